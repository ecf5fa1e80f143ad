"""The numpy optimizer step and row apply: the test oracle of the row store's C updates
(``client_lib/csrc/store.c``, ``embnic_store_apply`` and ``embnic_rows_step``, the one production
implementation, through :meth:`embnic.client_lib.rowstore.RowStore.apply` and
:func:`embnic.client_lib.table_numerics.optimizer_step`). Moved here from ``client_lib/rowstore.py``
(``RowStore.apply`` / ``apply_passes`` / ``_materialise``) and ``client_lib/table_numerics.py``
(``optimizer_step``); ``test_rowstore_c.py`` compares both bit for bit. :func:`numpy_find` is the
store's search in numpy (``RowStore._find``, in C ``embnic_store_find_many``); :func:`numpy_init_rows`
the initial rows in numpy (``table_numerics.init_rows``, in C ``embnic_init_rows``).

:class:`NumpyRowStore` keeps each table's rows in a dict (key → row, accumulator) and applies a
batch as the numpy store did: in passes — pass ``r`` every (table, key)'s ``r``-th gradient in
arrival order — each pass one vectorised optimizer step over the rows it touches (rows of one
dim: :func:`optimizer_step`, or the mixed Adagrad/SGD step; rows of several dims: the ragged
mean square).
"""
from __future__ import annotations

import numpy as np

from embnic.client_lib.config import TableConfig
from embnic.client_lib.rowstore import RowStore
from embnic.client_lib.splitmix import splitmix64, u64
from embnic.client_lib.table_numerics import rowwise_mean_square, rowwise_mean_square_ragged


def numpy_init_rows(seed: int, table_id: int, keys: np.ndarray, dim: int, scale: float) -> np.ndarray:
    """``table_numerics.init_rows`` (its docstring has the formula) in numpy: float32 (N, dim)."""
    t = splitmix64(u64(seed) ^ splitmix64(u64(table_id)))
    h = splitmix64(np.asarray(keys, np.uint64).reshape(-1) ^ t)
    cols = splitmix64(np.arange(dim, dtype=np.uint64) + np.uint64(0x5EED000000000000))
    u = (splitmix64(h[:, None] ^ cols[None, :]) >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)
    return (u * np.float32(2.0) - np.float32(1.0)) * np.float32(scale)


def optimizer_step(w: np.ndarray, acc: np.ndarray | None, g: np.ndarray, lr, eps) -> np.ndarray | None:
    """One optimizer step on rows ``w`` float32 (N, dim) in place: row-wise Adagrad when ``acc``
    float32 (N,) is given (not changed; the new accumulators are returned), else SGD (None).
    ``lr``, ``eps``: float32 scalars or float32 (N,)."""
    with np.errstate(over="ignore"):
        if acc is not None:
            acc = acc + rowwise_mean_square(g)
            mult = lr / (np.sqrt(acc) + eps)
            w -= mult[:, None] * g
            return acc
        w -= (lr[:, None] if np.ndim(lr) else lr) * g
        return None


