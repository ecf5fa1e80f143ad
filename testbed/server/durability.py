"""A shard that loses nothing: write-ahead log, checkpoints and restore.

One shard's directory (``--checkpoint-dir DIR`` → ``DIR/shard-<id>/``) holds ``ckpt-<S>.npz`` (the
state after the first S logged updates; a disk table's rows as a RocksDB snapshot
``ckpt-<S>.<n>.store/t<id>/`` beside it), ``wal-<S>.log`` (the updates logged from S on: a
16-byte file header :data:`WAL_HEADER`, then one :data:`REC` record per applied update, its body
as on the wire) and ``LOCK``. The formats, the group commit (the ``fdatasync`` in a thread of its
own, :class:`Durability`), the restore and the refusal of a protocol-v1 directory (format 1,
:data:`V1_ADVICE`): docs/server.md, "Durability".
"""
from __future__ import annotations

import collections
import collections.abc
import json
import logging
import os
import re
import shutil
import struct
import tempfile
import threading
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.rowstore import TableShard

from .fsdirs import fsync_dir, link_or_copy, lock_dir
from .stores import load_diskstore, open_tables, shard_dir
from .window import UpdateWindow

log = logging.getLogger("embnic.server")

REC = struct.Struct("<IIQIHHIII")  #: hdr_crc, body_len, seq, msg_id, client_id, num_tables, num_keys, value_len, body_crc
REC_LEN = REC.size
_HDR_NOCRC = struct.Struct("<IQIHHIII")
FORMAT = "embnic-checkpoint"
FORMAT_VERSION = 2
WAL_MAGIC = b"embnic-wal\0\0"
WAL_HEADER = WAL_MAGIC + struct.pack("<I", FORMAT_VERSION)  #: the first 16 bytes of every log file
#: what to do with a directory of an older format (the tail of the refusal's one line)
V1_ADVICE = ("it was written by a protocol-v1 shard (checkpoint/log format 1) and this shard reads format "
             f"{FORMAT_VERSION} only: export its tables with the embnic that wrote it (`embnic tables export`), "
             "`embnic tables import` the file into an empty directory and --restore that, or start with an empty "
             "--checkpoint-dir")
_CKPT = re.compile(r"^ckpt-(\d{20})\.npz$")
_CKPT_STORE = re.compile(r"^\.?ckpt-(\d{20})\.[0-9a-f]+\.store(\.tmp)?$")  #: disk tables' snapshots (and leftovers)
_WAL = re.compile(r"^wal-(\d{20})\.log$")
_IOV_MAX = 1024


class DurabilityError(Exception):
    """A checkpoint or log that cannot be used (wrong shard or tables, unreadable file, an
    older format)."""


class SnapshotRef(str):
    """A disk table's entry of a checkpoint: the path of its RocksDB snapshot (what
    :func:`read_checkpoint` gives instead of ``(keys, rows, acc)``)."""


def load_table(ts, st) -> None:
    """Load one table's checkpoint entry ``st`` (``(keys, rows, acc)`` or a :class:`SnapshotRef`)
    into store ``ts`` (a ``TableShard`` or a ``DiskTable``), whichever store each is.

    Raises:
        DurabilityError: a snapshot that is missing or not of this table.
        StoreDependencyError: a snapshot, and ``rocksdict`` is not installed.
    """
    if not isinstance(st, SnapshotRef):
        ts.load_state(*st)
        return
    ds = load_diskstore()
    try:
        if hasattr(ts, "load_snapshot"):
            ts.load_snapshot(st)
        else:  # the config keeps the table in memory now: read the snapshot row by row
            parts = [(np.empty(0, np.uint64), np.empty((0, ts.dim), np.float32), np.empty(0, np.float32)),
                     *ds.read_snapshot(st, ts.table)]
            ts.load_state(*(np.concatenate([p[i] for p in parts]) for i in range(3)))
    except ds.StoreError as e:
        raise DurabilityError(f"checkpoint: table {ts.table.id}'s snapshot: {e}") from None


