"""Batch preparation: KeyedJaggedTensor-style batches → per-table value/index/offset arrays.

A batch holds ``F`` features (``keys``) for ``B`` samples (``stride``), TorchRec
``KeyedJaggedTensor`` layout: ``values`` are grouped feature-major, ``lengths[f*B + b]`` is the
number of ids of feature ``f`` in sample ``b`` and ``offsets = [0, cumsum(lengths)]``
(``(F*B+1,)``).

Preparation (:func:`prepare_batch`) sorts the ids of every table once and produces

- the **value array** ``unique`` — sorted distinct ids of the table (uint64 (U,)),
- the **index array** ``inverse`` — for every original id its position in ``unique``
  (``values[i] == unique[inverse[i]]``, int64 (n,)),
- the **index offset array** ``offsets`` — where each bag starts in ``inverse``
  (int64 (bags+1,)): bag ``j`` of the table reads ``unique[inverse[offsets[j]:offsets[j+1]]]``.

Worked example (one table, F=2 features, B=2 samples)::

    keys=["a", "b"], stride=2, lengths=[2, 1, 0, 2], values=[7, 3, 7, 9, 3]
    unique  = [3, 7, 9]
    inverse = [1, 0, 1, 2, 0]
    offsets = [0, 2, 3, 3, 5]     # bags (a,0) (a,1) (b,0) (b,1)

Ids are full uint64 (0 .. 2^64-1): production systems hash features into 64-bit ids, and
nothing here folds or tags them. The ids of each table are sorted once (``np.unique`` over the
concatenated ids of its features), so the cost is one sort of the batch in per-table pieces.
Pooling (:func:`pool`) and its backward (:func:`pool_backward`) follow
``torch.nn.EmbeddingBag`` semantics (``mode="sum"`` / ``"mean"``; an empty bag pools to 0).

Empty batches work: zero samples (``stride=0``), zero features, all-empty bags and a table
whose features have no ids all give per-table results with empty ``unique``/``inverse``
and offsets ``[0, 0, ...]`` (``[0]`` when the table has no bags).

:func:`prepare_batch` validates its input by default (:func:`validate_batch`: O(F·B + n)
cheap checks, ``ValueError`` naming the problem); trusted inner callers pass
``validate=False``.
"""
from __future__ import annotations

import dataclasses
import operator

import numpy as np

_U64_MAX = (1 << 64) - 1
_MAX_TABLE_ID = 0xFFFF


def as_ids(values) -> np.ndarray:
    """Ids as uint64 (n,), without a float round trip.

    Accepts a 1-D array of unsigned or non-negative signed integers, or a sequence of Python /
    numpy ints in 0..2^64-1. (For a list mixing ``np.uint64`` with signed ints numpy picks
    float64, and for ints beyond int64 mixed with others it picks object: both are converted
    from the original ints exactly, never through a float.)

    Raises:
        ValueError: not 1-D (a 2-D array is refused, not flattened: a (B, F) matrix is
            sample-major while ``values`` is feature-major, see
            :meth:`KeyedJaggedBatch.from_dense`), not integers (floats and bools are refused),
            or an id outside 0..2^64-1.
    """
    v = values if isinstance(values, np.ndarray) else _ids_from_sequence(values)
    if v.ndim != 1:
        raise ValueError(f"values must be a 1-D id array, got shape {v.shape} (flatten it feature-major, "
                         "or use KeyedJaggedBatch.from_dense for a (B, F) matrix)")
    if v.dtype.kind == "u":
        return v.astype(np.uint64, copy=False)
    if v.dtype.kind == "i":
        if v.size and int(v.min()) < 0:
            raise ValueError(f"negative id {int(v.min())} (ids must be in 0..2**64-1)")
        return v.astype(np.uint64, copy=False)
    raise ValueError(f"ids must be integers (uint64), got dtype {v.dtype}")


def _ids_from_sequence(values) -> np.ndarray:
    try:
        v = np.asarray(values)
    except OverflowError:
        v = np.asarray(values, dtype=object)
    if v.size == 0:
        return np.empty(v.shape, dtype=np.uint64)
    if v.dtype.kind in "iu":
        return v
    if v.dtype.kind not in "fO":
        raise ValueError(f"ids must be integers (uint64), got dtype {v.dtype}")
    obj = np.asarray(values, dtype=object)
    try:
        ints = [operator.index(x) for x in obj.ravel()]
    except TypeError:
        raise ValueError("ids must be integers (uint64), got a non-integer value") from None
    bad = [x for x in ints if not 0 <= x <= _U64_MAX]
    if bad:
        raise ValueError(f"{'negative ' if bad[0] < 0 else ''}id {bad[0]} (ids must be in 0..2**64-1)")
    return np.array(ints, dtype=np.uint64).reshape(obj.shape)


