"""Parameter-server shard, protocol v2: numerics against the in-process reference over real UDP
on loopback (messages of several tables, one reply of every table's rows), exactly-once updates
(polls, UPDATE_NACK), ERROR statuses naming the first bad table, directory faults, counted drops
of malformed frames (version-1 frames too), the ``embnic server`` command (errors,
SIGTERM/SIGINT → exit 0 with counters). Frames come from the v2 codec (``multi_lookup_frames``,
``multi_update_frames`` below, shared by the other shard tests).

Run alone: python3 -m pytest -q tests/testbed/test_server.py
"""
import collections
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import warnings

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embnic.client_lib import codec, consts, routing
from embnic.client_lib.client import EmbeddingClient, ShardError, set_socket_buffers
from embnic.client_lib.config import parse_config
from embnic.client_lib.consts import MsgType, Status
from embnic.client_lib.reassembly import Reassembler
from embnic.client_lib.local import LocalBackend
from embnic.client_lib.table_numerics import init_rows
from embnic.cli.main import cli
from embnic.testbed.server.runner import ServerCluster, ServerThread
from embnic.testbed.server.shard_state import ShardState, gradient_bound

from reference_shard import ReferenceShard, engine_kw
import clientref

TABLES = [
    {"id": 0, "rows": 2000, "dim": 8, "optimizer": "adagrad", "lr": 0.1},
    {"id": 1, "rows": 5000, "dim": 16, "optimizer": "sgd", "lr": 0.3},
    {"id": 3, "rows": 1000, "dim": 12, "optimizer": "adagrad", "dtype": "fp16"},
]


def make_cfg(shards=2, sharding="hash", mtu=1500, tables=TABLES, seed=42, **cluster):
    return parse_config({
        "cluster": {"seed": seed, "sharding": sharding, "mtu": mtu, "timeout_ms": 200, "retries": 10, **cluster},
        "tables": tables,
        "shards": [{"id": i, "ip": "127.0.0.1", "port": 7900 + i} for i in range(shards)],
        "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7990}, {"id": 2, "ip": "127.0.0.1", "port": 7991}],
    })


class Raw:
    """A bare UDP client socket that speaks frames, for protocol-level tests."""

    def __init__(self, dest):
        self.dest = dest
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(10.0)  # a safety bound for a lost server, not a timing assertion
        self.reasm = Reassembler(expect="reply")
        self.frames = []

    def send(self, frames):
        for f in frames:
            self.sock.sendto(f, self.dest)

    def recv(self):
        """The next complete reply message."""
        while True:
            data, addr = self.sock.recvfrom(65536)
            self.frames.append(data)
            m = self.reasm.feed(data, addr)
            if m is not None:
                return m

    def close(self):
        self.sock.close()


@pytest.fixture(params=["batch", "reference"])
def shard0(request):
    """Shard 0 of a 2-shard hash cluster, in a thread (each engine), and a raw client pointed at it."""
    cfg = make_cfg()
    with ServerThread(cfg, 0, **engine_kw(request.param)) as st_:
        raw = Raw(st_.address)
        yield cfg, st_, raw
        raw.close()


def owned_keys(cfg, table_id, shard_id, n, rng):
    keys = clientref.owned_keys(cfg, table_id, shard_id)
    return np.sort(rng.choice(keys, size=n, replace=False)).astype(np.uint64)


def directory_of(cfg, parts, dims=None, dtypes=None):
    """The v2 directory of ``parts`` ``[(table_id, keys), ...]`` (tables in that order), each
    table's ``dim``/``dtype`` from the config unless ``dims``/``dtypes`` ``{table_id: value}`` say
    otherwise (for refusal tests; a table not in the config gets dim 8, fp32)."""
    known = {t.id: t for t in cfg.tables}
    dims, dtypes = dims or {}, dtypes or {}
    tids = [t for t, _ in parts]
    return codec.make_directory(tids, [dims.get(t) or (known[t].dim if t in known else 8) for t in tids],
                                [dtypes.get(t) or (known[t].wire_dtype if t in known else 1) for t in tids],
                                [len(k) for _, k in parts])


def multi_lookup_frames(cfg, parts, msg_id, shard_id=0, client_id=1, dims=None, dtypes=None, flags=0):
    """Frames of one LOOKUP_REQ of several tables: ``parts`` ``[(table_id, keys uint64), ...]``."""
    d = directory_of(cfg, parts, dims, dtypes)
    keys = np.concatenate([np.asarray(k, np.uint64) for _, k in parts])
    return codec.encode_lookup(msg_id=msg_id, client_id=client_id, shard_id=shard_id, directory=d, keys=keys,
                               mtu=cfg.mtu, flags=flags)


def multi_update_frames(cfg, parts, msg_id, shard_id=0, client_id=1, flags=0, dims=None):
    """Frames of one UPDATE_REQ of several tables: ``parts`` ``[(table_id, keys, grads (n, dim)), ...]``;
    gradients are cast to each table's wire dtype (fp16 tables round, and may overflow to inf)."""
    d = directory_of(cfg, [(t, k) for t, k, _ in parts], dims)
    keys = np.concatenate([np.asarray(k, np.uint64) for _, k, _ in parts])
    with np.errstate(over="ignore"):
        vals = codec.values_to_body([g for _, _, g in parts], d["dtype"].tolist())
    return codec.encode_update(msg_id=msg_id, client_id=client_id, shard_id=shard_id, directory=d, keys=keys,
                               values=vals, mtu=cfg.mtu, flags=flags)


def lookup_frames(cfg, table_id, keys, msg_id, shard_id=0, client_id=1, dim=None, dtype=None, flags=0):
    """Frames of a one-table LOOKUP_REQ (``dim``/``dtype`` override the directory entry's)."""
    return multi_lookup_frames(cfg, [(table_id, keys)], msg_id, shard_id, client_id,
                               dims={table_id: dim} if dim else None, dtypes={table_id: dtype} if dtype else None,
                               flags=flags)


def update_frames(cfg, table_id, keys, grads, msg_id, shard_id=0, client_id=1, flags=0):
    """Frames of a one-table UPDATE_REQ."""
    return multi_update_frames(cfg, [(table_id, keys, grads)], msg_id, shard_id, client_id, flags)


def reply_rows(cfg, m, parts):
    """A LOOKUP_REPLY message's rows per table of ``parts`` ``[(table_id, keys), ...]`` (the
    request's directory order), as float32 arrays."""
    out, at = [], 0
    for tid, k in parts:
        t = cfg.table(tid)
        dt = codec.value_dtype(t.wire_dtype)
        n = len(k) * t.dim
        out.append(np.frombuffer(m.body, dt, n, at).reshape(len(k), t.dim).astype(np.float32))
        at += n * dt.itemsize
    assert at == len(m.body) == m.header.value_len
    return out


