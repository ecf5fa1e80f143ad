"""The shard's answer path in C (``testbed/server/csrc/``, built with the package as
``libembnic_shard``, :mod:`embnic.client_lib.clib`) through ctypes: the one production
implementation of the shard's header checks, grouping of fragments, lookups and reply framing
(docs/server.md, "The answer path in C").

Per wake-up :meth:`CAnswer.serve` is one call: every header checked, the lookups it can take
answered straight from the receive buffer from the shard's
:class:`~embnic.client_lib.rowstore.RowStore` (its arrays read in place through the
``struct embnic_store`` the store keeps current, :attr:`RowStore.cstore`). What it leaves the
serving loop handles with the state's rules (:mod:`.engine`); :meth:`CAnswer.lookups` answers the
lookups the loop reassembled, :meth:`CAnswer.update_ok` tells the state which updates pass every
table rule as they are, :meth:`CAnswer.add_spec` queues the replies the loop decides,
:meth:`CAnswer.send` sends them all.
:func:`load` refuses a library that is missing, built from other sources or for another
protocol, or whose structs (numpy dtypes below, 8-byte fields in the order of ``csrc/shard.h``)
differ. The numpy oracle the tests compare it with: ``tests/testbed/shard_oracle.py``.
"""
from __future__ import annotations

import ctypes

import numpy as np

from embnic.client_lib import clib, consts
from embnic.client_lib.table_numerics import CStore

from . import udpio
from .shard_state import ShardState

_NF = len(consts.HEADER_FIELDS)


def _struct(fields: list[str], tail: list[tuple] = ()) -> np.dtype:
    return np.dtype([(f, "<u8" if f.startswith("p_") else "<i8") for f in fields] + list(tail))


#: struct embnic_shard_tables
TABLES = _struct(["p_dim", "p_dtype", "p_rows", "p_has_rows", "p_owns_all", "p_li", "p_shard_ids", "nshards",
                  "hash_sharding", "shard_id"])
ST = ("rx_frames", "rx_bytes", "messages", "whole", "lookup_keys", "tx_frames", "tx_bytes", "send_calls",
      "gso_sends", "send_errors", "gso_fallbacks", "sent_frames", "answered")
NB_ST = 16
#: struct embnic_answer
ANSWER = _struct(["p_rx", "slot", "p_lens", "p_names", "p_cols", "p_ok", "p_p", "p_order", "p_grp", "p_taken",
                  "p_mg", "p_tx", "p_txlen", "width", "tx_cap", "ntx", "p_rq_idx", "p_rq_start", "p_rq_count",
                  "p_rq_name", "rq_cap", "nrq", "p_rq_order", "p_req_buf", "req_cap", "p_rep_buf", "rep_cap", "p_work",
                  "p_tables", "p_store", "P", "max_msg", "max_reply", "shard_id", "pending_empty", "serve", "fd",
                  "gso", "p_mmsg", "p_iov", "p_cmsg", "send_cap"], [("stats", "<i8", (NB_ST,))])
#: struct embnic_reply_spec
SPEC = np.dtype({"names": ["idx", "p_body", "body_len", "msg_id", "client_id", "num_tables", "num_keys", "value_len",
                           "status", "table_id", "msg_type", "name"],
                 "formats": ["<i8", "<u8", "<i8", "<u4", "<u2", "<u2", "<u4", "<u4", "<u2", "<u2", "u1", "V16"],
                 "offsets": [0, 8, 16, 24, 28, 30, 32, 36, 40, 42, 44, 48], "itemsize": 64})
SEND_CAP = 1024  #: sendmmsg entries per call
WORK_BYTES = 0  #: the C path's scratch per shard (embnic_shard_layout, set by load())
_VP = ctypes.c_void_p
_lib: ctypes.CDLL | None = None


def _ptr(a: np.ndarray | None) -> int:
    return 0 if a is None else a.__array_interface__["data"][0]


