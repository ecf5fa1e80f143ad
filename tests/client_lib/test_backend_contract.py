"""The backend contract (embnic.client_lib.backend) and LocalBackend, its in-process reference.

* LocalBackend keeps every table in one row store and serves whole rounds: its rows equal, bit
  for bit, one TableShard per table driven one table at a time (the per-table reference it was
  before), over tables of several dims, fp16 and fp32, SGD and Adagrad, with and without rows;
* the mapping and the flat layout of a round give the same rows and the same updates;
* every backend (LocalBackend, EmbeddingClient, the DLRM workers' DeferredUpdates) implements
  the protocol; an object with per-table methods only is refused naming what it lacks.

Run alone: python3 -m pytest -q tests/client_lib/test_backend_contract.py
"""
import numpy as np
import pytest

from embnic.client_lib.backend import Backend, require_backend
from embnic.client_lib.client import EmbeddingClient
from embnic.client_lib.config import parse_config
from embnic.client_lib.local import LocalBackend
from embnic.client_lib.rowstore import TableShard
from embnic.client_lib.table_numerics import validate_keys, validate_update, wire_round

TABLES = [
    {"id": 3, "name": "a", "rows": 500, "dim": 8, "optimizer": "adagrad", "lr": 0.1, "init_scale": 0.5},
    {"id": 1, "name": "b", "rows": 300, "dim": 4, "optimizer": "sgd", "lr": 0.05, "dtype": "fp16"},
    {"id": 7, "name": "c", "dim": 6, "optimizer": "adagrad", "lr": 0.2, "dtype": "fp16"},
    {"id": 2, "name": "d", "rows": 1000, "dim": 8, "optimizer": "sgd", "lr": 0.3},
]


def _cfg(tables=TABLES):
    return parse_config({"cluster": {"seed": 21}, "tables": tables,
                         "shards": [{"id": 0, "ip": "127.0.0.1", "port": 21900}],
                         "clients": [{"id": 1, "ip": "127.0.0.1", "port": 21910}]})


