"""Batch preparation against a plain np.unique reference; EmbeddingBag pooling and backward.

Run alone: python3 -m pytest -q tests/client_lib/test_batch.py
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embnic.client_lib.batch import (KeyedJaggedBatch, pool, pool_backward, prepare_batch,
                                     validate_batch)


def _reference(batch, ftab):
    """Per table: np.unique over the concatenated ids of its features; bags in feature order."""
    b = batch.stride
    off = batch.offsets()
    out = {}
    for t in sorted(set(ftab)):
        feats = [f for f, x in enumerate(ftab) if x == t]
        vals = np.concatenate([batch.values[off[f * b]:off[(f + 1) * b]] for f in feats])
        lens = np.concatenate([batch.lengths[f * b:(f + 1) * b] for f in feats])
        u, inv = np.unique(vals, return_inverse=True)
        out[t] = (u, inv.reshape(-1), np.r_[0, np.cumsum(lens)])
    return out


def _random_batch(rng, f, b, max_len, id_space):
    lengths = rng.integers(0, max_len + 1, f * b)
    values = rng.integers(0, id_space, int(lengths.sum())).astype(np.uint64)
    return KeyedJaggedBatch([f"f{i}" for i in range(f)], values, lengths, b)


def test_worked_example():
    b = KeyedJaggedBatch(["a", "b"], np.array([7, 3, 7, 9, 3], np.uint64), np.array([2, 1, 0, 2]), 2)
    t = prepare_batch(b, [0, 0]).tables[0]
    np.testing.assert_array_equal(t.unique, [3, 7, 9])
    np.testing.assert_array_equal(t.inverse, [1, 0, 1, 2, 0])
    np.testing.assert_array_equal(t.offsets, [0, 2, 3, 3, 5])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.integers(0, 5), st.integers(1, 2**48 - 1),
       st.integers(0, 2**32 - 1), st.integers(1, 4))
def test_prepare_matches_np_unique(f, b, max_len, id_space, seed, ntab):
    rng = np.random.default_rng(seed)
    batch = _random_batch(rng, f, b, max_len, id_space)
    ftab = [int(x) for x in rng.integers(0, ntab, f)]
    validate_batch(batch, ftab)
    prep = prepare_batch(batch, ftab)
    ref = _reference(batch, ftab)
    assert set(prep.tables) == set(ref)
    for t, (u, inv, off) in ref.items():
        tp = prep.tables[t]
        np.testing.assert_array_equal(tp.unique, u)
        np.testing.assert_array_equal(tp.inverse, inv)
        np.testing.assert_array_equal(tp.offsets, off)
        # the defining property: every original id is found at its index
        np.testing.assert_array_equal(tp.unique[tp.inverse], u[inv])
    assert prep.num_ids == len(batch.values)
    assert prep.num_unique == sum(len(r[0]) for r in ref.values())


def test_prepare_on_criteo_batch():
    from embnic.testbed import criteo

    data = criteo.load_criteo(criteo.sample_path("train"), rows=65536, max_rows=4096)
    batch = KeyedJaggedBatch.from_dense(list(criteo.SPARSE_NAMES), data.sparse)
    ftab = list(range(26))
    prep = prepare_batch(batch, ftab)
    for t, (u, inv, off) in _reference(batch, ftab).items():
        np.testing.assert_array_equal(prep.tables[t].unique, u)
        np.testing.assert_array_equal(prep.tables[t].inverse, inv)
        np.testing.assert_array_equal(prep.tables[t].offsets, off)
    assert 0 < prep.dedup_ratio < 1  # Criteo categorical columns repeat a lot


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_pool_and_backward_against_naive(mode):
    rng = np.random.default_rng(1)
    batch = _random_batch(rng, 3, 17, 4, 50)
    ftab = [0, 1, 0]
    prep = prepare_batch(batch, ftab)
    for t, tp in prep.tables.items():
        rows = rng.standard_normal((len(tp.unique), 5)).astype(np.float32)
        pooled = pool(rows, tp, mode)
        g_bags = rng.standard_normal(pooled.shape).astype(np.float32)
        g_rows = pool_backward(g_bags, tp, mode)
        exp_p = np.zeros_like(pooled)
        exp_g = np.zeros_like(rows)
        for j in range(len(tp.lengths)):
            idx = tp.inverse[tp.offsets[j]:tp.offsets[j + 1]]
            n = max(len(idx), 1) if mode == "mean" else 1
            for i in idx:
                exp_p[j] += rows[i] / n
                exp_g[i] += g_bags[j] / n
        np.testing.assert_allclose(pooled, exp_p, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(g_rows, exp_g, rtol=1e-5, atol=1e-6)
        assert not pooled[tp.lengths == 0].any()  # empty bags pool to 0


def test_validate_batch_errors():
    b = KeyedJaggedBatch(["a"], np.array([1, 2], np.uint64), np.array([1, 2]), 2)
    with pytest.raises(ValueError, match="sum\\(lengths\\)"):
        validate_batch(b, [0])
    with pytest.raises(ValueError, match="feature"):
        validate_batch(KeyedJaggedBatch(["a"], np.array([1], np.uint64), np.array([1]), 1), [0, 1])
    with pytest.raises(ValueError, match="2\\*\\*48"):
        validate_batch(KeyedJaggedBatch(["a"], np.array([2**50], np.uint64), np.array([1]), 1), [0])
    with pytest.raises(ValueError, match="pooling mode"):
        pool(np.zeros((1, 2), np.float32), prepare_batch(
            KeyedJaggedBatch(["a"], np.array([1], np.uint64), np.array([1]), 1), [0]).tables[0], "max")
