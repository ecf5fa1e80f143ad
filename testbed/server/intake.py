"""The batch engine's intake: header checks of a whole wake-up at once, and reassembly.

An :class:`Intake` belongs to one :class:`~.engine.BatchShardServer`, which gives it its receive
buffers (:mod:`.udpio`, and the C intake of :mod:`.cintake` when built) once its socket is open.
Per wake-up the engine asks it to :meth:`~Intake.check` the ``n`` datagrams of one ``recvmmsg``
— every header as a vector expression of the reference's rules (:meth:`~Intake.check_vector`; a
few frames: :meth:`~Intake.check_scalar`, the reference's own functions) — hands every frame the
fast path does not take to the reference handler itself, and gives the others back to
:meth:`~Intake.messages`, which copies fragments into one preallocated buffer per message
(:meth:`~Intake.whole`, :meth:`~Intake.reassemble`) and returns the complete messages as
``(idx, info, name, body)``; an update poll's frame goes to :meth:`~Intake.poll`.

Header fields are columns of an int64 ``(n, len(HEADER_FIELDS))`` array, named by
:data:`consts.HEADER_COLUMN <embnic.client_lib.consts.HEADER_COLUMN>` (the one field table); a
message's ``info`` is the tuple of its :data:`INFO_FIELDS`.

Reassembly memory: a message's buffer (``frag_count × P`` bytes) is allocated when its first
fragment arrives and counted against ``max_pending_bytes`` (256 MiB) by that size, so a header's
claim costs at most that bound (the reference counts received bytes instead).
"""
from __future__ import annotations

import collections
import time
from typing import Callable

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.codec import FrameError, Header
from embnic.client_lib.consts import HEADER_COLUMN as COL, MsgType
from embnic.client_lib.reassembly import AGREE_FIELDS, fragment_size

from . import cintake, udpio

_ZERO = (0,) * len(consts.HEADER_FIELDS)
_FIELDS = [f[0] for f in consts.HEADER_FIELDS]
MT, MID, CID, SID, NT, NK, VL, ML = (COL[f] for f in ("msg_type", "msg_id", "client_id", "shard_id", "num_tables",
                                                       "num_keys", "value_len", "msg_len"))
