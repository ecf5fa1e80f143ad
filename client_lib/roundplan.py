"""One lookup or update round planned flat: every table's keys grouped by shard, cut into the
round's messages and laid out for sending and for the replies (protocol v2, docs/protocol.md) —
what a plan is (:class:`RoundPlan`), what the C plan reads of the config (:class:`TableArrays`)
and the numpy steps around it. The plan itself is made in one C call
(:func:`embnic.client_lib.native.prepare`, ``client_lib/csrc/plan.c``), the one production cut.

A round's input is flat, TorchRec's jagged layout: ``tix`` int64 (T,) the tables of the call
(indices into :class:`TableArrays`), ``counts`` int64 (T,) keys per table and ``keys`` uint64
(N,) every table's keys one table after the other (the *call order*: key ``i`` is key
``i - ko[t]`` of table ``t``, ``ko = [0, cumsum(counts)]``). A plan gives

- ``order`` int64 (N,): the *grouped order* — by shard (stable), so within a shard by table,
  then key order — as indices into the call order; a message is a contiguous range of it;
- the messages (:attr:`RoundPlan.msgs`, one row each, :data:`MSG_COLUMNS`): a shard's keys cut
  into as few messages as fit ``msg_frames`` fragments each way and the send window, in table
  order;
- the directory of every message in one :data:`codec.DIR_DTYPE` array (``dir``);
- the reply layout of a lookup (:meth:`RoundPlan.out_layout`): where each row goes in one flat
  output buffer, so a reply fragment's bytes go straight to their rows in the C round, whatever
  table they belong to.

Worked example (2 shards, hash sharding, tables 0 and 1 of 3 and 2 keys)::

    tix=[0, 1], counts=[3, 2], keys=[a0, a1, a2, b0, b1]    # call order
    shard of each key: [1, 0, 1, 0, 0]
    order = [1, 3, 4, 0, 2]   # shard 0: a1 | b0 b1, shard 1: a0 a2
    messages (shards in the order a walk over the tables meets them: table 0 has keys of both,
    so by index): shard 0 keys order[0:3], directory [table 0: 1 key, table 1: 2 keys]; shard 1
    keys order[3:5], directory [table 0: 2 keys]
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .config import ClusterConfig
from .consts import DType
from .splitmix import splitmix64

#: columns of :attr:`RoundPlan.msgs` (int64 (M, len)), in this order
MSG_COLUMNS = ("shard", "dir0", "num_tables", "ka", "kb", "num_keys", "value_len", "voff", "msg_len", "frames",
               "reply_frames")
(C_SHARD, C_DIR0, C_NT, C_KA, C_KB, C_NKEYS, C_VLEN, C_VOFF, C_MSGLEN, C_FRAMES, C_RFRAMES) = range(len(MSG_COLUMNS))


class TableArrays:
    """The config's tables as arrays sorted by id (what a round needs of them, per table):
    ``ids`` int64, ``dim`` int64, ``dtype`` int64 (wire code), ``esize`` int64 (bytes per value on
    the wire), ``rows`` uint64 (0 where unbounded), ``bounded`` bool, ``shard_idx`` int64 (the
    index into ``cfg.shards`` owning the table under ``table`` sharding), ``lr`` float32,
    ``adagrad`` bool; ``tables`` the :class:`TableConfig` objects in the same order."""

    def __init__(self, cfg: ClusterConfig):
        ts = sorted(cfg.tables, key=lambda t: t.id)
        self.tables = ts
        self.ids = np.array([t.id for t in ts], np.int64)
        self.dim = np.array([t.dim for t in ts], np.int64)
        self.dtype = np.array([int(t.wire_dtype) for t in ts], np.int64)
        self.esize = np.where(self.dtype == DType.FP16, 2, 4).astype(np.int64)
        self.row_bytes = self.dim * self.esize
        self.rows = np.array([t.rows or 0 for t in ts], np.uint64)
        self.bounded = np.array([t.rows is not None for t in ts], bool)
        self.lr = np.array([t.lr for t in ts], np.float32)
        self.adagrad = np.array([t.optimizer == "adagrad" for t in ts], bool)
        pos = {s.id: i for i, s in enumerate(cfg.shards)}
        self.shard_idx = np.array([pos[t.shard] if t.shard is not None else t.id % len(cfg.shards) for t in ts],
                                  np.int64)
        self.sharding = cfg.sharding
        self.num_shards = len(cfg.shards)
        #: (tables, 7): id, row bytes, dim, dtype, shard index, rows (0: any id), adagrad — what the
        #: C plan reads (native.prepare), with ``lr64`` float64 (tables,)
        self.cfg = np.ascontiguousarray(np.stack([self.ids, self.row_bytes, self.dim, self.dtype, self.shard_idx,
                                                  self.rows.view(np.int64), self.adagrad.astype(np.int64)], axis=1))
        self.lr64 = np.array([t.lr for t in ts], np.float64)

    def index(self, table_ids) -> np.ndarray:
        """Positions of ``table_ids`` (int (T,)) in the arrays: int64 (T,), -1 where a table is not
        configured."""
        t = np.asarray(table_ids).astype(np.int64, copy=False).reshape(-1)
        if not len(self.ids):
            return np.full(t.shape, -1, np.int64)
        i = np.minimum(np.searchsorted(self.ids, t), len(self.ids) - 1)
        return np.where(self.ids[i] == t, i, -1)


@dataclasses.dataclass
class RoundPlan:
    """A planned round (module docstring). Arrays in the grouped order unless said otherwise."""

    msg_type: int
    tix: np.ndarray  #: int64 (T,) the call's tables (indices into TableArrays)
    counts: np.ndarray  #: int64 (T,) keys per table of the call
    ko: np.ndarray  #: int64 (T+1,) where each table's keys start in the call order
    order: np.ndarray  #: int64 (N,) grouped position -> call index
    keys: np.ndarray  #: uint64 (N,) the keys, grouped
    tkey: np.ndarray  #: int64 (N,) table of each grouped key (index into the call's T)
    rb: np.ndarray  #: int64 (N,) wire bytes of each grouped key's row
    so: np.ndarray  #: int64 (N+1,) exclusive cumsum of rb: a key's row bytes in the round's values
    dir: np.ndarray  #: codec.DIR_DTYPE (D,) every message's directory, message after message
    msgs: np.ndarray  #: int64 (M, len(MSG_COLUMNS)), in sending order (shards by first key of the call)
    uniform: bool  #: every table of the call fp32 of one dim: rows are plain (N, dim) float32 arrays
    dim: int  #: that dim when ``uniform``
    ta: TableArrays
    dst: np.ndarray | None = None  #: int64 (N,) a lookup's row offsets (:meth:`out_layout`)
    V: int | None = None  #: float32 values of the round's rows
    nbytes: int | None = None  #: bytes of a lookup's output buffer
    vo: np.ndarray | None = None  #: int64 (T+1,) where each table's values start
    dims: np.ndarray | None = None  #: int64 (T,) each table's dim
    #: the C plan's (native.prepare): int64 (M, native.NCOL) the message rows in sending order with
    #: their ids and type, the rows in the send queue's order, an update's value bytes (None where
    #: fp16 tables need :meth:`values`), the first id of the round and the one after its last
    tab: np.ndarray | None = None
    qorder: np.ndarray | None = None
    vals: np.ndarray | None = None
    first_id: int = 0
    next_id: int = 0

    @property
    def num_msgs(self) -> int:
        return len(self.msgs)

    # -- updates: the gradients as the round's value bytes -----------------------------------

    def values(self, grads: np.ndarray) -> np.ndarray:
        """The update's gradients as wire bytes in the grouped order: uint8 (so[-1],); message
        ``m``'s are ``[voff, voff + value_len)``. ``grads``: float32, the call's gradients flat in
        the call order (table ``t``'s ``(counts[t], dim_t)`` rows one table after the other).
        fp16 tables' values are rounded to fp16 (the wire's rounding)."""
        ta = self.ta  # (the C plan makes the bytes of a round without fp16 tables itself: plan.vals)
        kdim = np.repeat(ta.dim[self.tix], self.counts)  # call order
        h = np.repeat(np.repeat(ta.dtype[self.tix], self.counts), kdim) == DType.FP16  # value of an fp16 table
        es = np.where(h, 2, 4)
        start = np.zeros(grads.size, np.int64)  # each value's first byte, call order
        np.cumsum(es[:-1], out=start[1:])
        out = np.empty(int(es.sum()), np.uint8)
        f = ~h
        out[concat_ranges(start[f], np.full(int(f.sum()), 4))] = np.ascontiguousarray(grads[f], "<f4").view(np.uint8)
        out[concat_ranges(start[h], np.full(int(h.sum()), 2))] = grads[h].astype("<f2").view(np.uint8)
        wstart = np.zeros(self.order.size + 1, np.int64)  # each key's row, call order
        np.cumsum(np.repeat(ta.row_bytes[self.tix], self.counts), out=wstart[1:])
        return out[concat_ranges(wstart[:-1][self.order], self.rb)]

    # -- lookups: where every reply row goes ---------------------------------------------------

    def out_layout(self) -> tuple[np.ndarray, int, int]:
        """The lookup's output buffer: ``(dst int64 (N,), values V, bytes)``. The buffer is uint8
        of ``bytes``: first V float32 values — table ``t``'s ``(counts[t], dim_t)`` rows one table
        after the other (call order) —, then an fp16 staging area for fp16 tables' rows as they
        come, 2 bytes a value, one table after the other (converted by :meth:`finish`). ``dst``:
        byte offset of each grouped key's row (laid out by the C plan, ``native.prepare``)."""
        return self.dst, self.V, self.nbytes

    def finish(self, out: np.ndarray) -> np.ndarray:
        """The float32 values (V,) of a lookup's filled output buffer ``out`` (uint8, of
        :meth:`out_layout`), fp16 tables' staged rows converted."""
        vo = self.vo
        V = int(vo[-1])
        vals = out[:4 * V].view(np.float32)
        if not self.uniform and out.size > 4 * V:  # fp16 tables' rows are staged after the values
            fp16 = self.ta.dtype[self.tix] == DType.FP16
            vals[concat_ranges(vo[:-1], np.where(fp16, np.diff(vo), 0))] = out[4 * V:].view("<f2").astype(np.float32)
        return vals

    def split(self, vals: np.ndarray) -> dict[int, np.ndarray]:
        """``{table_id: rows float32 (counts[t], dim_t)}`` views of :meth:`finish`'s values."""
        return split_rows(self.ta, self.tix, self.counts, vals)


