"""Embedding-table numerics: row initialisation, SGD and row-wise Adagrad, the wire's rounding and
the rules an update must pass.

The one home of every computation that produces a row value, shared by the parameter-server
shards and the in-process reference (:class:`embnic.client_lib.local.LocalBackend`) through
:class:`~embnic.client_lib.rowstore.RowStore`: the same code on the same float32 values in the same
order, so a table trained through UDP shards and in process are **bit-identical**. The optimizer
step runs in C (``client_lib/csrc/store.c``, the package's client library: :func:`store_lib`,
built with ``-ffp-contract=off``), in numpy's float32 order; its numpy twin is the test oracle
``tests/client_lib/numpy_rowstore.py``, compared bit for bit.

Optimizers (row-wise, one row's result never depends on another row)
    * ``sgd``: ``w -= lr * g``.
    * ``adagrad``: row-wise Adagrad as FBGEMM's ``OptimType.EXACT_ROWWISE_ADAGRAD``
      (TorchRec's default for embedding tables; FBGEMM ``fbgemm_gpu`` ``split_table_batched_
      embeddings_ops_training.py`` and the kernel template in
      ``fbgemm_gpu/codegen/genscript/optimizers.py::rowwise_adagrad``)::

          acc[r] += mean_j(g[r, j] ** 2)                  # one accumulator per row
          multiplier[r] = lr / (sqrt(acc[r]) + eps)
          w[r, :] -= multiplier[r] * g[r, :]

      The mean is summed column by column, left to right, in float32 (a loop over ``dim``
      vectorised over rows) so the result for a row never depends on how many rows are in the
      batch (numpy's ``sum(axis=1)`` may pick pairwise or sequential order by array shape).

Master rows and accumulators are float32; ``dtype = "fp16"`` is the *wire* type
(:func:`wire_round`).
"""
from __future__ import annotations

import ctypes
import math

import numpy as np

from . import clib, consts
from .batch import as_ids
from .config import FLOAT32_MAX, TableConfig
from .splitmix import splitmix64, u64 as _u64


def init_rows(seed: int, table_id: int, keys: np.ndarray, dim: int, scale: float) -> np.ndarray:
    """Initial values of rows ``keys`` of table ``table_id``: uniform in ``[-scale, scale)``.

    A pure function of (seed, table, key, column), independent of the number of shards::

        t      = splitmix64(seed ^ splitmix64(table_id))           # per table
        h[k]   = splitmix64(key ^ t)                               # per row
        c[j]   = splitmix64(0x5EED0000_00000000 + j)               # per column
        u[k,j] = (splitmix64(h[k] ^ c[j]) >> 40) / 2^24            # 24 bits, exact in float32
        w[k,j] = float32(2 * u - 1) * float32(scale)

    Args:
        seed: cluster seed (``[cluster] seed``), 0..2^63-1.
        table_id: table id.
        keys: uint64 (N,).
        dim: values per row.
        scale: half-width of the interval (``init_scale``).

    Returns:
        float32 (N, dim), C-contiguous: computed in C (``embnic_init_rows``, the rule's one
        implementation; its numpy oracle is ``tests/client_lib/numpy_rowstore.py``).
    """
    t = splitmix64(_u64(seed) ^ splitmix64(_u64(table_id)))
    return initial_rows(keys, t, np.float32([scale]), np.array([dim], np.int64)).reshape(-1, dim)


def initial_rows(keys: np.ndarray, tinit: np.ndarray, scale: np.ndarray, dims: np.ndarray) -> np.ndarray:
    """:func:`init_rows` of rows of several tables at once, flat: float32 (Σ dims,), row after row.

    Args:
        keys: uint64 (N,).
        tinit: uint64, each row's table hash ``splitmix64(seed ^ splitmix64(table_id))``.
        scale: float32, each row's ``init_scale``.
        dims: int64, each row's dim. ``tinit``, ``scale`` and ``dims``: (N,), or (1,) for every row.
    """
    keys = np.ascontiguousarray(keys, np.uint64).reshape(-1)
    tinit, scale, dims = (np.ascontiguousarray(a, t).reshape(-1) for a, t in
                          ((tinit, np.uint64), (scale, np.float32), (dims, np.int64)))
    per_row = int(tinit.size == keys.size and tinit.size != 1)
    out = np.empty(int(dims.sum()) if per_row else keys.size * int(dims[0]), np.float32)
    if keys.size:
        store_lib().embnic_init_rows(keys.ctypes.data, keys.size, tinit.ctypes.data, scale.ctypes.data,
                                     dims.ctypes.data, per_row, out.ctypes.data)
    return out


