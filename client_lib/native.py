"""The client's round I/O in C (``dataplane/client/round.c``, built as
``dataplane/build/libembnic-client.so`` by ``make -C dataplane``) through ctypes.

One call runs a whole round — sendmmsg/recvmmsg on the client's socket, reply fragments copied
straight to their rows in the output buffer, the send window, the retransmission timers, loss
detection and recovery (docs/protocol.md, "Reliability") — as
:meth:`embnic.client_lib.client.EmbeddingClient._round` does in Python, which stays the readable
reference and the fallback: used when the library is not built (one warning says so),
refused (``EMBNIC_CLIENT_C=0``, or ``native=False``), or built for another protocol version or
message table. ``tests/client_lib/test_native_round.py`` runs both on the same rounds. The
library is looked for at ``EMBNIC_CLIENT_LIB`` if set, else in the repository's
``dataplane/build/``.
"""
from __future__ import annotations

import ctypes
import logging
import os
import socket
from pathlib import Path

import numpy as np

from . import consts
from .roundplan import MSG_COLUMNS

log = logging.getLogger("embnic.client")

LIB_NAME = "libembnic-client.so"
#: where ``make -C dataplane`` puts it (an editable install runs from the repository)
REPO_LIB = Path(__file__).resolve().parents[1] / "dataplane" / "build" / LIB_NAME
#: the round's message table: roundplan's columns, then the message id and type
NCOL = len(MSG_COLUMNS) + 2
#: what a round returns (round.c, R_*)
RES = ("kind", "shard", "table", "status", "tries", "type", "nmsg", "big", "errno", "elapsed_ns", "next_id",
       "nlat", "largest")
R = {n: i for i, n in enumerate(RES)}
KIND_OK, KIND_SHARD_ERROR, KIND_GIVE_UP, KIND_OS_ERROR = range(4)
_VP = ctypes.c_void_p
_lib: ctypes.CDLL | None = None
_tried = False


def lib_path() -> Path:
    """Where the library is looked for."""
    return Path(os.environ.get("EMBNIC_CLIENT_LIB") or REPO_LIB)


def load() -> ctypes.CDLL | None:
    """The library, or None when it is refused (``EMBNIC_CLIENT_C=0``), absent (a warning, once,
    names the file and how to build it) or built for another protocol or message table. Loaded once."""
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    if os.environ.get("EMBNIC_CLIENT_C", "1") == "0":
        return None
    path = lib_path()
    if not path.is_file():
        log.warning("embnic client: %s is not built (make -C dataplane): rounds run on the numpy path", path)
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        log.warning("embnic client: %s not loaded (%s): rounds run on the numpy path", path, e)
        return None
    want = consts.VERSION * 1000000 + len(consts.HEADER_FIELDS) * 10000 + NCOL * 100 + len(RES)
    if lib.embnic_client_abi() != want:
        log.warning("embnic client: %s speaks ABI %d, not %d (rebuild: make -C dataplane): rounds run on the "
                    "numpy path", path, lib.embnic_client_abi(), want)
        return None
    lib.embnic_client_new.restype = _VP
    lib.embnic_client_new.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int,
                                      ctypes.c_double, ctypes.c_double, ctypes.c_double, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_int, _VP, _VP, _VP]
    lib.embnic_client_free.restype = None
    lib.embnic_client_free.argtypes = [_VP]
    lib.embnic_client_stats.restype = None
    lib.embnic_client_stats.argtypes = [_VP, _VP]
    lib.embnic_client_rtt.restype = ctypes.c_int
    lib.embnic_client_rtt.argtypes = [_VP, ctypes.c_int, ctypes.c_int, _VP]
    lib.embnic_client_nstats.restype = ctypes.c_int
    lib.embnic_client_nstats.argtypes = []
    lib.embnic_client_stat_name.restype = ctypes.c_char_p
    lib.embnic_client_stat_name.argtypes = [ctypes.c_int]
    lib.embnic_client_round.restype = ctypes.c_int
    lib.embnic_client_round.argtypes = [_VP, ctypes.c_int, _VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP, ctypes.c_int,
                                        _VP, ctypes.c_uint32, _VP]
    _lib = lib
    return lib


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


