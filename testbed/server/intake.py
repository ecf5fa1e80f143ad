"""The serving loop's reassembly: the messages whose fragments the answer path did not gather.

An :class:`Intake` reads its loop's receive buffers (:mod:`.udpio`); per wake-up it takes the
frames the header checks passed (their fields as an int64 ``(n, len(HEADER_FIELDS))`` array,
columns :data:`consts.HEADER_COLUMN <embnic.client_lib.consts.HEADER_COLUMN>`), copies fragments
into one preallocated buffer per message — :meth:`~Intake.whole` for messages complete in the
wake-up, :meth:`~Intake.reassemble` across wake-ups — and returns the whole ones as
:class:`~.shard_state.Request`. A message's buffer (``frag_count × P`` bytes) is counted against
``max_pending_bytes`` from its first fragment on.
"""
from __future__ import annotations

import collections
import time
from typing import Callable

import numpy as np

from embnic.client_lib import consts
from embnic.client_lib.consts import HEADER_COLUMN as COL
from embnic.client_lib.reassembly import AGREE_FIELDS

from . import udpio
from .shard_state import Request

MT, MID, CID, SID, NT, NK, VL, ML = (COL[f] for f in ("msg_type", "msg_id", "client_id", "shard_id", "num_tables",
                                                       "num_keys", "value_len", "msg_len"))
FO, FI, FC, FL = (COL[f] for f in ("frag_offset", "frag_index", "frag_count", "frag_len"))
FLAGS = COL["flags"]
#: the header fields of a message's ``info`` tuple, in its order
INFO_FIELDS = ("msg_type", "client_id", "msg_id", "num_tables", "num_keys", "value_len")
_INFO = [COL[f] for f in INFO_FIELDS]
#: header columns every fragment of a message must agree on (reassembly.AGREE_FIELDS); then P
SAME_COLS = [COL[f] for f in AGREE_FIELDS]
SAME_FC = AGREE_FIELDS.index("frag_count")
SAME_ML = AGREE_FIELDS.index("msg_len")
SAME_P = len(AGREE_FIELDS)  #: the fragment size's column in a ``same`` row


def message_key(cols: np.ndarray) -> np.ndarray:
    """The reassembly key of each header row of ``cols`` (int64 (n, 19)): uint64 (n,)
    ``client_id << 48 | msg_id << 16 | msg_type``."""
    return ((cols[:, CID].astype(np.uint64) << np.uint64(48)) | (cols[:, MID].astype(np.uint64) << np.uint64(16))
            | cols[:, MT].astype(np.uint64))


class _Pend:
    """A message being reassembled (multi-fragment)."""

    __slots__ = ("same", "fc", "ml", "p", "buf", "seen", "nseen", "t_last", "name", "info")

    def __init__(self, same, fc, ml, p, name, info, now):
        self.same = same  # the AGREE_FIELDS, then P
        self.fc, self.ml, self.p = fc, ml, p
        self.buf = np.empty(fc * p, np.uint8)
        self.seen = np.zeros(fc, bool)
        self.nseen = 0
        self.t_last = now
        self.name = name
        self.info = info  # INFO_FIELDS


