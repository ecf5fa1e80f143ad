"""Batched UDP socket I/O: ``recvmmsg``/``sendmmsg`` and UDP GSO through ctypes, on preallocated
buffers.

The ``struct mmsghdr``/``iovec``/``cmsghdr`` arrays are numpy structured arrays (Linux LP64:
:data:`MMSGHDR` 64 bytes, :data:`IOVEC` 16, :data:`CMSG` 24), filled with vector operations.
:meth:`BatchSocket.recv` fills up to ``batch`` slots of a ``(batch, slot)`` uint8 buffer with one
``recvmmsg``. :meth:`BatchSocket.send` (the load generator's and the tests' path; the shard sends
in C, ``csrc/send.c``) sends frames laid out in a ``(rows, width)`` buffer with one ``sendmmsg``
per 1024 entries, consecutive rows of one reply as one UDP GSO super-datagram; a kernel that
refuses GSO turns it off for the socket. Linux LP64 only (:func:`available`), as the shard's C
library.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import select
import socket
import struct
import sys

import numpy as np

SOL_UDP = 17
UDP_SEGMENT = 103  #: linux/udp.h
MSG_DONTWAIT = 0x40
MAX_VLEN = 1024  #: UIO_MAXIOV: entries one sendmmsg/recvmmsg takes at most
GSO_MAX_SEGS = 64  #: UDP_MAX_SEGMENTS of older kernels (newer allow 128)
GSO_MAX_BYTES = 65507  #: largest UDP payload

MMSGHDR = np.dtype({"names": ["name", "namelen", "iov", "iovlen", "control", "controllen", "flags", "len"],
                    "formats": ["<u8", "<u4", "<u8", "<u8", "<u8", "<u8", "<i4", "<u4"],
                    "offsets": [0, 8, 16, 24, 32, 40, 48, 56], "itemsize": 64})
IOVEC = np.dtype({"names": ["base", "len"], "formats": ["<u8", "<u8"], "offsets": [0, 8], "itemsize": 16})
# struct cmsghdr { size_t len; int level; int type; } + u16 gso_size, padded: CMSG_SPACE(2) = 24
CMSG = np.dtype({"names": ["len", "level", "type", "gso"], "formats": ["<u8", "<i4", "<i4", "<u2"],
                 "offsets": [0, 8, 12, 16], "itemsize": 24})
SOCKADDR_LEN = 16
_MMSG_S = struct.Struct("<QI4xQQQQi4xI4x")  #: one MMSGHDR entry (64 bytes)
_IOVEC_S = struct.Struct("<QQ")
_CMSG_S = struct.Struct("<QiiH6x")
assert _MMSG_S.size == MMSGHDR.itemsize and _IOVEC_S.size == IOVEC.itemsize and _CMSG_S.size == CMSG.itemsize

_libc = None


def available() -> bool:
    """Whether recvmmsg/sendmmsg can be called here (Linux, 64-bit, glibc/musl with both)."""
    global _libc
    if _libc is None:
        if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
            _libc = False
        else:
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
                for fn in (lib.recvmmsg, lib.sendmmsg):
                    fn.restype = ctypes.c_int
                lib.recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
                lib.sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
                _libc = lib
            except (OSError, AttributeError):
                _libc = False
    return _libc is not False


def _ptr(a: np.ndarray) -> int:
    """Address of ``a``'s first byte (``__array_interface__``: a tenth of ``a.ctypes.data``'s cost)."""
    return a.__array_interface__["data"][0]


def sockaddr_to_tuple(sa: bytes | np.ndarray) -> tuple[str, int]:
    """16-byte ``sockaddr_in`` → ``(ip, port)``."""
    b = bytes(sa)
    return socket.inet_ntoa(b[4:8]), int.from_bytes(b[2:4], "big")


def tuple_to_sockaddr(addr: tuple[str, int]) -> bytes:
    """``(ip, port)`` → 16-byte ``sockaddr_in``."""
    return (socket.AF_INET.to_bytes(2, sys.byteorder) + int(addr[1]).to_bytes(2, "big")
            + socket.inet_aton(addr[0]) + bytes(8))


class BatchSocket:
    """A bound, non-blocking IPv4 UDP socket read and written in batches.

    Args:
        sock: the socket (bound; made non-blocking here).
        batch: datagrams received per :meth:`recv` at most.
        slot: bytes per receive slot (65536: no UDP datagram is ever truncated).
        gso: send multi-frame replies as UDP GSO super-datagrams (falls back by itself).

    Raises:
        RuntimeError: no ``recvmmsg``/``sendmmsg`` here (:func:`available`).

    Attributes:
        rx: uint8 (batch, slot), datagram ``i`` of the last :meth:`recv` in ``rx[i, :lens[i]]``.
        lens: int64 (batch,) lengths of the last :meth:`recv`.
        names: uint8 (batch, 16) source ``sockaddr_in`` of each.
        gso: whether GSO is in use (False after a refusal).
        small_send: a lone reply of at most this many frames is sent with ``sendto`` (cheaper
            than filling ``mmsghdr`` arrays for one datagram).
        scalar_max: a send of at most this many replies fills its ``mmsghdr`` entries one by one
            with ``struct`` (a few µs each) instead of two dozen numpy vector operations.
        stats: ``recv_calls``, ``send_calls``, ``send_errors``, ``gso_sends``, ``gso_fallbacks``.
    """

    def __init__(self, sock: socket.socket, batch: int = 64, slot: int = 65536, gso: bool = True):
        if not available():
            raise RuntimeError("batched UDP needs recvmmsg/sendmmsg (Linux, 64-bit)")
        self.sock = sock
        sock.setblocking(False)
        self.fd = sock.fileno()
        self.batch = int(batch)
        self.slot = int(slot)
        self.rx = np.empty((self.batch, self.slot), np.uint8)
        self.lens = np.zeros(self.batch, np.int64)
        self.names = np.zeros((self.batch, SOCKADDR_LEN), np.uint8)
        self.gso = bool(gso)
        self.small_send = 2  #: a reply of at most this many frames goes out with plain sendto
        self.scalar_max = 8  #: at most this many replies: entries filled one by one (struct), not as vectors
        self.stats = {"recv_calls": 0, "send_calls": 0, "send_errors": 0, "gso_sends": 0, "gso_fallbacks": 0}
        self._rx_iov = np.zeros(self.batch, IOVEC)
        self._rx_iov["base"] = _ptr(self.rx) + np.arange(self.batch, dtype=np.uint64) * np.uint64(self.slot)
        self._rx_iov["len"] = self.slot
        self._rx_hdr = np.zeros(self.batch, MMSGHDR)
        self._rx_hdr["name"] = _ptr(self.names) + np.arange(self.batch, dtype=np.uint64) * np.uint64(SOCKADDR_LEN)
        self._rx_hdr["iov"] = _ptr(self._rx_iov) + np.arange(self.batch, dtype=np.uint64) * np.uint64(IOVEC.itemsize)
        self._rx_hdr["iovlen"] = 1
        self._p_rx_hdr = _ptr(self._rx_hdr)
        self._cap = 0
        self._grow_tx(256)

    # -- receive ------------------------------------------------------------------------------

    def recv(self) -> int:
        """Receive up to ``batch`` datagrams without blocking; returns how many (0: none waiting).

        Raises:
            OSError: a socket error other than ``EAGAIN``/``EINTR`` (ICMP errors from earlier
                sends, ``ECONNREFUSED``, are swallowed and counted as ``send_errors``).
        """
        self._rx_hdr["namelen"] = SOCKADDR_LEN
        self.stats["recv_calls"] += 1
        n = _libc.recvmmsg(self.fd, self._p_rx_hdr, self.batch, MSG_DONTWAIT, None)
        if n < 0:
            e = ctypes.get_errno()
            if e in (errno.EAGAIN, errno.EINTR):
                return 0
            if e in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
                self.stats["send_errors"] += 1
                return 0
            raise OSError(e, errno.errorcode.get(e, str(e)))
        self.lens[:n] = self._rx_hdr["len"][:n]
        return n

    # -- send ---------------------------------------------------------------------------------

    def _grow_tx(self, n: int) -> None:
        if n <= self._cap:
            return
        cap = max(n, 2 * self._cap)
        self._tx_iov = np.zeros(cap, IOVEC)
        self._tx_hdr = np.zeros(cap, MMSGHDR)
        self._tx_cmsg = np.zeros(cap, CMSG)
        self._cap = cap
        self._p_iov, self._p_hdr, self._p_cmsg = _ptr(self._tx_iov), _ptr(self._tx_hdr), _ptr(self._tx_cmsg)
        self._b_iov, self._b_hdr, self._b_cmsg = (a.view(np.uint8) for a in (self._tx_iov, self._tx_hdr, self._tx_cmsg))

    def send(self, buf: np.ndarray, starts: np.ndarray, counts: np.ndarray, lens: np.ndarray,
             names: np.ndarray) -> int:
        """Send replies laid out in ``buf``.

        Args:
            buf: uint8 (rows, width), C-contiguous: frame ``r`` in ``buf[r, :lens[r]]``; every
                frame of a reply but its last is ``width`` bytes long.
            starts, counts: int64 (R,): reply ``j`` is rows ``starts[j] .. starts[j]+counts[j]-1``,
                sent in the order of ``j``.
            lens: int64 (rows,) frame lengths.
            names: uint8 (R, 16) destination ``sockaddr_in`` of each reply.

        Returns:
            frames handed to the kernel (frames of entries the kernel refused are counted in
            ``stats["send_errors"]`` and not returned).
        """
        if len(starts) == 0:
            return 0
        width = buf.shape[1]
        if len(starts) == 1 and counts[0] <= self.small_send:
            return self._send_fallback(buf, starts, counts, lens, names)
        counts = counts.astype(np.int64)
        g = max(1, min(GSO_MAX_SEGS, GSO_MAX_BYTES // width)) if self.gso and width <= GSO_MAX_BYTES else 1
        if len(starts) <= self.scalar_max:
            return self._send_few(buf, starts, counts, lens, names, g)
        # entries: each reply cut into chunks of at most g rows
        nchunks = -(-counts // g)
        rep = np.repeat(np.arange(len(starts)), nchunks)
        first = np.repeat(np.cumsum(nchunks) - nchunks, nchunks)
        k = np.arange(rep.size) - first
        est = starts[rep] + k * g  # first row of each entry
        ecount = np.minimum(g, counts[rep] - k * g)
        elast = est + ecount - 1
        elen = (ecount - 1) * width + lens[elast]
        e = rep.size
        self._grow_tx(e)
        iov, hdr, cm = self._tx_iov[:e], self._tx_hdr[:e], self._tx_cmsg[:e]
        base = _ptr(buf)
        iov["base"] = np.uint64(base) + est.astype(np.uint64) * np.uint64(width)
        iov["len"] = elen
        hdr["name"] = np.uint64(_ptr(names)) + rep.astype(np.uint64) * np.uint64(SOCKADDR_LEN)
        hdr["namelen"] = SOCKADDR_LEN
        hdr["iov"] = np.uint64(self._p_iov) + np.arange(e, dtype=np.uint64) * np.uint64(IOVEC.itemsize)
        hdr["iovlen"] = 1
        multi = ecount > 1
        hdr["control"] = np.where(multi, np.uint64(self._p_cmsg) + np.arange(e, dtype=np.uint64)
                                  * np.uint64(CMSG.itemsize), np.uint64(0))
        hdr["controllen"] = np.where(multi, CMSG.itemsize, 0)
        hdr["flags"] = 0
        cm["len"] = 18  # CMSG_LEN(2)
        cm["level"] = SOL_UDP
        cm["type"] = UDP_SEGMENT
        cm["gso"] = width
        sent, stop = self._sendmmsg(hdr, ecount)
        self.stats["gso_sends"] += int(np.count_nonzero(multi[:stop]))
        if stop < e:  # GSO refused: off for good, the rest goes frame by frame
            sent += self.send(buf, est[stop:], ecount[stop:], lens, np.ascontiguousarray(names[rep[stop:]]))
        return sent

    def _send_few(self, buf, starts, counts, lens, names, g: int) -> int:
        """As :meth:`send`'s vector code, entry by entry (for a few replies)."""
        width = buf.shape[1]
        base, pn = _ptr(buf), _ptr(names)
        sl, cl = starts.tolist(), counts.tolist()
        self._grow_tx(sum(-(-c // g) for c in cl))
        bh, bi, bc = self._b_hdr, self._b_iov, self._b_cmsg
        piov, pcm = self._p_iov, self._p_cmsg
        est, ecount, rep = [], [], []
        e = 0
        for j, (s0, c) in enumerate(zip(sl, cl)):
            for k in range(0, c, g):
                n = min(g, c - k)
                r0 = s0 + k
                _IOVEC_S.pack_into(bi, e * 16, base + r0 * width, (n - 1) * width + int(lens[r0 + n - 1]))
                if n > 1:
                    _CMSG_S.pack_into(bc, e * 24, 18, SOL_UDP, UDP_SEGMENT, width)
                    _MMSG_S.pack_into(bh, e * 64, pn + j * SOCKADDR_LEN, SOCKADDR_LEN, piov + e * 16, 1,
                                      pcm + e * 24, CMSG.itemsize, 0, 0)
                else:
                    _MMSG_S.pack_into(bh, e * 64, pn + j * SOCKADDR_LEN, SOCKADDR_LEN, piov + e * 16, 1, 0, 0, 0, 0)
                est.append(r0)
                ecount.append(n)
                rep.append(j)
                e += 1
        ec = np.array(ecount, np.int64)
        sent, stop = self._sendmmsg(self._tx_hdr[:e], ec)
        self.stats["gso_sends"] += int(np.count_nonzero(ec[:stop] > 1))
        if stop < e:  # GSO refused: off for good, the rest goes frame by frame
            sent += self.send(buf, np.array(est[stop:], np.int64), ec[stop:], lens,
                              np.ascontiguousarray(names[rep[stop:]]))
        return sent

    def _sendmmsg(self, hdr: np.ndarray, ecount: np.ndarray) -> tuple[int, int]:
        """sendmmsg every entry of ``hdr`` (partial sends retried).

        Returns:
            (frames sent, entries done): entries done < ``len(hdr)`` only when the kernel
            refused GSO (then ``self.gso`` is False).
        """
        i, e, frames = 0, len(hdr), 0
        while i < e:
            k = min(MAX_VLEN, e - i)
            self.stats["send_calls"] += 1
            r = _libc.sendmmsg(self.fd, self._p_hdr + i * MMSGHDR.itemsize, k, 0)
            if r > 0:
                frames += int(ecount[i:i + r].sum())
                i += r
                continue
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.ENOBUFS, errno.EINTR):
                select.select([], [self.sock], [], 0.01)
                continue
            if err in (errno.EIO, errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP) and ecount[i] > 1 and self.gso:
                self.gso = False
                self.stats["gso_fallbacks"] += 1
                return frames, i
            # a refused destination (ECONNREFUSED from an earlier ICMP, EMSGSIZE, ...): skip it
            self.stats["send_errors"] += 1
            i += 1
        return frames, e

    def _send_fallback(self, buf, starts, counts, lens, names) -> int:
        n = 0
        for j in range(len(starts)):
            addr = sockaddr_to_tuple(names[j])
            for r in range(int(starts[j]), int(starts[j] + counts[j])):
                try:
                    self.sock.sendto(memoryview(buf[r, :lens[r]]), addr)
                    n += 1
                except BlockingIOError:
                    select.select([], [self.sock], [], 0.01)
                except OSError:
                    self.stats["send_errors"] += 1
        return n
