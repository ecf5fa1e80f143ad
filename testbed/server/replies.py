"""The batch engine's reply builder: replies encoded into one preallocated transmit buffer, sent per wake-up.

A :class:`ReplyBuilder` belongs to one :class:`~.engine.BatchShardServer` (the numpy path; the C
answer path's :class:`~.canswer.CAnswer` has the same four methods and builds its frames in C).
:meth:`~ReplyBuilder.add_spec` writes the bytes ``codec.encode_reply`` would write into the
transmit buffer of ``(rows, 44 + P)`` bytes, fragment headers as vector copies;
:meth:`~ReplyBuilder.queue_frames` takes the reference handler's frames; :meth:`~ReplyBuilder.send`
sends everything of one wake-up, ordered by the datagram that completed each request, with one
``sendmmsg`` (multi-frame replies as UDP GSO super-datagrams, :mod:`.udpio`).
"""
from __future__ import annotations

import struct

import numpy as np

from embnic.client_lib import codec, consts

from . import udpio

_HDR = codec._HDR  #: the v2 header, network byte order
_FOFF = dict((f[0], f[1]) for f in consts.HEADER_FIELDS)
_FRAG_AT = _FOFF["frag_offset"]  #: frag_offset (u32) then frag_index (u16): 6 bytes
_FLEN_AT = _FOFF["frag_len"]
assert _FOFF["frag_index"] == _FRAG_AT + 4
_U4 = np.dtype(">u4")
_U2 = np.dtype(">u2")
_U2BE = struct.Struct(">H")


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

    def add_spec(self, idx: int, name: bytes, msg_type: int, status: int, table_id: int, info: tuple,
                 body: np.ndarray | None) -> None:
        """Encode a reply of ``msg_type`` to the request of datagram ``idx`` (``info``: its
        ``intake.INFO_FIELDS``; ``name``: its source ``sockaddr_in``) into the transmit buffer:
        ``codec.encode_reply``'s bytes — ``num_tables``, ``num_keys``, ``value_len`` copied from the
        request, ``table_id`` naming an ERROR's table, ``body`` uint8 or None — fragmented to P."""
        _, cid, mid, nt, nk, vl = info
        ml = 0 if body is None else int(body.size)
        P, W, H = self.P, self.W, consts.HDR_LEN
        count = max(1, -(-ml // P))
        a = self._reserve(count)
        tx = self.tx
        last_len = ml - (count - 1) * P
        _HDR.pack_into(tx[a], 0, consts.MAGIC, consts.VERSION, msg_type, 0, 0, status, mid, cid, self.shard_id,
                       nt, table_id, nk, vl, ml, 0, 0, count, P if count > 1 else ml, 0)
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

    def queue_frames(self, frames: list[bytes], idx: int, name: bytes) -> None:
        """A reply already encoded (the reference handler's frames, in order) to ``name`` (a
        16-byte ``sockaddr_in``), in the place of datagram ``idx``."""
        count = len(frames)
        a = self._reserve(count)
        for r, f in enumerate(frames):
            self.tx[a + r, :len(f)] = np.frombuffer(f, np.uint8)
            self.txlen[a + r] = len(f)
        self._rep_idx.append(idx)
        self._rep_start.append(a)
        self._rep_count.append(count)
        self._rep_name.append(name)

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
