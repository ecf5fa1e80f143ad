"""The shard's batch engine: many datagrams and messages per wake-up, numpy across all of them.

:class:`BatchShardServer` answers exactly as the reference :class:`~embnic.testbed.server.shard.ShardServer`
(same replies, statuses, counters, exactly-once rules and numerics — the tests run both on the
same frames and compare), but where the reference handles one datagram per asyncio callback in
Python, the engine works per **wake-up**::

    poll ─▶ recvmmsg (≤ 64 datagrams into a preallocated (64, 65536) uint8 buffer)
         ─▶ headers of all of them parsed and checked at once (numpy structured view)
         ─▶ frames the fast path cannot take (malformed, wrong shard, unknown table, ...) go to
            the reference handler one by one: one home for every error rule and drop reason
         ─▶ fragments reassembled per message (vector copies into one buffer per message)
         ─▶ complete messages grouped per table: one key check (range, owner) over all their
            keys, one row gather for all lookups, one optimizer step for all updates
            (:func:`serve_batch` → :meth:`_flush_lookups` / :meth:`_flush_updates`)
         ─▶ replies encoded straight into a preallocated (rows, 40 + P) transmit buffer
         ─▶ sendmmsg, multi-frame replies as UDP GSO super-datagrams (:mod:`.udpio`)

Replies leave in the order of the datagrams that completed their requests, as with the
reference. Ordering rules that keep the numerics identical to the reference (and so to
:class:`~embnic.client_lib.local.LocalBackend`): per table, a lookup queued after an update of
the same table (or the other way round) first flushes what is queued; updates of one flush
whose keys overlap are applied one message after the other, in arrival order; disjoint ones in
one :meth:`TableShard.apply` call (row-wise optimizers: a row's result does not depend on the
other rows of the call). An update whose ``(client_id, msg_id)`` is queued for another table
flushes every table first, so the exactly-once window sees messages in arrival order.

**Where an update is made durable.** With ``checkpoint_dir`` every applied update is appended to
the write-ahead log where the exactly-once window takes it (:meth:`_flush_updates`, or the
reference's ``_update`` for lone small messages and diverted frames), and :meth:`serve_batch`
commits the log with **one** ``fdatasync`` per wake-up before :meth:`_transmit` lets any ack of
that wake-up leave (:mod:`.durability`). Checkpoints are taken between wake-ups.

Reassembly memory: a message's buffer (``frag_count × P`` bytes) is allocated when its first
fragment arrives and counted against ``max_pending_bytes`` (256 MiB) by that size, so a header's
claim costs at most that bound (the reference counts received bytes instead).
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import select
import socket
import struct
import time
import zlib
from typing import Any, Callable

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.client import set_socket_buffers
from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.codec import FrameError
from embnic.client_lib.consts import MsgType, Status
from embnic.client_lib.reassembly import Message, _geometry
from embnic.client_lib.routing import owns
from embnic.client_lib.table_numerics import is_unique, rowwise_mean_square

from . import udpio
from .shard import _SOCK_BUF, ShardServer, _Refused

log = logging.getLogger("embnic.server")

_HDR = struct.Struct("!HBBBBHIHHHHIIIHHHH")
_U4 = np.dtype(">u4")
_U2 = np.dtype(">u2")
_ZERO = (0,) * len(consts.HEADER_FIELDS)
_FIELDS = [f[0] for f in consts.HEADER_FIELDS]


class _Pend:
    """A message being reassembled (multi-fragment)."""

    __slots__ = ("same", "fc", "ml", "p", "buf", "seen", "nseen", "t_last", "name", "info")

    def __init__(self, same, fc, ml, p, name, info, now):
        self.same = same  # (dtype, status, table_id, shard_id, dim, num_keys, msg_len, frag_count)
        self.fc, self.ml, self.p = fc, ml, p
        self.buf = np.empty(fc * p, np.uint8)
        self.seen = np.zeros(fc, bool)
        self.nseen = 0
        self.t_last = now
        self.name = name
        self.info = info  # (msg_type, client_id, msg_id, table_id, num_keys, dim, dtype)


class BatchShardServer(ShardServer):
    """One shard served by the batch engine (see the module docstring).

    Args:
        cfg, shard_id, bind, port, **kwargs: as :class:`ShardServer` (``dedup_window``,
            ``max_msg_bytes``, ``reassembly_timeout_s``).
        batch: datagrams per ``recvmmsg`` (per wake-up pass).
        small: wake-ups of at most this many frames check their headers frame by frame
            (:meth:`_check_scalar`), larger ones as vectors (:meth:`_check_vector`).
        small_keys: a message of at most this many keys that is alone of its table and kind in
            a wake-up is served by the reference's own functions (:meth:`_flush_one`); others
            (and every larger one) by the vector path.
        gso: send multi-frame replies with UDP GSO (falls back by itself where refused).
        sock: an already bound UDP socket to serve (the ``--workers`` parent binds them);
            ``bind``/``port`` are then ignored.

    Raises:
        KeyError: ``shard_id`` is not in the config.
    """

    _sync_each = False  # one log commit per wake-up, in serve_batch

    def __init__(self, cfg: ClusterConfig, shard_id: int, bind: str | None = None, port: int | None = None, *,
                 batch: int = 64, small: int = 4, small_keys: int = 256, gso: bool = True, sock: socket.socket | None = None,
                 **kwargs):
        super().__init__(cfg, shard_id, bind, port, **kwargs)
        self.batch = int(batch)
        self.small = int(small)
        self.small_keys = int(small_keys)
        self.gso = bool(gso)
        self._sock = sock
        self._bs: udpio.BatchSocket | None = None
        self._P = consts.max_body_per_frame(self.mtu)
        self._W = consts.HDR_LEN + self._P
        self._tx = np.empty((256, self._W), np.uint8)
        self._txlen = np.zeros(256, np.int64)
        self._ntx = 0
        self._rep_idx: list[int] = []
        self._rep_start: list[int] = []
        self._rep_count: list[int] = []
        self._rep_name: list[bytes] = []
        self._cur_idx = 0
        self._cur_name = b""
        # per table id: dim (-1: unknown table), wire dtype, most keys a lookup may carry
        self._tdim = np.full(1 << 16, -1, np.int64)
        self._tdt = np.zeros(1 << 16, np.int64)
        self._tmaxlk = np.zeros(1 << 16, np.int64)
        for t in cfg.tables:
            self._tdim[t.id] = t.dim
            self._tdt[t.id] = int(t.wire_dtype)
            self._tmaxlk[t.id] = consts.max_keys_per_message(MsgType.LOOKUP_REQ, t.dim, t.wire_dtype, self.mtu)
        self._pend: collections.OrderedDict[int, _Pend] = collections.OrderedDict()
        self._pend_bytes = 0
        self._max_pending = self._reasm.max_pending
        self._max_pending_bytes = self._reasm.max_pending_bytes
        self._pend_timeout = self._reasm.timeout_s
        self._rstats: collections.Counter = collections.Counter()
        self._rdrops: collections.Counter = collections.Counter()
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._calls: collections.deque = collections.deque()
        self._ckpt_req = False

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """(ip, port) actually bound (after :meth:`open`)."""
        if self._bs is None:
            return self.bind, self.port
        return self._bs.sock.getsockname()[:2]

    def open(self) -> tuple[str, int]:
        """Bind the socket (unless one was given). Returns (ip, port).

        Raises:
            OSError: the address cannot be bound.
        """
        sock = self._sock
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                set_socket_buffers(sock, _SOCK_BUF)
                sock.bind((self.bind, self.port))
            except OSError:
                sock.close()
                raise
        self._bs = udpio.BatchSocket(sock, batch=self.batch, gso=self.gso)
        self.started_at = time.monotonic()
        return self.address

    def run(self) -> None:
        """Serve until :meth:`request_stop` (from any thread or a signal handler)."""
        bs = self._bs
        poller = select.poll()
        poller.register(bs.fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        next_tick = time.monotonic() + 0.5
        while not self._stopping:
            if self._calls:
                self._run_calls()
            if self._ckpt_req:
                self._ckpt_req = False
                try:
                    self.checkpoint()
                except OSError as e:
                    self._c["checkpoint_errors"] += 1
                    log.error("shard %d: checkpoint failed (%s); the log is kept whole", self.shard_id, e)
            wait_ms = max(0, int((next_tick - time.monotonic()) * 1000))
            for fd, _ in poller.poll(wait_ms):
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
            for _ in range(64):  # drain, then look at calls and the clock again
                n = bs.recv()
                if n == 0:
                    break
                self.serve_batch(n)
            now = time.monotonic()
            if now >= next_tick:
                self._reasm.expire(now)
                self._expire(now)
                next_tick = now + 0.5
        self._run_calls()

    def request_checkpoint(self) -> None:
        """Checkpoint between the next wake-ups (thread- and signal-safe; SIGUSR1)."""
        self._ckpt_req = True
        self._wake()

    def request_stop(self) -> None:
        """Make :meth:`run` return (thread- and signal-safe)."""
        self._stopping = True
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        """Close the socket, the wake-up pipe and the log. Idempotent."""
        if self._dur is not None:
            self._dur.close()
        if self._bs is not None:
            self._bs.sock.close()
            self._bs = None
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1

    def stop(self) -> None:
        """As :meth:`request_stop` (the reference's name)."""
        self.request_stop()

    def call(self, fn: Callable, *args, timeout_s: float = 10.0):
        """Run ``fn(*args)`` on the serving thread between wake-ups; returns its result."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.append((fut, fn, args))
        self._wake()
        return fut.result(timeout_s)

    def _run_calls(self) -> None:
        while self._calls:
            fut, fn, args = self._calls.popleft()
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

    # -- observability ------------------------------------------------------------------------

    def counters(self) -> dict[str, Any]:
        """As :meth:`ShardServer.counters`, plus ``engine``: ``batch``, wake-ups, datagrams per
        wake-up, system calls and GSO sends."""
        c = super().counters()
        for r, v in self._rdrops.items():
            c["drops"][r] = c["drops"].get(r, 0) + v
        re = c["reassembly"]
        re["pending"] += len(self._pend)
        re["expired"] += self._rstats["expired"]
        re["evicted"] += self._rstats["evicted"]
        re["duplicate_frames"] += self._rstats["duplicates"]
        io = dict(self._bs.stats) if self._bs is not None else {}
        c["engine"] = {"name": "batch", "wakeups": self._c["wakeups"], "batch": self.batch,
                       "gso": bool(self._bs.gso) if self._bs is not None else self.gso, **io}
        c["send_errors"] += io.get("send_errors", 0)
        return c

    # -- the wake-up --------------------------------------------------------------------------

    def serve_batch(self, n: int) -> None:
        """Handle the ``n`` datagrams of the last receive: one wake-up. Never raises."""
        self._c["wakeups"] += 1
        try:
            msgs = self._frames(n)
            self._messages(msgs)
        except Exception:  # noqa: BLE001 - a bug must not stop the shard
            self._c["internal_errors"] += 1
            log.exception("shard %d: internal error in a batch of %d frames", self.shard_id, n)
        if self._dur is not None and not self._commit_log():
            self._rep_idx.clear()  # not durable: no reply of this wake-up may leave
            self._rep_start.clear()
            self._rep_count.clear()
            self._rep_name.clear()
            self._ntx = 0
        self._transmit()

    def _frames(self, n: int) -> list[tuple]:
        """Validate, divert and reassemble the ``n`` frames; returns complete messages as
        ``(idx, info, name, body)`` in the order of the datagram that completed them."""
        bs = self._bs
        L = bs.lens[:n]
        cols, ok, p = self._check_vector(n) if n > self.small else self._check_scalar(n)
        mt, dt, tid, dim, nk = cols[:, 2], cols[:, 4], cols[:, 8], cols[:, 10], cols[:, 11]
        fi, fc, fl = cols[:, 14], cols[:, 15], cols[:, 16]
        single = fc == 1
        if self.fixed_length:
            ok &= self._announced_match(np.flatnonzero(ok), cols, n)

        # frames the fast path does not take: the reference handler, one by one
        slow = np.flatnonzero(~ok)
        for i in slow.tolist():
            self._cur_idx = i
            self.handle_datagram(bytes(bs.rx[i, :L[i]]), udpio.sockaddr_to_tuple(bs.names[i]))
        good = np.flatnonzero(ok)
        if good.size == 0:
            return []
        self._c["rx_frames"] += int(good.size)
        self._c["rx_bytes"] += int(L[good].sum())
        self._rstats["frames"] += int(good.size)
        out: list[tuple] = []
        info_cols = (mt, cols[:, 7], cols[:, 6], tid, nk, dim, dt)
        sg = good[single[good]]
        if sg.size:
            icols = [c[sg].tolist() for c in info_cols]
            for j, i in enumerate(sg.tolist()):
                out.append((i, tuple(c[j] for c in icols), bs.names[i].tobytes(),
                            bs.rx[i, consts.HDR_LEN:L[i]]))
            self._rstats["messages"] += int(sg.size)
        mg = good[~single[good]]
        if mg.size:
            out.extend(self._reassemble(mg, cols, info_cols, p, fi, fl))
            out.sort(key=lambda m: m[0])
        return out

    def _check_vector(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Header fields of the ``n`` frames (int64 (n, 18), in ``consts.HEADER_FIELDS`` order),
        whether the fast path takes each (bool (n,)) and its fragment size P (0 for single
        frames): all frames at once, the rules of ``codec.parse_header``,
        ``ShardServer._check_header`` and ``reassembly._geometry`` as vector expressions."""
        bs = self._bs
        L = bs.lens[:n]
        H = np.ascontiguousarray(bs.rx[:n, :consts.HDR_LEN]).view(codec.HEADER_DTYPE).reshape(n)
        cols = np.empty((n, len(_FIELDS)), np.int64)
        for j, f in enumerate(_FIELDS):  # 18 field copies (structured_to_unstructured costs 10x)
            cols[:, j] = H[f]
        mt, dt, tid, dim, nk, ml = cols[:, 2], cols[:, 4], cols[:, 8], cols[:, 10], cols[:, 11], cols[:, 12]
        fo, fi, fc, fl = cols[:, 13], cols[:, 14], cols[:, 15], cols[:, 16]
        esize = np.where(dt == 1, 4, np.where(dt == 2, 2, 0))
        expect = np.where(mt == MsgType.LOOKUP_REQ, consts.KEY_SIZE * nk, nk * (consts.KEY_SIZE + dim * esize))
        ok = ((L >= consts.HDR_LEN) & (cols[:, 0] == consts.MAGIC) & (cols[:, 1] == consts.VERSION)
              & ((mt == MsgType.LOOKUP_REQ) | (mt == MsgType.UPDATE_REQ))
              & (fl == L - consts.HDR_LEN) & (fc >= 1) & (fi < fc) & (fo + fl <= ml) & (ml == expect) & (nk > 0)
              & (fc <= consts.MAX_FRAGS) & (ml <= self.max_msg_bytes) & (ml <= self._reasm.max_msg_len)
              & (cols[:, 9] == self.shard_id) & (self._tdim[tid] == dim) & (self._tdt[tid] == dt)
              & ~((mt == MsgType.LOOKUP_REQ) & (nk > self._tmaxlk[tid])))
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
        SIZE_REQ with its header's type, dtype, table, ``num_keys`` and ``msg_len`` — so every
        buffer the fast path allocates has the announced size. The others go to the reference
        handler, which drops them as ``unannounced`` / ``size_mismatch``. One dict look-up per
        distinct message, not per frame."""
        out = np.zeros(n, bool)
        if cand.size == 0:
            return out
        c = cols[cand]
        k = (c[:, 7].astype(np.uint64) << np.uint64(32)) | c[:, 6].astype(np.uint64)
        uk, first, inv = np.unique(k, return_index=True, return_inverse=True)
        good = np.zeros(uk.size, bool)
        ann = self._announced
        want = c[first][:, [2, 4, 8, 11, 12]].tolist()  # msg_type, dtype, table_id, num_keys, msg_len
        for u, key in enumerate(uk.tolist()):
            good[u] = ann.get((key >> 32, key & 0xFFFFFFFF)) == tuple(want[u])
        out[cand] = good[inv]
        return out

    def _reassemble(self, mg: np.ndarray, cols: np.ndarray, info_cols, p, fi, fl) -> list[tuple]:
        """Feed the multi-fragment frames ``mg`` (indices, ascending) to their messages."""
        bs = self._bs
        now = time.monotonic()
        c = cols[mg]
        key = ((c[:, 7].astype(np.uint64) << np.uint64(48)) | (c[:, 6].astype(np.uint64) << np.uint64(16))
               | c[:, 2].astype(np.uint64))
        # dtype, status, table_id, shard_id, dim, num_keys, msg_len, frag_count (reassembly._SAME), P
        same = np.concatenate([c[:, [4, 5, 8, 9, 10, 11, 12, 15]], p[mg, None]], axis=1)
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
                    ent = _Pend(tuple(s0.tolist()), int(s0[7]), int(s0[6]), int(s0[8]), bs.names[i0].tobytes(),
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

    # -- messages -----------------------------------------------------------------------------

    def _messages(self, msgs: list[tuple]) -> None:
        """Queue complete messages per table and flush (see the module docstring for the rules)."""
        queues: dict[int, list] = {}
        kinds: dict[int, int] = {}
        upd_keys: dict[tuple[int, int], int] = {}
        for m in msgs:
            info = m[1]
            mtype, cid, mid, tid = info[0], info[1], info[2], info[3]
            self._requests[MsgType(mtype)] += 1
            q = queues.get(tid)
            if q and kinds[tid] != mtype:
                self._flush(tid, kinds[tid], q)
                q = None
            if mtype == MsgType.UPDATE_REQ:
                other = upd_keys.get((cid, mid))
                if other is not None and other != tid:
                    for t in list(queues):
                        if queues[t]:
                            self._flush(t, kinds[t], queues[t])
                        queues[t] = []
                    upd_keys.clear()
                    q = None
                upd_keys[(cid, mid)] = tid
            if not q:
                q = queues[tid] = []
                kinds[tid] = mtype
            q.append(m)
        for t, q in queues.items():
            if q:
                self._flush(t, kinds[t], q)

    def _flush(self, tid: int, kind: int, q: list) -> None:
        try:
            if len(q) == 1 and q[0][1][4] <= self.small_keys:
                self._flush_one(tid, kind, q[0])
            elif kind == MsgType.LOOKUP_REQ:
                self._flush_lookups(tid, q)
            else:
                self._flush_updates(tid, q)
        except Exception:  # noqa: BLE001 - answered INTERNAL, the shard keeps serving
            self._c["internal_errors"] += 1
            log.exception("shard %d: internal error serving %d messages of table %d", self.shard_id, len(q), tid)
            for m in q:
                self._emit(m, MsgType.ERROR, status=Status.INTERNAL)

    def _flush_one(self, tid: int, kind: int, m: tuple) -> None:
        """A lone small message of its table in this wake-up: the reference's own ``_lookup`` /
        ``_update`` (a few scalar-sized numpy calls cost less than the vector bookkeeping)."""
        idx, info, name, body = m
        mtype, cid, mid, _, nk, dim, dt = info
        h = codec.Header(consts.MAGIC, consts.VERSION, mtype, 0, dt, 0, mid, cid, tid, self.shard_id, dim, nk,
                         int(body.size), 0, 0, 1, int(body.size), 0)
        msg = Message(h, body, name, 1)
        self._cur_idx = idx
        try:
            if kind == MsgType.LOOKUP_REQ:
                ShardServer._lookup(self, self.tables[tid], msg)
            else:
                ShardServer._update(self, self.tables[tid], msg)
        except _Refused as r:
            self._reply_error(h, r.status, name)

    def _key_status(self, tid: int, keys: np.ndarray, offs: np.ndarray) -> np.ndarray:
        """Per message (segments ``offs`` of ``keys``): 0, KEY_OUT_OF_RANGE or NOT_OWNER, as
        :meth:`ShardServer._check_keys` in that order."""
        t = self.tables[tid].table
        st = np.zeros(offs.size - 1, np.int64)
        if t.rows is not None:
            st[np.maximum.reduceat(keys, offs[:-1]) >= np.uint64(t.rows)] = Status.KEY_OUT_OF_RANGE
        mine = np.logical_and.reduceat(owns(self.cfg, tid, self.shard_id, keys), offs[:-1])
        st[(st == 0) & ~mine] = Status.NOT_OWNER
        return st

    def _flush_lookups(self, tid: int, q: list) -> None:
        ts = self.tables[tid]
        nks = np.array([m[1][4] for m in q], np.int64)
        offs = np.r_[0, np.cumsum(nks)]
        keys = np.concatenate([m[3].view(codec.KEY_DTYPE) for m in q]) if len(q) > 1 else q[0][3].view(codec.KEY_DTYPE)
        st = self._key_status(tid, keys, offs)
        okm = st == 0
        if okm.all():
            rows = ts.lookup(keys)
        else:
            rows = ts.lookup(keys[np.repeat(okm, nks)])
        wire = codec.value_dtype(ts.table.wire_dtype)
        body = rows.astype(wire, copy=False).reshape(-1).view(np.uint8)
        rb = ts.dim * wire.itemsize
        at = 0
        for j, m in enumerate(q):
            if okm[j]:
                n = int(nks[j]) * rb
                self._emit(m, MsgType.LOOKUP_REPLY, body[at:at + n])
                at += n
                self._c["lookup_keys"] += int(nks[j])
            else:
                self._emit(m, MsgType.ERROR, status=int(st[j]))

    def _flush_updates(self, tid: int, q: list) -> None:
        ts = self.tables[tid]
        dim, wire = ts.dim, codec.value_dtype(ts.table.wire_dtype)
        nks = np.array([m[1][4] for m in q], np.int64)
        offs = np.r_[0, np.cumsum(nks)]
        keys = np.concatenate([m[3][:8 * k].view(codec.KEY_DTYPE) for m, k in zip(q, nks.tolist())])
        grads = np.concatenate([m[3][8 * k:].view(wire) for m, k in zip(q, nks.tolist())]).reshape(-1, dim)
        g = grads.astype(np.float32)
        st = self._key_status(tid, keys, offs)
        # duplicate keys in a message, or a gradient the optimizer must not see: MALFORMED
        inc = np.ones(keys.size, bool)
        inc[1:] = keys[1:] > keys[:-1]
        inc[offs[:-1]] = True
        sorted_ok = np.logical_and.reduceat(inc, offs[:-1])
        rowok = np.isfinite(g).all(axis=1)
        if ts.adagrad:
            with np.errstate(over="ignore", invalid="ignore"):
                rowok &= np.isfinite(rowwise_mean_square(g))
        gok = np.logical_and.reduceat(rowok, offs[:-1])
        for j in np.flatnonzero((st == 0) & ~sorted_ok).tolist():
            if not is_unique(keys[offs[j]:offs[j + 1]]):
                st[j] = Status.MALFORMED
        st[(st == 0) & ~gok] = Status.MALFORMED
        # exactly once, in arrival order, as ShardServer._update
        apply: list[int] = []
        acks: list[int] = []
        for j, m in enumerate(q):
            info = m[1]
            key = (info[1], info[2])
            fp = (info[3], info[4], info[5], info[6], zlib.crc32(m[3]))
            if self._applied.get(key) == fp:
                self._c["duplicates"] += 1
                self._applied.move_to_end(key)
                acks.append(j)
            elif st[j]:
                acks.append(~j)
            else:
                apply.append(j)
                acks.append(j)
                if self._dur is not None:
                    self._dur.append(key[0], key[1], fp, m[3])
                self._c["updates_applied"] += 1
                self._c["update_keys"] += int(nks[j])
                self._applied[key] = fp
                self._applied.move_to_end(key)
                while len(self._applied) > self.dedup_window:
                    self._applied.popitem(last=False)
        if apply:
            self._apply_updates(ts, keys, g, offs, apply)
        for j in acks:
            if j >= 0:
                self._emit(q[j], MsgType.UPDATE_ACK)
            else:
                self._emit(q[~j], MsgType.ERROR, status=int(st[~j]))

    def _apply_updates(self, ts, keys: np.ndarray, g: np.ndarray, offs: np.ndarray, which: list[int]) -> None:
        """Apply the updates ``which`` (message indices into segments ``offs``, arrival order)
        to table ``ts``: the one place a wake-up changes rows (a write-ahead log goes here)."""
        if len(which) == int(offs.size - 1):
            k, gg = keys, g
        else:
            sel = np.zeros(offs.size - 1, bool)
            sel[which] = True
            rows = np.repeat(sel, np.diff(offs))
            k, gg = keys[rows], g[rows]
        if len(which) == 1 or is_unique(k):
            ts.apply(k, gg)
            return
        for j in which:  # overlapping keys: one message after the other, as they came
            ts.apply(keys[offs[j]:offs[j + 1]], g[offs[j]:offs[j + 1]])

    # -- replies ------------------------------------------------------------------------------

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

    def _emit(self, m: tuple, msg_type: int, body: np.ndarray | None = None, status: int = 0) -> None:
        """Encode the reply to message ``m`` into the transmit buffer (codec.encode_reply's bytes)."""
        idx, info, name = m[0], m[1], m[2]
        _, cid, mid, tid, nk, dim, dt = info
        ml = 0 if body is None else int(body.size)
        if msg_type == MsgType.ERROR:
            self._errors[Status(status)] += 1
        P, W, H = self._P, self._W, consts.HDR_LEN
        count = max(1, -(-ml // P))
        a = self._reserve(count)
        tx = self._tx
        last_len = ml - (count - 1) * P
        _HDR.pack_into(tx[a], 0, consts.MAGIC, consts.VERSION, msg_type, 0, dt, status, mid, cid, tid,
                       self.shard_id, dim, nk, ml, 0, 0, count, P if count > 1 else ml, 0)
        if count > 1:
            tx[a + 1:a + count, :H] = tx[a, :H]
            idx_arr = np.arange(count)
            tx[a:a + count, 28:32] = (idx_arr * P).astype(_U4).view(np.uint8).reshape(count, 4)
            tx[a:a + count, 32:34] = idx_arr.astype(_U2).view(np.uint8).reshape(count, 2)
            tx[a + count - 1, 36:38] = np.frombuffer(last_len.to_bytes(2, "big"), np.uint8)
            tx[a:a + count - 1, H:] = body[:(count - 1) * P].reshape(count - 1, P)
        if ml:
            tx[a + count - 1, H:H + last_len] = body[(count - 1) * P:]
        self._txlen[a:a + count] = W
        self._txlen[a + count - 1] = H + last_len
        self._rep_idx.append(idx)
        self._rep_start.append(a)
        self._rep_count.append(count)
        self._rep_name.append(name)

    def _send(self, frames: list[bytes], addr) -> None:
        """The reference handler's replies into the transmit buffer, in order (``addr``: an
        ``(ip, port)`` tuple or a 16-byte ``sockaddr_in``)."""
        if not frames:
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


# ---- running it: one process, or worker processes behind one address ---------------------------

def steering_program(workers: int) -> bytes:
    """The classic BPF program that picks a worker socket of a ``SO_REUSEPORT`` group:
    ``table_id mod workers``.

    For UDP the kernel runs it with the packet at the UDP payload (the embnic header), so
    ``ldh [14]`` is ``table_id``; a datagram too short to hold it goes to worker 0 (whose
    reference handler counts it ``too_short``). Every fragment of a message carries its table,
    so a message, its retransmissions and their duplicates always reach the same worker.

    Returns:
        the ``struct sock_fprog`` filter array (3 instructions of 8 bytes).
    """
    ins = (
        (0x28, 0, 0, 14),        # BPF_LD | BPF_H | BPF_ABS: A = u16 at payload offset 14 (table_id)
        (0x94, 0, 0, workers),   # BPF_ALU | BPF_MOD | BPF_K: A %= workers
        (0x16, 0, 0, 0),         # BPF_RET | BPF_A
    )
    return b"".join(struct.pack("HBBI", *i) for i in ins)


def _reuseport_sockets(ip: str, port: int, workers: int) -> list[socket.socket]:
    """``workers`` UDP sockets bound to (ip, port) in one ``SO_REUSEPORT`` group, steered by
    :func:`steering_program` (socket ``i`` serves ``table_id % workers == i``)."""
    import ctypes

    socks: list[socket.socket] = []
    try:
        for i in range(workers):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            set_socket_buffers(s, _SOCK_BUF)
            s.bind((ip, port))
            port = s.getsockname()[1]  # port 0: the others join the one the first got
            if i == 0:
                prog = ctypes.create_string_buffer(steering_program(workers))
                fprog = struct.pack("HL", 3, ctypes.addressof(prog))
                s.setsockopt(socket.SOL_SOCKET, 51, fprog)  # SO_ATTACH_REUSEPORT_CBPF
    except OSError:
        for s in socks:
            s.close()
        raise
    return socks


def _merge_counters(parts: list[dict]) -> dict:
    """Sum the counters of several workers (numbers add up; ``shard`` is kept; ``engine`` becomes
    the per-worker list ``workers``)."""
    def add(a, b):
        if isinstance(a, dict):
            return {k: add(a.get(k, 0), b.get(k, 0)) if k in b else a[k] for k in a} | \
                   {k: v for k, v in b.items() if k not in a}
        if isinstance(a, bool) or not isinstance(a, (int, float)):
            return a
        return a + b

    out = {k: v for k, v in parts[0].items() if k != "engine"}
    for p in parts[1:]:
        out = add(out, {k: v for k, v in p.items() if k not in ("engine", "shard")})
    out["shard"] = parts[0]["shard"]
    out["workers"] = [p.get("engine", {}) for p in parts]
    return out


def _worker_main(cfg, shard_id, sock, conn, kwargs) -> None:
    import ctypes
    import signal

    try:  # PR_SET_PDEATHSIG: a worker never outlives its parent (killed with SIGKILL, say)
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        return

    server = BatchShardServer(cfg, shard_id, sock=sock, **kwargs)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.request_stop())
    signal.signal(signal.SIGUSR1, lambda *_: server.request_checkpoint())
    server.open()
    try:
        server.run()
    finally:
        conn.send(server.counters())
        conn.close()


def run_workers(cfg: ClusterConfig, shard_id: int, bind: str | None = None, port: int | None = None, *,
                workers: int = 1, **kwargs) -> int:
    """Serve one shard with the batch engine until SIGTERM/SIGINT, in this process
    (``workers == 1``) or in ``workers`` forked worker processes behind one address.

    **Workers.** The address is bound ``workers`` times with ``SO_REUSEPORT``; a classic BPF
    program (:func:`steering_program`) sends every datagram to worker ``table_id % workers``.
    Each worker owns the rows of its tables outright (no sharing, no locks) and keeps its own
    exactly-once window of ``dedup_window`` entries over the updates it serves: the dedup
    window is split **by table**, like the rows. A message and all its retransmissions carry
    the same table id, so they reach the same worker and exactly-once holds across workers;
    each worker remembers an update at least as long as the one-process server would (it sees
    a subset of the updates), at a memory cost of ``workers × dedup_window`` entries at most.
    Tables, not ids within a table, are what spreads over the workers: a shard serving one
    table uses one worker.

    Logs ``listening on IP:PORT`` once bound and, at exit, the counters summed over the
    workers as one JSON line (``workers``: each worker's engine counters).

    Returns:
        0 after a clean stop; 1 if a worker died (the others are stopped).

    Raises:
        KeyError: unknown shard. OSError: the address cannot be bound. ValueError:
        ``fixed_length`` with ``workers > 1`` (a SIZE_REQ reaches one worker, the data it
        announces all of them).
    """
    import json
    import multiprocessing
    import signal

    if workers > 1 and kwargs.get("fixed_length"):
        raise ValueError("--fixed-length needs one worker: a SIZE_REQ announces data for every table, "
                         "but the workers split the tables")

    me = cfg.shard(shard_id)
    ip = bind if bind is not None else me.ip
    p = me.port if port is None else int(port)
    if workers <= 1:
        server = BatchShardServer(cfg, shard_id, ip, p, **kwargs)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: server.request_stop())
        signal.signal(signal.SIGUSR1, lambda *_: server.request_checkpoint())
        ip2, p2 = server.open()
        log.info("shard %d listening on %s:%d (%s; engine batch)", shard_id, ip2, p2, _describe(cfg))
        try:
            server.run()
        finally:
            server.close()
        log.info("shard %d stopped; counters %s", shard_id, json.dumps(server.counters(), sort_keys=True))
        return 1 if server.durable_failed else 0
    if kwargs.get("checkpoint_dir") is not None or kwargs.get("restore") is not None:
        raise ValueError("--checkpoint-dir/--restore need --workers 1 (each worker would need its own log)")
    socks = _reuseport_sockets(ip, p, workers)
    ip2, p2 = socks[0].getsockname()[:2]
    ctx = multiprocessing.get_context("fork")
    procs, conns = [], []
    stop = {"flag": False}
    r, w = os.pipe()
    os.set_blocking(w, False)

    def on_signal(*_):
        stop["flag"] = True
        try:
            os.write(w, b"x")
        except OSError:
            pass

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for i, s in enumerate(socks):
            a, b = ctx.Pipe(duplex=False)
            pr = ctx.Process(target=_worker_main, args=(cfg, shard_id, s, b, kwargs),
                             name=f"embnic-shard-{shard_id}-w{i}", daemon=True)
            pr.start()
            b.close()
            procs.append(pr)
            conns.append(a)
        log.info("shard %d listening on %s:%d (%s; engine batch, %d workers: worker i serves tables with "
                 "table_id %% %d == i; pids %s)", shard_id, ip2, p2, _describe(cfg), workers, workers,
                 ",".join(str(x.pid) for x in procs))
        from multiprocessing.connection import wait

        died = None
        while not stop["flag"]:
            ready = wait([x.sentinel for x in procs] + [r])
            for x in procs:
                if x.sentinel in ready and not stop["flag"]:
                    died = x
                    stop["flag"] = True
        for x in procs:
            if x.is_alive():
                os.kill(x.pid, signal.SIGTERM)
        parts = []
        for x, c in zip(procs, conns):
            x.join(30)
            try:
                if c.poll(5):
                    parts.append(c.recv())
            except (EOFError, OSError):
                pass
        if parts:
            log.info("shard %d stopped; counters %s", shard_id, json.dumps(_merge_counters(parts), sort_keys=True))
        if died is not None:
            log.error("shard %d: worker %s (pid %d) died with exit code %s; stopped the others",
                      shard_id, died.name, died.pid, died.exitcode)
            return 1
        return 0
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        for x in procs:
            if x.is_alive():
                x.kill()
        for s in socks:
            s.close()
        os.close(r)
        os.close(w)


def _describe(cfg: ClusterConfig) -> str:
    from .shard import describe

    return describe(cfg)
