"""Exactly once under reused message ids (issue 34, item 1): the shard's window
(``testbed/server/window.py``) keeps every update it acknowledged, by id *and* fingerprint, and
acks a poll from it only when the poll is that update's last fragment byte for byte.

A hypothesis property test drives random sequences of new, re-sent, reused-id and polled
updates into the reference server and the batch engine (through their sockets, one action at a
time, each followed by a lookup whose answer shows everything before it was answered) and
checks, from the rows: nothing applied twice, nothing acknowledged that was not applied — and
that both engines answered every action alike. Every update has keys of its own and its own
gradient value, so a row tells how often its update was applied. Updates under one id differ in
their last fragment too: two updates under one id that differ only before it cannot be told
apart by a poll (the poll frames are the same bytes), which is why a client never reuses an id
while a window may remember it (``client_lib/msgid.py``, docs/protocol.md "Message ids").

Run alone: python3 -m pytest -q tests/testbed/test_exactly_once_window.py
"""
from __future__ import annotations

import socket

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from embnic.client_lib import codec, consts
from embnic.client_lib.config import parse_config
from embnic.client_lib.consts import MsgType
from embnic.client_lib.rowstore import TableShard
from embnic.testbed.server.runner import ServerThread

from reference_shard import engine_kw
from embnic.testbed.server.window import UpdateWindow, fingerprint, tail_of

from test_server import lookup_frames, update_frames

CFG = parse_config({
    "cluster": {"seed": 3, "sharding": "hash", "mtu": 576, "timeout_ms": 200, "retries": 1},
    "tables": [{"id": 0, "dim": 8, "optimizer": "sgd", "lr": 1.0}],
    "shards": [{"id": 0, "ip": "127.0.0.1", "port": 7900}],
    "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7990}],
})
PROBE_ID = 0x7FFF0000
NKEYS = (1, 30, 45)  # 1, 3 and 4 fragments at MTU 576


def _rt(frame: bytes) -> bytes:
    return frame[:4] + bytes([frame[4] | consts.Flags.RETRANSMIT]) + frame[5:]


class Update:
    """One update: keys of its own (``1000·j + i``), every gradient value ``g``."""

    def __init__(self, j: int, msg_id: int, n: int):
        self.j, self.msg_id, self.n = j, msg_id, n
        self.keys = (1000 * j + np.arange(n)).astype(np.uint64)
        self.g = np.float32(0.5 * (j + 1))
        self.frames = update_frames(CFG, 0, self.keys, np.full((n, 8), self.g, np.float32), msg_id)


class Shard:
    """A shard of ``engine`` on a socket, asked one action at a time."""

    def __init__(self, engine: str):
        self.st = ServerThread(CFG, 0, reassembly_timeout_s=600.0, **engine_kw(engine))
        self.st.start()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(20.0)  # a bound for a lost server, not a timing assertion

    def ask(self, frames: list[bytes]) -> list[tuple[int, int]]:
        """Send ``frames``, then a probe lookup; the replies before the probe's, as (type, msg_id)."""
        for f in frames:
            self.sock.sendto(f, self.st.address)
        self.sock.sendto(lookup_frames(CFG, 0, np.array([7], np.uint64), PROBE_ID)[0], self.st.address)
        out = []
        while True:
            h = codec.parse_header(self.sock.recv(65536), expect="reply")
            if h.msg_id == PROBE_ID:
                return out
            out.append((int(h.msg_type), int(h.msg_id)))

    def close(self):
        self.sock.close()
        self.st.stop()


