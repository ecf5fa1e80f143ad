"""Trained tables in and out of the shards' directories (``embnic tables export|import``).

Files are **safetensors** (https://huggingface.co/docs/safetensors), written here with numpy alone,
tensors in name order and the header padded to 8 bytes, so the same tables always give the same
bytes; the two layouts (``torchrec``: ``embedding_bags.<name>.weight``, every row; ``ids``:
``tables.<name>.ids``/``.weight``/``.acc``, the updated rows) and their metadata are in
docs/server.md, "Tables in and out". Export reads every shard's directory as a restart would
(:func:`~embnic.testbed.server.durability.load_shard_stores`) and streams: every table's rows
merged across the shards in id order, :data:`CHUNK_ROWS` at a time, written at their offsets (a
disk table is never held whole). Import writes each shard a checkpoint of the rows it owns that
differ from their initial value, so export → import → export gives the same bytes.
"""
from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import numpy as np

from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.routing import owns
from embnic.client_lib.table_numerics import init_rows

from . import durability as D
from .stores import open_tables

FORMAT = "embnic-tables"
LAYOUTS = ("torchrec", "ids")
MAX_DENSE_BYTES = 8 << 30  #: largest whole table the torchrec layout writes (bytes); beyond it: ids
_DT = {np.dtype("<f4"): "F32", np.dtype("<u8"): "U64", np.dtype("<f2"): "F16"}
_NP = {v: k for k, v in _DT.items()}


class TablesFileError(Exception):
    """A tables file that is not one, or does not fit the cluster config."""


CHUNK_ROWS = 1 << 16  #: rows per piece of a streamed export


def safetensors_header(specs: dict[str, tuple[np.dtype, tuple[int, ...]]], metadata: dict[str, str]
                       ) -> tuple[bytes, dict[str, int]]:
    """The header of a safetensors file holding tensors ``specs`` (name → (dtype, shape)), tensors
    in name order: (the bytes up to the data — length and padded JSON —, name → offset of its
    data in the file)."""
    header: dict = {"__metadata__": dict(sorted(metadata.items()))}
    off = 0
    for n in sorted(specs):
        dt, shape = specs[n]
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
        header[n] = {"dtype": _DT[np.dtype(dt).newbyteorder("<")], "shape": list(shape),
                     "data_offsets": [off, off + nbytes]}
        off += nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    head = len(h).to_bytes(8, "little") + h
    return head, {n: len(head) + header[n]["data_offsets"][0] for n in sorted(specs)}


