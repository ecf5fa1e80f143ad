"""The batch engine's intake: header checks of a whole wake-up at once, and reassembly.

:class:`BatchIntake` is a part of :class:`~.engine.BatchShardServer` (its state — the receive
buffers of :mod:`.udpio`, the pending messages ``_pend`` — is set up there): :meth:`_intake`
takes the ``n`` datagrams of one ``recvmmsg``, checks every header as a vector expression of
the reference's rules (:meth:`_check_vector`; a few frames: :meth:`_check_scalar`, the
reference's own functions), hands every frame the fast path does not take to the reference
handler (one home for every error rule and drop reason) and copies fragments into one
preallocated buffer per message (:meth:`_fast`: :meth:`_whole`, :meth:`_reassemble`); update
polls are answered in their place in the wake-up (:meth:`_poll_row`). Out: complete messages as
``(idx, info, name, body)``, to ``_messages``.

Reassembly memory: a message's buffer (``frag_count × P`` bytes) is allocated when its first
fragment arrives and counted against ``max_pending_bytes`` (256 MiB) by that size, so a header's
claim costs at most that bound (the reference counts received bytes instead).
"""
from __future__ import annotations

import time

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.codec import FrameError
from embnic.client_lib.consts import MsgType
from embnic.client_lib.reassembly import _SAME, _geometry

from . import udpio

_ZERO = (0,) * len(consts.HEADER_FIELDS)
_FIELDS = [f[0] for f in consts.HEADER_FIELDS]
_C = {f: i for i, f in enumerate(_FIELDS)}  #: header field -> its column in ``cols``
MT, MID, CID, SID, NT, NK, VL, ML = (_C[f] for f in ("msg_type", "msg_id", "client_id", "shard_id", "num_tables",
                                                      "num_keys", "value_len", "msg_len"))
FO, FI, FC, FL = (_C[f] for f in ("frag_offset", "frag_index", "frag_count", "frag_len"))
FLAGS = _C["flags"]
#: header columns of a message's info: msg_type, client_id, msg_id, num_tables, num_keys, value_len
_INFO = [MT, CID, MID, NT, NK, VL]
#: header columns every fragment of a message must agree on (reassembly._SAME); then P
_SAMEC = [_C[f] for f in _SAME]
_SFC = _SAME.index("frag_count")
_SML = _SAME.index("msg_len")
_SP = len(_SAME)  #: the fragment size's column in a ``same`` row


class _Pend:
    """A message being reassembled (multi-fragment)."""

    __slots__ = ("same", "fc", "ml", "p", "buf", "seen", "nseen", "t_last", "name", "info")

    def __init__(self, same, fc, ml, p, name, info, now):
        self.same = same  # the _SAME fields, then P
        self.fc, self.ml, self.p = fc, ml, p
        self.buf = np.empty(fc * p, np.uint8)
        self.seen = np.zeros(fc, bool)
        self.nseen = 0
        self.t_last = now
        self.name = name
        self.info = info  # (msg_type, client_id, msg_id, num_tables, num_keys, value_len)



