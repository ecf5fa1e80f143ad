"""The fixed-length baseline (docs/protocol.md, "Size messages"): a size round before every data
round, shards that take only announced data, on real UDP shards of both engines.

Run alone: python3 -m pytest -q tests/testbed/test_fixed_length.py
"""
from __future__ import annotations

import socket

import numpy as np
import pytest

from embnic.client_lib import codec
from embnic.client_lib.client import EmbeddingClient, ShardUnavailableError
from embnic.client_lib.config import parse_config
from embnic.client_lib.consts import MsgType, Status
from embnic.client_lib.local import LocalBackend
from embnic.client_lib.reassembly import Reassembler
from embnic.testbed.server.runner import ServerCluster, ServerThread

from reference_shard import engine_kw
import clientref

TABLES = [{"id": 0, "dim": 8, "optimizer": "adagrad", "lr": 0.1},
          {"id": 4, "rows": 30000, "dim": 16, "optimizer": "sgd", "lr": 0.3, "dtype": "fp16"}]


def make_cfg(sharding="hash", **cluster):
    return parse_config({
        "cluster": {"seed": 11, "sharding": sharding, "timeout_ms": 200, "retries": 10, **cluster},
        "tables": TABLES,
        "shards": [{"id": i, "ip": "127.0.0.1", "port": 7900 + i} for i in range(2)],
        "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7990}],
    })


def batch(seed, n=3000):
    rng = np.random.default_rng(seed)
    return {0: np.unique(rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)),
            4: np.unique(rng.integers(0, 30000, n, dtype=np.uint64))}


@pytest.mark.parametrize("engine", ["reference", "batch"])
@pytest.mark.parametrize("sharding", ["hash", "table"])
def test_fixed_length_client_and_shards_match_the_reference(engine, sharding):
    cfg = make_cfg(sharding)
    ref = LocalBackend(cfg)
    with ServerCluster(cfg, fixed_length=True, **engine_kw(engine)) as cl, \
            EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0), fixed_length=True, rto_min_ms=1000) as c:
        for step in range(3):
            b = batch(step)
            got = c.lookup(b)
            for t, k in b.items():
                assert np.array_equal(got[t], ref.lookup({t: k})[t])
            g = {t: (k, np.full((len(k), cfg.table(t).dim), 0.01 * (step + 1), np.float32)) for t, k in b.items()}
            c.update(g)
            for t, (k, gr) in g.items():
                ref.update({t: (k, gr)})
        got = c.lookup(batch(0))
        assert all(np.array_equal(got[t], ref.lookup({t: k})[t]) for t, k in batch(0).items())
        s = c.stats
        assert s.rounds == 2 * (3 * 2 + 1) and s.size_rounds == 3 * 2 + 1  # a size round before each
        assert s.retransmits == 0  # nothing lost (the 1 s RTO floor, RFC 6298's, rides out a busy machine)
        counters = cl.counters()
    shards_used = {sid for sid in range(2) if counters[sid]["requests"]["LOOKUP_REQ"]}
    assert sum(x["requests"]["SIZE_REQ"] for x in counters) == len(shards_used) * 7  # one per shard per round
    for x in counters:
        assert x["drops"]["unannounced"] == 0 and x["drops"]["size_mismatch"] == 0


@pytest.mark.parametrize("engine", ["reference", "batch"])
def test_fixed_length_shard_drops_unannounced_data(engine):
    cfg = make_cfg()
    with ServerCluster(cfg, fixed_length=True, **engine_kw(engine)) as cl, \
            EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0), timeout_ms=20, retries=2) as c:
        with pytest.raises(ShardUnavailableError):
            c.lookup({0: np.arange(5, dtype=np.uint64)})
        counters = cl.counters()
    assert sum(x["drops"]["unannounced"] for x in counters) >= 2  # the lookup and its retransmission
    assert sum(x["requests"]["LOOKUP_REQ"] for x in counters) == 0


def _raw(dest):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(10.0)  # a bound for a broken shard, not a timing assertion

    def ask(frames):
        for f in frames:
            s.sendto(f, dest)
        r = Reassembler(expect="reply")
        while True:
            m = r.feed(s.recvfrom(65536)[0])
            if m is not None:
                return m.header
    return s, ask


