"""The C round engine (client_lib/csrc/round.c, the package's ``libembnic_client``) against the
numpy transport it was written after (``pyround.PyRoundClient``, the test oracle), on real UDP shards behind
relays that record every frame: the same request frames, byte for byte, for the same rounds
(lookups and updates over tables of several dims and dtypes, split into many messages, and the
fixed-length mode's size rounds); the same rows out; and, with frames dropped, duplicated and
reordered by deterministic rules, the same recovery (the same frames re-sent), the same rows
and every update applied exactly once. Also: a client without the library refuses to start, in
one line naming the rebuild command.

Run alone: python3 -m pytest -q tests/client_lib/test_native_round.py
"""
from __future__ import annotations

import dataclasses
import os
import select
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from embnic.client_lib.client import EmbeddingClient
from embnic.client_lib.codec import parse_header
from embnic.client_lib.config import parse_config
from embnic.client_lib.consts import Flags, MsgType
from embnic.client_lib.local import LocalBackend
from embnic.client_lib.msgid import MsgIds
from embnic.client_lib.sockets import set_socket_buffers
from embnic.testbed.server.runner import ServerCluster
from pyround import PyRoundClient

TABLES = [{"id": 0, "dim": 16, "optimizer": "adagrad", "lr": 0.1},
          {"id": 1, "rows": 50000, "dim": 8, "optimizer": "sgd", "lr": 0.3},
          {"id": 2, "dim": 3, "dtype": "fp16", "optimizer": "sgd", "lr": 0.2},
          {"id": 7, "dim": 8}]


