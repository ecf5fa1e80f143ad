"""Routing of ids to shards: hash-modulo and table-wise policies.

Run alone: python3 -m pytest -q tests/client_lib/test_routing.py
"""
import numpy as np

from embnic.client_lib.config import parse_config
from embnic.client_lib.routing import shard_of

from clientref import owned_keys
from pyplan import split_by_shard


def _cfg(policy, n_shards=3, shard_ids=None, table_shard=None):
    ids = shard_ids or list(range(n_shards))
    tables = [{"id": 0, "rows": 10000, "dim": 4}, {"id": 1, "rows": 10000, "dim": 4}]
    if table_shard is not None:
        tables[1]["shard"] = table_shard
    return parse_config({
        "cluster": {"sharding": policy},
        "tables": tables,
        "shards": [{"id": i, "ip": "127.0.0.1", "port": 20000 + i} for i in ids],
        "clients": [{"id": 1, "ip": "127.0.0.1"}],
    })


def test_hash_policy_balanced_and_deterministic():
    cfg = _cfg("hash", shard_ids=[4, 7, 9])
    keys = np.arange(30000, dtype=np.uint64)
    s = shard_of(cfg, 0, keys)
    assert set(np.unique(s)) == {4, 7, 9}
    counts = np.bincount(s)[[4, 7, 9]]
    assert counts.min() > 0.9 * counts.mean()
    np.testing.assert_array_equal(s, shard_of(cfg, 0, keys))
    assert not np.array_equal(s, shard_of(cfg, 1, keys))  # tables spread independently


def test_table_policy():
    cfg = _cfg("table", table_shard=2)
    keys = np.arange(100, dtype=np.uint64)
    assert set(shard_of(cfg, 0, keys)) == {0}  # 0 mod 3
    assert set(shard_of(cfg, 1, keys)) == {2}  # placed


def test_split_by_shard_partitions_keys():
    cfg = _cfg("hash")
    keys = np.sort(np.random.default_rng(0).integers(0, 10000, 500).astype(np.uint64))
    parts = split_by_shard(cfg, 0, keys)
    pos_all = np.concatenate([p for _, p, _ in parts])
    assert sorted(pos_all.tolist()) == list(range(len(keys)))
    for sid, pos, k in parts:
        np.testing.assert_array_equal(keys[pos], k)
        assert (shard_of(cfg, 0, k) == sid).all()
        assert (np.diff(pos) > 0).all()  # order kept within a shard


def test_owned_keys_cover_table_once():
    cfg = _cfg("hash")
    owned = [owned_keys(cfg, 0, s) for s in range(3)]
    allk = np.sort(np.concatenate(owned))
    np.testing.assert_array_equal(allk, np.arange(10000, dtype=np.uint64))


def _splitmix64_py(x: int) -> int:
    m = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_hash_routing_of_any_u64_matches_the_formula():
    """splitmix64((t << 48) ^ k) mod S in Python ints, for ids at the edges of every width."""
    import pytest

    edges = [0, 1, 2**31, 2**32, 2**48 - 1, 2**48, 2**53 + 1, 2**63, 2**64 - 2, 2**64 - 1]
    cfg = _cfg("hash", shard_ids=[4, 7, 9])
    ids = [4, 7, 9]
    for t in (0, 1):
        want = [ids[_splitmix64_py((t << 48) ^ k) % 3] for k in edges]
        assert shard_of(cfg, t, np.array(edges, np.uint64)).tolist() == want
        assert shard_of(cfg, t, edges).tolist() == want  # Python ints, no float round trip
        parts = split_by_shard(cfg, t, edges)
        assert sorted(int(k) for _, _, ks in parts for k in ks) == edges
        assert all(want[int(p)] == s for s, pos, _ in parts for p in pos)
    for bad in ([-1], [0.5]):
        with pytest.raises(ValueError):
            shard_of(cfg, 0, bad)


def test_owned_keys_needs_rows():
    import pytest

    cfg = parse_config({"tables": [{"id": 0, "dim": 4}], "shards": [{"id": 0, "ip": "127.0.0.1"}],
                        "clients": [{"id": 1, "ip": "127.0.0.1"}]})
    with pytest.raises(ValueError, match="no rows bound"):
        owned_keys(cfg, 0, 0)


def test_split_by_shard_property_any_u64():
    """hypothesis: ids near 0, 2^31, 2^32, 2^48, 2^53, 2^63, 2^64-1, any table id, 1..5 shards:
    every id goes to splitmix64((t << 48) ^ k) mod S, once, with its position."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    edges = [0, 2**31, 2**32, 2**48, 2**53, 2**63, 2**64 - 1]
    near = st.builds(lambda e, d: min(max(e + d, 0), 2**64 - 1), st.sampled_from(edges), st.integers(-2, 2))

    @settings(max_examples=100, deadline=None)
    @given(st.lists(near, max_size=40, unique=True), st.integers(0, 0xFFFF), st.integers(1, 5))
    def check(ids, t, n):
        cfg = parse_config({"tables": [{"id": t, "dim": 4}],
                            "shards": [{"id": 10 + i, "ip": "127.0.0.1", "port": 20000 + i} for i in range(n)],
                            "clients": [{"id": 1, "ip": "127.0.0.1"}]})
        keys = np.array(sorted(ids), dtype=np.uint64)
        seen = {}
        for sid, pos, ks in split_by_shard(cfg, t, keys):
            assert np.array_equal(keys[pos], ks)
            for p in pos.tolist():
                seen[p] = sid
        assert seen == {i: 10 + _splitmix64_py((t << 48) ^ int(k)) % n for i, k in enumerate(keys)}

    check()
