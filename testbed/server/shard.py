"""A parameter-server shard: the readable reference server (asyncio, one datagram at a time).

``embnic server`` runs the batch engine (:mod:`embnic.testbed.server.engine`) by default; it
answers exactly as this server does and hands it every frame its fast path does not take, so
the rules below are the rules of both (docs/server.md). ``--engine reference`` runs this one.
Started as ``embnic server --shard I --config F``, as ``python -m embnic.testbed.server --shard I
--config F`` (what the testbed runs), or in process with :class:`~.runner.ServerThread` /
:class:`~.runner.ServerCluster` (either engine; :mod:`.runner`; a process of its own:
:func:`~.foreground.run_server`). Wiring::

    client ──UDP (LOOKUP_REQ / UPDATE_REQ, fragmented)──▶ shard I  (bind ip:port, config)
       ▲                                                     │ Reassembler → handle → TableShard
       └──────────UDP (LOOKUP_REPLY / UPDATE_ACK / ERROR)────┘ to the request's source address

What it does with every datagram (docs/protocol.md, version 2: a request carries several
tables, each with its own ``dim`` and ``dtype``, listed in the body's directory):

1. **Validate** the header (:func:`~embnic.client_lib.codec.parse_header`, requests only). A
   frame that does not parse is dropped and counted by reason (``too_short``, ``bad_magic``,
   ``bad_version`` — version-1 frames too —, ``bad_type``, ``bad_length``, ``too_many_frags``,
   ``frag_mismatch``); if its magic, version and type are right (a request whose lengths do
   not add up) the server also answers ``ERROR MALFORMED`` — once per message, on fragment 0.
   Requests larger than ``max_msg_bytes`` are dropped as ``too_large`` (answered MALFORMED),
   before any buffer is allocated for them.
2. **Header checks** on every fragment, answered on fragment 0 only (so a bad message of many
   fragments draws one ERROR, ``table_id`` ``NO_TABLE``): ``WRONG_SHARD`` (``shard_id`` is not
   this shard) and ``MALFORMED`` for a lookup whose reply (``value_len`` bytes) would need more
   than ``MAX_FRAGS`` fragments. Every frame refused here is dropped and counted as
   ``refused``, answered or not.
3. **Reassemble** (:class:`~embnic.client_lib.reassembly.Reassembler`, any order, duplicates).
4. **Body checks** on the whole message, answered with **one** ERROR and nothing of the message
   applied: the directory must add up to the header (:func:`~embnic.client_lib.codec.parse_request_body`,
   ``MALFORMED``); then table by table in directory order (:meth:`ShardServer._table_fault`; the
   first bad table is named in the ERROR's ``table_id``): ``UNKNOWN_TABLE``, ``DIM_MISMATCH``
   (the entry's ``dim`` or ``dtype`` differs from the table's), ``KEY_OUT_OF_RANGE`` (a key
   ``>= rows``, for a table with ``rows``; without it every uint64 is a key), ``NOT_OWNER`` (a
   key another shard owns under the cluster's sharding policy,
   :func:`~embnic.client_lib.routing.owns`), ``MALFORMED`` (an update's duplicate keys within a
   table, or a gradient the optimizer must not apply — NaN/inf, or a step that overflows
   float32, :func:`~embnic.client_lib.table_numerics.gradient_rows_ok`).
5. **Serve**: LOOKUP_REQ → one LOOKUP_REPLY with the rows of every table in directory order,
   each in key order; UPDATE_REQ → every table's gradients applied with its optimizer
   (:class:`~embnic.client_lib.rowstore.TableShard`: SGD or row-wise Adagrad, the same
   code as the in-process reference) → UPDATE_ACK. Replies are fragmented to the cluster MTU
   and sent to the request's source address and port.

**Exactly once** (:mod:`.window`, the one implementation of both engines). The server remembers
every update it acknowledged, up to ``dedup_window`` (default 65536) of them and for at most
``dedup_age_s`` (30 min), each by ``(client_id, msg_id)`` *and* fingerprint — (num_tables,
num_keys, value_len, CRC-32 of the body) —, not only the latest per id. An update whose id and
fingerprint are remembered is a duplicate: re-acked, not applied — also after another update
reused its id. Updates that were refused (ERROR) are not remembered.

**Lost updates, fragment by fragment.** A client that saw no ack for an update of several
fragments re-sends its last fragment (``RETRANSMIT``), a *poll* (:func:`is_poll`): served as
usual if it completes the update, else answered ``UPDATE_ACK`` if the window holds an update of
that id whose last fragment it is, byte for byte (same counts, same offset, same CRC-32 of the
fragment's bytes: its ack was lost), else ``UPDATE_NACK`` with a bitmap of the fragments
held — and the client re-sends exactly the others.

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
from typing import Any

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.codec import DirectoryError, FrameError, Header, RequestBody
from embnic.client_lib.sockets import SOCK_BUF, set_socket_buffers
from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.consts import DType, MsgType, Status
from embnic.client_lib.reassembly import Message, Reassembler, fragment_size
from embnic.client_lib.routing import owns, owns_tables
from embnic.client_lib.config import TableConfig
from embnic.client_lib.rowstore import TableShard
from embnic.client_lib.table_numerics import rowwise_mean_square_ragged

from .durability import Durability
from .metrics import ServiceTimes
from .stores import ShardStores, open_tables
from .window import DEFAULT_MAX_AGE_S, UpdateWindow, fingerprint, tail_of

log = logging.getLogger("embnic.server")

DEFAULT_DEDUP_WINDOW = 65536  #: remembered applied updates (docs/protocol.md, "Reliability")
DEFAULT_MAX_MSG_BYTES = 64 << 20  #: largest request body accepted, bytes
#: extra drop reasons of the server (besides consts.DROP_REASONS); ``refused``: a frame of a
#: request the header checks refused (fragment 0 also draws the ERROR reply)
SERVER_DROP_REASONS = ("too_large", "unannounced", "size_mismatch", "refused")


_F32_MAX = float(np.finfo(np.float32).max)


def gradient_bound(table: TableConfig) -> float:
    """A bound B on |g| below which no gradient row of ``table`` is refused by
    :func:`~embnic.client_lib.table_numerics.gradient_rows_ok` (a sufficient condition, not the
    rule: rows at or above B are checked with the rule itself).

    Adagrad: every ``g²`` ≤ B² = f32max / (4·dim), so the float32 sum of a row's squares stays
    below f32max / 4 — finite with room for rounding. SGD: ``|lr·g|`` ≤ f32max / 2 (``float32(lr)``
    differs from ``lr`` by 2^-24 relative); any finite g when ``lr`` is 0.
    """
    if table.optimizer == "adagrad":
        return float(np.sqrt(_F32_MAX / (4.0 * table.dim)))
    lr = abs(float(table.lr))
    return _F32_MAX / (2.0 * lr) if lr > 0 else float("inf")


def is_poll(h: Header) -> bool:
    """A **poll** (docs/protocol.md, "Reliability"): the last fragment of an UPDATE_REQ of several
    fragments, re-sent (``RETRANSMIT``) by a client that saw no ack. Only the last fragment polls,
    so the fragments a client re-sends after an UPDATE_NACK (never the last: the poll brought it)
    draw no NACK of their own."""
    return (h.msg_type == MsgType.UPDATE_REQ and h.flags & consts.Flags.RETRANSMIT and h.frag_count > 1
            and h.frag_index == h.frag_count - 1)


def last_fragment_offset(h: Header) -> int:
    """The byte offset of the last fragment of the message of fragment header ``h`` (any of its
    fragments: they all give the fragment size P, :func:`~embnic.client_lib.reassembly.fragment_size`):
    ``(frag_count - 1) · P``; 0 for a message of one fragment."""
    if h.frag_count <= 1:
        return 0
    return (h.frag_count - 1) * fragment_size(h)


class _Refused(Exception):
    """A request is answered with ERROR ``status`` naming ``table_id`` (``NO_TABLE``: the whole message)."""

    def __init__(self, status: Status, table_id: int = consts.NO_TABLE):
        self.status = status
        self.table_id = int(table_id)


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
        dedup_age_s: seconds the exactly-once window remembers an update at most (:mod:`.window`).
        max_msg_bytes: largest request body accepted (bytes); larger are dropped ``too_large``.
        reassembly_timeout_s: incomplete requests are forgotten after this long (s).
        fixed_length: the fixed-length baseline (docs/protocol.md, "Size messages"): data
            requests must have been announced by a SIZE_REQ of their client (else dropped as
            ``unannounced``) with the same type, ``num_tables``, ``num_keys`` and ``msg_len``
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
        stores: the table store to serve (:class:`~.stores.ShardStores` of this config and shard:
            a store per table, the in-memory ones in one ``RowStore``); the shard closes it
            (:meth:`close_stores`). None: opened for the config by :func:`~.stores.open_tables`
            (disk tables under ``checkpoint_dir`` or ``restore``).

    Raises:
        KeyError: ``shard_id`` is not in the config.
        DurabilityError: ``restore`` holds another shard's or other tables' checkpoint, or
            ``checkpoint_dir`` already holds a log (without ``restore``).
    """

    #: commit the log before each update's ack (the reference: one message per callback); the
    #: batch engine commits once per wake-up instead
    _sync_each = True
    #: ``(index, N)``: worker ``index`` of a ``--workers N`` shard (set by the batch engine before
    #: this class's ``__init__``; each worker keeps disk tables of its own)
    _worker = (0, 1)

    def __init__(self, cfg: ClusterConfig, shard_id: int, bind: str | None = None, port: int | None = None, *,
                 dedup_window: int = DEFAULT_DEDUP_WINDOW, dedup_age_s: float = DEFAULT_MAX_AGE_S,
                 max_msg_bytes: int = DEFAULT_MAX_MSG_BYTES, reassembly_timeout_s: float = 2.0, fixed_length: bool = False,
                 checkpoint_dir: str | None = None, checkpoint_every: int = 0,
                 restore: str | None = None, log_fsync: bool = True, stores: ShardStores | None = None):
        me = cfg.shard(shard_id)
        self.cfg = cfg
        self.shard_id = int(shard_id)
        self.bind = bind if bind is not None else me.ip
        self.port = int(port) if port is not None else me.port
        self.mtu = cfg.mtu
        self.dedup_window = int(dedup_window)
        self.max_msg_bytes = int(max_msg_bytes)
        self.fixed_length = bool(fixed_length)
        # (client_id, msg_id) -> (msg_type, num_tables, num_keys, msg_len) of announced data
        self._announced: collections.OrderedDict[tuple[int, int], tuple] = collections.OrderedDict()
        #: every in-memory table's rows in one arena with one index (one gather per message, whatever
        #: its tables); ``tables`` holds a :class:`TableShard` view of it per table — a table whose
        #: rows live in another store (``store = "disk"``: its own object with TableShard's
        #: interface, :mod:`.stores`) is served through that object, one call per such table
        #: (:meth:`_rows_lookup`, :meth:`_rows_apply`)
        if stores is None:
            stores = open_tables(cfg, self.shard_id, checkpoint_dir if checkpoint_dir is not None else restore,
                                 worker=self._worker)
        self._stores = stores
        self.store = self._stores.store
        self.tables: dict[int, TableShard] = self._stores.tables
        # per table id (65536 entries; what _table_fault reads as vectors): dim (-1: no such
        # table), wire dtype, rows bound (and whether there is one), every key ours (one shard,
        # or this table's shard under table sharding: no key need be hashed), and the largest
        # |gradient| whose step cannot overflow (gradient_bound)
        self._tdim = np.full(1 << 16, -1, np.int64)
        self._tdt = np.zeros(1 << 16, np.int64)
        self._trows = np.zeros(1 << 16, np.uint64)
        self._thas_rows = np.zeros(1 << 16, bool)
        self._towns_all = np.zeros(1 << 16, bool)
        self._tgbound = np.zeros(1 << 16, np.float64)
        self._tada = np.zeros(1 << 16, bool)  # row-wise Adagrad (else SGD)
        self._tlr = np.zeros(1 << 16, np.float32)
        for t in cfg.tables:
            self._tdim[t.id], self._tdt[t.id] = t.dim, int(t.wire_dtype)
            if t.rows is not None:
                self._trows[t.id], self._thas_rows[t.id] = t.rows, True
            self._towns_all[t.id] = (bool(owns(cfg, t.id, self.shard_id, np.zeros(1, np.uint64))[0])
                                     and (len(cfg.shards) == 1 or cfg.sharding == "table"))
            self._tgbound[t.id] = gradient_bound(t)
            self._tada[t.id], self._tlr[t.id] = t.optimizer == "adagrad", np.float32(t.lr)
        self._in_store = np.zeros(1 << 16, bool)  # per table id: its rows are in self.store
        for tid, ts in self.tables.items():
            self._in_store[tid] = isinstance(ts, TableShard) and ts.store is self.store
        #: tables whose store may take no writes for a while (the disk tier on a full disk), asked
        #: before an update is taken (:meth:`_store_fault`)
        self._disk_tids = frozenset(tid for tid, ts in self.tables.items() if hasattr(ts, "writable"))
        #: the largest lookup reply (value_len) that fits MAX_FRAGS fragments at the cluster MTU
        self.max_reply_bytes = consts.MAX_FRAGS * consts.max_body_per_frame(cfg.mtu)
        self._reasm = Reassembler(max_pending=1024, timeout_s=reassembly_timeout_s, expect="request")
        #: the exactly-once window (:mod:`.window`): every acknowledged update by id and fingerprint
        self._applied = UpdateWindow(self.dedup_window, dedup_age_s)
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
        try:
            if checkpoint_dir is not None or restore is not None:
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
                    log.info("shard %d restored from %s: %s, %d updates replayed from the log%s", self.shard_id,
                             restore, f"checkpoint {rep['checkpoint']}" if rep["checkpoint"] else "no checkpoint (the log alone)",
                             rep["replayed"],
                             "" if rep["corrupt"] is None else f"; bad log tail cut off ({rep['corrupt']['reason']})")
                else:
                    self._dur.start_fresh()
        except BaseException:
            if self._dur is not None:
                self._dur.close()
            self._stores.close()
            raise

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

    def close_stores(self) -> None:
        """Close the tables' disk stores (:mod:`.stores`; a scratch directory is removed). After
        the shard stopped; idempotent."""
        self._stores.close()

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
        ``update_polls`` (re-sent last fragments of updates, :func:`is_poll`), ``update_poll_acks``
        (polls of applied updates, acked from the window: lost acks; not in ``duplicates``,
        which counts complete updates re-acked),
        ``update_nacks`` (polls of incomplete updates answered with the fragments held),
        ``replies`` (reply messages by type), ``errors`` (ERROR replies by status), ``drops`` (frames by reason, every reason
        present), ``reassembly`` (``pending``, ``expired``, ``evicted``, ``duplicate_frames``),
        ``internal_errors``, ``send_errors``, ``dedup_entries``, ``rows`` (materialised rows
        per table id), ``service`` (per-message service times: ``hist``, log2 µs buckets, and
        ``sum_ns``, :class:`~.metrics.ServiceTimes`); with disk tables ``stores`` (the disk tier,
        :meth:`.stores.ShardStores.counters`); with ``checkpoint_dir`` also ``durability`` (log records, bytes and
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
            "duplicates": c["duplicates"], "update_polls": c["update_polls"],
            "update_poll_acks": c["update_poll_acks"], "update_nacks": c["update_nacks"],
            "replies": {t.name: self._replies[t] for t in sorted(consts.REPLY_TYPES)},
            "errors": {s.name: self._errors[s] for s in Status if s != Status.OK},
            "drops": dict(drops),
            "reassembly": {"pending": len(self._reasm), "expired": rs["expired"], "evicted": rs["evicted"],
                           "duplicate_frames": rs["duplicates"]},
            "internal_errors": c["internal_errors"], "send_errors": c["send_errors"],
            "dedup_entries": len(self._applied),
            "rows": {str(tid): len(ts) for tid, ts in self.tables.items()},
            "service": self._svc.as_dict(),
            **({"stores": self._stores.counters()} if self._stores.env is not None else {}),
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

    def _reply_error(self, h: Header, status: Status, addr, table_id: int = consts.NO_TABLE) -> None:
        """ERROR reply to request header ``h`` (``num_tables``, ``num_keys``, ``value_len``
        copied) naming ``table_id`` (:data:`consts.NO_TABLE`: the whole message)."""
        frames = codec.encode_reply(h, MsgType.ERROR, shard_id=self.shard_id, status=int(status),
                                    table_id=table_id, mtu=self.mtu)
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
                if ann != (h.msg_type, h.num_tables, h.num_keys, h.msg_len):
                    self._drops["size_mismatch"] += 1
                    if h.frag_index == 0:
                        self._reply_error(h, Status.MALFORMED, addr)
                    return
            if is_poll(h):
                self._poll(h, data, addr)
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

    def _poll(self, h: Header, data: bytes, addr) -> None:
        """A poll (:func:`is_poll`: the last fragment of an update of several, re-sent), taken like
        any fragment first: if it completes the update, the update is served as usual (applied,
        or re-acked as a duplicate); else, when the exactly-once window holds an update of this id
        whose last fragment this is, byte for byte (:meth:`.UpdateWindow.poll_ack`: applied, its
        ack was lost), ``UPDATE_ACK`` — the fragments held again are
        dropped; else ``UPDATE_NACK`` with the bitmap of the fragments held (docs/protocol.md,
        "Reliability"). A poll the reassembler refuses (it contradicts the fragments held) and
        that the window does not know is not answered."""
        self._c["update_polls"] += 1
        drops = self._reasm.drops.total()
        msg = self._reasm.feed(data, addr, header=h)
        if msg is not None:
            self._handle_message(msg)
            return
        if self._applied.poll_ack(h.client_id, h.msg_id, h.num_tables, h.num_keys, h.value_len, h.frag_offset,
                                  memoryview(data)[consts.HDR_LEN:consts.HDR_LEN + h.frag_len]):
            self._c["update_poll_acks"] += 1
            self._reasm.discard(h.client_id, h.msg_id, MsgType.UPDATE_REQ)
            self._send(codec.encode_reply(h, MsgType.UPDATE_ACK, shard_id=self.shard_id, mtu=self.mtu), addr)
            return
        part = self._reasm.partial(h.client_id, h.msg_id, MsgType.UPDATE_REQ)
        if part is not None and self._reasm.drops.total() == drops:  # not a contradicting fragment
            self._c["update_nacks"] += 1
            self._send(codec.encode_reply(h, MsgType.UPDATE_NACK, shard_id=self.shard_id,
                                          body=codec.nack_body(part[1]), mtu=self.mtu), addr)

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
        """What a fragment's header alone refuses: another shard's request (``WRONG_SHARD``), or
        a lookup whose reply (``value_len`` bytes) needs more than ``MAX_FRAGS`` fragments
        (``MALFORMED``). Everything about tables is in the body (:meth:`_table_fault`)."""
        if h.shard_id != self.shard_id:
            return Status.WRONG_SHARD
        if h.msg_type == MsgType.LOOKUP_REQ and h.value_len > self.max_reply_bytes:
            return Status.MALFORMED
        return None

    def _table_fault(self, h: Header, rb: RequestBody, grads: tuple | None = None) -> tuple[Status, int] | None:
        """The first bad table of a request in directory order, as ``(status, table_id)``, or
        None when every table may be served (docs/protocol.md, "Errors"). Per table, in this
        order: ``UNKNOWN_TABLE``, ``DIM_MISMATCH`` (``dim`` or ``dtype``), ``KEY_OUT_OF_RANGE``,
        ``NOT_OWNER``, and for an update ``MALFORMED`` for duplicate keys within the table or a
        gradient row :func:`~embnic.client_lib.table_numerics.gradient_rows_ok` refuses.

        Vectorised over the message's tables and keys: one range compare and one owner hash
        (:func:`~embnic.client_lib.routing.owns_tables`) over all keys; duplicates by one
        sortedness test (the keys of the tables not strictly increasing then sorted by (table,
        key) at once: a duplicate is a neighbour); gradients by one bound on |g| per table
        (:func:`gradient_bound`: below it no row can be refused), the rule itself only on the
        rows of the tables above it, all at once (:meth:`_grads_ok`). No per-table loop.

        Args:
            h: the request header; rb: its parsed body (:func:`codec.parse_request_body`).
            grads: an update's gradients (:meth:`_grads`: the flat float32 values and each
                table's element offsets).
        """
        d = rb.directory
        tids = d["table_id"].astype(np.int64)
        ko = rb.key_offsets
        counts = np.diff(ko)
        starts = ko[:-1]
        keys = rb.keys
        tdim = self._tdim[tids]
        st = np.where(tdim < 0, int(Status.UNKNOWN_TABLE), 0)
        st[(st == 0) & ((tdim != d["dim"]) | (self._tdt[tids] != d["dtype"]))] = Status.DIM_MISMATCH
        known = st == 0
        rows = self._thas_rows[tids] & known
        if rows.any():
            bad = np.repeat(rows, counts) & (keys >= np.repeat(self._trows[tids], counts))
            st[(st == 0) & np.logical_or.reduceat(bad, starts)] = Status.KEY_OUT_OF_RANGE
        hashed = (st == 0) & ~self._towns_all[tids]
        if hashed.any():
            sel = np.repeat(hashed, counts)
            mine = np.ones(keys.size, bool)
            mine[sel] = owns_tables(self.cfg, tids[hashed], counts[hashed], self.shard_id, keys[sel])
            st[(st == 0) & ~np.logical_and.reduceat(mine, starts)] = Status.NOT_OWNER
        if grads is not None:
            inc = np.ones(keys.size, bool)
            inc[1:] = keys[1:] > keys[:-1]
            inc[starts] = True  # a table's first key starts its run
            unsorted = (st == 0) & ~np.logical_and.reduceat(inc, starts)
            if unsorted.any():  # those tables' keys sorted by (table, key): a duplicate is a neighbour
                sel = np.repeat(unsorted, counts)
                seg = np.repeat(np.arange(tids.size), counts)[sel]
                k = keys[sel]
                o = np.lexsort((k, seg))
                ks, ss = k[o], seg[o]
                dup = (ks[1:] == ks[:-1]) & (ss[1:] == ss[:-1])
                st[np.unique(ss[1:][dup])] = Status.MALFORMED
            flat, eo = grads
            with np.errstate(invalid="ignore"):  # NaN gradients compare False: checked exactly below
                near = (st == 0) & ~(np.maximum.reduceat(np.abs(flat), eo[:-1]) < self._tgbound[tids])
            if near.any():  # gradient_rows_ok's rule on the rows of the tables near the bound
                st[near & ~self._grads_ok(tids, counts, flat, eo, near)] = Status.MALFORMED
        bad_t = np.flatnonzero(st)
        if bad_t.size == 0:
            return None
        t = int(bad_t[0])
        return Status(int(st[t])), int(tids[t])

    def _grads_ok(self, tids: np.ndarray, counts: np.ndarray, flat: np.ndarray, eo: np.ndarray,
                  which: np.ndarray) -> np.ndarray:
        """Per directory entry, whether every gradient row of the tables ``which`` (bool (T,))
        passes :func:`~embnic.client_lib.table_numerics.gradient_rows_ok` (True for the others):
        the rule itself — every value finite, and the step finite in float32 (an Adagrad row's
        mean square, an SGD value times ``lr``) — over all of them at once."""
        dims = self._tdim[tids]
        el = np.repeat(which, eo[1:] - eo[:-1])
        g = flat[el]
        n = np.where(which, counts, 0)
        rows_t = np.repeat(np.arange(tids.size), n)  # the directory entry of each row checked
        rdim = dims[rows_t]
        with np.errstate(over="ignore", invalid="ignore"):
            fin = np.isfinite(g)
            sgd = ~self._tada[tids]
            e_sgd = np.repeat(sgd[rows_t], rdim)
            fin[e_sgd] &= np.isfinite(np.repeat(self._tlr[tids][rows_t], rdim)[e_sgd] * g[e_sgd])
            row_ok = np.logical_and.reduceat(fin, np.r_[0, np.cumsum(rdim)[:-1]]) if rdim.size else fin[:0]
            ada = ~sgd[rows_t]
            if ada.any():
                gr = g[np.repeat(ada, rdim)]
                row_ok[ada] &= np.isfinite(rowwise_mean_square_ragged(gr, rdim[ada]))
        ok = np.ones(tids.size, bool)
        bad = np.unique(rows_t[~row_ok])
        ok[bad] = False
        return ok

    @staticmethod
    def _grads(rb: RequestBody) -> tuple[np.ndarray, np.ndarray]:
        """An update's gradients as float32: (the flat values of every table, table after table,
        row after row (V,); element offsets int64 (T+1,): table ``t``'s are ``flat[eo[t]:eo[t+1]]``,
        ``(n_t, dim_t)`` row-major). fp16 values widened exactly; an update of fp32 tables only
        is viewed in place, no copy. A fixed number of numpy calls whatever the tables."""
        d = rb.directory
        n = d["num_keys"].astype(np.int64) * d["dim"].astype(np.int64)
        eo = np.zeros(n.size + 1, np.int64)
        np.cumsum(n, out=eo[1:])
        fp32 = d["dtype"] == DType.FP32
        if bool(fp32.all()):
            return np.frombuffer(rb.values, np.float32, count=int(eo[-1])), eo
        if not fp32.any():
            return np.frombuffer(rb.values, "<f2", count=int(eo[-1])).astype(np.float32), eo
        # fp32 and fp16 tables in one message: every value's byte offset, then one gather per dtype
        es = np.where(fp32, 4, 2)
        e32 = np.repeat(fp32, n)
        at = np.repeat(rb.value_offsets[:-1] - eo[:-1] * es, n) + np.arange(int(eo[-1])) * np.repeat(es, n)
        b = np.frombuffer(rb.values, np.uint8)
        flat = np.empty(int(eo[-1]), np.float32)
        flat[e32] = b[at[e32][:, None] + np.arange(4)].view("<f4").reshape(-1)
        flat[~e32] = b[at[~e32][:, None] + np.arange(2)].view("<f2").reshape(-1)
        return flat, eo

    def _rows_lookup(self, tids: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Rows of the keys of directory segments ``tids``/``counts`` (int (S,)), ``keys`` uint64
        (Σ counts,): float32 flat (Σ counts·dim,), row after row — one search and one gather in
        :attr:`store` for every table it holds; a table in a store of its own, one call each."""
        if self._in_store[tids].all():
            return self.store.lookup_segments(tids, counts, keys)
        dims = self._tdim[tids]
        out = np.empty(int((counts * dims).sum()), np.float32)
        seg_in = self._in_store[tids]
        key_in = np.repeat(seg_in, counts)
        el_in = np.repeat(key_in, np.repeat(dims, counts))
        if seg_in.any():
            out[el_in] = self.store.lookup_segments(tids[seg_in], counts[seg_in], keys[key_in])
        ko = np.r_[0, np.cumsum(counts)]
        eo = np.r_[0, np.cumsum(counts * dims)]
        for s in np.flatnonzero(~seg_in).tolist():
            out[eo[s]:eo[s + 1]] = self.tables[int(tids[s])].lookup(keys[ko[s]:ko[s + 1]]).reshape(-1)
        return out

    def _rows_apply(self, tids: np.ndarray, counts: np.ndarray, keys: np.ndarray, flat: np.ndarray,
                    several: bool) -> None:
        """Apply gradients ``flat`` (float32 (Σ counts·dim,)) to the keys of directory segments
        ``tids``/``counts`` (the segments of one or several messages in arrival order, a table's
        keys unique within a segment; ``several``: a (table, key) may repeat across segments) —
        one call to :attr:`store` for every table it holds (:meth:`RowStore.apply_segments`);
        a table in a store of its own, one ``apply_segments`` each over its segments."""
        if self._in_store[tids].all():
            self.store.apply_segments(tids, counts, keys, flat, several)
            return
        dims = self._tdim[tids]
        seg_in = self._in_store[tids]
        key_in = np.repeat(seg_in, counts)
        el_in = np.repeat(key_in, np.repeat(dims, counts))
        if seg_in.any():
            self.store.apply_segments(tids[seg_in], counts[seg_in], keys[key_in], flat[el_in], several)
        for tid in np.unique(tids[~seg_in]).tolist():
            seg = tids == tid
            kt = np.repeat(seg, counts)
            offs = np.r_[0, np.cumsum(counts[seg])]
            self.tables[tid].apply_segments(keys[kt], flat[np.repeat(kt, np.repeat(dims, counts))].reshape(
                -1, int(self._tdim[tid])), offs)

    def _handle_message(self, msg: Message) -> None:
        h = msg.header
        self._requests[MsgType(h.msg_type)] += 1
        if h.msg_type == MsgType.SIZE_REQ:
            self._size(msg)
            return
        try:
            rb = codec.parse_request_body(h, msg.body)
        except DirectoryError as e:
            self._reply_error(h, Status(e.status), msg.addr, e.table_id)
            return
        try:
            if h.msg_type == MsgType.LOOKUP_REQ:
                self._lookup(msg, rb)
            else:
                self._update(msg, rb)
        except _Refused as r:
            self._reply_error(h, r.status, msg.addr, r.table_id)

    def _size(self, msg: Message) -> None:
        """SIZE_REQ: check every entry (a data request type, ``num_tables`` ≥ 1, ``num_keys`` ≥
        ``num_tables``, ``msg_len`` that fits the type — a lookup exactly ``16·T + 8·n``, an
        update at least ``16·T + 10·n`` with an even value part —, within ``max_msg_bytes``),
        remember them all and answer SIZE_ACK — or ERROR MALFORMED, remembering none. Tables are
        in the data messages' directories, checked when they come."""
        h = msg.header
        e = codec.body_to_size_entries(msg.body, h.num_keys)
        mt, nt = e["msg_type"].astype(np.int64), e["num_tables"].astype(np.int64)
        nk, ml = e["num_keys"].astype(np.int64), e["msg_len"].astype(np.int64)
        head = consts.DIR_ENTRY * nt + consts.KEY_SIZE * nk
        vals = ml - head
        fits = np.where(mt == MsgType.LOOKUP_REQ, vals == 0, (vals >= 2 * nk) & (vals % 2 == 0))
        ok = (((mt == MsgType.LOOKUP_REQ) | (mt == MsgType.UPDATE_REQ)) & (nt >= 1) & (nk >= nt) & fits
              & (ml <= self.max_msg_bytes))
        if not bool(ok.all()):
            self._reply_error(h, Status.MALFORMED, msg.addr)
            return
        ann = self._announced
        for row in zip(e["msg_id"].tolist(), mt.tolist(), nt.tolist(), nk.tolist(), ml.tolist()):
            k = (h.client_id, row[0])  # one dict entry per announced message
            ann[k] = row[1:]
            ann.move_to_end(k)
        while len(ann) > self.dedup_window:
            ann.popitem(last=False)
        self._send(codec.encode_reply(h, MsgType.SIZE_ACK, shard_id=self.shard_id, mtu=self.mtu), msg.addr)

    def _lookup(self, msg: Message, rb: RequestBody) -> None:
        """One LOOKUP_REPLY: every table's rows, in directory order, cast to its wire dtype."""
        h = msg.header
        fault = self._table_fault(h, rb)
        if fault is not None:
            raise _Refused(*fault)
        body = np.empty(h.value_len, np.uint8)
        ko, vo = rb.key_offsets.tolist(), rb.value_offsets.tolist()
        for t, tid in enumerate(rb.directory["table_id"].tolist()):
            ts = self.tables[tid]
            rows = ts.lookup(rb.keys[ko[t]:ko[t + 1]])
            body[vo[t]:vo[t + 1]] = rows.astype(codec.value_dtype(ts.table.wire_dtype)).reshape(-1).view(np.uint8)
        self._c["lookup_keys"] += h.num_keys
        self._send(codec.encode_reply(h, MsgType.LOOKUP_REPLY, shard_id=self.shard_id, body=body, mtu=self.mtu),
                   msg.addr)

    def _admit_update(self, h: Header, body, rb: RequestBody, last_offset: int | None = None) -> np.ndarray | None:
        """The exactly-once decision of one update, in arrival order (both engines): None for a
        duplicate (its id and fingerprint in the window, :class:`.UpdateWindow`: re-ack, apply
        nothing); else its gradients, float32 flat, table after table (:meth:`_grads`),
        after the update was checked (:meth:`_table_fault`), logged (write-ahead log) and put in
        the window — the caller applies them.

        Args:
            h: the update's header (ids and counts); body: its whole body (bytes-like);
            rb: the parsed body. last_offset: the byte offset of its last fragment
                (:func:`last_fragment_offset`; 0 for one fragment; None: unknown, and then no
                poll of it is acked from the window).

        Raises:
            _Refused: a table of it is refused (nothing logged or remembered).
        """
        fp = fingerprint(h.num_tables, h.num_keys, h.value_len, body)
        if self._applied.duplicate(h.client_id, h.msg_id, fp):
            self._c["duplicates"] += 1
            return None
        grads = self._grads(rb)
        fault = self._table_fault(h, rb, grads)
        if fault is None and self._disk_tids:
            fault = self._store_fault(rb)
        if fault is not None:
            raise _Refused(*fault)
        grads = grads[0]
        if self._dur is not None:
            self._dur.append(h.client_id, h.msg_id, fp, body)
        self._c["updates_applied"] += 1
        self._c["update_keys"] += h.num_keys
        self._applied.add(h.client_id, h.msg_id, fp, tail_of(body, last_offset))
        return grads

    def _store_fault(self, rb: RequestBody) -> tuple[Status, int] | None:
        """``(STORE_FULL, table)`` for the first table of update ``rb`` (directory order) whose store
        takes no writes now (a disk table on a full disk: ``writable()``, docs/server.md "Disk
        tier"), else None: refused before it is logged or remembered, so nothing of it is applied
        and the same message can be sent again."""
        for tid in rb.directory["table_id"].tolist():
            if tid in self._disk_tids and not self.tables[tid].writable():
                return Status.STORE_FULL, int(tid)
        return None

    def _update(self, msg: Message, rb: RequestBody) -> None:
        h = msg.header
        grads = self._admit_update(h, msg.body, rb, last_fragment_offset(h))
        if grads is not None:
            d = rb.directory
            self._rows_apply(d["table_id"].astype(np.int64), d["num_keys"].astype(np.int64), rb.keys, grads, False)
        if self._sync_each and not self._commit_log():
            return
        self._send(codec.encode_reply(h, MsgType.UPDATE_ACK, shard_id=self.shard_id, mtu=self.mtu), msg.addr)
