"""Embedding-table numerics and the row store: SplitMix64, row init, SGD and row-wise Adagrad, LocalBackend.

Run alone: python3 -m pytest -q tests/client_lib/test_table_numerics.py
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embnic.client_lib import routing
from embnic.client_lib.config import TableConfig, parse_config
from embnic.client_lib.local import LocalBackend
from embnic.client_lib.splitmix import splitmix64
from embnic.client_lib.rowstore import RowStore, TableShard, shared_tables
from embnic.client_lib.table_numerics import (init_rows, is_unique, merge_states, rowwise_mean_square,
                                              rowwise_mean_square_ragged, wire_round)

M64 = (1 << 64) - 1


def _splitmix64_py(x: int) -> int:
    """Vigna's splitmix64.c next(), from state x, in plain Python ints."""
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _cfg(tables, shards=1, sharding="hash", seed=11):
    return parse_config({
        "cluster": {"seed": seed, "sharding": sharding},
        "tables": tables,
        "shards": [{"id": i, "ip": "127.0.0.1", "port": 20000 + i} for i in range(shards)],
        "clients": [{"id": 1, "ip": "127.0.0.1"}],
    })


def _ref_step(w, acc, g, opt, lr, eps):
    """One optimizer step on one row, scalar float32 Python (the independent reference)."""
    lr, eps = np.float32(lr), np.float32(eps)
    w = w.copy()
    if opt == "sgd":
        for j in range(w.size):
            w[j] = np.float32(w[j] - np.float32(lr * g[j]))
        return w, acc
    s = np.float32(0)
    for j in range(g.size):
        s = np.float32(s + np.float32(g[j] * g[j]))
    acc = np.float32(acc + np.float32(s / np.float32(g.size)))
    mult = np.float32(lr / np.float32(np.sqrt(acc) + eps))
    for j in range(w.size):
        w[j] = np.float32(w[j] - np.float32(mult * g[j]))
    return w, acc


# ---- SplitMix64 and init ---------------------------------------------------------------------

def test_splitmix64_known_values():
    # first two outputs of splitmix64.c seeded with 0: states 0 and 0x9E3779B97F4A7C15
    got = splitmix64(np.array([0, 0x9E3779B97F4A7C15], dtype=np.uint64))
    assert [int(v) for v in got] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, M64), min_size=1, max_size=50))
def test_splitmix64_matches_python(xs):
    got = splitmix64(np.array(xs, dtype=np.uint64))
    assert [int(v) for v in got] == [_splitmix64_py(x) for x in xs]


def test_one_splitmix64():
    """Routing, row init and the Criteo hashing share one definition (no second copy to drift)."""
    from embnic.client_lib import rowstore, splitmix, table_numerics
    from embnic.testbed.training import criteo
    assert routing.splitmix64 is splitmix.splitmix64
    assert table_numerics.splitmix64 is splitmix.splitmix64
    assert rowstore.splitmix64 is splitmix.splitmix64
    assert criteo.splitmix64 is splitmix.splitmix64


def test_init_rows_deterministic_and_in_range():
    keys = np.array([0, 1, 2, 2**40 - 1, 123456789], dtype=np.uint64)
    a = init_rows(7, 3, keys, 16, 0.05)
    b = init_rows(7, 3, keys, 16, 0.05)
    assert a.dtype == np.float32 and a.shape == (5, 16) and a.flags.c_contiguous
    assert np.array_equal(a, b)
    assert np.all(a >= -0.05) and np.all(a < 0.05)
    # a row does not depend on which other rows are initialised with it
    for i, k in enumerate(keys):
        assert np.array_equal(init_rows(7, 3, keys[i:i + 1], 16, 0.05)[0], a[i])
    # a narrower row is a prefix of the wider one (column hash independent of dim)
    assert np.array_equal(init_rows(7, 3, keys, 4, 0.05), a[:, :4])


def test_init_rows_differs_by_seed_table_key_column():
    keys = np.arange(64, dtype=np.uint64)
    base = init_rows(1, 0, keys, 8, 1.0)
    assert not np.array_equal(base, init_rows(2, 0, keys, 8, 1.0))
    assert not np.array_equal(base, init_rows(1, 1, keys, 8, 1.0))
    assert np.unique(base).size == base.size  # no repeated values across keys/columns