def log_format(path: Path) -> int | None:
    """The format of log file ``path``: 2 (it starts with :data:`WAL_HEADER`), 1 (records
    without a file header: a protocol-v1 shard's), or None (empty, or a torn file header: no
    records)."""
    with open(path, "rb") as f:
        head = f.read(len(WAL_HEADER))
    if head == WAL_HEADER:
        return FORMAT_VERSION
    if len(head) < len(WAL_HEADER) and WAL_HEADER.startswith(head):
        return None
    return 1


def read_log(path: Path, start_seq: int) -> tuple[list[tuple], dict | None]:
    """Good records of log file ``path`` (format 2; :func:`log_format`).

    Args:
        path: a ``wal-<S>.log`` file.
        start_seq: the sequence number its first record must carry.

    Returns:
        (records ``(seq, client_id, msg_id, num_tables, num_keys, value_len, body_crc, body bytes)``,
        None or ``{"file", "offset", "reason", "dropped_bytes"}`` for the first bad record:
        ``truncated header``, ``header checksum``, ``truncated body``, ``body checksum``,
        ``sequence gap``).
    """
    data = path.read_bytes()
    out: list[tuple] = []
    n, want = len(data), start_seq
    off = len(WAL_HEADER) if data.startswith(WAL_HEADER) else n  # no file header: no records
    bad = None
    while off < n:
        if n - off < REC_LEN:
            bad = "truncated header"
            break
        crc, blen, seq, mid, cid, nt, nk, vl, bcrc = REC.unpack_from(data, off)
        if zlib.crc32(data[off + 4:off + REC_LEN]) != crc:
            bad = "header checksum"
            break
        if n - off - REC_LEN < blen:
            bad = "truncated body"
            break
        body = data[off + REC_LEN:off + REC_LEN + blen]
        if zlib.crc32(body) != bcrc:
            bad = "body checksum"
            break
        if seq != want:
            bad = f"sequence gap (record {seq}, expected {want})"
            break
        out.append((seq, cid, mid, nt, nk, vl, bcrc, body))
        off += REC_LEN + blen
        want += 1
    if bad is None:
        return out, None
    return out, {"file": str(path), "offset": off, "reason": bad, "dropped_bytes": n - off}


def restorable(d: Path) -> list[Path]:
    """The checkpoints (``ckpt-<S>.npz``) and logs (``wal-<S>.log``) in shard directory ``d``:
    what a restore reads (empty: nothing of a shard's to restore)."""
    return [p for _, p in _files(d, _CKPT) + _files(d, _WAL)]


def _files(d: Path, rx) -> list[tuple[int, Path]]:
    if not d.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in d.iterdir() if (m := rx.match(p.name)))


def write_checkpoint(d: Path, shard_id: int, seq: int, seed: int, tables: dict[int, TableShard],
                      applied: UpdateWindow | collections.abc.Mapping) -> tuple[Path, dict]:
    """Write ``ckpt-<seq>.npz`` atomically (temporary file, ``fsync``, rename, directory ``fsync``);
    disk tables' snapshots first, into ``ckpt-<seq>.<n>.store/`` (module docstring).

    Args:
        d: the shard's directory.
        seq: updates the state includes (the next log record's sequence number).
        tables: the shard's tables; applied: its exactly-once window (:class:`.UpdateWindow`; or a
            mapping ``(client_id, msg_id) -> fingerprint``, oldest first, e.g. empty).

    Returns:
        (the checkpoint's path, its meta).

    Raises:
        OSError: it could not be written.
    """
    d.mkdir(parents=True, exist_ok=True)
    entries = {tid: {"id": t.table.id, "name": t.table.name, "dim": t.dim, "optimizer": t.table.optimizer,
                     "rows": t.table.rows, "dtype": t.table.dtype} for tid, t in tables.items()}
    disk = {tid: ts for tid, ts in tables.items() if hasattr(ts, "snapshot")}
    if disk:  # RocksDB checkpoints, renamed into place before the .npz that names them
        name = f"ckpt-{int(seq):020d}.{time.time_ns():x}.store"
        tmp = d / f".{name}.tmp"
        tmp.mkdir()
        for tid, ts in disk.items():
            info = ts.snapshot(tmp / f"t{tid}")
            entries[tid].update(store="disk", snapshot=f"{name}/t{tid}", rows_held=info["rows_held"])
        fsync_dir(tmp)
        os.rename(tmp, d / name)
        fsync_dir(d)
    meta = {"format": FORMAT, "version": FORMAT_VERSION, "shard": int(shard_id), "seq": int(seq), "seed": int(seed),
            "tables": list(entries.values())}
    arrays: dict[str, np.ndarray] = {"meta": np.frombuffer(json.dumps(meta).encode(), np.uint8)}
    for tid, ts in tables.items():
        if tid not in disk:
            arrays.update(zip((f"t{tid}.keys", f"t{tid}.rows", f"t{tid}.acc"), ts.state()))
    rows = (applied.rows() if isinstance(applied, UpdateWindow)  # (an empty mapping: no window, an import)
            else [(c, m) + tuple(fp) for (c, m), fp in applied.items()])
    arrays["applied"] = np.array(list(rows), np.int64).reshape(-1, 6)
    final = d / f"ckpt-{int(seq):020d}.npz"
    tmp = d / f".{final.name}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, final)
    fsync_dir(d)
    return final, meta