@dataclasses.dataclass
class KeyedJaggedBatch:
    """A KeyedJaggedTensor-style sparse batch.

    Attributes:
        keys: feature names, length F.
        values: uint64 (sum(lengths),) ids, feature-major, any of 0..2^64-1; 1-D only (a 2-D
            id array is refused with ``ValueError``, not flattened: use :meth:`from_dense` for
            a (B, F) matrix).
        lengths: int32/int64 (F*B,) ids per (feature, sample).
        stride: B, samples in the batch.
    """

    keys: list[str]
    values: np.ndarray
    lengths: np.ndarray
    stride: int

    def offsets(self) -> np.ndarray:
        """int64 (F*B+1,): ``offsets[i]`` is where bag ``i`` starts in ``values``."""
        out = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=out[1:])
        return out

    @classmethod
    def from_dense(cls, keys: list[str], ids: np.ndarray) -> "KeyedJaggedBatch":
        """One id per (sample, feature): ``ids`` (B, F) integers → a batch with all lengths 1.

        ``values`` become feature-major: ``values[f*B + b] == ids[b, f]`` (uint64, see
        :func:`as_ids`).

        Raises:
            ValueError: ``ids`` not 2-D integers in 0..2^64-1, or F != len(keys).
        """
        a = ids if isinstance(ids, np.ndarray) else _ids_from_sequence(ids)
        if a.ndim != 2 or a.shape[1] != len(keys):
            raise ValueError(f"ids must be (B, F={len(keys)}), got shape {a.shape}")
        b, f = a.shape
        return cls(list(keys), as_ids(np.ascontiguousarray(a.T).reshape(-1)), np.ones(f * b, dtype=np.int32), b)


@dataclasses.dataclass
class TablePrep:
    """Prepared ids of one table (see the module docstring).

    Attributes:
        table_id: the table.
        features: indices (into the batch's ``keys``) of the features using this table, in order.
        unique: uint64 (U,) value array, sorted.
        inverse: int64 (n,) index array into ``unique``.
        offsets: int64 (len(features)*B+1,) index offset array into ``inverse``.
        lengths: int64 (len(features)*B,) ids per bag.
    """

    table_id: int
    features: list[int]
    unique: np.ndarray
    inverse: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray


@dataclasses.dataclass
class PreparedBatch:
    """Output of :func:`prepare_batch`: one :class:`TablePrep` per table, plus counts."""

    tables: dict[int, TablePrep]
    stride: int
    num_ids: int
    num_unique: int

    @property
    def dedup_ratio(self) -> float:
        """unique ids / all ids (1.0 = no duplicates)."""
        return self.num_unique / self.num_ids if self.num_ids else 1.0


