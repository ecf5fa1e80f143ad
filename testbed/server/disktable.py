"""A disk table: one table's rows in RocksDB behind a cache of hot rows (``store = "disk"``).

:class:`DiskTable` keeps its rows in an embedded RocksDB (:mod:`.diskstore`) and only its hot rows
in memory (:mod:`.rowcache`), with :class:`~embnic.client_lib.rowstore.TableShard`'s interface;
every row value comes from the same code (``init_rows``, ``optimizer_step``) on the same float32
values, so its rows are bit-identical to the in-memory store's. A table whose store refuses a
write, or whose file system is short of ``StoreEnv.reserve_bytes``, is **full**:
:meth:`DiskTable.writable` says no (updates are refused ``STORE_FULL``), lookups are still
answered, rows an update already taken could not write are kept in memory (:attr:`DiskTable.pending`)
and written once the store takes them again (tried every :data:`RETRY_S`). docs/server.md,
"Disk tier".
"""
from __future__ import annotations

import collections
import errno
import logging
import os
import time
from pathlib import Path
from typing import Iterator

import numpy as np

from embnic.client_lib.config import TableConfig
from embnic.client_lib.table_numerics import init_rows, is_unique, optimizer_step

from .diskstore import StoreEnv, StoreError, StoreFullError, TableStore, read_meta
from .rowcache import PendingRows, RowCache, put_rows

log = logging.getLogger("embnic.server")

#: a full table tries its store again at most this often (seconds; :meth:`DiskTable.writable`)
RETRY_S = 0.5