def split_rows(ta: TableArrays, tix: np.ndarray, counts: np.ndarray, vals: np.ndarray) -> dict[int, np.ndarray]:
    """``{table_id: float32 (counts[t], dim_t)}`` views of a flat round's rows ``vals`` (tables
    ``tix``, indices into ``ta``, one after the other)."""
    dims = ta.dim[tix]
    vo = np.concatenate([[0], np.cumsum(counts * dims)])
    return {t: vals[a:b].reshape(-1, d) for t, a, b, d in
            zip(ta.ids[tix].tolist(), vo[:-1].tolist(), vo[1:].tolist(), dims.tolist())}


def concat_ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, s + l)`` for every (s, l): int64 (Σ lens,), with no loop."""
    starts = np.asarray(starts, np.int64)
    lens = np.asarray(lens, np.int64)
    tot = int(lens.sum())
    if tot == 0:
        return np.zeros(0, np.int64)
    cl = np.zeros(lens.size, np.int64)
    np.cumsum(lens[:-1], out=cl[1:])
    return np.repeat(starts - cl, lens) + np.arange(tot, dtype=np.int64)


def shard_index(ta: TableArrays, tix: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Index into ``cfg.shards`` owning each key (call order): int64 (N,) — the rule of
    :func:`embnic.client_lib.routing.shard_index_of`, over every table at once (one hash under
    ``hash`` sharding, each key's table in the top 16 bits; a constant per table under
    ``table``)."""
    if ta.sharding == "table":
        return np.repeat(ta.shard_idx[tix], counts)
    t48 = np.repeat(ta.ids[tix].astype(np.uint64) << np.uint64(48), counts)
    return (splitmix64(keys ^ t48) % np.uint64(ta.num_shards)).astype(np.int64)