def validate_batch(batch: KeyedJaggedBatch, feature_tables: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Check a batch's shapes and ids; returns (values uint64 (n,), lengths int64 (F*B,)).

    Cheap checks, O(F·B + n) (no sort): every id of 0..2^64-1 is valid.

    Raises:
        ValueError: naming the problem — ``stride`` not a non-negative int; ``feature_tables``
            not one table id (0..65535) per feature; ``lengths`` not 1-D integers of shape
            (F*B,) or negative; ``values`` not 1-D integers in 0..2^64-1 (see :func:`as_ids`);
            ``sum(lengths) != len(values)``.
    """
    f = len(batch.keys)
    b = batch.stride
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 0:
        raise ValueError(f"stride must be an int >= 0 (samples in the batch), got {b!r}")
    b = int(b)
    if len(feature_tables) != f:
        raise ValueError(f"{f} features but {len(feature_tables)} feature→table entries")
    for i, t in enumerate(feature_tables):
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t <= _MAX_TABLE_ID:
            raise ValueError(f"feature_tables[{i}] = {t!r}: a table id must be an int in 0..{_MAX_TABLE_ID}")
    lengths = np.asarray(batch.lengths)
    if lengths.size == 0 and lengths.dtype.kind == "f":  # np.asarray([]) is float64
        lengths = lengths.astype(np.int64)
    if lengths.dtype.kind not in "iu":
        raise ValueError(f"lengths must be integers, got dtype {lengths.dtype}")
    if lengths.shape != (f * b,):
        raise ValueError(f"lengths has shape {lengths.shape}, expected ({f}*{b},) = ({f * b},): one length per "
                         "(feature, sample), feature-major")
    lengths = lengths.astype(np.int64, copy=False)
    if lengths.size and int(lengths.min()) < 0:
        raise ValueError(f"negative length {int(lengths.min())} at bag {int(np.argmin(lengths))}")
    values = as_ids(batch.values)
    total = int(lengths.sum())
    if total != values.size:
        raise ValueError(f"sum(lengths)={total} != len(values)={values.size}")
    return values, lengths


def prepare_batch(batch: KeyedJaggedBatch, feature_tables: list[int], *, validate: bool = True) -> PreparedBatch:
    """Sort → value, index and index offset arrays for every table (module docstring).

    Args:
        batch: the sparse batch (F features, B samples; B or F may be 0).
        feature_tables: table id of every feature (length F); features may share a table.
        validate: check shapes and ids first (:func:`validate_batch`, the default); a trusted
            caller whose batches are well-formed by construction may pass False.

    Returns:
        :class:`PreparedBatch` with one :class:`TablePrep` per distinct table id of
        ``feature_tables`` (a table whose features have no ids gets empty arrays).

    Raises:
        ValueError: (with ``validate``) a malformed batch, see :func:`validate_batch`.

    Cost: one ``np.unique`` (sort) per table over its ids, O(n log n) in all, plus O(n)
    gathers; a Python loop over tables and features only, never over ids.
    """
    if validate:
        values, lengths = validate_batch(batch, feature_tables)
    else:
        values = np.asarray(batch.values, dtype=np.uint64)
        lengths = np.asarray(batch.lengths, dtype=np.int64)
    f, b = len(feature_tables), int(batch.stride)
    feat_len = lengths.reshape(f, b).sum(axis=1) if f else np.zeros(0, dtype=np.int64)
    feat_start = np.zeros(f + 1, dtype=np.int64)
    np.cumsum(feat_len, out=feat_start[1:])
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(feature_tables):
        groups.setdefault(int(t), []).append(i)
    out: dict[int, TablePrep] = {}
    num_unique = 0
    for t in sorted(groups):
        feats = groups[t]
        if len(feats) == 1:
            i = feats[0]
            t_vals = values[feat_start[i]:feat_start[i + 1]]
            t_len = lengths[i * b:(i + 1) * b]
        else:
            t_vals = np.concatenate([values[feat_start[i]:feat_start[i + 1]] for i in feats])
            t_len = np.concatenate([lengths[i * b:(i + 1) * b] for i in feats])
        uniq, inv = np.unique(t_vals, return_inverse=True)
        t_off = np.zeros(len(t_len) + 1, dtype=np.int64)
        np.cumsum(t_len, out=t_off[1:])
        out[t] = TablePrep(t, feats, uniq, inv.reshape(-1).astype(np.int64, copy=False), t_off, t_len)
        num_unique += uniq.size
    return PreparedBatch(out, b, int(values.size), num_unique)


def pool(rows: np.ndarray, prep: TablePrep, mode: str = "sum") -> np.ndarray:
    """EmbeddingBag forward: rows of the value array → pooled bags.

    Args:
        rows: float32 (U, dim), ``rows[i]`` is the embedding of ``prep.unique[i]``.
        prep: the table's prepared ids.
        mode: ``"sum"`` or ``"mean"``.

    Returns:
        float32 (bags, dim), ``bags = len(prep.lengths)``; an empty bag is 0.
    """
    g = rows[prep.inverse]
    nb = len(prep.lengths)
    out = np.zeros((nb, rows.shape[1]), dtype=rows.dtype)
    nonempty = prep.lengths > 0
    if g.shape[0]:
        out[nonempty] = np.add.reduceat(g, prep.offsets[:-1][nonempty], axis=0)
    if mode == "mean":
        out /= np.maximum(prep.lengths, 1).astype(rows.dtype)[:, None]
    elif mode != "sum":
        raise ValueError(f"pooling mode must be 'sum' or 'mean', got {mode!r}")
    return out


def pool_backward(grad_pooled: np.ndarray, prep: TablePrep, mode: str = "sum") -> np.ndarray:
    """EmbeddingBag backward: gradient of pooled bags → gradient per row of the value array.

    Args:
        grad_pooled: float32 (bags, dim).
        prep: the table's prepared ids.

    Returns:
        float32 (U, dim): the summed gradient of every unique id (duplicates aggregated).
    """
    gp = grad_pooled
    if mode == "mean":
        gp = gp / np.maximum(prep.lengths, 1).astype(gp.dtype)[:, None]
    g = np.repeat(gp, prep.lengths, axis=0)  # per original id
    u = len(prep.unique)
    order = np.argsort(prep.inverse, kind="stable")
    inv_sorted = prep.inverse[order]
    out = np.zeros((u, gp.shape[1]), dtype=gp.dtype)
    if len(order):
        starts = np.flatnonzero(np.r_[True, inv_sorted[1:] != inv_sorted[:-1]])
        out[inv_sorted[starts]] = np.add.reduceat(g[order], starts, axis=0)
    return out
