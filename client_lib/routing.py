"""Routing of embedding ids to parameter-server shards (the target address of a message).

Policies (``[cluster] sharding`` in the config, docs/config.md):

- ``hash`` (row-wise, hash-modulo): key ``k`` of table ``t`` lives on shard
  ``splitmix64((t << 48) ^ k) mod S`` (:func:`embnic.client_lib.splitmix.splitmix64`); ``k`` is
  any uint64 id (0..2^64-1) and the formula is fixed (changing it would move every row).
- ``table`` (table-wise): every key of table ``t`` lives on shard ``tables[t].shard`` if set,
  else ``t mod S``.

``S`` is the number of shards; shard index ``i`` means ``cfg.shards[i]`` (so shard ids in the
config need not be dense).
"""
from __future__ import annotations

import numpy as np

from .batch import as_ids
from .config import ClusterConfig
from .splitmix import splitmix64

def shard_index_of(cfg: ClusterConfig, table_id: int, keys: np.ndarray) -> np.ndarray:
    """Index into ``cfg.shards`` of the shard owning every key.

    Args:
        cfg: cluster config (policy and shard list).
        table_id: the table the keys belong to.
        keys: uint64 (N,) ids, any of 0..2^64-1 (or integers :func:`~embnic.client_lib.batch.as_ids`
            converts exactly).

    Returns:
        int64 (N,) shard indices in ``[0, len(cfg.shards))``.

    Raises:
        ValueError: keys not 1-D integers in 0..2^64-1.
    """
    s = len(cfg.shards)
    keys = as_ids(keys)
    if cfg.sharding == "table":
        t = cfg.table(table_id)
        if t.shard is not None:
            idx = next(i for i, sh in enumerate(cfg.shards) if sh.id == t.shard)
        else:
            idx = table_id % s
        return np.full(keys.shape, idx, dtype=np.int64)
    h = splitmix64(keys ^ np.uint64(table_id << 48))
    return (h % np.uint64(s)).astype(np.int64)


def shard_of(cfg: ClusterConfig, table_id: int, keys: np.ndarray) -> np.ndarray:
    """Shard id (as in the config) owning every key: int64 (N,). See :func:`shard_index_of`."""
    ids = np.array([sh.id for sh in cfg.shards], dtype=np.int64)
    return ids[shard_index_of(cfg, table_id, keys)]


def owns(cfg: ClusterConfig, table_id: int, shard_id: int, keys: np.ndarray) -> np.ndarray:
    """bool (N,): whether ``shard_id`` owns each key of ``table_id``."""
    return shard_of(cfg, table_id, keys) == shard_id


def owns_tables(cfg: ClusterConfig, table_ids: np.ndarray, counts: np.ndarray, shard_id: int,
                keys: np.ndarray) -> np.ndarray:
    """:func:`owns` for the keys of several tables at once (a protocol-v2 message's directory):
    bool (n,), whether ``shard_id`` owns each key.

    Args:
        table_ids: int (T,), the tables in order; counts: int (T,), keys of each;
        keys: uint64 (n,), table by table (``n = counts.sum()``).

    One hash over every key under ``hash`` sharding (the formula of :func:`shard_index_of`, with
    each key's table in the top 16 bits); a constant per table under ``table`` sharding.

    Raises:
        KeyError: a table not in the config (``table`` sharding only).
    """
    tids = np.asarray(table_ids, np.int64)
    counts = np.asarray(counts, np.int64)
    ids = np.array([sh.id for sh in cfg.shards], dtype=np.int64)
    if cfg.sharding == "table":
        mine = np.array([ids[shard_index_of(cfg, t, np.zeros(1, np.uint64))[0]] == shard_id for t in tids.tolist()],
                        bool)
        return np.repeat(mine, counts)
    t48 = np.repeat(tids.astype(np.uint64) << np.uint64(48), counts)
    h = splitmix64(np.asarray(keys, np.uint64) ^ t48)
    return ids[(h % np.uint64(len(cfg.shards))).astype(np.int64)] == shard_id
