"""The disk tier's RocksDB (``store = "disk"``): the stores of a shard process's disk tables.

Imported by this module alone, through the ``rocksdict`` binding (the extra ``embnic[disk]``):
:class:`StoreEnv` holds what a process's tables share (root directory, block cache, options),
:class:`TableStore` one table's store; :func:`read_meta` and :func:`read_snapshot` read
snapshots. One RocksDB per table (``<root>/t<id>/``): key = the id as 8 bytes big-endian (so
iteration yields sorted ids), value = the row's ``dim`` float32 LE then, for Adagrad, its
accumulator; the key :data:`META_KEY` holds JSON (:data:`FORMAT`, table, dim, optimizer, rows
held). Writes skip RocksDB's own log (the shard's log covers every update) and use
``no_slowdown`` with ``paranoid_checks`` off, so a full disk refuses a write
(:class:`StoreFullError`) instead of blocking the shard or making the store read-only for good.
Memory, snapshots and the full disk: docs/server.md, "Disk tier".
"""
from __future__ import annotations

import collections
import errno
import itertools
import json
import logging
import operator
import os
import shutil
import tempfile
import time
import weakref
from pathlib import Path
from typing import Iterator

import numpy as np

try:
    import rocksdict
except ImportError as e:  # pragma: no cover - what stores.py turns into one line naming the extra
    raise ImportError(f"the disk tier needs rocksdict ({e}): pip install 'embnic[disk]'") from e

from embnic.client_lib.config import TableConfig

from .fsdirs import fsync_tree, link_or_copy, lock_dir
from .rowcache import capacity

log = logging.getLogger("embnic.server")

FORMAT = "embnic-rows"  #: the ``format`` of a store's meta record
FORMAT_VERSION = 1
META_KEY = b"\xff" * 8 + b"~meta"  #: sorts after every 8-byte row key
ROWS_END = b"\xff" * 8 + b"\x00"  #: exclusive upper bound of the row keys (the largest id included)
#: a write that stalls (memtables waiting for a flush) while the file system has room is retried for
#: at most this long (seconds) before the table counts as full
STALL_WAIT_S = 2.0
#: the file system's free space is read at most this often (seconds; :meth:`StoreEnv.space_ok`)
SPACE_CHECK_S = 0.2
#: a snapshot waits at most this long for RocksDB to flush its memtables (seconds)
FLUSH_WAIT_S = 30.0
#: the memtables' bloom filters: this share of ``write_buffer_size`` (bytes of filter per memtable)
MEMTABLE_BLOOM_RATIO = 0.1
#: closing a store waits at most this long for them (seconds; :meth:`DiskTable.close`)
CLOSE_FLUSH_WAIT_S = 5.0
_abandoned: list = []  #: stores that could not flush at close, kept open until the process exits


class StoreError(Exception):
    """A store that cannot be used: another process holds it, a snapshot of another table or
    layout, a value of the wrong size (damage)."""


class StoreFullError(StoreError, OSError):
    """The store cannot take writes now (its file system is full, or RocksDB refuses writes until a
    flush gets through): retry when space is back. An ``OSError`` too, so a checkpoint that meets it
    fails as any other disk error does."""


#: allocations at least this large are mapped and unmapped by glibc's malloc (M_MMAP_THRESHOLD)
MMAP_THRESHOLD = 512 << 10
_M_MMAP_THRESHOLD = -3  #: malloc.h


def _fix_mmap_threshold() -> bool:
    """Fix glibc's ``M_MMAP_THRESHOLD`` at :data:`MMAP_THRESHOLD` (process-wide, once; True if set).

    By default glibc raises the threshold to the size of any mapped block freed, so after one
    large temporary buffer (a compaction's, a big numpy temporary) every later one of that size
    comes from the heap and stays resident when freed: the shard's anonymous memory would creep
    up with the sizes RocksDB's background work reaches as the table grows, past the budget.
    A fixed threshold returns such buffers to the kernel when freed."""
    import ctypes

    try:
        return bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):  # not glibc
        return False