def load_safetensors(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors, metadata) of a safetensors file (F32, F16, U64 tensors).

    Every length in the file is checked against the file before any of it is used, so a
    truncated or damaged file is named as such rather than failing deep inside numpy.

    Raises:
        TablesFileError: not a (complete) safetensors file, or a dtype this project does not use.
        OSError: the file cannot be read.
    """
    data = Path(path).read_bytes()

    def bad(why: str) -> TablesFileError:
        return TablesFileError(f"{path} is not a complete safetensors file ({why})")

    if len(data) < 8:
        raise bad(f"{len(data)} bytes; it starts with an 8-byte header length")
    n = int.from_bytes(data[:8], "little")
    if 8 + n > len(data):
        raise bad(f"its header length says {n} bytes of JSON header, the file has {len(data) - 8} after the "
                  "length: truncated?")
    try:
        header = json.loads(data[8:8 + n])
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"the header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    meta = header.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict):
        raise bad("__metadata__ is not a JSON object")
    out = {}
    base = 8 + n
    have = len(data) - base
    for name, d in header.items():
        if not isinstance(d, dict):
            raise bad(f"tensor {name}: not a JSON object")
        if d.get("dtype") not in _NP:
            raise TablesFileError(f"{path}: tensor {name}: dtype {d.get('dtype')} (F32, F16 or U64 expected)")
        dt = _NP[d["dtype"]]
        shape, offs = d.get("shape"), d.get("data_offsets")
        if not (isinstance(shape, list) and all(isinstance(x, int) and x >= 0 for x in shape)):
            raise bad(f"tensor {name}: shape {shape!r} is not a list of sizes")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(x, int) for x in offs)
                and 0 <= offs[0] <= offs[1]):
            raise bad(f"tensor {name}: data_offsets {offs!r} are not [begin, end]")
        a, b = offs
        if b > have:
            raise bad(f"tensor {name} ends at byte {b} of the data, the file holds {have} bytes of data: truncated?")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if b - a != count * dt.itemsize:
            raise bad(f"tensor {name}: {b - a} bytes for shape {tuple(shape)} of {d['dtype']} "
                      f"({count * dt.itemsize} expected)")
        out[name] = np.frombuffer(data, dt, count, base + a).reshape(shape)
    return out, meta


def _meta(cfg: ClusterConfig, layout: str) -> dict[str, str]:
    return {"format": FORMAT, "layout": layout, "seed": str(cfg.seed),
            "tables": json.dumps([{"id": t.id, "name": t.name, "dim": t.dim, "rows": t.rows,
                                   "optimizer": t.optimizer} for t in cfg.tables])}


def _chunks(ts, chunk_rows: int):
    """One shard's rows of one table in id order, ``chunk_rows`` at a time."""
    if hasattr(ts, "iter_state"):
        yield from ts.iter_state(chunk_rows)
        return
    k, r, a = ts.state()
    for lo in range(0, k.size, chunk_rows):
        yield k[lo:lo + chunk_rows], r[lo:lo + chunk_rows], a[lo:lo + chunk_rows]


def merge_sorted(streams: list, table_id: int):
    """Merge streams of ``(keys, rows, acc)`` chunks, each in strictly increasing key order and
    holding keys no other stream holds (one per shard), into chunks in key order.

    Each round takes, from every stream with rows left, the rows up to the smallest of their
    current chunks' last keys (rows above it may still come after rows of another stream): one
    sort of at most ``streams × chunk`` rows.

    Raises:
        ValueError: a key in two streams (two shards hold the same row).
    """
    its = [(c for c in s if c[0].size) for s in streams]  # empty chunks skipped
    bufs = [next(it, None) for it in its]  # each stream's rows not merged yet; None: it has no more
    while any(b is not None for b in bufs):
        live = [i for i, b in enumerate(bufs) if b is not None]
        bound = min(bufs[i][0][-1] for i in live)
        parts = []
        for i in live:
            k, r, a = bufs[i]
            n = int(np.searchsorted(k, bound, side="right"))
            parts.append((k[:n], r[:n], a[:n]))
            bufs[i] = (k[n:], r[n:], a[n:]) if n < k.size else next(its[i], None)
        k = np.concatenate([p[0] for p in parts])
        order = np.argsort(k, kind="stable")
        k = k[order]
        if k.size > 1 and not bool(np.all(k[1:] > k[:-1])):
            raise ValueError(f"table {table_id}: a key is held by more than one shard")
        yield k, np.concatenate([p[1] for p in parts])[order], np.concatenate([p[2] for p in parts])[order]