def test_init_rows_uniform_statistics():
    v = init_rows(0, 0, np.arange(200_000, dtype=np.uint64), 4, 1.0).ravel()
    # U[-1, 1): mean 0, variance 1/3; 800k samples -> std error of mean ~0.00065
    assert abs(float(v.mean())) < 0.005
    assert abs(float(v.var()) - 1 / 3) < 0.005
    hist = np.histogram(v, bins=10, range=(-1, 1))[0] / v.size
    assert np.all(np.abs(hist - 0.1) < 0.005)


def test_init_independent_of_number_of_shards():
    tabs = [{"id": 5, "rows": 10_000, "dim": 8}]
    keys = np.arange(0, 10_000, 7, dtype=np.uint64)
    want = LocalBackend(_cfg(tabs)).lookup({5: keys})[5]
    for s in (2, 3, 5):
        cfg = _cfg(tabs, shards=s)
        owner = routing.shard_of(cfg, 5, keys)
        got = np.empty_like(want)
        for sh in cfg.shards:
            ts = TableShard(cfg.table(5), cfg.seed)
            m = owner == sh.id
            got[m] = ts.lookup(keys[m])
        assert np.array_equal(got, want)


# ---- optimizers ------------------------------------------------------------------------------

@pytest.mark.parametrize("opt", ["sgd", "adagrad"])
def test_optimizer_matches_scalar_reference(opt):
    t = TableConfig(id=2, name="t", rows=50, dim=5, optimizer=opt, lr=0.3, eps=1e-6, init_scale=0.1)
    ts = TableShard(t, seed=3, capacity=1)
    rng = np.random.default_rng(1)
    ref_w = {k: init_rows(3, 2, np.array([k], np.uint64), 5, 0.1)[0] for k in range(50)}
    ref_a = {k: np.float32(0) for k in range(50)}
    for _ in range(20):
        keys = rng.choice(50, size=rng.integers(1, 20), replace=False).astype(np.uint64)
        g = rng.standard_normal((keys.size, 5)).astype(np.float32)
        ts.apply(keys, g)
        for i, k in enumerate(keys.tolist()):
            ref_w[k], ref_a[k] = _ref_step(ref_w[k], ref_a[k], g[i], opt, 0.3, 1e-6)
    keys, rows, acc = ts.state()
    assert keys.tolist() == sorted(keys.tolist()) and len(keys) == len(ts)
    for i, k in enumerate(keys.tolist()):
        assert np.array_equal(rows[i], ref_w[k]), k
        assert acc[i] == (ref_a[k] if opt == "adagrad" else 0)
    # untouched rows are still at their initial value
    untouched = np.setdiff1d(np.arange(50, dtype=np.uint64), keys)
    assert np.array_equal(ts.lookup(untouched), init_rows(3, 2, untouched, 5, 0.1))


def test_adagrad_closed_form_float64():
    """Row-wise Adagrad on one row with a constant gradient, against the float64 closed form."""
    t = TableConfig(id=0, name="t", rows=4, dim=3, optimizer="adagrad", lr=0.1, eps=1e-8, init_scale=0.0)
    ts = TableShard(t, seed=0)
    g = np.array([[1.0, -2.0, 2.0]], dtype=np.float32)  # mean g^2 = 3
    w = np.zeros(3)
    for n in range(1, 11):
        ts.apply(np.array([1], np.uint64), g)
        w -= 0.1 / (np.sqrt(3.0 * n) + 1e-8) * g[0].astype(np.float64)
    _, rows, acc = ts.state()
    np.testing.assert_allclose(acc, [30.0], rtol=1e-6)
    np.testing.assert_allclose(rows[0], w, rtol=1e-5)


def test_rows_independent_of_batch_composition():
    t = TableConfig(id=0, name="t", rows=1000, dim=16, optimizer="adagrad", lr=0.05)
    rng = np.random.default_rng(2)
    keys = rng.choice(1000, 300, replace=False).astype(np.uint64)
    g = rng.standard_normal((300, 16)).astype(np.float32)
    whole = TableShard(t, 9)
    whole.apply(keys, g)
    parts = TableShard(t, 9)
    for sl in (slice(0, 1), slice(1, 17), slice(17, 300)):
        parts.apply(keys[sl][::-1], g[sl][::-1])
    for a, b in zip(whole.state(), parts.state()):
        assert np.array_equal(a, b)


def test_rowwise_mean_square_order_fixed():
    g = np.random.default_rng(0).standard_normal((1000, 37)).astype(np.float32)
    full = rowwise_mean_square(g)
    assert full.dtype == np.float32
    for i in (0, 1, 500, 999):
        assert full[i] == rowwise_mean_square(g[i:i + 1])[0]
    np.testing.assert_allclose(full, np.mean(g.astype(np.float64) ** 2, axis=1), rtol=1e-5)


