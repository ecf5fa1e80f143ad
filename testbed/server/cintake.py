"""The shard's C intake (``testbed/server/csrc/intake.c``, built with the package as ``libembnic_shard``:
:mod:`embnic.client_lib.clib`) through ctypes.

Two functions per wake-up replace the numpy expressions of :mod:`.intake` that cost the most
per call (a dozen small-array operations each): the header checks of every frame
(:meth:`.intake.Intake.check_vector`) and the grouping of multi-fragment frames by message
(:meth:`.intake.Intake.group`). Same rules, same outputs — the Python versions stay the
readable reference, used when the library is not built (or ``EMBNIC_SHARD_C=0``), and the
engine tests run both. The library is looked for at ``EMBNIC_SHARD_LIB`` if set, else beside
this module; one built from other sources or for another protocol version is refused.
"""
from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import numpy as np

from embnic.client_lib import clib, consts

log = logging.getLogger("embnic.server")

REPO_LIB = clib.SHARD.path
_NF = len(consts.HEADER_FIELDS)
_VP = ctypes.c_void_p
_lib: ctypes.CDLL | None = None
_tried = False


def load() -> ctypes.CDLL | None:
    """The library, or None when it is absent, refused (``EMBNIC_SHARD_C=0``) or built for
    another protocol (``embnic_shard_abi() != VERSION * 1000 + header fields``). Loaded once."""
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    if os.environ.get("EMBNIC_SHARD_C", "1") == "0":
        return None
    lib = clib.load(clib.SHARD, consts.VERSION)
    want = consts.VERSION * 1000 + _NF
    if lib.embnic_shard_abi() != want:
        raise clib.NativeLibraryError(f"embnic: {clib.SHARD.path} speaks ABI {lib.embnic_shard_abi()}, not {want}: "
                                      f"run {clib.REBUILD}")
    lib.embnic_shard_check.restype = ctypes.c_int
    lib.embnic_shard_check.argtypes = [_VP, ctypes.c_int64, _VP, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                       ctypes.c_int64, _VP, _VP, _VP]
    lib.embnic_shard_whole.restype = ctypes.c_int
    lib.embnic_shard_whole.argtypes = [_VP, _VP, _VP, ctypes.c_int, _VP, _VP]
    _lib = lib
    return lib


_told = False


def log_missing() -> None:
    """Say once per process that the library is not used, and why (what the engine falls back to)."""
    global _told
    if _told:
        return
    _told = True
    if os.environ.get("EMBNIC_SHARD_C", "1") == "0":
        log.info("shard C library off (EMBNIC_SHARD_C=0): intake and answers in Python (numpy)")
    elif os.environ.get("EMBNIC_SHARD_LIB") and not Path(os.environ["EMBNIC_SHARD_LIB"]).is_file():
        log.info("shard C library %s (EMBNIC_SHARD_LIB) not found: intake and answers in Python (numpy)",
                 os.environ["EMBNIC_SHARD_LIB"])
    elif _lib is None and not REPO_LIB.is_file():
        log.info("shard C library %s not built (pip install -e .): intake and answers in Python (numpy)", REPO_LIB)


class CIntake:
    """The C intake bound to one batch socket's receive buffers and one shard.

    Args:
        lib: :func:`load`'s library. rx: uint8 (batch, slot) and lens: int64 (batch,), the
            :class:`~.udpio.BatchSocket` buffers. shard_id: this shard. max_msg: the largest
            message body taken (bytes). max_reply: the largest lookup reply (``value_len``,
            bytes) that fits ``MAX_FRAGS`` fragments.

    The arrays returned by :meth:`check` and :meth:`whole` are this object's buffers, valid
    until the next call.
    """

    def __init__(self, lib: ctypes.CDLL, rx: np.ndarray, lens: np.ndarray, shard_id: int, max_msg: int,
                 max_reply: int):
        for a, dt in ((rx, np.uint8), (lens, np.int64)):
            if a.dtype != dt or not a.flags.c_contiguous:
                raise ValueError(f"C intake needs C-contiguous {np.dtype(dt)} arrays, got {a.dtype}")
        batch = rx.shape[0]
        self._keep = (rx, lens)  # the pointers below stay valid
        self._check = lib.embnic_shard_check
        self._whole = lib.embnic_shard_whole
        self.cols = np.zeros((batch, _NF), np.int64)
        self.ok = np.zeros(batch, np.uint8)
        self.p = np.zeros(batch, np.int64)
        self.order = np.zeros(batch, np.int64)
        self.grp = np.zeros((batch, 6), np.int64)
        self._args = (rx.ctypes.data, rx.shape[1], lens.ctypes.data)
        self._targs = (int(shard_id), int(max_msg), int(max_reply), self.cols.ctypes.data, self.ok.ctypes.data,
                       self.p.ctypes.data)
        self._p_order, self._p_grp = self.order.ctypes.data, self.grp.ctypes.data

    def check(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Header checks of frames ``0..n-1``: (cols int64 (n, 19), ok bool (n,), p int64 (n,)),
        as :meth:`~.intake.Intake.check_vector`."""
        rx, slot, lens = self._args
        self._check(rx, slot, lens, n, *self._targs)
        return self.cols[:n], self.ok[:n].view(bool), self.p[:n]

    def whole(self, mg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Group the multi-fragment frames ``mg`` (int64, ascending indices into the last
        :meth:`check`'s arrays) by message: (order int64 (m,) positions into ``mg`` sorted by
        message then fragment index, groups int64 (G, 6): first position in ``order``, frames,
        first and last datagram index, fragment size P, 1 if whole)."""
        mg = np.ascontiguousarray(mg, np.int64)
        g = self._whole(self._targs[3], self._targs[5], mg.ctypes.data, mg.size, self._p_order, self._p_grp)
        return self.order[:mg.size], self.grp[:g]
