"""A parameter-server shard: the readable reference server (asyncio, one datagram at a time).

``embnic server`` runs the batch engine (:mod:`embnic.testbed.server.engine`) by default; it
answers exactly as this server does and hands it every frame its fast path does not take, so
the rules below are the rules of both (docs/server.md). ``--engine reference`` runs this one.
Started as ``embnic server --shard I --config F``, as ``python -m embnic.testbed.server --shard I
--config F`` (what the testbed runs), or in process with :class:`~.runner.ServerThread` /
:class:`~.runner.ServerCluster` (either engine; :mod:`.runner`). Wiring::

    client ──UDP (LOOKUP_REQ / UPDATE_REQ, fragmented)──▶ shard I  (bind ip:port, config)
       ▲                                                     │ Reassembler → handle → TableShard
       └──────────UDP (LOOKUP_REPLY / UPDATE_ACK / ERROR)────┘ to the request's source address

What it does with every datagram (docs/protocol.md):

1. **Validate** the header (:func:`~embnic.client_lib.codec.parse_header`, requests only). A
   frame that does not parse is dropped and counted by reason (``too_short``, ``bad_magic``,
   ``bad_version``, ``bad_type``, ``bad_dtype``, ``bad_length``, ``frag_mismatch``); if its
   magic, version and type are right (a request whose lengths or dtype do not add up) the
   server also answers ``ERROR MALFORMED`` — once per message, on fragment 0. Requests
   larger than ``max_msg_bytes`` are dropped as ``too_large`` (answered MALFORMED), before any
   buffer is allocated for them.
2. **Header checks** on every fragment, answered on fragment 0 only (so a bad message of many
   fragments draws one ERROR): ``WRONG_SHARD`` (``shard_id`` is not this shard),
   ``UNKNOWN_TABLE``, ``DIM_MISMATCH`` (``dim`` or ``dtype`` differs from the table's). Every
   frame refused here is dropped and counted as ``refused``, answered or not.
3. **Reassemble** (:class:`~embnic.client_lib.reassembly.Reassembler`, any order, duplicates).
4. **Body checks** on the whole message: ``KEY_OUT_OF_RANGE`` (a key ``>= rows``, for a table
   with ``rows``; without it every uint64 is a key),
   ``NOT_OWNER`` (a key another shard owns under the cluster's sharding policy,
   :func:`~embnic.client_lib.routing.owns`), ``MALFORMED`` (duplicate keys, or a gradient
   the optimizer must not apply — NaN/inf, or a step that overflows float32,
   :func:`~embnic.client_lib.table_numerics.gradient_rows_ok` — in an update: the whole
   message is refused, nothing applied, rather than poisoning rows).
5. **Serve**: LOOKUP_REQ → LOOKUP_REPLY with the rows in key order; UPDATE_REQ → apply with
   the table's optimizer (:class:`~embnic.client_lib.table_numerics.TableShard`: SGD or row-wise
   Adagrad, the same code as the in-process reference) → UPDATE_ACK. Replies are fragmented
   to the cluster MTU and sent to the request's source address and port.

**Exactly once.** The server remembers the last ``dedup_window`` (default 65536) applied updates
as ``(client_id, msg_id) → fingerprint`` in an ordered dict (oldest evicted first). An update
whose pair is remembered *with the same fingerprint* — (table, num_keys, dim, dtype, CRC-32 of
the body) — is a duplicate: re-acked, not applied. Same pair, different fingerprint means a new
message that reuses the id (e.g. a restarted client counting from 1 again): it is applied and
replaces the entry. Updates that were refused (ERROR) are not remembered.

**Never crashes.** Any exception while handling one datagram is counted (``internal_errors``)
and answered ``ERROR INTERNAL`` when the header was readable; the server keeps serving.
SIGTERM/SIGINT (CLI) stop it cleanly: counters are logged as one JSON line and it exits 0.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time
import zlib
from typing import Any

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.codec import FrameError, Header
from embnic.client_lib.sockets import SOCK_BUF, set_socket_buffers
from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.consts import MsgType, Status
from embnic.client_lib.reassembly import Message, Reassembler
from embnic.client_lib.routing import owns
from embnic.client_lib.table_numerics import TableShard, gradient_ok, is_unique

from .metrics import ServiceTimes

log = logging.getLogger("embnic.server")

DEFAULT_DEDUP_WINDOW = 65536  #: remembered applied updates (docs/protocol.md, "Reliability")
DEFAULT_MAX_MSG_BYTES = 64 << 20  #: largest request body accepted, bytes
#: extra drop reasons of the server (besides consts.DROP_REASONS); ``refused``: a frame of a
#: request the header checks refused (fragment 0 also draws the ERROR reply)
SERVER_DROP_REASONS = ("too_large", "unannounced", "size_mismatch", "refused")


class _Refused(Exception):
    """A request is answered with ERROR ``status``."""

    def __init__(self, status: Status):
        self.status = status


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, server: ShardServer):
        self.server = server

    def connection_made(self, transport):
        self.server._transport = transport

    def datagram_received(self, data, addr):
        srv = self.server
        before = sum(srv._replies.values())
        t0 = time.monotonic_ns()
        srv.handle_datagram(data, addr)
        n = sum(srv._replies.values()) - before
        if n:  # the replies this datagram completed: its service time
            srv._svc.add(time.monotonic_ns() - t0, n)

    def error_received(self, exc):
        # ICMP errors for earlier sends (e.g. a client that went away): count, keep serving
        self.server._c["send_errors"] += 1


class ShardServer:
    """One parameter-server shard (see the module docstring for the protocol behaviour).

    Args:
        cfg: the cluster config (tables, sharding policy, seed, MTU).
        shard_id: this shard's id; must be one of ``cfg.shards``.
        bind: IPv4 address to bind; default the shard's ``ip`` in the config.
        port: UDP port; default the shard's ``port`` in the config; 0 picks a free one.
        dedup_window: applied updates remembered for exactly-once (entries).
        max_msg_bytes: largest request body accepted (bytes); larger are dropped ``too_large``.
        reassembly_timeout_s: incomplete requests are forgotten after this long (s).
        fixed_length: the fixed-length baseline (docs/protocol.md, "Size messages"): data
            requests must have been announced by a SIZE_REQ of their client (else dropped as
            ``unannounced``) with the same type, table, dtype, ``num_keys`` and ``msg_len``
            (else ``size_mismatch``, answered MALFORMED). Without it SIZE_REQs are still
            answered (and remembered), but data needs no announcement.
        checkpoint_dir: keep a write-ahead log and checkpoints in ``checkpoint_dir/shard-<id>``
            (:mod:`~embnic.testbed.server.durability`): an update is acknowledged only once its
            log record is on disk. None: memory only.
        checkpoint_every: checkpoint after this many logged updates (0: only on request,
            :meth:`checkpoint` / SIGUSR1).
        restore: load ``restore/shard-<id>`` (latest checkpoint + log replay) before serving;
            the log then continues there unless ``checkpoint_dir`` names another directory.
        log_fsync: ``fdatasync`` the log once per wake-up (False only to measure its cost).

    Raises:
        KeyError: ``shard_id`` is not in the config.
        DurabilityError: ``restore`` holds another shard's or other tables' checkpoint, or
            ``checkpoint_dir`` already holds a log (without ``restore``).
    """

    #: commit the log before each update's ack (the reference: one message per callback); the
    #: batch engine commits once per wake-up instead
    _sync_each = True

    def __init__(self, cfg: ClusterConfig, shard_id: int, bind: str | None = None, port: int | None = None, *,
                 dedup_window: int = DEFAULT_DEDUP_WINDOW, max_msg_bytes: int = DEFAULT_MAX_MSG_BYTES,
                 reassembly_timeout_s: float = 2.0, fixed_length: bool = False,
                 checkpoint_dir: str | None = None, checkpoint_every: int = 0,
                 restore: str | None = None, log_fsync: bool = True):
        me = cfg.shard(shard_id)
        self.cfg = cfg
        self.shard_id = int(shard_id)
        self.bind = bind if bind is not None else me.ip
        self.port = int(port) if port is not None else me.port
        self.mtu = cfg.mtu
        self.dedup_window = int(dedup_window)
        self.max_msg_bytes = int(max_msg_bytes)
        self.fixed_length = bool(fixed_length)
        # (client_id, msg_id) -> (msg_type, dtype, table_id, num_keys, msg_len) of announced data
        self._announced: collections.OrderedDict[tuple[int, int], tuple] = collections.OrderedDict()
        self.tables: dict[int, TableShard] = {t.id: TableShard(t, cfg.seed, capacity=64) for t in cfg.tables}
        self._reasm = Reassembler(max_pending=1024, timeout_s=reassembly_timeout_s, expect="request")
        self._applied: collections.OrderedDict[tuple[int, int], tuple] = collections.OrderedDict()
        self._transport: asyncio.DatagramTransport | None = None
        self._expire_handle: asyncio.TimerHandle | None = None
        self._c: collections.Counter = collections.Counter()
        self._drops: collections.Counter = collections.Counter({r: 0 for r in consts.DROP_REASONS + SERVER_DROP_REASONS})
        self._errors: collections.Counter = collections.Counter()
        self._requests: collections.Counter = collections.Counter()
        self._replies: collections.Counter = collections.Counter()  # reply messages by msg_type value
        self._svc = ServiceTimes()
        self.started_at: float | None = None
        self._dur = None
        self.durable_failed = False
        if checkpoint_dir is not None or restore is not None:
            from .durability import Durability

            self._dur = Durability(checkpoint_dir if checkpoint_dir is not None else restore, self.shard_id,
                                   cfg.seed, checkpoint_every=checkpoint_every, fsync=log_fsync)
            if restore is not None:
                if checkpoint_dir is not None and str(checkpoint_dir) != str(restore):
                    src = Durability(restore, self.shard_id, cfg.seed, fsync=log_fsync)
                    rep = src.restore(self.tables, self._applied, self.dedup_window)
                    src.close()
                    self._dur.start_fresh()
                    self._dur.restored = rep
                    self._dur.checkpoint(self.tables, self._applied)
                else:
                    rep = self._dur.restore(self.tables, self._applied, self.dedup_window)
                log.info("shard %d restored from %s: checkpoint %s, %d updates replayed from the log%s", self.shard_id,
                         restore, rep["checkpoint"], rep["replayed"],
                         "" if rep["corrupt"] is None else f"; bad log tail cut off ({rep['corrupt']['reason']})")
            else:
                self._dur.start_fresh()

    # -- durability -----------------------------------------------------------------------------

    def checkpoint(self) -> str | None:
        """Write a checkpoint now (between messages: a consistent point); returns its path, or
        None without ``checkpoint_dir``.

        Raises:
            OSError: it could not be written (the log stays whole; the shard keeps serving).
        """
        if self._dur is None:
            return None
        p = str(self._dur.checkpoint(self.tables, self._applied))
        log.info("shard %d: checkpoint %s", self.shard_id, p)
        return p

    def _commit_log(self) -> bool:
        """Make the logged updates durable; False (and stop serving) if the disk refused: their
        acks must not leave."""
        if self._dur is None or self.durable_failed:
            return not self.durable_failed
        try:
            self._dur.commit()
        except OSError as e:
            self.durable_failed = True
            self._c["log_errors"] += 1
            log.error("shard %d: cannot write the log in %s (%s): no more acks; stopping", self.shard_id,
                      self._dur.dir, e)
            self.stop()
            return False
        if self._dur.due:
            try:
                self.checkpoint()
            except OSError as e:
                self._c["checkpoint_errors"] += 1
                log.error("shard %d: checkpoint failed (%s); the log is kept whole", self.shard_id, e)
        return True

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """(ip, port) actually bound (after :meth:`start`)."""
        if self._transport is None:
            return self.bind, self.port
        return self._transport.get_extra_info("sockname")[:2]

    async def start(self) -> tuple[str, int]:
        """Bind the UDP socket and start serving on the running loop.

        Returns:
            (ip, port) bound.

        Raises:
            OSError: the address cannot be bound (``EADDRINUSE``, ``EADDRNOTAVAIL``).
        """
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            set_socket_buffers(sock, SOCK_BUF)
            sock.bind((self.bind, self.port))
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        await loop.create_datagram_endpoint(lambda: _Protocol(self), sock=sock)
        self.started_at = time.monotonic()
        self._schedule_expire(loop)
        return self.address

    def _schedule_expire(self, loop: asyncio.AbstractEventLoop) -> None:
        def tick():
            try:
                self._reasm.expire()
            finally:
                self._expire_handle = loop.call_later(0.5, tick)

        self._expire_handle = loop.call_later(0.5, tick)

    def stop(self) -> None:
        """Stop serving and close the socket (call on the server's loop). Idempotent."""
        if self._expire_handle is not None:
            self._expire_handle.cancel()
            self._expire_handle = None
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    # -- observability ------------------------------------------------------------------------

    def counters(self) -> dict[str, Any]:
        """Counters of this shard (a snapshot; JSON-serialisable).

        Keys: ``shard``, ``rx_frames``, ``rx_bytes``, ``tx_frames``, ``tx_bytes`` (bytes are UDP
        payload bytes), ``requests`` (complete requests by type), ``lookup_keys``,
        ``updates_applied``, ``update_keys``, ``duplicates`` (re-acked, not applied),
        ``replies`` (reply messages by type), ``errors`` (ERROR replies by status), ``drops`` (frames by reason, every reason
        present), ``reassembly`` (``pending``, ``expired``, ``evicted``, ``duplicate_frames``),
        ``internal_errors``, ``send_errors``, ``dedup_entries``, ``rows`` (materialised rows
        per table id), ``service`` (per-message service times: ``hist``, log2 µs buckets, and
        ``sum_ns``, :class:`~.metrics.ServiceTimes`); with ``checkpoint_dir`` also ``durability`` (log records, bytes and
        commits, checkpoints, the restore report, ``log_errors``, ``checkpoint_errors``).
        """
        c = self._c
        drops = collections.Counter(self._drops)
        drops.update(self._reasm.drops)
        rs = self._reasm.stats
        return {
            "shard": self.shard_id,
            "rx_frames": c["rx_frames"], "rx_bytes": c["rx_bytes"],
            "tx_frames": c["tx_frames"], "tx_bytes": c["tx_bytes"],
            "requests": {t.name: self._requests[t] for t in (MsgType.LOOKUP_REQ, MsgType.UPDATE_REQ,
                                                             MsgType.SIZE_REQ)},
            "announced": len(self._announced),
            "lookup_keys": c["lookup_keys"],
            "updates_applied": c["updates_applied"], "update_keys": c["update_keys"],
            "duplicates": c["duplicates"],
            "replies": {t.name: self._replies[t] for t in sorted(consts.REPLY_TYPES)},
            "errors": {s.name: self._errors[s] for s in Status if s != Status.OK},
            "drops": dict(drops),
            "reassembly": {"pending": len(self._reasm), "expired": rs["expired"], "evicted": rs["evicted"],
                           "duplicate_frames": rs["duplicates"]},
            "internal_errors": c["internal_errors"], "send_errors": c["send_errors"],
            "dedup_entries": len(self._applied),
            "rows": {str(tid): len(ts) for tid, ts in self.tables.items()},
            "service": self._svc.as_dict(),
            **({} if self._dur is None else {"durability": {**self._dur.counters(), "log_errors": c["log_errors"],
                                                             "checkpoint_errors": c["checkpoint_errors"]}}),
        }

    def state_dict(self) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``{table_id: (keys uint64 (M,) sorted, rows float32 (M, dim), acc float32 (M,))}`` of the
        rows this shard has updated (see :meth:`TableShard.state`)."""
        return {tid: ts.state() for tid, ts in self.tables.items()}

    # -- data path ----------------------------------------------------------------------------

    def _send(self, frames: list[bytes], addr) -> None:
        tr = self._transport
        if tr is None:
            return
        self._replies[frames[0][3]] += 1  # one reply message (byte 3: msg_type)
        for f in frames:
            tr.sendto(f, addr)
            self._c["tx_frames"] += 1
            self._c["tx_bytes"] += len(f)

    def _reply_error(self, h: Header, status: Status, addr) -> None:
        """ERROR reply to request header ``h`` (copies what is valid of its fields)."""
        dtype = h.dtype if h.dtype <= 2 else 0
        frames = codec.encode_message(MsgType.ERROR, msg_id=h.msg_id, client_id=h.client_id,
                                      table_id=h.table_id, shard_id=self.shard_id, dim=h.dim, dtype=dtype,
                                      num_keys=h.num_keys, status=int(status), mtu=self.mtu)
        self._errors[status] += 1
        self._send(frames, addr)

    def handle_datagram(self, data: bytes, addr) -> None:
        """Process one UDP payload from ``addr``. Never raises."""
        self._c["rx_frames"] += 1
        self._c["rx_bytes"] += len(data)
        h = None
        try:
            try:
                h = codec.parse_header(data, expect="request")
            except FrameError as e:
                self._drops[e.reason] += 1
                self._answer_malformed(data, addr)
                return
            if h.msg_len > self.max_msg_bytes:
                self._drops["too_large"] += 1
                if h.frag_index == 0:
                    self._reply_error(h, Status.MALFORMED, addr)
                return
            status = self._check_header(h)
            if status is not None:
                self._drops["refused"] += 1  # every fragment: the others were counted nowhere
                if h.frag_index == 0:
                    self._reply_error(h, status, addr)
                return
            if self.fixed_length and h.msg_type != MsgType.SIZE_REQ:
                ann = self._announced.get((h.client_id, h.msg_id))
                if ann is None:
                    self._drops["unannounced"] += 1
                    return
                if ann != (h.msg_type, h.dtype, h.table_id, h.num_keys, h.msg_len):
                    self._drops["size_mismatch"] += 1
                    if h.frag_index == 0:
                        self._reply_error(h, Status.MALFORMED, addr)
                    return
            msg = self._reasm.feed(data, addr, header=h)
            if msg is not None:
                self._handle_message(msg)
        except Exception:  # noqa: BLE001 - one bad datagram must not stop the shard
            self._c["internal_errors"] += 1
            log.exception("shard %d: internal error handling a frame from %s", self.shard_id, addr)
            if h is not None:
                try:
                    self._reply_error(h, Status.INTERNAL, addr)
                except Exception:  # noqa: BLE001
                    pass

    def _answer_malformed(self, data: bytes, addr) -> None:
        """Answer MALFORMED to a request that failed validation but whose magic, version and
        type are right (fragment 0 only); anything else is only dropped."""
        if len(data) < consts.HDR_LEN:
            return
        h = codec.unpack_header(data)
        if h.magic != consts.MAGIC or h.version != consts.VERSION or h.msg_type not in consts.REQUEST_TYPES:
            return
        if h.frag_index == 0:
            self._reply_error(h, Status.MALFORMED, addr)

    def _check_header(self, h: Header) -> Status | None:
        if h.shard_id != self.shard_id:
            return Status.WRONG_SHARD
        if h.msg_type == MsgType.SIZE_REQ:
            return None  # entries are checked on the whole message (_size)
        ts = self.tables.get(h.table_id)
        if ts is None:
            return Status.UNKNOWN_TABLE
        if h.dim != ts.dim or h.dtype != ts.table.wire_dtype:
            return Status.DIM_MISMATCH
        if h.msg_type == MsgType.LOOKUP_REQ and h.num_keys > consts.max_keys_per_message(
                MsgType.LOOKUP_REQ, h.dim, h.dtype, self.mtu):
            return Status.MALFORMED  # its reply would need more than consts.MAX_FRAGS fragments
        return None

    def _check_keys(self, ts: TableShard, keys: np.ndarray) -> None:
        if ts.table.rows is not None and int(keys.max()) >= ts.table.rows:
            raise _Refused(Status.KEY_OUT_OF_RANGE)
        if not bool(owns(self.cfg, ts.table.id, self.shard_id, keys).all()):
            raise _Refused(Status.NOT_OWNER)

    def _handle_message(self, msg: Message) -> None:
        h = msg.header
        self._requests[MsgType(h.msg_type)] += 1
        if h.msg_type == MsgType.SIZE_REQ:
            self._size(msg)
            return
        ts = self.tables[h.table_id]
        try:
            if h.msg_type == MsgType.LOOKUP_REQ:
                self._lookup(ts, msg)
            else:
                self._update(ts, msg)
        except _Refused as r:
            self._reply_error(h, r.status, msg.addr)

    def _size(self, msg: Message) -> None:
        """SIZE_REQ: check every entry (a data request type, a table of this cluster with its
        dtype, ``msg_len`` = the type's formula, ``num_keys`` ≥ 1, within ``max_msg_bytes``),
        remember them all and answer SIZE_ACK — or ERROR MALFORMED, remembering none."""
        h = msg.header
        e = codec.body_to_size_entries(msg.body, h.num_keys)
        mt, tid = e["msg_type"].astype(np.int64), e["table_id"].astype(np.int64)
        nk, ml = e["num_keys"].astype(np.int64), e["msg_len"].astype(np.int64)
        dim = np.full(len(e), -1, np.int64)
        wdt = np.full(len(e), -1, np.int64)
        for t in np.unique(tid).tolist():  # one pass per table, not per entry
            ts = self.tables.get(t)
            if ts is not None:
                dim[tid == t], wdt[tid == t] = ts.dim, ts.table.wire_dtype
        esize = np.where(wdt == 1, 4, np.where(wdt == 2, 2, 0))
        want = np.where(mt == MsgType.LOOKUP_REQ, consts.KEY_SIZE * nk, nk * (consts.KEY_SIZE + dim * esize))
        ok = (((mt == MsgType.LOOKUP_REQ) | (mt == MsgType.UPDATE_REQ)) & (dim >= 0) & (e["dtype"] == wdt)
              & (nk > 0) & (ml == want) & (ml <= self.max_msg_bytes))
        if not bool(ok.all()):
            self._reply_error(h, Status.MALFORMED, msg.addr)
            return
        ann = self._announced
        for row in zip(e["msg_id"].tolist(), mt.tolist(), e["dtype"].tolist(), tid.tolist(), nk.tolist(),
                       ml.tolist()):  # one dict entry per announced message
            k = (h.client_id, row[0])
            ann[k] = row[1:]
            ann.move_to_end(k)
        while len(ann) > self.dedup_window:
            ann.popitem(last=False)
        self._send(codec.encode_reply(h, MsgType.SIZE_ACK, shard_id=self.shard_id, mtu=self.mtu), msg.addr)

    def _lookup(self, ts: TableShard, msg: Message) -> None:
        h = msg.header
        keys = codec.body_to_keys(msg.body, h.num_keys)
        self._check_keys(ts, keys)
        rows = ts.lookup(keys)
        self._c["lookup_keys"] += h.num_keys
        self._send(codec.encode_reply(h, MsgType.LOOKUP_REPLY, shard_id=self.shard_id,
                                      body=codec.rows_to_body(rows, h.dtype), mtu=self.mtu), msg.addr)

    def _update(self, ts: TableShard, msg: Message) -> None:
        h = msg.header
        key = (h.client_id, h.msg_id)
        fp = (h.table_id, h.num_keys, h.dim, h.dtype, zlib.crc32(msg.body))
        if self._applied.get(key) == fp:
            self._c["duplicates"] += 1
            self._applied.move_to_end(key)
        else:
            keys, grads = codec.split_update_body(msg.body, h.num_keys, h.dim, h.dtype)
            self._check_keys(ts, keys)
            g = grads.astype(np.float32)
            if not is_unique(keys) or not gradient_ok(ts.table, g):
                raise _Refused(Status.MALFORMED)
            if self._dur is not None:
                self._dur.append(h.client_id, h.msg_id, fp, msg.body)
            ts.apply(keys, g)
            self._c["updates_applied"] += 1
            self._c["update_keys"] += h.num_keys
            self._applied[key] = fp
            self._applied.move_to_end(key)
            while len(self._applied) > self.dedup_window:
                self._applied.popitem(last=False)
        if self._sync_each and not self._commit_log():
            return
        self._send(codec.encode_reply(h, MsgType.UPDATE_ACK, shard_id=self.shard_id, mtu=self.mtu), msg.addr)


# The runners (ServerThread, ServerCluster, run_server, ...) moved to .runner; old imports of
# them from this module keep working (resolved on first use: .runner imports this module).
_MOVED = ("ENGINES", "make_server", "ServerThread", "ServerCluster", "run_server", "describe",
          "bind_error_message", "LOG_FORMAT")


def __getattr__(name: str):
    if name in _MOVED:
        from . import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