# ---- storage ---------------------------------------------------------------------------------

def test_lazy_storage_is_proportional_to_rows_updated():
    t = TableConfig(id=0, name="t", rows=2**40, dim=4)
    ts = TableShard(t, 0, capacity=2)
    big = np.array([2**40 - 1, 2**39, 5], dtype=np.uint64)
    ts.lookup(big)
    assert len(ts) == 0  # lookups do not materialise
    rng = np.random.default_rng(0)
    for _ in range(10):
        k = np.unique(rng.integers(0, 2**40, 100, dtype=np.uint64))
        ts.apply(k, np.ones((k.size, 4), np.float32))
    assert 990 <= len(ts) <= 1000
    assert ts.nbytes < 4 * 1024 * (16 + 4 + 8 + 8)  # arena at most 2x the rows, plus index
    keys, rows, acc = ts.state()
    assert np.all(keys[1:] > keys[:-1])
    assert np.array_equal(ts.lookup(keys), rows)


def test_is_unique():
    assert is_unique(np.array([], np.uint64)) and is_unique(np.array([3, 1, 2], np.uint64))
    assert not is_unique(np.array([1, 2, 2], np.uint64)) and not is_unique(np.array([2, 1, 2], np.uint64))


# ---- LocalBackend ----------------------------------------------------------------------------

def test_local_backend_fp16_wire_rounding():
    cfg = _cfg([{"id": 0, "rows": 100, "dim": 8, "dtype": "fp16", "optimizer": "sgd", "lr": 1.0,
                 "init_scale": 0.3}])
    lb = LocalBackend(cfg)
    keys = np.arange(10, dtype=np.uint64)
    rows = lb.lookup({0: keys})[0]
    assert rows.dtype == np.float32
    assert np.array_equal(rows, rows.astype(np.float16).astype(np.float32))
    master = lb.tables[0].lookup(keys)
    assert not np.array_equal(rows, master)  # fp32 master kept on the server side
    with pytest.raises(ValueError, match="non-finite.*fp16"):
        lb.update({0: (keys, np.full((10, 8), 7e4, np.float32))})  # finite in fp32, inf in fp16
    g = np.full((10, 8), 1e-4 + 1e-8, np.float32)
    lb.update({0: (keys, g)})
    _, w, _ = lb.state_dict()[0]
    assert np.array_equal(w, master - wire_round(g, "fp16"))


def test_local_backend_validation():
    cfg = _cfg([{"id": 0, "rows": 100, "dim": 4}])
    lb = LocalBackend(cfg)
    with pytest.raises(ValueError, match="unknown table 9"):
        lb.lookup({9: np.array([1], np.uint64)})[9]
    with pytest.raises(ValueError, match="key 100 >= rows 100"):
        lb.lookup({0: np.array([1, 100], np.uint64)})[0]
    with pytest.raises(ValueError, match="negative"):
        lb.lookup({0: np.array([-1], np.int64)})[0]
    with pytest.raises(ValueError, match="duplicate"):
        lb.update({0: (np.array([1, 1], np.uint64), np.zeros((2, 4), np.float32))})
    with pytest.raises(ValueError, match="non-finite"):
        lb.update({0: (np.array([1, 2], np.uint64), np.array([[0, 0, 0, np.inf], [0] * 4], np.float32))})
    with pytest.raises(ValueError, match="shape"):
        lb.update({0: (np.array([1, 2], np.uint64), np.zeros((2, 5), np.float32))})
    assert lb.state_dict()[0][0].size == 0


@pytest.mark.parametrize("sharding,shards", [("hash", 2), ("hash", 3), ("table", 2)])
def test_sharded_tables_equal_local_backend(sharding, shards):
    tabs = [{"id": 0, "rows": 500, "dim": 8, "optimizer": "adagrad"},
            {"id": 1, "rows": 300, "dim": 4, "optimizer": "sgd", "lr": 0.5}]
    cfg = _cfg(tabs, shards=shards, sharding=sharding)
    lb = LocalBackend(cfg)
    parts = [{t.id: TableShard(t, cfg.seed) for t in cfg.tables} for _ in cfg.shards]
    rng = np.random.default_rng(5)
    for _ in range(15):
        for t in cfg.tables:
            keys = np.unique(rng.integers(0, t.rows, 64)).astype(np.uint64)
            g = rng.standard_normal((keys.size, t.dim)).astype(np.float32)
            owner = routing.shard_index_of(cfg, t.id, keys)
            rows = np.empty((keys.size, t.dim), np.float32)
            for i, p in enumerate(parts):
                m = owner == i
                rows[m] = p[t.id].lookup(keys[m])
                p[t.id].apply(keys[m], g[m])
            assert np.array_equal(rows, lb.lookup({t.id: keys})[t.id])
            lb.update({t.id: (keys, g)})
    merged = merge_states([{tid: ts.state() for tid, ts in p.items()} for p in parts])
    ref = lb.state_dict()
    for tid in ref:
        for a, b in zip(merged[tid], ref[tid]):
            assert np.array_equal(a, b)


