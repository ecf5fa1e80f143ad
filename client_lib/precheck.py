"""Checks of a whole lookup or update round, before any message of it is built or sent.

A round spans several tables and, per table, several shards (``routing.split_by_shard``). A
shard refuses a bad message on its own (``KEY_OUT_OF_RANGE``, ``MALFORMED``: duplicate keys, a
gradient its optimizer must not apply — docs/protocol.md, "Reliability"), so a round checked
only by the shards can be applied in part: one shard's share applied, another's refused. What a
client can know from the cluster config alone it therefore checks here, over every table of the
call, and raises before the first frame leaves:

* the argument is ``{table_id: ...}`` of tables of the config;
* keys are 1-D integers in 0..2^64-1 and, for a table with ``rows``, below ``rows``;
* for updates: keys unique, gradients real numbers of shape ``(N, dim)`` that the table's
  optimizer may apply (:func:`~embnic.client_lib.table_numerics.gradient_rows_ok`, the rule
  the shards apply, after the wire's fp16 rounding).

Every check is a numpy vector operation over the keys or gradients of one table (a Python loop
runs over the tables of the call only). Used by :class:`~embnic.client_lib.client.EmbeddingClient`
and by the per-table adapters of :class:`~embnic.client_lib.local.LocalBackend` (the PyTorch
module, the training loop), so the in-process reference refuses the same rounds, whole.

Example::

    update_round(cfg, {0: (np.array([3, 5], np.uint64), np.zeros((3, 4), np.float32))})
    # ValueError: table 0 (a): grads shape (3, 4), expected (2, 4): one row of dim 4 per key
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .config import ClusterConfig, TableConfig
from .table_numerics import table_label, validate_keys, validate_update


def _table(cfg: ClusterConfig, table_id) -> TableConfig:
    for t in cfg.tables:
        if t.id == table_id and not isinstance(table_id, bool):
            return t
    raise ValueError(f"unknown table {table_id!r} (tables of {cfg.path or 'the config'}: "
                     f"{cfg.table_ids_text()})")


def lookup_round(cfg: ClusterConfig, requests: Mapping) -> dict[int, np.ndarray]:
    """Check a lookup round; returns ``{table_id: keys uint64 (N_t,)}`` (duplicates allowed).

    Args:
        cfg: the cluster config (tables, rows).
        requests: ``{table_id: keys}``, keys any 1-D integer array or sequence of ints.

    Raises:
        ValueError: naming the table and the problem (not a mapping, unknown table, keys not
            1-D integers in 0..2^64-1, a key ``>= rows``).
    """
    if not isinstance(requests, Mapping):
        raise ValueError(f"a lookup takes {{table_id: keys}}, got {type(requests).__name__}")
    return {t.id: validate_keys(t, keys) for t, keys in ((_table(cfg, tid), k) for tid, k in requests.items())}


def update_round(cfg: ClusterConfig, updates: Mapping) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Check an update round; returns ``{table_id: (keys uint64 (N,), grads float32 (N, dim))}``.

    Args:
        cfg: the cluster config (tables: rows, dim, dtype, optimizer and lr for the gradient rule).
        updates: ``{table_id: (keys, grads)}``, keys unique.

    Raises:
        ValueError: naming the table and the problem (not a mapping, unknown table, an entry
            that is not a (keys, grads) pair, bad keys, a duplicate key, grads of another shape
            than ``(len(keys), dim)``, a gradient the shards refuse — NaN, inf, or a step that
            overflows float32).
    """
    if not isinstance(updates, Mapping):
        raise ValueError(f"an update takes {{table_id: (keys, grads)}}, got {type(updates).__name__}")
    out = {}
    for tid, entry in updates.items():
        t = _table(cfg, tid)
        if not isinstance(entry, (tuple, list)) or len(entry) != 2:
            raise ValueError(f"{table_label(t)}: an update entry is (keys, grads), got {type(entry).__name__}")
        out[t.id] = validate_update(t, entry[0], entry[1])
    return out
