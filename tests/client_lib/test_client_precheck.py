"""EmbeddingClient checks a whole lookup/update round before sending anything (client_lib/precheck.py).

Issue 23's cases on real UDP shards (two, hash-sharded, so every table's keys reach both): a
gradient of the wrong shape either way, duplicate keys, a key out of one table's ``rows``, a NaN
or inf row (an fp16 overflow too) — each a ValueError naming the table and the problem, with no
frame sent and no row changed on any shard, while the same round made valid is applied whole.
The per-table adapters of LocalBackend (the training loop's, the PyTorch module's) refuse a
round whole too.

Run alone: python3 -m pytest -q tests/client_lib/test_client_precheck.py
"""
from __future__ import annotations

import numpy as np
import pytest

from embnic.client_lib import precheck
from embnic.client_lib.client import EmbeddingClient
from embnic.client_lib.config import parse_config
from embnic.client_lib.local import LocalBackend
from embnic.testbed.server.runner import ServerCluster

from pyplan import split_by_shard

TABLES = [{"id": 0, "name": "a", "rows": 1000, "dim": 4, "optimizer": "adagrad", "lr": 0.1},
          {"id": 1, "name": "b", "rows": 1000, "dim": 4, "optimizer": "sgd", "lr": 0.3},
          {"id": 2, "name": "h", "rows": 1000, "dim": 4, "dtype": "fp16", "optimizer": "sgd", "lr": 0.3}]


def make_cfg():
    return parse_config({
        "cluster": {"seed": 5, "sharding": "hash", "timeout_ms": 200, "retries": 10},
        "tables": TABLES,
        "shards": [{"id": i, "ip": "127.0.0.1", "port": 7900 + i} for i in range(2)],
        "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7990}],
    })


KEYS = np.arange(0, 40, 3, dtype=np.uint64)  # 14 keys, on both shards


def good_round():
    g = np.linspace(-1, 1, KEYS.size * 4, dtype=np.float32).reshape(KEYS.size, 4)
    return {0: (KEYS, g), 1: (KEYS, 2 * g)}


def with_table1(keys, grads):
    r = good_round()
    r[1] = (keys, grads)
    return r


def nan_row():
    g = np.ones((KEYS.size, 4), np.float32)
    g[7, 2] = np.nan
    return g


BAD_UPDATES = {  # name: (round, message)
    "2 keys, grads (3, 4)": (with_table1(KEYS[:2], np.ones((3, 4), np.float32)),
                             r"table 1 \(b\): grads shape \(3, 4\), expected \(2, 4\)"),
    "3 keys, grads (2, 4)": (with_table1(KEYS[:3], np.ones((2, 4), np.float32)),
                             r"table 1 \(b\): grads shape \(2, 4\), expected \(3, 4\)"),
    "grads of another dim": (with_table1(KEYS, np.ones((KEYS.size, 5), np.float32)),
                             r"table 1 \(b\): grads shape \(14, 5\), expected \(14, 4\)"),
    "duplicate keys": (with_table1(np.array([3, 9, 3], np.uint64), np.ones((3, 4), np.float32)),
                       r"table 1 \(b\): duplicate key 3"),
    "key >= rows": (with_table1(np.append(KEYS, np.uint64(1000)), np.ones((KEYS.size + 1, 4), np.float32)),
                    r"table 1 \(b\): key 1000 >= rows 1000 \(1 of 15 keys"),
    "NaN row": (with_table1(KEYS, nan_row()), r"table 1 \(b\): non-finite gradient for key 21 \(1 of 14 rows"),
    "inf row": (with_table1(KEYS, np.where(np.arange(KEYS.size * 4).reshape(-1, 4) == 9, np.inf, 1.0).astype(np.float32)),
                r"table 1 \(b\): non-finite gradient for key 6"),
    "Adagrad's g² overflows": ({**good_round(), 0: (KEYS, np.full((KEYS.size, 4), 1e20, np.float32))},
                               r"table 0 \(a\): non-finite gradient .* its square overflows"),
    "fp16 overflow": ({**good_round(), 2: (KEYS, np.full((KEYS.size, 4), 7e4, np.float32))},
                      r"table 2 \(h\): non-finite gradient .*in fp16"),
    "string grads": (with_table1(KEYS, np.full((KEYS.size, 4), "x")), r"table 1 \(b\): grads must be real numbers"),
    "negative key": (with_table1(np.array([-1, 2]), np.ones((2, 4), np.float32)), r"table 1 \(b\): keys: negative id"),
    "float keys": (with_table1(np.array([1.0, 2.0]), np.ones((2, 4), np.float32)), r"table 1 \(b\): keys: ids must be integers"),
    "unknown table": ({**good_round(), 9: (KEYS, np.ones((KEYS.size, 4), np.float32))}, r"unknown table 9"),
    "not a pair": ({**good_round(), 1: KEYS}, r"table 1 \(b\): an update entry is \(keys, grads\)"),
}


@pytest.fixture(scope="module")
def cluster():
    with ServerCluster(make_cfg()) as cl:
        yield cl


def test_the_cases_reach_both_shards():
    cfg = make_cfg()
    assert {s for s, _, _ in split_by_shard(cfg, 1, KEYS)} == {0, 1}


