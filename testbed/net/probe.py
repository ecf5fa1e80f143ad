"""What a readiness probe of the testbed asks each shard: a key it owns (:func:`probe_key`)."""
from __future__ import annotations

from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.consts import Status


def probe_key(cfg: ClusterConfig, shard_id: int):
    """The (table, key, owned) a readiness probe of shard ``shard_id`` looks up.

    The first table (config order) with a key the shard owns among ids ``0 .. min(rows, 4096)-1``
    and the smallest such key: under the ``hash`` policy a shard of S owns one id in S, so
    4096 candidates miss with probability (1-1/S)^4096. ``owned`` is False only when the shard
    owns none of them (``table`` policy, no table on it): then table 0, key 0.

    Returns:
        (``TableConfig``, keys uint64 (1,), owned bool).
    """
    import numpy as np

    from embnic.client_lib.routing import shard_of

    for t in cfg.tables:
        cand = np.arange(min(t.rows, 4096) if t.rows is not None else 4096, dtype=np.uint64)
        hit = np.flatnonzero(shard_of(cfg, t.id, cand) == shard_id)
        if hit.size:
            return t, cand[hit[:1]], True
    return cfg.tables[0], np.zeros(1, dtype=np.uint64), False


def status_name(status: int) -> str:
    """The name of a reply's status (``Status``), or its number when it is none of them."""
    try:
        return Status(status).name
    except ValueError:
        return str(status)
