"""The disk tier's rows in memory (numpy only): the cache of hot rows in front of a disk table's
store (:class:`RowCache`: ``S`` sets of :data:`WAYS` ways, least-frequently-used with ageing,
write-back; docs/server.md, "Disk tier", says why and how it compares with the other
:data:`POLICIES`) and the rows a full store could not take yet (:class:`PendingRows`), both for
:class:`~embnic.testbed.server.disktable.DiskTable`.
"""
from __future__ import annotations

import numpy as np

from embnic.client_lib.splitmix import splitmix64

WAYS = 8  #: ways per cache set
#: use counts are halved every AGE_EVERY x cache_rows uses (16: measured on Zipf(1.05), 4096-key
#: messages over 16 x the cache's rows, hit ratio 0.67 where halving every cache_rows uses gave 0.62)
AGE_EVERY = 16
#: replacement policies: ``"lfu-aged"`` (the default: least used first, use counts halved every
#: AGE_EVERY x cache_rows uses, ties least recently used), ``"lfu"`` (the same, never halved) and
#: ``"lru"`` (least recently used first); ``embnic bench server --disk`` compares them
POLICIES = ("lfu-aged", "lfu", "lru")
_FREQ_MAX = 1 << 30
_BIG = np.iinfo(np.int64).max


def put_rows(dst: np.ndarray, idx: np.ndarray, src: np.ndarray) -> None:
    """``dst[idx] = src`` for a C-contiguous 2-D ``dst`` (n, w) and ``src`` (len(idx), w) of its dtype,
    as one assignment of whole rows (each row one numpy void): numpy's row scatter through a 2-D
    fancy index costs ~2.5 x as much. Rows are copied bit for bit."""
    vt = np.dtype((np.void, dst.shape[1] * dst.itemsize))
    dst.view(vt).reshape(-1)[idx] = np.ascontiguousarray(src, dtype=dst.dtype).view(vt).reshape(-1)