def make_cfg(**cluster):
    return parse_config({"cluster": {"seed": 11, "sharding": "hash", "timeout_ms": 200, "retries": 20, **cluster},
                         "tables": TABLES, "shards": [{"id": 3 + i, "ip": "127.0.0.1", "port": 7920 + i}
                                                      for i in range(2)],
                         "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7999}]})


class Relay:
    """A UDP relay in front of one shard recording every frame ``(direction, bytes)``; ``rule(d, h)``
    (``d`` "req"/"rep", ``h`` the header) says what to do with a frame: None (pass), "drop", "dup"
    (send twice) or "hold" (send it after the next frame of its direction: a reordering)."""

    def __init__(self, shard_addr, rule=None):
        self.shard_addr, self.rule = shard_addr, rule or (lambda d, h: None)
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for s in (self.front, self.back):
            set_socket_buffers(s)
            s.bind(("127.0.0.1", 0))
        self.address = self.front.getsockname()
        self.client = None
        self.seen: list = []
        self.acted: list = []
        self._held: dict = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            r, _, _ = select.select([self.front, self.back], [], [], 0.05)
            for s in r:
                data, addr = s.recvfrom(65536)
                if s is self.front:
                    self.client = addr
                    d, dest, out = "req", self.shard_addr, self.back
                else:
                    d, dest, out = "rep", self.client, self.front
                self.seen.append((d, data))
                act = self.rule(d, parse_header(data))
                if act:
                    self.acted.append((d, act, parse_header(data)))
                if act == "drop":
                    continue
                if act == "hold" and d not in self._held:
                    self._held[d] = data
                    continue
                out.sendto(data, dest)
                if act == "dup":
                    out.sendto(data, dest)
                if d in self._held:
                    out.sendto(self._held.pop(d), dest)

    def requests(self) -> list[bytes]:
        return [b for d, b in self.seen if d == "req"]

    def close(self):
        self._stop.set()
        self._t.join(5)
        self.front.close()
        self.back.close()


class Behind:
    """A ServerCluster with a :class:`Relay` in front of each shard; ``cfg`` points at the relays."""

    def __init__(self, cfg, rule=None, **kw):
        self.cl = ServerCluster(cfg, **kw)
        self.rule = rule

    def __enter__(self):
        self.cl.__enter__()
        self.relays = [Relay((s.ip, s.port), self.rule) for s in self.cl.cfg.shards]
        self.cfg = dataclasses.replace(self.cl.cfg, shards=tuple(
            dataclasses.replace(s, ip=r.address[0], port=r.address[1]) for s, r in zip(self.cl.cfg.shards, self.relays)))
        return self

    def __exit__(self, *exc):
        for r in self.relays:
            r.close()
        self.cl.__exit__(*exc)


def rounds(seed, n=2, size=1500):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        req = {0: np.unique(rng.integers(0, 2**64 - 1, size, dtype=np.uint64, endpoint=True)),
               1: np.unique(rng.integers(0, 50000, size // 2, dtype=np.uint64)),
               2: np.unique(rng.integers(0, 10**6, size // 3, dtype=np.uint64)),
               7: np.unique(rng.integers(0, 10**6, 7, dtype=np.uint64))}
        grads = {t: (k, rng.standard_normal((len(k), TABLES[i]["dim"])).astype(np.float32))
                 for i, (t, k) in enumerate(req.items())}
        yield req, grads


def drive(cfg, client_class, ref, seed, first_id=1000, **kw):
    """Lookups and updates of :func:`rounds` through a ``client_class`` client (the C round or the
    numpy oracle) starting at message id ``first_id``;
    asserts every row equals ``ref``'s (which takes the same updates); returns the client's stats
    and how many update messages its rounds had."""
    updates = 0
    with client_class(cfg, 1, bind=("127.0.0.1", 0), **kw) as c:
        c._ids = MsgIds(1, frozen=True, first=first_id)  # both paths the same ids: frames compared byte for byte
        for req, grads in rounds(seed):
            got = c.lookup(req)
            for t, k in req.items():
                assert np.array_equal(got[t], ref.lookup({t: k})[t]), t
            before = c.stats.round_messages
            c.update(grads)
            updates += c.stats.round_messages - before
            for t, (k, g) in grads.items():
                ref.update({t: (k, g)})
        got = c.lookup(req)
        for t, k in req.items():
            assert np.array_equal(got[t], ref.lookup({t: k})[t]), t
        return c.stats, updates


@pytest.mark.parametrize("fixed", [False, True])
def test_same_frames_and_rows_as_the_numpy_path(fixed):
    """Loss-free: per shard, the C engine sends exactly the numpy path's request frames (the
    directory, keys, values, headers and fragmentation of every message, the fixed-length mode's
    SIZE_REQs), in the same order, and gets the same rows. Tail probes are compared apart from
    the rest: whether one goes out at all, and its id, depend on whether the shard's replies came
    before it (a probe follows only a message still unanswered), so under load one engine may
    send one fewer; each probe sent must be a well-formed one-key lookup."""
    cfg = make_cfg()
    kw = dict(msg_frames=4, window_frames=24, rto_min_ms=2000, fixed_length=fixed)
    sent = {}
    for nat, cls in ((False, PyRoundClient), (True, EmbeddingClient)):
        ref = LocalBackend(cfg)
        with Behind(cfg, fixed_length=fixed) as b:
            st, _ = drive(b.cfg, cls, ref, seed=5, **kw)
            sent[nat] = [r.requests() for r in b.relays]
        assert st.retransmits == 0 and st.round_messages > 2 * st.data_rounds  # split into many messages
        assert (st.size_rounds > 0) == fixed
    def is_probe(f: bytes) -> bool:
        h = parse_header(f)
        return h.msg_type == MsgType.LOOKUP_REQ and h.num_keys == 1 and h.frag_count == 1

    for shard, (a, b_) in enumerate(zip(sent[False], sent[True])):
        probes = [f for f in a + b_ if is_probe(f)]
        assert all(len(f) == len(probes[0]) for f in probes), shard  # one key of one table each
        a, b_ = [f for f in a if not is_probe(f)], [f for f in b_ if not is_probe(f)]
        assert len(a) == len(b_) > 50, shard
        assert a == b_, (shard, next(i for i, (x, y) in enumerate(zip(a, b_)) if x != y))


def once(keys: set, key) -> bool:
    if key in keys:
        return False
    keys.add(key)
    return True


def lossy_rule():
    """Drops, once each: fragment 2 of the first lookup message's reply, fragment 0 of the second
    lookup message, the first update's ack, fragment 1 of the second update message (as
    test_transport's deterministic case, on both shards)."""
    done: set = set()
    order: dict = {}

    def nth(h) -> int:
        ids = order.setdefault((h.shard_id, h.msg_type), [])
        if h.msg_id not in ids and h.num_keys > 1:
            ids.append(h.msg_id)
        return ids.index(h.msg_id) + 1 if h.msg_id in ids else 0

    def rule(d, h):
        if d == "req" and h.msg_type in (MsgType.LOOKUP_REQ, MsgType.UPDATE_REQ):
            k = nth(h)
            if h.msg_type == MsgType.LOOKUP_REQ and k == 2 and h.frag_index == 0 and once(done, (h.shard_id, "lq")):
                return "drop"
            if h.msg_type == MsgType.UPDATE_REQ and k == 2 and h.frag_index == 1 and once(done, (h.shard_id, "uq")):
                return "drop"
            return None
        req = MsgType.LOOKUP_REQ if h.msg_type == MsgType.LOOKUP_REPLY else MsgType.UPDATE_REQ
        ids = order.get((h.shard_id, req), [])
        if h.msg_type == MsgType.LOOKUP_REPLY and ids[:1] == [h.msg_id] and h.frag_index == 2 \
                and once(done, (h.shard_id, "lr")):
            return "drop"
        if h.msg_type == MsgType.UPDATE_ACK and ids[:1] == [h.msg_id] and once(done, (h.shard_id, "ua")):
            return "drop"
        return None

    return rule


def test_same_recovery_as_the_numpy_path_under_loss():
    """Frames dropped by one deterministic rule: both engines repair the partly answered lookup,
    send the unanswered one again, poll both lost updates (one acked from the shard's window, one
    answered UPDATE_NACK and completed with the one missing fragment) — the same frames re-sent,
    the same counters, the same rows; each update applied once."""
    cfg = make_cfg()
    kw = dict(msg_frames=6, rto_min_ms=5000)
    out = {}
    for nat, cls in ((False, PyRoundClient), (True, EmbeddingClient)):
        ref = LocalBackend(cfg)
        with Behind(cfg, lossy_rule()) as b:
            st, updates = drive(b.cfg, cls, ref, seed=8, **kw)
            resent = sorted(x for r in b.relays for x in r.requests() if x[4] & Flags.RETRANSMIT)
            out[nat] = (resent, (st.repairs, st.fast_retransmits, st.timeouts, st.update_polls, st.nacks,
                                 st.frames_resent), [len(r.acted) for r in b.relays])
        assert sum(c["updates_applied"] for c in b.cl.counters()) == updates  # each exactly once
    assert out[False][2] == out[True][2] == [4, 4]  # the rule struck on both shards
    assert out[True][1] == out[False][1]
    assert out[True][1][0] == 2 and out[True][1][4] == 2  # a repair and a NACK per shard
    assert out[True][0] == out[False][0]


@pytest.mark.parametrize("client_class", [EmbeddingClient, PyRoundClient], ids=["c", "numpy"])
def test_duplicated_and_reordered_frames_change_nothing(client_class):
    """Every 5th frame sent twice and every 7th held back behind the next, both ways: the rows are
    LocalBackend's and the shards apply each update message once (their duplicate window and the
    client's reassembly absorb the copies)."""
    cfg = make_cfg()
    n = {"req": 0, "rep": 0}

    def rule(d, h):
        n[d] += 1
        return "dup" if n[d] % 5 == 0 else ("hold" if n[d] % 7 == 0 else None)

    ref = LocalBackend(cfg)
    with Behind(cfg, rule) as b:
        with client_class(b.cfg, 1, bind=("127.0.0.1", 0), msg_frames=5, rto_min_ms=2000) as c:
            updates = 0
            for req, grads in rounds(13, n=3):
                got = c.lookup(req)
                assert all(np.array_equal(got[t], ref.lookup({t: k})[t]) for t, k in req.items())
                before = c.stats.round_messages
                c.update(grads)
                updates += c.stats.round_messages - before
                for t, (k, g) in grads.items():
                    ref.update({t: (k, g)})
            got = c.lookup(req)
            assert all(np.array_equal(got[t], ref.lookup({t: k})[t]) for t, k in req.items())
        acted = [a for r in b.relays for _, a, _ in r.acted]
        counters = b.cl.counters()
    assert acted.count("dup") > 20 and acted.count("hold") > 20
    assert sum(c["updates_applied"] for c in counters) == updates
    assert sum(c["duplicates"] + c["reassembly"]["duplicate_frames"] for c in counters) > 0  # copies arrived


def test_missing_library_is_one_line_naming_the_rebuild(tmp_path):
    """No library, no client: EmbeddingClient raises NativeLibraryError, whose message is one line
    naming the file and the rebuild command (there is no other round to fall back to)."""
    code = ("from embnic.client_lib.clib import NativeLibraryError\n"
            "from embnic.client_lib.client import EmbeddingClient\n"
            "from embnic.client_lib.config import parse_config\n"
            "cfg = parse_config({'cluster': {}, 'tables': [{'id': 0, 'dim': 4}], 'shards': [{'id': 0, 'ip': '127.0.0.1', "
            "'port': 7930}], 'clients': [{'id': 1, 'ip': '127.0.0.1', 'port': 7931}]})\n"
            "try:\n"
            "    EmbeddingClient(cfg, 1, bind=('127.0.0.1', 0))\n"
            "except NativeLibraryError as e:\n"
            "    print(e)\n")
    missing = tmp_path / "libembnic-client.so"
    env = dict(os.environ, EMBNIC_CLIENT_LIB=str(missing))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 1 and str(missing) in lines[0] and "is not built: run pip install -e ." in lines[0], lines


def test_the_cli_says_a_missing_library_in_its_one_line():
    """The CLI maps NativeLibraryError as a missing dependency: its one line, exit 2, no traceback."""
    from embnic.cli.main import to_click
    from embnic.client_lib.clib import NativeLibraryError

    e = to_click(NativeLibraryError("embnic: the client library /x.so is not built: run pip install -e ."))
    assert e.exit_code == 2 and e.format_message() == "embnic: the client library /x.so is not built: run pip install -e ."


class SlowShard:
    """A bare UDP socket playing the only shard of a one-table (dim 4) cluster: it answers every
    lookup (rows = key / 2) once ``open`` is set, and holds back what came before."""

    def __init__(self):
        from embnic.client_lib import codec
        from embnic.client_lib.reassembly import Reassembler

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.open = threading.Event()
        self._stop = threading.Event()
        self._codec, self._reasm = codec, Reassembler(expect="request")
        self.cfg = parse_config({"cluster": {"seed": 1, "timeout_ms": 5000, "retries": 3},
                                 "tables": [{"id": 0, "dim": 4}],
                                 "shards": [{"id": 0, "ip": "127.0.0.1", "port": self.sock.getsockname()[1]}],
                                 "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7995}]})
        self._held: list = []
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        codec = self._codec
        while not self._stop.is_set():
            try:
                data, addr = self.sock.recvfrom(65536)
                m = self._reasm.feed(data, addr)
                if m is not None:
                    self._held.append(m)
            except OSError:
                pass
            if self.open.is_set():
                for m in self._held:
                    keys = codec.parse_request_body(m.header, m.body).keys
                    rows = np.repeat((keys / 2).astype(np.float32)[:, None], 4, axis=1)
                    for f in codec.encode_reply(m.header, MsgType.LOOKUP_REPLY, shard_id=0,
                                                body=codec.rows_to_body(rows)):
                        self.sock.sendto(f, m.addr)
                self._held = []

    def close(self):
        self._stop.set()
        self._t.join(5)
        self.sock.close()


def test_ctrl_c_stops_a_waiting_round_and_the_client_goes_on():
    """SIGINT while the C round waits for a shard: KeyboardInterrupt at once (not after the
    retries), the round is dropped, and the next round of the same client works."""
    import signal
    import time as _t

    shard = SlowShard()
    keys = np.arange(2, 40, 2, dtype=np.uint64)
    # Python's own SIGINT handler, whatever this process inherited (a shell's background job
    # starts with SIGINT ignored, and Python then installs none)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with EmbeddingClient(shard.cfg, 1, bind=("127.0.0.1", 0), rto_min_ms=5000) as c:
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
            t0 = _t.monotonic()
            with pytest.raises(KeyboardInterrupt):
                c.lookup({0: keys})
            assert _t.monotonic() - t0 < 3.0  # (the first timer alone is 5 s)
            shard.open.set()
            got = c.lookup({0: keys})
            assert np.array_equal(got[0], np.repeat((keys / 2).astype(np.float32)[:, None], 4, axis=1))
    finally:
        signal.signal(signal.SIGINT, old)
        shard.close()


def test_ctrl_c_the_round_was_not_waiting_for_still_stops_it():
    """A SIGINT that no ppoll of the round sees (it came while the round was sending, or — made
    certain here — to another thread, whose C handler only flags it for the main thread's
    interpreter) stops the round within a wait slice too, not after the retries."""
    import signal
    import time as _t

    def to_this_thread():
        _t.sleep(0.3)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    shard = SlowShard()
    keys = np.arange(2, 40, 2, dtype=np.uint64)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # (as above)
    try:
        with EmbeddingClient(shard.cfg, 1, bind=("127.0.0.1", 0), rto_min_ms=5000, retries=2) as c:
            threading.Thread(target=to_this_thread, daemon=True).start()
            t0 = _t.monotonic()
            with pytest.raises(KeyboardInterrupt):
                c.lookup({0: keys})
            assert _t.monotonic() - t0 < 3.0  # (the first timer alone is 5 s)
            shard.open.set()
            assert np.array_equal(c.lookup({0: keys})[0], np.repeat((keys / 2).astype(np.float32)[:, None], 4, axis=1))
    finally:
        signal.signal(signal.SIGINT, old)
        shard.close()


def test_a_signal_whose_handler_returns_lets_the_round_go_on():
    import signal

    shard = SlowShard()
    seen = []
    old = signal.signal(signal.SIGUSR1, lambda *a: seen.append(1))
    keys = np.arange(1, 30, dtype=np.uint64)
    try:
        with EmbeddingClient(shard.cfg, 1, bind=("127.0.0.1", 0), rto_min_ms=5000) as c:
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
            threading.Timer(0.6, shard.open.set).start()
            got = c.lookup({0: keys})
            assert np.array_equal(got[0], np.repeat((keys / 2).astype(np.float32)[:, None], 4, axis=1))
            assert seen == [1] and c.stats.retransmits == 0 and c.stats.messages_received == 1
    finally:
        signal.signal(signal.SIGUSR1, old)
        shard.close()
