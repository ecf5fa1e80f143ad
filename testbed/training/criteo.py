"""Criteo click logs (Kaggle Display Advertising Challenge, 2014): a vectorised TSV loader.

The format, the ids' hashing and the parsing: testbed/training/data/README.md, beside the
6435-line sample the package ships (:func:`sample_path` finds it).
"""
from __future__ import annotations

import bz2
import codecs
import dataclasses
import gzip
import importlib.resources
import io
import lzma
import math
import os
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from embnic.client_lib.splitmix import splitmix64
from embnic.control.errors import USAGE, OperationalError

NUM_DENSE = 13
NUM_SPARSE = 26
SPARSE_NAMES = tuple(f"C{i}" for i in range(1, NUM_SPARSE + 1))
MISSING_CAT = 1 << 32  #: value a missing categorical takes before hashing
SAMPLE_FILES = {
    "train": "criteo_kaggle_train_sample.tsv",
    "test": "criteo_kaggle_test_sample.tsv",
}

_DEC = np.full(256, 255, dtype=np.uint8)  #: byte -> its decimal digit, 255 for none
_DEC[list(b"0123456789")] = np.arange(10)
_HEX = _DEC.copy()  #: byte -> its hex digit (either case), 255 for none
_HEX[list(b"abcdef")] = _HEX[list(b"ABCDEF")] = np.arange(10, 16)
_MAX_DEC = 18  # digits; |x| < 10^18 fits int64


@dataclasses.dataclass
class CriteoData:
    """A block of Criteo samples (rows in file order).

    Attributes:
        labels: float32 (N,), 0/1; NaN if the file had no label column.
        dense: float32 (N, 13), ``log1p(max(I, 0))``, missing → 0.
        sparse: uint64 (N, 26), column j in ``[0, rows[j])`` (any uint64 where ``rows[j]``
            is None).
        rows: the 26 id-space sizes ``sparse`` was hashed into (None: full 64-bit ids).
        first_line: 0-based line number (in the file) of the first sample.
    """

    labels: np.ndarray
    dense: np.ndarray
    sparse: np.ndarray
    rows: tuple[int | None, ...]
    first_line: int = 0

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def has_labels(self) -> bool:
        return not (len(self) and bool(np.isnan(self.labels[0])))

    def __getitem__(self, idx) -> CriteoData:
        """Rows ``idx`` (a slice or an index array) as a new :class:`CriteoData`."""
        first = self.first_line + (idx.indices(len(self))[0] if isinstance(idx, slice) else 0)
        return CriteoData(self.labels[idx], self.dense[idx], self.sparse[idx], self.rows, first)



def hash_categorical(column: int, values: np.ndarray, rows: int | None) -> np.ndarray:
    """Id of categorical values of column ``column`` (0-based: C1 is 0).

    ``id = splitmix64((column << 40) | v) mod rows`` with ``v`` the 32-bit value, or
    :data:`MISSING_CAT` (2^32) for a missing one; with ``rows=None`` the full 64-bit
    ``splitmix64((column << 40) | v)`` (a bijection of its input: distinct values, distinct ids).

    Args:
        column: 0..25.
        values: uint64 (N,), each ``<= 2**32``.
        rows: id-space size of the column's table, or None to keep full 64-bit ids.

    Returns:
        uint64 (N,), in ``[0, rows)`` (or any uint64).
    """
    x = np.asarray(values, dtype=np.uint64) | (np.uint64(column) << np.uint64(40))
    h = splitmix64(x)
    return h if rows is None else h % np.uint64(rows)


def default_tables(rows: int | None | Sequence[int | None] = 65536, dim: int = 8, **fields) -> list[dict]:
    """The 26 ``[[tables]]`` entries (one per categorical column) for a cluster config.

    Table ``j`` (id ``j``) is named ``C{j+1}`` and holds the ids of that column.

    Args:
        rows: id-space size of every table, or 26 sizes; None (for all, or for one) leaves
            ``rows`` out of the entry: a collision-free table of full 64-bit ids.
        dim: embedding dimension.
        **fields: further fields for every table (``dtype``, ``optimizer``, ``lr``, ``eps``,
            ``init_scale``, ...; see docs/config.md).

    Returns:
        list of 26 dicts, ready for ``raw["tables"]`` of :func:`~embnic.client_lib.config.parse_config`.

    Raises:
        ValueError: ``rows`` is a sequence whose length is not 26.
    """
    r = _rows_tuple(rows)
    return [{"id": j, "name": SPARSE_NAMES[j], **({"rows": r[j]} if r[j] is not None else {}), "dim": int(dim),
             **fields} for j in range(NUM_SPARSE)]


