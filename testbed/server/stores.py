"""Where a shard keeps each table's rows: the in-memory arena (default) or the disk tier.

The one seam between a shard and its row stores: :func:`open_tables` gives every table a store
with :class:`~embnic.client_lib.rowstore.TableShard`'s interface — a ``TableShard`` view of the
shard's one ``RowStore`` for ``store = "memory"`` tables, a
:class:`~embnic.testbed.server.disktable.DiskTable` for ``store = "disk"`` ones (docs/config.md) —
and imports ``rocksdict`` only when a table is on disk. The live disk stores (scratch) are in
``D/shard-<id>/store/`` under ``--checkpoint-dir D``, else ``S/shard-<id>/`` under ``[[shards]]
store_dir = S``, else a temporary directory.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from embnic.client_lib.config import DEFAULT_BLOCK_CACHE_MB, ClusterConfig
from embnic.client_lib.rowstore import RowStore, shared_tables

log = logging.getLogger("embnic.server")

DISK_EXTRA = "pip install 'embnic[disk]'"  #: how to get the disk tier's dependency


class StoreSetupError(Exception):
    """The disk tier cannot start: its directory is unusable (one line naming the fix)."""


class StoreDependencyError(StoreSetupError):
    """The disk tier's Python dependency (``rocksdict``) is not installed (the line names the extra)."""


def shard_dir(directory: str | os.PathLike, shard_id: int) -> Path:
    """``DIR/shard-<id>``: where shard ``shard_id`` keeps its checkpoints and log
    (:mod:`~embnic.testbed.server.durability`) and, under ``store/``, its disk tables' live stores."""
    return Path(directory) / f"shard-{int(shard_id)}"


def disk_tables(cfg: ClusterConfig, shard_id: int) -> list[int]:
    """Ids of the tables shard ``shard_id`` keeps on disk."""
    return [t.id for t in cfg.tables if cfg.store_of(t.id, shard_id)[0] == "disk"]


def load_diskstore():
    """The :mod:`~embnic.testbed.server.diskstore` module.

    Raises:
        StoreDependencyError: ``rocksdict`` is not installed (names the extra).
    """
    try:
        from . import diskstore
    except ImportError as e:  # diskstore's own message names the fix too: give the cause, and the fix once
        raise StoreDependencyError(f'a table has store = "disk", which needs the RocksDB binding rocksdict '
                                   f"({e.__cause__ or e}); install it: {DISK_EXTRA}") from None
    return diskstore


class ShardStores:
    """The row stores of one shard process: ``tables`` (table id → store), ``store`` (the
    :class:`~embnic.client_lib.rowstore.RowStore` holding every in-memory table: one search
    and one gather per message, whatever its tables) and the disk tier's
    :class:`~embnic.testbed.server.diskstore.StoreEnv` (None without disk tables). ``close()``
    closes the disk stores (and removes a scratch directory)."""

    def __init__(self, tables: dict, store: RowStore, env=None):
        self.tables = tables
        self.store = store
        self.env = env

    def counters(self) -> dict:
        """``{"root", "tables": {table id: DiskTable.counters()}, **StoreEnv.usage()}`` of the disk
        tables; ``{}`` without any."""
        if self.env is None:
            return {}
        return {"root": str(self.env.root), **self.env.usage(),
                "tables": {str(tid): ts.counters() for tid, ts in self.tables.items() if hasattr(ts, "counters")}}

    def close(self) -> None:
        if self.env is not None:
            self.env.close()