class NumpyRowStore:
    """The rows of ``tables`` (by local index, in table id order, as
    :class:`~embnic.client_lib.rowstore.RowStore`), updated with numpy."""

    def __init__(self, tables: list[TableConfig], seed: int):
        self.tables = sorted(tables, key=lambda t: t.id)
        self.seed = int(seed)
        self.tdim = np.array([t.dim for t in self.tables], np.int64)
        self.tadagrad = np.array([t.optimizer == "adagrad" for t in self.tables], bool)
        self.tlr = np.array([np.float32(t.lr) for t in self.tables], np.float32)
        self.teps = np.array([np.float32(t.eps) for t in self.tables], np.float32)
        self.rows: list[dict[int, np.ndarray]] = [{} for _ in self.tables]
        self.acc: list[dict[int, np.float32]] = [{} for _ in self.tables]

    def _row(self, li: int, key: int) -> np.ndarray:
        r = self.rows[li].get(key)
        if r is None:  # materialised on its first update
            t = self.tables[li]
            r = numpy_init_rows(self.seed, t.id, np.array([key], np.uint64), t.dim, t.init_scale)[0]
            self.rows[li][key] = r
            self.acc[li][key] = np.float32(0)
        return r

    def apply(self, li, keys: np.ndarray, grads: np.ndarray) -> None:
        """As :meth:`RowStore.apply`: ``li`` an int or int64 (N,), keys uint64 (N,) (a (table, key)
        may repeat: applied in order), ``grads`` float32 flat or (N, dim)."""
        keys = np.asarray(keys, np.uint64).reshape(-1)
        li = np.broadcast_to(np.asarray(li, np.int64), keys.shape)
        dims = self.tdim[li]
        g = np.ascontiguousarray(grads, np.float32).reshape(-1)
        goff = np.r_[0, np.cumsum(dims)]
        seen: dict[tuple[int, int], int] = {}
        rank = np.empty(keys.size, np.int64)
        for i, (t, k) in enumerate(zip(li.tolist(), keys.tolist())):
            rank[i] = seen.get((t, k), 0)
            seen[(t, k)] = rank[i] + 1
        for r in range(int(rank.max()) + 1 if keys.size else 0):
            sel = np.flatnonzero(rank == r)
            self._pass(li[sel], keys[sel], [g[goff[i]:goff[i + 1]] for i in sel])

    def _pass(self, li: np.ndarray, keys: np.ndarray, gl: list[np.ndarray]) -> None:
        """One vectorised step over rows of distinct (table, key)s."""
        dims = self.tdim[li]
        ada = self.tadagrad[li]
        lr, eps = self.tlr[li], self.teps[li]
        rows = [self._row(int(t), int(k)) for t, k in zip(li, keys)]
        acc0 = np.array([self.acc[int(t)][int(k)] for t, k in zip(li, keys)], np.float32)
        with np.errstate(over="ignore"):
            if (dims == dims[0]).all():
                w = np.stack(rows)
                g = np.stack(gl)
                acc = acc0
                if bool(ada.all()) or not ada.any():
                    new = optimizer_step(w, acc0 if bool(ada.all()) else None, g, lr, eps)
                    acc = acc0 if new is None else new
                else:  # Adagrad and SGD tables in one step
                    mult = lr.copy()
                    a = np.flatnonzero(ada)
                    acc = acc0.copy()
                    acc[a] = acc0[a] + rowwise_mean_square(g[a])
                    mult[a] = lr[a] / (np.sqrt(acc[a]) + eps[a])
                    w -= mult[:, None] * g
                out = list(w)
            else:  # rows of several dims, flat
                w = np.concatenate(rows)
                g = np.concatenate(gl)
                mult = lr.copy()
                acc = acc0.copy()
                a = np.flatnonzero(ada)
                if a.size:
                    ga = g[np.repeat(ada, dims)]
                    acc[a] = acc0[a] + rowwise_mean_square_ragged(ga, dims[a])
                    mult[a] = lr[a] / (np.sqrt(acc[a]) + eps[a])
                w -= np.repeat(mult, dims) * g
                out = np.split(w, np.cumsum(dims)[:-1])
        for j, (t, k) in enumerate(zip(li.tolist(), keys.tolist())):
            self.rows[t][k] = out[j]
            self.acc[t][k] = acc[j] if ada[j] else np.float32(0)

    def state(self, li: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As :meth:`RowStore.state`: (keys uint64 sorted, rows float32 (M, dim), acc float32 (M,))."""
        keys = np.array(sorted(self.rows[li]), np.uint64)
        dim = int(self.tdim[li])
        rows = np.array([self.rows[li][int(k)] for k in keys], np.float32).reshape(-1, dim)
        acc = np.array([self.acc[li][int(k)] for k in keys], np.float32)
        return keys, rows, acc


def numpy_find(store: RowStore, li, c: np.ndarray) -> np.ndarray:
    """:meth:`RowStore._find <embnic.client_lib.rowstore.RowStore._find>` in numpy (moved here from
    ``client_lib/rowstore.py``: the C search's oracle): the arena slot int64 (N,) of each composite key
    ``c`` of table ``li`` (int, or int64 (N,)), -1 where the store holds no row; one
    ``np.searchsorted`` over the main index and one over the delta index, a run of composites shared
    by two tables walked for the row of ``li``."""
    slot = np.full(c.size, -1, np.int64)
    for ix, sl, tl in ((store._ck, store._cs, store._ct), (store._dck, store._dcs, store._dct)):
        m = ix.size
        if m == 0 or c.size == 0:
            continue
        pos = np.searchsorted(ix, c)
        np.minimum(pos, m - 1, out=pos)
        hit = ix[pos] == c
        s = sl[pos]
        if store.multi:
            same = tl[pos] == li
            other = hit & ~same
            hit &= same
            if other.any():  # a composite shared with a row of another table: walk its run
                w = np.flatnonzero(other)
                p, cw = pos[w], c[w]
                lw = li[w] if np.ndim(li) else np.full(w.size, li, np.int64)
                while w.size:
                    p = p + 1
                    go = p < m
                    w, p, cw, lw = w[go], p[go], cw[go], lw[go]
                    go = ix[p] == cw
                    w, p, cw, lw = w[go], p[go], cw[go], lw[go]
                    ok = tl[p] == lw
                    s[w[ok]] = sl[p[ok]]
                    hit[w[ok]] = True
                    w, p, cw, lw = w[~ok], p[~ok], cw[~ok], lw[~ok]
        np.copyto(slot, s, where=hit)
    return slot
