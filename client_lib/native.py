"""The client's round in C (``client_lib/csrc/``: the plan in ``plan.c``, the round in ``round.c``
and the files beside it; built with the package as ``libembnic_client``, :mod:`.clib`) through
ctypes: the one production implementation of the message cut and of the round transport.

One call plans a round (:func:`prepare`: the checks, the cut into messages, the message ids, the
send queue's order), one call runs it (:meth:`NativeRound.run`: sendmmsg/recvmmsg on the client's
socket, reply fragments copied straight to their rows in the output buffer, the send window, the
retransmission timers, loss detection and recovery — docs/protocol.md, "Reliability"). A missing
or stale library is refused with one line naming the rebuild command.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import socket

import numpy as np

from . import clib, codec, consts
from .consts import DType, MsgType
from .roundplan import MSG_COLUMNS, RoundPlan, TableArrays

#: the round's message table: roundplan's columns, then the message id and type
NCOL = len(MSG_COLUMNS) + 2
#: what a round returns (round.c, R_*)
RES = ("kind", "shard", "table", "status", "tries", "type", "nmsg", "big", "errno", "elapsed_ns", "next_id",
       "nlat", "largest")
R = {n: i for i, n in enumerate(RES)}
KIND_OK, KIND_SHARD_ERROR, KIND_GIVE_UP, KIND_OS_ERROR, KIND_INTERRUPTED = range(5)
_LOOKUP, _FP32 = int(MsgType.LOOKUP_REQ), int(DType.FP32)
_VP = ctypes.c_void_p
_I64, _INT, _DBL = ctypes.c_int64, ctypes.c_int, ctypes.c_double
#: the library's functions (``embnic_client_NAME``): name -> (restype, argtypes)
_SIGNATURES = {
    "new": (_VP, [_INT, _INT, _INT, _I64, _INT, _DBL, _DBL, _DBL, _INT, _INT, _INT, _VP, _VP, _VP]),
    "abort": (None, [_VP]),
    "free": (None, [_VP]),
    "stats": (None, [_VP, _VP]),
    "rtt": (_INT, [_VP, _INT, _INT, _VP]),
    "nstats": (_INT, []),
    "stat_name": (ctypes.c_char_p, [_INT]),
    "prepare": (_I64, [_VP, _VP, _I64, _VP, _VP, _I64, _VP, _I64, _VP, _I64, _VP, _INT, _I64, _INT, _I64, _I64,
                       _I64, ctypes.c_uint32, _INT] + [_VP] * 17),
    "round": (_INT, [_VP, _INT, _VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP, _INT, _VP, ctypes.c_uint32, _VP]),
}
_lib: ctypes.CDLL | None = None


def load() -> ctypes.CDLL:
    """The library (built with the package, :mod:`.clib`), loaded and bound once.

    Raises clib.NativeLibraryError (one line naming the rebuild command) when it is missing, built from
    other sources or for another protocol version, or speaks another message table (its ABI number)."""
    global _lib
    if _lib is not None:
        return _lib
    want = consts.VERSION * 1000000 + len(consts.HEADER_FIELDS) * 10000 + NCOL * 100 + len(RES)
    lib = clib.load(clib.CLIENT, consts.VERSION, abi=("embnic_client_abi", want))
    for name, (restype, argtypes) in _SIGNATURES.items():
        f = getattr(lib, f"embnic_client_{name}")
        f.restype, f.argtypes = restype, argtypes
    _lib = lib
    return lib


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


#: what embnic_client_prepare returns in its info words (plan.c I_*)
INFO = ("msgs", "dirs", "V", "bytes", "next_id", "uniform", "dim", "fp16", "err_table")


class Workspace:
    """int64 words the C plan writes into, kept from round to round (grown when a round needs more):
    a round's plan is a set of views of it, valid until the next round."""

    def __init__(self):
        self.w = np.empty(0, np.int64)

    def get(self, words: int) -> np.ndarray:
        if self.w.size < words:
            self.w = np.empty(max(words, 2 * self.w.size), np.int64)
        return self.w


