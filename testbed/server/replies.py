"""The batch engine's replies: encoded into one preallocated transmit buffer, sent per wake-up.

:class:`BatchReplies` is a part of :class:`~.engine.BatchShardServer` (its state — the transmit
buffer ``_tx`` of ``(rows, 44 + P)`` bytes and the per-reply lists — is set up there).
:meth:`_emit` writes the bytes ``codec.encode_reply`` would write, fragment headers as vector
copies; :meth:`_send` takes the reference handler's frames; :meth:`_transmit` sends everything
of one wake-up, ordered by the datagram that completed each request, with one ``sendmmsg``
(multi-frame replies as UDP GSO super-datagrams, :mod:`.udpio`).
"""
from __future__ import annotations

import logging
import struct

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.consts import MsgType, Status

from . import udpio

log = logging.getLogger("embnic.server")

_HDR = codec._HDR  #: the v2 header, network byte order
_FOFF = dict((f[0], f[1]) for f in consts.HEADER_FIELDS)
_FRAG_AT = _FOFF["frag_offset"]  #: frag_offset (u32) then frag_index (u16): 6 bytes
_FLEN_AT = _FOFF["frag_len"]
assert _FOFF["frag_index"] == _FRAG_AT + 4
_U4 = np.dtype(">u4")
_U2 = np.dtype(">u2")
_U2BE = struct.Struct(">H")


class BatchReplies:
    """Reply encoding and transmission of one wake-up (a part of ``BatchShardServer``)."""

    def _reserve(self, count: int) -> int:
        a = self._ntx
        if a + count > self._tx.shape[0]:
            cap = max(a + count, 2 * self._tx.shape[0])
            tx = np.empty((cap, self._W), np.uint8)
            tx[:a] = self._tx[:a]
            ln = np.zeros(cap, np.int64)
            ln[:a] = self._txlen[:a]
            self._tx, self._txlen = tx, ln
        self._ntx = a + count
        return a

    def _emit(self, m: tuple, msg_type: int, body: np.ndarray | None = None, status: int = 0,
              table_id: int = consts.NO_TABLE) -> None:
        """Encode the reply to message ``m`` into the transmit buffer (codec.encode_reply's bytes:
        ``num_tables``, ``num_keys``, ``value_len`` copied from the request; ``table_id`` names
        an ERROR's table)."""
        idx, info, name = m[0], m[1], m[2]
        if msg_type == MsgType.ERROR:
            self._errors[Status(status)] += 1
        self._replies[msg_type] += 1
        if self._ca is not None:  # the C answer path builds the frames (canswer.CAnswer.emit)
            self._ca.add_spec(idx, name, msg_type, status, table_id, info, body)
            return
        _, cid, mid, nt, nk, vl = info
        ml = 0 if body is None else int(body.size)
        P, W, H = self._P, self._W, consts.HDR_LEN
        count = max(1, -(-ml // P))
        a = self._reserve(count)
        tx = self._tx
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
        self._txlen[a:a + count] = W
        self._txlen[a + count - 1] = H + last_len
        self._rep_idx.append(idx)
        self._rep_start.append(a)
        self._rep_count.append(count)
        self._rep_name.append(name)

    def _frag_cols(self, count: int) -> np.ndarray:
        """uint8 (count, 6): the ``frag_offset`` (u32 BE, ``i * P``) and ``frag_index`` (u16 BE)
        bytes of fragments ``0..count-1`` (computed once for the most fragments a reply has)."""
        fc = getattr(self, "_fc_cache", None)
        if fc is None or fc.shape[0] < count:
            n = max(count, consts.MAX_FRAGS)
            i = np.arange(n)
            fc = np.empty((n, 6), np.uint8)
            fc[:, 0:4] = (i * self._P).astype(_U4).view(np.uint8).reshape(n, 4)
            fc[:, 4:6] = i.astype(_U2).view(np.uint8).reshape(n, 2)
            self._fc_cache = fc
        return fc[:count]

    def _send(self, frames: list[bytes], addr) -> None:
        """The reference handler's replies into the transmit buffer, in order (``addr``: an
        ``(ip, port)`` tuple or a 16-byte ``sockaddr_in``)."""
        if not frames:
            return
        self._replies[frames[0][3]] += 1  # one reply message (byte 3: msg_type)
        if self._ca is not None:
            self._ca.queue_frames(frames, self._cur_idx,
                                  addr if isinstance(addr, bytes) else udpio.tuple_to_sockaddr(addr))
            return
        count = len(frames)
        a = self._reserve(count)
        for r, f in enumerate(frames):
            self._tx[a + r, :len(f)] = np.frombuffer(f, np.uint8)
            self._txlen[a + r] = len(f)
        self._rep_idx.append(self._cur_idx)
        self._rep_start.append(a)
        self._rep_count.append(count)
        self._rep_name.append(addr if isinstance(addr, bytes) else udpio.tuple_to_sockaddr(addr))

    def _transmit(self) -> None:
        """Send every reply of this wake-up, ordered by the datagram that completed its request."""
        if self._ca is not None:  # built and sent in C (canswer: the frames' counts are its counters)
            try:
                self._ca.send()
            except Exception:  # noqa: BLE001 - a bug must not stop the shard
                self._c["send_errors"] += 1
                self._ca.clear()
                log.exception("shard %d: send failed", self.shard_id)
            return
        if not self._rep_idx:
            self._ntx = 0
            return
        try:
            order = np.argsort(np.asarray(self._rep_idx), kind="stable")
            starts = np.asarray(self._rep_start, np.int64)[order]
            counts = np.asarray(self._rep_count, np.int64)[order]
            names = np.frombuffer(b"".join(self._rep_name), np.uint8).reshape(-1, udpio.SOCKADDR_LEN)[order]
            names = np.ascontiguousarray(names)
            self._c["tx_frames"] += self._ntx
            self._c["tx_bytes"] += int(self._txlen[:self._ntx].sum())
            if self._bs is not None:
                self._bs.send(self._tx, starts, counts, self._txlen, names)
        except OSError as e:
            self._c["send_errors"] += 1
            log.warning("shard %d: send failed: %s", self.shard_id, e)
        finally:
            self._rep_idx.clear()
            self._rep_start.clear()
            self._rep_count.clear()
            self._rep_name.clear()
            self._ntx = 0