def read_checkpoint(path: Path) -> tuple[dict, dict[int, tuple[np.ndarray, np.ndarray, np.ndarray] | SnapshotRef],
                                          np.ndarray]:
    """(meta, ``{table_id: (keys, rows, acc)}``, applied int64 (W, 6)) of a checkpoint file; a disk
    table's entry is the :class:`SnapshotRef` of its RocksDB snapshot instead.

    Raises:
        DurabilityError: not an embnic checkpoint, unreadable, or of another format version
            (format 1, a protocol-v1 shard's: :data:`V1_ADVICE`).
    """
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"PK\x03\x04":  # np.load would say "contains pickled (object) data"
            raise DurabilityError(f"{path}: unreadable checkpoint (not an .npz file: truncated or overwritten?)")
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            if meta.get("format") != FORMAT:
                raise DurabilityError(f"{path}: not an {FORMAT} file")
            if meta.get("version") != FORMAT_VERSION:
                raise DurabilityError(f"{path}: checkpoint format {meta.get('version')}: "
                                      + (V1_ADVICE if meta.get("version") == 1 else
                                         f"this shard reads format {FORMAT_VERSION} only"))
            tables = {int(t["id"]): (SnapshotRef(Path(path).parent / t["snapshot"]) if t.get("store") == "disk" else
                                     (z[f"t{t['id']}.keys"], z[f"t{t['id']}.rows"], z[f"t{t['id']}.acc"]))
                      for t in meta["tables"]}
            applied = z["applied"]
    except (OSError, ValueError, KeyError, EOFError, zlib.error, zipfile.BadZipFile) as e:
        why = "not a complete .npz file: truncated?" if isinstance(e, (zipfile.BadZipFile, EOFError)) else e
        raise DurabilityError(f"{path}: unreadable checkpoint ({why})") from None
    return meta, tables, applied


