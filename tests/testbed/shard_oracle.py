"""The numpy oracle of the shard's C intake and answer path (``testbed/server/csrc/``, production:
:mod:`embnic.testbed.server.canswer`): the same header checks (:meth:`NumpyAnswer.check_vector`,
and frame by frame with the codec's own functions, :meth:`NumpyAnswer.check_scalar`), the same
grouping of fragments by message (:meth:`NumpyAnswer.group`), the same reply frames
(:class:`ReplyBuilder`, ``codec.encode_reply``'s bytes) sent with ``sendmmsg`` + GSO
(:meth:`embnic.testbed.server.udpio.BatchSocket.send`).

:class:`NumpyAnswer` has the answer path's interface, so a serving loop runs on it
(``BatchShardServer(..., answer_path=numpy_path(small=...))``): the engine tests run the same
streams through both and compare every reply frame, counter and row; ``test_c_intake_equals_the_numpy_intake``
compares the checks and the grouping directly. It answers no lookup itself (``serving`` False):
the loop's numpy gather does.
"""
from __future__ import annotations

import functools
import struct

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.codec import FrameError
from embnic.client_lib.consts import HEADER_COLUMN as COL, MsgType
from embnic.client_lib.reassembly import fragment_size
from embnic.testbed.server import udpio
from embnic.testbed.server.intake import (FC, FI, FL, FO, ML, MT, NK, NT, SID, VL, SAME_COLS, SAME_FC, SAME_P,
                                          message_key)

_ZERO = (0,) * len(consts.HEADER_FIELDS)
_FIELDS = [f[0] for f in consts.HEADER_FIELDS]
_FOFF = dict((f[0], f[1]) for f in consts.HEADER_FIELDS)
_FRAG_AT = _FOFF["frag_offset"]  #: frag_offset (u32) then frag_index (u16): 6 bytes
_FLEN_AT = _FOFF["frag_len"]
assert _FOFF["frag_index"] == _FRAG_AT + 4
_U4 = np.dtype(">u4")
_U2 = np.dtype(">u2")
_U2BE = struct.Struct(">H")
_ST = ("rx_frames", "rx_bytes", "messages", "whole", "lookup_keys", "tx_frames", "tx_bytes", "send_calls",
       "gso_sends", "send_errors", "gso_fallbacks", "sent_frames", "answered")


def numpy_path(small: int = 4):
    """An ``answer_path`` for :class:`~embnic.testbed.server.engine.BatchShardServer`: the numpy
    oracle, checking wake-ups of at most ``small`` frames frame by frame."""
    return functools.partial(NumpyAnswer, small=small)