def exclusive_cumsum(counts: np.ndarray) -> np.ndarray:
    """int64 (N,): ``[0, c0, c0+c1, ...]`` of int (N,) ``counts``, without the total."""
    out = np.empty(counts.size, np.int64)
    if counts.size:
        out[0] = 0
        np.cumsum(counts[:-1], out=out[1:])
    return out


def wire_round(values: np.ndarray, dtype: int | str) -> np.ndarray:
    """What ``values`` become after a trip over the wire as ``dtype``, as float32.

    fp32 → unchanged (as float32); fp16 → rounded to nearest float16, widened back.

    Args:
        values: float array (N, dim).
        dtype: ``consts.DType`` or ``"fp32"``/``"fp16"``.

    Returns:
        float32 (N, dim) (a new array for fp16; possibly the input itself for fp32).
    """
    if isinstance(dtype, str):
        dtype = consts.DTYPE_BY_NAME[dtype]
    v = np.asarray(values, dtype=np.float32)
    if dtype == consts.DType.FP16:
        with np.errstate(over="ignore"):  # |x| > 65504 becomes inf, as on the wire
            return v.astype(np.float16).astype(np.float32)
    return v


def rowwise_mean_square(g: np.ndarray) -> np.ndarray:
    """``mean(g**2, axis=1)`` float32 (N,) of float32 (N, dim) ``g``, summed column by column left
    to right (a fixed order, so a row's result does not depend on the other rows in ``g``)."""
    return _column_sum_of_squares(g) / np.float32(g.shape[1])


def _column_sum_of_squares(g: np.ndarray) -> np.ndarray:
    s = np.zeros(g.shape[0], dtype=np.float32)
    for j in range(g.shape[1]):  # loop over columns, vectorised over rows
        col = g[:, j]
        s += col * col
    return s


def rowwise_mean_square_ragged(g: np.ndarray, dims: np.ndarray) -> np.ndarray:
    """:func:`rowwise_mean_square` of rows of different lengths, bit for bit.

    Args:
        g: float32 (E,), row ``r``'s ``dims[r]`` values one row after the other.
        dims: int64 (N,), ``dims.sum() == E``, each ≥ 1.

    Returns:
        float32 (N,): row ``r``'s mean square, summed column by column left to right as
        :func:`rowwise_mean_square` does (the rows are zero-padded to the longest: adding
        ``0 * 0`` to a non-negative float32 sum changes nothing).
    """
    n = dims.size
    width = int(dims.max()) if n else 0
    pad = np.zeros((n, width), np.float32)
    rows = np.repeat(np.arange(n), dims)
    cols = np.arange(g.size) - np.repeat(exclusive_cumsum(dims), dims)
    pad[rows, cols] = g
    return _column_sum_of_squares(pad) / dims.astype(np.float32)


class CStore(ctypes.Structure):
    """``struct embnic_store`` (``client_lib/csrc/store.h``): the row store's arrays as C reads and
    updates them, filled by :class:`~embnic.client_lib.rowstore.RowStore`; ``(io)`` fields (``d``,
    ``n``, ``e``, ``trows``' values) are moved by C. Pointers are addresses (0: none)."""

    _fields_ = [(f, ctypes.c_void_p if f.startswith("p_") else ctypes.c_int64) for f in (
        "p_ck", "p_cs", "p_ct", "m", "p_sample", "nsample", "step", "p_dck", "p_dcs", "p_dct", "d", "p_vals", "p_off",
        "dim", "p_tsalt", "p_tinit", "p_tscale", "ntables", "dcap", "n", "cap", "e", "ecap", "p_acc", "p_tdim",
        "p_tada", "p_tlr", "p_teps", "p_trows")]


_VP, _I64 = ctypes.c_void_p, ctypes.c_int64
_LIB: ctypes.CDLL | None = None