class Intake:
    """Reassembly of the frames of a wake-up the answer path did not gather, for one serving loop.

    Args:
        max_pending, max_pending_bytes, timeout_s: as :class:`~embnic.client_lib.reassembly.Reassembler`'s.

    Attributes:
        bs: the :class:`~.udpio.BatchSocket` whose buffers are read (:meth:`bind`).
        stats: Counter of ``frames``, ``messages``, ``whole`` (multi-fragment messages gathered
            from one wake-up), ``duplicates``, ``expired``, ``evicted``.
        drops: Counter of frames dropped here by reason (``frag_mismatch``).
    """

    def __init__(self, *, max_pending: int = 1024, max_pending_bytes: int = 256 << 20, timeout_s: float = 2.0):
        self.max_pending = int(max_pending)
        self.max_pending_bytes = int(max_pending_bytes)
        self.timeout_s = float(timeout_s)
        self.bs: udpio.BatchSocket | None = None
        self._group: Callable | None = None
        self.stats: collections.Counter = collections.Counter()
        self.drops: collections.Counter = collections.Counter()
        self._pend: collections.OrderedDict[int, _Pend] = collections.OrderedDict()
        self._pend_bytes = 0

    def bind(self, bs: udpio.BatchSocket, group: Callable) -> None:
        """Read the receive buffers of ``bs`` from now on; ``group(mg)``: the multi-fragment frames
        ``mg`` grouped by message (:meth:`.canswer.CAnswer.whole`'s ``(order, groups)``)."""
        self.bs, self._group = bs, group

    def __len__(self) -> int:
        """Messages being reassembled."""
        return len(self._pend)

    def request(self, r: int, cols: np.ndarray, name: bytes, body=None, last_offset: int = 0) -> Request:
        """Frame ``r``'s message as a :class:`~.shard_state.Request` (its header's fields)."""
        return Request(r, name, *(int(cols[r, j]) for j in _INFO), last_offset, body)

    def messages(self, good: np.ndarray, cols: np.ndarray, p: np.ndarray) -> list[Request]:
        """Reassemble the fast path's frames ``good`` (indices, ascending; ``cols``, ``p``: the
        header fields and fragment sizes of the wake-up's frames, as the answer path's checks
        give them): the complete messages in the order of the datagram that completed them
        (``idx``; ``name``: the source ``sockaddr_in`` of the message's first frame)."""
        bs = self.bs
        L = bs.lens
        single = cols[:, FC] == 1
        self.stats["frames"] += int(good.size)
        out: list[tuple] = []
        sg = good[single[good]]
        if sg.size:
            for i, info in zip(sg.tolist(), cols[sg][:, _INFO].tolist()):
                out.append(Request(i, bs.names[i].tobytes(), *info, 0, bs.rx[i, consts.HDR_LEN:L[i]]))
            self.stats["messages"] += int(sg.size)
        mg = good[~single[good]]
        if mg.size:
            whole, mg = self.whole(mg, cols, p)
            out.extend(whole)
            if mg.size:
                out.extend(self.reassemble(mg, cols, p))
            out.sort(key=lambda m: m.idx)
        return out

    def poll(self, r: int, cols: np.ndarray, p: np.ndarray) -> tuple[list[Request], list[int] | None]:
        """Frame ``r``, an update poll (:func:`.shard_state.is_poll`), fed to its message like any fragment.

        Returns:
            (the message it completes, as :meth:`messages` gives it, or ``[]``; when it completes
            none: the fragment indices held of its message, or None when nothing is held or the
            poll contradicts what is — what ``UPDATE_NACK`` answers, :meth:`.ShardState.poll_reply`).
        """
        self.stats["frames"] += 1
        drops = self.drops["frag_mismatch"]
        done = self.reassemble(np.array([r], np.int64), cols, p)
        if done:
            return done, None
        ent = self._pend.get(int(message_key(cols[r:r + 1])[0]))
        if ent is None or self.drops["frag_mismatch"] != drops:
            return [], None
        return [], np.flatnonzero(ent.seen).tolist()

    def take_one(self, r: int, cols: np.ndarray, p: np.ndarray) -> Request | None:
        """Frame ``r`` alone (one the answer path's checks left to the state's one-frame path, which
        took it: a SIZE_REQ, say), fed to its message; the message it completes, else None."""
        if int(cols[r, FC]) == 1:
            return self.messages(np.array([r], np.int64), cols, p)[0]
        self.stats["frames"] += 1
        done = self.reassemble(np.array([r], np.int64), cols, p)
        return done[0] if done else None

    def discard(self, client_id: int, msg_id: int, msg_type: int) -> None:
        """Forget the fragments held of a message (an update the window holds: a poll's ack)."""
        ent = self._pend.pop((int(client_id) << 48) | (int(msg_id) << 16) | int(msg_type), None)
        if ent is not None:
            self._pend_bytes -= ent.buf.size

    def whole(self, mg: np.ndarray, cols: np.ndarray, p: np.ndarray) -> tuple[list[Request], np.ndarray]:
        """The messages whose every fragment came in this wake-up, once each, with headers that
        agree, and that nothing is pending for: their bodies gathered with one copy per fragment
        size for all of them (rows of the receive buffer in (message, fragment index) order).

        Args:
            mg: indices of the multi-fragment frames the fast path takes (ascending).

        Returns:
            (complete messages, the frames of ``mg`` left for
            :meth:`reassemble`, ascending). ``idx`` is the last datagram of the message (the one
            that completed it), ``name`` the first one's source — as :meth:`reassemble` gives.
        """
        order, grp = self._group(mg)
        start, cnt, first, last, gP, whole = (grp[:, j] for j in range(6))
        cols_first = cols[first]
        grp_ok = whole.astype(bool)
        if self._pend:  # nothing may be pending for a message gathered whole
            grp_ok &= np.array([k not in self._pend for k in message_key(cols_first).tolist()], bool)
        if not grp_ok.any():
            return [], mg
        rows = mg[order]
        take = np.repeat(grp_ok, cnt)
        out = []
        bs = self.bs
        H = consts.HDR_LEN
        Ps = gP[grp_ok]
        for P in ([int(Ps[0])] if (Ps == Ps[0]).all() else np.unique(Ps).tolist()):
            sel = grp_ok & (gP == P)
            data = bs.rx[rows[take & np.repeat(gP == P, cnt)], H:H + P].reshape(-1)  # one copy
            at = 0
            cs = cols_first[sel]
            infos = cs[:, _INFO].tolist()
            for info, n, ml, i0, i1 in zip(infos, cnt[sel].tolist(), cs[:, ML].tolist(), first[sel].tolist(),
                                           last[sel].tolist()):
                out.append(Request(i1, bs.names[i0].tobytes(), *info, (n - 1) * P, data[at:at + ml]))
                at += n * P
        self.stats["messages"] += len(out)
        self.stats["whole"] += len(out)
        return out, np.sort(rows[~take])

    def reassemble(self, mg: np.ndarray, cols: np.ndarray, p: np.ndarray) -> list[Request]:
        """Feed the multi-fragment frames ``mg`` (indices, ascending) to their messages; returns
        the ones they complete (as :meth:`messages`)."""
        bs = self.bs
        fi, fl = cols[:, FI], cols[:, FL]
        now = time.monotonic()
        c = cols[mg]
        key = message_key(c)
        same = np.concatenate([c[:, SAME_COLS], p[mg, None]], axis=1)  # AGREE_FIELDS, then P
        uk, first, inv = np.unique(key, return_index=True, return_inverse=True)
        order = np.argsort(inv, kind="stable")
        bounds = np.r_[0, np.cumsum(np.bincount(inv, minlength=uk.size))]
        out = []
        for g in np.argsort(first, kind="stable").tolist():
            rows = order[bounds[g]:bounds[g + 1]]  # positions in mg, ascending
            k = int(uk[g])
            pos = 0
            while pos < rows.size:
                ent = self._pend.get(k)
                r0 = int(rows[pos])
                if ent is None:
                    i0 = int(mg[r0])
                    s0 = same[r0]
                    while len(self._pend) >= self.max_pending:
                        self.expire(now)
                        if len(self._pend) >= self.max_pending:
                            self._drop_oldest("evicted")
                    ent = _Pend(tuple(s0.tolist()), int(s0[SAME_FC]), int(s0[SAME_ML]), int(s0[SAME_P]), bs.names[i0].tobytes(),
                                tuple(cols[i0, _INFO].tolist()), now)
                    self._pend[k] = ent
                    self._pend_bytes += ent.buf.size
                else:
                    self._pend.move_to_end(k)
                rest = rows[pos:]
                mism = (same[rest] != np.asarray(ent.same)).any(axis=1)
                gpos = np.flatnonzero(~mism)
                gr = rest[gpos]
                fidx = fi[mg[gr]]
                isnew = ~ent.seen[fidx]
                if fidx.size > 1:
                    firstocc = np.zeros(fidx.size, bool)
                    firstocc[np.unique(fidx, return_index=True)[1]] = True
                    isnew &= firstocc
                cum = np.cumsum(isnew)
                need = ent.fc - ent.nseen
                done = bool(cum.size) and int(cum[-1]) >= need
                if done:
                    c = int(np.searchsorted(cum, need))
                    cut = int(gpos[c])  # position in rest of the completing frame
                    self.drops["frag_mismatch"] += int(mism[:cut + 1].sum())
                    gr, isnew, fidx = gr[:c + 1], isnew[:c + 1], fidx[:c + 1]
                    pos += cut + 1
                else:
                    self.drops["frag_mismatch"] += int(mism.sum())
                    pos = rows.size
                self.stats["duplicates"] += int(isnew.size - np.count_nonzero(isnew))
                if isnew.any():
                    src = mg[gr[isnew]]
                    dst = fidx[isnew]
                    P = ent.p
                    body = ent.buf.reshape(ent.fc, P)
                    full = fl[src] == P
                    if full.any():
                        body[dst[full]] = bs.rx[src[full], consts.HDR_LEN:consts.HDR_LEN + P]
                    for i, d in zip(src[~full].tolist(), dst[~full].tolist()):  # the last fragment only
                        body[d, :fl[i]] = bs.rx[i, consts.HDR_LEN:consts.HDR_LEN + fl[i]]
                    ent.seen[dst] = True
                    ent.nseen += int(dst.size)
                    ent.t_last = now
                if done:
                    del self._pend[k]
                    self._pend_bytes -= ent.buf.size
                    self.stats["messages"] += 1
                    out.append(Request(int(mg[gr[-1]]), ent.name, *ent.info, (ent.fc - 1) * ent.p, ent.buf[:ent.ml]))
                else:
                    while self._pend_bytes > self.max_pending_bytes and len(self._pend) > 1:
                        self._drop_oldest("evicted")
        return out

    def _drop_oldest(self, why: str) -> None:
        """Forget the oldest message being reassembled, counted ``why`` (``evicted``, ``expired``)."""
        _, ent = self._pend.popitem(last=False)
        self._pend_bytes -= ent.buf.size
        self.stats[why] += 1

    def expire(self, now: float) -> None:
        """Forget the messages untouched for ``timeout_s`` (counted ``expired``)."""
        while self._pend and now - next(iter(self._pend.values())).t_last >= self.timeout_s:
            self._drop_oldest("expired")
