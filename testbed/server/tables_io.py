"""Trained tables in and out of the shards' directories (``embnic tables export|import``).

Files are **safetensors** (https://huggingface.co/docs/safetensors: an 8-byte little-endian
header length, a JSON header naming each tensor's dtype, shape and byte range, then the raw
little-endian data), written here with numpy alone, tensors in name order and the header padded
to 8 bytes, so the same tables always give the same bytes. Two layouts:

``torchrec`` (every table has ``rows``)
    ``embedding_bags.<table name>.weight``: float32 (rows, dim), the whole table (rows never
    updated hold their initial values) — the state dict of a TorchRec
    ``EmbeddingBagCollection`` whose ``EmbeddingBagConfig`` names are the config's table names::

        from safetensors.torch import load_file
        ebc.load_state_dict(load_file("tables.safetensors"))

    Optimizer state is not part of it: an import starts every row's Adagrad accumulator at 0.

``ids`` (any tables, including collision-free ones without ``rows``)
    the rows that were updated, by full uint64 id: ``tables.<name>.ids`` uint64 (M,) strictly
    increasing, ``tables.<name>.weight`` float32 (M, dim), ``tables.<name>.acc`` float32 (M,)
    (row-wise Adagrad accumulators, zeros for SGD). Every other id holds its initial value, a
    function of (seed, table, id) (:func:`~embnic.client_lib.table_numerics.init_rows`).

Both carry ``__metadata__``: ``format`` (``embnic-tables``), ``layout``, ``seed`` and
``tables`` (JSON: id, name, dim, rows, optimizer). Export reads every shard's directory as a
restart would (latest checkpoint + log, :func:`~embnic.testbed.server.durability.load_shard_state`);
import writes each shard a checkpoint of the rows it owns, which ``embnic server --restore DIR``
serves. An import stores only rows that differ from their initial value, so export → import →
export gives the same bytes.
"""
from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np

from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.routing import owns
from embnic.client_lib.table_numerics import TableShard, init_rows, merge_states

from . import durability as D

FORMAT = "embnic-tables"
LAYOUTS = ("torchrec", "ids")
MAX_DENSE_BYTES = 8 << 30  #: largest whole table the torchrec layout writes (bytes); beyond it: ids
_DT = {np.dtype("<f4"): "F32", np.dtype("<u8"): "U64", np.dtype("<f2"): "F16"}
_NP = {v: k for k, v in _DT.items()}


class TablesFileError(Exception):
    """A tables file that is not one, or does not fit the cluster config."""