class DiskTable:
    """One table's rows in RocksDB behind a cache of ``cache_rows`` hot rows (module docstring).

    Args:
        table: the table's config.
        seed: the cluster seed (initial rows, :func:`~embnic.client_lib.table_numerics.init_rows`).
        env: the shard process's :class:`~embnic.testbed.server.diskstore.StoreEnv`; the store
            is ``env.root / f"t{table.id}"``, created empty.
        cache_rows: rows the cache holds at most (its capacity is the largest multiple of the
            ways not above it).
        policy: the cache's replacement policy (:data:`~embnic.testbed.server.rowcache.POLICIES`;
            the default is the one the shard uses).

    Raises:
        StoreError: the store cannot be opened. ValueError: an unknown ``policy``.
    """

    def __init__(self, table: TableConfig, seed: int, env: StoreEnv, cache_rows: int, policy: str = "lfu-aged"):
        self.table = table
        self.seed = int(seed)
        self.dim = int(table.dim)
        self.adagrad = table.optimizer == "adagrad"
        self._lr = np.float32(table.lr)
        self._eps = np.float32(table.eps)
        self.env = env
        self._vw = self.dim + (1 if self.adagrad else 0)  # float32 values per stored row
        self.cache = RowCache(self.dim, self.adagrad, cache_rows, table.id, policy)
        self.capacity = self.cache.capacity
        self._n = 0  # materialised rows (in the store or dirty in the cache)
        self.stats = collections.Counter({k: 0 for k in ("hits", "misses", "store_reads", "store_found",
                                                          "evictions", "writebacks", "store_writes",
                                                          "write_through", "store_write_errors",
                                                          "full_periods")})
        # a full store (module docstring): why (None: writes go through), when to try
        # again, and the rows an update taken before could not write
        self._full: str | None = None
        self._retry_at = 0.0
        self.pending = PendingRows(self._vw)
        self.store = TableStore(env, table, self._vw, self.stats)
        self.path = self.store.path

    def close(self) -> None:
        """Close the store (:meth:`TableStore.close <embnic.testbed.server.diskstore.TableStore.close>`:
        unflushed rows are dropped, the shard's log holds their updates). Idempotent."""
        self.store.close()

    def __len__(self) -> int:
        """Materialised (ever updated) rows."""
        return self._n

    def _fetch(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Rows, accumulators, found-mask and pending-mask of ``keys`` (unique uint64 (n,)) from the
        store — the rows kept in memory while it was full (``pending``) first; ids in neither get
        their initial row and accumulator 0."""
        n = keys.size
        found, v = self.store.get(keys)
        nf = v.shape[0]
        if nf == n:  # every one stored (the common case once a table is trained): no scatter
            rows = v[:, :self.dim].copy()  # v is the store's read-only buffer
            acc = v[:, self.dim].copy() if self.adagrad else np.zeros(n, np.float32)
        else:
            rows = np.empty((n, self.dim), np.float32)
            acc = np.zeros(n, np.float32)
            if nf:
                rows[found] = v[:, :self.dim]
                if self.adagrad:
                    acc[found] = v[:, self.dim]
            miss = ~found
            rows[miss] = init_rows(self.seed, self.table.id, keys[miss], self.dim, self.table.init_scale)
        pend, pv = self.pending.find(keys)
        if pv.size:
            rows[pend] = pv[:, :self.dim]
            if self.adagrad:
                acc[pend] = pv[:, self.dim]
            found |= pend
        return rows, acc, found, pend

    def _pack(self, rows: np.ndarray, acc: np.ndarray | None) -> np.ndarray:
        """Rows (n, dim) and accumulators (n,) as stored: float32 LE (n, dim [+ 1])."""
        v = np.empty((rows.shape[0], self._vw), "<f4")
        v[:, :self.dim] = rows
        if self.adagrad:
            v[:, self.dim] = acc
        return v

    # -- a full store (module docstring) ----------------------------------------------------------

    def _enter_full(self, why: str) -> None:
        if self._full is None:
            self.stats["full_periods"] += 1
            log.warning("table %d: its row store takes no writes (%s): updates of it are refused (STORE_FULL) "
                        "until there is room again; lookups are still answered", self.table.id, why)
        self._full = why
        self._retry_at = time.monotonic() + RETRY_S

    def writable(self) -> bool:
        """Whether an update of this table can be taken now: its store takes writes and its file
        system has at least :attr:`StoreEnv.reserve_bytes` free. A full table tries its store again
        — the rows it keeps in memory (``pending``) and its meta record — at most every
        :data:`RETRY_S` s, once the file system has room: True again when the store took them."""
        if self._full is None:
            if self.env.space_ok():
                return True
            self._enter_full(f"less than {self.env.reserve_bytes >> 20} MiB free on the file system of "
                             f"{self.env.root}")
            return False
        now = time.monotonic()
        if now < self._retry_at or not self.env.space_ok():
            return False
        self._retry_at = now + RETRY_S
        n = len(self.pending)
        try:
            if n:
                self.store.put(self.pending.keys, self.pending.values)
                self.pending.clear()
            self.store.write_meta(self._n)
        except StoreFullError as e:
            self._full = str(e)
            return False
        log.info("table %d: its row store takes writes again (%d rows kept in memory meanwhile written)",
                 self.table.id, n)
        self._full = None
        return True

    def _store_rows(self, keys: np.ndarray, rows: np.ndarray, acc: np.ndarray | None) -> None:
        """Write rows an update has changed past the cache: to the store, or — it is full — into
        memory until it takes them (:attr:`pending`). Never raises for a full store: an update the
        shard took is never half applied."""
        if self._full is None:
            try:
                self.store.put(keys, self._pack(rows, acc))
                return
            except StoreFullError as e:
                self._enter_full(str(e))
        self.pending.keep(keys, self._pack(rows, acc))

    def flush(self) -> int:
        """Write every dirty cached row to the store (they stay cached, clean) and the meta record.
        Returns the rows written.

        Raises:
            StoreFullError: the store takes no writes now (the rows stay dirty in the cache).
        """
        if self._full is not None and not self.writable():
            raise StoreFullError(errno.ENOSPC, f"{self.path}: the row store takes no writes now ({self._full})")
        c = self.cache
        d = c.dirty_slots()
        try:
            self.store.put(c.keys[d], self._pack(c.rows[d], c.acc[d] if self.adagrad else None))
        except StoreFullError as e:
            self._enter_full(str(e))
            raise
        c.dirty[d] = False
        self.stats["writebacks"] += d.size
        self.store.write_meta(self._n)
        return int(d.size)

    # -- the cache ----------------------------------------------------------------------------

    def _resolve(self, keys: np.ndarray, unique: bool):
        """Cache slots of ``keys`` (uint64 (N,)), installing the misses (fetched from the store;
        dirty victims written back).

        Returns:
            (slot int64 (N,) — -1 where the key could not be cached —, and for the uncached keys
            ``(index into keys (U,), rows (U, dim), acc (U,), found (U,))``).
        """
        c = self.cache
        slot, _ = c.hits(keys)
        nh = int(np.count_nonzero(slot >= 0))
        self.stats["hits"] += nh
        none = (np.empty(0, np.int64), np.empty((0, self.dim), np.float32), np.empty(0, np.float32),
                np.empty(0, bool))
        if nh == keys.size:
            c.age(nh)
            return slot, none
        mi = np.flatnonzero(slot < 0)
        mk = keys[mi]
        # a lookup may repeat a key: fetch and install each once
        mk, inv = (mk, None) if unique else np.unique(mk, return_inverse=True)
        n = mk.size
        self.stats["misses"] += n
        rows, acc, found, pend = self._fetch(mk)
        while True:
            vs, ins = c.victims(mk, keep_dirty=self._full is not None)
            ev = c.valid[vs]
            dv = vs[ev & c.dirty[vs]]
            if dv.size:
                try:
                    v = self._pack(np.take(c.rows, dv, axis=0), c.acc[dv] if self.adagrad else None)
                    self.store.put(c.keys[dv], v)
                except StoreFullError as e:  # the cache is unchanged: choose again among clean rows
                    self._enter_full(str(e))
                    continue
                self.stats["writebacks"] += int(dv.size)
            break
        self.stats["evictions"] += int(np.count_nonzero(ev))
        pin = pend[ins]  # rows kept in memory while the store was full: the cache holds them now, dirty
        if pin.any():
            self.pending.forget(mk[ins][pin])
        c.install(vs, mk[ins], np.take(rows, ins, axis=0), acc[ins], found[ins], pin)
        mslot = np.full(n, -1, np.int64)
        mslot[ins] = vs
        slot[mi] = mslot if inv is None else mslot[inv]
        c.age(nh + n)
        if ins.size == n:
            return slot, none
        left = np.flatnonzero(mslot < 0)  # misses that found no free way: served straight through
        self.stats["write_through"] += int(left.size)
        if inv is None:
            return slot, (mi[left], rows[left], acc[left], found[left])
        # lookups: every position of an uncached key
        pos = np.flatnonzero(slot < 0)
        j = np.searchsorted(mk, keys[pos])
        return slot, (pos, rows[j], acc[j], found[j])

    # -- TableShard's interface -----------------------------------------------------------------

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Current rows of ``keys`` (uint64 (N,), any order, duplicates allowed) → float32 (N, dim),
        a new array; as :meth:`TableShard.lookup <embnic.client_lib.rowstore.TableShard.lookup>`."""
        keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
        out = np.empty((keys.size, self.dim), np.float32)
        if keys.size == 0:
            return out
        if self._full is not None:
            self.writable()  # space back? (at most every RETRY_S s)
        slot, (pos, rows, _, _) = self._resolve(keys, unique=False)
        if pos.size == 0:
            np.take(self.cache.rows, slot, axis=0, out=out)
            return out
        c = slot >= 0
        out[c] = self.cache.rows[slot[c]]
        out[pos] = rows
        return out

    def apply(self, keys_unique: np.ndarray, grads: np.ndarray) -> None:
        """One optimizer step per row (``keys_unique`` uint64 (N,) without duplicates, ``grads``
        float32 (N, dim)); as :meth:`TableShard.apply <embnic.client_lib.rowstore.TableShard.apply>`,
        bit for bit (the same :func:`~embnic.client_lib.table_numerics.optimizer_step`). Never
        refused for a full store: rows it cannot write are kept in memory (``pending``) — the shard
        asks :meth:`writable` before it takes an update."""
        keys = np.asarray(keys_unique, dtype=np.uint64).reshape(-1)
        if keys.size == 0:
            return
        g = np.ascontiguousarray(grads, dtype=np.float32).reshape(keys.size, self.dim)
        slot, (pos, rows, acc, found) = self._resolve(keys, unique=True)
        ch = self.cache
        if pos.size == 0:
            w = np.take(ch.rows, slot, axis=0)
            a = optimizer_step(w, ch.acc[slot] if self.adagrad else None, g, self._lr, self._eps)
            put_rows(ch.rows, slot, w)
            if self.adagrad:
                ch.acc[slot] = a
            ch.dirty[slot] = True
            self._n += int(np.count_nonzero(~ch.stored[slot]))
            ch.stored[slot] = True
            return
        c = slot >= 0
        cs = slot[c]
        w = np.empty((keys.size, self.dim), np.float32)
        w[c] = np.take(ch.rows, cs, axis=0)
        w[pos] = rows
        a0 = None
        if self.adagrad:
            a0 = np.empty(keys.size, np.float32)
            a0[c] = ch.acc[cs]
            a0[pos] = acc
        a = optimizer_step(w, a0, g, self._lr, self._eps)
        put_rows(ch.rows, cs, w[c])
        if self.adagrad:
            ch.acc[cs] = a[c]
        ch.dirty[cs] = True
        self._n += int(np.count_nonzero(~ch.stored[cs])) + int(np.count_nonzero(~found))
        ch.stored[cs] = True
        self._store_rows(keys[pos], w[pos], a[pos] if self.adagrad else None)

    def apply_segments(self, keys: np.ndarray, g: np.ndarray, offs: np.ndarray) -> None:
        """Apply the updates of several messages in their order (``keys`` uint64 (K,), each segment
        ``keys[offs[j]:offs[j+1]]`` free of duplicates; ``g`` float32 (K, dim); ``offs`` int64
        (M+1,)), as :meth:`TableShard.apply_segments
        <embnic.client_lib.rowstore.TableShard.apply_segments>`: one :meth:`apply` when no
        key repeats, else in passes — pass ``r`` applies every key's ``r``-th gradient, so a row
        gets its gradients one message after the other (row-wise optimizers)."""
        keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
        if keys.size == 0:
            return
        g = np.ascontiguousarray(g, dtype=np.float32).reshape(keys.size, self.dim)
        if offs.size <= 2 or is_unique(keys):
            self.apply(keys, g)
            return
        order = np.argsort(keys, kind="stable")
        sk = keys[order]
        start = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]])
        run = np.diff(np.r_[start, sk.size])
        rank = np.empty(keys.size, np.int64)
        rank[order] = np.arange(sk.size) - np.repeat(start, run)  # occurrence of its key, in arrival order
        for r in range(int(run.max())):
            sel = rank == r
            self.apply(keys[sel], g[sel])

    def iter_state(self, chunk_rows: int = 1 << 16) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The materialised rows in id order, ``chunk_rows`` at a time (after a :meth:`flush`):
        ``(keys uint64 (m,), rows float32 (m, dim), acc float32 (m,))`` per chunk — what
        ``embnic tables export`` streams. The table must not change while it is iterated."""
        self.flush()
        yield from self.store.rows(chunk_rows)

    def state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every materialised row, as :meth:`TableShard.state
        <embnic.client_lib.rowstore.TableShard.state>` (keys sorted, rows, acc) — the whole
        table in memory: for tests and small tables; exports stream :meth:`iter_state`."""
        parts = list(self.iter_state())
        if not parts:
            return np.empty(0, np.uint64), np.empty((0, self.dim), np.float32), np.empty(0, np.float32)
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))

    def _reset(self, snapshot: Path | None = None) -> None:
        """A new store — empty, or a copy of ``snapshot`` (a loaded state or snapshot): nothing
        cached, nothing kept in memory, writes go through."""
        self.store.reset(snapshot)
        self.cache.clear()
        self._full = None
        self.pending.clear()

    def load_state(self, keys: np.ndarray, rows: np.ndarray, acc: np.ndarray) -> None:
        """Replace every row with ``(keys, rows, acc)`` (a checkpoint of the in-memory store, an
        imported table); as :meth:`TableShard.load_state
        <embnic.client_lib.rowstore.TableShard.load_state>`.

        Raises:
            ValueError: shapes that do not fit the table, or keys not strictly increasing.
        """
        k = np.asarray(keys, dtype=np.uint64).reshape(-1)
        r = np.asarray(rows)
        a = np.asarray(acc).reshape(-1)
        if r.shape != (k.size, self.dim) or a.shape != (k.size,):
            raise ValueError(f"table {self.table.id}: state shapes keys {k.shape}, rows {r.shape}, acc {a.shape} "
                             f"do not fit dim {self.dim}")
        if k.size > 1 and not bool(np.all(k[1:] > k[:-1])):
            raise ValueError(f"table {self.table.id}: state keys are not strictly increasing")
        self._reset()
        for lo in range(0, k.size, 1 << 16):
            s = slice(lo, lo + (1 << 16))
            self.store.put(k[s], self._pack(r[s], a[s] if self.adagrad else None))
        self._n = int(k.size)
        self.store.write_meta(self._n)

    # -- snapshots ----------------------------------------------------------------------------

    def snapshot(self, path: str | os.PathLike) -> dict:
        """Flush, then write a RocksDB checkpoint of the store to ``path`` (must not exist; hard
        links to the SST files), synced to disk. Returns ``{"rows_held"}``.

        Raises:
            StoreFullError (an OSError): the store takes no writes now. OSError: the checkpoint failed.
        """
        self.flush()
        self.store.checkpoint(Path(path))
        return {"rows_held": self._n}

    def load_snapshot(self, path: str | os.PathLike) -> dict:
        """Replace the live store by snapshot ``path`` (:meth:`snapshot`; the snapshot itself is
        not changed) and empty the cache. Returns the snapshot's meta record.

        Raises:
            StoreError: ``path`` is not a snapshot of this table (another id, dim or optimizer, or
                no meta record).
        """
        path = Path(path)
        meta = read_meta(path)
        want = {"table": self.table.id, "dim": self.dim, "optimizer": self.table.optimizer}
        got = {k: meta.get(k) for k in want}
        if got != want:
            raise StoreError(f"{path} is a snapshot of {got}, not of {want}")
        self._reset(path)
        self._n = int(meta["rows_held"])
        return meta

    def counters(self) -> dict:
        """``{"cache_rows", "cached", "dirty", "rows_held", "full", "pending", "hits", "misses",
        "store_reads", "store_found", "evictions", "writebacks", "store_writes", "write_through",
        "store_write_errors", "full_periods"}``: the cache's capacity and occupancy and its counts
        (``hits``/``misses`` per key looked up or updated; ``writebacks``: dirty rows written at
        eviction or flush); ``full`` 1 while the store takes no writes, ``pending`` the rows kept in
        memory meanwhile, ``store_write_errors`` writes it refused, ``full_periods`` times it
        became full."""
        return {"cache_rows": self.capacity, "cached": int(np.count_nonzero(self.cache.valid)),
                "dirty": int(np.count_nonzero(self.cache.dirty)), "rows_held": self._n,
                "full": int(self._full is not None), "pending": len(self.pending), **self.stats}
