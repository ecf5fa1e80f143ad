"""Capture of the frames a client puts on its veth: an ``AF_PACKET`` socket per interface,
kernel timestamps, read by a thread (what ``embnic trace record`` and ``replay`` use).
"""
from __future__ import annotations

import select
import socket
import struct
import threading
import time
from typing import Callable

from embnic.client_lib import consts

_ETH_P_ALL = 0x0003
_SOL_PACKET = 263
_PACKET_STATISTICS = 6
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_PACKET_OUTGOING = 4
_RCVBUF = 256 << 20


def udp_payload(frame: bytes) -> tuple[int, int, bytes] | None:
    """(UDP source port, destination port, payload) of an Ethernet/IPv4/UDP frame, else None."""
    if len(frame) < 42 or frame[12:14] != b"\x08\x00" or frame[23] != 17:
        return None
    ihl = (frame[14] & 0x0F) * 4
    u = 14 + ihl
    if len(frame) < u + 8:
        return None
    sport, dport, ulen = struct.unpack_from("!HHH", frame, u)
    return sport, dport, frame[u + 8:u + ulen] if ulen >= 8 else b""


class Capture:
    """Every frame on one interface (both directions) with kernel timestamps, read by a thread.

    Create it inside the interface's namespace (:func:`~embnic.testbed.net.topology.in_netns`);
    the socket stays there. ``frames`` holds ``(t_ns, outgoing, frame)`` for embnic frames
    (UDP to or from port ``udp_port``); ``on_frame`` (optional) is called with each.

    Raises:
        OSError: the interface does not exist here.
    """

    def __init__(self, ifname: str, udp_port: int = consts.UDP_PORT, on_frame: Callable | None = None):
        self.ifname = ifname
        self.port = udp_port
        self.on_frame = on_frame
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), _RCVBUF)
        except PermissionError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
        self.sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        self.sock.bind((ifname, _ETH_P_ALL))
        self.sock.setblocking(False)
        self._stats()  # reset the kernel's counters
        self.frames: list[tuple[int, bool, bytes]] = []
        self.kernel_drops = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"capture-{ifname}", daemon=True)

    def _stats(self) -> tuple[int, int]:
        raw = self.sock.getsockopt(_SOL_PACKET, _PACKET_STATISTICS, 8)
        return struct.unpack("II", raw)

    def start(self) -> "Capture":
        self._thread.start()
        return self

    def _read_available(self) -> int:
        n = 0
        cms = socket.CMSG_SPACE(16)
        while True:
            try:
                data, anc, _flags, addr = self.sock.recvmsg(65536, cms)
            except (BlockingIOError, InterruptedError):
                return n
            u = udp_payload(data)
            if u is None or (u[0] != self.port and u[1] != self.port):
                continue
            t_ns = time.time_ns()
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == _SO_TIMESTAMPNS and len(cdata) >= 16:
                    sec, nsec = struct.unpack_from("qq", cdata)
                    t_ns = sec * 1_000_000_000 + nsec
            rec = (t_ns, addr[2] == _PACKET_OUTGOING, data)
            self.frames.append(rec)
            if self.on_frame is not None:
                self.on_frame(rec)
            n += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            r, _, _ = select.select([self.sock], [], [], 0.05)
            if r:
                self._read_available()

    def stop(self) -> list[tuple[int, bool, bytes]]:
        """Stop the reader, read what is left; returns ``frames``. ``kernel_drops`` counts frames
        the kernel dropped because the socket buffer was full. Idempotent."""
        if self._stop.is_set():
            return self.frames
        self._stop.set()
        self._thread.join()
        self._read_available()
        self.kernel_drops += self._stats()[1]
        self.sock.close()
        return self.frames
