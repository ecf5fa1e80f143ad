"""Embedding-table numerics: the row store, row initialisation, SGD and row-wise Adagrad.

The one home of every computation that produces a row value, shared by the parameter-server
shards (``embnic.testbed.server.shard``) and the in-process reference
(:class:`embnic.client_lib.local.LocalBackend`): both hold :class:`TableShard` objects and
call exactly the same numpy code on the same float32 values in the same order, so a table
trained through UDP shards and the same table trained in process are **bit-identical**. This
module needs neither the testbed nor a network.

Row initialisation
    ``init_rows(seed, table_id, keys, dim, scale)`` is a pure function of
    (seed, table, key, column): a counter-based hash (:mod:`embnic.client_lib.splitmix`), not a
    stateful RNG, so a row's initial value does not depend on which shard owns it, on the number of shards,
    or on the order rows are first touched.

Storage (:class:`TableShard`)
    A collision-free dynamic table keyed by the raw uint64 id (any of 0..2^64-1; no id is
    ever folded into a row count, so two ids never share a row). Rows are materialised
    lazily, on their first *update*: memory is proportional to the rows updated, not to the
    table's ``rows`` (optional; tables may have 2^40 rows, or no bound at all). A lookup of a
    row never updated computes its initial value on the fly (and stores nothing). Materialised rows live
    in an append-only arena (``(capacity, dim)`` float32, doubled when full, plus one float32
    Adagrad accumulator per row); sorted ``uint64`` key indexes with the arena slot of each key
    find them with ``np.searchsorted`` (O(N log M) per batch of N keys). New keys go to a small
    delta index (an ``np.insert`` of O(D)), folded into the main index when it exceeds
    max(4096, M/8) keys (one O(M) pass per M/8 new keys: O(1) amortised per key, where one
    index would copy all M entries on every batch with a new key); rows themselves never move.

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

fp16 tables
    Master rows and accumulators are always stored in **float32**; ``dtype = "fp16"`` is the
    *wire* type. A lookup reply carries the rows rounded to fp16 and an update carries fp16
    gradients, which the server widens to float32 before applying. :func:`wire_round` is that
    rounding; :class:`~embnic.client_lib.local.LocalBackend` applies it on both directions so it
    matches the network path bit for bit.
"""
from __future__ import annotations

import math

import numpy as np