def _rows_tuple(rows: int | None | Sequence[int | None]) -> tuple[int | None, ...]:
    if rows is None or isinstance(rows, (int, np.integer)):
        r = (None if rows is None else int(rows),) * NUM_SPARSE
    else:
        r = tuple(None if x is None else int(x) for x in rows)
    if len(r) != NUM_SPARSE:
        raise ValueError(f"rows: need one size per categorical column ({NUM_SPARSE}), got {len(r)}")
    small = [x for x in r if x is not None and x < 1]
    if small:
        raise ValueError(f"rows: every size must be >= 1 (or None for full 64-bit ids), got {small[0]}")
    return r


def sample_path(which: str = "train") -> Path:
    """Path of the Criteo sample shipped in the package (``"train"``: 6435 labelled lines,
    ``"test"``: 1999 unlabelled lines).

    Raises:
        ValueError: unknown ``which``.
    """
    if which not in SAMPLE_FILES:
        raise ValueError(f"unknown sample {which!r} (one of {', '.join(SAMPLE_FILES)})")
    return Path(str(importlib.resources.files("embnic.testbed.training").joinpath("data", SAMPLE_FILES[which])))


def time_split(data: CriteoData, valid_fraction: float = 0.2) -> tuple[CriteoData, CriteoData]:
    """Split by position: the first ``1 - valid_fraction`` for training, the rest (later in
    time: Criteo files are in chronological order) for validation.

    Raises:
        ValueError: ``valid_fraction`` not in (0, 1).
    """
    if not 0.0 < valid_fraction < 1.0:
        raise ValueError(f"valid_fraction must be in (0, 1), got {valid_fraction}")
    cut = int(round(len(data) * (1.0 - valid_fraction)))
    return data[:cut], data[cut:]


# ---- parsing -------------------------------------------------------------------------------

class CriteoFormatError(OperationalError, ValueError):
    """A line does not follow the Criteo TSV format; the message names file and line.

    A usage error of the control plane (the file given as training data is not what it
    claims to be; the fix is another ``--data``): the CLI prints its one line, exit 2.
    """

    category = USAGE


def _decode_digits(buf: np.ndarray, start: np.ndarray, length: np.ndarray, table: np.ndarray, base: int,
                   dtype, most: int) -> tuple[np.ndarray, np.ndarray]:
    """Fields of at most ``most`` digits (``table``: byte → digit, 255 for none) in ``base`` →
    (values of ``dtype``, bad bool mask), same shape as ``start``; empty → 0 (not bad)."""
    v = np.zeros(start.shape, dtype=dtype)
    bad = length > most
    last = buf.size - 1
    for p in range(min(int(length.max()) if length.size else 0, most)):
        live = p < length
        d = table[buf[np.minimum(start + p, last)]]
        bad |= live & (d == 255)
        v = np.where(live, v * dtype(base) + d.astype(dtype), v)
    return v, bad


