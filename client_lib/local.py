"""The in-process reference backend: every embedding table whole in this process.

:class:`LocalBackend` has the network client's interface (``lookup``/``update`` per table) and
the parameter-server shards' numerics, bit for bit: both use
:mod:`embnic.client_lib.table_numerics` (row store, initialisation, SGD / row-wise Adagrad).
``embnic train --local`` and the demo's reference run train through it.
"""
from __future__ import annotations

import numpy as np

from .config import ClusterConfig, id_ranges
from .table_numerics import TableShard, validate_keys, validate_update, wire_round


class LocalBackend:
    """The in-process reference: every table whole in this process, same interface as the
    network client (``lookup``/``update``), same numerics as the servers, bit for bit.

    Values make the same round trip as over the wire (:func:`wire_round` for fp16 tables).

    Args:
        cfg: the cluster config (tables, seed).
    """

    def __init__(self, cfg: ClusterConfig):
        self.cfg = cfg
        self.tables = {t.id: TableShard(t, cfg.seed) for t in cfg.tables}

    def _table(self, table_id: int) -> TableShard:
        try:
            return self.tables[table_id]
        except KeyError:
            raise ValueError(f"unknown table {table_id} (tables: {id_ranges(self.tables)})") from None

    def lookup(self, table_id: int, keys_unique: np.ndarray) -> np.ndarray:
        """Rows of ``keys_unique`` (uint64 (N,)) of table ``table_id`` → float32 (N, dim).

        Raises:
            ValueError: unknown table or a key out of range.
        """
        ts = self._table(table_id)
        k = validate_keys(ts.table, keys_unique)
        return wire_round(ts.lookup(k), ts.table.dtype)

    def update(self, table_id: int, keys_unique: np.ndarray, grads: np.ndarray) -> None:
        """Apply gradients float32 (N, dim) to rows ``keys_unique`` uint64 (N,) (no duplicates).

        Raises:
            ValueError: unknown table, a key out of range, duplicate keys, wrong shape, or a
                gradient the shards refuse with MALFORMED (NaN/inf, or a step that overflows
                float32: :func:`~embnic.client_lib.table_numerics.gradient_rows_ok`); nothing
                of the update is applied then.
        """
        ts = self._table(table_id)
        k, g = validate_update(ts.table, keys_unique, grads)
        ts.apply(k, wire_round(g, ts.table.dtype))

    def state_dict(self) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``{table_id: (keys uint64 (M,) sorted, rows float32 (M, dim), acc float32 (M,))}``
        of every table's updated rows."""
        return {tid: ts.state() for tid, ts in self.tables.items()}
