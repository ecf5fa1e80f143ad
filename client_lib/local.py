"""The in-process reference backend: every embedding table whole in this process
(``embnic train --local``, the demo's reference run and the DLRM workers' reference).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from . import precheck
from .config import ClusterConfig
from .consts import DType
from .roundplan import TableArrays, split_rows
from .rowstore import TableShard, shared_tables
from .table_numerics import wire_round


class LocalBackend:
    """The in-process reference: the backend contract (:class:`~embnic.client_lib.backend.Backend`)
    with the shards' numerics bit for bit. Every table's rows are in one
    :class:`~embnic.client_lib.rowstore.RowStore` (as a shard's), so a round of any number of
    tables is one check (:mod:`~embnic.client_lib.precheck`, the client's: the same rounds are
    refused, whole), one search and gather for a lookup, one optimizer step for an update. Values
    make the same round trip as over the wire (:func:`~embnic.client_lib.table_numerics.wire_round`
    of an fp16 table's rows and gradients).

    Args:
        cfg: the cluster config (tables, seed).

    Attributes:
        tables: ``{table_id: TableShard}``, each table's view of the store (``state()``, ``len()``).
    """

    def __init__(self, cfg: ClusterConfig):
        self.cfg = cfg
        self._ta = TableArrays(cfg)
        self.store, views = shared_tables(list(cfg.tables), cfg.seed)
        self.tables: dict[int, TableShard] = {t.id: views[t.id] for t in cfg.tables}  # config order

    # -- the contract ---------------------------------------------------------------------------

    def lookup(self, requests: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        """:meth:`Backend.lookup <embnic.client_lib.backend.Backend.lookup>` (rows: views of one array)."""
        tix, counts, keys = precheck.lookup_flat(self.cfg, self._ta, requests)
        return split_rows(self._ta, tix, counts, self._rows(tix, counts, keys))

    def lookup_flat(self, table_ids, counts, keys) -> np.ndarray:
        """:meth:`Backend.lookup_flat <embnic.client_lib.backend.Backend.lookup_flat>`."""
        return self._rows(*precheck.lookup_jagged(self.cfg, self._ta, table_ids, counts, keys))

    def update(self, updates: Mapping[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """:meth:`Backend.update <embnic.client_lib.backend.Backend.update>`."""
        self._apply(*precheck.update_flat(self.cfg, self._ta, updates))

    def update_flat(self, table_ids, counts, keys, grads) -> None:
        """:meth:`Backend.update_flat <embnic.client_lib.backend.Backend.update_flat>`."""
        self._apply(*precheck.update_jagged(self.cfg, self._ta, table_ids, counts, keys, grads))

    # -- reading the tables -----------------------------------------------------------------------

    def state_dict(self) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``{table_id: (keys uint64 (M,) sorted, rows float32 (M, dim), acc float32 (M,))}``
        of every table's updated rows (master values, before any wire rounding)."""
        return {tid: ts.state() for tid, ts in self.tables.items()}

    # -- the round, checked (tix: indices into TableArrays, counts int64, keys uint64) -------------

    def _fp16_values(self, tix: np.ndarray, counts: np.ndarray) -> np.ndarray | None:
        """bool (Σ counts·dim,) marking the values of fp16 tables in a flat round, or None if none."""
        fp16 = self._ta.dtype[tix] == DType.FP16
        return np.repeat(fp16, counts * self._ta.dim[tix]) if fp16.any() else None

    def _rows(self, tix: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """float32 (Σ counts·dim,): the round's rows, one table after the other, as received."""
        if keys.size == 0:
            return np.zeros(0, np.float32)
        li = np.repeat(self.store.local_index(self._ta.ids[tix]), counts)
        out = self.store.lookup(li, keys).reshape(-1)
        m = self._fp16_values(tix, counts)
        if m is not None:
            out[m] = wire_round(out[m], DType.FP16)
        return out

    def _apply(self, tix: np.ndarray, counts: np.ndarray, keys: np.ndarray, grads: np.ndarray) -> None:
        """One optimizer step over the round (keys unique per table: checked by precheck)."""
        if keys.size == 0:
            return
        g = np.array(grads, np.float32).reshape(-1)  # a copy: the caller's gradients stay as they are
        m = self._fp16_values(tix, counts)
        if m is not None:
            g[m] = wire_round(g[m], DType.FP16)
        self.store.apply(np.repeat(self.store.local_index(self._ta.ids[tix]), counts), keys, g)