def _entries(*rows):
    e = np.zeros(len(rows), codec.SIZE_ENTRY_DTYPE)
    for i, r in enumerate(rows):
        e[i] = r
    return e


@pytest.mark.parametrize("engine", ["reference", "batch"])
def test_size_req_checked_and_data_must_match_the_announcement(engine):
    """SIZE_REQ entries (msg_id, msg_type, reserved, num_tables, num_keys, msg_len): an entry that
    does not fit its type is refused whole (MALFORMED, nothing remembered); announced messages of
    several tables are served; one whose header disagrees with its entry is dropped as
    ``size_mismatch`` and answered MALFORMED; one never announced is dropped ``unannounced``."""
    from embnic.client_lib import routing

    from test_server import multi_lookup_frames, multi_update_frames

    cfg = make_cfg()
    with ServerThread(cfg, 0, fixed_length=True, **engine_kw(engine)) as st:
        s, ask = _raw(("127.0.0.1", st.port))
        try:
            lk = MsgType.LOOKUP_REQ
            for i, bad in enumerate([(70, lk, 0, 1, 3, 25),          # 16 + 24 = 40 bytes, not 25
                                     (71, lk, 0, 0, 3, 24),          # no table
                                     (72, lk, 0, 4, 3, 88),          # more tables than keys
                                     (73, MsgType.UPDATE_REQ, 0, 1, 3, 16 + 24 + 5),  # 5 value bytes < 2 per key
                                     (74, MsgType.SIZE_REQ, 0, 1, 3, 40)]):
                h = ask(clientref.encode_size(msg_id=900 + i, client_id=1, shard_id=0,
                                          entries=_entries((80, lk, 0, 1, 1, 24), bad)))
                assert (h.msg_type, h.status) == (MsgType.ERROR, Status.MALFORMED), bad
            k0 = clientref.owned_keys(cfg, 4, 0)[:3]
            k1 = np.array([k for k in range(5000) if routing.owns(cfg, 0, 0, np.array([k], np.uint64))[0]][:2],
                          np.uint64)
            ok_lookup = multi_lookup_frames(cfg, [(4, k0), (0, k1)], 81)
            ok_update = multi_update_frames(cfg, [(0, k1, np.ones((2, 8), np.float32)),
                                                  (4, k0, np.ones((3, 16), np.float32))], 82)
            bigger = multi_lookup_frames(cfg, [(4, k0), (0, np.r_[k1, k1 + np.uint64(10**9)][:3])], 83)
            ents = [(m, t, 0, h.num_tables, h.num_keys, h.msg_len) for m, t, h in
                    ((81, lk, codec.parse_header(ok_lookup[0])), (82, MsgType.UPDATE_REQ, codec.parse_header(ok_update[0])),
                     (83, lk, codec.parse_header(ok_lookup[0])))]  # 83 announced with 81's size
            h = ask(clientref.encode_size(msg_id=910, client_id=1, shard_id=0, entries=_entries(*ents)))
            assert (h.msg_type, h.num_keys, h.msg_id, h.num_tables) == (MsgType.SIZE_ACK, 3, 910, 0)
            h = ask(ok_lookup)
            assert (h.msg_type, h.msg_id, h.num_tables, h.value_len) == (MsgType.LOOKUP_REPLY, 81, 2, 3 * 32 + 2 * 32)
            assert ask(ok_update).msg_type == MsgType.UPDATE_ACK
            h = ask(bigger)
            assert (h.msg_type, h.status, h.msg_id) == (MsgType.ERROR, Status.MALFORMED, 83)
            for f in multi_lookup_frames(cfg, [(0, k1)], 84):  # never announced: dropped, unanswered
                s.sendto(f, ("127.0.0.1", st.port))
            h = ask(clientref.encode_size(msg_id=911, client_id=1, shard_id=0, entries=_entries((85, lk, 0, 1, 2, 32))))
            assert (h.msg_type, h.msg_id) == (MsgType.SIZE_ACK, 911)  # the next answer: nothing for 84
            counters = st.counters()
            assert counters["drops"]["size_mismatch"] == 1 and counters["drops"]["unannounced"] == 1
            assert counters["errors"]["MALFORMED"] == 6
            assert counters["requests"]["SIZE_REQ"] == 7 and counters["announced"] == 4
            assert counters["updates_applied"] == 1 and counters["lookup_keys"] == 5
        finally:
            s.close()