def _check_cache_memory(ds, cfg: ClusterConfig, shard_id: int, disk: list[int]) -> None:
    """Refuse disk-table caches (``cache_rows``) larger together than this machine's memory, naming
    the tables and their ``cache_rows``, before anything is allocated or opened.

    Raises:
        StoreSetupError: the caches would not fit in physical memory.
    """
    try:
        phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not known here: nothing to check against
        return
    need = {tid: (cfg.store_of(tid, shard_id)[1], ds.cache_bytes(cfg.table(tid), cfg.store_of(tid, shard_id)[1]))
            for tid in disk}
    total = sum(b for _, b in need.values())
    if total <= phys:
        return
    big = sorted(need, key=lambda tid: -need[tid][1])[:3]
    named = ", ".join(f"table {tid} cache_rows = {need[tid][0]} ({_gib(need[tid][1])})" for tid in big)
    raise StoreSetupError(f"shard {shard_id}'s disk-table caches need {_gib(total)} of memory "
                          f"(cache_rows x (4·dim + 23) bytes each; {named}{', ...' if len(need) > 3 else ''}), more "
                          f"than this machine's {_gib(phys)}: lower cache_rows")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n < 1 << 40 else f"{n / (1 << 40):.2f} TiB"


def open_tables(cfg: ClusterConfig, shard_id: int, durable_dir: str | os.PathLike | None = None, *,
                root: str | os.PathLike | None = None,
                scratch: bool = False) -> ShardStores:
    """Every table's store for shard ``shard_id`` (see the module docstring for where disk tables live).

    Args:
        durable_dir: the shard's ``--checkpoint-dir`` (or ``--restore``) directory, if any.
        root: put the disk tables' live stores here instead.
        scratch: put them in a new temporary directory, whatever the config says (``tables
            import``/``export``: never the directory of a shard that may be running).

    Raises:
        StoreDependencyError: a disk table without ``rocksdict``. StoreSetupError: a store directory
            in use by another process or holding files of something else.
    """
    disk = disk_tables(cfg, shard_id)
    # the in-memory tables share one RowStore (with no table in memory it holds them all and serves
    # none: the engine's C answer path reads its arrays, and leaves every table not in it to Python)
    memory = [t for t in cfg.tables if t.id not in disk]
    rows, tables = shared_tables(memory or list(cfg.tables), cfg.seed, capacity=64)
    env = None
    if disk:
        ds = load_diskstore()
        from .disktable import DiskTable
        me = cfg.shard(shard_id)
        mb = me.block_cache_mb or DEFAULT_BLOCK_CACHE_MB
        # what an error names: where the stores go and how to fix it
        where, fix = "store directory", "give a directory this shard can create and write"
        if scratch:
            root = None
        elif root is None and durable_dir is not None:
            root = shard_dir(durable_dir, shard_id) / "store"
            where = f"--checkpoint-dir {durable_dir}"
        elif root is None and me.store_dir is not None:
            root = Path(me.store_dir) / f"shard-{shard_id}"
            where, fix = f"store_dir {me.store_dir}", "give store_dir a directory this shard can create and write"
        if root is None:
            where = f"temporary store directory ({os.environ.get('EMBNIC_STORE_TMP') or '/var/tmp'})"
            fix = "free space there or set EMBNIC_STORE_TMP to a writable directory"
        _check_cache_memory(ds, cfg, shard_id, disk)
        what = f"{where} of shard {shard_id}'s disk table{'s' if len(disk) > 1 else ''} {','.join(map(str, disk))}"
        try:
            if root is None:
                env = ds.scratch_env(mb, prefix=f"embnic-rows-shard{shard_id}-")
            else:
                env = ds.StoreEnv(root, mb)
            (log.debug if scratch else log.info)("shard %d: tables %s on disk in %s%s (block cache %d MiB)",
                                                 shard_id, ",".join(map(str, disk)), env.root,
                                                 " (scratch, removed at stop)" if env.scratch else "", mb)
            for tid in disk:
                tables[tid] = DiskTable(cfg.table(tid), cfg.seed, env, cfg.store_of(tid, shard_id)[1])
        except BaseException as e:
            if env is not None:
                env.close()
            if isinstance(e, ds.StoreError):
                raise StoreSetupError(f"{what}: {e}") from None
            if isinstance(e, OSError):  # not a directory, not there, not ours to write: not an address to bind
                at = e.filename or (root if env is None else env.root)
                raise StoreSetupError(f"{what}: cannot use {at}: {e.strerror or e}: {fix}") from None
            raise
    return ShardStores({t.id: tables[t.id] for t in cfg.tables}, rows, env)  # in the config's order