class StoreEnv:
    """What the disk tables of one shard process share: their root directory (locked), RocksDB's
    block cache (which the memtables are charged to) and options.

    Args:
        root: the directory the tables' stores live in (``<root>/t<id>``); created. Its previous
            contents are removed: a live store is scratch (the durable state is the shard's
            snapshots and log), so only a directory holding the :data:`MARK` file (one of ours) or
            an empty one is taken.
        block_cache_mb: RocksDB block cache, MiB (the memtables of every table are charged to it).
        scratch: remove ``root`` when closed (a temporary directory).

    Raises:
        StoreError: ``root`` is in use by another process (its pid named), or holds files that are
            not a store of ours.
    """

    MARK = "EMBNIC-ROWS"  #: the file that marks a directory as a shard's live stores (scratch)

    def __init__(self, root: str | os.PathLike, block_cache_mb: int, *, scratch: bool = False):
        self.root = Path(root)
        self.scratch = bool(scratch)
        self.block_cache_bytes = int(block_cache_mb) << 20
        self.root.mkdir(parents=True, exist_ok=True)
        self._refuse_foreign()  # before the lock: a refused directory is left as it was (no LOCK file made)
        self._lock_fd = lock_dir(self.root, StoreError, ", or give this one another store_dir")
        try:
            others = self._refuse_foreign()  # again, under the lock
        except StoreError:
            os.close(self._lock_fd)
            raise
        for name in others:  # an earlier run's live stores: scratch (restore rebuilds from snapshots)
            p = self.root / name
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        (self.root / self.MARK).write_text("live row stores of an embnic shard: scratch, replaced at every start; "
                                           "the durable state is --checkpoint-dir\n")
        _fix_mmap_threshold()
        self.cache = rocksdict.Cache(self.block_cache_bytes)
        self.wbm = rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(
            max(1 << 20, self.block_cache_bytes // 2), False, self.cache)
        self.write_opts = rocksdict.WriteOptions()
        self.write_opts.disable_wal = True  # the shard's own log covers every update
        self.write_opts.no_slowdown = True  # a stall fails the write (retried, or the table is full), never blocks
        #: bytes of one memtable (``write_buffer_size`` of every table)
        self.write_buffer_bytes = max(1 << 20, min(64 << 20, self.block_cache_bytes // 4))
        #: free bytes the file system must have for the tables to take updates: what two memtables
        #: need to reach disk (below it every table is full: :meth:`space_ok`)
        self.reserve_bytes = 2 * self.write_buffer_bytes
        self._space = (-1.0, True)  # (monotonic time of the last statvfs, its verdict)
        self.tables: weakref.WeakSet = weakref.WeakSet()
        self._final = weakref.finalize(self, StoreEnv._cleanup, self.root if self.scratch else None, self.tables)

    def _refuse_foreign(self) -> list[str]:
        """The names in ``root`` besides ``LOCK`` and :data:`MARK`.

        Raises:
            StoreError: there are some and no :data:`MARK` (not a store of ours).
        """
        others = sorted(p.name for p in self.root.iterdir() if p.name not in ("LOCK", self.MARK))
        if others and not (self.root / self.MARK).exists():
            raise StoreError(f"{self.root} holds {', '.join(others[:4])}{', ...' if len(others) > 4 else ''}, which "
                             "is not a shard's row store: give store_dir an empty directory (its contents are "
                             "scratch, replaced at every start)")
        return others

    def space_ok(self) -> bool:
        """Whether the file system has at least :attr:`reserve_bytes` free (read at most every
        :data:`SPACE_CHECK_S` s; a root that cannot be read counts as no room)."""
        now = time.monotonic()
        at, ok = self._space
        if now - at < SPACE_CHECK_S:
            return ok
        try:
            st = os.statvfs(self.root)  # bytes free to this process
            ok = st.f_bavail * st.f_frsize >= self.reserve_bytes
        except OSError:
            ok = False
        self._space = (now, ok)
        return ok

    def options(self, dim: int) -> "rocksdict.Options":
        """RocksDB options of one table: raw bytes, no compression (float rows do not compress),
        bloom filters (an absent id costs a filter probe) in the SST files and in the memtables (a
        read of an id the memtables do not hold skips their skip-list search: measured, a multi-get
        of the cache's misses cost 15–25 % less here), SST files read through ``mmap``, the
        shared block cache and write-buffer manager, two background jobs; ``paranoid_checks`` off,
        so a flush or compaction that finds the disk full is retried by RocksDB once there is
        room instead of stopping every write for good (docs/server.md, "Disk tier")."""
        o = rocksdict.Options(raw_mode=True)
        o.create_if_missing(True)
        o.set_paranoid_checks(False)
        o.set_compression_type(rocksdict.DBCompressionType.none())
        o.set_allow_mmap_reads(True)
        o.set_max_background_jobs(2)
        o.set_write_buffer_size(self.write_buffer_bytes)
        o.set_max_write_buffer_number(2)
        o.set_write_buffer_manager(self.wbm)
        o.set_memtable_whole_key_filtering(True)  # a whole-key bloom filter per memtable, in its arena
        o.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO)
        o.set_keep_log_file_num(2)
        # bounded working memory of flushes and compactions: output files of at most 4 MiB (a file's
        # filter is built in memory), small write buffers, levels from 16 MiB up (no compaction
        # rewrites the whole table)
        o.set_target_file_size_base(4 << 20)
        o.set_max_bytes_for_level_base(16 << 20)
        o.set_writable_file_max_buffer_size(256 << 10)
        o.set_max_compaction_bytes(16 << 20)  # one compaction job reads and writes at most ~16 MiB
        o.set_max_subcompactions(1)
        bo = rocksdict.BlockBasedOptions()
        bo.set_block_cache(self.cache)
        bo.set_bloom_filter(10, False)
        bo.set_cache_index_and_filter_blocks(True)
        bo.set_pin_l0_filter_and_index_blocks_in_cache(True)
        o.set_block_based_table_factory(bo)
        return o

    def usage(self) -> dict:
        """``{"block_cache_bytes", "block_cache_capacity", "memtable_bytes", "table_readers_bytes",
        "sst_bytes"}`` over every open table (bytes; memtables are charged to the block cache, so
        they are part of ``block_cache_bytes`` too)."""
        dbs = [t.db for t in list(self.tables) if t.db is not None]
        props = {"memtable_bytes": "cur-size-all-mem-tables", "table_readers_bytes": "estimate-table-readers-mem",
                 "sst_bytes": "total-sst-files-size"}
        return {"block_cache_bytes": int(self.cache.get_usage()), "block_cache_capacity": self.block_cache_bytes,
                **{k: sum(db.property_int_value(f"rocksdb.{p}") or 0 for db in dbs) for k, p in props.items()}}

    @staticmethod
    def _cleanup(root: Path | None, tables: weakref.WeakSet) -> None:
        """Close the tables still open (their RocksDB background threads would write into the
        directory being removed: at interpreter exit, say), then remove a scratch root."""
        for t in list(tables):
            t.close()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    def close(self) -> None:
        """Close every table's store (and remove a scratch root), release the lock. Idempotent."""
        self._final()  # _cleanup
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def scratch_env(block_cache_mb: int, prefix: str = "embnic-rows-") -> StoreEnv:
    """A :class:`StoreEnv` in a new temporary directory under ``/var/tmp`` (disk, not a tmpfs;
    ``$EMBNIC_STORE_TMP`` overrides), removed when closed."""
    base = os.environ.get("EMBNIC_STORE_TMP") or ("/var/tmp" if os.path.isdir("/var/tmp") else None)
    root = tempfile.mkdtemp(prefix=prefix, dir=base)
    try:
        return StoreEnv(root, block_cache_mb, scratch=True)
    except BaseException:  # before its finalizer exists (an interrupt, say): nothing left behind
        shutil.rmtree(root, ignore_errors=True)
        raise


def cache_bytes(table: TableConfig, cache_rows: int) -> int:
    """Bytes of :class:`DiskTable`'s cache of ``table`` with ``cache_rows`` rows (its capacity, the
    multiple of the ways not above ``cache_rows``, × (4·dim row + 4 accumulator (adagrad) + 19:
    key, flags, use count, stamp))."""
    ways, sets = capacity(cache_rows)
    return ways * sets * (4 * int(table.dim) + (4 if table.optimizer == "adagrad" else 0) + 19)


class TableStore:
    """One disk table's rows in its own RocksDB (module docstring): rows of
    ``width`` float32 values (the row, then the accumulator), counted in ``stats``
    (``store_reads``, ``store_found``, ``store_writes``, ``store_write_errors``).

    Args:
        env: the shard process's :class:`StoreEnv`; the store is ``env.root / f"t{table.id}"``,
            created empty.
        table: the table's config.
        width: float32 values per stored row.
        stats: the table's counters.

    Raises:
        StoreError: the store cannot be opened.
    """

    def __init__(self, env: StoreEnv, table: TableConfig, width: int, stats: collections.Counter):
        self.env, self.table, self.width, self.stats = env, table, int(width), stats
        self.path = env.root / f"t{table.id}"
        self._vdt = np.dtype(f"V{4 * self.width}")
        self.db = None
        self.reset()
        env.tables.add(self)

    def reset(self, snapshot: Path | None = None) -> None:
        """Replace the store by an empty one, or by a copy of checkpoint ``snapshot`` (hard links:
        RocksDB never writes into an SST file, so the live store and the snapshot can share them).

        Raises:
            StoreError: RocksDB cannot open it. OSError: the copy cannot be made.
        """
        self.close()
        if self.path.exists():
            shutil.rmtree(self.path)
        if snapshot is not None:
            shutil.copytree(snapshot, self.path, copy_function=link_or_copy)
        try:
            self.db = rocksdict.Rdict(str(self.path), self.env.options(self.table.dim))
        except Exception as e:  # rocksdict raises plain Exceptions for I/O and lock errors
            raise StoreError(f"{self.path}: cannot open the row store ({e})") from None
        self.db.set_write_options(self.env.write_opts)
        self._ro = rocksdict.ReadOptions()
        self._ro.set_iterate_upper_bound(ROWS_END)

    def close(self) -> None:
        """Close the store (unflushed rows are dropped: the shard's log holds their updates). Idempotent.

        The binding's close (and its destructor) flushes RocksDB's memtables and waits for it; with
        ``paranoid_checks`` off a flush that cannot succeed (a full disk, a removed directory) is
        retried for ever, so the memtables are flushed here first, waiting at most
        :data:`CLOSE_FLUSH_WAIT_S`; a store that could not flush them is left open, unreferenced,
        until the process exits (RocksDB's threads do not hold the exit up)."""
        db, self.db = self.db, None
        if db is None:
            return
        try:
            self.flush_memtables(db, CLOSE_FLUSH_WAIT_S)
        except Exception as e:  # noqa: BLE001 - any failure to flush: do not let close() wait for ever
            log.warning("table %d: RocksDB could not flush %s (%s); its unflushed rows are dropped with it",
                        self.table.id, self.path, e)
            _abandoned.append(db)  # never deallocated: its destructor would flush and wait
            import ctypes
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(db))
            return
        db.close()

    def __del__(self):
        # close the store before the attributes go: a StoreEnv freed first removes a scratch directory,
        # and the binding's destructor would then wait for a flush that cannot succeed
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report to at collection
            pass

    def get(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found bool (n,), their values float32 (found, width)) of ``keys`` (unique uint64 (n,)):
        one multi-get.

        Raises:
            StoreError: values of another size (damaged, or another table's).
        """
        n = keys.size
        vals = self.db[keys.astype(">u8").view("V8").tolist()]  # one multi-get; None where absent
        found = np.fromiter(map(operator.is_not, vals, itertools.repeat(None)), bool, n)
        nf = int(np.count_nonzero(found))
        self.stats["store_reads"] += n
        self.stats["store_found"] += nf
        buf = b"".join(itertools.compress(vals, found))
        if len(buf) != nf * 4 * self.width:
            raise StoreError(f"{self.path}: stored rows of {len(buf) // max(nf, 1)} bytes, expected "
                             f"{4 * self.width} (dim {self.table.dim}, {self.table.optimizer}): damaged or another "
                             "table's")
        return found, np.frombuffer(buf, "<f4").reshape(nf, self.width)

    def put(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Write ``values`` (float32 LE (n, width)) of ``keys`` (uint64 (n,)) in one WriteBatch.

        Raises:
            StoreFullError: the store refused the write (:meth:`write`); nothing of it was written.
        """
        n = keys.size
        if n == 0:
            return
        self.write(keys.astype(">u8").view("V8").tolist(),
                   np.ascontiguousarray(values).view(self._vdt).reshape(n).tolist())
        self.stats["store_writes"] += n

    def write(self, keys: list[bytes], values: list[bytes]) -> None:
        """Write ``values[i]`` under ``keys[i]`` in one WriteBatch (atomic: all of it or nothing),
        made again for each attempt (the binding consumes a batch even when RocksDB refuses it): a
        write stall (memtables waiting for a flush) while the file system has room is waited out for
        up to :data:`STALL_WAIT_S`.

        Raises:
            StoreFullError: the store refused it — out of space, stalled past the wait, or any other
                write error RocksDB reports (its message is kept).
        """
        deadline, delay = None, 0.001
        while True:
            wb = rocksdict.WriteBatch(raw_mode=True)
            # one bound-method call per row, driven by C (map, deque): the binding has no bulk put
            collections.deque(map(wb.put, keys, values), maxlen=0)
            try:
                self.db.write(wb, self.env.write_opts)
                return
            except Exception as e:  # noqa: BLE001 - rocksdict raises plain Exceptions
                err = e
            if "incomplete" in str(err).lower() and self.env.space_ok():  # a write stall (``Incomplete``)
                now = time.monotonic()
                deadline = now + STALL_WAIT_S if deadline is None else deadline
                if now < deadline:
                    time.sleep(min(delay, deadline - now))
                    delay = min(2 * delay, 0.05)
                    continue
            self.stats["store_write_errors"] += 1
            raise StoreFullError(errno.ENOSPC, f"{self.path}: the row store refused a write ({err})") from None

    def write_meta(self, rows_held: int) -> None:
        """Write the meta record (:data:`FORMAT`, the table, ``rows_held``).

        Raises:
            StoreFullError: the store refused it.
        """
        self.write([META_KEY], [json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "table": self.table.id,
                                            "dim": self.table.dim, "optimizer": self.table.optimizer,
                                            "rows_held": rows_held}).encode()])

    def rows(self, chunk_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Every stored row in id order, ``chunk_rows`` at a time (:func:`_row_chunks`)."""
        yield from _row_chunks(self.db.items(read_opt=self._ro), self.path, self.table.dim, self.width, chunk_rows)

    def flush_memtables(self, db, wait_s: float) -> None:
        """Flush RocksDB's memtables (of ``db``: the store's, or one being closed) into SST files
        and wait for it, at most ``wait_s`` seconds: a flush that finds the disk full is retried by
        RocksDB, so waiting on it could be for ever.

        Raises:
            StoreFullError: the memtables were not flushed in time.
        """
        db.flush(False)
        deadline = time.monotonic() + wait_s
        while (db.property_int_value("rocksdb.num-entries-active-mem-table") or 0) + \
                (db.property_int_value("rocksdb.num-entries-imm-mem-tables") or 0):
            if time.monotonic() > deadline:
                raise StoreFullError(errno.ENOSPC, f"{self.path}: RocksDB did not flush its memtables within "
                                     f"{wait_s:g} s (a full disk?)")
            time.sleep(0.005)

    def checkpoint(self, path: Path) -> None:
        """Write a RocksDB checkpoint of the store to ``path`` (must not exist; hard links to the
        SST files; the memtables flushed first, as writes skip RocksDB's log), synced to disk.

        Raises:
            StoreFullError (an OSError): the memtables could not be flushed. OSError: the checkpoint failed.
        """
        self.flush_memtables(self.db, FLUSH_WAIT_S)
        try:
            rocksdict.Checkpoint(self.db).create_checkpoint(str(path))
        except Exception as e:
            raise OSError(f"{path}: RocksDB checkpoint failed ({e})") from None
        fsync_tree(path)


def read_meta(path: str | os.PathLike) -> dict:
    """The meta record of a store or snapshot directory (opened read-only).

    Raises:
        StoreError: not a RocksDB directory of ours (no meta record, or unreadable).
    """
    path = Path(path)
    try:
        db = rocksdict.Rdict(str(path), rocksdict.Options(raw_mode=True), access_type=rocksdict.AccessType.read_only())
    except Exception as e:
        raise StoreError(f"{path}: not a readable row store ({e})") from None
    try:
        raw = db.get(META_KEY)
    finally:
        db.close()
    if raw is None:
        raise StoreError(f"{path}: no {FORMAT} meta record (not a snapshot of a disk table)")
    meta = json.loads(bytes(raw).decode())
    if meta.get("format") != FORMAT or meta.get("version") != FORMAT_VERSION:
        raise StoreError(f"{path}: meta record of format {meta.get('format')} {meta.get('version')}, "
                         f"this shard reads {FORMAT} {FORMAT_VERSION}")
    return meta


def read_snapshot(path: str | os.PathLike, table: TableConfig, chunk_rows: int = 1 << 16
                  ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The rows of snapshot ``path`` of ``table`` in id order, ``chunk_rows`` at a time (read-only;
    for a table the config now keeps in memory).

    Raises:
        StoreError: not a snapshot of ``table`` (:func:`read_meta`).
    """
    meta = read_meta(path)
    if (meta.get("table"), meta.get("dim"), meta.get("optimizer")) != (table.id, table.dim, table.optimizer):
        raise StoreError(f"{path} is a snapshot of table {meta.get('table')} (dim {meta.get('dim')}, "
                         f"{meta.get('optimizer')}), not of table {table.id} (dim {table.dim}, {table.optimizer})")
    vw = table.dim + (1 if table.optimizer == "adagrad" else 0)
    db = rocksdict.Rdict(str(path), rocksdict.Options(raw_mode=True), access_type=rocksdict.AccessType.read_only())
    try:
        ro = rocksdict.ReadOptions()
        ro.set_iterate_upper_bound(ROWS_END)
        yield from _row_chunks(db.items(read_opt=ro), Path(path), table.dim, vw, chunk_rows)
    finally:
        db.close()


def _row_chunks(items, path: Path, dim: int, vw: int, chunk_rows: int
                ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(keys uint64 (m,), rows float32 (m, dim), acc float32 (m,))`` of the (key, value) pairs
    ``items`` of a store at ``path`` (rows of ``vw`` floats: ``dim``, then the accumulator when
    ``vw > dim``, else zeros), ``chunk_rows`` at a time.

    Raises:
        StoreError: a value of another size (damaged, or another table's).
    """
    width = 4 * vw
    while True:
        part = list(itertools.islice(items, chunk_rows))
        if not part:
            return
        k = np.frombuffer(b"".join(map(operator.itemgetter(0), part)), ">u8").astype(np.uint64)
        vb = b"".join(map(operator.itemgetter(1), part))
        if len(vb) != width * k.size:
            raise StoreError(f"{path}: stored rows are not {width} bytes each: damaged or another table's")
        v = np.frombuffer(vb, "<f4").reshape(k.size, vw)
        acc = np.ascontiguousarray(v[:, dim]) if vw > dim else np.zeros(k.size, np.float32)
        yield k, np.ascontiguousarray(v[:, :dim]), acc