def probe(raw, cfg, msg_id=999_999):
    """Send a valid lookup and return the next reply: proves the server is alive and, since
    replies come back in order, that nothing was answered to what was sent before."""
    keys = clientref.owned_keys(cfg, 0, 0)[:1]
    raw.send(lookup_frames(cfg, 0, keys, msg_id))
    return raw.recv()


# ---- numerics through UDP vs the in-process reference ---------------------------------------

@pytest.mark.parametrize("engine", ["batch", "reference"])
@pytest.mark.parametrize("sharding,shards,mtu", [("hash", 2, 1500), ("hash", 3, 576), ("table", 2, 9000)])
def test_server_numerics_equal_local_backend(sharding, shards, mtu, engine):
    cfg = make_cfg(shards, sharding, mtu)
    ref = LocalBackend(cfg)
    rng = np.random.default_rng(7)
    with ServerCluster(cfg, **engine_kw(engine)) as cl, EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0)) as c:
        for _ in range(6):
            req = {t.id: np.unique(rng.integers(0, t.rows, 400)).astype(np.uint64) for t in cfg.tables}
            got = c.lookup(req)
            for tid, keys in req.items():
                assert np.array_equal(got[tid], ref.lookup({tid: keys})[tid]), tid
            upd = {tid: (k, rng.standard_normal((k.size, cfg.table(tid).dim)).astype(np.float32))
                   for tid, k in req.items()}
            c.update(upd)
            for tid, (k, g) in upd.items():
                ref.update({tid: (k, g)})
        counters = cl.counters()
    state, want = cl.state_dict(), ref.state_dict()
    for tid in want:
        assert len(want[tid][0]) > 0
        for a, b in zip(state[tid], want[tid]):
            assert np.array_equal(a, b)
    # every update message applied once (a retransmitted one re-acked), nothing refused
    assert sum(x["updates_applied"] for x in counters) == sum(x["requests"]["UPDATE_REQ"] - x["duplicates"]
                                                              for x in counters) > 0
    assert all(sum(x["errors"].values()) == 0 for x in counters)
    if sharding == "table":  # whole tables on one shard each
        assert all(sum(int(x["rows"][str(t.id)]) > 0 for x in counters) == 1 for t in cfg.tables)


def test_multi_table_messages_equal_local_backend(shard0):
    """One lookup message of three tables (fp32 and fp16, 1 to 300 keys) → one reply with every
    table's rows in directory order; one update message of the same tables applied once, all of
    it; rows equal LocalBackend's bit for bit (protocol v2, docs/protocol.md "Body")."""
    cfg, st_, raw = shard0
    ref = LocalBackend(cfg)
    rng = np.random.default_rng(11)
    for step, sizes in enumerate([(300, 1, 7), (2, 40, 120), (1, 1, 1)]):
        parts = [(tid, owned_keys(cfg, tid, 0, n, rng)) for tid, n in zip((1, 3, 0), sizes)]
        raw.send(multi_lookup_frames(cfg, parts, 100 + step))
        m = raw.recv()
        assert (m.header.msg_type, m.header.msg_id, m.header.num_tables) == (MsgType.LOOKUP_REPLY, 100 + step, 3)
        for (tid, k), rows in zip(parts, reply_rows(cfg, m, parts)):
            assert np.array_equal(rows, ref.lookup({tid: k})[tid]), (step, tid)
        upd = [(tid, k, rng.standard_normal((k.size, cfg.table(tid).dim)).astype(np.float32)) for tid, k in parts]
        raw.send(multi_update_frames(cfg, upd, 200 + step))
        a = raw.recv()
        assert (a.header.msg_type, a.header.msg_id, a.header.num_tables) == (MsgType.UPDATE_ACK, 200 + step, 3)
        for tid, k, g in upd:
            ref.update({tid: (k, g)})
    c = st_.counters()
    assert c["updates_applied"] == 3 and c["requests"] == {"LOOKUP_REQ": 3, "UPDATE_REQ": 3, "SIZE_REQ": 0}
    state, want = st_.state_dict(), ref.state_dict()
    for tid in want:
        for x, y in zip(state[tid], want[tid]):
            assert np.array_equal(x, y), tid


