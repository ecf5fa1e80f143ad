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

All ids of all tables are sorted in one ``np.unique`` over ``(table << 48) | id``, so the cost is
one sort of the batch. Pooling (:func:`pool`) and its backward (:func:`pool_backward`) follow
``torch.nn.EmbeddingBag`` semantics (``mode="sum"`` / ``"mean"``; an empty bag pools to 0).
The fast path does not validate; :func:`validate_batch` raises ``ValueError``.
"""
from __future__ import annotations

import dataclasses

import numpy as np

_TABLE_SHIFT = 48
_ID_MASK = np.uint64((1 << _TABLE_SHIFT) - 1)


@dataclasses.dataclass
class KeyedJaggedBatch:
    """A KeyedJaggedTensor-style sparse batch.

    Attributes:
        keys: feature names, length F.
        values: uint64 (sum(lengths),) ids, feature-major.
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
        """One id per (sample, feature): ``ids`` (B, F) → a batch with all lengths 1."""
        b, f = ids.shape
        return cls(list(keys), np.ascontiguousarray(ids.T).reshape(-1).astype(np.uint64),
                   np.ones(f * b, dtype=np.int32), b)


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


def validate_batch(batch: KeyedJaggedBatch, feature_tables: list[int]) -> None:
    """Check a batch's shapes and ids.

    Raises:
        ValueError: lengths not (F*B,), negative lengths, sum(lengths) != len(values),
            a feature without a table, or an id >= 2**48.
    """
    f, b = len(batch.keys), batch.stride
    if len(feature_tables) != f:
        raise ValueError(f"{f} features but {len(feature_tables)} feature→table entries")
    if batch.lengths.shape != (f * b,):
        raise ValueError(f"lengths has shape {batch.lengths.shape}, expected ({f}*{b},)")
    if batch.lengths.size and batch.lengths.min() < 0:
        raise ValueError("negative length")
    if int(batch.lengths.sum()) != len(batch.values):
        raise ValueError(f"sum(lengths)={int(batch.lengths.sum())} != len(values)={len(batch.values)}")
    if len(batch.values) and int(np.asarray(batch.values, dtype=np.uint64).max()) >> _TABLE_SHIFT:
        raise ValueError("ids must be < 2**48")


def prepare_batch(batch: KeyedJaggedBatch, feature_tables: list[int]) -> PreparedBatch:
    """Sort → value, index and index offset arrays for every table (module docstring).

    Args:
        batch: the sparse batch (F features, B samples).
        feature_tables: table id of every feature (length F); features may share a table.

    Returns:
        :class:`PreparedBatch` with one :class:`TablePrep` per distinct table id.

    Cost: one ``np.unique`` (sort) of all ``n`` ids plus O(n) gathers; no per-id Python loop.
    """
    b = batch.stride
    values = np.asarray(batch.values, dtype=np.uint64)
    lengths = np.asarray(batch.lengths, dtype=np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ftab = np.asarray(feature_tables, dtype=np.uint64)
    # ids per feature → table tag per id, then one sort of (table << 48 | id)
    feat_len = np.add.reduceat(lengths, np.arange(0, len(lengths), b)) if len(lengths) else lengths
    tags = np.repeat(ftab << np.uint64(_TABLE_SHIFT), feat_len)
    uniq_c, inv = np.unique(values | tags, return_inverse=True)
    inv = inv.reshape(-1)
    table_of_uniq = uniq_c >> np.uint64(_TABLE_SHIFT)
    out: dict[int, TablePrep] = {}
    feat_start = offsets[np.arange(0, len(lengths), b)] if len(lengths) else offsets[:0]
    for t in sorted(set(int(x) for x in feature_tables)):
        lo, hi = np.searchsorted(table_of_uniq, [t, t + 1])
        feats = [i for i, ft in enumerate(feature_tables) if ft == t]
        if len(feats) == 1:
            f = feats[0]
            sl = slice(int(feat_start[f]), int(feat_start[f] + feat_len[f]))
            t_inv = inv[sl] - lo
            t_len = lengths[f * b:(f + 1) * b]
        else:
            t_inv = np.concatenate([inv[int(feat_start[f]):int(feat_start[f] + feat_len[f])] for f in feats]) - lo
            t_len = np.concatenate([lengths[f * b:(f + 1) * b] for f in feats])
        t_off = np.zeros(len(t_len) + 1, dtype=np.int64)
        np.cumsum(t_len, out=t_off[1:])
        out[t] = TablePrep(t, feats, uniq_c[lo:hi] & _ID_MASK, t_inv, t_off, t_len)
    return PreparedBatch(out, b, len(values), len(uniq_c))


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