def test_merge_states_rejects_overlap():
    s = (np.array([1, 2], np.uint64), np.zeros((2, 1), np.float32), np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="more than one shard"):
        merge_states([{0: s}, {0: s}])


def test_gradient_whose_square_overflows_is_refused():
    """|g| ~ 1e20 is finite but g**2 is not: Adagrad would set acc = inf and freeze the row."""
    from embnic.client_lib.config import parse_config

    cfg = parse_config({"tables": [{"id": 0, "rows": 10, "dim": 2, "optimizer": "adagrad"},
                                   {"id": 1, "rows": 10, "dim": 2, "optimizer": "sgd"}],
                        "shards": [{"id": 0, "ip": "127.0.0.1"}], "clients": [{"id": 1, "ip": "127.0.0.1"}]})
    b = LocalBackend(cfg)
    g = np.array([[1e20, 0.0]], dtype=np.float32)
    with pytest.raises(ValueError, match="overflows"):
        b.update({0: (np.array([3], np.uint64), g)})
    assert b.state_dict()[0][0].size == 0  # nothing applied
    b.update({1: (np.array([3], np.uint64), g)})  # SGD: finite result, accepted


# ---- tables without rows: collision-free, any uint64 id -------------------------------------

EDGES = [0, 2**31, 2**32, 2**48, 2**53, 2**63, 2**64 - 1]
near_edge = st.builds(lambda e, d: min(max(e + d, 0), M64), st.sampled_from(EDGES), st.integers(-2, 2))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(near_edge, min_size=1, max_size=12, unique=True), min_size=1, max_size=4),
       st.sampled_from(["sgd", "adagrad"]))
def test_rowless_table_keys_any_u64_never_collide(steps, opt):
    """Ids near 0, 2^31, 2^32, 2^48, 2^53, 2^63, 2^64-1 each get a row of their own: after
    updates, every id holds exactly its own history (a scalar reference per id)."""
    t = TableConfig(id=2, name="t", rows=None, dim=3, optimizer=opt, lr=0.5)
    ts = TableShard(t, seed=4, capacity=1)
    ref = {}  # id -> (row, acc), Python-int keyed
    for i, ids in enumerate(steps):
        keys = np.array(ids, dtype=np.uint64)
        g = (np.arange(keys.size * 3, dtype=np.float32).reshape(keys.size, 3) + i) / 7
        for k, gk in zip(ids, g):
            w, acc = ref.get(k, (init_rows(4, 2, np.array([k], np.uint64), 3, t.init_scale)[0], np.float32(0)))
            ref[k] = _ref_step(w, acc, gk, opt, t.lr, t.eps)
        ts.apply(keys, g)
    all_ids = sorted(ref)
    got = ts.lookup(np.array(all_ids, dtype=np.uint64))
    for k, row in zip(all_ids, got):
        assert np.array_equal(row, ref[k][0]), k
    keys, rows, acc = ts.state()
    assert [int(x) for x in keys] == all_ids and len(ts) == len(all_ids)


def test_rowless_local_backend_accepts_any_u64_and_python_ints():
    cfg = _cfg([{"id": 0, "dim": 4}, {"id": 1, "rows": 10, "dim": 4}])
    assert cfg.table(0).rows is None and cfg.table(1).rows == 10
    lb = LocalBackend(cfg)
    a = lb.lookup({0: [2**64 - 1, 2**63, 0]})[0]
    assert np.array_equal(a, lb.lookup({0: np.array([2**64 - 1, 2**63, 0], np.uint64)})[0])
    assert not np.array_equal(a[0], a[1])
    with pytest.raises(ValueError, match="key 10 >= rows 10"):
        lb.lookup({1: [10]})[1]
    for bad in ([-1], [1.5], np.zeros((1, 1), np.uint64), [2**64]):
        with pytest.raises(ValueError, match=r"table 0 \(t0\): keys"):
            lb.lookup({0: bad})[0]


