"""The row store: where the parameter-server shards and the in-process reference keep the rows of
their embedding tables (:class:`RowStore`, one arena and one index for several tables, and
:class:`TableShard`, the interface of one table's rows); every value it computes comes from
:mod:`embnic.client_lib.table_numerics`, so rows are bit-identical wherever they are held.
Tables are collision-free and keyed by the raw uint64 id; rows are materialised on their first
update (layout: :class:`RowStore`). Updates run in C (``client_lib/csrc/store.c``,
``embnic_store_apply``: the optimizer step and new rows), bit-identical to the numpy oracle
``tests/client_lib/numpy_rowstore.py``.
"""
from __future__ import annotations

import ctypes

import numpy as np

from .config import TableConfig
from .splitmix import splitmix64, u64 as _u64
from .table_numerics import CStore, exclusive_cumsum, initial_rows, store_lib

#: added to a table's id before hashing it into the table's key salt (:attr:`RowStore.tsalt`)
_SALT_TAG = 0x7AB1E5A170000000


def _ptr(a: np.ndarray) -> int:
    """The address of ``a``'s first element (C-contiguous arrays only)."""
    return a.__array_interface__["data"][0]


class RowStore:
    """The rows of one or several tables in **one** arena with **one** index, so that a message
    carrying keys of many tables costs one search, one gather and one optimizer step whatever
    the number of tables.

    Layout (``T`` tables, by a local index ``li`` in table id order, :meth:`local_index`):

    * **index**: a composite key per row, ``c = key + salt[li]`` (mod 2^64): sorted ``uint64``
      arrays with each row's arena slot — a main index (``M`` entries; every
      :data:`SAMPLE_STEP`-th key copied into a small sample the C searches start in) and a small
      delta index of recently added rows (with spare capacity: C inserts new rows into it),
      folded into the main one when it holds more than max(MERGE_MIN, M/8)
      entries (one O(M) pass per M/8 new rows); a search is one C call over the keys of every
      table at once (:meth:`_find`). Within a table ``c`` is a bijection of the key, so a table's
      keys never collide; a store of one table has salt 0 (``c`` is the key). Rows of two tables
      may share a composite (``k1 - k2 == salt2 - salt1``: for 64-bit random salts a chance of
      2^-64 per pair of rows); each index entry's table (``_ct``, beside its key, so reading it
      costs no cache miss) tells them apart and a search walks such a run (a loop whose rounds
      are the longest run in the batch, in practice none).
    * **arena**: materialised rows, float32, append-only (doubled when full; C appends new rows
      into the spare slots and asks for a grow when they run out): when every table
      of the store has the same ``dim`` D a ``(capacity, D)`` array (slot ``s`` is row ``s``),
      else a flat array with each slot's element offset (``_off``); one float32 Adagrad
      accumulator per slot. Rows never move while serving (only :meth:`load_state` compacts).

    Rows are materialised on their first update; a lookup of a row never updated computes its
    initial value (:func:`~embnic.client_lib.table_numerics.init_rows`) and stores nothing.

    The fast path does not validate (callers check keys, gradients and table ids first). Every
    array C uses is described by one ``struct embnic_store`` (:attr:`cstore`, a
    :class:`~embnic.client_lib.table_numerics.CStore`), which this class keeps current: a native
    reader (the shard's answer path) points at it and reads the rows in place. Arrays are
    replaced, never resized in place (and :attr:`cstore` pointed at the new ones); the counts
    ``n``, ``e``, ``d`` and the rows in the spare capacity move with every update.

    Args:
        tables: the tables (distinct ids).
        seed: the cluster seed.
        capacity: initial arena capacity (rows); grows by doubling.

    Raises:
        ValueError: no table, or a table id twice.
    """

    #: the delta index is merged into the main one when it holds more than max(MERGE_MIN, M/8) rows
    MERGE_MIN = 4096
    #: every SAMPLE_STEP-th key of the main index is in the sample, the first level of the C searches
    SAMPLE_STEP = 16

    def __init__(self, tables: list[TableConfig], seed: int, capacity: int = 1024):
        tables = sorted(tables, key=lambda t: t.id)
        ids = [t.id for t in tables]
        if not ids or len(set(ids)) != len(ids):
            raise ValueError(f"a row store needs distinct tables, got ids {ids}")
        self.seed = int(seed)
        self.tables = tables  #: by local index
        self.table_ids = np.array(ids, np.int64)  #: sorted
        self.multi = len(ids) > 1
        self.tdim = np.array([t.dim for t in tables], np.int64)
        self.tadagrad = np.array([t.optimizer == "adagrad" for t in tables], bool)
        self.tlr = np.array([np.float32(t.lr) for t in tables], np.float32)
        self.teps = np.array([np.float32(t.eps) for t in tables], np.float32)
        self.tscale = np.array([np.float32(t.init_scale) for t in tables], np.float32)
        #: init_rows' per-table hash: splitmix64(seed ^ splitmix64(table_id))
        self.tinit = splitmix64(_u64(self.seed)[0] ^ splitmix64(self.table_ids.astype(np.uint64)))
        self._tada = self.tadagrad.astype(np.uint8)
        self.tsalt = (splitmix64(self.table_ids.astype(np.uint64) + np.uint64(_SALT_TAG)) if self.multi
                      else np.zeros(1, np.uint64))
        self.trows = np.zeros(len(ids), np.int64)  #: materialised rows per table
        self.uniform = bool((self.tdim == self.tdim[0]).all())
        self.D = int(self.tdim[0]) if self.uniform else 0  #: the one dim of every table (0: several)
        #: struct embnic_store over this store's arrays (what C reads and updates; kept current)
        self.cstore = CStore()
        self._cp = ctypes.addressof(self.cstore)
        self._lib = store_lib()
        self._work = np.empty(0, np.int64)  # embnic_store_apply's scratch, grown to the largest batch
        self._need = np.zeros(3, np.int64)
        self._reset(max(1, int(capacity)))

    # -- layout -------------------------------------------------------------------------------

    def _reset(self, cap: int) -> None:
        self._ck = np.empty(0, np.uint64)  # main index: sorted composite keys (M,)
        self._cs = np.empty(0, np.int64)  # arena slot of each (M,)
        self._ct = np.empty(0, np.uint16)  # its table (local index; only with several tables) (M,)
        self._sampled = None  # the main index the sample was taken of
        # delta index: its first d entries (cstore.d) in use, the rest spare
        self._dk = np.empty(max(64, cap), np.uint64)
        self._ds = np.empty(self._dk.size, np.int64)
        self._dt = np.empty(self._dk.size, np.uint16)
        self.cstore.d = 0
        if self.uniform:
            self._rows = np.empty((cap, self.D), np.float32)
            self._vals = self._rows.reshape(-1)
            self._off = np.empty(0, np.int64)
        else:
            self._vals = np.empty(cap * int(self.tdim.max()), np.float32)
            self._rows = None
            self._off = np.empty(cap, np.int64)
        self._acc = np.zeros(cap if self.tadagrad.any() else 0, np.float32)
        self._cap = cap
        self._n = 0  # slots in use
        self._e = 0  # arena elements in use (flat layout)
        self.trows[:] = 0
        self._replaced()

    # the counts C moves: slots and arena elements in use, delta index entries in use
    _n = property(lambda self: self.cstore.n, lambda self, v: setattr(self.cstore, "n", v))
    _e = property(lambda self: self.cstore.e, lambda self, v: setattr(self.cstore, "e", v))
    _dck = property(lambda self: self._dk[:self.cstore.d])
    _dcs = property(lambda self: self._ds[:self.cstore.d])
    _dct = property(lambda self: self._dt[:self.cstore.d])

    def _replaced(self) -> None:
        """An array was replaced: point :attr:`cstore` at the arrays as they are now (the main
        index's sample taken again if it changed)."""
        s = self.cstore
        if self._sampled is not self._ck:  # the main index changed (a merge): sample it again
            self._sample = np.ascontiguousarray(self._ck[::self.SAMPLE_STEP])
            self._sampled = self._ck
        ptr = _ptr
        s.p_ck, s.p_cs, s.p_ct, s.m = ptr(self._ck), ptr(self._cs), ptr(self._ct) if self.multi else None, self._ck.size
        s.p_sample, s.nsample, s.step = ptr(self._sample), self._sample.size, self.SAMPLE_STEP
        s.p_dck, s.p_dcs, s.p_dct, s.dcap = (ptr(self._dk), ptr(self._ds), ptr(self._dt) if self.multi else None,
                                            self._dk.size)
        s.p_vals, s.p_off, s.dim = ptr(self._vals), None if self.uniform else ptr(self._off), self.D
        s.cap, s.ecap = self._cap, self._vals.size
        s.p_acc = ptr(self._acc) if self._acc.size else None
        s.p_tsalt, s.p_tinit, s.p_tscale, s.ntables = (ptr(self.tsalt), ptr(self.tinit), ptr(self.tscale),
                                                       self.table_ids.size)
        s.p_tdim, s.p_tada, s.p_tlr, s.p_teps = ptr(self.tdim), ptr(self._tada), ptr(self.tlr), ptr(self.teps)
        s.p_trows = ptr(self.trows)

    def __len__(self) -> int:
        """Materialised rows of every table."""
        return self._n

    def __contains__(self, table_id: int) -> bool:
        i = int(np.searchsorted(self.table_ids, table_id))
        return i < self.table_ids.size and int(self.table_ids[i]) == int(table_id)

    @property
    def nbytes(self) -> int:
        """Bytes held by the arena, the accumulators and the index (with their spare capacity)."""
        return sum(a.nbytes for a in (self._vals, self._off, self._acc, self._ck, self._cs, self._ct, self._sample,
                                      self._dk, self._ds, self._dt))

    def local_index(self, table_ids) -> np.ndarray:
        """Local index int64 of each table id (array-like, or an int → int64 0-d).

        Raises:
            KeyError: a table this store does not hold.
        """
        t = np.asarray(table_ids, np.int64)
        li = np.searchsorted(self.table_ids, t)
        li = np.minimum(li, self.table_ids.size - 1)
        if not np.array_equal(self.table_ids[li], t):
            bad = np.asarray(t).reshape(-1)[np.asarray(self.table_ids[li] != t).reshape(-1)]
            raise KeyError(f"tables {bad.tolist()} are not in this row store (it holds {self.table_ids.tolist()})")
        return li

    def _grow(self, slots: int, elems: int = 0, delta: int = 0) -> None:
        """Capacity for ``slots`` slots, ``elems`` arena elements (flat layout) and ``delta`` delta
        index entries in all: each doubled until it fits (what is in use copied)."""
        cap = self._cap
        ecap = self._vals.size
        if delta > self._dk.size:
            dcap = self._dk.size
            while dcap < delta:
                dcap *= 2
            d = self.cstore.d
            for name in ("_dk", "_ds", "_dt"):
                old = getattr(self, name)
                new = np.empty(dcap, old.dtype)
                new[:d] = old[:d]
                setattr(self, name, new)
            if slots <= cap and (self.uniform or elems <= ecap):
                self._replaced()
                return
        if slots <= cap and (self.uniform or elems <= ecap):
            return
        while cap < slots:
            cap *= 2
        n = self._n
        if self.uniform:
            if cap != self._cap:
                rows = np.empty((cap, self.D), np.float32)
                rows[:n] = self._rows[:n]
                self._rows, self._vals = rows, rows.reshape(-1)
        else:
            if elems > ecap:
                while ecap < elems:
                    ecap *= 2
                vals = np.empty(ecap, np.float32)
                vals[:self._e] = self._vals[:self._e]
                self._vals = vals
            if cap != self._cap:
                off = np.empty(cap, np.int64)
                off[:n] = self._off[:n]
                self._off = off
        if cap != self._cap:
            if self._acc.size:
                acc = np.zeros(cap, np.float32)
                acc[:n] = self._acc[:n]
                self._acc = acc
            self._cap = cap
        self._replaced()

    # -- search -------------------------------------------------------------------------------

    def composite(self, li, keys: np.ndarray) -> np.ndarray:
        """The index's composite keys uint64 (N,) of ``keys`` of tables ``li`` (int or int64 (N,))."""
        if not self.multi:
            return keys
        return keys + self.tsalt[li]

    def _find(self, li, c: np.ndarray) -> np.ndarray:
        """Arena slot int64 (N,) of each composite key ``c`` (uint64 (N,)) of table ``li`` (a local
        index, or int64 (N,) per key); -1 where no row. In C (``embnic_store_find_many``: the keys
        sorted a window at a time, the index walked in its order through its sample); the numpy
        search it was written after is the oracle ``tests/client_lib/numpy_rowstore.py``."""
        c = np.ascontiguousarray(c, np.uint64)
        n = c.size
        out = np.empty(n, np.int64)
        if n == 0:
            return out
        words = 5 * min(n, 4096) + 1  # EMBNIC_STORE_FIND_WORK(min(n, EMBNIC_STORE_WINDOW)) bytes, in int64 words
        if self._work.size < words:
            self._work = np.empty(max(words, 2 * self._work.size), np.int64)
        if np.ndim(li):
            lia = np.ascontiguousarray(li, np.int64)
            lip, li0 = _ptr(lia), 0
        else:
            lip, li0 = None, int(li)
        if self._lib.embnic_store_find_many(self._cp, _ptr(c), lip, li0, n, _ptr(out), _ptr(self._work)) != 0:
            raise ValueError(f"row store search: tables {np.unique(np.asarray(li)).tolist()} out of range")
        return out

    def _init(self, li, keys: np.ndarray) -> np.ndarray:
        """Initial rows of ``keys`` of tables ``li`` (int, or int64 (N,) when the dims agree):
        float32 (N, dim), :func:`~embnic.client_lib.table_numerics.init_rows` element for element."""
        dim = int(self.tdim[li]) if np.ndim(li) == 0 else self.D
        li = np.atleast_1d(li)
        return initial_rows(keys, self.tinit[li], self.tscale[li], self.tdim[li]).reshape(-1, dim)

    def _init_flat(self, li: np.ndarray, keys: np.ndarray, dims: np.ndarray) -> np.ndarray:
        """Initial rows of ``keys`` of tables ``li`` of several dims, flat float32 (Σ dims,)."""
        return initial_rows(keys, self.tinit[li], self.tscale[li], dims)

    def _elements(self, slot: np.ndarray, dims: np.ndarray) -> np.ndarray:
        """Flat-layout arena element indices int64 (Σ dims,) of the rows in ``slot`` (N,)."""
        return np.repeat(self._off[slot] - exclusive_cumsum(dims), dims) + np.arange(int(dims.sum()))

    # -- lookup -------------------------------------------------------------------------------

    def lookup(self, li, keys: np.ndarray) -> np.ndarray:
        """Current rows of ``keys``.

        Args:
            li: the keys' table: a local index (int: every key of one table), or int64 (N,)
                (several tables: :meth:`local_index` of each key's table).
            keys: uint64 (N,), any order, duplicates allowed.

        Returns:
            float32, a new array: (N, dim) for one table or tables of one dim; else flat
            (Σ dim,), row after row. Master values (round with
            :func:`~embnic.client_lib.table_numerics.wire_round` for the wire).
        """
        keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
        one = np.ndim(li) == 0
        slot = self._find(li, self.composite(li, keys))
        found = slot >= 0
        if self.uniform or one:
            dim = int(self.tdim[li]) if one else self.D
            out = np.empty((keys.size, dim), np.float32)
            allfound = bool(found.all())
            if self.uniform:
                if allfound:
                    np.take(self._rows, slot, axis=0, out=out)
                    return out
                out[found] = self._rows[slot[found]]
            elif allfound:
                out.reshape(-1)[:] = self._vals[self._elements(slot, np.full(keys.size, dim, np.int64))]
                return out
            else:
                f = np.flatnonzero(found)
                out[f] = self._vals[self._elements(slot[f], np.full(f.size, dim, np.int64))].reshape(-1, dim)
            miss = ~found
            out[miss] = self._init(li if one else li[miss], keys[miss])
            return out
        dims = self.tdim[li]
        out = np.empty(int(dims.sum()), np.float32)
        ef = np.repeat(found, dims)
        out[ef] = self._vals[self._elements(slot[found], dims[found])]
        if not found.all():
            miss = ~found
            out[~ef] = self._init_flat(li[miss], keys[miss], dims[miss])
        return out

    def lookup_segments(self, table_ids: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Rows of the keys of several tables in one search and one gather (a protocol-v2
        message's directory, or the concatenated directories of several messages).

        Args:
            table_ids: int (S,), the table of each segment; counts: int (S,) keys per segment.
            keys: uint64 (Σ counts,), segment after segment.

        Returns:
            float32 (Σ counts · dim of its table,), row after row in key order (for tables of
            one dim a view of an (N, dim) array).

        Raises:
            KeyError: a table this store does not hold.
        """
        li = np.repeat(self.local_index(table_ids), counts)
        return self.lookup(li, keys).reshape(-1)

    # -- updates ------------------------------------------------------------------------------

    def _append(self, rows: np.ndarray, dims: np.ndarray, acc) -> np.ndarray:
        """Append rows of ``dims`` (int64 (k,)) — float32 (k, D) when :attr:`uniform`, else flat
        (Σ dims,) — with accumulators ``acc`` to the arena; returns their slots int64 (k,)."""
        n, k = self._n, dims.size
        if self.uniform:
            self._grow(n + k)
            self._rows[n:n + k] = rows
        else:
            e = int(dims.sum())
            self._grow(n + k, self._e + e)
            self._off[n:n + k] = self._e + exclusive_cumsum(dims)
            self._vals[self._e:self._e + e] = rows
            self._e += e
        if self._acc.size:
            self._acc[n:n + k] = acc
        self._n += k
        return np.arange(n, n + k, dtype=np.int64)

    def _merge(self) -> None:
        """Fold the delta index into the main one: one O(M + D) pass per M/8 new rows."""
        if self.cstore.d == 0:
            return
        self._insert(self._dck, self._dcs, self._dct)
        self.cstore.d = 0
        self._replaced()

    def _insert(self, c: np.ndarray, slots: np.ndarray, tl: np.ndarray) -> None:
        """Insert entries (composites ``c`` sorted, their slots and tables) into the main index."""
        ins = np.searchsorted(self._ck, c)
        self._ck = np.insert(self._ck, ins, c)
        self._cs = np.insert(self._cs, ins, slots)
        if self.multi:
            self._ct = np.insert(self._ct, ins, tl)

    def apply(self, li, keys: np.ndarray, grads: np.ndarray) -> None:
        """Apply one gradient per key with each table's optimizer (SGD or row-wise Adagrad), key
        after key in the order given, in one C call (``embnic_store_apply``): a (table, key) that
        comes more than once — the updates of several messages, one after the other — gets its
        gradients in that order, so the rows are those of the messages applied one after the
        other (the optimizers are row-wise). Rows never updated are created first (their
        initial value, accumulator 0) in the arena's spare capacity, grown (doubled) only when
        it runs out; the delta index is folded into the main one past max(MERGE_MIN, M/8).

        Args:
            li: the keys' tables (as :meth:`lookup`).
            keys: uint64 (N,).
            grads: float32, row ``i`` the gradient of ``keys[i]``: (N, dim), or flat (Σ dim,)
                row after row; rows that pass :func:`~embnic.client_lib.table_numerics.gradient_rows_ok`
                (not checked).

        Raises:
            ValueError: a table index out of range, or gradients that are not one row per key.
        """
        keys = np.ascontiguousarray(keys, dtype=np.uint64).reshape(-1)
        n = keys.size
        if n == 0:
            return
        g = np.ascontiguousarray(grads, dtype=np.float32).reshape(-1)
        if np.ndim(li):
            lia = np.ascontiguousarray(li, np.int64)
            lip, li0 = _ptr(lia), 0
        else:
            lip, li0 = None, int(li)
        words = 6 * n + 1  # EMBNIC_STORE_APPLY_WORK(n) = 44 n + 4 bytes, in int64 words
        if self._work.size < words:
            self._work = np.empty(max(words, 2 * self._work.size), np.int64)
        call = self._lib.embnic_store_apply
        args = (self._cp, lip, li0, _ptr(keys), n, _ptr(g), g.size, _ptr(self._work), _ptr(self._need))
        r = call(*args)
        while r == 1:  # the spare capacity ran out: grow, then again (nothing was applied)
            self._grow(*self._need.tolist())
            r = call(*args)
        if r != 0:
            raise ValueError(f"row store apply: {n} keys with {g.size} gradient values do not fit tables "
                             f"{np.unique(np.asarray(li)).tolist()} of dims {self.tdim.tolist()}")
        if self.cstore.d > max(self.MERGE_MIN, self._ck.size >> 3):
            self._merge()

    def apply_segments(self, table_ids: np.ndarray, counts: np.ndarray, keys: np.ndarray, grads: np.ndarray) -> None:
        """:meth:`apply` for segments of several tables (directories, as
        :meth:`lookup_segments`): ``grads`` float32 flat (Σ counts · dim,), row after row.

        Raises:
            KeyError: a table this store does not hold.
        """
        self.apply(np.repeat(self.local_index(table_ids), counts), keys, grads)

    # -- whole tables ---------------------------------------------------------------------------

    def _table_slots(self, li: int) -> tuple[np.ndarray, np.ndarray]:
        """(keys uint64 sorted, slots int64) of table ``li``'s materialised rows."""
        self._merge()
        ck, cs = self._ck, self._cs
        if self.multi:
            sel = self._ct == li
            ck, cs = ck[sel], cs[sel]
            keys = ck - self.tsalt[li]
            order = np.argsort(keys, kind="stable")
            return keys[order], cs[order]
        return ck.copy(), cs.copy()

    def state(self, li: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Table ``li``'s materialised rows: (keys uint64 (M,) sorted, rows float32 (M, dim),
        acc float32 (M,), zeros for SGD) — copies."""
        keys, slots = self._table_slots(li)
        dim = int(self.tdim[li])
        if self.uniform:
            rows = self._rows[slots]
        else:
            rows = self._vals[self._elements(slots, np.full(slots.size, dim, np.int64))].reshape(-1, dim)
        acc = self._acc[slots] if self.tadagrad[li] else np.zeros(keys.size, dtype=np.float32)
        return keys, rows, acc

    def _drop(self, li: int) -> None:
        """Forget table ``li``'s rows (compacting the arena: rows of other tables move)."""
        if not self.multi:
            self._reset(64)
            return
        self._merge()
        n = self._n
        tli = np.empty(n, np.uint16)  # each slot's table
        tli[self._cs] = self._ct
        keep = tli != li
        if keep.all():
            return
        new_of = np.cumsum(keep) - 1
        kept = np.flatnonzero(keep)
        if self.uniform:
            self._rows[:kept.size] = self._rows[kept]
        else:
            dims = self.tdim[tli[kept]]
            el = self._elements(kept, dims)
            self._vals[:el.size] = self._vals[el]
            self._off[:kept.size] = exclusive_cumsum(dims)
            self._e = int(el.size)
        if self._acc.size:
            self._acc[:kept.size] = self._acc[kept]
        ent = self._ct != li
        self._ck = self._ck[ent]
        self._cs = new_of[self._cs[ent]]
        self._ct = self._ct[ent]
        self._n = int(kept.size)
        self.trows[li] = 0
        self._replaced()

    def load_state(self, li: int, keys: np.ndarray, rows: np.ndarray, acc: np.ndarray) -> None:
        """Replace every materialised row of table ``li`` with ``(keys, rows, acc)`` (what
        :meth:`state` returned; a checkpoint or an imported table).

        Raises:
            ValueError: shapes that do not fit the table, or keys not strictly increasing.
        """
        t = self.tables[li]
        dim = int(self.tdim[li])
        k = np.asarray(keys, dtype=np.uint64).reshape(-1)
        r = np.asarray(rows)
        a = np.asarray(acc).reshape(-1)
        if r.shape != (k.size, dim) or a.shape != (k.size,):
            raise ValueError(f"table {t.id}: state shapes keys {k.shape}, rows {r.shape}, acc {a.shape} "
                             f"do not fit dim {dim}")
        if k.size > 1 and not bool(np.all(k[1:] > k[:-1])):
            raise ValueError(f"table {t.id}: state keys are not strictly increasing")
        self._drop(li)
        if k.size == 0:
            return
        slots = self._append(r if self.uniform else np.asarray(r, np.float32).reshape(-1),
                             np.full(k.size, dim, np.int64), a if self.tadagrad[li] else 0)
        self.trows[li] = k.size
        c = self.composite(li, k)
        order = np.argsort(c, kind="stable")
        self._insert(c[order], slots[order], np.full(k.size, li, np.uint16))
        self._replaced()


class TableShard:
    """The rows of one table that one process holds (all rows, or one shard's): a view of a
    :class:`RowStore`, its own or one shared by several tables. The interface every holder of a
    table's rows offers (the disk tier too); it does not validate: call
    :func:`~embnic.client_lib.table_numerics.validate_update` first.

    Args:
        table: the table's config (``rows``, ``dim``, ``optimizer``, ``lr``, ``eps``,
            ``init_scale``).
        seed: the cluster seed.
        capacity: initial arena capacity (rows) of its own store; grows by doubling.
        store: a shared :class:`RowStore` holding this table (None: one of its own).

    Raises:
        KeyError: ``store`` does not hold the table.
    """

    def __init__(self, table: TableConfig, seed: int, capacity: int = 1024, *, store: RowStore | None = None):
        self.table = table
        self.seed = int(seed)
        self.dim = int(table.dim)
        self.adagrad = table.optimizer == "adagrad"
        self.store = store if store is not None else RowStore([table], seed, capacity)
        self._li = int(self.store.local_index(table.id))

    def __len__(self) -> int:
        """Materialised (ever updated) rows."""
        return int(self.store.trows[self._li])

    @property
    def nbytes(self) -> int:
        """Bytes held by the arena and the index (of its own store; a shared store's bytes
        per row times this table's rows)."""
        st = self.store
        if not st.multi:
            return st.nbytes
        return st.nbytes * len(self) // max(1, len(st))

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Current rows of ``keys`` uint64 (N,) (any order, duplicates allowed): float32 (N, dim),
        a new array (:meth:`RowStore.lookup`)."""
        return self.store.lookup(self._li, keys)

    def apply(self, keys_unique: np.ndarray, grads: np.ndarray) -> None:
        """Apply gradients float32 (N, dim) to ``keys_unique`` uint64 (N,) (no duplicates, not
        checked) with the table's optimizer (:meth:`RowStore.apply`)."""
        self.store.apply(self._li, keys_unique, grads)

    def apply_segments(self, keys: np.ndarray, g: np.ndarray, offs: np.ndarray) -> None:
        """Apply the updates of several messages in their order.

        Args:
            keys: uint64 (K,), each segment ``keys[offs[j]:offs[j+1]]`` free of duplicates.
            g: float32 (K, dim), the gradients in the same order.
            offs: int64 (M+1,), segment bounds (``offs[0] == 0``, ``offs[-1] == K``; empty
                segments allowed).

        As one message after the other: :meth:`RowStore.apply` takes the keys in their order (the
        bounds are the interface's: the disk tier's store uses them).
        """
        self.store.apply(self._li, keys, g)

    def state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Materialised rows, copies: (keys uint64 (M,) sorted, rows float32 (M, dim), acc float32
        (M,), zeros for SGD)."""
        return self.store.state(self._li)

    def load_state(self, keys: np.ndarray, rows: np.ndarray, acc: np.ndarray) -> None:
        """Replace every materialised row with ``(keys, rows, acc)``, as :meth:`state` returns
        them (:meth:`RowStore.load_state`, which says what it raises)."""
        self.store.load_state(self._li, keys, rows, acc)


def shared_tables(tables: list[TableConfig], seed: int, capacity: int = 1024) -> tuple[RowStore, dict[int, TableShard]]:
    """One :class:`RowStore` for ``tables`` and a :class:`TableShard` view of each:
    ``(store, {table_id: view})`` (a shard's rows: one gather per message, whatever its tables)."""
    store = RowStore(tables, seed, capacity)
    return store, {t.id: TableShard(t, seed, store=store) for t in tables}