def store_lib() -> ctypes.CDLL:
    """The package's client library with the row store's functions bound (``client_lib/csrc/store.c``:
    ``embnic_store_apply``, ``embnic_store_find_many``, ``embnic_rows_step``, ``embnic_init_rows``),
    loaded and checked once.

    Raises:
        clib.NativeLibraryError: the library is missing, built from other sources or for another
            protocol, or its ``struct embnic_store`` differs from :class:`CStore` (one line naming
            the rebuild command).
    """
    global _LIB
    if _LIB is not None:
        return _LIB
    lib = clib.load(clib.CLIENT, consts.VERSION)
    for name, res, args in (("embnic_store_layout", None, [_VP]),
                            ("embnic_store_apply", _I64, [_VP, _VP, _I64, _VP, _I64, _VP, _I64, _VP, _VP]),
                            ("embnic_store_find_many", _I64, [_VP, _VP, _VP, _I64, _I64, _VP, _VP]),
                            ("embnic_rows_step", None, [_VP, _VP, _VP, _I64, _I64, _VP, _VP, _I64]),
                            ("embnic_init_rows", None, [_VP, _I64, _VP, _VP, _VP, _I64, _VP])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    lay = np.zeros(3, np.int64)
    lib.embnic_store_layout(lay.ctypes.data)
    want = [ctypes.sizeof(CStore), CStore.p_trows.offset, 16]
    if lay.tolist() != want:
        raise clib.NativeLibraryError(f"embnic: {clib.CLIENT.path}'s struct embnic_store {lay.tolist()} differs from "
                                      f"table_numerics.CStore's {want}: run {clib.REBUILD}")
    _LIB = lib
    return lib


def optimizer_step(w: np.ndarray, acc: np.ndarray | None, g: np.ndarray, lr, eps) -> np.ndarray | None:
    """One optimizer step on rows ``w`` in place: row-wise Adagrad when ``acc`` is given, else SGD
    (the formulas in the module docstring), in C (``embnic_rows_step``: the step
    :meth:`RowStore.apply <embnic.client_lib.rowstore.RowStore.apply>` runs) — what another row
    store (the shard's disk tier) calls, so their rows are bit-identical.

    Args:
        w: float32 (N, dim), the rows (changed in place).
        acc: float32 (N,) Adagrad accumulators (not changed), or None for SGD.
        g: float32 (N, dim) gradients that pass :func:`gradient_rows_ok` (not checked).
        lr, eps: float32 scalars, or float32 (N,) (one per row: rows of several tables).

    Returns:
        the new accumulators float32 (N,) (Adagrad), else None.

    Raises:
        ValueError: ``g`` or ``acc`` do not fit ``w``'s shape.
    """
    n, dim = w.shape
    rows = w if w.dtype == np.float32 and w.flags.c_contiguous else np.ascontiguousarray(w, np.float32)
    gg = np.ascontiguousarray(g, np.float32)
    if gg.shape != (n, dim) or (acc is not None and np.shape(acc) != (n,)):
        raise ValueError(f"optimizer_step: rows {w.shape}, gradients {np.shape(g)}, accumulators {np.shape(acc)}")
    per_row = np.ndim(lr) > 0 or np.ndim(eps) > 0
    lr_a = np.ascontiguousarray(np.broadcast_to(np.asarray(lr, np.float32), (n,) if per_row else ()))
    eps_a = np.ascontiguousarray(np.broadcast_to(np.asarray(eps, np.float32), (n,) if per_row else ()))
    new = None if acc is None else np.array(acc, np.float32)
    if n:
        store_lib().embnic_rows_step(rows.ctypes.data, 0 if new is None else new.ctypes.data, gg.ctypes.data, n, dim,
                                     lr_a.ctypes.data, eps_a.ctypes.data, int(per_row))
    if rows is not w:
        w[...] = rows
    return new


def table_label(table: TableConfig) -> str:
    """How every error message names a table: ``table 3 (C4)`` (id and config name)."""
    return f"table {table.id} ({table.name})"


def validate_keys(table: TableConfig, keys: np.ndarray, *, unique: bool = False) -> np.ndarray:
    """Check keys for ``table``; returns them as uint64 (N,). Vectorised: O(N), plus a sort when
    ``unique`` and the keys are not sorted.

    Raises:
        ValueError: naming the table (:func:`table_label`) and the problem — not 1-D integers,
            negative, a key ``>= table.rows`` when the table has ``rows`` (without it every
            uint64 is a key; the largest such key and how many there are), or a duplicate
            when ``unique`` (which key).
    """
    try:
        k = as_ids(keys)
    except ValueError as e:
        raise ValueError(f"{table_label(table)}: keys: {e}") from None
    if table.rows is not None and k.size:
        hi = int(k.max())
        if hi >= table.rows:
            n = int(np.count_nonzero(k >= np.uint64(table.rows)))
            raise ValueError(f"{table_label(table)}: key {hi} >= rows {table.rows} "
                             f"({n} of {k.size} keys out of range 0..{table.rows - 1})")
    if unique and k.size > 1 and not is_unique(k):
        s = np.sort(k)
        d = int(s[int(np.flatnonzero(s[1:] == s[:-1])[0])])
        raise ValueError(f"{table_label(table)}: duplicate key {d} in an update (send each key once, "
                         "with the sum of its gradients: np.unique(keys, return_inverse=True))")
    return k


def is_unique(keys: np.ndarray) -> bool:
    """True if ``keys`` (1-D) has no duplicates; O(N) when sorted, O(N log N) otherwise."""
    if keys.size < 2:
        return True
    if bool(np.all(keys[1:] > keys[:-1])):
        return True
    return np.unique(keys).size == keys.size


def validate_update(table: TableConfig, keys: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Check an update for ``table``; returns (keys uint64 (N,), grads float32 (N, dim)).
    Vectorised: O(N·dim).

    Raises:
        ValueError: naming the table and the problem — bad keys (see :func:`validate_keys`,
            uniqueness required), grads not real numbers of shape (N, table.dim), or a
            gradient the servers refuse (:func:`gradient_rows_ok`: NaN or inf after the wire's
            rounding — fp16 overflows above 65504 —, or a step that is not finite in float32;
            the first such key and how many rows).
    """
    k = validate_keys(table, keys, unique=True)
    g = np.asarray(grads)
    if g.dtype.kind not in "fiu":
        raise ValueError(f"{table_label(table)}: grads must be real numbers (float32), got dtype {g.dtype}")
    if g.shape != (k.size, table.dim):
        raise ValueError(f"{table_label(table)}: grads shape {g.shape}, expected ({k.size}, {table.dim}): "
                         f"one row of dim {table.dim} per key")
    with np.errstate(over="ignore"):  # a float64 beyond float32 becomes inf: refused below
        g = g.astype(np.float32, copy=False)
    ok = gradient_rows_ok(table, wire_round(g, table.dtype))
    if not ok.all():
        bad = np.flatnonzero(~ok)
        step = "its square" if table.optimizer == "adagrad" else "lr times it"
        raise ValueError(f"{table_label(table)}: non-finite gradient for key {int(k[bad[0]])} ({bad.size} of {k.size} "
                         f"rows: NaN or inf{' in fp16' if table.dtype == 'fp16' else ''}, "
                         f"or so large that {step} overflows float32)")
    return k, g


def gradient_rows_ok(table: TableConfig, g: np.ndarray) -> np.ndarray:
    """Per row of gradients float32 (N, dim) (as the server sees them: after the wire's
    rounding), whether the optimizer may apply it — the one statement of the refusal rule
    (docs/protocol.md, "Reliability"), used by both shard engines and :class:`LocalBackend`.

    A row is refused when a value is NaN or inf, or when the step it asks of the optimizer is
    not finite in float32: for SGD ``lr * g`` (a large ``lr`` times a large gradient), for
    Adagrad the row's mean square of ``g`` (the accumulator's increment: |g| above ~1.8e19),
    which would set the accumulator to inf and freeze the row forever. The rule reads the
    message and the table's config only, never the rows, so a client can check it before
    sending (:func:`validate_update`) and every shard, worker layout and log replay agrees.

    Cost: one ``max(|g|)`` when it is small enough that no row can fail (``2·dim·max² <
    FLT_MAX`` for Adagrad, ``|lr|·max·(1 + 2⁻²⁰) < FLT_MAX`` for SGD — sufficient conditions,
    with room for float32 rounding), else the per-row test (a per-row ``all`` over a short axis
    costs ~30 ns a row in numpy).

    Returns:
        bool (N,).
    """
    g = np.asarray(g, dtype=np.float32)
    if g.size:
        m = float(np.abs(g).max())  # NaN when any value is NaN
        if m < math.inf and (2.0 * g.shape[1] * m * m < FLOAT32_MAX if table.optimizer == "adagrad"
                             else abs(float(np.float32(table.lr))) * m * (1 + 2.0 ** -20) < FLOAT32_MAX):
            return np.ones(g.shape[0], dtype=bool)
    ok = np.isfinite(g).all(axis=1)
    if g.size:
        with np.errstate(over="ignore", invalid="ignore"):
            if table.optimizer == "adagrad":
                ok &= np.isfinite(rowwise_mean_square(g))
            else:
                ok &= np.isfinite(np.float32(table.lr) * g).all(axis=1)
    return ok


def merge_states(states: list[dict]) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Merge per-shard ``state_dict()`` results into one (keys sorted per table).

    Args:
        states: dicts ``{table_id: (keys, rows, acc)}``, e.g. one per server shard.

    Returns:
        ``{table_id: (keys uint64 (M,) sorted, rows float32 (M, dim), acc float32 (M,))}``.

    Raises:
        ValueError: a key appears in two states (two shards own the same row).
    """
    out = {}
    for tid in sorted({t for s in states for t in s}):
        parts = [s[tid] for s in states if tid in s]
        keys = np.concatenate([p[0] for p in parts])
        rows = np.concatenate([p[1] for p in parts])
        acc = np.concatenate([p[2] for p in parts])
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        if keys.size > 1 and not bool(np.all(keys[1:] > keys[:-1])):
            raise ValueError(f"table {tid}: a key is held by more than one shard")
        out[tid] = (keys, rows[order], acc[order])
    return out