def applied_counts(state: dict, updates: list[Update]) -> list[int]:
    """How many times each update was applied, from the rows (SGD, lr 1: a row falls by ``g`` per
    application). Asserts every row of an update agrees (no update applied in part or mixed)."""
    keys, rows, _ = state.get(0, (np.zeros(0, np.uint64), np.zeros((0, 8), np.float32), None))
    init = TableShard(CFG.tables[0], CFG.seed, capacity=64)
    out = []
    for u in updates:
        i = np.searchsorted(keys, u.keys)
        have = (i < keys.size) & (keys[np.minimum(i, max(keys.size - 1, 0))] == u.keys) if keys.size else \
            np.zeros(u.n, bool)
        now = init.lookup(u.keys).copy()
        now[have] = rows[i[have]]
        c = (init.lookup(u.keys) - now) / u.g
        k = np.rint(c)
        assert np.allclose(c, k, atol=1e-3) and (k == k.flat[0]).all(), (u.j, c)
        out.append(int(k.flat[0]))
    return out


def play(engine: str, steps) -> tuple[list, list[int], list[int], dict]:
    """Run ``steps`` on a shard of ``engine``: (replies per action, applied count per update,
    the updates acked, counters)."""
    updates: list[Update] = []
    pending: dict[int, tuple[int, set]] = {}  # msg_id -> (update, fragments the shard holds): its reassembler
    acked: set[int] = set()
    replies = []
    next_id = 1
    sh = Shard(engine)
    try:
        for kind, pick, mask, rt in steps:
            if kind == "new" or not updates:
                u = Update(len(updates), next_id, NKEYS[pick % len(NKEYS)])
                next_id += 1
                updates.append(u)
                kind = "send"
            elif kind == "reuse":
                old = updates[pick % len(updates)]
                if old.msg_id in pending:  # a client never reuses an id while its message is under way
                    u, kind = updates[pending[old.msg_id][0]], "send"
                else:
                    u = Update(len(updates), old.msg_id, old.n)  # same id, same counts, other bytes
                    updates.append(u)
                    kind = "send"
            else:
                u = updates[pick % len(updates)]
                if u.msg_id in pending and pending[u.msg_id][0] != u.j:
                    u = updates[pending[u.msg_id][0]]
            fr = u.frames
            if kind == "poll":
                idx = [len(fr) - 1]
                out = [_rt(fr[-1])]
            else:  # the fragments of mask (all when it picks none); the last one never RETRANSMIT (a poll)
                idx = [i for i in range(len(fr)) if mask >> i & 1] or list(range(len(fr)))
                out = [(_rt(fr[i]) if rt and i < len(fr) - 1 else fr[i]) for i in idx]
            # the shard's reassembler, mirrored: a message completes when its last missing
            # fragment comes; a fragment after that opens it again
            for i in idx:
                held = pending.setdefault(u.msg_id, (u.j, set()))[1]
                held.add(i)
                if len(held) == len(fr):
                    del pending[u.msg_id]
            got = sh.ask(out)
            replies.append(got)
            assert all(t in (MsgType.UPDATE_ACK, MsgType.UPDATE_NACK) and m == u.msg_id for t, m in got), got
            if (MsgType.UPDATE_ACK, u.msg_id) in got:
                acked.add(u.j)
                if kind == "poll":  # a poll acked from the window: its fragments dropped (a fragment sent
                    pending.pop(u.msg_id, None)  # again after its message completed stays held: mirrored above)
        counts = applied_counts(sh.st.state_dict(), updates)
        counters = sh.st.counters()
    finally:
        sh.close()
    return replies, counts, sorted(acked), counters


ACTIONS = st.lists(st.tuples(st.sampled_from(["new", "new", "reuse", "reuse", "resend", "poll", "poll"]),
                             st.integers(0, 63), st.integers(0, 15), st.booleans()), min_size=1, max_size=24)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ACTIONS)
def test_exactly_once_under_reused_ids(steps):
    """Nothing applied twice, nothing acknowledged unapplied; reference and batch engine alike."""
    ref = play("reference", steps)
    bat = play("batch", steps)
    for replies, counts, acked, counters in (ref, bat):
        assert all(c in (0, 1) for c in counts), counts  # nothing applied twice
        assert all(counts[j] == 1 for j in acked), (counts, acked)  # nothing acknowledged unapplied
        assert counters["updates_applied"] == sum(counts)
        assert counters["internal_errors"] == 0
    assert bat[0] == ref[0] and bat[1] == ref[1]