def save_safetensors(path: str | Path, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """Write ``tensors`` (float32 / float16 / uint64 arrays) as a safetensors file, deterministically."""
    header: dict = {"__metadata__": dict(sorted(metadata.items()))}
    off = 0
    names = sorted(tensors)
    for n in names:
        a = tensors[n]
        header[n] = {"dtype": _DT[a.dtype.newbyteorder("<")], "shape": list(a.shape),
                     "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for n in names:
            f.write(np.ascontiguousarray(tensors[n]).astype(tensors[n].dtype.newbyteorder("<"), copy=False).tobytes())


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


def gather(cfg: ClusterConfig, directory) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Every shard's updated rows from ``directory`` (as a restart would see them), merged:
    ``{table_id: (keys uint64 (M,), rows float32 (M, dim), acc float32 (M,))}``.

    Raises:
        TablesFileError: ``directory`` lacks a shard's ``shard-<id>`` directory (not where the
            shards ran: its rows would be exported as the initial ones).
    """
    missing = [f"shard-{s.id}" for s in cfg.shards if not D.shard_dir(directory, s.id).is_dir()]
    if missing:
        raise TablesFileError(f"{directory} has no {', '.join(missing)} "
                              f"{'directory' if len(missing) == 1 else 'directories'}: give --from the directory "
                              "the shards ran with --checkpoint-dir (or filled by `embnic tables import`); "
                              "exporting would write those shards' initial rows")
    states = []
    for s in cfg.shards:
        tables, _ = D.load_shard_state(directory, s.id, cfg)
        states.append({tid: ts.state() for tid, ts in tables.items()})
    return merge_states(states)


def export_tables(cfg: ClusterConfig, directory, out: str | Path, layout: str | None = None) -> dict:
    """Write the tables held in the shards' ``directory`` to ``out``.

    Args:
        layout: ``"torchrec"``, ``"ids"``, or None: torchrec when every table has ``rows`` and
            fits :data:`MAX_DENSE_BYTES` as a dense weight, else ids.

    Returns:
        ``{"layout", "tables": {name: rows written}}``.

    Raises:
        TablesFileError: ``torchrec`` asked for a table without ``rows`` or larger than
            :data:`MAX_DENSE_BYTES`.
    """
    if layout is None:
        layout = "torchrec" if all(t.rows is not None and t.rows * t.dim * 4 <= MAX_DENSE_BYTES
                                   for t in cfg.tables) else "ids"
    if layout not in LAYOUTS:
        raise TablesFileError(f"unknown layout {layout!r} ({', '.join(LAYOUTS)})")
    st = gather(cfg, directory)
    tensors: dict[str, np.ndarray] = {}
    info = {}
    for t in cfg.tables:
        k, r, a = st.get(t.id, (np.empty(0, np.uint64), np.empty((0, t.dim), np.float32), np.empty(0, np.float32)))
        if layout == "torchrec":
            if t.rows is None:
                raise TablesFileError(f"table {t.name} (id {t.id}) has no rows in the config: a TorchRec weight "
                                      "needs a row count; export it with --layout ids")
            if t.rows * t.dim * 4 > MAX_DENSE_BYTES:
                raise TablesFileError(f"table {t.name} (id {t.id}): {t.rows} x {t.dim} float32 is "
                                      f"{t.rows * t.dim * 4 / 2**30:.0f} GiB as a dense TorchRec weight (limit "
                                      f"{MAX_DENSE_BYTES >> 30} GiB); export the updated rows with --layout ids")
            w = np.empty((t.rows, t.dim), np.float32)
            for lo in range(0, t.rows, 1 << 16):  # initial values in slices (bounded temporary memory)
                hi = min(t.rows, lo + (1 << 16))
                w[lo:hi] = init_rows(cfg.seed, t.id, np.arange(lo, hi, dtype=np.uint64), t.dim, t.init_scale)
            w[k.astype(np.int64)] = r
            tensors[f"embedding_bags.{t.name}.weight"] = w
            info[t.name] = t.rows
        else:
            tensors[f"tables.{t.name}.ids"] = k
            tensors[f"tables.{t.name}.weight"] = r
            tensors[f"tables.{t.name}.acc"] = a
            info[t.name] = int(k.size)
    save_safetensors(out, tensors, _meta(cfg, layout))
    return {"layout": layout, "tables": info}


def import_tables(cfg: ClusterConfig, path: str | Path, directory) -> dict:
    """Initialise every shard's directory under ``directory`` from a tables file: each shard gets
    a checkpoint of the rows it owns (``embnic server --restore DIRECTORY`` serves them).

    Rows equal to their initial value are not stored (they need no storage).

    Returns:
        ``{"layout", "rows": {shard id: rows written}}``.

    Raises:
        TablesFileError: not an embnic tables file, or its tables do not fit the config (name,
            dim, rows), or a shard directory already holds a checkpoint or log.
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
        if D._files(d, D._CKPT) or D._files(d, D._WAL):
            raise TablesFileError(f"{d} already holds a checkpoint or log: import into an empty directory")
        tables = {t.id: TableShard(t, cfg.seed, capacity=64) for t in cfg.tables}
        n = 0
        for tid, (k, r, a) in per_table.items():
            mine = owns(cfg, tid, s.id, k) if k.size else np.zeros(0, bool)
            try:
                tables[tid].load_state(k[mine], r[mine], a[mine])
            except ValueError as e:
                raise TablesFileError(f"{path}: {e}") from None
            n += int(mine.sum())
        D.write_checkpoint(d, s.id, 0, cfg.seed, tables, collections.OrderedDict())
        written[s.id] = n
    return {"layout": layout, "rows": written}