def _decode_dec(buf: np.ndarray, start: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decimal fields ``-?[0-9]+`` → (int64 values, bad bool mask); empty → 0 (not bad)."""
    neg = (length > 0) & (buf[np.minimum(start, buf.size - 1)] == ord("-"))
    v, bad = _decode_digits(buf, start + neg, length - neg, _DEC, 10, np.int64, _MAX_DEC)
    return np.where(neg, -v, v), bad | (neg & (length == 1))


def _parse_block(data: bytes, nfields: int | None, rows: tuple[int, ...], where: str,
                 first_line: int) -> tuple[CriteoData, int]:
    """Parse complete lines (``data`` ends with a newline). Returns (data, nfields)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    nl = np.flatnonzero(buf == 10)
    line_start = np.concatenate(([0], nl[:-1] + 1))
    line_end = nl - (buf[np.maximum(nl - 1, 0)] == 13) * (nl > line_start)  # strip CR
    tabs = np.flatnonzero(buf == 9)
    ntabs = np.searchsorted(tabs, nl) - np.searchsorted(tabs, line_start)
    keep = line_end > line_start  # skip empty lines
    if nfields is None:
        if not keep.any():
            return _empty(rows, first_line), 0
        nfields = int(ntabs[np.argmax(keep)]) + 1
        if nfields not in (NUM_DENSE + NUM_SPARSE + 1, NUM_DENSE + NUM_SPARSE):
            raise CriteoFormatError(f"{where}:{first_line + int(np.argmax(keep)) + 1}: {nfields} fields, "
                                    f"expected 40 (label, I1..I13, C1..C26) or 39 (no label)")
    wrong = keep & (ntabs != nfields - 1)
    if wrong.any():
        i = int(np.argmax(wrong))
        raise CriteoFormatError(f"{where}:{first_line + i + 1}: {int(ntabs[i]) + 1} fields, expected {nfields}")
    line_no = first_line + np.flatnonzero(keep)
    line_start, line_end = line_start[keep], line_end[keep]
    n = line_start.size
    if n == 0:
        return _empty(rows, first_line), nfields
    # all tabs belong to kept lines (empty lines have none), in order
    t = tabs.reshape(n, nfields - 1)
    starts = np.column_stack((line_start, t + 1))  # int64 (n, nfields): each field's first byte
    lengths = np.column_stack((t, line_end)) - starts
    has_label = nfields == NUM_DENSE + NUM_SPARSE + 1
    o = 1 if has_label else 0

    ints, bad_i = _decode_dec(buf, starts[:, :o + NUM_DENSE], lengths[:, :o + NUM_DENSE])
    cats, bad_c = _decode_digits(buf, starts[:, o + NUM_DENSE:], lengths[:, o + NUM_DENSE:], _HEX, 16, np.uint64, 8)
    bad = bad_i.any(axis=1) | bad_c.any(axis=1)
    if has_label:
        lab = ints[:, 0]
        bad |= (lengths[:, 0] == 0) | ((lab != 0) & (lab != 1))
    if bad.any():
        i = int(np.argmax(bad))
        raise CriteoFormatError(f"{where}:{int(line_no[i]) + 1}: a field is not a label 0/1, an integer "
                                f"or 1..8 hex digits")
    labels = ints[:, 0].astype(np.float32) if has_label else np.full(n, np.nan, dtype=np.float32)
    dense = np.log1p(np.maximum(ints[:, o:], 0).astype(np.float64)).astype(np.float32)
    cats = np.where(lengths[:, o + NUM_DENSE:] == 0, np.uint64(MISSING_CAT), cats)
    sparse = np.empty((n, NUM_SPARSE), dtype=np.uint64)
    for j in range(NUM_SPARSE):  # per column (26), vectorised over rows
        sparse[:, j] = hash_categorical(j, cats[:, j], rows[j])
    return CriteoData(labels, dense, sparse, rows, int(line_no[0])), nfields


def _empty(rows: tuple[int, ...], first_line: int) -> CriteoData:
    return CriteoData(np.empty(0, np.float32), np.empty((0, NUM_DENSE), np.float32),
                      np.empty((0, NUM_SPARSE), np.uint64), rows, first_line)


#: compressed formats by magic bytes: (name, leading bytes, stdlib module that reads it or None, command)
_COMPRESSED = (("gzip", b"\x1f\x8b", gzip, "gunzip"), ("bzip2", b"BZh", bz2, "bunzip2"),
               ("xz", b"\xfd7zXZ\x00", lzma, "unxz"), ("zstd", b"\x28\xb5\x2f\xfd", None, "unzstd"),
               ("zip", b"PK\x03\x04", None, "unzip"))
_DECODE_ERRORS = (EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile)


def open_data(path: str | os.PathLike) -> io.BufferedIOBase:
    """Open a Criteo file for binary reading, decompressing what the standard library reads.

    The format is told by the file's first bytes, not its name: gzip (``.gz``, as Kaggle's
    ``dac.tar.gz`` and the Criteo 1TB logs ship), bzip2 and xz are decompressed as they are
    read (streaming, bounded memory); zstd and zip are named, with the command that unpacks
    them. A tar archive (inside gzip or not) is named too: its members must be extracted.

    Raises:
        OSError: the file cannot be opened.
        CriteoFormatError: a compressed format the standard library does not read, a tar
            archive, or a file that is not text (a NUL byte in its first 4 KiB).
    """
    where = os.fspath(path)
    with open(path, "rb") as raw:
        head = raw.read(8)
    kind, module = "", None
    for name, magic, mod, cmd in _COMPRESSED:
        if head.startswith(magic):
            if mod is None:
                raise CriteoFormatError(f"{where} is {name}-compressed; decompress it first "
                                        f"({cmd} {where}) and pass the TSV as --data")
            kind, module = f"{name}-compressed ", mod
            break
    f = module.open(path, "rb") if module is not None else open(path, "rb")
    try:
        peek = _read(f, 4096, where)
        f.seek(0)
        if peek[257:262] == b"ustar":
            raise CriteoFormatError(f"{where} is a {kind}tar archive; extract it first (tar xf {where}) and pass "
                                    "train.txt as --data")
        if peek.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            raise CriteoFormatError(f"{where} is {kind}UTF-16 text (it starts with a UTF-16 byte-order mark); a Criteo "
                                    f"TSV is ASCII: convert it (iconv -f UTF-16 -t UTF-8 {where} > train.txt)")
        if b"\x00" in peek:
            raise CriteoFormatError(f"{where} is {kind}binary data, not a Criteo TSV (tab-separated text)")
        return f
    except BaseException:
        f.close()
        raise


def _read(f, n: int, where: str) -> bytes:
    """``f.read(n)``, a corrupt or truncated compressed stream as :class:`CriteoFormatError`."""
    try:
        return f.read(n)
    except _DECODE_ERRORS as e:
        raise CriteoFormatError(f"{where}: corrupt or truncated compressed data ({e})") from None


def iter_criteo(path: str | os.PathLike, *, rows: int | None | Sequence[int | None] = 65536,
                batch_lines: int = 65536,
                skip_rows: int = 0, max_rows: int | None = None,
                chunk_bytes: int = 16 << 20) -> Iterator[CriteoData]:
    """Stream a Criteo TSV file as blocks of at most ``batch_lines`` samples.

    Args:
        path: a ``train.txt``-style (40 fields) or ``test.txt``-style (39 fields) file, plain
            or gzip/bzip2/xz-compressed (:func:`open_data`).
        rows: id-space size of every categorical table, or 26 sizes; None (all or one):
            full 64-bit hashed ids, not folded (:func:`hash_categorical`).
        batch_lines: lines per yielded block (empty lines are skipped, so a block may be
            shorter).
        skip_rows: lines to skip at the start of the file.
        max_rows: stop after this many lines (after ``skip_rows``); None reads to the end.
        chunk_bytes: bytes read from the file at a time (bounds memory with ``batch_lines``).

    Yields:
        :class:`CriteoData` blocks in file order.

    Raises:
        OSError: the file cannot be read.
        CriteoFormatError: a line is malformed (the message names file and line number), or
            the file is not a (readable) TSV (:func:`open_data`: compressed in a format it
            names, an archive, binary; corrupt compressed data).
    """
    r = _rows_tuple(rows)
    where = os.fspath(path)
    nfields: int | None = None
    line = 0  # 0-based number of the next line in the file
    remaining = math.inf if max_rows is None else int(max_rows)
    to_skip = int(skip_rows)
    pending = b""
    with open_data(path) as f:
        eof = False
        first = True
        while not eof and remaining > 0:
            chunk = _read(f, chunk_bytes, where)
            if first:  # a UTF-8 byte-order mark (as editors on Windows save text) is no part of line 1
                first, chunk = False, chunk.removeprefix(codecs.BOM_UTF8)
            if not chunk:
                eof = True
                if not pending:
                    break
                data, pending = pending + b"\n", b""
            else:
                data = pending + chunk
                cut = data.rfind(b"\n") + 1
                data, pending = data[:cut], data[cut:]
                if not data:
                    continue
            buf = np.frombuffer(data, dtype=np.uint8)
            nl = np.flatnonzero(buf == 10)
            pos = 0
            if to_skip:
                k = min(to_skip, nl.size)
                to_skip -= k
                line += k
                pos = int(nl[k - 1]) + 1
                nl = nl[k:]
            for s in range(0, nl.size, batch_lines):
                take = min(batch_lines, nl.size - s, remaining)
                if take <= 0:
                    break
                end = int(nl[s + take - 1]) + 1
                block, nfields = _parse_block(data[pos:end], nfields, r, where, line)
                pos = end
                line += take
                remaining -= take
                if len(block):
                    yield block


def load_criteo(path: str | os.PathLike, *, rows: int | None | Sequence[int | None] = 65536, skip_rows: int = 0,
                max_rows: int | None = None, chunk_bytes: int = 16 << 20) -> CriteoData:
    """Read a Criteo TSV file (or a window of it) into one :class:`CriteoData`.

    Memory: about 264 bytes per sample (plus one chunk); bound it with ``max_rows`` on the
    full dataset, or stream with :func:`iter_criteo`.

    Args:
        path: the file (``sample_path()`` for the shipped sample).
        rows, skip_rows, max_rows, chunk_bytes: as in :func:`iter_criteo`.

    Raises:
        OSError: the file cannot be read.
        CriteoFormatError: a line is malformed (names file and line).
    """
    r = _rows_tuple(rows)
    blocks = list(iter_criteo(path, rows=r, skip_rows=skip_rows, max_rows=max_rows,
                              chunk_bytes=chunk_bytes, batch_lines=1 << 18))
    if not blocks:
        return _empty(r, int(skip_rows))
    return CriteoData(np.concatenate([b.labels for b in blocks]), np.concatenate([b.dense for b in blocks]),
                      np.concatenate([b.sparse for b in blocks]), r, blocks[0].first_line)


def feature_tables(cfg, n_features: int) -> list[int]:
    """Table id of every sparse feature (column ``C{j+1}``, j in 0..n_features-1): the table named
    ``C{j+1}`` if the config has one, else the ``j mod T``-th table in config order (features
    then share tables). What every trainer and the planner use.

    Args:
        cfg: a :class:`~embnic.client_lib.config.ClusterConfig` (its ``tables``, T ≥ 1).
        n_features: F.

    Returns:
        F table ids (ints).
    """
    by_name = {t.name: t.id for t in cfg.tables}
    return [by_name.get(f"C{j + 1}", cfg.tables[j % len(cfg.tables)].id) for j in range(n_features)]
