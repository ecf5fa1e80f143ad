"""The shard's batch engine: many datagrams and messages per wake-up, numpy across all of them.

:class:`BatchShardServer` answers exactly as the reference :class:`~embnic.testbed.server.shard.ShardServer`
(same replies, statuses, counters, exactly-once rules and numerics — the tests run both on the
same frames and compare), but where the reference handles one datagram per asyncio callback in
Python, the engine works per **wake-up**::

    poll ─▶ recvmmsg (≤ 256 datagrams into a preallocated (256, 65536) uint8 buffer)
         ─▶ headers of all of them parsed and checked at once (numpy structured view)
         ─▶ frames the fast path cannot take (malformed, wrong shard, a lookup whose reply
            would need too many fragments, ...) go to the reference handler one by one: one
            home for every header rule and drop reason
         ─▶ fragments reassembled per message (vector copies into one buffer per message)
         ─▶ complete messages' directories parsed and their tables checked with the
            reference's own functions (``codec.parse_request_body``, ``_table_fault``,
            ``_admit_update``: one home for every per-table rule); then per table one row
            gather for all lookups of the wake-up and one optimizer step for all its updates
            (:func:`serve_batch` → :meth:`_flush_lookups` / :meth:`_flush_updates`)
         ─▶ replies encoded straight into a preallocated (rows, 44 + P) transmit buffer
         ─▶ sendmmsg, multi-frame replies as UDP GSO super-datagrams (:mod:`.udpio`)

Replies leave in the order of the datagrams that completed their requests, as with the
reference. A message (protocol v2) carries several tables. Ordering rules that keep the
numerics identical to the reference (and so to :class:`~embnic.client_lib.local.LocalBackend`):
lookups and updates wait in two queues; a message that shares a table with what the other
queue holds flushes that queue first (so the queues never share a table, and a lookup sees
exactly the updates that came before it); updates are admitted — exactly-once window, checks,
log — one message after the other in arrival order, then applied per table, overlapping keys
one message after the other, disjoint ones in one :meth:`TableShard.apply` call (row-wise
optimizers: a row's result does not depend on the other rows of the call).

**Where an update is made durable.** With ``checkpoint_dir`` every applied update is appended to
the write-ahead log where the exactly-once window takes it (``ShardServer._admit_update``,
called by :meth:`_flush_updates`), and :meth:`serve_batch`
commits the log with **one** ``fdatasync`` per wake-up before :meth:`_transmit` lets any ack of
that wake-up leave (:mod:`.durability`). Checkpoints are taken between wake-ups.

**Composition.** The engine is the reference :class:`ShardServer` (its rules, counters, window,
log and the table store it opened, :mod:`.stores`) with a loop of its own and two parts it holds:
an :class:`~.intake.Intake` (``self.intake``: the header checks and reassembly of a wake-up) and
a reply builder (``self.replies``: :class:`~.replies.ReplyBuilder`, or the C answer path's
:class:`~.canswer.CAnswer`, which has the same methods). This module holds the loop, the
order of a wake-up (frames to the reference handler, polls, messages), the lookup and update
queues and the application of a wake-up's messages (:meth:`_messages`, :meth:`_flush_lookups`,
:meth:`_flush_updates`); the batched system calls are :mod:`.udpio`, worker processes behind
one address :mod:`.foreground` and :mod:`.peers`.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import select
import socket
import time
from typing import Any, Callable

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.sockets import set_socket_buffers
from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.consts import DType, MsgType, Status
from embnic.client_lib.codec import DirectoryError

from . import canswer, cintake, udpio
from .intake import CID, FC, FI, FL, FLAGS, FO, INFO_FIELDS, MID, ML, MT, NK, NT, Intake
from .peers import PeerGone, PeerHub, PeerLink, SplitTable, segment_bounds as _offsets, serve_sub_request
from .replies import ReplyBuilder
from .shard import ShardServer, _Refused

log = logging.getLogger("embnic.server")


class BatchShardServer(ShardServer):
    """One shard served by the batch engine (see the module docstring): the reference's rules and
    state, an :class:`~.intake.Intake` (``intake``) and a reply builder (``replies``).

    Args:
        cfg, shard_id, bind, port, **kwargs: as :class:`ShardServer` (``dedup_window``,
            ``max_msg_bytes``, ``reassembly_timeout_s``).
        batch: datagrams per ``recvmmsg`` (per wake-up pass).
        small: wake-ups of at most this many frames check their headers frame by frame
            (:meth:`.Intake.check_scalar`), larger ones as vectors (:meth:`.Intake.check_vector`).
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
                 batch: int = 256, small: int = 4, gso: bool = True,
                 sock: socket.socket | None = None,
                 worker: tuple[int, int] = (0, 1), peer_socks: dict[int, socket.socket] | None = None,
                 c_intake: bool = True, c_answer: bool = True, **kwargs):
        me, n = int(worker[0]), int(worker[1])
        if n > 1 and (kwargs.get("checkpoint_dir") is not None or kwargs.get("restore") is not None):
            raise ValueError("a write-ahead log needs one worker (--workers 1)")
        if n > 1 and sorted(peer_socks or {}) != [v for v in range(n) if v != me]:
            raise ValueError(f"worker {me} of {n} needs a socket to every other worker, got {sorted(peer_socks or {})}")
        self._worker = (me, n)  # before ShardServer opens the row stores: a worker's disk tables are its own
        super().__init__(cfg, shard_id, bind, port, **kwargs)
        self._hub: PeerHub | None = None
        self._local = self.tables  # this process's own rows per table (all of them with one worker)
        if n > 1:
            local = self._local = dict(self.tables)
            self._hub = PeerHub(me, n, {v: PeerLink(s) for v, s in peer_socks.items()},
                                lambda op, tid, cnt, p: serve_sub_request(local, op, tid, cnt, p))
            self.tables = {tid: SplitTable(ts, self._hub) for tid, ts in local.items()}
        self.batch = int(batch)
        self.gso = bool(gso)
        self.c_intake = bool(c_intake)
        self.c_answer = bool(c_answer)
        self._cin: cintake.CIntake | None = None
        self._ca: canswer.CAnswer | None = None
        self._sock = sock
        self._bs: udpio.BatchSocket | None = None
        #: the header checks and reassembly of every wake-up (bound to the socket by :meth:`open`)
        self.intake = Intake(self.shard_id, min(self.max_msg_bytes, self._reasm.max_msg_len), self.max_reply_bytes,
                             self._check_header, small=small, max_pending=self._reasm.max_pending,
                             max_pending_bytes=self._reasm.max_pending_bytes, timeout_s=self._reasm.timeout_s)
        #: the replies of a wake-up: framed in numpy, or by the C answer path once :meth:`open` found it
        self.replies: ReplyBuilder | canswer.CAnswer = ReplyBuilder(self.shard_id, self.mtu)
        self._P = self.replies.P
        self._cur_idx = 0  # the datagram the reference handler is answering (its replies' place)
        self._twire = {t.id: codec.value_dtype(t.wire_dtype) for t in cfg.tables}
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
            self._cin = cintake.CIntake(lib, self._bs.rx, self._bs.lens, self.shard_id,
                                        min(self.max_msg_bytes, self._reasm.max_msg_len), self.max_reply_bytes)
            cal = canswer.load() if self.c_answer and self._bs.native else None
            if cal is not None:
                # lookups answered in C unless rows live in other processes (workers) or data
                # must have been announced (fixed length): then C checks, builds and sends only
                self._ca = canswer.CAnswer(cal, self, serve=self._hub is None and not self.fixed_length)
                self.replies = self._ca
        elif self.c_intake:
            cintake.log_missing()
        self.intake.bind(self._bs, self._cin)
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
                self.intake.expire(now)
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
        """Close the socket, the wake-up pipe, the log and the disk stores. Idempotent."""
        if self._dur is not None:
            self._dur.close()
        self.close_stores()
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
        rs = self.intake.stats
        for r, v in self.intake.drops.items():
            c["drops"][r] = c["drops"].get(r, 0) + v
        re = c["reassembly"]
        re["pending"] += len(self.intake)
        re["expired"] += rs["expired"]
        re["evicted"] += rs["evicted"]
        re["duplicate_frames"] += rs["duplicates"]
        if self._bs is not None:
            io, gso = dict(self._bs.stats), bool(self._bs.gso)
        else:
            io, gso = self._io_final
        whole = rs["whole"]
        ca = self._ca
        if ca is not None:  # what the C answer path did: added to the engine's own counts
            st = ca.stats()
            c["rx_frames"] += st["rx_frames"]
            c["rx_bytes"] += st["rx_bytes"]
            c["tx_frames"] += st["tx_frames"]
            c["tx_bytes"] += st["tx_bytes"]
            c["lookup_keys"] += st["lookup_keys"]
            c["requests"][MsgType.LOOKUP_REQ.name] += st["messages"]  # the engine counted the others'
            c["replies"][MsgType.LOOKUP_REPLY.name] += st["messages"] + st["answered"]
            whole += st["whole"]
            for k in ("send_calls", "gso_sends", "send_errors", "gso_fallbacks"):
                io[k] = io.get(k, 0) + st[k]
            gso = ca.gso
        c["engine"] = {"name": "batch", "wakeups": self._c["wakeups"], "batch": self.batch,
                       "intake": "c" if self._cin is not None else "numpy",
                       "answer": "c" if ca is not None and ca.serving else ("c-frames" if ca is not None
                                                                             else "numpy"),
                       "messages_whole": whole, "gso": gso, **io}
        if ca is not None:
            # lookups answered by the C path: straight from the receive buffer, and reassembled by the engine
            c["engine"]["answered_in_c"] = st["messages"] + st["answered"]
            c["engine"]["answered_from_rx"] = st["messages"]
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
        ca = self._ca
        try:
            if ca is None:
                self._take(n)
            elif ca.serve(n, not len(self.intake)) < n:  # checks, and the lookups C answers; then the rest
                self._take(n, (ca.cols[:n], ca.ok[:n].view(bool), ca.p[:n]), ca.taken[:n].view(bool))
        except Exception:  # noqa: BLE001 - a bug must not stop the shard
            self._c["internal_errors"] += 1
            log.exception("shard %d: internal error in a batch of %d frames", self.shard_id, n)
        if self._dur is not None and not self._commit_log():
            self.replies.clear()  # not durable: no reply of this wake-up may leave
        nrep = self.replies.replies()
        self._transmit()
        if nrep:  # every reply of the wake-up left in its one sendmmsg: their service time
            self._svc.add(time.monotonic_ns() - t0, nrep)

    def _take(self, n: int, checked: tuple | None = None, taken: np.ndarray | None = None) -> None:
        """Validate, divert and reassemble the ``n`` frames (:attr:`intake`) and hand the complete
        messages to :meth:`_messages` (in the order of the datagram that completed them). Frames
        the fast path does not take go to the reference handler, one by one (one home for every
        error rule and drop reason). A wake-up holding update polls (``shard.is_poll``) is cut at
        each poll: the frames before it are served first, then the poll (:meth:`_poll_frame`),
        so its answer depends on exactly what came before it, as in the reference.

        ``checked``: the header checks already made (``(cols, ok, p)`` as :meth:`.Intake.check_vector`:
        the C answer path's, :meth:`.canswer.CAnswer.serve`); ``taken``: bool (n,), frames it
        answered already (lookups: they change nothing here)."""
        bs = self._bs
        L = bs.lens[:n]
        cols, ok, p = checked if checked is not None else self.intake.check(n)
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
            self._messages(self.intake.messages(good, cols, p), cols, p)
            return
        rest = good[~poll]
        start = 0
        for r in good[poll].tolist():
            seg = rest[(rest >= start) & (rest < r)]
            if seg.size:
                self._messages(self.intake.messages(seg, cols, p), cols, p)
            self._poll_frame(r, cols, p)
            start = r + 1
        seg = rest[rest >= start]
        if seg.size:
            self._messages(self.intake.messages(seg, cols, p), cols, p)

    def _poll_frame(self, r: int, cols: np.ndarray, p: np.ndarray) -> None:
        """Frame ``r``, an update poll, as ``ShardServer._poll``: fed to its message first —
        served if it completes it; else ``UPDATE_ACK`` when the window holds an update of its id
        whose last fragment it is, byte for byte (:meth:`.UpdateWindow.poll_ack`; the fragments
        held again dropped), else ``UPDATE_NACK`` with the fragments held."""
        info = self.intake.info(r, cols)
        cid, mid = info[1], info[2]
        m = (r, info, self._bs.names[r].tobytes(), None)
        self._c["update_polls"] += 1
        done, held = self.intake.poll(r, cols, p)
        if done:
            self._messages(done, cols, p)
            return
        fo = int(cols[r, FO])
        if self._applied.poll_ack(cid, mid, info[3], info[4], info[5], fo,
                                  self._bs.rx[r, consts.HDR_LEN:consts.HDR_LEN + int(cols[r, FL])]):
            self._c["update_poll_acks"] += 1
            self.intake.discard(cid, mid, MsgType.UPDATE_REQ)
            self._emit(m, MsgType.UPDATE_ACK)
            return
        if held is not None:
            self._c["update_nacks"] += 1
            self._emit(m, MsgType.UPDATE_NACK, np.frombuffer(codec.nack_body(held), np.uint8))

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

    # -- replies ------------------------------------------------------------------------------

    def _emit(self, m: tuple, msg_type: int, body: np.ndarray | None = None, status: int = 0,
              table_id: int = consts.NO_TABLE) -> None:
        """Reply ``msg_type`` to message ``m`` (``(idx, info, name, ...)``, :meth:`.Intake.messages`)
        through the reply builder, counted (``table_id`` names an ERROR's table)."""
        if msg_type == MsgType.ERROR:
            self._errors[Status(status)] += 1
        self._replies[msg_type] += 1
        self.replies.add_spec(m[0], m[2], msg_type, status, table_id, m[1], body)

    def _send(self, frames: list[bytes], addr) -> None:
        """The reference handler's replies (``addr``: an ``(ip, port)`` tuple or a 16-byte
        ``sockaddr_in``), queued in the place of the datagram it is handling."""
        if not frames:
            return
        self._replies[frames[0][3]] += 1  # one reply message (byte 3: msg_type)
        self.replies.queue_frames(frames, self._cur_idx, addr if isinstance(addr, bytes) else udpio.tuple_to_sockaddr(addr))

    def _transmit(self) -> None:
        """Send every reply of this wake-up, ordered by the datagram that completed its request."""
        if self._ca is not None:  # built and sent in C (canswer: the frames' counts are its counters)
            try:
                self._ca.send()
            except Exception:  # noqa: BLE001 - a bug must not stop the shard
                self._c["send_errors"] += 1
                self._ca.clear()
                log.exception("shard %d: send failed", self.shard_id)
            return
        rb = self.replies
        if not rb.replies():
            rb.clear()
            return
        try:
            self._c["tx_frames"] += rb.ntx
            self._c["tx_bytes"] += rb.queued_bytes()
            rb.send(self._bs)
        except OSError as e:
            self._c["send_errors"] += 1
            log.warning("shard %d: send failed: %s", self.shard_id, e)

    # -- messages -----------------------------------------------------------------------------

    def _messages(self, msgs: list[tuple], cols: np.ndarray, p: np.ndarray) -> None:
        """Parse the complete messages' directories, queue them by kind and flush (see the module
        docstring for the rules). ``msgs``: ``(idx, info, name, body)`` in arrival order, info =
        the message's ``intake.INFO_FIELDS``; ``cols``, ``p``: the wake-up's header rows and
        fragment sizes (the frame ``idx`` that completed a message gives its fragment count and
        size: each message's header here is that of its last fragment, whose offset and bytes
        the exactly-once window keeps for polls)."""
        lk: list = []
        up: list = []
        lk_t: set = set()
        up_t: set = set()
        for m in msgs:
            info, body = m[1], m[3]
            f = dict(zip(INFO_FIELDS, info))
            mtype = f["msg_type"]
            self._requests[MsgType(mtype)] += 1
            fc = int(cols[m[0], FC])
            lo = (fc - 1) * int(p[m[0]])
            h = codec.Header(magic=consts.MAGIC, version=consts.VERSION, flags=0, reserved0=0, status=0,
                             shard_id=self.shard_id, table_id=consts.NO_TABLE, msg_len=int(body.size), frag_offset=lo,
                             frag_index=fc - 1, frag_count=fc, frag_len=int(body.size) - lo, reserved=0, **f)
            try:
                rb = codec.parse_request_body(h, body)
            except DirectoryError as e:
                self._emit(m, MsgType.ERROR, status=e.status, table_id=e.table_id)
                continue
            tids = set(rb.directory["table_id"].tolist())
            if mtype == MsgType.LOOKUP_REQ:
                if up_t & tids:
                    self._flush(self._flush_updates, up)
                    up, up_t = [], set()
                lk.append((m, h, rb))
                lk_t |= tids
            else:
                if lk_t & tids:
                    self._flush(self._flush_lookups, lk)
                    lk, lk_t = [], set()
                up.append((m, h, rb))
                up_t |= tids
        if lk:  # the two queues share no table: their order does not matter
            self._flush(self._flush_lookups, lk)
        if up:
            self._flush(self._flush_updates, up)

    def _flush(self, fn: Callable, q: list) -> None:
        try:
            fn(q)
        except Exception:  # noqa: BLE001 - answered INTERNAL, the shard keeps serving
            self._c["internal_errors"] += 1
            log.exception("shard %d: internal error serving %d messages", self.shard_id, len(q))
            for m, _, _ in q:
                self._emit(m, MsgType.ERROR, status=Status.INTERNAL)

    @staticmethod
    def _segments(q: list) -> dict[int, list[tuple[int, int]]]:
        """``{table_id: [(message index in q, table index in its directory), ...]}`` in arrival order."""
        segs: dict[int, list[tuple[int, int]]] = {}
        for j, (_, _, rb) in enumerate(q):
            for t, tid in enumerate(rb.directory["table_id"].tolist()):
                segs.setdefault(tid, []).append((j, t))
        return segs

    def _flush_lookups(self, q: list) -> None:
        """Lookups ``q`` (``(m, header, body)``, arrival order): each checked as the reference does,
        then the rows of every table of all of them in one search and one gather
        (:meth:`_lookup_bodies`; with workers one exchange per peer for every table,
        :meth:`_lookup_bodies_workers`), each reply's rows in its directory order."""
        ca = self._ca
        if ca is not None and ca.serving:  # answered in C where its rules allow; the rest below
            done = ca.lookups(q)
            if done.all():
                return
            q = [x for x, d in zip(q, done.tolist()) if not d]
        ok = []
        for m, h, rb in q:
            fault = self._table_fault(h, rb)
            if fault is None:
                ok.append((m, h, rb))
            else:
                self._emit(m, MsgType.ERROR, status=int(fault[0]), table_id=fault[1])
        if not ok:
            return
        bodies = self._lookup_bodies(ok) if self._hub is None else self._lookup_bodies_workers(ok)
        for (m, h, _), body in zip(ok, bodies):
            self._emit(m, MsgType.LOOKUP_REPLY, body)
            self._c["lookup_keys"] += h.num_keys

    @staticmethod
    def _concat(q: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The directory segments and keys of the messages ``q`` (``(m, header, body)``) one after
        the other: (table ids int64 (S,), key counts int64 (S,), keys uint64 (Σ counts,))."""
        if len(q) == 1:
            rb = q[0][2]
            d, keys = rb.directory, rb.keys
        else:
            d = np.concatenate([x[2].directory for x in q])
            keys = np.concatenate([x[2].keys for x in q])
        return d["table_id"].astype(np.int64), d["num_keys"].astype(np.int64), keys

    def _lookup_bodies(self, ok: list) -> list[np.ndarray]:
        """Reply bodies (uint8 (value_len,) each) of the checked lookups ``ok``: the segments of
        every message concatenated, their rows in one :meth:`_rows_lookup`, cast to the wire
        dtypes at once (:meth:`_to_wire`); each body a slice of the result (no per-table or per-key
        work in Python)."""
        tids, counts, keys = self._concat(ok)
        data = self._to_wire(self._rows_lookup(tids, counts, keys), tids, counts)
        if len(ok) == 1:
            return [data]
        ends = np.cumsum([h.value_len for _, h, _ in ok]).tolist()
        return [data[a:b] for a, b in zip([0] + ends[:-1], ends)]

    def _to_wire(self, rows: np.ndarray, tids: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Rows float32 flat of segments ``tids``/``counts`` → their wire bytes uint8 (each
        table's dtype, little-endian, row-major): a view for fp32 tables only, one cast for fp16
        only, one scatter per dtype for both."""
        dt = self._tdt[tids]
        if bool((dt == DType.FP32).all()):
            return rows.astype("<f4", copy=False).view(np.uint8)
        if bool((dt == DType.FP16).all()):
            with np.errstate(over="ignore"):  # |x| > 65504 becomes inf, as LocalBackend's wire_round
                return rows.astype("<f2").view(np.uint8)
        e16 = np.repeat(np.repeat(dt == DType.FP16, counts), np.repeat(self._tdim[tids], counts))
        es = np.where(e16, 2, 4)
        pos = np.cumsum(es) - es
        out = np.empty(int(es.sum()), np.uint8)
        out[pos[~e16][:, None] + np.arange(4)] = rows[~e16].astype("<f4").view(np.uint8).reshape(-1, 4)
        with np.errstate(over="ignore"):
            out[pos[e16][:, None] + np.arange(2)] = rows[e16].astype("<f2").view(np.uint8).reshape(-1, 2)
        return out

    def _lookup_bodies_workers(self, ok: list) -> list[np.ndarray]:
        """As :meth:`_lookup_bodies` with worker processes: per table one part for every owner,
        one exchange per peer for every table (:meth:`~.peers.PeerHub.lookup_many`)."""
        bodies = [np.empty(h.value_len, np.uint8) for _, h, _ in ok]
        segs_of = self._segments(ok)
        keys_of = {tid: [ok[j][2].keys[ok[j][2].key_offsets[t]:ok[j][2].key_offsets[t + 1]] for j, t in segs]
                   for tid, segs in segs_of.items()}
        parts = [(tid, np.concatenate(ks) if len(ks) > 1 else ks[0]) for tid, ks in keys_of.items()]
        for (tid, _), rows in zip(parts, self._hub.lookup_many(self._local, parts)):
            wire = self._twire[tid]
            data = rows.astype(wire, copy=False).reshape(-1).view(np.uint8)
            rb_ = rows.shape[1] * wire.itemsize
            at = 0
            for (j, t), k in zip(segs_of[tid], keys_of[tid]):
                n = k.size * rb_
                v0 = int(ok[j][2].value_offsets[t])
                bodies[j][v0:v0 + n] = data[at:at + n]
                at += n
        return bodies

    def _flush_updates(self, q: list) -> None:
        """Updates ``q`` (arrival order): each admitted as the reference does (exactly-once
        window, checks, log), then every admitted one applied, all tables in one call."""
        apply: list[tuple[int, np.ndarray]] = []
        acks: list[tuple[int, tuple | None]] = []
        for j, (m, h, rb) in enumerate(q):
            try:
                grads = self._admit_update(h, m[3], rb, h.frag_offset)
            except _Refused as r:
                acks.append((j, (r.status, r.table_id)))
                continue
            if grads is not None:
                apply.append((j, grads))
            acks.append((j, None))
        if apply:
            self._apply_updates(q, apply)
        for j, fault in acks:
            if fault is None:
                self._emit(q[j][0], MsgType.UPDATE_ACK)
            else:
                self._emit(q[j][0], MsgType.ERROR, status=int(fault[0]), table_id=fault[1])

    def _apply_updates(self, q: list, apply: list[tuple[int, np.ndarray]]) -> None:
        """Apply the admitted updates ``apply`` (``(index into q, gradients float32 flat)``, arrival
        order): the one place a wake-up changes rows. Every message's segments in one
        :meth:`_rows_apply` (one optimizer step for every table; overlapping keys one message
        after the other, :meth:`RowStore.apply_passes`); with workers each owner applies its share
        of every segment (:meth:`~.peers.PeerHub.apply_many`)."""
        if self._hub is None:
            sel = [q[j] for j, _ in apply]
            tids, counts, keys = self._concat(sel)
            flat = apply[0][1] if len(apply) == 1 else np.concatenate([g for _, g in apply])
            self._rows_apply(tids, counts, keys, flat, len(apply) > 1)
            return
        by_tid: dict[int, list] = {}
        for j, grads in apply:
            rb = q[j][2]
            ko = rb.key_offsets
            d = rb.directory
            eo = np.r_[0, np.cumsum(d["num_keys"].astype(np.int64) * d["dim"].astype(np.int64))]
            for t, (tid, dim) in enumerate(zip(d["table_id"].tolist(), d["dim"].tolist())):
                by_tid.setdefault(tid, []).append((rb.keys[ko[t]:ko[t + 1]], grads[eo[t]:eo[t + 1]].reshape(-1, dim)))
        parts = []
        for tid, segs in by_tid.items():
            if len(segs) == 1:
                k, g = segs[0]
                offs = np.array([0, k.size], np.int64)
            else:
                k = np.concatenate([s[0] for s in segs])
                g = np.concatenate([s[1] for s in segs])
                offs = _offsets(np.array([s[0].size for s in segs], np.int64))
            parts.append((tid, k, g, offs))
        self._hub.apply_many(self._local, parts)  # one exchange per peer for every table
