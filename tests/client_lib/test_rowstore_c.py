"""The row store's updates and search in C (``client_lib/csrc/store.c`` through ``RowStore.apply``,
``RowStore._find`` and ``table_numerics.optimizer_step``) against the numpy oracle
(``numpy_rowstore.py``), bit for bit:
SGD and row-wise Adagrad, tables of one and of several dims, mixed optimizers in one store, keys
repeated within a batch (applied in arrival order), new rows past the spare capacity and past
the delta index's merge point, gradients rounded as fp16 or not."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numpy_rowstore import NumpyRowStore, numpy_find, numpy_init_rows, optimizer_step as np_step

from embnic.client_lib.config import TableConfig
from embnic.client_lib.rowstore import RowStore
from embnic.client_lib.splitmix import splitmix64, u64
from embnic.client_lib.table_numerics import init_rows, initial_rows, optimizer_step, wire_round


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(np.ascontiguousarray(a).view(np.uint8),
                                                 np.ascontiguousarray(b).view(np.uint8))


def _tables(draw_dims, draw_opts, draw_lr) -> list[TableConfig]:
    return [TableConfig(id=3 * i + 1, name=f"t{i}", rows=None, dim=d, dtype="fp32", optimizer=o, lr=lr, eps=1e-8,
                        init_scale=0.05) for i, (d, o, lr) in enumerate(zip(draw_dims, draw_opts, draw_lr))]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), ntab=st.integers(1, 3), same_dim=st.booleans(), fp16=st.booleans(),
       seed=st.integers(0, 2**63 - 1))
def test_apply_equals_numpy(data, ntab, same_dim, fp16, seed):
    """Random batches (several per store, duplicates within and across them, a small key pool so
    rows repeat, a capacity of 1 row and a merge point of 3 so the arena, the delta index and the
    main index all grow) applied by C and by numpy: every row and accumulator bit-identical."""
    dims = [data.draw(st.sampled_from([1, 3, 8, 17]))] * ntab if same_dim else \
        data.draw(st.lists(st.sampled_from([1, 2, 5, 8, 300]), min_size=ntab, max_size=ntab))
    opts = data.draw(st.lists(st.sampled_from(["sgd", "adagrad"]), min_size=ntab, max_size=ntab))
    lrs = data.draw(st.lists(st.sampled_from([0.05, 0.5, 3.0]), min_size=ntab, max_size=ntab))
    tables = _tables(dims, opts, lrs)
    store = RowStore(tables, seed, capacity=1)
    store.MERGE_MIN = 3
    ref = NumpyRowStore(tables, seed)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    pool = np.r_[rng.integers(0, 2**64, 40, dtype=np.uint64), np.array([0, 2**64 - 1], np.uint64)]
    for _ in range(data.draw(st.integers(1, 5))):
        n = data.draw(st.integers(0, 60))
        keys = rng.choice(pool, n)
        li = rng.integers(0, ntab, n) if data.draw(st.booleans()) else int(rng.integers(0, ntab))
        d = store.tdim[np.broadcast_to(li, (n,))]
        g = (rng.standard_normal(int(d.sum())) * rng.choice([1e-3, 1.0, 50.0])).astype(np.float32)
        if fp16:
            g = wire_round(g, "fp16")
        store.apply(li, keys, g)
        ref.apply(li, keys, g)
    for li in range(ntab):
        for a, b in zip(store.state(li), ref.state(li)):
            assert _same(a, b), (li, a, b)
        k = ref.state(li)[0]
        if k.size:
            assert _same(store.lookup(li, k), ref.state(li)[1])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 50), dim=st.integers(1, 40), ada=st.booleans(), per_row=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_optimizer_step_equals_numpy(n, dim, ada, per_row, seed):
    """``optimizer_step`` (C, the disk tier's step) against the numpy step: scalar or per-row
    lr/eps, SGD and Adagrad; the accumulators passed in are not changed."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, dim)).astype(np.float32)
    g = (rng.standard_normal((n, dim)) * 10).astype(np.float32)
    acc = np.abs(rng.standard_normal(n)).astype(np.float32) if ada else None
    lr = rng.random(n).astype(np.float32) if per_row else np.float32(0.1)
    eps = np.full(n, 1e-8, np.float32) if per_row else np.float32(1e-8)
    acc_before = None if acc is None else acc.copy()
    w1, w2 = w.copy(), w.copy()
    a1 = optimizer_step(w1, acc, g, lr, eps)
    a2 = np_step(w2, acc, g, lr, eps)
    assert _same(w1, w2)
    assert (a1 is None) == (a2 is None) and (a1 is None or _same(a1, a2))
    assert acc is None or _same(acc, acc_before)


def test_apply_refuses_what_does_not_fit():
    """A table index out of range or gradients that are not a row per key: ValueError, nothing
    applied."""
    t = _tables([4, 2], ["adagrad", "sgd"], [0.1, 0.1])
    store = RowStore(t, 7)
    with pytest.raises(ValueError):
        store.apply(2, np.array([1], np.uint64), np.zeros(4, np.float32))
    with pytest.raises(ValueError):
        store.apply(np.array([0, 1]), np.array([1, 2], np.uint64), np.zeros(5, np.float32))
    assert len(store) == 0


def test_growth_keeps_rows_and_index():
    """Many new rows in batches (the arena, the delta index and the main index all grow, merges
    in between): every row found again and equal to the oracle's."""
    t = _tables([8, 8], ["adagrad", "sgd"], [0.05, 0.05])
    store = RowStore(t, 11, capacity=1)
    ref = NumpyRowStore(t, 11)
    rng = np.random.default_rng(5)
    for _ in range(30):
        keys = rng.integers(0, 2**64, 500, dtype=np.uint64)
        li = rng.integers(0, 2, 500)
        g = rng.standard_normal(500 * 8).astype(np.float32)
        store.apply(li, keys, g)
        ref.apply(li, keys, g)
    assert len(store) == 15000 and store.cstore.n == 15000
    for li in range(2):
        for a, b in zip(store.state(li), ref.state(li)):
            assert _same(a, b)


def test_search_in_c_equals_numpy():
    """RowStore._find in C (sorted windows, the sample, blocks, the delta index, composites two
    tables share) gives numpy's slots on keys held in the main and the delta index, absent keys
    and colliding ones."""
    t = [TableConfig(id=i, name=f"t{i}", rows=None, dim=8, optimizer=o, lr=0.5) for i, o in
         ((0, "adagrad"), (1, "adagrad"), (2, "sgd"))]
    st = RowStore(t, 42)
    st.MERGE_MIN = 200  # main and delta index both in use
    rng = np.random.default_rng(3)
    pool = rng.integers(0, 2**64 - 1, 6000, dtype=np.uint64, endpoint=True)
    l1, l2 = (int(x) for x in st.local_index([1, 2]))
    twin = (pool[:50].astype(object) + int(st.tsalt[l1]) - int(st.tsalt[l2])) % 2**64
    pool2 = np.r_[pool[3000:], np.array(twin.tolist(), np.uint64)]  # table 2 ids sharing table 1's composites
    for step in range(30):
        k1 = np.unique(rng.choice(pool[:3000], 300))
        k2 = np.unique(rng.choice(pool2, 300))
        st.apply_segments(np.array([1, 2]), np.array([k1.size, k2.size]), np.r_[k1, k2],
                          rng.standard_normal((k1.size + k2.size) * 8).astype(np.float32))
        probe = np.r_[rng.choice(pool[:3000], 500), rng.choice(pool2, 500)]
        for li in (np.repeat(st.local_index([1, 2]), 500), l1, l2):
            c = st.composite(li, probe)
            assert np.array_equal(st._find(li, c), numpy_find(st, li, c)), step
    assert st._dck.size > 0 and st._ck.size > 0
    with pytest.raises(ValueError):
        st._find(3, np.zeros(2, np.uint64))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 40), dims=st.lists(st.integers(1, 600), min_size=1, max_size=3),
       seed=st.integers(0, 2**63 - 1), tid=st.integers(0, 65535), scale=st.floats(1e-6, 10.0), ks=st.integers(0, 2**32))
def test_init_rows_in_c_equal_numpy(n, dims, seed, tid, scale, ks):
    """The initial value rule in C (``embnic_init_rows``, the one implementation) equals its numpy
    oracle bit for bit — one table (``init_rows``, dims across the C's 256-value pieces) and rows
    of several tables of several dims at once (``initial_rows``, as the row store asks)."""
    keys = np.random.default_rng(ks).integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    for dim in dims:
        got, want = init_rows(seed, tid, keys, dim, scale), numpy_init_rows(seed, tid, keys, dim, scale)
        assert got.shape == (n, dim) and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    tids = np.arange(n) % 3 + tid // 2
    tinit = splitmix64(u64(seed) ^ splitmix64(tids.astype(np.uint64)))
    dd = np.array(dims * n, np.int64)[:n]
    flat = initial_rows(keys, tinit, np.full(n, scale, np.float32), dd)
    want = [numpy_init_rows(seed, int(t), keys[i:i + 1], int(dd[i]), scale).reshape(-1) for i, t in enumerate(tids)]
    assert np.array_equal(flat.view(np.uint32), np.concatenate(want or [np.zeros(0, np.float32)]).view(np.uint32))
