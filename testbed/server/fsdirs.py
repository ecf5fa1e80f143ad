"""Directories of a shard's state on disk: the lock that keeps a second process out, and copies
of a store's directory that are synced to disk or share its immutable files (hard links)."""
from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path


class DirLockedError(Exception):
    """Another process holds the directory's lock; :attr:`holder` is the pid it wrote ("?" when
    unreadable)."""

    def __init__(self, directory: Path, holder: str):
        super().__init__(f"{directory} is locked by pid {holder}")
        self.holder = holder


def lock_dir(d: Path) -> int:
    """Take ``d/LOCK`` (a POSIX lock, held while the returned descriptor is open: until it is
    closed or the process exits) and write this process's pid into it.

    Raises:
        DirLockedError: another process holds it.
        OSError: ``d/LOCK`` cannot be opened.
    """
    fd = os.open(Path(d) / "LOCK", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise DirLockedError(Path(d), holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


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
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link_tree(src: Path, dst: Path) -> None:
    """Copy RocksDB directory ``src`` to ``dst`` (must not exist): SST files as hard links (RocksDB
    never writes into one), every other file as a copy (a store opened on ``dst`` rewrites them).
    Falls back to copying where hard links are refused (another file system).

    Raises:
        OSError: ``dst`` exists, or a file cannot be copied.
    """
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if not p.is_file():
            continue
        q = dst / p.name
        if p.suffix == ".sst":
            try:
                os.link(p, q)
                continue
            except OSError:
                pass
        shutil.copy2(p, q)
