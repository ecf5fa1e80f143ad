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

Ids are full uint64 (0 .. 2^64-1), never folded or tagged. Every table's ids are sorted
together, once (:func:`unique_by_table`), and the result is kept flat (:class:`PreparedBatch`).
Pooling (:func:`pool_all`) and its backward (:func:`pool_backward_all`) follow
``torch.nn.EmbeddingBag`` semantics (``mode="sum"`` / ``"mean"``; an empty bag pools to 0).
Empty batches (zero samples, zero features, all-empty bags) give empty ``unique``/``inverse``
and offsets ``[0, 0, ...]`` (``[0]`` when the table has no bags).
"""
from __future__ import annotations

import dataclasses
import functools
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
    if v.dtype.kind not in "iu":
        raise ValueError(f"ids must be integers (uint64), got dtype {v.dtype}")
    if v.dtype.kind == "i" and v.size and int(v.min()) < 0:
        raise ValueError(f"negative id {int(v.min())} (ids must be in 0..2**64-1)")
    return v.astype(np.uint64, copy=False)


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
        return np.concatenate(([0], np.cumsum(self.lengths, dtype=np.int64)))

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
    """Output of :func:`prepare_batch`: every table's value, index and index offset arrays flat,
    tables in ascending id (``T`` tables, ``n`` ids, ``U`` unique ids, ``G`` bags), plus counts;
    :attr:`tables` gives them per table as :class:`TablePrep` views.

    Attributes:
        table_ids: int64 (T,) ascending.
        unique: uint64 (U,): table ``t``'s value array is ``unique[unique_offsets[t]:unique_offsets[t+1]]``.
        unique_offsets: int64 (T+1,).
        inverse: int64 (n,): every id's index into its own table's value array, tables one after the
            other, a table's ids in the order of its features (``id_offsets`` (T+1,) delimit them).
        lengths: int64 (G,): ids per bag, tables one after the other (``bag_offsets`` (T+1,)), a
            table's bags feature by feature.
        offsets: int64 (G+1,): where each bag starts in ``inverse`` (``[0, cumsum(lengths)]``).
        features: int64 (F,): the batch's features grouped by table (ascending id, then feature
            order); ``feature_offsets`` (T+1,) delimit each table's.
        stride, num_ids, num_unique: B, n, U.
    """

    table_ids: np.ndarray
    unique: np.ndarray
    unique_offsets: np.ndarray
    inverse: np.ndarray
    id_offsets: np.ndarray
    lengths: np.ndarray
    bag_offsets: np.ndarray
    offsets: np.ndarray
    features: np.ndarray
    feature_offsets: np.ndarray
    stride: int
    num_ids: int
    num_unique: int

    @property
    def dedup_ratio(self) -> float:
        """unique ids / all ids (1.0 = no duplicates): :func:`dedup_ratio` of the batch."""
        return dedup_ratio(self.num_unique, self.num_ids)

    @functools.cached_property
    def row_index(self) -> np.ndarray:
        """int64 (n,): each id's row among every table's value arrays one after the other
        (``inverse`` plus its table's ``unique_offsets``), in the order of ``inverse``."""
        return self.inverse + np.repeat(self.unique_offsets[:-1], np.diff(self.id_offsets))

    @functools.cached_property
    def tables(self) -> dict[int, TablePrep]:
        """``{table_id: TablePrep}``, views of the flat arrays (built once, on first use)."""
        uo, io, bo, fo = (x.tolist() for x in (self.unique_offsets, self.id_offsets, self.bag_offsets,
                                               self.feature_offsets))
        feats = self.features.tolist()
        return {t: TablePrep(t, feats[fo[i]:fo[i + 1]], self.unique[uo[i]:uo[i + 1]], self.inverse[io[i]:io[i + 1]],
                             self.offsets[bo[i]:bo[i + 1] + 1] - io[i], self.lengths[bo[i]:bo[i + 1]])
                for i, t in enumerate(self.table_ids.tolist())}


def dedup_ratio(num_unique: int, num_ids: int) -> float:
    """What deduplication leaves of a lookup: ``num_unique / num_ids`` (ids sent per id asked for;
    1.0 = no duplicates, and for no ids at all)."""
    return num_unique / num_ids if num_ids else 1.0


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
    """Sort → value, index and index offset arrays for every table (module docstring): one sort
    of every id of the batch and O(n) gathers, a fixed number of numpy calls whatever the tables.

    Args:
        batch: the sparse batch (F features, B samples; B or F may be 0).
        feature_tables: table id of every feature (length F); features may share a table.
        validate: check shapes and ids first (:func:`validate_batch`); False for a trusted caller.

    Returns:
        :class:`PreparedBatch` with every distinct table id of ``feature_tables``.

    Raises:
        ValueError: (with ``validate``) a malformed batch, see :func:`validate_batch`.
    """
    if validate:
        values, lengths = validate_batch(batch, feature_tables)
    else:
        values = np.asarray(batch.values, dtype=np.uint64)
        lengths = np.asarray(batch.lengths, dtype=np.int64)
    f, b = len(feature_tables), int(batch.stride)
    ftab = np.asarray(feature_tables, dtype=np.int64).reshape(f)
    tids, frank = np.unique(ftab, return_inverse=True)
    frank = frank.reshape(-1)
    T = tids.size
    feat_len = lengths.reshape(f, b).sum(axis=1) if f else np.zeros(0, dtype=np.int64)
    vrank = np.repeat(frank, feat_len)  # each id's table (its rank among the tables)
    uniq, uoff, inv = unique_by_table(values, vrank, T)
    fperm = np.argsort(frank, kind="stable")  # features grouped by table, feature order kept
    if f > 1 and not bool(np.all(frank[1:] >= frank[:-1])):  # a table's features are not consecutive
        inv = inv[np.argsort(vrank, kind="stable")]
        lengths = lengths.reshape(f, b)[fperm].reshape(-1)
    fo, io = (np.concatenate(([0], np.cumsum(c, dtype=np.int64))) for c in (
        np.bincount(frank, minlength=T), np.bincount(frank, weights=feat_len, minlength=T).astype(np.int64)))
    off = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return PreparedBatch(tids, uniq, uoff, inv, io, lengths, fo * b, off, fperm.astype(np.int64), fo, b,
                         int(values.size), int(uniq.size))


def unique_by_table(values: np.ndarray, table: np.ndarray, num_tables: int) -> tuple[np.ndarray, np.ndarray,
                                                                                         np.ndarray]:
    """``np.unique(return_inverse=True)`` of every table's ids at once.

    Args:
        values: uint64 (n,) ids; table: int (n,) each id's table, in ``0..num_tables-1``.

    Returns:
        ``(unique uint64 (U,), unique_offsets int64 (T+1,), inverse int64 (n,))``: table ``t``'s
        sorted distinct ids are ``unique[unique_offsets[t]:unique_offsets[t+1]]`` and id ``i`` is
        ``unique[unique_offsets[table[i]] + inverse[i]]`` (``inverse`` indexes its own table's).

    One sort of n keys: where table, id and position fit 64 bits together (ids below
    ``2^(64 - bits(T-1) - bits(n-1))``: e.g. ids of tables of up to 2^40 rows in batches of a
    million), a plain ``np.sort`` of ``table | id | position`` packed into one uint64 (a vectorised
    sort, no argsort); otherwise an argsort of the ids and a stable radix pass by table.
    """
    n = values.size
    uoff = np.zeros(num_tables + 1, dtype=np.int64)
    if n == 0:
        return np.zeros(0, dtype=np.uint64), uoff, np.zeros(0, dtype=np.int64)
    tb = int(num_tables - 1).bit_length()
    pb = int(n - 1).bit_length() or 1
    ib = int(values.max()).bit_length()
    if tb + ib + pb <= 64:
        one = np.uint64(1)
        key = (values << np.uint64(pb)) | np.arange(n, dtype=np.uint64)
        if tb:
            key |= table.astype(np.uint64) << np.uint64(ib + pb)
        s = np.sort(key)
        pos = (s & ((one << np.uint64(pb)) - one)).astype(np.int64)
        hi = s >> np.uint64(pb)  # table and id
        first = np.empty(n, dtype=bool)
        first[0] = True
        np.not_equal(hi[1:], hi[:-1], out=first[1:])
        uniq = hi[first] & ((one << np.uint64(ib)) - one) if ib < 64 else hi[first]
        srank = (hi >> np.uint64(ib)).astype(np.int64) if tb else np.zeros(n, dtype=np.int64)
    else:
        pos = np.argsort(values)
        if num_tables > 1:
            pos = pos[np.argsort(table[pos].astype(np.uint16 if num_tables <= 65536 else np.int64), kind="stable")]
        sv = values[pos]
        srank = np.asarray(table, dtype=np.int64)[pos]
        first = np.empty(n, dtype=bool)
        first[0] = True
        np.not_equal(sv[1:], sv[:-1], out=first[1:])
        first[1:] |= srank[1:] != srank[:-1]
        uniq = sv[first]
    uid = np.cumsum(first) - 1
    np.cumsum(np.bincount(srank[first], minlength=num_tables), out=uoff[1:])
    inv = np.empty(n, dtype=np.int64)
    inv[pos] = uid - uoff[srank]
    return uniq, uoff, inv


def pool_all(rows: np.ndarray, prep: PreparedBatch, mode: str = "sum") -> np.ndarray:
    """EmbeddingBag forward of every table at once: ``rows`` float32 (U, dim), every table's value
    array one after the other (one dim for all) → float32 (G, dim), every table's bags in
    ``prep.lengths`` order (``mode`` ``"sum"`` or ``"mean"``; an empty bag is 0).

    Raises:
        ValueError: another ``mode``.
    """
    g, lengths = rows[prep.row_index], prep.lengths
    out = np.zeros((lengths.size, g.shape[1]), dtype=g.dtype)
    nonempty = lengths > 0
    if g.shape[0]:
        out[nonempty] = np.add.reduceat(g, prep.offsets[:-1][nonempty], axis=0)
    if mode == "mean":
        out /= np.maximum(lengths, 1).astype(g.dtype)[:, None]
    elif mode != "sum":
        raise ValueError(f"pooling mode must be 'sum' or 'mean', got {mode!r}")
    return out


def pool_backward_all(grad_pooled: np.ndarray, prep: PreparedBatch, mode: str = "sum") -> np.ndarray:
    """EmbeddingBag backward of every table at once: ``grad_pooled`` float32 (G, dim) in
    ``prep.lengths`` order → float32 (U, dim), the summed gradient of every row of every table's
    value array (one after the other; duplicates aggregated)."""
    gp = grad_pooled
    if mode == "mean":
        gp = gp / np.maximum(prep.lengths, 1).astype(gp.dtype)[:, None]
    g = np.repeat(gp, prep.lengths, axis=0)
    inv = prep.row_index
    order = np.argsort(inv, kind="stable")
    inv_sorted = inv[order]
    out = np.zeros((prep.num_unique, gp.shape[1]), dtype=gp.dtype)
    if len(order):
        starts = np.flatnonzero(np.r_[True, inv_sorted[1:] != inv_sorted[:-1]])
        out[inv_sorted[starts]] = np.add.reduceat(g[order], starts, axis=0)
    return out