class NumpyAnswer:
    """The numpy oracle of :class:`~embnic.testbed.server.canswer.CAnswer` (same interface).

    Args:
        bs: the loop's batch socket. state: the shard's ``ShardState``. serve: ignored (the
        oracle answers no lookup itself). small: wake-ups of at most this many frames are
        checked frame by frame (:meth:`check_scalar`), larger ones as vectors (:meth:`check_vector`).
    """

    name = intake_name = "numpy"
    serving = False

    def __init__(self, bs: udpio.BatchSocket, state, serve: bool = False, small: int = 4):
        self.bs, self.state, self.small = bs, state, int(small)
        self.max_msg, self.max_reply, self.shard_id = state.max_msg, state.max_reply_bytes, state.shard_id
        self.cols = np.zeros((bs.batch, len(_FIELDS)), np.int64)
        self.ok = np.zeros(bs.batch, np.uint8)
        self.p = np.zeros(bs.batch, np.int64)
        self.taken = np.zeros(bs.batch, np.uint8)
        self.rb = ReplyBuilder(state.shard_id, state.mtu)
        self._st = dict.fromkeys(_ST, 0)

    @property
    def gso(self) -> bool:
        return bool(self.bs.gso)

    def serve(self, n: int, pending_empty: bool) -> int:
        """The header checks of the ``n`` frames (into :attr:`cols`, :attr:`ok`, :attr:`p`); no
        frame taken. Returns 0."""
        cols, ok, p = self.check_vector(n) if n > self.small else self.check_scalar(n)
        self.cols[:n], self.ok[:n], self.p[:n] = cols, ok, p
        return 0

    def whole(self, mg: np.ndarray):
        """:meth:`group` in the C path's output form: (order, groups int64 (G, 6))."""
        order, start, cnt, first, last, gP, whole = self.group(mg, self.cols, self.p)
        return order, np.stack([start, cnt, first, last, gP, whole.astype(np.int64)], axis=1)

    def lookups(self, q: list) -> np.ndarray:
        return np.zeros(len(q), bool)

    def add_spec(self, *args) -> None:
        self.rb.add_spec(*args)

    def replies(self) -> int:
        return self.rb.replies()

    def send(self) -> None:
        rb = self.rb
        if not rb.replies():
            rb.clear()
            return
        self._st["tx_frames"] += rb.ntx
        self._st["tx_bytes"] += rb.queued_bytes()
        rb.send(self.bs)

    def clear(self) -> None:
        self.rb.clear()

    def stats(self) -> dict:
        return dict(self._st)

    def check_vector(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Header fields of the ``n`` frames (int64 (n, 19), columns :data:`consts.HEADER_COLUMN`),
        whether the fast path takes each (bool (n,)) and its fragment size P (0 for single
        frames): all frames at once, the rules of ``codec.parse_header``,
        ``ShardState.check_header`` and :func:`~embnic.client_lib.reassembly.fragment_size`
        as vector expressions (what ``embnic_shard_check`` does in C)."""
        bs = self.bs
        L = bs.lens[:n]
        H = np.ascontiguousarray(bs.rx[:n, :consts.HDR_LEN]).view(codec.HEADER_DTYPE).reshape(n)
        cols = np.empty((n, len(_FIELDS)), np.int64)
        for j, f in enumerate(_FIELDS):  # 19 field copies (structured_to_unstructured costs 10x)
            cols[:, j] = H[f]
        mt, nt, nk, vl, ml = cols[:, MT], cols[:, NT], cols[:, NK], cols[:, VL], cols[:, ML]
        fo, fi, fc, fl = cols[:, FO], cols[:, FI], cols[:, FC], cols[:, FL]
        lookup = mt == MsgType.LOOKUP_REQ
        expect = consts.DIR_ENTRY * nt + consts.KEY_SIZE * nk + np.where(lookup, 0, vl)
        ok = ((L >= consts.HDR_LEN) & (cols[:, COL["magic"]] == consts.MAGIC)
              & (cols[:, COL["version"]] == consts.VERSION) & (lookup | (mt == MsgType.UPDATE_REQ))
              & (fl == L - consts.HDR_LEN) & (fc >= 1) & (fi < fc) & (fo + fl <= ml) & (ml == expect)
              & (nt >= 1) & (nk >= nt) & (vl >= 2 * nk)
              & (fc <= consts.MAX_FRAGS) & (ml <= self.max_msg)
              & (cols[:, SID] == self.shard_id) & ~(lookup & (vl > self.max_reply)))
        # fragment geometry (reassembly.fragment_size)
        single = fc == 1
        last = (fi == fc - 1) & ~single
        safe_fi = np.maximum(fi, 1)
        safe_fl = np.maximum(fl, 1)
        p = np.where(last, fo // safe_fi, np.where(single, 0, fl))
        g_single = (fo == 0) & (fl == ml)
        g_mid = (fl > 0) & (fo == fi * fl) & (-(-ml // safe_fl) == fc)
        g_last = (fo % safe_fi == 0) & (fo + fl == ml) & (fl > 0) & (fl <= p)
        ok &= np.where(single, g_single, np.where(last, g_last, g_mid))
        return cols, ok, p

    def check_scalar(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As :meth:`check_vector`, frame by frame with the codec's and the state's own functions (cheaper
        than a dozen vector operations when a wake-up brings a few frames)."""
        bs = self.bs
        rows, ok, p = [], [], []
        for i in range(n):
            try:
                h = codec.parse_header(memoryview(bs.rx[i, :bs.lens[i]]), expect="request")
                good = h.msg_len <= self.max_msg and h.msg_type != MsgType.SIZE_REQ and self.state.check_header(h) is None
                pp = fragment_size(h) if good else 0
            except FrameError:
                h, good, pp = _ZERO, False, 0
            rows.append(h)
            ok.append(good)
            p.append(pp)
        return np.array(rows, np.int64).reshape(n, len(consts.HEADER_FIELDS)), np.array(ok, bool), np.array(p, np.int64)

    @staticmethod
    def group(mg: np.ndarray, cols: np.ndarray, p: np.ndarray):
        """The multi-fragment frames ``mg`` grouped by message (numpy; ``embnic_shard_whole``
        does the same in C): (order: positions into ``mg`` by message key,
        then fragment index, then arrival; per group: first position in ``order``, frames,
        first and last datagram index, fragment size P, whether every fragment came once with
        headers that agree)."""
        c = cols[mg]
        key = message_key(c)
        order = np.lexsort((c[:, FI], key))  # by message, then fragment index
        ks = key[order]
        start = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
        cnt = np.diff(np.r_[start, ks.size])
        pos = np.arange(ks.size) - np.repeat(start, cnt)
        same = np.concatenate([c[:, SAME_COLS], p[mg, None]], axis=1)[order]  # AGREE_FIELDS, then P
        row_ok = (c[order, FI] == pos) & (same == np.repeat(same[start], cnt, axis=0)).all(axis=1)
        whole = (cnt == same[start, SAME_FC]) & np.logical_and.reduceat(row_ok, start)
        rows = mg[order]
        return (order, start, cnt, np.minimum.reduceat(rows, start), np.maximum.reduceat(rows, start),
                same[start, SAME_P], whole)


class ReplyBuilder:
    """The replies of one wake-up, framed in a transmit buffer and sent together.

    Args:
        shard_id: the shard the replies come from (their headers' ``shard_id``).
        mtu: the cluster MTU (fragments of ``consts.max_body_per_frame(mtu)`` body bytes).
    """

    def __init__(self, shard_id: int, mtu: int):
        self.shard_id = int(shard_id)
        self.P = consts.max_body_per_frame(mtu)  #: body bytes of every fragment but the last
        self.W = consts.HDR_LEN + self.P
        self.tx = np.empty((256, self.W), np.uint8)  #: the frames, a row each (grown when full)
        self.txlen = np.zeros(256, np.int64)  #: each row's frame length
        self.ntx = 0  #: rows used
        self._rep_idx: list[int] = []  # per reply: the datagram that completed its request
        self._rep_start: list[int] = []
        self._rep_count: list[int] = []
        self._rep_name: list[bytes] = []
        self._fc_cache: np.ndarray | None = None

    def _reserve(self, count: int) -> int:
        a = self.ntx
        if a + count > self.tx.shape[0]:
            cap = max(a + count, 2 * self.tx.shape[0])
            tx = np.empty((cap, self.W), np.uint8)
            tx[:a] = self.tx[:a]
            ln = np.zeros(cap, np.int64)
            ln[:a] = self.txlen[:a]
            self.tx, self.txlen = tx, ln
        self.ntx = a + count
        return a

    def add_spec(self, idx: int, name: bytes, msg_type: int, status: int, table_id: int, req,
                 body: np.ndarray | None) -> None:
        """Encode a reply of ``msg_type`` to request ``req`` of datagram ``idx`` (``name``: its
        source ``sockaddr_in``) into the transmit buffer: ``codec.encode_reply``'s bytes —
        ``num_tables``, ``num_keys``, ``value_len`` copied from the request, ``table_id`` naming an
        ERROR's table, ``body`` uint8 or None — fragmented to P."""
        cid, mid, nt, nk, vl = req.client_id, req.msg_id, req.num_tables, req.num_keys, req.value_len
        ml = 0 if body is None else int(body.size)
        P, W, H = self.P, self.W, consts.HDR_LEN
        count = max(1, -(-ml // P))
        a = self._reserve(count)
        tx = self.tx
        last_len = ml - (count - 1) * P
        tx[a, :H] = np.frombuffer(codec.Header(consts.MAGIC, consts.VERSION, msg_type, 0, 0, status, mid, cid,
                                               self.shard_id, nt, table_id, nk, vl, ml, 0, 0, count,
                                               P if count > 1 else ml, 0).pack(), np.uint8)
        if count > 1:
            tx[a + 1:a + count, :H] = tx[a, :H]
            tx[a:a + count, _FRAG_AT:_FRAG_AT + 6] = self._frag_cols(count)  # frag_offset, frag_index of each
            _U2BE.pack_into(tx[a + count - 1], _FLEN_AT, last_len)
            tx[a:a + count - 1, H:] = body[:(count - 1) * P].reshape(count - 1, P)
        if ml:
            tx[a + count - 1, H:H + last_len] = body[(count - 1) * P:]
        self.txlen[a:a + count] = W
        self.txlen[a + count - 1] = H + last_len
        self._rep_idx.append(idx)
        self._rep_start.append(a)
        self._rep_count.append(count)
        self._rep_name.append(name)

    def _frag_cols(self, count: int) -> np.ndarray:
        """uint8 (count, 6): the ``frag_offset`` (u32 BE, ``i * P``) and ``frag_index`` (u16 BE)
        bytes of fragments ``0..count-1`` (computed once for the most fragments a reply has)."""
        fc = self._fc_cache
        if fc is None or fc.shape[0] < count:
            n = max(count, consts.MAX_FRAGS)
            i = np.arange(n)
            fc = np.empty((n, 6), np.uint8)
            fc[:, 0:4] = (i * self.P).astype(_U4).view(np.uint8).reshape(n, 4)
            fc[:, 4:6] = i.astype(_U2).view(np.uint8).reshape(n, 2)
            self._fc_cache = fc
        return fc[:count]

    def replies(self) -> int:
        """Replies queued for this wake-up."""
        return len(self._rep_idx)

    def queued_bytes(self) -> int:
        """UDP payload bytes of the frames queued for this wake-up."""
        return int(self.txlen[:self.ntx].sum())

    def send(self, bs: udpio.BatchSocket | None) -> None:
        """Send every reply queued, ordered by the datagram that completed its request, with
        one ``sendmmsg`` on ``bs`` (None: a socket already closed, nothing sent); the queue is
        emptied either way.

        Raises:
            OSError: the send failed.
        """
        try:
            if not self._rep_idx:
                return
            order = np.argsort(np.asarray(self._rep_idx), kind="stable")
            starts = np.asarray(self._rep_start, np.int64)[order]
            counts = np.asarray(self._rep_count, np.int64)[order]
            names = np.frombuffer(b"".join(self._rep_name), np.uint8).reshape(-1, udpio.SOCKADDR_LEN)[order]
            names = np.ascontiguousarray(names)
            if bs is not None:
                bs.send(self.tx, starts, counts, self.txlen, names)
        finally:
            self.clear()

    def clear(self) -> None:
        """Drop every reply queued, unsent."""
        self._rep_idx.clear()
        self._rep_start.clear()
        self._rep_count.clear()
        self._rep_name.clear()
        self.ntx = 0