def prepare(lib: ctypes.CDLL, ta: TableArrays, ws: Workspace, msg_type: int, table_ids: np.ndarray,
            counts: np.ndarray, keys: np.ndarray, grads: np.ndarray | None, *, mtu: int, msg_frames: int | None,
            window_frames: int, next_id: int, gshape: np.ndarray | None = None,
            trusted: bool = False) -> RoundPlan | None:
    """Check and plan a round in one C call (``client_lib/csrc/plan.c``, ``embnic_client_prepare``):
    the checks of :mod:`~embnic.client_lib.precheck`'s fast path (tables configured, once; keys in
    range; an update's keys of a table strictly increasing and no gradient its optimizer could
    refuse), the round's plan (module docstring of :mod:`.roundplan`), message ids from ``next_id``
    in sending order, the send queue's order and an update's value bytes. ``trusted``: the round
    passed :mod:`~embnic.client_lib.precheck`'s per-table checks already, so the key order and
    gradient tests are left out (an update's unique keys in any order).

    Args:
        table_ids, counts: int64 (T,); keys: uint64 (N,) (call order); grads: an update's float32
            (Σ counts·dim,), None for a lookup; gshape: int64 (T, 2) the shape each table's gradients
            came in (checked against its count and dim), None when they came flat.

    Returns:
        the :class:`RoundPlan` (views of ``ws``) with ``tab`` (int64 (M, :data:`NCOL`): the message
        rows in sending order, with their ids and type), ``qorder`` (the rows in the queue's order),
        ``vals`` (an update's value bytes; None where an fp16 table needs :meth:`RoundPlan.values`)
        and ``next_id``; or None when a check fails: the caller's per-table checks then say why.

    Raises:
        ValueError: an MTU without room for a body byte.
    """
    T, N, S = len(table_ids), int(keys.size), ta.num_shards
    P = consts.max_body_per_frame(mtu)
    frags = consts.MAX_FRAGS if not msg_frames else min(msg_frames, consts.MAX_FRAGS)
    lookup = msg_type == _LOOKUP
    M = max(N, 1)
    nc = len(MSG_COLUMNS)
    vwords = 0 if lookup else (N * int(ta.row_bytes.max(initial=0)) + 7) // 8
    # int64 words, in the C function's argument order: tcol (7T), vo, ko (T+1 each), order, gkeys, tkey,
    # rb, dst (N each), so (N+1), scratch (3(S+1)), dir (2M), msgs (M·nc), rank (max(N, S)+1),
    # tab (M·(nc+2)), qorder (M), vals, info
    sizes = (7 * T, T + 1, T + 1, N, N, N, N, N, N + 1, 3 * (S + 1), 2 * M, M * nc, max(N, S) + 1, M * (nc + 2), M,
             vwords, len(INFO))
    o = [0, *itertools.accumulate(sizes)]
    w = ws.get(o[-1])
    base = w.ctypes.data
    p_ = [base + 8 * x for x in o[:-1]]
    m = lib.embnic_client_prepare(
        ta.cfg.ctypes.data, ta.lr64.ctypes.data, len(ta.ids), table_ids.ctypes.data, counts.ctypes.data, T,
        keys.ctypes.data, N, None if grads is None else grads.ctypes.data, 0 if grads is None else grads.size,
        None if gshape is None else gshape.ctypes.data, int(ta.sharding != "table"), S, int(lookup), P, frags * P, (window_frames - 2) * P if window_frames >= 3 else -1,
        int(next_id) & 0xFFFFFFFF, int(trusted), *p_[:17])
    if m < 0:
        return None
    info = w[o[16]:o[17]].tolist()
    nd, uniform, dim, fp16 = info[1], bool(info[5]), info[6], bool(info[7])
    tcol = w[o[0]:o[1]].reshape(7, T)
    tab = w[o[13]:o[13] + m * (nc + 2)].reshape(m, nc + 2)
    plan = RoundPlan(msg_type, tcol[0], counts, w[o[2]:o[3]], w[o[3]:o[4]], w[o[4]:o[5]].view(np.uint64),
                     w[o[5]:o[6]], w[o[6]:o[7]], w[o[8]:o[9]], w[o[10]:o[10] + 2 * nd].view(codec.DIR_DTYPE),
                     tab[:, :nc], uniform, dim if uniform else 0, ta, w[o[7]:o[8]] if lookup else None)
    plan.tab, plan.qorder = tab, w[o[14]:o[14] + m]
    plan.vo, plan.dims, plan.V, plan.nbytes = w[o[1]:o[2]], tcol[2], info[2], info[3]  # (dst set above)
    plan.next_id = info[4]
    plan.vals = None if lookup or fp16 else w[o[15]:o[16]].view(np.uint8)[:int(plan.so[-1])]
    return plan


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
        self._lib = self.lib = lib
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
        self._lat = np.zeros(64, np.float64)

    def run(self, tab: np.ndarray, directory: np.ndarray, keys: np.ndarray, vals: np.ndarray | None,
            dst: np.ndarray | None, rb: np.ndarray | None, so: np.ndarray | None, out: np.ndarray | None,
            record_latency: bool, next_id: int) -> tuple[np.ndarray, np.ndarray]:
        """Run one round (round.c ``embnic_client_round``). Raises ValueError once closed.

        Args:
            tab: int64 (M, :data:`NCOL`) the messages in queue order. directory: ``codec.DIR_DTYPE``
                (D,). keys: uint64 (N,) grouped. vals: uint8, an update's value bytes or the SIZE_REQ
                entries (None: none). dst, rb: int64 (N,), so: int64 (N+1,), out: uint8 — a lookup's
                row layout (:meth:`~embnic.client_lib.roundplan.RoundPlan.out_layout`; None otherwise).
            next_id: the first id a repair or probe takes.

        Returns:
            (res: ints by :data:`RES`, latencies float64 (µs) of the lookup messages answered: a view,
            valid until the next round).

        Raises:
            OSError: the library failed before the round (out of memory); socket errors come back in ``res``.
        """
        if not self._ctx:
            raise ValueError("the client is closed")
        tab = np.ascontiguousarray(tab, np.int64)
        if self._lat.size < len(tab):
            self._lat = np.zeros(2 * len(tab), np.float64)
        args = (self._ctx, len(tab), tab.ctypes.data, directory.ctypes.data, keys.ctypes.data,
                (vals if vals is not None else self._empty).ctypes.data, _ptr(dst), _ptr(rb), _ptr(so), _ptr(out),
                int(record_latency), self._lat.ctypes.data, int(next_id) & 0xFFFFFFFF, self._res.ctypes.data)
        try:
            rc = self._lib.embnic_client_round(*args)
            # a signal while waiting, or a wait slice (0.1 s) over: the Python handlers of the
            # signals that came have run by now (a KeyboardInterrupt is raised here); otherwise
            # the round goes on where it was
            while self._res[R["kind"]] == KIND_INTERRUPTED:
                rc = self._lib.embnic_client_round(*args)
        except BaseException:
            self._lib.embnic_client_abort(self._ctx)
            raise
        res = self._res.tolist()
        if rc != 0 and res[R["kind"]] != KIND_OS_ERROR:
            raise OSError(-rc, os.strerror(-rc))
        return res, self._lat[:res[R["nlat"]]]

    def counters(self) -> np.ndarray:
        """uint64 (len(stat_names),): the counters so far (cumulative; their last values once closed)."""
        if self._ctx:
            self._lib.embnic_client_stats(self._ctx, _ptr(self._stats))
        return self._stats.copy()

    def rtt(self, shard_index: int, msg_type: int) -> tuple[float | None, float, float, float | None, int]:
        """(srtt, rttvar, rto, min_rtt (s; None before a sample), samples) of one estimator.

        Raises:
            KeyError: a shard index out of range.
        """
        o = np.zeros(5, np.float64)
        if not self._ctx:
            raise ValueError("the client is closed")
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