def test_the_issue_cases():
    """The two findings, step by step: (1) U1, then U2 under U1's id, then U1 again whole: a
    duplicate, not applied again; (2) U1 applied, U2 under its id with the same counts, only
    U2's last fragment arrives as a poll: NACKed (U2 was not applied), then U2 completes and is
    applied once; U1's own poll is still acked from the window."""
    for engine in ("reference", "batch"):
        u1, u2 = Update(0, 5, 30), Update(1, 5, 30)
        assert len(u1.frames) == 3
        sh = Shard(engine)
        try:
            assert sh.ask(u1.frames) == [(MsgType.UPDATE_ACK, 5)]
            assert sh.ask([_rt(u2.frames[-1])]) == [(MsgType.UPDATE_NACK, 5)]
            assert sh.ask([_rt(f) for f in u2.frames[:-1]]) == [(MsgType.UPDATE_ACK, 5)]
            assert sh.ask(u1.frames) == [(MsgType.UPDATE_ACK, 5)]  # a duplicate
            assert sh.ask([_rt(u1.frames[-1])]) == [(MsgType.UPDATE_ACK, 5)]  # acked from the window
            assert sh.ask([_rt(u2.frames[-1])]) == [(MsgType.UPDATE_ACK, 5)]
            assert applied_counts(sh.st.state_dict(), [u1, u2]) == [1, 1]
            c = sh.st.counters()
            assert (c["updates_applied"], c["duplicates"], c["update_poll_acks"], c["update_nacks"]) == (2, 1, 2, 1)
            assert c["dedup_entries"] == 2
        finally:
            sh.close()


def test_window_bounds_and_polls():
    """UpdateWindow alone: every fingerprint of an id kept; a poll matches only its update's last
    fragment (offset and bytes); oldest entries dropped past the size, any entry past its age."""
    now = [0.0]
    w = UpdateWindow(3, max_age_s=10.0, clock=lambda: now[0])
    a, b = b"A" * 100 + b"tail-a", b"B" * 100 + b"tail-b"
    fa, fb = fingerprint(1, 2, 3, a), fingerprint(1, 2, 3, b)
    w.add(1, 9, fa, tail_of(a, 100))
    w.add(1, 9, fb, tail_of(b, 100))
    assert w.duplicate(1, 9, fa) and w.duplicate(1, 9, fb) and not w.duplicate(1, 9, fingerprint(1, 2, 3, b"x"))
    assert not w.duplicate(2, 9, fa) and not w.duplicate(1, 10, fa)
    assert w.poll_ack(1, 9, 1, 2, 3, 100, b"tail-a") and w.poll_ack(1, 9, 1, 2, 3, 100, b"tail-b")
    assert not w.poll_ack(1, 9, 1, 2, 3, 100, b"tail-c")  # another update's last fragment
    assert not w.poll_ack(1, 9, 1, 2, 3, 99, b"atail-a")  # cut at another fragment size
    assert not w.poll_ack(1, 9, 1, 2, 4, 100, b"tail-a")  # other counts
    w.add(1, 11, fa)  # no tail (restored from a log): never acks a poll
    assert not w.poll_ack(1, 11, 1, 2, 3, 100, b"tail-a") and w.duplicate(1, 11, fa)
    w.add(1, 12, fa, tail_of(a, 100))  # the 4th: the least recently used one goes
    assert len(w) == 3 and not w.duplicate(1, 9, fa) and w.duplicate(1, 9, fb)
    assert not w.poll_ack(1, 9, 1, 2, 3, 100, b"tail-a")  # its poll entry went with it
    now[0] = 5.0
    assert w.duplicate(1, 12, fa)  # touched at 5 s
    now[0] = 12.0
    assert not w.duplicate(1, 9, fb) and w.duplicate(1, 12, fa) and len(w) == 1 and w.expired == 2
    assert list(w.rows()) == [(1, 12) + fa]
    with pytest.raises(ValueError):
        UpdateWindow(0)
