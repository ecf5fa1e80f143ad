"""Batch preparation against a plain np.unique reference; EmbeddingBag pooling and backward.

Run alone: python3 -m pytest -q tests/client_lib/test_batch.py
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embnic.client_lib.batch import KeyedJaggedBatch, pool_all, pool_backward_all, prepare_batch, validate_batch


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
    from embnic.testbed.training import criteo

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
    rows = rng.standard_normal((prep.num_unique, 5)).astype(np.float32)  # every table's value array
    pooled = pool_all(rows, prep, mode)
    g_bags = rng.standard_normal(pooled.shape).astype(np.float32)
    g_rows = pool_backward_all(g_bags, prep, mode)
    exp_p = np.zeros_like(pooled)
    exp_g = np.zeros_like(rows)
    for t, tp in prep.tables.items():  # bag by bag, per table, with the table's own value array
        i = int(np.flatnonzero(prep.table_ids == t)[0])
        u0, b0 = int(prep.unique_offsets[i]), int(prep.bag_offsets[i])
        for j in range(len(tp.lengths)):
            idx = tp.inverse[tp.offsets[j]:tp.offsets[j + 1]]
            n = max(len(idx), 1) if mode == "mean" else 1
            for k in idx:
                exp_p[b0 + j] += rows[u0 + k] / n
                exp_g[u0 + k] += g_bags[b0 + j] / n
    np.testing.assert_allclose(pooled, exp_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_rows, exp_g, rtol=1e-5, atol=1e-6)
    assert not pooled[prep.lengths == 0].any()  # empty bags pool to 0


def test_validate_batch_errors():
    b = KeyedJaggedBatch(["a"], np.array([1, 2], np.uint64), np.array([1, 2]), 2)
    with pytest.raises(ValueError, match="sum\\(lengths\\)"):
        validate_batch(b, [0])
    with pytest.raises(ValueError, match="feature"):
        validate_batch(KeyedJaggedBatch(["a"], np.array([1], np.uint64), np.array([1]), 1), [0, 1])
    with pytest.raises(ValueError, match="pooling mode"):
        pool_all(np.zeros((1, 2), np.float32), prepare_batch(
            KeyedJaggedBatch(["a"], np.array([1], np.uint64), np.array([1]), 1), [0]), "max")


# ---- full 64-bit ids ---------------------------------------------------------------------------

#: ids near the boundaries a tag, a sign bit or a float would break
EDGES = [0, 2**31, 2**32, 2**48, 2**53, 2**63, 2**64 - 1]
M64 = 2**64 - 1


def test_issue_example_ids_of_any_64_bits_keep_their_table():
    v = np.array([0, 2**31, 2**32 + 1, 2**48 - 1, 2**48, 2**63, 2**64 - 1, 5], dtype=np.uint64)
    prep = prepare_batch(KeyedJaggedBatch(["f0", "f1"], v, np.array([4, 0, 4, 0]), 2), [0, 1])
    t1 = prep.tables[1]
    assert [int(x) for x in t1.unique] == [5, 2**48, 2**63, 2**64 - 1]
    np.testing.assert_array_equal(t1.unique[t1.inverse], v[4:])
    np.testing.assert_array_equal(t1.offsets, [0, 4, 4])
    t0 = prep.tables[0]
    np.testing.assert_array_equal(t0.unique[t0.inverse], v[:4])


near_edge = st.builds(lambda e, d: min(max(e + d, 0), M64), st.sampled_from(EDGES), st.integers(-3, 3))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.integers(0, 12), st.data())
def test_prepare_any_u64_every_table_count(f, b, data):
    """Ids near 0, 2^31, 2^32, 2^48, 2^53, 2^63, 2^64-1, with 1..F distinct tables."""
    lengths = np.array(data.draw(st.lists(st.integers(0, 4), min_size=f * b, max_size=f * b)), dtype=np.int64)
    ids = data.draw(st.lists(near_edge, min_size=int(lengths.sum()), max_size=int(lengths.sum())))
    ntab = data.draw(st.integers(1, f))
    ftab = data.draw(st.lists(st.integers(0, ntab - 1), min_size=f, max_size=f))
    for values in (np.array(ids, dtype=np.uint64), ids):  # an array, and plain Python ints
        batch = KeyedJaggedBatch([f"f{i}" for i in range(f)], values, lengths, b)
        prep = prepare_batch(batch, ftab)
        off = np.r_[0, np.cumsum(lengths)]
        for t in set(ftab):
            tp = prep.tables[t]
            feats = [i for i, x in enumerate(ftab) if x == t]
            want = [ids[j] for i in feats for j in range(off[i * b], off[(i + 1) * b])]
            assert tp.unique.dtype == np.uint64 and tp.inverse.dtype == np.int64
            assert [int(x) for x in tp.unique] == sorted(set(want))  # exact, Python ints
            assert [int(x) for x in tp.unique[tp.inverse]] == want
            assert tp.offsets[-1] == len(want) and len(tp.offsets) == len(feats) * b + 1
        assert prep.num_ids == len(ids)


def test_as_ids_exact_without_floats():
    from embnic.client_lib.batch import as_ids

    # numpy would make float64 of np.uint64 mixed with int, object of ints beyond int64 mixed with others
    assert [int(x) for x in as_ids([np.uint64(2**64 - 1), 3])] == [2**64 - 1, 3]
    assert [int(x) for x in as_ids([2**64 - 1, np.int64(0), 2**53 + 1])] == [2**64 - 1, 0, 2**53 + 1]
    assert as_ids(np.array([7], np.int32)).dtype == np.uint64
    for bad, msg in (([1.5], "integers"), ([-1], "0..2"), ([2**64], "0..2"), (np.array([-2]), "0..2"),
                     (np.array([1.0]), "dtype float64"), (np.array([True]), "dtype bool"),
                     (np.zeros((2, 2), np.uint64), "1-D")):
        with pytest.raises(ValueError, match=msg):
            as_ids(bad)


# ---- empty and malformed batches ---------------------------------------------------------------

@pytest.mark.parametrize("keys,ftab,stride,lengths,values", [
    (["a", "b"], [0, 1], 0, [], []),              # zero samples
    ([], [], 4, [], []),                          # zero features
    (["a", "b"], [0, 0], 3, [0] * 6, []),         # all bags empty
])
def test_empty_batches_give_empty_results(keys, ftab, stride, lengths, values):
    prep = prepare_batch(KeyedJaggedBatch(keys, np.array(values, np.uint64), np.array(lengths, np.int64), stride),
                         ftab)
    assert sorted(prep.tables) == sorted(set(ftab)) and prep.num_ids == prep.num_unique == 0
    for t, tp in prep.tables.items():
        nb = len(tp.features) * stride
        assert tp.unique.size == tp.inverse.size == 0 and tp.unique.dtype == np.uint64
        np.testing.assert_array_equal(tp.offsets, np.zeros(nb + 1))
    nb = prep.lengths.size
    assert pool_all(np.zeros((0, 3), np.float32), prep).shape == (nb, 3)
    assert pool_backward_all(np.ones((nb, 3), np.float32), prep).shape == (0, 3)


def test_zero_samples_with_keys_gives_offsets_zero():
    prep = prepare_batch(KeyedJaggedBatch(["a", "b", "c"], np.empty(0, np.uint64), np.empty(0, np.int32), 0),
                         [3, 1, 3])
    assert {t: tp.offsets.tolist() for t, tp in prep.tables.items()} == {1: [0], 3: [0]}


def test_table_without_ids_and_shard_without_ids():
    from embnic.client_lib.config import parse_config
    from pyplan import split_by_shard

    prep = prepare_batch(KeyedJaggedBatch(["a", "b"], np.array([4, 4], np.uint64), np.array([1, 1, 0, 0]), 2),
                         [0, 1])
    assert prep.tables[1].unique.size == 0 and prep.tables[1].offsets.tolist() == [0, 0, 0]
    cfg = parse_config({"cluster": {"sharding": "table"},
                        "tables": [{"id": 0, "dim": 4, "shard": 0}, {"id": 1, "dim": 4, "shard": 0}],
                        "shards": [{"id": 0, "ip": "127.0.0.1", "port": 1}, {"id": 1, "ip": "127.0.0.1", "port": 2}],
                        "clients": [{"id": 1, "ip": "127.0.0.1"}]})
    assert [s for s, _, _ in split_by_shard(cfg, 0, prep.tables[0].unique)] == [0]  # shard 1 gets none
    assert split_by_shard(cfg, 1, prep.tables[1].unique) == []


@pytest.mark.parametrize("batch,ftab,msg", [
    # the issue's example: lengths of size 3 for 2 features x 2 samples
    (KeyedJaggedBatch(["a", "b"], np.arange(3, dtype=np.uint64), np.array([1, 1, 1]), 2), [0, 1],
     r"lengths has shape \(3,\), expected \(2\*2,\)"),
    (KeyedJaggedBatch(["a"], np.arange(3, dtype=np.uint64), np.array([1, 1]), 2), [0], r"sum\(lengths\)=2"),
    (KeyedJaggedBatch(["a"], np.arange(1, dtype=np.uint64), np.array([2, -1]), 2), [0], "negative length"),
    (KeyedJaggedBatch(["a"], np.arange(2, dtype=np.uint64), np.array([1.0, 1.0]), 2), [0], "lengths must be integers"),
    (KeyedJaggedBatch(["a"], np.zeros((1, 2), np.uint64), np.array([1, 1]), 2), [0], "1-D id array"),
    (KeyedJaggedBatch(["a"], np.array([1.0, 2.0]), np.array([1, 1]), 2), [0], "dtype float64"),
    (KeyedJaggedBatch(["a"], np.array([-1, 2]), np.array([1, 1]), 2), [0], "0..2\\*\\*64-1"),
    (KeyedJaggedBatch(["a"], np.arange(2, dtype=np.uint64), np.array([1, 1]), -2), [0], "stride"),
    (KeyedJaggedBatch(["a"], np.arange(2, dtype=np.uint64), np.array([1, 1]), 2), [0, 1], "feature→table"),
    (KeyedJaggedBatch(["a"], np.arange(2, dtype=np.uint64), np.array([1, 1]), 2), [70000], "table id"),
])
def test_malformed_batches_raise_naming_the_problem(batch, ftab, msg):
    with pytest.raises(ValueError, match=msg):
        prepare_batch(batch, ftab)
    with pytest.raises(ValueError, match=msg):
        validate_batch(batch, ftab)


def test_from_dense_refuses_wrong_shapes():
    with pytest.raises(ValueError, match="ids must be"):
        KeyedJaggedBatch.from_dense(["a", "b"], np.zeros(4, np.uint64))
    with pytest.raises(ValueError, match="ids must be"):
        KeyedJaggedBatch.from_dense(["a", "b"], np.zeros((4, 3), np.uint64))
    b = KeyedJaggedBatch.from_dense(["a", "b"], [[1, 2**64 - 1], [3, 4]])
    assert [int(x) for x in b.values] == [1, 3, 2**64 - 1, 4] and b.stride == 2


@pytest.mark.parametrize("top", [2**20, 2**40, 2**64 - 1])
def test_one_sort_of_every_table_matches_np_unique_per_table(top):
    """prepare_batch sorts every table's ids at once: packed (table, id, position) keys where they
    fit 64 bits, an argsort and a stable pass by table where ids use them all; tables whose
    features are not consecutive too."""
    rng = np.random.default_rng(top % 1000)
    f, b = 9, 50
    lengths = rng.integers(0, 4, f * b)
    values = rng.integers(0, top, int(lengths.sum()), dtype=np.uint64, endpoint=True) % np.uint64(top)
    values[::7] = values[0]  # duplicates across tables and within
    batch = KeyedJaggedBatch([f"f{i}" for i in range(f)], values, lengths, b)
    ftab = [5, 2, 5, 9, 2, 2, 1000, 5, 3]
    prep = prepare_batch(batch, ftab)
    ref = _reference(batch, ftab)
    assert list(prep.tables) == sorted(ref)
    for t, (u, inv, off) in ref.items():
        tp = prep.tables[t]
        np.testing.assert_array_equal(tp.unique, u)
        np.testing.assert_array_equal(tp.inverse, inv)
        np.testing.assert_array_equal(tp.offsets, off)
        assert tp.features == [i for i, x in enumerate(ftab) if x == t]
    assert prep.num_unique == sum(len(u) for u, _, _ in ref.values())