def test_lookup_reply_fragmented_to_mtu_and_sent_to_source(shard0):
    cfg, st_, raw = shard0
    rng = np.random.default_rng(0)
    keys = owned_keys(cfg, 1, 0, 500, rng)  # 500 keys x 16 fp32 = 32000 bytes of rows
    other = Raw(st_.address)
    try:
        raw.send(lookup_frames(cfg, 1, keys, 10))
        other.send(lookup_frames(cfg, 1, keys[:3], 11, client_id=2))
        m = raw.recv()
        m2 = other.recv()
    finally:
        other.close()
    assert m.header.msg_type == MsgType.LOOKUP_REPLY and m.header.msg_id == 10 and m.header.shard_id == 0
    assert (m.header.num_tables, m.header.num_keys, m.header.value_len) == (1, 500, 500 * 16 * 4)
    assert m.header.table_id == consts.NO_TABLE
    assert m.frames == -(-500 * 16 * 4 // consts.max_body_per_frame(cfg.mtu))
    assert all(len(f) <= cfg.mtu - 28 for f in raw.frames)
    rows, = reply_rows(cfg, m, [(1, keys)])
    assert np.array_equal(rows, init_rows(cfg.seed, 1, keys, 16, cfg.table(1).init_scale))
    assert m2.header.msg_id == 11 and m2.header.client_id == 2 and m2.header.num_keys == 3


# ---- exactly once ----------------------------------------------------------------------------

def test_poll_of_an_incomplete_update_is_answered_with_the_fragments_held(shard0):
    """docs/protocol.md, "Reliability": an update that lost fragments 1 and 4 is polled (its last
    fragment again, RETRANSMIT): the shard answers UPDATE_NACK with the fragments it holds; the
    missing ones re-sent (RETRANSMIT, not the last: no NACK each) complete it — applied once, acked;
    a second poll then is acked from the window. Both engines."""
    cfg, st_, raw = shard0
    rng = np.random.default_rng(2)
    keys = owned_keys(cfg, 0, 0, 300, rng)  # 9 fragments
    g = rng.standard_normal((300, 8)).astype(np.float32)
    frames = update_frames(cfg, 0, keys, g, msg_id=7)
    retrans = update_frames(cfg, 0, keys, g, msg_id=7, flags=consts.Flags.RETRANSMIT)
    n = len(frames)
    raw.send([f for i, f in enumerate(frames) if i not in (1, 4)])
    raw.send(retrans[-1:])
    nack = raw.recv()
    assert nack.header.msg_type == MsgType.UPDATE_NACK and nack.header.msg_id == 7 and len(nack.body) == 32
    assert np.flatnonzero(~clientref.nack_held(nack.body, n)).tolist() == [1, 4]
    raw.send([retrans[1], retrans[4]])
    ack = raw.recv()
    assert ack.header.msg_type == MsgType.UPDATE_ACK and ack.header.msg_id == 7
    raw.send(retrans[-1:])  # the ack lost: the next poll is acked from the window
    again = raw.recv()
    assert again.header.msg_type == MsgType.UPDATE_ACK
    c = st_.counters()
    # (duplicates counts complete updates re-acked; update_poll_acks the polls acked from the window)
    assert (c["updates_applied"], c["duplicates"], c["update_poll_acks"], c["update_nacks"]) == (1, 0, 1, 1)
    ref = LocalBackend(cfg)
    ref.update({0: (keys, g)})
    for x, y in zip(st_.state_dict()[0], ref.state_dict()[0]):
        assert np.array_equal(x, y)


def test_poll_of_an_update_never_seen_names_only_itself(shard0):
    """Every fragment of an update lost: its poll is the one fragment held (a NACK naming only the
    last fragment), and the client's re-send of the others completes it."""
    cfg, st_, raw = shard0
    rng = np.random.default_rng(3)
    keys = owned_keys(cfg, 0, 0, 100, rng)
    g = rng.standard_normal((100, 8)).astype(np.float32)
    retrans = update_frames(cfg, 0, keys, g, msg_id=8, flags=consts.Flags.RETRANSMIT)
    raw.send(retrans[-1:])
    nack = raw.recv()
    assert nack.header.msg_type == MsgType.UPDATE_NACK
    assert np.flatnonzero(clientref.nack_held(nack.body, len(retrans))).tolist() == [len(retrans) - 1]
    raw.send(retrans[:-1])
    assert raw.recv().header.msg_type == MsgType.UPDATE_ACK
    assert st_.counters()["updates_applied"] == 1


def test_duplicate_update_is_reacked_not_reapplied(shard0):
    cfg, st_, raw = shard0
    rng = np.random.default_rng(1)
    keys = owned_keys(cfg, 0, 0, 300, rng)  # 300 x (8 + 32) bytes: 9 fragments
    g = rng.standard_normal((300, 8)).astype(np.float32)
    frames = update_frames(cfg, 0, keys, g, msg_id=5)
    assert len(frames) > 1
    raw.send(frames)
    a1 = raw.recv()
    retrans = update_frames(cfg, 0, keys, g, msg_id=5, flags=consts.Flags.RETRANSMIT)
    raw.send(retrans[-1:])  # the client's poll of an update whose ack it lost: its last fragment
    a2 = raw.recv()
    raw.send(retrans)  # and a whole copy, in order: it completes, a duplicate re-acked
    a3 = raw.recv()
    for a in (a1, a2, a3):
        assert a.header.msg_type == MsgType.UPDATE_ACK and a.header.msg_id == 5 and a.header.status == 0
    c = st_.counters()
    assert c["updates_applied"] == 1 and c["dedup_entries"] == 1
    assert (c["duplicates"], c["update_poll_acks"], c["update_nacks"]) == (1, 1, 0)
    ref = LocalBackend(cfg)
    ref.update({0: (keys, g)})
    for x, y in zip(st_.state_dict()[0], ref.state_dict()[0]):
        assert np.array_equal(x, y)


def test_same_ids_different_body_is_a_new_update(shard0):
    cfg, st_, raw = shard0
    keys = clientref.owned_keys(cfg, 0, 0)[:4]
    g = np.ones((4, 8), np.float32)
    raw.send(update_frames(cfg, 0, keys, g, msg_id=1))
    raw.recv()
    raw.send(update_frames(cfg, 0, keys, 2 * g, msg_id=1))  # e.g. a restarted client
    raw.recv()
    ref = LocalBackend(cfg)
    ref.update({0: (keys, g)})
    ref.update({0: (keys, 2 * g)})
    assert st_.counters()["updates_applied"] == 2
    assert np.array_equal(st_.state_dict()[0][1], ref.state_dict()[0][1])


def test_dedup_window_is_bounded():
    cfg = make_cfg()
    with ServerThread(cfg, 0, dedup_window=2) as st_:
        raw = Raw(st_.address)
        keys = clientref.owned_keys(cfg, 0, 0)[:2]
        g = np.ones((2, 8), np.float32)
        for mid in (1, 2, 3, 1):  # 1 has left the 2-entry window when it comes again
            raw.send(update_frames(cfg, 0, keys, g, msg_id=mid))
            assert raw.recv().header.msg_type == MsgType.UPDATE_ACK
        raw.send(update_frames(cfg, 0, keys, g, msg_id=3))  # still remembered
        raw.recv()
        c = st_.counters()
        raw.close()
    assert c["updates_applied"] == 4 and c["duplicates"] == 1 and c["dedup_entries"] == 2


# ---- refused requests: ERROR with a status ---------------------------------------------------

def _err(raw):
    m = raw.recv()
    assert m.header.msg_type == MsgType.ERROR, MsgType(m.header.msg_type).name
    return m.header


def test_error_statuses(shard0):
    """Every refusal answered with one ERROR: its status, and ``table_id`` naming the table (the
    whole message's faults: ``NO_TABLE``)."""
    cfg, st_, raw = shard0
    mine = clientref.owned_keys(cfg, 0, 0)
    theirs = clientref.owned_keys(cfg, 0, 1)
    g2 = np.ones((2, 8), np.float32)
    fp16_inf = update_frames(cfg, 3, clientref.owned_keys(cfg, 3, 0)[:1], np.full((1, 12), 1e5, np.float32), 111)
    NO = consts.NO_TABLE
    cases = [
        (lookup_frames(cfg, 0, mine[:2], 101, shard_id=1), Status.WRONG_SHARD, NO),
        (multi_lookup_frames(cfg, [(2, mine[:2])], 102), Status.UNKNOWN_TABLE, 2),
        (lookup_frames(cfg, 0, mine[:2], 103, dim=9), Status.DIM_MISMATCH, 0),
        (lookup_frames(cfg, 0, mine[:2], 104, dtype=consts.DType.FP16), Status.DIM_MISMATCH, 0),
        (lookup_frames(cfg, 0, np.array([mine[0], 2000], np.uint64), 105), Status.KEY_OUT_OF_RANGE, 0),
        (lookup_frames(cfg, 0, np.array([mine[0], theirs[0]], np.uint64), 106), Status.NOT_OWNER, 0),
        (update_frames(cfg, 0, np.array([mine[0], theirs[0]], np.uint64), g2, 107), Status.NOT_OWNER, 0),
        (update_frames(cfg, 0, np.array([mine[1], mine[1]], np.uint64), g2, 108), Status.MALFORMED, 0),
        (update_frames(cfg, 0, np.array([mine[1], 2**63], np.uint64), g2, 109), Status.KEY_OUT_OF_RANGE, 0),
        (update_frames(cfg, 0, mine[:2], np.array([[1] * 8, [np.nan] * 8], np.float32), 110), Status.MALFORMED, 0),
        (fp16_inf, Status.MALFORMED, 3),  # 1e5 overflows fp16 on the wire: inf
    ]
    for frames, status, table in cases:
        raw.send(frames)
        h = _err(raw)
        assert (h.status, h.table_id, h.msg_id, h.client_id, h.shard_id) == \
            (status, table, codec.parse_header(frames[0]).msg_id, 1, 0)
        assert h.num_tables == codec.parse_header(frames[0]).num_tables  # copied from the request
    c = st_.counters()
    assert c["errors"]["DIM_MISMATCH"] == 2 and c["errors"]["NOT_OWNER"] == 2 and c["errors"]["MALFORMED"] == 3
    assert c["updates_applied"] == 0 and c["rows"]["0"] == 0 and c["rows"]["3"] == 0  # nothing applied
    assert probe(raw, cfg).header.msg_type == MsgType.LOOKUP_REPLY


def test_one_bad_table_refuses_the_whole_message(shard0):
    """A message of several tables with one bad table: one ERROR naming the first bad table in
    directory order, and nothing of the message applied — the good tables' rows untouched
    (docs/protocol.md, "Errors")."""
    cfg, st_, raw = shard0
    k0, k1, k3 = (clientref.owned_keys(cfg, t, 0)[:5] for t in (0, 1, 3))
    g = {0: np.ones((5, 8), np.float32), 1: np.ones((5, 16), np.float32), 3: np.ones((5, 12), np.float32)}
    bad_keys = np.r_[k1[:4], 5000].astype(np.uint64)  # table 1 has 5000 rows
    nan = g[3].copy()
    nan[2, 5] = np.nan
    cases = [  # (update parts, status, the table the ERROR names)
        ([(0, k0, g[0]), (1, bad_keys, g[1]), (3, k3, g[3])], Status.KEY_OUT_OF_RANGE, 1),
        ([(0, k0, g[0]), (3, k3, nan), (1, bad_keys, g[1])], Status.MALFORMED, 3),  # first bad table
        ([(3, k3, g[3]), (0, np.r_[k0[:4], k0[:1]].astype(np.uint64), g[0]), (1, k1, g[1])], Status.MALFORMED, 0),
        ([(1, k1, g[1]), (0, k0, g[0])], Status.DIM_MISMATCH, 0),  # (dims below)
    ]
    for i, (parts, status, table) in enumerate(cases):
        dims = {0: 4} if status == Status.DIM_MISMATCH else None
        if dims:
            parts = [(1, k1, g[1]), (0, k0, np.ones((5, 4), np.float32))]
        raw.send(multi_update_frames(cfg, parts, 300 + i, dims=dims))
        h = _err(raw)
        assert (h.status, h.table_id, h.msg_id, h.num_tables) == (status, table, 300 + i, len(parts))
    raw.send(multi_lookup_frames(cfg, [(3, k3), (0, np.r_[k0[:2], clientref.owned_keys(cfg, 0, 1)[:1]]), (1, bad_keys)],
                                 310))
    h = _err(raw)
    assert (h.status, h.table_id) == (Status.NOT_OWNER, 0)
    c = st_.counters()
    assert c["updates_applied"] == 0 and all(v == 0 for v in c["rows"].values()) and c["dedup_entries"] == 0
    # the same updates without the bad table are applied
    raw.send(multi_update_frames(cfg, [(0, k0, g[0]), (3, k3, g[3])], 320))
    assert raw.recv().header.msg_type == MsgType.UPDATE_ACK
    c = st_.counters()
    assert c["updates_applied"] == 1 and c["rows"] == {"0": 5, "1": 0, "3": 5}


def _body_frames(cfg, directory, keys, msg_id=400, msg_type=MsgType.LOOKUP_REQ, num_keys=None, value_len=None,
                 values=b""):
    """A request built by hand from a directory that need not add up to the header."""
    body = directory.tobytes() + np.asarray(keys, np.uint64).tobytes() + bytes(values)
    n = len(keys) if num_keys is None else num_keys
    vl = codec.value_len_of(directory) if value_len is None else value_len
    return codec.encode_message(msg_type, msg_id=msg_id, client_id=1, shard_id=0, num_tables=len(directory),
                                num_keys=n, value_len=vl, body=body, mtu=cfg.mtu)


def test_directory_that_does_not_add_up_is_malformed(shard0):
    """A directory whose counts or row bytes disagree with the header, a table twice, a zero
    count or dim, an unknown dtype: ERROR MALFORMED, naming the table where the fault is one
    table's (``codec.parse_request_body``), nothing served."""
    cfg, st_, raw = shard0
    k = clientref.owned_keys(cfg, 0, 0)[:4].astype(np.uint64)
    d = codec.make_directory([0, 1], [8, 16], [1, 1], [2, 2])
    twice = codec.make_directory([0, 0], [8, 8], [1, 1], [2, 2])
    zero_dim = codec.make_directory([0, 1], [8, 0], [1, 1], [2, 2])
    bad_dt = codec.make_directory([0, 1], [8, 16], [1, 7], [2, 2])
    cases = [  # frames, table named
        (_body_frames(cfg, d, k, value_len=codec.value_len_of(d) + 4), consts.NO_TABLE),  # row bytes != value_len
        (_body_frames(cfg, twice, k), 0),
        (_body_frames(cfg, zero_dim, k, value_len=2 * 8 * 4 + 2 * 2), 1),
        (_body_frames(cfg, bad_dt, k, value_len=2 * 8 * 4 + 2 * 2), 1),
    ]
    for i, (frames, table) in enumerate(cases):
        raw.send(frames)
        h = _err(raw)
        assert (h.status, h.table_id, h.msg_id) == (Status.MALFORMED, table, 400), i
    # an update whose directory counts 5 keys where the header says 4 (the lengths still fit)
    d5 = codec.make_directory([0], [8], [1], [5])
    raw.send(_body_frames(cfg, d5, k, msg_type=MsgType.UPDATE_REQ, value_len=4 * 32, values=bytes(4 * 32)))
    h = _err(raw)
    assert (h.status, h.table_id) == (Status.MALFORMED, consts.NO_TABLE)
    c = st_.counters()
    assert c["errors"]["MALFORMED"] == 5 and c["updates_applied"] == 0 and c["lookup_keys"] == 0
    assert probe(raw, cfg).header.msg_type == MsgType.LOOKUP_REPLY


def test_multi_fragment_refusal_answered_once(shard0):
    cfg, st_, raw = shard0
    keys = clientref.owned_keys(cfg, 1, 0)[:300]
    frames = lookup_frames(cfg, 1, keys, 7, shard_id=1)  # wrong shard, 2 fragments
    assert len(frames) == 2
    raw.send(frames[::-1])
    h = _err(raw)
    assert (h.status, h.table_id) == (Status.WRONG_SHARD, consts.NO_TABLE)
    assert probe(raw, cfg).header.msg_id == 999_999  # no second ERROR in between
    assert st_.counters()["errors"]["WRONG_SHARD"] == 1


def test_client_sees_shard_error():
    cfg = make_cfg()
    with ServerCluster(cfg) as cl:
        bad = parse_config({**cl.cfg.raw, "tables": [{**TABLES[0], "dim": 4}],
                            "shards": [{"id": s.id, "ip": s.ip, "port": s.port} for s in cl.cfg.shards]})
        with EmbeddingClient(bad, 1, bind=("127.0.0.1", 0)) as c:
            with pytest.raises(ShardError, match="DIM_MISMATCH") as e:
                c.lookup({0: np.arange(10, dtype=np.uint64)})
    assert e.value.table_id == 0


# ---- malformed frames: counted, answered or dropped, server lives on -------------------------

def _good_lookup(cfg):
    return lookup_frames(cfg, 0, clientref.owned_keys(cfg, 0, 0)[:2], 77)[0]


def _mutate(frame, **fields):
    h = codec.parse_header(frame)._replace(**fields)
    return h.pack() + frame[consts.HDR_LEN:]


@pytest.mark.parametrize("name,make,reason,answered", [
    ("truncated", lambda f: f[:43], "too_short", False),
    ("empty", lambda f: b"", "too_short", False),
    ("bad_magic", lambda f: b"\x12\x34" + f[2:], "bad_magic", False),
    ("version_1", lambda f: f[:2] + b"\x01" + f[3:], "bad_version", False),
    ("bad_version", lambda f: f[:2] + b"\x03" + f[3:], "bad_version", False),
    ("unknown_type", lambda f: f[:3] + b"\x09" + f[4:], "bad_type", False),
    ("reply_type", lambda f: _mutate(f, msg_type=MsgType.LOOKUP_REPLY, msg_len=0, frag_len=0)[:44], "bad_type", False),
    ("truncated_body", lambda f: f[:-3], "bad_length", True),
    ("length_too_big", lambda f: _mutate(f, num_keys=1000), "bad_length", True),
    ("num_tables_off", lambda f: _mutate(f, num_tables=2), "bad_length", True),
    ("value_len_below_2n", lambda f: _mutate(f, value_len=3), "bad_length", True),
    ("frag_beyond_msg", lambda f: _mutate(f, frag_offset=8), "bad_length", True),
    ("frag_count_zero", lambda f: _mutate(f, frag_count=0), "bad_length", True),
    ("frag_mismatch", lambda f: _mutate(f, frag_count=2, frag_index=1, frag_offset=0), "frag_mismatch", False),
    ("too_many_frags", lambda f: _mutate(f, frag_count=257), "too_many_frags", True),
])
def test_malformed_frame_counted_and_server_lives(shard0, name, make, reason, answered):
    cfg, st_, raw = shard0
    raw.send([make(_good_lookup(cfg))])
    m = probe(raw, cfg)  # replies come back in order: an answer to the bad frame comes first
    if answered:
        assert m.header.msg_type == MsgType.ERROR and m.header.status == Status.MALFORMED
        assert m.header.msg_id == 77 and m.header.table_id == consts.NO_TABLE
        m = raw.recv()
    assert m.header.msg_id == 999_999  # alive; nothing else was answered
    c = st_.counters()
    assert c["drops"][reason] == 1 and sum(c["drops"].values()) == 1
    assert c["errors"]["MALFORMED"] == (1 if answered else 0)
    assert c["internal_errors"] == 0 and c["requests"]["LOOKUP_REQ"] == 1


BIG_DIM = [{"id": 0, "rows": 4000, "dim": 512, "optimizer": "sgd", "lr": 0.1}]


def test_lookup_whose_reply_needs_over_256_fragments_refused():
    """A lookup whose reply (``value_len``) would need more than 256 fragments is answered
    MALFORMED for the whole message (``NO_TABLE``), at fragment 0 from the header alone."""
    cfg = make_cfg(tables=BIG_DIM)
    cap = consts.MAX_FRAGS * consts.max_body_per_frame(1500) // (512 * 4)  # 178 keys of 2 KiB rows
    with ServerThread(cfg, 0) as st_:
        raw = Raw(st_.address)
        set_socket_buffers(raw.sock)  # a 366 KB reply arrives in one burst
        keys = clientref.owned_keys(cfg, 0, 0)
        raw.send(lookup_frames(cfg, 0, keys[:cap + 1], 5))
        h = _err(raw)
        assert (h.status, h.table_id) == (Status.MALFORMED, consts.NO_TABLE)
        raw.send(lookup_frames(cfg, 0, keys[:cap], 6))
        m = raw.recv()
        raw.close()
    assert m.header.msg_type == MsgType.LOOKUP_REPLY and m.header.frag_count == 256


def test_client_splits_what_needs_over_256_fragments():
    """The client splits a shard's keys into messages whose replies fit 256 fragments; rows and
    updates equal the in-process reference."""
    cfg = make_cfg(tables=BIG_DIM)
    ref = LocalBackend(cfg)
    keys = np.arange(0, 4000, 3, dtype=np.uint64)  # 1334 keys, ~667 per shard: 4 messages each
    cap = consts.MAX_FRAGS * consts.max_body_per_frame(1500) // (512 * 4)
    per_shard = [int(routing.owns(cfg, 0, s, keys).sum()) for s in (0, 1)]
    # (msg_frames=None: only the 256-fragment bound and the window split messages here)
    with ServerCluster(cfg) as cl, EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0), msg_frames=None) as c:
        assert np.array_equal(c.lookup({0: keys})[0], ref.lookup({0: keys})[0])
        assert c.stats.messages_sent == sum(-(-n // cap) for n in per_shard)
        g = np.random.default_rng(1).standard_normal((keys.size, 512)).astype(np.float32)
        c.update({0: (keys, g)})
        ref.update({0: (keys, g)})
        assert np.array_equal(c.lookup({0: keys})[0], ref.lookup({0: keys})[0])
    assert c.drops.total() == 0


def test_oversized_request_dropped_before_buffering():
    cfg = make_cfg()
    with ServerThread(cfg, 0, max_msg_bytes=1000) as st_:
        raw = Raw(st_.address)
        keys = clientref.owned_keys(cfg, 0, 0)[:200]  # 1600 bytes of keys
        raw.send(lookup_frames(cfg, 0, keys, 3))
        h = _err(raw)
        assert h.status == Status.MALFORMED
        c = st_.counters()
        raw.close()
    assert c["drops"]["too_large"] == 2 and c["reassembly"]["pending"] == 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzz_handle_datagram_never_raises(data):
    """Random bytes and randomly corrupted valid frames straight into the handler."""
    srv = _FUZZ_SERVER
    before = srv.counters()["rx_frames"]
    kind = data.draw(st.sampled_from(["random", "flip", "field"]))
    base = _FUZZ_FRAMES[data.draw(st.integers(0, len(_FUZZ_FRAMES) - 1))]
    if kind == "random":
        frame = data.draw(st.binary(max_size=200))
    elif kind == "flip":
        b = bytearray(base)
        for _ in range(data.draw(st.integers(1, 4))):
            b[data.draw(st.integers(0, len(b) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        frame = bytes(b)
    else:
        name, off, size = data.draw(st.sampled_from(consts.HEADER_FIELDS))
        v = data.draw(st.integers(0, (1 << (8 * size)) - 1))
        frame = base[:off] + v.to_bytes(size, "big") + base[off + size:]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. NaN arithmetic in an optimizer
        srv.handle_datagram(frame, ("127.0.0.1", 9))
    c = srv.counters()
    assert c["rx_frames"] == before + 1 and c["internal_errors"] == 0
    for keys, rows, acc in srv.state_dict().values():
        assert np.isfinite(rows).all() and np.isfinite(acc).all()  # nothing poisoned a row


_FUZZ_CFG = make_cfg()
_FUZZ_SERVER = ReferenceShard(_FUZZ_CFG, 0, port=0)  # never started: replies go nowhere
_FUZZ_FRAMES = (lookup_frames(_FUZZ_CFG, 0, clientref.owned_keys(_FUZZ_CFG, 0, 0)[:3], 1)
                + update_frames(_FUZZ_CFG, 0, clientref.owned_keys(_FUZZ_CFG, 0, 0)[:40],
                                np.ones((40, 8), np.float32), 2)
                + update_frames(_FUZZ_CFG, 3, clientref.owned_keys(_FUZZ_CFG, 3, 0)[:5],
                                np.ones((5, 12), np.float32), 3)
                + multi_update_frames(_FUZZ_CFG, [(1, clientref.owned_keys(_FUZZ_CFG, 1, 0)[:3], np.ones((3, 16))),
                                                  (0, clientref.owned_keys(_FUZZ_CFG, 0, 0)[:2], np.ones((2, 8)))], 4)
                + multi_lookup_frames(_FUZZ_CFG, [(3, clientref.owned_keys(_FUZZ_CFG, 3, 0)[:2]),
                                                  (1, clientref.owned_keys(_FUZZ_CFG, 1, 0)[:30])], 5))


# ---- the command -----------------------------------------------------------------------------

def _write_cfg(tmp_path, port=0):
    p = tmp_path / "c.toml"
    p.write_text(f"""
[cluster]
seed = 1
[[tables]]
id = 0
rows = 100
dim = 4
[[shards]]
id = 0
ip = "127.0.0.1"
port = {port or 17880}
[[shards]]
id = 3
ip = "127.0.0.1"
port = 17883
[[clients]]
id = 1
ip = "127.0.0.1"
""")
    return p


def test_cli_unknown_shard_and_bad_config(tmp_path):
    p = _write_cfg(tmp_path)
    r = CliRunner().invoke(cli, ["server", "--shard", "2", "--config", str(p)])
    assert r.exit_code == 2 and "no shard 2" in r.output and "shards: 0, 3" in r.output
    bad = tmp_path / "bad.toml"
    bad.write_text("[[tables]]\nid = 0\nrows = 10\ndim = 0\n")
    r = CliRunner().invoke(cli, ["server", "--shard", "0", "--config", str(bad)])
    assert r.exit_code == 2 and "tables[0].dim" in r.output
    r = CliRunner().invoke(cli, ["server", "--shard", "0"], env={"EMBNIC_CONFIG": ""})
    assert r.exit_code == 2 and "--config" in r.output


def _spawn(args):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "embnic", "server", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def test_cli_port_in_use(tmp_path):
    holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    holder.bind(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    try:
        p = _spawn(["--shard", "0", "--config", str(_write_cfg(tmp_path)), "--port", str(port)])
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            pytest.fail("server started on a port that is in use")
    finally:
        holder.close()
    assert p.returncode == 1, err
    assert f"cannot bind 127.0.0.1:{port}: address already in use" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_serves_and_stops_cleanly(tmp_path, sig):
    p = _spawn(["--shard", "0", "--config", str(_write_cfg(tmp_path)), "--port", "0"])
    try:
        line = p.stderr.readline()
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        assert m, line
        cfg = parse_config({"cluster": {"seed": 1}, "tables": [{"id": 0, "rows": 100, "dim": 4}],
                            "shards": [{"id": 0, "ip": "127.0.0.1", "port": int(m.group(1))},
                                       {"id": 3, "ip": "127.0.0.1", "port": 17883}],
                            "clients": [{"id": 1, "ip": "127.0.0.1"}]})
        keys = clientref.owned_keys(cfg, 0, 0)[:5]
        raw = Raw(("127.0.0.1", int(m.group(1))))
        raw.send([b"garbage"])
        raw.send(lookup_frames(cfg, 0, keys, 1))
        reply = raw.recv()
        raw.close()
        assert np.array_equal(clientref.body_to_rows(reply.body, 5, 4), LocalBackend(cfg).lookup({0: keys})[0])
        p.send_signal(sig)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err
    counters = json.loads(err[err.index("counters ") + len("counters "):].splitlines()[0])
    assert counters["requests"]["LOOKUP_REQ"] == 1 and counters["drops"]["too_short"] == 1


# ---- full 64-bit ids, tables without rows ---------------------------------------------------

EDGE_IDS = [0, 1, 2**31 - 1, 2**31, 2**32, 2**32 + 1, 2**48 - 1, 2**48, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 2,
            2**64 - 1]


@pytest.mark.parametrize("sharding", ["hash", "table"])
def test_u64_ids_through_shards_equal_local_backend(sharding):
    """Tables without ``rows``: any uint64 id is a row of its own, served by its owner, and the
    numbers equal the in-process reference bit for bit."""
    tables = [{"id": 0, "dim": 8, "optimizer": "adagrad", "lr": 0.1}, {"id": 7, "dim": 4, "optimizer": "sgd"},
              {"id": 3, "rows": 1000, "dim": 12}]
    cfg = make_cfg(3, sharding, tables=tables)
    ref = LocalBackend(cfg)
    rng = np.random.default_rng(5)
    big = rng.integers(0, 2**64 - 1, 300, dtype=np.uint64, endpoint=True)
    keys = np.unique(np.r_[np.array(EDGE_IDS, np.uint64), big])
    with ServerCluster(cfg) as cl, EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0)) as c:
        for step in range(3):
            got = c.lookup({0: keys, 7: keys, 3: keys[keys < 1000]})
            for tid, k in ((0, keys), (7, keys)):
                assert np.array_equal(got[tid], ref.lookup({tid: k})[tid]), (step, tid)
            g = {tid: rng.standard_normal((keys.size, cfg.table(tid).dim)).astype(np.float32) for tid in (0, 7)}
            c.update({tid: (keys, g[tid]) for tid in g})
            for tid in g:
                ref.update({tid: (keys, g[tid])})
        # Python ints near 2^64 reach the right rows too (no float round trip)
        got = c.lookup({0: [2**64 - 1, 2**63, 5]})[0]
        assert np.array_equal(got, ref.lookup({0: np.array([2**64 - 1, 2**63, 5], np.uint64)})[0])
        counters = cl.counters()
    assert all(sum(v["errors"].values()) == 0 for v in counters), counters
    state, want = cl.state_dict(), ref.state_dict()
    for tid in (0, 7):
        assert np.array_equal(state[tid][0], keys) and np.array_equal(want[tid][0], keys)
        assert np.array_equal(state[tid][1], want[tid][1]) and np.array_equal(state[tid][2], want[tid][2])


def test_rows_bound_still_refused_by_server():
    cfg = make_cfg(1)
    with ServerThread(cfg, 0) as st_:
        raw = Raw(("127.0.0.1", st_.port))
        raw.send(lookup_frames(cfg, 0, np.array([5, 2**63], np.uint64), 11))
        m = raw.recv()
        assert m.header.msg_type == MsgType.ERROR and m.header.status == Status.KEY_OUT_OF_RANGE


def test_client_empty_requests_and_a_shard_without_ids():
    """A table with no ids sends nothing and gets (0, dim) rows; ids all on one shard leave
    the other shard without a message."""
    cfg = make_cfg(2)
    ref = LocalBackend(cfg)
    one_shard = clientref.owned_keys(cfg, 0, 1)[:5]
    with ServerCluster(cfg) as cl, EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0)) as c:
        got = c.lookup({0: np.empty(0, np.uint64), 1: []})
        assert got[0].shape == (0, 8) and got[1].shape == (0, 16) and c.stats.messages_sent == 0
        c.update({0: (np.empty(0, np.uint64), np.empty((0, 8), np.float32))})
        assert c.stats.messages_sent == 0
        got = c.lookup({0: one_shard})
        assert np.array_equal(got[0], ref.lookup({0: one_shard})[0]) and c.stats.messages_sent == 1
        counters = cl.counters()
        probes = c.stats.probes  # the client's one-key tail probe after the message (it may still be on its way)
    n0, n1 = [sum(s["requests"].values()) for s in counters]
    assert n0 == 0 and 1 <= n1 <= 1 + probes and probes == 1


def _fault_oracle(srv, cfg, parts, update):
    """The per-table rule of docs/protocol.md "Errors", table by table (the readable statement
    ShardState.table_fault vectorises): the first bad table in directory order and why."""
    from embnic.client_lib.table_numerics import gradient_rows_ok, is_unique

    for tid, dim, dt, keys, g in parts:
        t = next((x for x in cfg.tables if x.id == tid), None)
        if t is None:
            return Status.UNKNOWN_TABLE, tid
        if dim != t.dim or dt != t.wire_dtype:
            return Status.DIM_MISMATCH, tid
        if t.rows is not None and int(keys.max()) >= t.rows:
            return Status.KEY_OUT_OF_RANGE, tid
        if not routing.owns(cfg, tid, srv.shard_id, keys).all():
            return Status.NOT_OWNER, tid
        if update and (not is_unique(keys) or not gradient_rows_ok(t, g).all()):
            return Status.MALFORMED, tid
    return None


@pytest.mark.parametrize("sharding,shards", [("hash", 2), ("hash", 1), ("table", 2)])
def test_table_fault_equals_the_per_table_rule(sharding, shards):
    """ShardState.table_fault (vectorised over tables and keys, with a gradient bound as a
    shortcut) against the rule table by table, on 3000 random messages of 1-5 tables with every
    kind of fault (unknown table, dim, dtype, range, owner, duplicates sorted or not, NaN, inf,
    gradients just below and above the bound, a table with lr 1e30), lookups and updates."""

    tables = TABLES + [{"id": 5, "dim": 4, "optimizer": "sgd", "lr": 1e30},
                       {"id": 6, "dim": 2, "optimizer": "adagrad", "dtype": "fp16"}]
    cfg = make_cfg(shards, sharding, tables=tables)
    srv = ShardState(cfg, 0)
    rng = np.random.default_rng(1)
    seen = collections.Counter()
    for trial in range(3000):
        update = bool(trial % 2)
        T = int(rng.integers(1, 6))
        tids = [int(x) for x in rng.choice([0, 1, 3, 5, 6, 9], size=T, replace=False)]
        parts = []
        for tid in tids:
            t = next((x for x in cfg.tables if x.id == tid), None)
            dim = t.dim if t else 8
            dt = t.wire_dtype if t else 1
            if rng.random() < 0.03:
                dim += 1
            if rng.random() < 0.03:
                dt = 3 - dt
            n = int(rng.integers(1, 30))
            pool = clientref.owned_keys(cfg, tid, 0) if t is not None and t.rows is not None else []
            if len(pool) == 0 or rng.random() < 0.1:
                pool = rng.integers(0, 2**64 - 1, 200, dtype=np.uint64, endpoint=True)
            keys = np.sort(rng.choice(pool, min(n, pool.size), replace=False)).astype(np.uint64)
            r = rng.random()
            if r < 0.03 and keys.size > 1:
                keys[-1] = keys[0]  # a duplicate, unsorted
            elif r < 0.06 and keys.size > 1:
                keys[1] = keys[0]  # a duplicate, sorted
            elif r < 0.08:
                keys[-1] = np.uint64(2**63)  # out of range (or another shard's)
            elif r < 0.1 and keys.size > 1:
                keys = keys[::-1].copy()  # unsorted, unique
            g = (rng.standard_normal((keys.size, dim)) * 0.1).astype(np.float32)
            r = rng.random()
            if t is not None and r < 0.15:
                b = min(gradient_bound(t), 3e38) * float(rng.choice([0.5, 0.999, 1.0, 1.001, 2.0, 1e5]))
                with np.errstate(over="ignore"):
                    g[int(rng.integers(0, keys.size)), int(rng.integers(0, dim))] = np.float32(b)
            elif r < 0.2:
                g[0, 0] = rng.choice([np.nan, np.inf, -np.inf, 7e4])
            parts.append((tid, dim, dt, keys, g))
        d = codec.make_directory([p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts],
                                 [p[3].size for p in parts])
        keys = np.concatenate([p[3] for p in parts])
        with np.errstate(over="ignore", invalid="ignore"):
            if update:
                fr = codec.encode_update(msg_id=trial, client_id=1, shard_id=0, directory=d, keys=keys,
                                         values=codec.values_to_body([p[4] for p in parts], [p[2] for p in parts]),
                                         mtu=9000)
            else:
                fr = codec.encode_lookup(msg_id=trial, client_id=1, shard_id=0, directory=d, keys=keys, mtu=9000)
        h = codec.parse_header(fr[0])
        body = b"".join(f[consts.HDR_LEN:] for f in fr)
        rb = codec.parse_request_body(h, body)
        grads = srv.gradients(rb) if update else None
        # the oracle sees the gradients as the shard does: after the wire's rounding
        eo = grads[1] if update else None
        oparts = [(p[0], p[1], p[2], p[3], grads[0][eo[i]:eo[i + 1]].reshape(-1, p[1]) if update else None)
                  for i, p in enumerate(parts)]
        want = _fault_oracle(srv, cfg, oparts, update)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = srv.table_fault(rb, grads)
        assert got == want, (trial, got, want, [(p[0], p[1], p[2]) for p in parts])
        seen[want[0].name if want else "ok"] += 1
    assert set(seen) >= {"ok", "UNKNOWN_TABLE", "DIM_MISMATCH", "KEY_OUT_OF_RANGE", "MALFORMED"} | (
        {"NOT_OWNER"} if shards > 1 and sharding == "hash" else set()), seen


def _retransmit(frame):
    return frame[:4] + bytes([frame[4] | consts.Flags.RETRANSMIT]) + frame[5:]


def test_update_poll_nack_and_ack(shard0):
    """Lost updates fragment by fragment (docs/protocol.md, "Reliability"): a poll (the last
    fragment re-sent, RETRANSMIT) of an update the shard holds in part draws UPDATE_NACK with the
    bitmap of what it holds; the missing fragments re-sent draw no NACK of their own and complete
    it (one ACK, applied once); a poll after that is acked from the window, not applied again;
    a poll with nothing held names only itself; a refused update is not in the window."""
    cfg, st_, raw = shard0
    rng = np.random.default_rng(3)
    parts = [(0, owned_keys(cfg, 0, 0, 120, rng), rng.standard_normal((120, 8)).astype(np.float32)),
             (1, owned_keys(cfg, 1, 0, 60, rng), rng.standard_normal((60, 16)).astype(np.float32))]
    fr = multi_update_frames(cfg, parts, 500)
    n = len(fr)
    assert n >= 6
    raw.send([f for i, f in enumerate(fr) if i not in (1, 3, n - 1)])
    raw.send([_retransmit(fr[-1])])  # the poll
    m = raw.recv()
    assert (m.header.msg_type, m.header.msg_id, m.header.num_tables, m.header.num_keys) == \
        (MsgType.UPDATE_NACK, 500, 2, 180)
    held = clientref.nack_held(m.body, n)
    assert held.tolist() == [i not in (1, 3) for i in range(n)]
    raw.send([_retransmit(fr[1]), _retransmit(fr[3])])  # exactly the others
    a = raw.recv()
    assert (a.header.msg_type, a.header.msg_id) == (MsgType.UPDATE_ACK, 500)  # no NACK before it
    raw.send([_retransmit(fr[-1])])  # the ack was lost: poll again
    a = raw.recv()
    assert (a.header.msg_type, a.header.msg_id) == (MsgType.UPDATE_ACK, 500)
    # a poll of an update of which nothing arrived
    fr2 = multi_update_frames(cfg, parts[:1], 501)
    raw.send([_retransmit(fr2[-1])])
    m = raw.recv()
    assert m.header.msg_type == MsgType.UPDATE_NACK
    assert np.flatnonzero(clientref.nack_held(m.body, len(fr2))).tolist() == [len(fr2) - 1]
    # a refused update: ERROR, and a poll finds it not applied (NACK: only the poll held)
    bad = [(0, parts[0][1], np.where(np.arange(120)[:, None] == 7, np.nan, parts[0][2]).astype(np.float32))]
    fr3 = multi_update_frames(cfg, bad, 502)
    raw.send(fr3)
    assert _err(raw).status == Status.MALFORMED
    raw.send([_retransmit(fr3[-1])])
    assert raw.recv().header.msg_type == MsgType.UPDATE_NACK
    c = st_.counters()
    assert c["update_polls"] == 4 and c["update_nacks"] == 3 and c["update_poll_acks"] == 1
    assert c["updates_applied"] == 1 and c["duplicates"] == 0
    ref = LocalBackend(cfg)
    for tid, k, g in parts:
        ref.update({tid: (k, g)})
    state, want = st_.state_dict(), ref.state_dict()
    for tid in want:
        for x, y in zip(state[tid], want[tid]):
            assert np.array_equal(x, y), tid