def test_one_home_for_the_numerics():
    """The shard server and the in-process reference hold the same TableShard class; the modules
    import without the testbed (a training job links only the client library)."""
    import subprocess
    import sys

    from embnic.client_lib import local, rowstore
    from embnic.testbed.server import shard_state

    assert shard_state.TableShard is rowstore.TableShard is local.TableShard
    code = ("import sys, embnic.client_lib.rowstore, embnic.client_lib.local; "
            "print(sorted(m for m in sys.modules if m.startswith('embnic.testbed')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_delta_index_merges_change_nothing():
    """Many batches of new keys: a store that folds its delta index every few keys and one
    that never does hold the same rows (bit for bit) and find every key; the delta stays bounded."""
    t = TableConfig(id=1, name="t", rows=None, dim=4, optimizer="adagrad", lr=0.3)
    often, never = TableShard(t, seed=2, capacity=1), TableShard(t, seed=2, capacity=1)
    often.store.MERGE_MIN, never.store.MERGE_MIN = 3, 1 << 40
    rng = np.random.default_rng(3)
    seen = np.empty(0, np.uint64)
    for step in range(40):
        keys = np.unique(np.r_[rng.integers(0, 2**64 - 1, 20, dtype=np.uint64, endpoint=True),
                               rng.choice(seen, min(seen.size, 10)) if seen.size else []].astype(np.uint64))
        g = rng.standard_normal((keys.size, 4)).astype(np.float32)
        often.apply(keys, g)
        never.apply(keys, g)
        seen = np.union1d(seen, keys)
        assert often.store._dck.size <= max(3, often.store._ck.size >> 3)
        probe = np.r_[seen[::3], np.array([12345], np.uint64)]
        assert np.array_equal(often.lookup(probe), never.lookup(probe)), step
    assert len(often) == len(never) == seen.size and never.store._ck.size == 0
    for a, b in zip(often.state(), never.state()):
        assert np.array_equal(a, b)
    assert np.array_equal(often.state()[0], seen)


@pytest.mark.parametrize("optimizer,lr", [("adagrad", 0.05), ("sgd", 0.05), ("sgd", 1e30), ("sgd", 0.0)])
def test_gradient_rows_ok_fast_path_equals_the_per_row_rule(optimizer, lr):
    """The one-max fast path of gradient_rows_ok never accepts a row the per-row rule refuses,
    at magnitudes around both overflow thresholds (and NaN/inf rows)."""
    from embnic.client_lib.config import TableConfig
    from embnic.client_lib.table_numerics import gradient_rows_ok, rowwise_mean_square

    rng = np.random.default_rng(12)
    for dim in (1, 8, 300):
        t = TableConfig(0, "x", None, dim, optimizer=optimizer, lr=lr)
        for scale in (1.0, 3e8, 1e18, 2e18, 4.6e18, 6.5e18, 1e19, 1e30, 3.4e38):
            with np.errstate(over="ignore"):  # 3.4e38 × N(0, 1) overflows float32 in places: inf rows too
                g = (rng.standard_normal((400, dim)) * scale).astype(np.float32)
            g[7, 0] = np.nan if scale == 1e18 else g[7, 0]
            g[9, -1] = np.inf if scale == 2e18 else g[9, -1]
            with np.errstate(all="ignore"):
                step = (np.isfinite(rowwise_mean_square(g)) if optimizer == "adagrad"
                        else np.isfinite(np.float32(lr) * g).all(axis=1))
                want = np.isfinite(g).all(axis=1) & step
            np.testing.assert_array_equal(gradient_rows_ok(t, g), want, err_msg=f"dim {dim} scale {scale}")


# ---- one store for several tables ------------------------------------------------------------

def _tables(dims, opts):
    return [TableConfig(id=3 * i + 1, name=f"t{i}", rows=None, dim=d, optimizer=o, lr=0.05 + 0.1 * i, eps=1e-7,
                        init_scale=0.01 * (i + 1)) for i, (d, o) in enumerate(zip(dims, opts))]


@pytest.mark.parametrize("dims,opts", [((8, 8, 8), ("adagrad", "adagrad", "adagrad")),
                                       ((8, 8, 8, 8), ("adagrad", "sgd", "adagrad", "sgd")),
                                       ((4, 16, 1, 7), ("adagrad", "sgd", "sgd", "adagrad")),
                                       ((3, 5), ("adagrad", "adagrad"))])
def test_one_store_of_many_tables_equals_one_store_per_table(dims, opts):
    """Messages of several tables (segments of each table, keys repeated across messages, new
    and held rows, ids that share a composite key with another table's) through one shared
    RowStore — one search, one gather, one optimizer step per call — hold and return exactly the
    rows of one TableShard per table, bit for bit; state and load_state per table agree."""
    tabs = _tables(dims, opts)
    rng = np.random.default_rng(len(dims))
    store, views = shared_tables(tabs, seed=7, capacity=1)
    store.MERGE_MIN = 5  # fold the delta index often
    alone = {t.id: TableShard(t, 7, capacity=1) for t in tabs}
    pool = {t.id: np.unique(rng.integers(0, 2**64 - 1, 60, dtype=np.uint64, endpoint=True)) for t in tabs}
    # a key of table B whose composite equals one of table A's: a collision the search must walk
    a, b = tabs[0], tabs[1]
    la, lb = store.local_index(a.id), store.local_index(b.id)
    ka = pool[a.id][0]
    kb = np.uint64((int(ka) + int(store.tsalt[la]) - int(store.tsalt[lb])) % 2**64)
    assert store.composite(lb, np.array([kb]))[0] == store.composite(la, np.array([ka]))[0]
    pool[b.id] = np.unique(np.r_[pool[b.id], kb])
    for step in range(30):
        tids, counts, keys, grads = [], [], [], []
        for m in range(int(rng.integers(1, 4))):  # messages of a wake-up
            for t in rng.permutation(tabs)[:int(rng.integers(1, len(tabs) + 1))]:
                k = rng.choice(pool[t.id], int(rng.integers(1, 12)), replace=False)
                if t is b and step % 3 == 0:
                    k = np.unique(np.r_[k, kb])
                tids.append(t.id), counts.append(k.size), keys.append(k)
                grads.append(rng.standard_normal((k.size, t.dim)).astype(np.float32))
        keys_all = np.concatenate(keys)
        rows = store.lookup_segments(np.array(tids), np.array(counts), keys_all)
        want = np.concatenate([alone[t].lookup(k).reshape(-1) for t, k in zip(tids, keys)])
        assert np.array_equal(rows, want), step
        store.apply_segments(np.array(tids), np.array(counts), keys_all,
                             np.concatenate([g.reshape(-1) for g in grads]))
        for t, k, g in zip(tids, keys, grads):  # the reference: one message (segment) after the other
            alone[t].apply(k, g)
    for t in tabs:
        for x, y in zip(views[t.id].state(), alone[t.id].state()):
            assert np.array_equal(x, y), t.id
        assert len(views[t.id]) == len(alone[t.id]) > 0
    assert len(store) == sum(len(v) for v in alone.values())
    # load_state replaces one table (compacting the arena) and leaves the others alone
    k, r, acc = alone[b.id].state()
    views[b.id].load_state(k[::2].copy(), r[::2] + 1, acc[::2])
    alone[b.id].load_state(k[::2].copy(), r[::2] + 1, acc[::2])
    for t in tabs:
        for x, y in zip(views[t.id].state(), alone[t.id].state()):
            assert np.array_equal(x, y), t.id
        probe = np.r_[pool[t.id], np.array([5, 2**63], np.uint64)]
        assert np.array_equal(views[t.id].lookup(probe), alone[t.id].lookup(probe))


def test_ragged_mean_square_equals_the_per_table_one():
    rng = np.random.default_rng(1)
    dims = rng.integers(1, 40, 300)
    g = (rng.standard_normal(int(dims.sum())) * 10.0 ** rng.integers(-20, 20)).astype(np.float32)
    got = rowwise_mean_square_ragged(g, dims)
    at = 0
    for r, d in enumerate(dims.tolist()):
        assert got[r] == rowwise_mean_square(g[at:at + d].reshape(1, d))[0]
        at += d


def test_row_store_refuses_tables_it_does_not_hold():
    store = RowStore(_tables((4, 4), ("sgd", "sgd")), seed=1)
    with pytest.raises(KeyError, match=r"tables \[2\] are not in this row store"):
        store.lookup_segments(np.array([1, 2]), np.array([1, 1]), np.array([5, 6], np.uint64))
    with pytest.raises(ValueError, match="distinct tables"):
        RowStore(_tables((4,), ("sgd",)) * 2, seed=1)