def capacity(cache_rows: int) -> tuple[int, int]:
    """(ways, sets) of a cache of at most ``cache_rows`` rows: its capacity is their product, the
    largest multiple of the ways not above ``cache_rows``."""
    ways = max(1, min(WAYS, int(cache_rows)))
    return ways, max(1, int(cache_rows) // ways)


class RowCache:
    """A set-associative cache of one table's rows (module docstring).

    Its arrays, one entry per slot (``capacity`` slots, set ``s`` is slots ``s·ways ..
    s·ways + ways - 1``): ``keys`` uint64, ``valid`` (holds a row), ``dirty`` (differs from the
    store), ``stored`` (materialised: in the store, or counted as held), ``freq`` int32 use count,
    ``stamp`` int32 batch of the last use, ``rows`` float32 (capacity, dim), ``acc`` float32
    (capacity,) for Adagrad tables (else empty). Written once when made, so their pages are
    resident from the start: the shard's memory does not creep up as the cache fills.

    Args:
        dim: floats per row.
        adagrad: keep a row-wise accumulator per row.
        cache_rows: rows it holds at most (:func:`capacity`).
        table_id: salts the set of each key.
        policy: which rows make room (:data:`POLICIES`).

    Raises:
        ValueError: an unknown ``policy``.
    """

    def __init__(self, dim: int, adagrad: bool, cache_rows: int, table_id: int, policy: str = "lfu-aged"):
        if policy not in POLICIES:
            raise ValueError(f"cache policy {policy!r}: one of {', '.join(POLICIES)}")
        self.policy = policy
        self.ways, self.nsets = capacity(cache_rows)
        cap = self.capacity = self.ways * self.nsets
        self.salt = splitmix64(np.array([0x0D15C0000000 + table_id], np.uint64))[0]
        self.keys = np.full(cap, 0, np.uint64)
        self.valid = np.full(cap, False)
        self.dirty = np.full(cap, False)
        self.stored = np.full(cap, False)
        self.freq = np.full(cap, 0, np.int32)
        self.stamp = np.full(cap, 0, np.int32)
        self.rows = np.full((cap, dim), 0, np.float32)
        self.acc = np.full(cap if adagrad else 0, 0, np.float32)
        self.tick = 0
        self.uses = 0

    @property
    def nbytes(self) -> int:
        """Bytes of its arrays."""
        return sum(a.nbytes for a in (self.keys, self.valid, self.dirty, self.stored, self.freq, self.stamp,
                                      self.rows, self.acc))

    def set_of(self, keys: np.ndarray) -> np.ndarray:
        """int64 (N,): the set of each key, ``splitmix64(key ^ salt)`` scaled to the sets
        (``(h >> 32) · S >> 32``, Lemire's range reduction; a modulo beyond 2^32 sets)."""
        h = splitmix64(keys ^ self.salt)
        if self.nsets < (1 << 32):
            return ((h >> np.uint64(32)) * np.uint64(self.nsets) >> np.uint64(32)).astype(np.int64)
        return (h % np.uint64(self.nsets)).astype(np.int64)

    def age(self, uses: int) -> None:
        """Count ``uses``; every :data:`AGE_EVERY` × capacity uses, halve every use count (LFU with
        ageing, policy ``"lfu-aged"``: old popularity fades)."""
        if self.policy != "lfu-aged":
            return
        self.uses += uses
        if self.uses >= AGE_EVERY * self.capacity:
            self.freq >>= 1
            self.uses = 0

    def clear(self) -> None:
        """Empty it (a new store behind it)."""
        for a in (self.valid, self.dirty, self.stored, self.freq, self.stamp):
            a[:] = 0

    def hits(self, keys: np.ndarray) -> tuple[np.ndarray, int]:
        """Start a batch: the slot of each of ``keys`` (uint64 (N,)) it holds, -1 where it holds
        none, and the batch's stamp; the hits count as used."""
        self.tick = self.tick + 1 if self.tick < 0x7FFFFFFF else 1
        W = self.ways
        s = self.set_of(keys)
        # (N, W): the ways of each key's set (np.take: row gathers ~4 x faster than indexing here)
        m = np.take(self.keys.reshape(-1, W), s, axis=0) == keys[:, None]
        m &= np.take(self.valid.reshape(-1, W), s, axis=0)
        way = m.argmax(axis=1)
        hit = np.take(m.reshape(-1), np.arange(0, m.size, W) + way)
        slot = np.where(hit, s * W + way, -1)
        hs = slot[hit]
        self.freq[hs] = np.minimum(self.freq[hs] + 1, _FREQ_MAX)
        self.stamp[hs] = self.tick
        return slot, self.tick

    def victims(self, misses: np.ndarray, keep_dirty: bool) -> tuple[np.ndarray, np.ndarray]:
        """Slots for ``misses`` (uint64 (n,) distinct keys it does not hold) in the current batch:
        per set, its free ways, then its least used rows (ties: least recently used; policy
        ``"lru"``: its least recently used rows); never a row this batch used, nor a dirty row when
        ``keep_dirty`` (nothing can be written back).

        Returns:
            (victim slots int64 (m,), the misses (indices into ``misses``) that get them), m ≤ n.
        """
        W, now = self.ways, self.tick
        ms = self.set_of(misses)
        order = np.argsort(ms, kind="stable")
        so = ms[order]
        first = np.empty(so.size, bool)
        first[:1] = True
        np.not_equal(so[1:], so[:-1], out=first[1:])
        grp = np.cumsum(first) - 1  # group (set) index of each sorted miss
        rank = np.arange(misses.size) - np.flatnonzero(first)[grp]  # rank among the misses of its set
        usets = so[first]
        ct = np.take(self.stamp.reshape(-1, W), usets, axis=0)  # (G, W): the ways of the sets
        cv = np.take(self.valid.reshape(-1, W), usets, axis=0)
        if self.policy == "lru":
            score = np.where(cv, ct.astype(np.int64), -1)
        else:
            score = np.where(cv, (np.take(self.freq.reshape(-1, W), usets, axis=0).astype(np.int64) << 24)
                             | (ct & 0xFFFFFF), -1)
        score[ct == now] = _BIG  # used by this batch: never a victim
        if keep_dirty:
            score[cv & np.take(self.dirty.reshape(-1, W), usets, axis=0)] = _BIG
        worder = np.argsort(score, axis=1, kind="stable")
        ok = rank < W
        vway = np.take(worder.reshape(-1), grp * W + np.minimum(rank, W - 1))
        ok &= np.take(score.reshape(-1), grp * W + vway) < _BIG
        return usets[grp[ok]] * W + vway[ok], order[ok]

    def install(self, slots: np.ndarray, keys: np.ndarray, rows: np.ndarray, acc: np.ndarray, stored: np.ndarray,
                dirty: np.ndarray) -> None:
        """Put rows ``rows`` (and accumulators ``acc``) of ``keys`` into ``slots`` (victims of the
        current batch), used once by it; ``stored``/``dirty`` bool per row."""
        self.keys[slots] = keys
        self.valid[slots] = True
        self.dirty[slots] = dirty
        self.stored[slots] = stored
        self.freq[slots] = 1
        self.stamp[slots] = self.tick
        put_rows(self.rows, slots, rows)
        if self.acc.size:
            self.acc[slots] = acc

    def dirty_slots(self) -> np.ndarray:
        """int64: the slots whose rows the store does not have yet."""
        return np.flatnonzero(self.dirty & self.valid)


class PendingRows:
    """Rows an update changed that a full store refused, kept in memory until it takes them: ids
    ``keys`` (uint64, sorted, distinct) and their rows as stored, ``values`` float32 (n, width)."""

    def __init__(self, width: int):
        self.width = width
        self.clear()

    def __len__(self) -> int:
        return int(self.keys.size)

    def clear(self) -> None:
        """Keep none."""
        self.keys = np.empty(0, np.uint64)
        self.values = np.empty((0, self.width), np.float32)

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bool (n,): which of ``keys`` (uint64 (n,)) are kept, their values (k, width))."""
        if not self.keys.size:
            return np.zeros(keys.size, bool), self.values
        j = np.minimum(np.searchsorted(self.keys, keys), self.keys.size - 1)
        kept = self.keys[j] == keys
        return kept, self.values[j[kept]]

    def keep(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Keep ``values`` (float32 (n, width)) of ``keys`` (uint64 (n,), distinct); a key already
        kept gets the newer row."""
        k = np.concatenate([self.keys, keys.astype(np.uint64)])
        v = np.concatenate([self.values, values])
        o = np.argsort(k, kind="stable")
        sk = k[o]
        last = np.r_[sk[1:] != sk[:-1], True]  # the newest of each key (stable: kept rows first)
        self.keys = sk[last]
        self.values = v[o][last]

    def forget(self, keys: np.ndarray) -> None:
        """Keep none of ``keys`` any more."""
        keep = ~np.isin(self.keys, keys)
        self.keys = self.keys[keep]
        self.values = self.values[keep]
