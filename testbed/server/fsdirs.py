"""Directories of a shard's state on disk: the lock that keeps a second process out, and copies
of a store's directory that are synced to disk or share its immutable files (hard links)."""
from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path


def lock_dir(d: Path, error: type[Exception], fix: str) -> int:
    """Take ``d/LOCK`` (a POSIX lock, held while the returned descriptor is open: until it is
    closed or the process exits) and write this process's pid into it.

    Raises:
        error: another process holds it: ``"<d> is in use by another shard process (pid P):
            stop it first<fix>"``.
        OSError: ``d/LOCK`` cannot be opened.
    """
    fd = os.open(Path(d) / "LOCK", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise error(f"{d} is in use by another shard process (pid {holder}): stop it first{fix}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def fsync_dir(d: Path) -> None:
    """``fsync`` directory ``d`` (its entries: a rename or a new file made durable).

    Raises:
        OSError: ``d`` cannot be opened or synced.
    """
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(d: Path) -> None:
    """``fsync`` every file of directory ``d`` and ``d`` itself.

    Raises:
        OSError: a file or ``d`` cannot be opened or synced.
    """
    for p in d.iterdir():
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(d)


def link_or_copy(src: str | Path, dst: str | Path) -> None:
    """Copy file ``src`` to ``dst``: a RocksDB SST file as a hard link (RocksDB never writes into
    one), any other file — or where hard links are refused (another file system) — as a copy
    (a store opened on ``dst`` rewrites it). ``shutil.copytree``'s ``copy_function`` shape.

    Raises:
        OSError: the file cannot be copied.
    """
    if str(src).endswith(".sst"):
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)