def export_tables(cfg: ClusterConfig, directory, out: str | Path, layout: str | None = None,
                  chunk_rows: int = CHUNK_ROWS) -> dict:
    """Write the tables held in the shards' ``directory`` to ``out``, streaming (module docstring).

    Args:
        layout: ``"torchrec"``, ``"ids"``, or None: torchrec when every table has ``rows`` and
            fits :data:`MAX_DENSE_BYTES` as a dense weight, else ids.
        chunk_rows: rows per piece read, merged and written.

    Returns:
        ``{"layout", "tables": {name: rows written}}``.

    Raises:
        TablesFileError: ``torchrec`` asked for a table without ``rows`` or larger than
            :data:`MAX_DENSE_BYTES`; a shard directory missing.
    """
    if layout is None:
        layout = "torchrec" if all(t.rows is not None and t.rows * t.dim * 4 <= MAX_DENSE_BYTES
                                   for t in cfg.tables) else "ids"
    if layout not in LAYOUTS:
        raise TablesFileError(f"unknown layout {layout!r} ({', '.join(LAYOUTS)})")
    if layout == "torchrec":
        for t in cfg.tables:
            if t.rows is None:
                raise TablesFileError(f"table {t.name} (id {t.id}) has no rows in the config: a TorchRec weight "
                                      "needs a row count; export it with --layout ids")
            if t.rows * t.dim * 4 > MAX_DENSE_BYTES:
                raise TablesFileError(f"table {t.name} (id {t.id}): {t.rows} x {t.dim} float32 is "
                                      f"{t.rows * t.dim * 4 / 2**30:.0f} GiB as a dense TorchRec weight (limit "
                                      f"{MAX_DENSE_BYTES >> 30} GiB); export the updated rows with --layout ids")
    missing = [f"shard-{s.id}" for s in cfg.shards if not D.shard_dir(directory, s.id).is_dir()]
    if missing:
        raise TablesFileError(f"{directory} has no {', '.join(missing)} "
                              f"{'directory' if len(missing) == 1 else 'directories'}: give --from the directory "
                              "the shards ran with --checkpoint-dir (or filled by `embnic tables import`); "
                              "exporting would write those shards' initial rows")
    shards = []
    try:
        for s in cfg.shards:
            shards.append(D.load_shard_stores(directory, s.id, cfg)[0])
        specs, info = {}, {}
        for t in cfg.tables:
            if layout == "torchrec":
                specs[f"embedding_bags.{t.name}.weight"] = (np.dtype("<f4"), (t.rows, t.dim))
                info[t.name] = t.rows
            else:
                m = sum(len(st.tables[t.id]) for st in shards)
                specs[f"tables.{t.name}.ids"] = (np.dtype("<u8"), (m,))
                specs[f"tables.{t.name}.weight"] = (np.dtype("<f4"), (m, t.dim))
                specs[f"tables.{t.name}.acc"] = (np.dtype("<f4"), (m,))
                info[t.name] = m
        head, offs = safetensors_header(specs, _meta(cfg, layout))
        with open(out, "wb") as f:
            f.write(head)
            for t in cfg.tables:
                merged = merge_sorted([_chunks(st.tables[t.id], chunk_rows) for st in shards], t.id)
                if layout == "torchrec":
                    _write_dense(f, offs[f"embedding_bags.{t.name}.weight"], cfg, t, merged, chunk_rows)
                else:
                    _write_ids(f, offs, t, merged, info[t.name])
    finally:
        for st in shards:
            st.close()
    return {"layout": layout, "tables": info}


def _write_ids(f, offs: dict, t, merged, m: int) -> None:
    """The ids layout of table ``t``: ids, weight and acc, each piece at its place."""
    at = 0
    for k, r, a in merged:
        if at + k.size > m:
            raise TablesFileError(f"table {t.name}: more rows than the shards counted ({m}): a store changed while "
                                  "it was exported")
        os.pwrite(f.fileno(), k.astype("<u8").tobytes(), offs[f"tables.{t.name}.ids"] + 8 * at)
        os.pwrite(f.fileno(), r.astype("<f4").tobytes(), offs[f"tables.{t.name}.weight"] + 4 * t.dim * at)
        os.pwrite(f.fileno(), a.astype("<f4").tobytes(), offs[f"tables.{t.name}.acc"] + 4 * at)
        at += k.size
    if at != m:
        raise TablesFileError(f"table {t.name}: {at} rows read, the shards counted {m}")


def _write_dense(f, off: int, cfg: ClusterConfig, t, merged, chunk_rows: int) -> None:
    """The torchrec layout of table ``t``: every row, initial values slice by slice with the updated
    rows of the slice (the merged stream, in id order) laid over them."""
    k, r = np.empty(0, np.uint64), np.empty((0, t.dim), np.float32)  # updated rows not laid over yet
    for lo in range(0, t.rows, chunk_rows):
        hi = min(t.rows, lo + chunk_rows)
        w = init_rows(cfg.seed, t.id, np.arange(lo, hi, dtype=np.uint64), t.dim, t.init_scale)
        while True:
            n = int(np.searchsorted(k, np.uint64(hi)))
            w[k[:n].astype(np.int64) - lo] = r[:n]
            k, r = k[n:], r[n:]
            if k.size or (nxt := next(merged, None)) is None:
                break
            k, r, _ = nxt
        os.pwrite(f.fileno(), w.astype("<f4").tobytes(), off + 4 * t.dim * lo)