class NativeRound:
    """The C round engine bound to one client's socket and settings (see
    :class:`~embnic.client_lib.client.EmbeddingClient` for their meaning).

    Args:
        lib: :func:`load`'s library. sock: the client's bound, non-blocking UDP socket.
        shard_ids: each shard index's id; dests: each shard index's (IPv4, UDP port).

    Raises:
        MemoryError: the context could not be allocated.
    """

    def __init__(self, lib: ctypes.CDLL, sock: socket.socket, client_id: int, *, mtu: int, window_frames: int,
                 retries: int, timeout_s: float, rto_min_s: float, rto_max_s: float, tail_probes: bool,
                 fixed_length: bool, shard_ids: list[int], dests: list[tuple[str, int]]):
        self._lib = lib
        self._sock = sock  # the fd stays open while this object lives
        ips = np.array([int.from_bytes(socket.inet_aton(socket.gethostbyname(ip)), "little") for ip, _ in dests],
                       np.uint32)
        ports = np.array([socket.htons(int(p)) for _, p in dests], np.uint16)
        sids = np.array(shard_ids, np.uint16)
        self._ctx = lib.embnic_client_new(sock.fileno(), int(client_id), int(mtu), int(window_frames), int(retries),
                                          float(timeout_s), float(rto_min_s), float(rto_max_s), int(tail_probes),
                                          int(fixed_length), len(sids), _ptr(sids), _ptr(ips), _ptr(ports))
        if not self._ctx:
            raise MemoryError("embnic client: the native round context could not be allocated")
        n = lib.embnic_client_nstats()
        self.stat_names = [lib.embnic_client_stat_name(i).decode() for i in range(n)]
        self._stats = np.zeros(n, np.uint64)
        self._res = np.zeros(len(RES), np.int64)
        self._empty = np.zeros(8, np.uint8)

    def run(self, tab: np.ndarray, directory: np.ndarray, keys: np.ndarray, vals: np.ndarray | None,
            dst: np.ndarray | None, rb: np.ndarray | None, so: np.ndarray | None, out: np.ndarray | None,
            record_latency: bool, next_id: int) -> tuple[np.ndarray, np.ndarray]:
        """Run one round (round.c ``embnic_client_round``).

        Args:
            tab: int64 (M, :data:`NCOL`) the messages in queue order. directory: ``codec.DIR_DTYPE``
                (D,). keys: uint64 (N,) grouped. vals: uint8, an update's value bytes or the SIZE_REQ
                entries (None: none). dst, rb: int64 (N,), so: int64 (N+1,), out: uint8 — a lookup's
                row layout (:meth:`~embnic.client_lib.roundplan.RoundPlan.out_layout`; None otherwise).
            next_id: the first id a repair or probe takes.

        Returns:
            (res int64 (len(:data:`RES`),), latencies float64 (µs) of the lookup messages answered).

        Raises:
            OSError: the library failed before the round (out of memory); socket errors come back in ``res``.
        """
        tab = np.ascontiguousarray(tab, np.int64)
        lat = np.zeros(len(tab), np.float64)
        rc = self._lib.embnic_client_round(
            self._ctx, len(tab), _ptr(tab), _ptr(directory), _ptr(keys), _ptr(vals if vals is not None else self._empty),
            _ptr(dst), _ptr(rb), _ptr(so), _ptr(out), int(record_latency), _ptr(lat), int(next_id) & 0xFFFFFFFF,
            _ptr(self._res))
        res = self._res.copy()
        if rc != 0 and res[R["kind"]] != KIND_OS_ERROR:
            raise OSError(-rc, os.strerror(-rc))
        return res, lat[:int(res[R["nlat"]])]

    def counters(self) -> np.ndarray:
        """uint64 (len(stat_names),): the counters so far (cumulative)."""
        self._lib.embnic_client_stats(self._ctx, _ptr(self._stats))
        return self._stats.copy()

    def rtt(self, shard_index: int, msg_type: int) -> tuple[float | None, float, float, float | None, int]:
        """(srtt, rttvar, rto, min_rtt (s; None before a sample), samples) of one estimator.

        Raises:
            KeyError: a shard index out of range.
        """
        o = np.zeros(5, np.float64)
        if self._lib.embnic_client_rtt(self._ctx, int(shard_index), int(msg_type), _ptr(o)) < 0:
            raise KeyError(shard_index)
        return (None if o[0] < 0 else float(o[0]), float(o[1]), float(o[2]), None if o[3] < 0 else float(o[3]),
                int(o[4]))

    def close(self) -> None:
        """Free the context (idempotent)."""
        if self._ctx:
            self._lib.embnic_client_free(self._ctx)
            self._ctx = None

    def __del__(self):
        self.close()
