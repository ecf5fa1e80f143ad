"""The shard's batch engine: many datagrams and messages per wake-up, numpy across all of them.

:class:`BatchShardServer` answers exactly as the reference :class:`~embnic.testbed.server.shard.ShardServer`
(same replies, statuses, counters, exactly-once rules and numerics — the tests run both on the
same frames and compare), but where the reference handles one datagram per asyncio callback in
Python, the engine works per **wake-up**::

    poll ─▶ recvmmsg (≤ 256 datagrams into a preallocated (256, 65536) uint8 buffer)
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

Modules: this one holds the loop, the per-table queues and the application of a wake-up's
messages (:meth:`_messages`, :meth:`_flush_lookups`, :meth:`_flush_updates`); the header checks
and reassembly are :mod:`.intake`, reply encoding and ``sendmmsg`` :mod:`.replies`, the batched
system calls :mod:`.udpio`, worker processes behind one address :mod:`.workers`.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import select
import socket
import time
import zlib
from typing import Any, Callable

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.sockets import set_socket_buffers
from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.consts import MsgType, Status
from embnic.client_lib.reassembly import Message
from embnic.client_lib.routing import owns
from embnic.client_lib.table_numerics import gradient_rows_ok, is_unique

from . import cintake, udpio
from .intake import BatchIntake, _Pend
from .peers import PeerGone, PeerHub, PeerLink, SplitTable, segment_bounds as _offsets, serve_sub_request
from .replies import BatchReplies
from .shard import ShardServer, _Refused

log = logging.getLogger("embnic.server")


class BatchShardServer(BatchIntake, BatchReplies, ShardServer):
    """One shard served by the batch engine (see the module docstring).

    Args:
        cfg, shard_id, bind, port, **kwargs: as :class:`ShardServer` (``dedup_window``,
            ``max_msg_bytes``, ``reassembly_timeout_s``).
        batch: datagrams per ``recvmmsg`` (per wake-up pass).
        small: wake-ups of at most this many frames check their headers frame by frame
            (:meth:`_check_scalar`), larger ones as vectors (:meth:`_check_vector`).
        small_keys: an update of at most this many keys that is alone of its table and kind in
            a wake-up is served by the reference's own function (:meth:`_flush_one`: fewer numpy
            calls than the vector path's checks); others (and every larger one) by the vector path.
        small_lookup_keys: the same for lookups (default 0: the vector path costs less for
            every lookup since replies are encoded in place).
        gso: send multi-frame replies with UDP GSO (falls back by itself where refused).
        c_intake: check headers and group fragments with the C intake (:mod:`.cintake`) when
            its library is built; False: always the numpy code (the reference for it).
        sock: an already bound UDP socket to serve (the ``--workers`` parent binds them);
            ``bind``/``port`` are then ignored.
        worker: ``(index, N)``: this process is worker ``index`` of N (:mod:`.peers`): it holds
            the rows :func:`~.peers.worker_of` gives it and asks the others for theirs.
        peer_socks: with N > 1, ``{other worker's index: this end of our stream socket pair}``.

    Raises:
        KeyError: ``shard_id`` is not in the config. ValueError: N > 1 with a write-ahead log
        or without a socket to every other worker.
    """

    _sync_each = False  # one log commit per wake-up, in serve_batch

    def __init__(self, cfg: ClusterConfig, shard_id: int, bind: str | None = None, port: int | None = None, *,
                 batch: int = 256, small: int = 4, small_keys: int = 256, small_lookup_keys: int = 0, gso: bool = True,
                 sock: socket.socket | None = None,
                 worker: tuple[int, int] = (0, 1), peer_socks: dict[int, socket.socket] | None = None,
                 c_intake: bool = True, **kwargs):
        me, n = int(worker[0]), int(worker[1])
        if n > 1 and (kwargs.get("checkpoint_dir") is not None or kwargs.get("restore") is not None):
            raise ValueError("a write-ahead log needs one worker (--workers 1)")
        if n > 1 and sorted(peer_socks or {}) != [v for v in range(n) if v != me]:
            raise ValueError(f"worker {me} of {n} needs a socket to every other worker, got {sorted(peer_socks or {})}")
        super().__init__(cfg, shard_id, bind, port, **kwargs)
        self._hub: PeerHub | None = None
        if n > 1:
            local = dict(self.tables)
            self._hub = PeerHub(me, n, {v: PeerLink(s) for v, s in peer_socks.items()},
                                lambda op, tid, cnt, p: serve_sub_request(local, op, tid, cnt, p))
            self.tables = {tid: SplitTable(ts, self._hub) for tid, ts in local.items()}
        self.batch = int(batch)
        self.small = int(small)
        self.small_keys = int(small_keys)
        self.small_lookup_keys = int(small_lookup_keys)
        self.gso = bool(gso)
        self.c_intake = bool(c_intake)
        self._cin: cintake.CIntake | None = None
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
        self._twire = {t.id: codec.value_dtype(t.wire_dtype) for t in cfg.tables}
        for t in cfg.tables:
            self._tdim[t.id] = t.dim
            self._tdt[t.id] = int(t.wire_dtype)
            self._tmaxlk[t.id] = consts.max_keys_per_message(MsgType.LOOKUP_REQ, t.dim, t.wire_dtype, self.mtu)
        # per table: every key is ours (one shard, or this table's shard under table sharding),
        # so the owner check of a message need not hash its keys
        self._owns_all = {t.id: bool(owns(cfg, t.id, shard_id, np.zeros(1, np.uint64))[0])
                          and (len(cfg.shards) == 1 or cfg.sharding == "table") for t in cfg.tables}
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
        self._io_final: tuple[dict, bool] = ({}, self.gso)  # the socket's counters once closed

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
                set_socket_buffers(sock)
                sock.bind((self.bind, self.port))
            except OSError:
                sock.close()
                raise
        self._bs = udpio.BatchSocket(sock, batch=self.batch, gso=self.gso)
        lib = cintake.load() if self.c_intake else None
        if lib is not None:
            self._cin = cintake.CIntake(lib, self._bs.rx, self._bs.lens, self._tdim, self._tdt, self._tmaxlk,
                                        self.shard_id, min(self.max_msg_bytes, self._reasm.max_msg_len))
        self.started_at = time.monotonic()
        return self.address

    def run(self) -> None:
        """Serve until :meth:`request_stop` (from any thread or a signal handler)."""
        bs = self._bs
        poller = select.poll()
        poller.register(bs.fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        peer_fds = set(self._hub.fds()) if self._hub is not None else set()
        for fd in peer_fds:
            poller.register(fd, select.POLLIN)
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
            if peer_fds:
                for fd, ev in self._hub.poll_masks().items():
                    poller.modify(fd, ev)
            for fd, _ in poller.poll(wait_ms):
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                elif fd in peer_fds:
                    try:
                        self._hub.pump()
                    except PeerGone as e:  # another worker went away: the shard is stopping
                        log.info("shard %d worker %d: %s; stopping", self.shard_id, self._hub.me, e)
                        self._stopping = True
                        break
            if self._stopping:
                break
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
            self._io_final = (dict(self._bs.stats), bool(self._bs.gso))  # counters() after close still has them
            self._bs.sock.close()
            self._bs = None
        if self._hub is not None:
            self._hub.close()
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
        wake-up, system calls and GSO sends, multi-fragment messages gathered whole from one
        wake-up (``messages_whole``; the others were reassembled across wake-ups); for a worker of several (:mod:`.peers`) also its
        index, the rows it holds per table (``rows_held``) and its sub-request counts
        (``peer_calls`` made, ``peer_requests`` served, rows asked/served, ``peer_wait_us``)."""
        c = super().counters()
        for r, v in self._rdrops.items():
            c["drops"][r] = c["drops"].get(r, 0) + v
        re = c["reassembly"]
        re["pending"] += len(self._pend)
        re["expired"] += self._rstats["expired"]
        re["evicted"] += self._rstats["evicted"]
        re["duplicate_frames"] += self._rstats["duplicates"]
        if self._bs is not None:
            io, gso = dict(self._bs.stats), bool(self._bs.gso)
        else:
            io, gso = self._io_final
        c["engine"] = {"name": "batch", "wakeups": self._c["wakeups"], "batch": self.batch,
                       "intake": "c" if self._cin is not None else "numpy",
                       "messages_whole": self._rstats["whole"], "gso": gso, **io}
        if self._hub is not None:
            c["engine"].update(worker=self._hub.me, rows_held={str(t): len(ts) for t, ts in self.tables.items()},
                               **self._hub.stats)
        c["send_errors"] += io.get("send_errors", 0)
        return c

    # -- the wake-up --------------------------------------------------------------------------

    def serve_batch(self, n: int) -> None:
        """Handle the ``n`` datagrams of the last receive: one wake-up. Never raises."""
        t0 = time.monotonic_ns()
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
        nrep = len(self._rep_idx)
        self._transmit()
        if nrep:  # every reply of the wake-up left in its one sendmmsg: their service time
            self._svc.add(time.monotonic_ns() - t0, nrep)

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
            if len(q) == 1 and q[0][1][4] <= (self.small_lookup_keys if kind == MsgType.LOOKUP_REQ else self.small_keys):
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
        if self._owns_all[tid]:
            return st
        mine = np.logical_and.reduceat(owns(self.cfg, tid, self.shard_id, keys), offs[:-1])
        st[(st == 0) & ~mine] = Status.NOT_OWNER
        return st

    def _flush_lookups(self, tid: int, q: list) -> None:
        ts = self.tables[tid]
        nkl = [m[1][4] for m in q]
        nks = np.array(nkl, np.int64)
        offs = _offsets(nks)
        keys = np.concatenate([m[3].view(codec.KEY_DTYPE) for m in q]) if len(q) > 1 else q[0][3].view(codec.KEY_DTYPE)
        if ts.table.rows is None and self._owns_all[tid]:
            st, okl = None, [True] * len(q)  # nothing to refuse: no range, every key ours
        else:
            st = self._key_status(tid, keys, offs)
            okl = (st == 0).tolist()
        if all(okl):
            rows = ts.lookup(keys)
        else:
            rows = ts.lookup(keys[np.repeat(np.array(okl, bool), nks)])
        wire = self._twire[tid]
        body = rows.astype(wire, copy=False).reshape(-1).view(np.uint8)
        rb = ts.dim * wire.itemsize
        at = 0
        for j, m in enumerate(q):
            if okl[j]:
                n = nkl[j] * rb
                self._emit(m, MsgType.LOOKUP_REPLY, body[at:at + n])
                at += n
                self._c["lookup_keys"] += nkl[j]
            else:
                self._emit(m, MsgType.ERROR, status=int(st[j]))

    def _flush_updates(self, tid: int, q: list) -> None:
        ts = self.tables[tid]
        dim, wire = ts.dim, codec.value_dtype(ts.table.wire_dtype)
        nks = np.array([m[1][4] for m in q], np.int64)
        offs = _offsets(nks)
        keys = np.concatenate([m[3][:8 * k].view(codec.KEY_DTYPE) for m, k in zip(q, nks.tolist())])
        grads = np.concatenate([m[3][8 * k:].view(wire) for m, k in zip(q, nks.tolist())]).reshape(-1, dim)
        g = grads.astype(np.float32)
        st = self._key_status(tid, keys, offs)
        # duplicate keys in a message, or a gradient the optimizer must not see: MALFORMED
        inc = np.ones(keys.size, bool)
        inc[1:] = keys[1:] > keys[:-1]
        inc[offs[:-1]] = True
        sorted_ok = np.logical_and.reduceat(inc, offs[:-1])
        gok = np.logical_and.reduceat(gradient_rows_ok(ts.table, g), offs[:-1])
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
        """Apply the updates ``which`` (message indices into segments ``offs``, ascending =
        arrival order) to table ``ts``: the one place a wake-up changes rows. Overlapping keys:
        one message after the other (``TableShard.apply_segments``); with workers, each owner
        applies its share of every message (:meth:`~.peers.SplitTable.apply_segments`)."""
        if len(which) == int(offs.size - 1):
            k, gg, o = keys, g, offs
        else:
            sel = np.zeros(offs.size - 1, bool)
            sel[which] = True
            n = np.diff(offs)
            rows = np.repeat(sel, n)
            k, gg, o = keys[rows], g[rows], _offsets(n[which])
        ts.apply_segments(k, gg, o)