@pytest.mark.parametrize("case", sorted(BAD_UPDATES))
def test_bad_update_is_refused_before_anything_is_sent(cluster, case):
    rnd, msg = BAD_UPDATES[case]
    applied = sum(x["updates_applied"] + sum(x["errors"].values()) for x in cluster.counters())
    with EmbeddingClient(cluster.cfg, 1, bind=("127.0.0.1", 0)) as c:
        before = c.lookup({0: KEYS, 1: KEYS})
        sent = c.stats.frames_sent
        with pytest.raises(ValueError, match=msg):
            c.update(rnd)
        assert c.stats.frames_sent == sent  # not one frame of the round left
        after = c.lookup({0: KEYS, 1: KEYS})
    for t in (0, 1):  # table 0 (valid, listed first) unchanged on both shards too
        np.testing.assert_array_equal(after[t], before[t])
    assert sum(x["updates_applied"] + sum(x["errors"].values()) for x in cluster.counters()) == applied


def test_bad_lookup_is_refused_before_anything_is_sent(cluster):
    with EmbeddingClient(cluster.cfg, 1, bind=("127.0.0.1", 0)) as c:
        for req, msg in (({0: KEYS, 1: np.array([5, 1000, 1001], np.uint64)},
                          r"table 1 \(b\): key 1001 >= rows 1000 \(2 of 3 keys"),
                         ({0: KEYS, 7: KEYS}, r"unknown table 7"),
                         ({0: np.zeros((2, 2), np.uint64)}, r"table 0 \(a\): keys: values must be a 1-D id array"),
                         ([KEYS], r"a lookup takes \{table_id: keys\}")):
            with pytest.raises(ValueError, match=msg):
                c.lookup(req)
        assert c.stats.frames_sent == 0
        rows = c.lookup({1: np.array([4, 4, 999], np.uint64)})[1]  # duplicates are fine in a lookup
        np.testing.assert_array_equal(rows[0], rows[1])


def test_a_table_id_of_another_type_is_no_table_on_every_path(cluster):
    """{"1": keys} or {1.5: keys} is unknown to the client's fast path as to LocalBackend (it was
    looked up as table 1 by the client, converted to int64)."""
    g = np.ones((KEYS.size, 4), np.float32)
    with EmbeddingClient(cluster.cfg, 1, bind=("127.0.0.1", 0)) as c:
        for backend in (c, LocalBackend(cluster.cfg)):
            for tid, msg in (("1", r"unknown table '1' \(tables of"), (1.5, r"unknown table 1\.5 \(tables of")):
                with pytest.raises(ValueError, match=msg):
                    backend.lookup({0: KEYS, tid: KEYS})
                with pytest.raises(ValueError, match=msg):
                    backend.update({0: (KEYS, g), tid: (KEYS, g)})
        assert c.stats.frames_sent == 0
        assert c.lookup({np.int64(1): KEYS})[1].shape == (KEYS.size, 4)  # numpy ints are table ids


def test_valid_round_is_applied_whole_like_the_reference():
    cfg = make_cfg()
    ref = LocalBackend(cfg)
    with ServerCluster(cfg) as cl, EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0)) as c:
        rnd = good_round()
        rnd[2] = (KEYS, np.full((KEYS.size, 4), 0.5, np.float32))
        c.update(rnd)
        ref.update(rnd)
        got = c.lookup({0: KEYS, 1: KEYS, 2: KEYS})
    for t in (0, 1, 2):
        np.testing.assert_array_equal(got[t], ref.lookup({t: KEYS})[t])
        assert not np.array_equal(got[t], LocalBackend(cfg).lookup({t: KEYS})[t])


def _flat_update(update):
    """A flat round's update (``update_flat``) called with a ``{table: (keys, grads)}`` round."""
    def call(rnd):
        ts = list(rnd)
        update(np.array(ts), [len(rnd[t][0]) for t in ts], np.concatenate([np.asarray(rnd[t][0], np.uint64) for t in ts]),
               np.concatenate([np.asarray(rnd[t][1], np.float32).reshape(-1) for t in ts]))
    return call


@pytest.mark.parametrize("case", ["NaN row", "key >= rows", "duplicate keys"])
def test_local_backend_refuses_a_round_whole_mapping_or_flat(case):
    rnd, msg = BAD_UPDATES[case]
    cfg = make_cfg()
    for make in (lambda lb: lb.update, lambda lb: _flat_update(lb.update_flat)):
        lb = LocalBackend(cfg)
        with pytest.raises(ValueError, match=msg):
            make(lb)(rnd)
        assert all(len(k) == 0 for k, _, _ in lb.state_dict().values())  # table 0 untouched


def test_precheck_returns_what_the_round_sends():
    cfg = make_cfg()
    out = precheck.update_round(cfg, {1: ([2**3, 7], np.ones((2, 4)))})
    k, g = out[1]
    assert k.dtype == np.uint64 and k.tolist() == [8, 7] and g.dtype == np.float32 and g.shape == (2, 4)
    assert precheck.lookup_round(cfg, {0: [999, 0, 999]})[0].tolist() == [999, 0, 999]


def test_unknown_table_lists_the_ids_as_ranges():
    """A config of 26 tables listed every id in the error; runs are ranges now."""
    from pathlib import Path

    from embnic.client_lib.config import id_ranges, load_config

    assert id_ranges(range(26)) == "0..25"
    assert id_ranges([9, 0, 1, 2, 3, 7, 10, 3]) == "0..3, 7, 9..10"
    assert id_ranges([]) == ""
    cfg = load_config(Path(__file__).parents[2] / "examples" / "plan-criteo1tb.toml")
    with pytest.raises(ValueError, match=r"unknown table 99 \(tables of .*plan-criteo1tb.toml: 0\.\.25\)$"):
        precheck.lookup_round(cfg, {99: KEYS})
