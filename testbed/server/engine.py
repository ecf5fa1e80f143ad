"""The shard's serving loop: many datagrams and messages per wake-up, in C where the rules allow.

:class:`BatchShardServer` holds the shard's state and rules (:class:`~.shard_state.ShardState`),
the reassembly across wake-ups (``intake``, :class:`~.intake.Intake`), the C answer path
(``answer``, :class:`~.canswer.CAnswer`). One wake-up: ``recvmmsg``; one C call that checks every header and answers
the lookups it can straight from the receive buffer; the frames it leaves through the state's
one-frame path (:meth:`.ShardState.take_frame`) or reassembled; whole messages checked with the
state's rules, all lookups' rows in one gather, all updates in one optimizer step
(:meth:`_flush_lookups`, :meth:`_flush_updates`); the write-ahead log's records written and
their ``fdatasync`` handed to the log's sync thread (group commit); every reply framed in C and
sent with ``sendmmsg`` (+ GSO), in the order of the datagrams that completed their requests —
but an ``UPDATE_ACK`` (an update's, a duplicate's, a poll's) is held (:attr:`BatchShardServer.held`)
until the ``fdatasync`` covering every record logged before it has returned, then sent by the
loop in the order given (woken through its wake-up pipe by the sync thread).

Ordering rules that keep the numerics identical to
:class:`~embnic.client_lib.local.LocalBackend`: a message that shares a table with what the other
queue (lookups, updates) holds flushes that queue first; updates are admitted one after the other
in arrival order, then applied in one call; a wake-up holding update polls is cut at each poll.
docs/server.md, "The answer path in C" and "Where the time goes".
"""
from __future__ import annotations

import collections
import contextlib
import concurrent.futures
import itertools
import logging
import os
import select
import socket
import time
from typing import Any, Callable, NamedTuple

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.codec import DirectoryError, FrameError
from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.consts import MsgType, Status
from embnic.client_lib.reassembly import fragment_size
from embnic.client_lib.sockets import set_socket_buffers

from . import canswer, udpio
from .durability import Durability
from .intake import CID, FC, FI, FLAGS, FL, FO, MID, ML, MT, NK, NT, Intake
from .shard_state import REASSEMBLY_BYTES, REASSEMBLY_PENDING, Refused, Request, ShardState

log = logging.getLogger("embnic.server")

#: the counters of the answer path added to the shard's own (:meth:`BatchShardServer.counters`)
_IO_KEYS = ("send_calls", "gso_sends", "send_errors", "gso_fallbacks")