from . import consts
from .batch import as_ids
from .config import TableConfig
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
        float32 (N, dim), C-contiguous.
    """
    keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
    t = splitmix64(_u64(seed) ^ splitmix64(_u64(table_id)))
    h = splitmix64(keys ^ t)
    c = splitmix64(np.arange(dim, dtype=np.uint64) + np.uint64(0x5EED000000000000))
    bits = splitmix64(h[:, None] ^ c[None, :]) >> np.uint64(40)
    u = bits.astype(np.float32) * np.float32(2.0 ** -24)
    return (u * np.float32(2.0) - np.float32(1.0)) * np.float32(scale)


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
    """``mean(g**2, axis=1)`` in float32, summed column by column left to right.

    The order is fixed, so a row's result does not depend on the other rows in ``g``.

    Args:
        g: float32 (N, dim).

    Returns:
        float32 (N,).
    """
    n, dim = g.shape
    s = np.zeros(n, dtype=np.float32)
    for j in range(dim):  # loop over columns, vectorised over rows
        col = g[:, j]
        s += col * col
    return s / np.float32(dim)


class TableShard:
    """The rows of one table that one process holds (all rows, or one shard's).

    Lazily materialised: see the module docstring for the layout. The fast path does not
    validate; call :func:`validate_keys` / :func:`validate_update` first.

    Args:
        table: the table's config (``rows``, ``dim``, ``optimizer``, ``lr``, ``eps``,
            ``init_scale``).
        seed: the cluster seed.
        capacity: initial arena capacity (rows); grows by doubling.
    """

    #: the delta index is merged into the main one when it holds more than
    #: max(MERGE_MIN, M/8) keys
    MERGE_MIN = 4096

    def __init__(self, table: TableConfig, seed: int, capacity: int = 1024):
        self.table = table
        self.seed = int(seed)
        self.dim = int(table.dim)
        self.adagrad = table.optimizer == "adagrad"
        self._lr = np.float32(table.lr)
        self._eps = np.float32(table.eps)
        self._keys = np.empty(0, dtype=np.uint64)  # main index: sorted materialised keys (M,)
        self._slots = np.empty(0, dtype=np.int64)  # arena slot of each key in _keys (M,)
        self._dkeys = np.empty(0, dtype=np.uint64)  # delta index: recently added keys, sorted (D,)
        self._dslots = np.empty(0, dtype=np.int64)
        cap = max(1, int(capacity))
        self._rows = np.empty((cap, self.dim), dtype=np.float32)
        self._acc = np.zeros(cap if self.adagrad else 0, dtype=np.float32)
        self._n = 0  # arena slots in use

    def __len__(self) -> int:
        """Materialised (ever updated) rows."""
        return self._n

    @property
    def nbytes(self) -> int:
        """Bytes held by the arena and the index."""
        return (self._rows.nbytes + self._acc.nbytes + self._keys.nbytes + self._slots.nbytes
                + self._dkeys.nbytes + self._dslots.nbytes)

    def _find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slot int64 (N,), found bool (N,)); slot is -1 where not materialised."""
        slot = np.full(keys.size, -1, dtype=np.int64)
        found = np.zeros(keys.size, dtype=bool)
        for index, slots in ((self._keys, self._slots), (self._dkeys, self._dslots)):
            m = index.size
            if m == 0:
                continue
            pos = np.minimum(np.searchsorted(index, keys), m - 1)
            hit = index[pos] == keys
            slot = np.where(hit, slots[pos], slot)
            found |= hit
        return slot, found

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Current rows of ``keys``.

        Args:
            keys: uint64 (N,), any order, duplicates allowed, all ``< rows`` if the table has
                ``rows`` (not checked).

        Returns:
            float32 (N, dim), a new array (master values; round with :func:`wire_round`
            for what a client receives).
        """
        keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
        slot, found = self._find(keys)
        out = np.empty((keys.size, self.dim), dtype=np.float32)
        if found.all():
            np.take(self._rows, slot, axis=0, out=out)
            return out
        out[found] = self._rows[slot[found]]
        miss = ~found
        out[miss] = init_rows(self.seed, self.table.id, keys[miss], self.dim, self.table.init_scale)
        return out

    def _grow(self, need: int) -> None:
        cap = self._rows.shape[0]
        if need <= cap:
            return
        while cap < need:
            cap *= 2
        rows = np.empty((cap, self.dim), dtype=np.float32)
        rows[:self._n] = self._rows[:self._n]
        self._rows = rows
        if self.adagrad:
            acc = np.zeros(cap, dtype=np.float32)
            acc[:self._n] = self._acc[:self._n]
            self._acc = acc

    def _materialise(self, keys: np.ndarray) -> np.ndarray:
        """Slots of ``keys`` (unique uint64 (N,)), creating initial rows for new ones."""
        slot, found = self._find(keys)
        if found.all():
            return slot
        new = np.sort(keys[~found])
        k = new.size
        self._grow(self._n + k)
        new_slots = np.arange(self._n, self._n + k, dtype=np.int64)
        self._rows[self._n:self._n + k] = init_rows(self.seed, self.table.id, new, self.dim,
                                                    self.table.init_scale)
        if self.adagrad:
            self._acc[self._n:self._n + k] = 0
        self._n += k
        ins = np.searchsorted(self._dkeys, new)
        self._dkeys = np.insert(self._dkeys, ins, new)
        self._dslots = np.insert(self._dslots, ins, new_slots)
        if self._dkeys.size > max(self.MERGE_MIN, self._keys.size >> 3):
            self._merge()
        slot[~found] = new_slots[np.searchsorted(new, keys[~found])]
        return slot

    def _merge(self) -> None:
        """Fold the delta index into the main one: one O(M + D) pass per M/8 new keys."""
        if self._dkeys.size == 0:
            return
        ins = np.searchsorted(self._keys, self._dkeys)
        self._keys = np.insert(self._keys, ins, self._dkeys)
        self._slots = np.insert(self._slots, ins, self._dslots)
        self._dkeys = self._dkeys[:0]
        self._dslots = self._dslots[:0]

    def apply(self, keys_unique: np.ndarray, grads: np.ndarray) -> None:
        """Apply one gradient per row with the table's optimizer (SGD or row-wise Adagrad).

        Args:
            keys_unique: uint64 (N,), **no duplicates**, all ``< rows`` if the table has ``rows``
                (not checked; a duplicate would lose all but one of its gradients).
            grads: float32 (N, dim), row ``i`` is the gradient of ``keys_unique[i]``; rows that
                pass :func:`gradient_rows_ok` (not checked: a NaN would poison its row).
        """
        keys = np.asarray(keys_unique, dtype=np.uint64).reshape(-1)
        if keys.size == 0:
            return
        g = np.ascontiguousarray(grads, dtype=np.float32).reshape(keys.size, self.dim)
        slot = self._materialise(keys)
        w = self._rows[slot]
        with np.errstate(over="ignore"):  # callers refuse g whose step overflows (gradient_rows_ok)
            if self.adagrad:
                acc = self._acc[slot] + rowwise_mean_square(g)
                self._acc[slot] = acc
                mult = self._lr / (np.sqrt(acc) + self._eps)
                w -= mult[:, None] * g
            else:
                w -= self._lr * g
        self._rows[slot] = w

    def apply_segments(self, keys: np.ndarray, g: np.ndarray, offs: np.ndarray) -> None:
        """Apply the updates of several messages in their order.

        Args:
            keys: uint64 (K,), each segment ``keys[offs[j]:offs[j+1]]`` free of duplicates.
            g: float32 (K, dim), the gradients in the same order.
            offs: int64 (M+1,), segment bounds (``offs[0] == 0``, ``offs[-1] == K``; empty
                segments allowed).

        All in one :meth:`apply` when no key repeats across segments (row-wise optimizers: the
        same rows as one message after the other); else one message after the other, as they
        came.
        """
        if keys.size == 0:
            return
        if offs.size <= 2 or is_unique(keys):
            self.apply(keys, g)
            return
        for a, b in zip(offs[:-1].tolist(), offs[1:].tolist()):
            if b > a:
                self.apply(keys[a:b], g[a:b])

    def state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Materialised rows, for comparison and checkpoints.

        Returns:
            (keys uint64 (M,) sorted, rows float32 (M, dim), acc float32 (M,)) — copies;
            ``acc`` is all zeros for SGD tables.
        """
        self._merge()
        rows = self._rows[self._slots]
        acc = self._acc[self._slots] if self.adagrad else np.zeros(self._keys.size, dtype=np.float32)
        return self._keys.copy(), rows, acc

    def load_state(self, keys: np.ndarray, rows: np.ndarray, acc: np.ndarray) -> None:
        """Replace every materialised row with ``(keys, rows, acc)`` (what :meth:`state` returned;
        a checkpoint or an imported table).

        Args:
            keys: uint64 (M,), strictly increasing.
            rows: float32 (M, dim).
            acc: float32 (M,) (ignored for SGD tables).

        Raises:
            ValueError: shapes that do not fit the table, or keys not strictly increasing.
        """
        k = np.asarray(keys, dtype=np.uint64).reshape(-1)
        r = np.asarray(rows)
        a = np.asarray(acc).reshape(-1)
        if r.shape != (k.size, self.dim) or a.shape != (k.size,):
            raise ValueError(f"table {self.table.id}: state shapes keys {k.shape}, rows {r.shape}, acc {a.shape} "
                             f"do not fit dim {self.dim}")
        if k.size > 1 and not bool(np.all(k[1:] > k[:-1])):
            raise ValueError(f"table {self.table.id}: state keys are not strictly increasing")
        cap = max(64, k.size)
        self._rows = np.empty((cap, self.dim), dtype=np.float32)
        self._rows[:k.size] = r
        self._acc = np.zeros(cap if self.adagrad else 0, dtype=np.float32)
        if self.adagrad:
            self._acc[:k.size] = a
        self._keys = k.copy()
        self._slots = np.arange(k.size, dtype=np.int64)
        self._dkeys = np.empty(0, dtype=np.uint64)
        self._dslots = np.empty(0, dtype=np.int64)
        self._n = k.size


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


_FLT_MAX = float(np.finfo(np.float32).max)


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
        if m < math.inf and (2.0 * g.shape[1] * m * m < _FLT_MAX if table.optimizer == "adagrad"
                             else abs(float(np.float32(table.lr))) * m * (1 + 2.0 ** -20) < _FLT_MAX):
            return np.ones(g.shape[0], dtype=bool)
    ok = np.isfinite(g).all(axis=1)
    if g.size:
        with np.errstate(over="ignore", invalid="ignore"):
            if table.optimizer == "adagrad":
                ok &= np.isfinite(rowwise_mean_square(g))
            else:
                ok &= np.isfinite(np.float32(table.lr) * g).all(axis=1)
    return ok


def gradient_ok(table: TableConfig, g: np.ndarray) -> bool:
    """Whether every row of gradients float32 (N, dim) may be applied (:func:`gradient_rows_ok`).

    The servers refuse an update with any such row (MALFORMED, the whole message, nothing
    applied) and :class:`LocalBackend` raises, so a corrupt gradient never poisons a row.
    """
    return bool(gradient_rows_ok(table, g).all())


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