def import_tables(cfg: ClusterConfig, path: str | Path, directory) -> dict:
    """Initialise every shard's directory under ``directory`` from a tables file: each shard gets
    a checkpoint of the rows it owns (``embnic server --restore DIRECTORY`` serves them).

    Rows equal to their initial value are not stored (they need no storage).

    Returns:
        ``{"layout", "rows": {shard id: rows written}}``.

    Raises:
        TablesFileError: not an embnic tables file, or its tables do not fit the config (name,
            dim, rows), or a shard directory already holds a checkpoint or log.
        StoreSetupError: a disk table and the disk tier cannot start (``rocksdict`` missing).
    """
    tensors, meta = load_safetensors(path)
    layout = meta.get("layout")
    if meta.get("format") != FORMAT and not any(n.startswith("embedding_bags.") for n in tensors):
        raise TablesFileError(f"{path}: neither an {FORMAT} file nor a TorchRec state dict")
    if layout is None:
        layout = "torchrec"
    per_table = {}
    for t in cfg.tables:
        if layout == "torchrec":
            w = tensors.get(f"embedding_bags.{t.name}.weight")
            if w is None:
                raise TablesFileError(f"{path}: no embedding_bags.{t.name}.weight for table {t.name}")
            if t.rows is None or w.shape != (t.rows, t.dim):
                raise TablesFileError(f"{path}: embedding_bags.{t.name}.weight has shape {tuple(w.shape)}, the config's "
                                      f"table {t.name} is ({t.rows}, {t.dim})")
            keys = np.arange(t.rows, dtype=np.uint64)
            init = init_rows(cfg.seed, t.id, keys, t.dim, t.init_scale)
            changed = np.flatnonzero((w.astype(np.float32) != init).any(axis=1))
            k, r, a = keys[changed], w[changed].astype(np.float32), np.zeros(changed.size, np.float32)
        else:
            try:
                k, r, a = (tensors[f"tables.{t.name}.{x}"] for x in ("ids", "weight", "acc"))
            except KeyError as e:
                raise TablesFileError(f"{path}: no tensor {e.args[0]} for table {t.name}") from None
            if r.shape != (k.size, t.dim) or a.shape != (k.size,):
                raise TablesFileError(f"{path}: table {t.name}: shapes ids {k.shape}, weight {r.shape}, acc {a.shape} "
                                      f"do not fit dim {t.dim}")
            if t.rows is not None and k.size and int(k.max()) >= t.rows:
                raise TablesFileError(f"{path}: table {t.name}: id {int(k.max())} >= rows {t.rows}")
        per_table[t.id] = (k, r, a)
    written = {}
    for s in cfg.shards:
        d = D.shard_dir(directory, s.id)
        if D.restorable(d):
            raise TablesFileError(f"{d} already holds a checkpoint or log: import into an empty directory")
        stores = open_tables(cfg, s.id, scratch=True)  # a disk table's rows go to a RocksDB snapshot
        try:
            tables = stores.tables
            n = 0
            for tid, (k, r, a) in per_table.items():
                mine = owns(cfg, tid, s.id, k) if k.size else np.zeros(0, bool)
                try:
                    tables[tid].load_state(k[mine], r[mine], a[mine])
                except ValueError as e:
                    raise TablesFileError(f"{path}: {e}") from None
                n += int(mine.sum())
            D.write_checkpoint(d, s.id, 0, cfg.seed, tables, collections.OrderedDict())
        finally:
            stores.close()
        written[s.id] = n
    return {"layout": layout, "rows": written}