FO, FI, FC, FL = (COL[f] for f in ("frag_offset", "frag_index", "frag_count", "frag_len"))
FLAGS = COL["flags"]
#: the header fields of a message's ``info`` tuple, in its order
INFO_FIELDS = ("msg_type", "client_id", "msg_id", "num_tables", "num_keys", "value_len")
_INFO = [COL[f] for f in INFO_FIELDS]
#: header columns every fragment of a message must agree on (reassembly.AGREE_FIELDS); then P
_SAMEC = [COL[f] for f in AGREE_FIELDS]
_SFC = AGREE_FIELDS.index("frag_count")
_SML = AGREE_FIELDS.index("msg_len")
_SP = len(AGREE_FIELDS)  #: the fragment size's column in a ``same`` row


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
    """Header checks and reassembly of a wake-up's datagrams, for one batch engine.

    Args:
        shard_id: the shard's id (another's requests are not taken).
        max_msg: the largest message body taken (bytes; larger: the reference handler's).
        max_reply: the largest lookup reply (``value_len``, bytes) that fits ``MAX_FRAGS``
            fragments at the cluster MTU.
        refuses: the reference's header rule (``ShardServer._check_header``: a Status or None),
            for :meth:`check_scalar`; :meth:`check_vector` is the same rule over all frames.
        small: wake-ups of at most this many frames are checked frame by frame.
        max_pending, max_pending_bytes, timeout_s: as :class:`~embnic.client_lib.reassembly.Reassembler`'s.

    Attributes:
        bs: the :class:`~.udpio.BatchSocket` whose buffers are read (:meth:`bind`).
        cin: the :class:`~.cintake.CIntake` on them, or None (numpy).
        stats: Counter of ``frames``, ``messages``, ``whole`` (multi-fragment messages gathered
            from one wake-up), ``duplicates``, ``expired``, ``evicted``.
        drops: Counter of frames dropped here by reason (``frag_mismatch``).
    """

    def __init__(self, shard_id: int, max_msg: int, max_reply: int, refuses: Callable[[Header], object], *,
                 small: int = 4, max_pending: int = 1024, max_pending_bytes: int = 256 << 20,
                 timeout_s: float = 2.0):
        self.shard_id = int(shard_id)
        self.max_msg = int(max_msg)
        self.max_reply = int(max_reply)
        self.refuses = refuses
        self.small = int(small)
        self.max_pending = int(max_pending)
        self.max_pending_bytes = int(max_pending_bytes)
        self.timeout_s = float(timeout_s)
        self.bs: udpio.BatchSocket | None = None
        self.cin: cintake.CIntake | None = None
        self.stats: collections.Counter = collections.Counter()
        self.drops: collections.Counter = collections.Counter()
        self._pend: collections.OrderedDict[int, _Pend] = collections.OrderedDict()
        self._pend_bytes = 0

    def bind(self, bs: udpio.BatchSocket, cin: cintake.CIntake | None) -> None:
        """Read the receive buffers of ``bs`` (checked by ``cin`` when given) from now on."""
        self.bs, self.cin = bs, cin

    def __len__(self) -> int:
        """Messages being reassembled."""
        return len(self._pend)

    def check(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The header checks of the ``n`` frames of the last receive, as :meth:`check_vector`
        (frame by frame, :meth:`check_scalar`, for at most ``small`` frames without the C intake)."""
        return self.check_vector(n) if n > self.small or self.cin is not None else self.check_scalar(n)

    def info(self, r: int, cols: np.ndarray) -> tuple:
        """Frame ``r``'s message ``info`` (its :data:`INFO_FIELDS`, ints)."""
        return tuple(int(cols[r, j]) for j in _INFO)

    def messages(self, good: np.ndarray, cols: np.ndarray, p: np.ndarray) -> list[tuple]:
        """Reassemble the fast path's frames ``good`` (indices, ascending; ``cols``, ``p`` as
        :meth:`check_vector` gives them): the complete messages as ``(idx, info, name, body)``
        in the order of the datagram that completed them (``idx``; ``name``: the source
        ``sockaddr_in`` bytes of the message's first frame; ``body`` uint8)."""
        bs = self.bs
        L = bs.lens
        fi, fl = cols[:, FI], cols[:, FL]
        single = cols[:, FC] == 1
        self.stats["frames"] += int(good.size)
        out: list[tuple] = []
        info_cols = tuple(cols[:, c] for c in _INFO)
        sg = good[single[good]]
        if sg.size:
            icols = [c[sg].tolist() for c in info_cols]
            for j, i in enumerate(sg.tolist()):
                out.append((i, tuple(c[j] for c in icols), bs.names[i].tobytes(),
                            bs.rx[i, consts.HDR_LEN:L[i]]))
            self.stats["messages"] += int(sg.size)
        mg = good[~single[good]]
        if mg.size:
            whole, mg = self.whole(mg, cols, info_cols, p)
            out.extend(whole)
            if mg.size:
                out.extend(self.reassemble(mg, cols, info_cols, p, fi, fl))
            out.sort(key=lambda m: m[0])
        return out

    def poll(self, r: int, cols: np.ndarray, p: np.ndarray) -> tuple[list[tuple], list[int] | None]:
        """Frame ``r``, an update poll (``shard.is_poll``), fed to its message like any fragment.

        Returns:
            (the message it completes, as :meth:`messages` gives it, or ``[]``; when it completes
            none: the fragment indices held of its message, or None when nothing is held or the
            poll contradicts what is — what ``UPDATE_NACK`` answers, ``ShardServer._poll``).
        """
        self.stats["frames"] += 1
        drops = self.drops["frag_mismatch"]
        done = self.reassemble(np.array([r], np.int64), cols, tuple(cols[:, c] for c in _INFO), p, cols[:, FI],
                               cols[:, FL])
        if done:
            return done, None
        ent = self._pend.get(int(message_key(cols[r:r + 1])[0]))
        if ent is None or self.drops["frag_mismatch"] != drops:
            return [], None
        return [], np.flatnonzero(ent.seen).tolist()

    def discard(self, client_id: int, msg_id: int, msg_type: int) -> None:
        """Forget the fragments held of a message (an update the window holds: a poll's ack)."""
        ent = self._pend.pop((int(client_id) << 48) | (int(msg_id) << 16) | int(msg_type), None)
        if ent is not None:
            self._pend_bytes -= ent.buf.size

    def whole(self, mg: np.ndarray, cols: np.ndarray, info_cols, p: np.ndarray) -> tuple[list[tuple], np.ndarray]:
        """The messages whose every fragment came in this wake-up, once each, with headers that
        agree, and that nothing is pending for: their bodies gathered with one copy per fragment
        size for all of them (rows of the receive buffer in (message, fragment index) order).

        Args:
            mg: indices of the multi-fragment frames the fast path takes (ascending).

        Returns:
            (complete messages as ``(idx, info, name, body)``, the frames of ``mg`` left for
            :meth:`reassemble`, ascending). ``idx`` is the last datagram of the message (the one
            that completed it), ``name`` the first one's source — as :meth:`reassemble` gives.
        """
        if self.cin is not None:
            order, grp = self.cin.whole(mg)
            start, cnt, first, last, gP, whole = (grp[:, j] for j in range(6))
        else:
            order, start, cnt, first, last, gP, whole = self.group(mg, cols, p)
        cols_first = cols[first]
        grp_ok = whole.astype(bool)
        if self._pend:
            for g in np.flatnonzero(grp_ok).tolist():
                c = cols_first[g]
                if (int(c[CID]) << 48) | (int(c[MID]) << 16) | int(c[MT]) in self._pend:
                    grp_ok[g] = False
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
                out.append((i1, tuple(info), bs.names[i0].tobytes(), data[at:at + ml]))
                at += n * P
        self.stats["messages"] += len(out)
        self.stats["whole"] += len(out)
        return out, np.sort(rows[~take])

    @staticmethod
    def group(mg: np.ndarray, cols: np.ndarray, p: np.ndarray):
        """The multi-fragment frames ``mg`` grouped by message (numpy; the C intake's
        ``embnic_shard_whole`` does the same): (order: positions into ``mg`` by message key,
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
        same = np.concatenate([c[:, _SAMEC], p[mg, None]], axis=1)[order]  # AGREE_FIELDS, then P
        row_ok = (c[order, FI] == pos) & (same == np.repeat(same[start], cnt, axis=0)).all(axis=1)
        whole = (cnt == same[start, _SFC]) & np.logical_and.reduceat(row_ok, start)
        rows = mg[order]
        return (order, start, cnt, np.minimum.reduceat(rows, start), np.maximum.reduceat(rows, start),
                same[start, _SP], whole)

    def check_vector(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Header fields of the ``n`` frames (int64 (n, 19), columns :data:`consts.HEADER_COLUMN`),
        whether the fast path takes each (bool (n,)) and its fragment size P (0 for single
        frames): all frames at once, the rules of ``codec.parse_header``,
        ``ShardServer._check_header`` and :func:`~embnic.client_lib.reassembly.fragment_size`
        as vector expressions (the C intake's when it is there)."""
        if self.cin is not None:
            return self.cin.check(n)
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
        """As :meth:`check_vector`, frame by frame with the reference's own functions (cheaper
        than a dozen vector operations when a wake-up brings a few frames)."""
        bs = self.bs
        rows, ok, p = [], [], []
        for i in range(n):
            try:
                h = codec.parse_header(memoryview(bs.rx[i, :bs.lens[i]]), expect="request")
                good = h.msg_len <= self.max_msg and h.msg_type != MsgType.SIZE_REQ and self.refuses(h) is None
                pp = fragment_size(h) if good else 0
            except FrameError:
                h, good, pp = _ZERO, False, 0
            rows.append(h)
            ok.append(good)
            p.append(pp)
        return np.array(rows, np.int64).reshape(n, len(consts.HEADER_FIELDS)), np.array(ok, bool), np.array(p, np.int64)

    def reassemble(self, mg: np.ndarray, cols: np.ndarray, info_cols, p, fi, fl) -> list[tuple]:
        """Feed the multi-fragment frames ``mg`` (indices, ascending) to their messages; returns
        the ones they complete (as :meth:`messages`)."""
        bs = self.bs
        now = time.monotonic()
        c = cols[mg]
        key = message_key(c)
        same = np.concatenate([c[:, _SAMEC], p[mg, None]], axis=1)  # AGREE_FIELDS, then P
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
                            self._evict_oldest()
                    ent = _Pend(tuple(s0.tolist()), int(s0[_SFC]), int(s0[_SML]), int(s0[_SP]), bs.names[i0].tobytes(),
                                tuple(int(c[i0]) for c in info_cols), now)
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
                    out.append((int(mg[gr[-1]]), ent.info, ent.name, ent.buf[:ent.ml]))
                else:
                    while self._pend_bytes > self.max_pending_bytes and len(self._pend) > 1:
                        self._evict_oldest()
        return out

    def _evict_oldest(self) -> None:
        _, ent = self._pend.popitem(last=False)
        self._pend_bytes -= ent.buf.size
        self.stats["evicted"] += 1

    def expire(self, now: float) -> None:
        """Forget the messages untouched for ``timeout_s`` (counted ``expired``)."""
        while self._pend:
            k, ent = next(iter(self._pend.items()))
            if now - ent.t_last < self.timeout_s:
                break
            del self._pend[k]
            self._pend_bytes -= ent.buf.size
            self.stats["expired"] += 1