class Durability:
    """The log and checkpoints of one shard server (what :class:`~.shard_state.ShardState` holds):
    the write-ahead log's records appended, written, and made durable by a group commit.

    Sequence numbers only grow: :attr:`seq` (records appended) ≥ :attr:`written` (handed to the
    file) ≥ :attr:`durable` (on disk: an ``fdatasync`` that started after they were written has
    returned). The serving thread appends and writes (:meth:`append`, :meth:`handoff`); one sync
    thread of this object runs the ``fdatasync`` s, each covering every record written before it
    started, while the serving thread goes on; :attr:`on_durable` is called (from the sync
    thread) each time :attr:`durable` moved or the disk refused. The first failed ``fdatasync``
    stops the thread: :attr:`durable` never moves again (a later sync could not vouch for the
    pages the failed one lost) and every later call raises it; so does a failed write (a torn
    record may be in the file).

    Args:
        directory: ``--checkpoint-dir`` (the shard uses ``directory/shard-<id>``).
        shard_id, seed: the shard and the cluster seed (recorded in checkpoints).
        checkpoint_every: checkpoint after this many logged updates (0: only on request).
        fsync: ``fdatasync`` the log (False only for measurements of the cost: what is
            written counts as durable, no thread).
    """

    def __init__(self, directory, shard_id: int, seed: int, *, checkpoint_every: int = 0, fsync: bool = True):
        self.dir = shard_dir(directory, shard_id)
        self.shard_id = int(shard_id)
        self.seed = int(seed)
        self.every = int(checkpoint_every)
        self.fsync = bool(fsync)
        self.seq = 0  #: sequence number of the next log record (records appended)
        self.written = 0  #: records written to the file (serving thread)
        self.durable = 0  #: records on disk (moved by the sync thread, under :attr:`_cv`)
        self.on_durable = None  #: called by the sync thread after each ``fdatasync`` (e.g. a wake-up)
        self._fd = -1  # the log file, once restore or start_fresh opened it
        self._pending: list = []  # header and body of each appended record not yet written
        self.records = self.bytes = self.commits = 0  # durable records, written bytes, fdatasyncs (this process)
        self.checkpoints = self._since = 0
        self.last_checkpoint: str | None = None
        self.restored: dict[str, Any] | None = None
        self._lock_fd: int | None = None
        self._cv = threading.Condition()
        self._want = 0  # records the serving thread asked to make durable (under _cv)
        self._error: OSError | None = None  # the failed fdatasync (under _cv)
        self._closing = False
        self._thread: threading.Thread | None = None

    def _lock(self) -> None:
        """Take ``DIR/shard-<id>/LOCK`` (a POSIX lock, held until :meth:`close` or exit) so that
        no second shard process restores, cuts or appends to a log a running one writes.

        Raises:
            DurabilityError: another process holds it (its pid is named).
        """
        if self._lock_fd is not None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_dir(self.dir, DurabilityError, " (a second shard on one directory would cut or "
                                 "interleave its log), or give this one another directory")

    def restore(self, tables: dict[int, TableShard], applied: UpdateWindow, window: int) -> dict:
        """Load the latest checkpoint into ``tables``/``applied`` (the shard's exactly-once window,
        :class:`.UpdateWindow`, which bounds itself; ``window``: its size, kept for callers),
        replay the log after it, cut off a bad tail, and open the log for appending. Without
        any file: an empty start.

        Returns:
            ``{"checkpoint", "checkpoint_seq", "replayed", "seq", "corrupt"}`` (``corrupt``: None
            or what :func:`read_log` reported, plus ``dropped_files``).

        Raises:
            DurabilityError: the checkpoint is of another shard or other tables, or another
                process uses the directory.
        """
        self._lock()
        # another format (V1_ADVICE) is refused before anything is read, cut or added: a log's by
        # its file header (log_format), a checkpoint's by its meta (read_checkpoint)
        for _, p in _files(self.dir, _WAL):
            if log_format(p) not in (None, FORMAT_VERSION):
                raise DurabilityError(f"{self.dir}: {p.name} is a format-1 log: {V1_ADVICE}")
        cks = _files(self.dir, _CKPT)
        seq0, ck = cks[-1] if cks else (0, None)
        if ck:
            meta, tstate, win = read_checkpoint(ck)
            if meta["shard"] != self.shard_id:
                raise DurabilityError(f"{ck} is shard {meta['shard']}'s checkpoint, not shard {self.shard_id}'s")
            have = {t.table.id: (t.dim, t.table.optimizer) for t in tables.values()}
            got = {int(t["id"]): (int(t["dim"]), t["optimizer"]) for t in meta["tables"]}
            if have != got or meta["seed"] != self.seed:
                raise DurabilityError(f"{ck}: its tables (id: dim, optimizer) {got} and seed {meta['seed']} differ "
                                      f"from the config's {have} and seed {self.seed}")
            for tid, st in tstate.items():
                load_table(tables[tid], st)
            applied.clear()
            for row in win.tolist():  # (no fragment size recorded: polls of these draw a NACK)
                applied.add(row[0], row[1], tuple(row[2:]))
        seq, replayed, corrupt = seq0, 0, None
        logs = _files(self.dir, _WAL)
        for i, (start, p) in enumerate(logs):
            if i + 1 < len(logs) and logs[i + 1][0] <= seq0:
                continue  # entirely behind the checkpoint
            if start > seq:
                corrupt = {"file": str(p), "offset": 0, "reason": f"missing records {seq}..{start - 1}",
                           "dropped_bytes": p.stat().st_size}
                bad_from = i
                break
            recs, bad = read_log(p, start)
            for (s, cid, mid, nt, nk, vl, bcrc, body) in recs:
                if s < seq:
                    continue
                why = _replay(tables, cid, mid, nt, nk, vl, body)
                if why is not None:
                    bad = {"file": str(p), "offset": -1, "reason": f"record {s}: {why}", "dropped_bytes": 0}
                    break
                applied.add(cid, mid, (nt, nk, vl, bcrc))
                seq = s + 1
                replayed += 1
            if bad is not None:
                corrupt = bad
                if bad["offset"] >= 0:
                    os.truncate(p, bad["offset"])
                bad_from = i + 1
                break
        if corrupt is not None:
            corrupt["dropped_files"] = [str(p) for _, p in logs[bad_from:]
                                        if p.exists() and str(p) != corrupt["file"]]
            for q in corrupt["dropped_files"]:
                os.unlink(q)
            log.warning("shard %d: log %s is bad at byte %s (%s): %d bytes and %d later files dropped; starting from "
                        "the last good record (%d updates replayed)", self.shard_id, corrupt["file"], corrupt["offset"],
                        corrupt["reason"], corrupt["dropped_bytes"], len(corrupt["dropped_files"]), replayed)
        self._open_log(seq)
        self.restored = {"checkpoint": str(ck) if ck else None, "checkpoint_seq": seq0, "replayed": replayed,
                         "seq": seq, "corrupt": corrupt}
        return self.restored

    def start_fresh(self) -> None:
        """Open the log of a shard that starts empty (``--checkpoint-dir`` without ``--restore``).

        Raises:
            DurabilityError: the directory already holds a checkpoint or log (restore it, or
                pick another directory: starting over it would mix two runs), or another
                process uses the directory.
        """
        self._lock()
        if _files(self.dir, _CKPT) or [p for _, p in _files(self.dir, _WAL) if p.stat().st_size]:
            raise DurabilityError(f"{self.dir} already holds a checkpoint or log: restart with --restore "
                                  f"{self.dir.parent} or use an empty --checkpoint-dir")
        self._open_log(0)

    def _open_log(self, start: int) -> None:
        """Open ``wal-<start>.log`` for appending (its file header written if it has none)."""
        self.seq = self.written = self.durable = self._want = int(start)
        self._fd = os.open(self.dir / f"wal-{start:020d}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if os.fstat(self._fd).st_size < len(WAL_HEADER):  # a new file (or a torn header: cut by restore)
            os.ftruncate(self._fd, 0)
            os.write(self._fd, WAL_HEADER)
            if self.fsync:
                os.fdatasync(self._fd)
        fsync_dir(self.dir)

    def append(self, client_id, msg_id, fp: tuple, body) -> None:
        """Queue one update about to be applied (``fp``: (num_tables, num_keys, value_len, body_crc),
        the exactly-once fingerprint; ``body``: the wire body, any contiguous buffer, kept by
        reference until :meth:`handoff` or :meth:`commit` writes it, which must run before the
        buffer is reused). Its record's sequence number is ``seq`` before the call."""
        hdr = _HDR_NOCRC.pack(len(body), self.seq, msg_id, client_id, *fp)
        self._pending += [struct.pack("<I", zlib.crc32(hdr)) + hdr, body]
        self.seq += 1
        self._since += 1

    def _write(self) -> None:
        """Write every queued record (``writev``; the page cache, not yet the disk)."""
        bufs = self._pending
        for i in range(0, len(bufs), _IOV_MAX):
            chunk = bufs[i:i + _IOV_MAX]
            want = sum(len(memoryview(b).cast("B")) for b in chunk)
            n = os.writev(self._fd, chunk)
            if n != want:  # a short write (rare): write the rest byte-exact
                rest = b"".join(bytes(memoryview(b).cast("B")) for b in chunk)[n:]
                while rest:
                    rest = rest[os.write(self._fd, rest):]
            self.bytes += want
        self._pending = []
        self.written = self.seq

    def handoff(self) -> int:
        """Write the queued records and ask the sync thread to make them durable (one
        ``fdatasync`` covering them starts once the one running, if any, has returned); returns
        at once with :attr:`durable` (records up to it are on disk). The serving thread's one
        handoff per wake-up: a lock taken once.

        Raises:
            OSError: the write failed, or an ``fdatasync`` did (nothing after :attr:`durable`
                may be acknowledged, ever).
        """
        if self._error is None:
            try:
                self._write()
            except OSError as e:  # a torn record may be in the file: nothing may follow it
                with self._cv:
                    self._error = e
        with self._cv:
            if self._error is not None:
                raise self._error
            if not self.fsync:  # measuring the cost: written counts as durable
                if self.written > self.durable:
                    self.records += self.written - self.durable
                    self.durable = self.written
                    self.commits += 1
                return self.durable
            if self.written > self._want:
                self._want = self.written
                if self._thread is None:
                    self._thread = threading.Thread(target=self._sync_loop, name=f"embnic-wal-{self.shard_id}",
                                                    daemon=True)
                    self._thread.start()
                self._cv.notify_all()
            return self.durable

    def poll(self) -> int:
        """:attr:`durable` now (read under the lock the sync thread moves it with).

        Raises:
            OSError: an ``fdatasync`` failed.
        """
        with self._cv:
            if self._error is not None:
                raise self._error
            return self.durable

    def commit(self) -> int:
        """Write every queued record and wait until all are durable. Returns :attr:`durable`.

        Raises:
            OSError: the write or an ``fdatasync`` failed (the caller must not acknowledge them).
        """
        self.handoff()
        with self._cv:
            while self.durable < self.written and self._error is None:
                self._cv.wait()
            if self._error is not None:
                raise self._error
            return self.durable

    def _sync_loop(self) -> None:
        """The sync thread: ``fdatasync`` whenever written records wait for it; each one covers
        every record written before it started (:attr:`_want` when it started)."""
        cv = self._cv
        while True:
            with cv:
                while self._want <= self.durable and not self._closing:
                    cv.wait()
                if self._closing:
                    return
                target, fd = self._want, self._fd
            try:
                os.fdatasync(fd)
                err = None
            except OSError as e:
                err = e
            with cv:
                if err is None:
                    self.records += target - self.durable
                    self.durable = target
                    self.commits += 1
                else:
                    self._error = err
                cv.notify_all()
            cb = self.on_durable
            if cb is not None:
                cb()
            if err is not None:
                return

    @property
    def due(self) -> bool:
        """A periodic checkpoint is due (``checkpoint_every`` updates logged since the last)."""
        return self.every > 0 and self._since >= self.every

    def checkpoint(self, tables: dict[int, TableShard], applied: UpdateWindow) -> Path:
        """Write a checkpoint of the committed state (every record made durable first, so the
        sync thread is idle), start a new log file and delete what is behind it. Call between
        wake-ups.

        Raises:
            OSError: the checkpoint could not be written (the log is kept whole).
        """
        self.commit()
        seq = self.seq
        path, meta = write_checkpoint(self.dir, self.shard_id, seq, self.seed, tables, applied)
        os.close(self._fd)
        self._open_log(seq)  # a new log file from here on
        for s, p in _files(self.dir, _WAL) + _files(self.dir, _CKPT):
            if s < seq:
                p.unlink()
        keep = {t["snapshot"].split("/")[0] for t in meta["tables"] if t.get("store") == "disk"}
        for _, p in _files(self.dir, _CKPT_STORE):  # older snapshots and leftovers of a crash
            if p.name not in keep:
                shutil.rmtree(p, ignore_errors=True)
        fsync_dir(self.dir)
        self.checkpoints += 1
        self.last_checkpoint = str(path)
        self._since = 0
        return path

    def counters(self) -> dict:
        """``{"dir", "seq", "log_records", "log_bytes", "log_commits", "checkpoints",
        "last_checkpoint", "since_checkpoint", "restored"}`` (of this process: records made
        durable, bytes written, ``fdatasync`` s; ``seq``: records appended; ``since_checkpoint``:
        updates logged since the last checkpoint)."""
        return {"dir": str(self.dir), "seq": self.seq, "log_records": self.records, "log_bytes": self.bytes,
                "log_commits": self.commits, "checkpoints": self.checkpoints,
                "last_checkpoint": self.last_checkpoint, "since_checkpoint": self._since, "restored": self.restored}

    def close(self) -> None:
        """Stop the sync thread (after the ``fdatasync`` it runs, if any), close the log (records
        not durable are dropped: they were never acknowledged) and release the directory's lock."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _replay(tables: dict[int, TableShard], client_id: int, msg_id: int, num_tables: int, num_keys: int,
            value_len: int, body: bytes) -> str | None:
    """Apply one logged update (its wire body: directory, keys, gradients) with the tables'
    own ``apply``, table by table in directory order, as the shard did. Returns None, or why the
    record cannot be applied (a body that does not add up, a table not in the config or with
    another dim or dtype): nothing of it is applied then."""
    if len(body) != consts.expected_msg_len(consts.MsgType.UPDATE_REQ, num_tables, num_keys, value_len):
        return f"body of {len(body)} bytes does not fit {num_tables} tables, {num_keys} keys"
    h = codec.Header(consts.MAGIC, consts.VERSION, consts.MsgType.UPDATE_REQ, 0, 0, 0, msg_id, client_id, 0,
                     num_tables, consts.NO_TABLE, num_keys, value_len, len(body), 0, 0, 1, len(body), 0)
    try:
        rb = codec.parse_request_body(h, body)
    except codec.DirectoryError as e:
        return f"directory: {e}"
    d = rb.directory
    for tid, dim, dt in zip(d["table_id"].tolist(), d["dim"].tolist(), d["dtype"].tolist()):
        ts = tables.get(tid)
        if ts is None or dim != ts.dim or dt != ts.table.wire_dtype:
            return f"table {tid} dim {dim} dtype {dt} not in config"
    ko = rb.key_offsets.tolist()
    for t, tid in enumerate(d["table_id"].tolist()):
        tables[tid].apply(rb.keys[ko[t]:ko[t + 1]], codec.table_values(rb.values, rb, t).astype(np.float32))
    return None


def load_shard_stores(directory, shard_id: int, cfg, window: int = 1 << 62):
    """Shard ``shard_id``'s tables as a restart would see them (latest checkpoint + log), read
    only: nothing in ``directory`` is changed (for ``embnic tables export``).

    Returns:
        (the :class:`~embnic.testbed.server.stores.ShardStores` — ``close()`` removes the disk
        tables' scratch copies —, the restore report of :meth:`Durability.restore`).

    The shard's directory is copied to a temporary one first (its log may be cut there); disk
    tables' snapshots are hard-linked, not copied, and the shard's live ``store/`` is skipped.
    """
    src = shard_dir(directory, shard_id)
    stores = open_tables(cfg, shard_id, scratch=True)  # StoreSetupError: rocksdict missing, say
    try:
        with tempfile.TemporaryDirectory() as tmp:
            dst = shard_dir(tmp, shard_id)
            if src.is_dir():
                shutil.copytree(src, dst, ignore=lambda d, names: ["store"] if Path(d) == src else [],
                                copy_function=link_or_copy)
            d = Durability(tmp, shard_id, cfg.seed, fsync=False)
            try:
                rep = d.restore(stores.tables, UpdateWindow(window), window)
            except DurabilityError as e:  # name the user's file, not the private copy's
                raise DurabilityError(str(e).replace(str(dst), str(src))) from None
            finally:
                d.close()
    except BaseException:
        stores.close()
        raise
    return stores, rep