class BatchShardServer:
    """One shard served per wake-up (see the module docstring).

    Args:
        cfg, shard_id: the cluster config and this shard's id.
        bind, port: the address (default the shard's in the config; port 0 picks a free one).
        batch: datagrams per ``recvmmsg`` (per wake-up pass).
        gso: send multi-frame replies with UDP GSO (falls back by itself where refused).
        answer_path: what builds the answer path once the socket is open,
            ``answer_path(batch_socket, state, serve=...)``; default the C one,
            :class:`~.canswer.CAnswer` (tests plug in the numpy oracle they compare it with).
        **state_kw: :class:`~.shard_state.ShardState`'s options (``dedup_window``, ``checkpoint_dir``, ...).

    Raises:
        KeyError: ``shard_id`` is not in the config. NativeLibraryError: the shard's C library
        is missing or was built from other sources (one line naming the rebuild command).
    """

    def __init__(self, cfg: ClusterConfig, shard_id: int, bind: str | None = None, port: int | None = None, *,
                 batch: int = 256, gso: bool = True, answer_path: Callable | None = None, **state_kw):
        if answer_path is None:
            canswer.load()  # at start: a missing or mismatched library is one line, before anything binds
            answer_path = canswer.CAnswer
        self.state = st = ShardState(cfg, shard_id, **state_kw)
        self.cfg = cfg
        self.shard_id = st.shard_id
        at = cfg.shard(shard_id)
        self.bind = bind if bind is not None else at.ip
        self.port = int(port) if port is not None else at.port
        self.batch = int(batch)
        self.gso = bool(gso)
        self._answer_path = answer_path
        #: the answer path (header checks, lookups, reply frames, sending), once :meth:`open` bound the socket
        self.answer = None
        #: the batched socket (after :meth:`open`; None once closed)
        self.bs: udpio.BatchSocket | None = None
        #: reassembly of the messages whose fragments span wake-ups
        self.intake = Intake(max_pending=REASSEMBLY_PENDING, max_pending_bytes=REASSEMBLY_BYTES,
                             timeout_s=st.reassembly_timeout_s)
        self._one = _OneFrame(self.intake)  # the intake as the one-frame path's assembly
        self._cur: tuple[int, bytes] = (0, b"")  # the datagram the one-frame path is answering (idx, name)
        self._t0 = 0  # the running wake-up's start (monotonic ns)
        self.started_at: float | None = None
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._calls: collections.deque = collections.deque()
        self._ckpt_req = False
        #: the acks waiting for the log (group commit), oldest first: ``(log sequence they wait
        #: for, the wake-up's start in ns, name, ids)``; the sequences never decrease
        self.held: collections.deque[tuple[int, int, bytes, _Ack]] = collections.deque()
        if st.durability is not None:
            st.durability.on_durable = self._wake  # the sync thread wakes the loop for the acks
        self._io_final: tuple[dict, bool] = ({}, self.gso)  # the socket's counters once closed

    @property
    def durable_failed(self) -> bool:
        """Whether the disk refused the log (no ack left since; the shard stopped)."""
        return self.state.durable_failed

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """(ip, port) actually bound (after :meth:`open`)."""
        if self.bs is None:
            return self.bind, self.port
        return self.bs.sock.getsockname()[:2]

    def open(self) -> tuple[str, int]:
        """Bind the socket and set up the answer path on it. Returns (ip, port).

        Raises:
            OSError: the address cannot be bound.
        """
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            set_socket_buffers(sock)
            sock.bind((self.bind, self.port))
        except OSError:
            sock.close()
            raise
        self.bs = udpio.BatchSocket(sock, batch=self.batch, gso=self.gso)
        # lookups answered in the answer path unless data must have been announced (fixed length):
        # then it checks, frames and sends only
        self.answer = self._answer_path(self.bs, self.state, serve=not self.state.fixed_length)
        self.intake.bind(self.bs, self.answer.whole)
        self.started_at = time.monotonic()
        return self.address

    def run(self) -> None:
        """Serve until :meth:`request_stop` (from any thread or a signal handler)."""
        bs = self.bs
        poller = select.poll()
        poller.register(bs.fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        next_tick = time.monotonic() + 0.5
        while not self._stopping:
            if self._calls:
                self._run_calls()
            if self._ckpt_req:
                self._ckpt_req = False
                self.state.checkpoint_or_log()
            for fd, _ in poller.poll(max(0, int((next_tick - time.monotonic()) * 1000))):
                if fd == self._wake_r:  # the wake-up pipe: emptied
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
            if self._stopping:
                break
            for _ in range(64):  # drain, then look at calls and the clock again
                n = bs.recv()
                if n == 0:
                    break
                self.serve_batch(n)
            if self.state.durability is not None:  # the acks the log's sync thread made durable
                self._send_held(self.state.log_step(Durability.poll))
            now = time.monotonic()
            if now >= next_tick:
                self.intake.expire(now)
                next_tick = now + 0.5
        self._run_calls()
        self.flush_acks()

    def flush_acks(self) -> None:
        """Wait for the log to make every logged update durable and send the acks held for it
        (on the serving thread: the end of :meth:`run`, or through :meth:`call`)."""
        if self.held and self.bs is not None:
            self._send_held(self.state.durability.durable if self.state.commit_log() else None)

    def request_checkpoint(self) -> None:
        """Checkpoint between the next wake-ups (thread- and signal-safe; SIGUSR1)."""
        self._ckpt_req = True
        self._wake()

    def request_stop(self) -> None:
        """Make :meth:`run` return (thread- and signal-safe)."""
        self._stopping = True
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: a wake-up is pending already
            os.write(self._wake_w, b"x")

    def close(self) -> None:
        """Close the socket, the wake-up pipe, the log and the disk stores. Idempotent."""
        self.state.close()
        if self.bs is not None:
            self._io_final = (dict(self.bs.stats), bool(self.bs.gso))  # counters() after close still has them
            self.bs.sock.close()
            self.bs = None
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_r = self._wake_w = -1

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

    def state_dict(self) -> dict:
        """:meth:`.ShardState.state_dict` (read it on the serving thread: :meth:`call`)."""
        return self.state.state_dict()

    def counters(self) -> dict[str, Any]:
        """:meth:`.ShardState.counters` with what the loop's parts counted (the intake's
        reassembly and drops, the answer path's frames, lookups and sends), plus ``engine``:
        wake-ups, datagrams per wake-up, the answer path (``intake``, ``answer``: ``c``, or
        ``c-frames`` when it only checks, frames and sends), system calls and GSO sends,
        multi-fragment messages gathered whole from one wake-up (``messages_whole``), lookups
        answered by the answer path (``answered_in_c``; straight from the receive buffer:
        ``answered_from_rx``)."""
        c = self.state.counters()
        rs = self.intake.stats
        for r, v in self.intake.drops.items():
            c["drops"][r] = c["drops"].get(r, 0) + v
        c["reassembly"] = {"pending": len(self.intake), "expired": rs["expired"], "evicted": rs["evicted"],
                           "duplicate_frames": rs["duplicates"]}  # the state's are zeros: the loop reassembles
        io, gso = (dict(self.bs.stats), bool(self.bs.gso)) if self.bs is not None else self._io_final
        e = {"name": "batch", "wakeups": self.state.counts["wakeups"], "batch": self.batch}
        whole = rs["whole"]
        if self.answer is not None:
            st = self.answer.stats()
            for k in ("rx_frames", "rx_bytes", "tx_frames", "tx_bytes", "lookup_keys"):
                c[k] += st[k]
            c["requests"][MsgType.LOOKUP_REQ.name] += st["messages"]  # the loop counted the others'
            c["replies"][MsgType.LOOKUP_REPLY.name] += st["messages"] + st["answered"]
            whole += st["whole"]
            for k in _IO_KEYS:
                io[k] = io.get(k, 0) + st[k]
            gso = self.answer.gso
            e.update(intake=self.answer.intake_name, answer=self.answer.name,
                     answered_in_c=st["messages"] + st["answered"], answered_from_rx=st["messages"])
        c["engine"] = {**e, "messages_whole": whole, "gso": gso, **io}
        c["send_errors"] += io.get("send_errors", 0)
        return c

    # -- the wake-up --------------------------------------------------------------------------

    def serve_batch(self, n: int) -> None:
        """Handle the ``n`` datagrams of the last receive: one wake-up. Never raises."""
        self._t0 = t0 = time.monotonic_ns()
        st, ans = self.state, self.answer
        st.counts["wakeups"] += 1
        try:
            if ans.serve(n, not len(self.intake)) < n:  # checks, and the lookups it answers; then the rest
                self._take(n)
        except Exception:  # noqa: BLE001 - a bug must not stop the shard
            st.counts["internal_errors"] += 1
            log.exception("shard %d: internal error in a batch of %d frames", self.shard_id, n)
        nrep = ans.replies()
        if st.durability is not None and not self._release(st.log_step(Durability.handoff)):
            nrep = 0
        self._send()
        if nrep:  # every reply of the wake-up not held left in its one sendmmsg: their service time
            st.service.add(time.monotonic_ns() - t0, nrep)

    def _send(self) -> None:
        """Send the queued replies (a failure counted and logged: the shard keeps serving)."""
        try:
            self.answer.send()
        except Exception:  # noqa: BLE001 - a bug must not stop the shard
            self.state.counts["send_errors"] += 1
            self.answer.clear()
            log.exception("shard %d: send failed", self.shard_id)

    def _release(self, durable: int | None) -> bool:
        """Queue the held acks the log's ``durable`` sequence covers, before the wake-up's other
        replies (each timed from its own wake-up). None (the disk refused): drop every reply
        queued or held — none may leave —, stop, and return False."""
        if durable is None:
            self.answer.clear()
            self.held.clear()
            self.request_stop()
            return False
        held = self.held
        if not held or held[0][0] > durable:
            return True
        now = time.monotonic_ns()
        while held and held[0][0] <= durable:
            _, t0, name, ids = held.popleft()
            self.answer.add_spec(-1, name, MsgType.UPDATE_ACK, 0, consts.NO_TABLE, ids, None)
            self.state.service.add(now - t0, 1)
        return True

    def _send_held(self, durable: int | None) -> None:
        """Between wake-ups: send the held acks ``durable`` covers (:meth:`_release`)."""
        self._release(durable)
        if self.answer.replies():
            self._send()

    def _reply(self, idx: int, name: bytes, msg_type: int, status: int, table_id: int, h,
               body: np.ndarray | None) -> None:
        """Queue a reply the loop decided (:meth:`.CAnswer.add_spec`); with a log an
        ``UPDATE_ACK`` is held instead, until every record logged so far is durable (its
        update's, or the original of a duplicate or poll)."""
        st = self.state
        if msg_type == MsgType.UPDATE_ACK and st.durability is not None:  # seq: the next log record's
            ids = _Ack(h.client_id, h.msg_id, h.num_tables, h.num_keys, h.value_len)
            self.held.append((st.durability.seq, self._t0, name, ids))
            return
        self.answer.add_spec(idx, name, msg_type, status, table_id, h, body)

    def _take(self, n: int) -> None:
        """The frames of the wake-up the answer path did not answer: the ones its header checks
        refused through the one-frame path, one by one (:meth:`.ShardState.take_frame`); the
        others reassembled (:attr:`intake`) and their whole messages served
        (:meth:`_messages`, in the order of the datagram that completed them). A wake-up
        holding update polls (:func:`.shard_state.is_poll`) is cut at each poll: the frames before it
        are served first, then the poll (:meth:`_poll_frame`)."""
        bs, ans, st = self.bs, self.answer, self.state
        L = bs.lens[:n]
        cols, ok, p = ans.cols[:n], ans.ok[:n].view(bool), ans.p[:n]
        if st.fixed_length:
            ok &= self._announced_match(np.flatnonzero(ok), cols, n)
        for i in np.flatnonzero(~ok).tolist():
            self._cur = (i, bs.names[i].tobytes())
            self._one.idx = i
            req = st.take_frame(bytes(bs.rx[i, :L[i]]), udpio.sockaddr_to_tuple(bs.names[i]), self._frame_reply,
                                self._one)
            if req is not None:
                self._messages([req])
        good = np.flatnonzero(ok & ~ans.taken[:n].view(bool))
        if good.size == 0:
            return
        st.counts["rx_frames"] += int(good.size)
        st.counts["rx_bytes"] += int(L[good].sum())
        c = cols[good]
        poll = ((c[:, MT] == MsgType.UPDATE_REQ) & ((c[:, FLAGS] & consts.Flags.RETRANSMIT) != 0) & (c[:, FC] > 1)
                & (c[:, FI] == c[:, FC] - 1))
        start = 0  # the frames between polls served, each poll after them
        for j in np.flatnonzero(poll).tolist():
            if j > start:
                self._messages(self.intake.messages(good[start:j], cols, p))
            self._poll_frame(int(good[j]), cols, p)
            start = j + 1
        if start < good.size:
            self._messages(self.intake.messages(good[start:], cols, p))

    def _frame_reply(self, h, msg_type: int, status: int, table_id: int, body: bytes) -> None:
        """The one-frame path's replies (:data:`.shard_state.ReplySink`), in the place of its datagram."""
        self._reply(self._cur[0], self._cur[1], msg_type, status, table_id, h,
                    np.frombuffer(body, np.uint8) if body else None)

    def _poll_frame(self, r: int, cols: np.ndarray, p: np.ndarray) -> None:
        """Frame ``r``, an update poll: fed to its message first — served if it completes it;
        else answered from the window (:meth:`.ShardState.poll_reply`: ``UPDATE_ACK`` for an
        applied update, the fragments held again dropped; ``UPDATE_NACK`` with the fragments held)."""
        st = self.state
        st.counts["update_polls"] += 1
        done, held = self.intake.poll(r, cols, p)
        if done:
            self._messages(done)
            return
        req = self.intake.request(r, cols, self.bs.names[r].tobytes())
        ans = st.poll_reply(req, int(cols[r, FO]), self.bs.rx[r, consts.HDR_LEN:consts.HDR_LEN + int(cols[r, FL])],
                            held)
        if ans is None:
            return
        if ans[0] == MsgType.UPDATE_ACK:
            self.intake.discard(req.client_id, req.msg_id, MsgType.UPDATE_REQ)
        self._reply(r, req.name, ans[0], 0, consts.NO_TABLE, req, np.frombuffer(ans[1], np.uint8) if ans[1] else None)

    def _announced_match(self, cand: np.ndarray, cols: np.ndarray, n: int) -> np.ndarray:
        """Fixed-length mode: bool (n,), True where frame ``cand[j]``'s message was announced by a
        SIZE_REQ with its header's type, ``num_tables``, ``num_keys`` and ``msg_len`` — so every
        buffer the fast path allocates has the announced size. The others go to the one-frame
        path, which drops them as ``unannounced`` / ``size_mismatch``. One look-up per distinct
        message, not per frame."""
        c = cols[cand]
        k = (c[:, CID].astype(np.uint64) << np.uint64(32)) | c[:, MID].astype(np.uint64)
        uk, first, inv = np.unique(k, return_index=True, return_inverse=True)
        ann = self.state.announced  # (client_id, msg_id) -> (msg_type, num_tables, num_keys, msg_len)
        want = c[first][:, [MT, NT, NK, ML]].tolist()
        hit = [ann.get((u >> 32, u & 0xFFFFFFFF)) == tuple(w) for u, w in zip(uk.tolist(), want)]
        out = np.zeros(n, bool)
        out[cand] = np.array(hit, bool)[inv]
        return out

    # -- messages -----------------------------------------------------------------------------

    def _emit(self, r: Request, msg_type: int, body: np.ndarray | None = None, status: int = 0,
              table_id: int = consts.NO_TABLE) -> None:
        """Reply ``msg_type`` to request ``r`` through the answer path, counted (``table_id``
        names an ERROR's table)."""
        self.state.count_reply(msg_type, status)
        self._reply(r.idx, r.name, msg_type, status, table_id, r, body)

    def _messages(self, reqs: list[Request]) -> None:
        """Parse the whole requests' directories, queue them by kind and flush (see the module
        docstring for the rules); ``reqs`` in arrival order."""
        st = self.state
        lk: tuple = ([], set(), self._flush_lookups)  # a queue: (requests, their tables, its flush)
        up: tuple = ([], set(), self._flush_updates)
        for r in reqs:
            st.requests[MsgType(r.msg_type)] += 1
            if r.msg_type == MsgType.SIZE_REQ:
                if st.admit_sizes(r, r.body):
                    self._emit(r, MsgType.SIZE_ACK)
                else:
                    self._emit(r, MsgType.ERROR, status=Status.MALFORMED)
                continue
            try:
                rb = codec.parse_request_body(r, r.body)
            except DirectoryError as e:
                self._emit(r, MsgType.ERROR, status=e.status, table_id=e.table_id)
                continue
            tids = set(rb.directory["table_id"].tolist())
            q, other = (lk, up) if r.msg_type == MsgType.LOOKUP_REQ else (up, lk)
            if other[1] & tids:
                self._flush(*other)
            q[0].append((r, rb))
            q[1].update(tids)
        for q in (lk, up):  # the two queues share no table: their order does not matter
            if q[0]:
                self._flush(*q)

    def _flush(self, q: list, tables: set, fn: Callable) -> None:
        """``fn(q)`` (a fault answered INTERNAL), then the queue ``q`` and its ``tables`` emptied."""
        try:
            fn(q)
        except Exception:  # noqa: BLE001 - answered INTERNAL, the shard keeps serving
            self.state.counts["internal_errors"] += 1
            log.exception("shard %d: internal error serving %d messages", self.shard_id, len(q))
            for r, _ in q:
                self._emit(r, MsgType.ERROR, status=Status.INTERNAL)
        q.clear()
        tables.clear()

    def _flush_lookups(self, q: list) -> None:
        """Lookups ``q`` (``(request, body)``, arrival order): answered by the answer path where
        its rules allow; the others checked (:meth:`.ShardState.table_fault`), then the rows of
        every table of all of them in one :meth:`.ShardState.rows_lookup` (one search and one
        gather), cast to the wire dtypes at once; each reply body (uint8 (value_len,)) a slice."""
        ans, st = self.answer, self.state
        if ans.serving:
            done = ans.lookups(q)
            if done.all():
                return
            q = [x for x, d in zip(q, done.tolist()) if not d]
        ok = []
        for r, rb in q:
            fault = st.table_fault(rb)
            if fault is None:
                ok.append((r, rb))
            else:
                self._emit(r, MsgType.ERROR, status=int(fault[0]), table_id=fault[1])
        if not ok:
            return
        tids, counts, keys = self._concat(ok)
        data = st.to_wire(st.rows_lookup(tids, counts, keys), tids, counts)
        at = 0
        for (r, _), end in zip(ok, itertools.accumulate(r.value_len for r, _ in ok)):
            self._emit(r, MsgType.LOOKUP_REPLY, data[at:end])
            st.counts["lookup_keys"] += r.num_keys
            at = end

    @staticmethod
    def _concat(q: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The directory segments and keys of the requests ``q`` (``(request, body)``) one after
        the other: (table ids int64 (S,), key counts int64 (S,), keys uint64 (Σ counts,))."""
        if len(q) == 1:
            rb = q[0][1]
            d, keys = rb.directory, rb.keys
        else:
            d = np.concatenate([x[1].directory for x in q])
            keys = np.concatenate([x[1].keys for x in q])
        return d["table_id"].astype(np.int64), d["num_keys"].astype(np.int64), keys

    def _flush_updates(self, q: list) -> None:
        """Updates ``q`` (arrival order): each admitted (:meth:`.ShardState.admit_update`:
        exactly-once window, checks, log), then every admitted one applied — the one place a
        wake-up changes rows: every message's segments in one :meth:`.ShardState.rows_apply`."""
        apply: list[tuple[tuple, np.ndarray]] = []  # ((request, body), gradients float32 flat)
        acks: list[tuple[Request, Refused | None]] = []
        for r, rb in q:
            try:
                grads = self.state.admit_update(r, r.body, rb, r.last_offset)
            except Refused as e:
                acks.append((r, e))
                continue
            if grads is not None:
                apply.append(((r, rb), grads))
            acks.append((r, None))
        if apply:
            tids, counts, keys = self._concat([x for x, _ in apply])
            flat = apply[0][1] if len(apply) == 1 else np.concatenate([g for _, g in apply])
            self.state.rows_apply(tids, counts, keys, flat)
        for r, e in acks:
            if e is None:
                self._emit(r, MsgType.UPDATE_ACK)
            else:
                self._emit(r, MsgType.ERROR, status=int(e.status), table_id=e.table_id)


class _Ack(NamedTuple):
    """The ids of a held ack's request (what its reply copies)."""

    client_id: int
    msg_id: int
    num_tables: int
    num_keys: int
    value_len: int


class _OneFrame:
    """The serving loop's intake as the one-frame path's :class:`~.shard_state.Assembly`: the frame
    :meth:`.ShardState.take_frame` took is datagram ``idx`` of the wake-up, whose header fields
    it gives (so reassembly exists once in the loop, whichever path a frame came by)."""

    def __init__(self, intake: Intake):
        self.intake = intake
        self.idx = 0

    def _row(self, h) -> tuple[int, np.ndarray, np.ndarray] | None:
        """The frame as the intake reads it (its index, header row and fragment size), or None
        when its fragments' geometry does not add up (dropped ``frag_mismatch``, as a reassembler
        drops it)."""
        try:
            P = fragment_size(h)
        except FrameError as e:
            self.intake.stats["frames"] += 1
            self.intake.drops[e.reason] += 1
            return None
        i = self.idx
        cols = np.zeros((i + 1, len(consts.HEADER_FIELDS)), np.int64)
        cols[i] = h
        p = np.zeros(i + 1, np.int64)
        p[i] = P
        return i, cols, p

    def feed(self, h, data: bytes, addr) -> Request | None:
        """:meth:`.Intake.take_one` of the frame."""
        row = self._row(h)
        return None if row is None else self.intake.take_one(*row)

    def feed_poll(self, h, data: bytes, addr) -> tuple[Request | None, list[int] | None]:
        """:meth:`.Intake.poll` of the frame."""
        row = self._row(h)
        if row is None:
            return None, None
        done, held = self.intake.poll(*row)
        return (done[0] if done else None), held

    def discard(self, client_id: int, msg_id: int, msg_type: int) -> None:
        self.intake.discard(client_id, msg_id, msg_type)
