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


def flat_calls(backend):
    """``backend`` as ``(lookup(table_ids, counts, keys) -> float32 values, update(table_ids,
    counts, keys, grads))`` over flat rounds — every table's keys one table after the other, rows
    and gradients likewise, table ``t``'s ``(counts[t], dim_t)`` (what
    :meth:`~embnic.client_lib.client.EmbeddingClient.lookup_flat` and ``update_flat`` take). An
    ``EmbeddingClient`` takes them as they are; a :class:`LocalBackend` (the in-process
    reference) or any backend of ``lookup({t: keys})`` / ``update({t: (keys, grads)})`` gets them
    per table, after the whole round was checked (:mod:`~embnic.client_lib.precheck`), as the
    network client checks it."""
    from . import precheck

    if hasattr(backend, "lookup_flat") and hasattr(backend, "update_flat"):
        return backend.lookup_flat, backend.update_flat
    cfg = backend.cfg if hasattr(backend, "cfg") else backend.inner.cfg
    if isinstance(backend, LocalBackend):
        def lookup_d(req):
            return {t: backend.lookup(t, k) for t, k in precheck.lookup_round(cfg, req).items()}

        def update_d(upd):
            for t, (k, g) in precheck.update_round(cfg, upd).items():
                backend.update(t, k, g)
    else:
        lookup_d, update_d = backend.lookup, backend.update

    def split(table_ids, counts, keys):
        return dict(zip(np.asarray(table_ids).tolist(), np.split(keys, np.cumsum(counts)[:-1])))

    def lookup(table_ids, counts, keys):
        rows = lookup_d(split(table_ids, counts, keys))
        parts = [np.asarray(rows[t], np.float32).reshape(-1) for t in np.asarray(table_ids).tolist()]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def update(table_ids, counts, keys, grads):
        dims = [cfg.table(t).dim for t in np.asarray(table_ids).tolist()]
        vo = np.concatenate([[0], np.cumsum(np.asarray(counts) * dims)]).astype(np.int64)
        grads = np.asarray(grads).reshape(-1)
        update_d({t: (k, grads[a:b].reshape(-1, d)) for (t, k), a, b, d in
                  zip(split(table_ids, counts, keys).items(), vo[:-1].tolist(), vo[1:].tolist(), dims)})
    return lookup, update