class BatchIntake:
    """Validation and reassembly of a wake-up's datagrams (a part of ``BatchShardServer``)."""

    def _intake(self, n: int, checked: tuple | None = None, taken: np.ndarray | None = None) -> None:
        """Validate, divert and reassemble the ``n`` frames and hand the complete messages to
        ``_messages`` (in the order of the datagram that completed them). A wake-up holding
        update polls (``shard.is_poll``) is cut at each poll: the frames before it are served
        first, then the poll (:meth:`_poll_row`), so its answer depends on exactly what came
        before it, as in the reference.

        ``checked``: the header checks already made (``(cols, ok, p)`` as :meth:`_check_vector`:
        the C answer path's, :meth:`.canswer.CAnswer.serve`); ``taken``: bool (n,), frames it
        answered already (lookups: they change nothing here)."""
        bs = self._bs
        L = bs.lens[:n]
        if checked is not None:
            cols, ok, p = checked
        else:
            cols, ok, p = self._check_vector(n) if n > self.small or self._cin is not None else self._check_scalar(n)
        if self.fixed_length:
            ok &= self._announced_match(np.flatnonzero(ok), cols, n)

        # frames the fast path does not take: the reference handler, one by one
        slow = np.flatnonzero(~ok)
        for i in slow.tolist():
            self._cur_idx = i
            self.handle_datagram(bytes(bs.rx[i, :L[i]]), udpio.sockaddr_to_tuple(bs.names[i]))
        good = np.flatnonzero(ok if taken is None else ok & ~taken)
        if good.size == 0:
            return
        self._c["rx_frames"] += int(good.size)
        self._c["rx_bytes"] += int(L[good].sum())
        c = cols[good]
        poll = ((c[:, MT] == MsgType.UPDATE_REQ) & ((c[:, FLAGS] & consts.Flags.RETRANSMIT) != 0) & (c[:, FC] > 1)
                & (c[:, FI] == c[:, FC] - 1))
        if not poll.any():
            self._messages(self._fast(good, cols, p))
            return
        rest = good[~poll]
        start = 0
        for r in good[poll].tolist():
            seg = rest[(rest >= start) & (rest < r)]
            if seg.size:
                self._messages(self._fast(seg, cols, p))
            self._poll_row(r, cols, p)
            start = r + 1
        seg = rest[rest >= start]
        if seg.size:
            self._messages(self._fast(seg, cols, p))

    def _fast(self, good: np.ndarray, cols: np.ndarray, p: np.ndarray) -> list[tuple]:
        """Reassemble the fast path's frames ``good`` (indices, ascending): complete messages as
        ``(idx, info, name, body)`` in the order of the datagram that completed them."""
        bs = self._bs
        L = bs.lens
        fi, fl = cols[:, FI], cols[:, FL]
        single = cols[:, FC] == 1
        self._rstats["frames"] += int(good.size)
        out: list[tuple] = []
        info_cols = tuple(cols[:, c] for c in _INFO)
        sg = good[single[good]]
        if sg.size:
            icols = [c[sg].tolist() for c in info_cols]
            for j, i in enumerate(sg.tolist()):
                out.append((i, tuple(c[j] for c in icols), bs.names[i].tobytes(),
                            bs.rx[i, consts.HDR_LEN:L[i]]))
            self._rstats["messages"] += int(sg.size)
        mg = good[~single[good]]
        if mg.size:
            whole, mg = self._whole(mg, cols, info_cols, p)
            out.extend(whole)
            if mg.size:
                out.extend(self._reassemble(mg, cols, info_cols, p, fi, fl))
            out.sort(key=lambda m: m[0])
        return out

    def _poll_row(self, r: int, cols: np.ndarray, p: np.ndarray) -> None:
        """Frame ``r``, an update poll, as ``ShardServer._poll``: fed to its message first —
        served if it completes it; else ``UPDATE_ACK`` when the window holds the update with these
        counts (the fragments held again dropped), else ``UPDATE_NACK`` with the fragments held."""
        info = tuple(int(cols[r, j]) for j in _INFO)
        cid, mid = info[1], info[2]
        m = (r, info, self._bs.names[r].tobytes(), None)
        key = (cid << 48) | (mid << 16) | MsgType.UPDATE_REQ
        self._c["update_polls"] += 1
        self._rstats["frames"] += 1
        drops = self._rdrops["frag_mismatch"]
        done = self._reassemble(np.array([r], np.int64), cols, tuple(cols[:, c] for c in _INFO), p, cols[:, FI],
                                cols[:, FL])
        if done:
            self._messages(done)
            return
        fp = self._applied.get((cid, mid))
        if fp is not None and fp[:3] == info[3:6]:
            self._c["update_poll_acks"] += 1
            self._applied.move_to_end((cid, mid))
            ent = self._pend.pop(key, None)
            if ent is not None:
                self._pend_bytes -= ent.buf.size
            self._emit(m, MsgType.UPDATE_ACK)
            return
        ent = self._pend.get(key)
        if ent is not None and self._rdrops["frag_mismatch"] == drops:
            self._c["update_nacks"] += 1
            self._emit(m, MsgType.UPDATE_NACK, np.frombuffer(codec.nack_body(np.flatnonzero(ent.seen).tolist()),
                                                             np.uint8))

    def _whole(self, mg: np.ndarray, cols: np.ndarray, info_cols, p: np.ndarray) -> tuple[list[tuple], np.ndarray]:
        """The messages whose every fragment came in this wake-up, once each, with headers that
        agree, and that nothing is pending for: their bodies gathered with one copy per fragment
        size for all of them (rows of the receive buffer in (message, fragment index) order).

        Args:
            mg: indices of the multi-fragment frames the fast path takes (ascending).

        Returns:
            (complete messages as ``(idx, info, name, body)``, the frames of ``mg`` left for
            :meth:`_reassemble`, ascending). ``idx`` is the last datagram of the message (the one
            that completed it), ``name`` the first one's source — as :meth:`_reassemble` gives.
        """
        if self._cin is not None:
            order, grp = self._cin.whole(mg)
            start, cnt, first, last, gP, whole = (grp[:, j] for j in range(6))
        else:
            order, start, cnt, first, last, gP, whole = self._group(mg, cols, p)
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
        bs = self._bs
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
        self._rstats["messages"] += len(out)
        self._rstats["whole"] += len(out)
        return out, np.sort(rows[~take])

    @staticmethod
    def _group(mg: np.ndarray, cols: np.ndarray, p: np.ndarray):
        """The multi-fragment frames ``mg`` grouped by message (numpy; the C intake's
        ``embnic_shard_whole`` does the same): (order: positions into ``mg`` by message key,
        then fragment index, then arrival; per group: first position in ``order``, frames,
        first and last datagram index, fragment size P, whether every fragment came once with
        headers that agree)."""
        c = cols[mg]
        key = ((c[:, CID].astype(np.uint64) << np.uint64(48)) | (c[:, MID].astype(np.uint64) << np.uint64(16))
               | c[:, MT].astype(np.uint64))
        order = np.lexsort((c[:, FI], key))  # by message, then fragment index
        ks = key[order]
        start = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
        cnt = np.diff(np.r_[start, ks.size])
        pos = np.arange(ks.size) - np.repeat(start, cnt)
        same = np.concatenate([c[:, _SAMEC], p[mg, None]], axis=1)[order]  # reassembly._SAME, then P
        row_ok = (c[order, FI] == pos) & (same == np.repeat(same[start], cnt, axis=0)).all(axis=1)
        whole = (cnt == same[start, _SFC]) & np.logical_and.reduceat(row_ok, start)
        rows = mg[order]
        return (order, start, cnt, np.minimum.reduceat(rows, start), np.maximum.reduceat(rows, start),
                same[start, _SP], whole)

    def _check_vector(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Header fields of the ``n`` frames (int64 (n, 19), in ``consts.HEADER_FIELDS`` order),
        whether the fast path takes each (bool (n,)) and its fragment size P (0 for single
        frames): all frames at once, the rules of ``codec.parse_header``,
        ``ShardServer._check_header`` and ``reassembly._geometry`` as vector expressions."""
        if self._cin is not None:
            return self._cin.check(n)
        bs = self._bs
        L = bs.lens[:n]
        H = np.ascontiguousarray(bs.rx[:n, :consts.HDR_LEN]).view(codec.HEADER_DTYPE).reshape(n)
        cols = np.empty((n, len(_FIELDS)), np.int64)
        for j, f in enumerate(_FIELDS):  # 19 field copies (structured_to_unstructured costs 10x)
            cols[:, j] = H[f]
        mt, nt, nk, vl, ml = cols[:, MT], cols[:, NT], cols[:, NK], cols[:, VL], cols[:, ML]
        fo, fi, fc, fl = cols[:, FO], cols[:, FI], cols[:, FC], cols[:, FL]
        lookup = mt == MsgType.LOOKUP_REQ
        expect = consts.DIR_ENTRY * nt + consts.KEY_SIZE * nk + np.where(lookup, 0, vl)
        ok = ((L >= consts.HDR_LEN) & (cols[:, _C["magic"]] == consts.MAGIC)
              & (cols[:, _C["version"]] == consts.VERSION) & (lookup | (mt == MsgType.UPDATE_REQ))
              & (fl == L - consts.HDR_LEN) & (fc >= 1) & (fi < fc) & (fo + fl <= ml) & (ml == expect)
              & (nt >= 1) & (nk >= nt) & (vl >= 2 * nk)
              & (fc <= consts.MAX_FRAGS) & (ml <= self.max_msg_bytes) & (ml <= self._reasm.max_msg_len)
              & (cols[:, SID] == self.shard_id) & ~(lookup & (vl > self.max_reply_bytes)))
        # fragment geometry (reassembly.py, _geometry)
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

    def _check_scalar(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As :meth:`_check_vector`, frame by frame with the reference's own functions (cheaper
        than a dozen vector operations when a wake-up brings a few frames)."""
        bs = self._bs
        rows, ok, p = [], [], []
        for i in range(n):
            try:
                h = codec.parse_header(memoryview(bs.rx[i, :bs.lens[i]]), expect="request")
                good = (h.msg_len <= self.max_msg_bytes and h.msg_len <= self._reasm.max_msg_len
                        and h.msg_type != MsgType.SIZE_REQ and self._check_header(h) is None)
                pp = _geometry(h) if good else 0
            except FrameError:
                h, good, pp = _ZERO, False, 0
            rows.append(h)
            ok.append(good)
            p.append(pp)
        return np.array(rows, np.int64).reshape(n, len(consts.HEADER_FIELDS)), np.array(ok, bool), np.array(p, np.int64)

    def _announced_match(self, cand: np.ndarray, cols: np.ndarray, n: int) -> np.ndarray:
        """Fixed-length mode: bool (n,), True where frame ``cand[j]``'s message was announced by a
        SIZE_REQ with its header's type, ``num_tables``, ``num_keys`` and ``msg_len`` — so every
        buffer the fast path allocates has the announced size. The others go to the reference
        handler, which drops them as ``unannounced`` / ``size_mismatch``. One dict look-up per
        distinct message, not per frame."""
        out = np.zeros(n, bool)
        if cand.size == 0:
            return out
        c = cols[cand]
        k = (c[:, CID].astype(np.uint64) << np.uint64(32)) | c[:, MID].astype(np.uint64)
        uk, first, inv = np.unique(k, return_index=True, return_inverse=True)
        good = np.zeros(uk.size, bool)
        ann = self._announced
        want = c[first][:, [MT, NT, NK, ML]].tolist()  # msg_type, num_tables, num_keys, msg_len
        for u, key in enumerate(uk.tolist()):
            good[u] = ann.get((key >> 32, key & 0xFFFFFFFF)) == tuple(want[u])
        out[cand] = good[inv]
        return out

    def _reassemble(self, mg: np.ndarray, cols: np.ndarray, info_cols, p, fi, fl) -> list[tuple]:
        """Feed the multi-fragment frames ``mg`` (indices, ascending) to their messages."""
        bs = self._bs
        now = time.monotonic()
        c = cols[mg]
        key = ((c[:, CID].astype(np.uint64) << np.uint64(48)) | (c[:, MID].astype(np.uint64) << np.uint64(16))
               | c[:, MT].astype(np.uint64))
        same = np.concatenate([c[:, _SAMEC], p[mg, None]], axis=1)  # reassembly._SAME, then P
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
                    while len(self._pend) >= self._max_pending:
                        self._expire(now)
                        if len(self._pend) >= self._max_pending:
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
                    self._rdrops["frag_mismatch"] += int(mism[:cut + 1].sum())
                    gr, isnew, fidx = gr[:c + 1], isnew[:c + 1], fidx[:c + 1]
                    pos += cut + 1
                else:
                    self._rdrops["frag_mismatch"] += int(mism.sum())
                    pos = rows.size
                self._rstats["duplicates"] += int(isnew.size - np.count_nonzero(isnew))
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
                    self._rstats["messages"] += 1
                    out.append((int(mg[gr[-1]]), ent.info, ent.name, ent.buf[:ent.ml]))
                else:
                    while self._pend_bytes > self._max_pending_bytes and len(self._pend) > 1:
                        self._evict_oldest()
        return out

    def _evict_oldest(self) -> None:
        _, ent = self._pend.popitem(last=False)
        self._pend_bytes -= ent.buf.size
        self._rstats["evicted"] += 1

    def _expire(self, now: float) -> None:
        while self._pend:
            k, ent = next(iter(self._pend.items()))
            if now - ent.t_last < self._pend_timeout:
                break
            del self._pend[k]
            self._pend_bytes -= ent.buf.size
            self._rstats["expired"] += 1
