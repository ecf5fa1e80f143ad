"""UDP socket set-up shared by the client and the shard server."""
from __future__ import annotations

import contextlib
import socket

SOCK_BUF = 16 << 20  #: bytes of kernel socket buffer asked for by default


def set_socket_buffers(sock: socket.socket, size: int = SOCK_BUF) -> None:
    """Ask for ``size``-byte kernel receive and send buffers (bytes) on a UDP socket.

    As root ``SO_RCVBUFFORCE``/``SO_SNDBUFFORCE`` go past ``net.core.rmem_max``; otherwise
    the plain options are capped by it. Never raises: a smaller buffer only means more
    retransmissions under bursts.
    """
    for force, plain in ((getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF),
                         (getattr(socket, "SO_SNDBUFFORCE", None), socket.SO_SNDBUF)):
        try:
            if force is None:
                raise PermissionError
            sock.setsockopt(socket.SOL_SOCKET, force, size)
        except OSError:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, plain, size)