class PerTable:
    """The reference LocalBackend was: one TableShard per table, one table at a time."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.tables = {t.id: TableShard(t, cfg.seed) for t in cfg.tables}

    def lookup(self, tid, keys):
        ts = self.tables[tid]
        return wire_round(ts.lookup(validate_keys(ts.table, keys)), ts.table.dtype)

    def update(self, tid, keys, grads):
        ts = self.tables[tid]
        k, g = validate_update(ts.table, keys, grads)
        ts.apply(k, wire_round(g, ts.table.dtype))


def _round(cfg, rng, tids):
    """``{table: (sorted unique keys, grads)}`` of ``tids`` (a table may get no keys)."""
    out = {}
    for t in tids:
        tc = cfg.table(t)
        hi = tc.rows or 2**64 - 1
        n = int(rng.integers(0, 40))
        keys = np.unique(rng.integers(0, min(hi, 2000), n, dtype=np.uint64))
        if tc.rows is None:
            keys = np.unique(np.concatenate([keys, np.array([2**64 - 1, 2**63], np.uint64)]))
        out[t] = (keys, rng.normal(0, 0.5, (keys.size, tc.dim)).astype(np.float32))
    return out


def _flat(rnd):
    ts = list(rnd)
    return (np.array(ts, np.int64), np.array([rnd[t][0].size for t in ts], np.int64),
            np.concatenate([rnd[t][0] for t in ts]), np.concatenate([rnd[t][1].reshape(-1) for t in ts]))


@pytest.mark.parametrize("flat", [False, True], ids=["mapping", "flat"])
def test_whole_rounds_equal_the_per_table_reference_bit_for_bit(flat):
    cfg = _cfg()
    lb, ref = LocalBackend(cfg), PerTable(cfg)
    rng = np.random.default_rng(5)
    ids = [t.id for t in cfg.tables]
    for step in range(12):
        tids = list(rng.permutation(ids)[:int(rng.integers(1, len(ids) + 1))])
        rnd = _round(cfg, rng, tids)
        if flat:
            t_ids, counts, keys, grads = _flat(rnd)
            vals = lb.lookup_flat(t_ids, counts, keys)
            assert vals.dtype == np.float32 and vals.ndim == 1
            want = np.concatenate([ref.lookup(t, rnd[t][0]).reshape(-1) for t in tids])
            assert np.array_equal(vals, want), step
            lb.update_flat(t_ids, counts, keys, grads)
        else:
            got = lb.lookup({t: k for t, (k, _) in rnd.items()})
            assert list(got) == tids
            for t in tids:
                assert got[t].shape == (rnd[t][0].size, cfg.table(t).dim) and got[t].dtype == np.float32
                assert np.array_equal(got[t], ref.lookup(t, rnd[t][0])), (step, t)
            lb.update(rnd)
        for t, (k, g) in rnd.items():
            ref.update(t, k, g)
    probe = {t: np.arange(0, 300, 3, dtype=np.uint64) for t in ids}
    got = lb.lookup(probe)
    for t in ids:
        assert np.array_equal(got[t], ref.lookup(t, probe[t])), t
        for a, b in zip(lb.state_dict()[t], ref.tables[t].state()):
            assert np.array_equal(a, b), t


def test_lookup_allows_duplicates_and_leaves_the_callers_gradients_alone():
    cfg = _cfg()
    lb = LocalBackend(cfg)
    rows = lb.lookup({1: np.array([4, 4, 9], np.uint64)})[1]
    assert np.array_equal(rows[0], rows[1]) and not np.array_equal(rows[0], rows[2])
    g = np.full((2, 4), 1e-4 + 1e-8, np.float32)  # not a float16 value: rounded on the way
    keep = g.copy()
    lb.update({1: (np.array([2, 5], np.uint64), g)})
    assert np.array_equal(g, keep)
    assert lb.lookup_flat([], [], np.zeros(0, np.uint64)).shape == (0,)
    lb.update_flat([], [], np.zeros(0, np.uint64), np.zeros(0, np.float32))
    assert lb.lookup({}) == {}


@pytest.mark.parametrize("call, match", [
    (lambda lb: lb.update({3: (np.array([1, 2], np.uint64), np.zeros((2, 8), np.float32)),
                           2: (np.array([1, 1], np.uint64), np.zeros((2, 8), np.float32))}), "duplicate key 1"),
    (lambda lb: lb.update_flat([3, 1], [1, 1], np.array([1, 300], np.uint64), np.zeros(12, np.float32)),
     "key 300 >= rows 300"),
    (lambda lb: lb.update_flat([3, 3], [1, 1], np.array([1, 2], np.uint64), np.zeros(16, np.float32)),
     "a table appears twice"),
    (lambda lb: lb.update_flat([3], [2], np.array([1, 2], np.uint64), np.zeros(15, np.float32)),
     "15 gradient values"),
    (lambda lb: lb.lookup({3: np.array([1], np.uint64), 99: np.array([1], np.uint64)}), "unknown table 99"),
    (lambda lb: lb.lookup_flat([3], [3], np.array([1, 2], np.uint64)), "one count per table"),
])
def test_a_bad_round_is_refused_whole_naming_the_problem(call, match):
    lb = LocalBackend(_cfg())
    with pytest.raises(ValueError, match=match):
        call(lb)
    assert all(k.size == 0 for k, _, _ in lb.state_dict().values())


def test_every_backend_implements_the_protocol():
    from embnic.testbed.training.dlrm_workers import DeferredUpdates

    cfg = _cfg()
    lb = LocalBackend(cfg)
    assert isinstance(lb, Backend) and require_backend(lb, "t") is lb
    deferred = DeferredUpdates(lb)
    assert isinstance(deferred, Backend)
    with EmbeddingClient(cfg, 1, bind=("127.0.0.1", 0)) as c:
        assert isinstance(c, Backend)

    class PerTableOnly:
        def __init__(self):
            self.cfg = cfg

        def lookup(self, table_id, keys):
            return None

    with pytest.raises(TypeError, match="without lookup_flat, update, update_flat"):
        require_backend(PerTableOnly(), "train")


def test_deferred_updates_hold_rounds_until_flushed_in_order():
    from embnic.testbed.training.dlrm_workers import DeferredUpdates

    cfg = _cfg()
    lb, ref = LocalBackend(cfg), LocalBackend(cfg)
    d = DeferredUpdates(lb)
    rng = np.random.default_rng(9)
    r1, r2 = _round(cfg, rng, [3, 1]), _round(cfg, rng, [3, 7])
    d.update(r1)
    d.update_flat(*_flat(r2))
    assert all(k.size == 0 for k, _, _ in lb.state_dict().values())  # nothing sent yet
    assert d.flush() == 2
    ref.update(r1)
    ref.update(r2)
    for t in (3, 1, 7):
        for a, b in zip(lb.state_dict()[t], ref.state_dict()[t]):
            assert np.array_equal(a, b)