def _bind(lib: ctypes.CDLL) -> None:
    """Declare the argument and result types of the library's functions."""
    i64 = ctypes.c_int64
    for name, res, args in (
            ("embnic_shard_check", ctypes.c_int, [_VP, i64, _VP, ctypes.c_int, i64, i64, i64, _VP, _VP, _VP]),
            ("embnic_shard_whole", ctypes.c_int, [_VP, _VP, _VP, ctypes.c_int, _VP, _VP]),
            ("embnic_shard_layout", None, [_VP]),
            ("embnic_shard_serve", i64, [_VP, ctypes.c_int]),
            ("embnic_shard_emit", i64, [_VP, _VP, i64]),
            ("embnic_shard_send", i64, [_VP]),
            ("embnic_shard_lookups", i64, [_VP, _VP, i64, _VP]),
            ("embnic_shard_update_ok", i64, [_VP, _VP, i64, i64, i64, i64, _VP])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


def load() -> ctypes.CDLL:
    """The shard library, loaded and checked once.

    Raises:
        NativeLibraryError: it is missing, was built from other sources or for another protocol
            (``embnic_shard_abi() != VERSION * 1000 + header fields``), or its structs differ
            from this module's — one line naming the rebuild command.
    """
    global _lib, WORK_BYTES
    if _lib is not None:
        return _lib
    lib = clib.load(clib.SHARD, consts.VERSION, abi=("embnic_shard_abi", consts.VERSION * 1000 + _NF))
    _bind(lib)
    lay = np.zeros(8, np.int64)  # the struct sizes, the stats' offset and count, the work buffer's bytes
    lib.embnic_shard_layout(lay.ctypes.data)
    want_lay = [ANSWER.itemsize, ANSWER.fields["stats"][1], ctypes.sizeof(CStore), TABLES.itemsize, SPEC.itemsize,
                NB_ST]
    if lay[:6].tolist() != want_lay:
        raise clib.NativeLibraryError(f"embnic: {clib.SHARD.path}'s structs {lay[:6].tolist()} differ from "
                                      f"canswer's {want_lay}: run {clib.REBUILD}")
    WORK_BYTES = int(lay[6])
    _lib = lib
    return lib


class CAnswer:
    """The C answer path of one serving loop, on its opened batch socket: the header checks'
    outputs, the transmit buffer and the reply queue.

    Args:
        bs: the loop's :class:`~.udpio.BatchSocket` (its receive buffers are read in place).
        state: the shard's :class:`~.shard_state.ShardState` (the per-table arrays the checks read,
            the row store, the limits).
        serve: answer lookups in C (False: only checks, reply frames and sending in C).

    Attributes:
        cols, ok, p, taken: after :meth:`serve`, per datagram of the wake-up: the header fields
            (int64 (batch, 19), columns :data:`consts.HEADER_COLUMN`), whether the fast path
            takes it, its fragment size (0 for a single frame), whether it was answered here.
        serving: lookups answered here. name, intake_name: what the counters call this path.

    Raises:
        NativeLibraryError: as :func:`load`.
    """

    intake_name = "c"

    def __init__(self, bs: udpio.BatchSocket, state: ShardState, serve: bool = True):
        lib = self._lib = load()
        batch = bs.batch
        self.P = P = consts.max_body_per_frame(state.mtu)
        self._state = state
        self.cols = np.zeros((batch, _NF), np.int64)
        self.ok = np.zeros(batch, np.uint8)
        self.p = np.zeros(batch, np.int64)
        self._check_args = (_ptr(bs.rx), bs.rx.shape[1], _ptr(bs.lens), state.shard_id, state.max_msg,
                            state.max_reply_bytes, _ptr(self.cols), _ptr(self.ok), _ptr(self.p))
        self._order = np.zeros(batch, np.int64)
        self._grp = np.zeros((batch, 6), np.int64)
        self._worder = np.zeros(batch, np.int64)  # whole()'s own outputs
        self._wgrp = np.zeros((batch, 6), np.int64)
        self.taken = np.zeros(batch, np.uint8)
        self._mg = np.zeros(batch, np.int64)
        self._req = np.empty(consts.MAX_FRAGS * P, np.uint8)  # a whole lookup request (≤ MAX_FRAGS frames)
        self._rep = np.empty(max(state.max_reply_bytes, 1), np.uint8)  # a lookup reply's rows
        self._work = np.empty(WORK_BYTES, np.uint8)  # a lookup's keys sorted by their place in the index
        self._mmsg = np.zeros(SEND_CAP * 64, np.uint8)
        self._iov = np.zeros(SEND_CAP * 16, np.uint8)
        self._cmsg = np.zeros(SEND_CAP * 24, np.uint8)
        self._specs = np.zeros(64, SPEC)
        self._nspec = 0
        self._keep: list = []  # the bodies the specs point into, alive until emitted
        self._tables = self._table_struct(state)
        serve = serve and state.store is not None
        self.serving = bool(serve)  #: lookups answered here (else checks, frames and sending only)
        self.name = "c" if self.serving else "c-frames"
        # the store's own struct embnic_store (kept current by the store: updates move it), or an empty one
        self._store = state.store.cstore if state.store is not None else CStore()
        a = np.zeros(1, ANSWER)
        a["p_rx"], a["slot"], a["p_lens"], a["p_names"] = _ptr(bs.rx), bs.rx.shape[1], _ptr(bs.lens), _ptr(bs.names)
        a["p_cols"], a["p_ok"], a["p_p"] = _ptr(self.cols), _ptr(self.ok), _ptr(self.p)
        a["p_order"], a["p_grp"], a["p_taken"], a["p_mg"] = (_ptr(self._order), _ptr(self._grp), _ptr(self.taken),
                                                           _ptr(self._mg))
        a["width"] = consts.HDR_LEN + P
        a["p_req_buf"], a["req_cap"] = _ptr(self._req), self._req.size
        a["p_rep_buf"], a["rep_cap"] = _ptr(self._rep), self._rep.size
        a["p_work"] = _ptr(self._work)
        a["p_tables"], a["p_store"] = _ptr(self._tables), ctypes.addressof(self._store)
        a["P"], a["max_msg"] = P, state.max_msg
        a["max_reply"], a["shard_id"] = state.max_reply_bytes, state.shard_id
        a["serve"], a["fd"], a["gso"] = int(bool(serve)), bs.fd, int(bs.gso)
        a["p_mmsg"], a["p_iov"], a["p_cmsg"], a["send_cap"] = (_ptr(self._mmsg), _ptr(self._iov), _ptr(self._cmsg),
                                                             SEND_CAP)
        self.ctx = a
        self._p_ctx = _ptr(a)
        self._a = a[0]  # a view of the one record (field reads and writes)
        self._grow_tx(256)
        self._grow_rq(4 * batch)
        self._serve = lib.embnic_shard_serve
        if self.serving:  # an update's table rules checked in C first (the state's rules decide the rest)
            self._gbound = state.tgbound
            state.update_ok = self.update_ok

    def _table_struct(self, state: ShardState) -> np.ndarray:
        """struct embnic_shard_tables over the state's per-table-id arrays (read in place; uint8
        views of its bools) and the local index of each table in the row store (-1: not in it)."""
        store = state.store
        li = np.full(1 << 16, -1, np.int64)
        if store is not None:
            li[store.table_ids] = np.arange(store.table_ids.size)
        li[~state.in_store] = -1
        cfg = state.cfg
        self._keep_tables = (li, np.array([sh.id for sh in cfg.shards], np.int64), state.thas_rows.view(np.uint8),
                             state.towns_all.view(np.uint8))
        _, shard_ids, has_rows, owns_all = self._keep_tables
        t = np.zeros(1, TABLES)
        t["p_dim"], t["p_dtype"], t["p_rows"] = _ptr(state.tdim), _ptr(state.tdtype), _ptr(state.trows)
        t["p_has_rows"], t["p_owns_all"], t["p_li"] = _ptr(has_rows), _ptr(owns_all), _ptr(li)
        t["p_shard_ids"], t["nshards"] = _ptr(shard_ids), shard_ids.size
        t["hash_sharding"], t["shard_id"] = int(cfg.sharding == "hash"), state.shard_id
        return t

    # -- buffers ------------------------------------------------------------------------------

    def _grow(self, cap_key: str, used_key: str, need: int, bufs) -> None:
        """Make the context's buffers ``bufs`` (``(attribute, pointer field, row shape, dtype,
        keep)``, ``cap_key`` rows each, ``used_key`` of them in use) hold ``need`` rows: twice as
        many or ``need``, the rows in use copied where ``keep``."""
        a = self._a
        cap = int(a[cap_key])
        if need <= cap:
            return
        cap = max(need, 2 * cap)
        used = int(a[used_key])
        for attr, field, shape, dt, keep in bufs:
            new = np.zeros((cap, *shape), dt)
            if used and keep:
                new[:used] = getattr(self, attr)[:used]
            setattr(self, attr, new)
            a[field] = _ptr(new)
        a[cap_key] = cap

    def _grow_tx(self, need: int) -> None:
        """The transmit buffer (a frame a row) and its frame lengths."""
        self._grow("tx_cap", "ntx", need, (("tx", "p_tx", (int(self._a["width"]),), np.uint8, True),
                                           ("txlen", "p_txlen", (), np.int64, True)))

    def _grow_rq(self, need: int) -> None:
        """The reply queue's columns (``order``: the send's scratch) and its names."""
        self._grow("rq_cap", "nrq", need, [(f"_rq_{n}", f"p_rq_{n}", (), np.int64, n != "order")
                                           for n in ("idx", "start", "count", "order")]
                   + [("_rq_name", "p_rq_name", (16,), np.uint8, True)])

    def update_ok(self, h, body: np.ndarray) -> bool:
        """Whether update ``h`` (its ``num_tables``, ``num_keys``, ``value_len``) with its whole body
        ``body`` (uint8, C-contiguous) passes every table rule as it is (``embnic_shard_update_ok``:
        directory, tables in the row store, keys in range, this shard's and increasing per table,
        gradients below their tables' bound); False: let the state's rules decide."""
        return bool(self._lib.embnic_shard_update_ok(self._p_ctx, _ptr(body), body.size, h.num_tables, h.num_keys,
                                                     h.value_len, _ptr(self._gbound)))

    # -- per wake-up --------------------------------------------------------------------------

    def check(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The header checks alone of frames ``0..n-1`` of the last receive (what :meth:`serve`
        does first): (:attr:`cols` (n, 19), :attr:`ok` as bool (n,), :attr:`p` (n,))."""
        self._lib.embnic_shard_check(*self._check_args[:3], n, *self._check_args[3:])
        return self.cols[:n], self.ok[:n].view(bool), self.p[:n]

    def whole(self, mg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Group the multi-fragment frames ``mg`` (int64, ascending indices into the last checks'
        arrays) by message: (order int64 (m,) positions into ``mg`` sorted by message then
        fragment index, groups int64 (G, 6): first position in ``order``, frames, first and last
        datagram index, fragment size P, 1 if whole — every fragment once, headers that agree)."""
        mg = np.ascontiguousarray(mg, np.int64)
        g = self._lib.embnic_shard_whole(_ptr(self.cols), _ptr(self.p), _ptr(mg), mg.size, _ptr(self._worder),
                                         _ptr(self._wgrp))
        return self._worder[:mg.size], self._wgrp[:g]

    def serve(self, n: int, pending_empty: bool) -> int:
        """Check the ``n`` datagrams of the last receive (:attr:`cols`, :attr:`ok`, :attr:`p`, as
        :meth:`check`) and answer the lookups the C path takes
        (:attr:`taken` marks their frames). ``pending_empty``: no message is being reassembled.
        Returns the frames taken."""
        self._a["pending_empty"] = pending_empty
        return self._growing(lambda: self._serve(self._p_ctx, n), 2 * n)

    def _growing(self, call, replies: int) -> int:
        """``call()`` until it fits: a negative result ``-rows`` (nothing was done) grows the
        transmit buffer to ``ntx + rows`` rows and the reply queue by ``replies``, then again."""
        a = self._a
        r = call()
        while r < 0:
            self._grow_tx(int(a["ntx"]) - int(r))
            self._grow_rq(int(a["nrq"]) + replies)
            r = call()
        return int(r)

    def lookups(self, q: list) -> np.ndarray:
        """Answer the lookups ``q`` (``(request, parsed body)`` as the loop queues them: whole
        requests it reassembled) in C where the C path's rules allow. Returns
        bool (len(q),): answered (replies queued); the others are the loop's to answer (errors,
        tables in another store, ...)."""
        k = len(q)
        sp = np.array([(r.idx, _ptr(r.body), r.body.size, r.msg_id, r.client_id, r.num_tables, r.num_keys,
                        r.value_len, 0, 0, 0, r.name) for r, _ in q], SPEC)
        done = np.zeros(k, np.uint8)
        self._growing(lambda: self._lib.embnic_shard_lookups(self._p_ctx, _ptr(sp), k, _ptr(done)), k)
        return done.view(bool)

    def add_spec(self, idx: int, name: bytes, msg_type: int, status: int, table_id: int, req,
                 body: np.ndarray | None) -> None:
        """Queue a reply the loop decided (its frames are built by :meth:`emit`) to request ``req``
        (a :class:`~.shard_state.Request` or a codec ``Header``: its ``client_id``, ``msg_id``,
        ``num_tables``, ``num_keys`` and ``value_len`` are copied) of datagram ``idx`` from
        ``name`` (a ``sockaddr_in``); ``body`` a C-contiguous uint8 array or None."""
        k = self._nspec
        if k == self._specs.size:
            sp = np.zeros(2 * k, SPEC)
            sp[:k] = self._specs
            self._specs = sp
        cid, mid, nt, nk, vl = req.client_id, req.msg_id, req.num_tables, req.num_keys, req.value_len
        if body is None or body.size == 0:
            p, ln = 0, 0
        else:
            p, ln = _ptr(body), int(body.size)
            self._keep.append(body)
        self._specs[k] = (idx, p, ln, mid, cid, nt, nk, vl, status, table_id, msg_type, name)
        self._nspec = k + 1

    def replies(self) -> int:
        """Replies queued for this wake-up (served here and decided by the loop)."""
        return int(self._a["nrq"]) + self._nspec

    def emit(self) -> None:
        """Build the frames of the replies :meth:`add_spec` queued."""
        k = self._nspec
        if not k:
            return
        self._growing(lambda: self._lib.embnic_shard_emit(self._p_ctx, _ptr(self._specs), k), k)
        self._nspec = 0
        self._keep.clear()

    def send(self) -> int:
        """Build the pending replies' frames and send the whole queue (emptied). Returns the
        frames handed to the kernel."""
        self.emit()
        return int(self._lib.embnic_shard_send(self._p_ctx))

    def clear(self) -> None:
        """Drop every reply of this wake-up unsent (the write-ahead log could not be committed)."""
        self._a["ntx"] = 0
        self._a["nrq"] = 0
        self._nspec = 0
        self._keep.clear()

    # -- counters -----------------------------------------------------------------------------

    @property
    def gso(self) -> bool:
        """Whether multi-frame replies still go as GSO super-datagrams."""
        return bool(self._a["gso"])

    def stats(self) -> dict[str, int]:
        """The C path's counters so far (cumulative)."""
        st = self._a["stats"]
        return {k: int(st[i]) for i, k in enumerate(ST)}
