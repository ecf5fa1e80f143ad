"""A parameter-server shard's state and rules: one object the serving loop holds.

:class:`ShardState` is everything a shard *is*, apart from how it meets its socket: the table
stores (:mod:`.stores`), the exactly-once window (:mod:`.window`), the write-ahead log and
checkpoints (:mod:`.durability`), the counters, and every protocol rule of docs/server.md
("Protocol v2"): a frame on its own (:meth:`ShardState.take_frame`: drops by reason, the header
checks :meth:`~ShardState.check_header`, fixed-length announcements, polls), the body's checks
(:meth:`~ShardState.table_fault`, :meth:`~ShardState.store_fault`), exactly once
(:meth:`~ShardState.admit_update`, :meth:`~ShardState.poll_reply`) and the rows
(:meth:`~ShardState.rows_lookup`, :meth:`~ShardState.rows_apply`). The C answer path
(:mod:`.canswer`) reads its per-table arrays (:attr:`ShardState.tdim`, ...) in place.
"""
from __future__ import annotations

import collections
import logging
from typing import Any, Callable, NamedTuple, Protocol

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.codec import FrameError, Header, RequestBody
from embnic.client_lib.config import ClusterConfig, TableConfig
from embnic.client_lib.consts import DType, MsgType, Status
from embnic.client_lib.routing import owns, owns_tables
from embnic.client_lib.rowstore import TableShard
from embnic.client_lib.table_numerics import rowwise_mean_square_ragged

from .durability import Durability
from .shard_metrics import ServiceTimes
from .stores import ShardStores, open_tables
from .window import DEFAULT_MAX_AGE_S, UpdateWindow, fingerprint, tail_of

log = logging.getLogger("embnic.server")

DEFAULT_DEDUP_WINDOW = 65536  #: remembered applied updates (docs/protocol.md, "Reliability")
DEFAULT_MAX_MSG_BYTES = 64 << 20  #: largest request body accepted, bytes
#: extra drop reasons of the server (besides consts.DROP_REASONS); ``refused``: a frame of a
#: request the header checks refused (fragment 0 also draws the ERROR reply)
SERVER_DROP_REASONS = ("too_large", "unannounced", "size_mismatch", "refused")
REASSEMBLY_PENDING = 1024  #: messages being reassembled at most (the oldest evicted first)
REASSEMBLY_BYTES = 256 << 20  #: their buffers' bytes at most
MAX_MSG_LEN = 64 << 20  #: the largest message body reassembled, whatever ``max_msg_bytes`` says

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


class Refused(Exception):
    """A request is answered with ERROR ``status`` naming ``table_id`` (``NO_TABLE``: the whole message)."""

    def __init__(self, status: Status, table_id: int = consts.NO_TABLE):
        super().__init__(status, table_id)
        self.status = status
        self.table_id = int(table_id)


class Request(NamedTuple):
    """A whole request as the serving loop holds it: its header parsed once into this form
    (the fields every reply copies, docs/protocol.md "Message types"), where it came from and
    its body."""

    idx: int  #: the datagram of the wake-up that completed it (its replies' place in the send order)
    name: bytes  #: the source ``sockaddr_in`` (16 bytes) its replies go to
    msg_type: int
    client_id: int
    msg_id: int
    num_tables: int
    num_keys: int
    value_len: int
    last_offset: int  #: the byte offset of its last fragment (0: one fragment)
    body: np.ndarray  #: uint8 (msg_len,)


#: a reply sink of :meth:`ShardState.take_frame`: ``reply(header, msg_type, status, table_id, body)``
ReplySink = Callable[[Header, int, int, int, bytes], None]


class Assembly(Protocol):
    """The serving loop's reassembly, as :meth:`ShardState.take_frame` feeds it one frame (the
    serving loop's :class:`~.intake.Intake`; the tests' reference shard: a ``Reassembler``)."""

    def feed(self, h: Header, data: bytes, addr) -> Any:
        """Take a frame that passed every check; the whole message it completes, else None."""

    def feed_poll(self, h: Header, data: bytes, addr) -> tuple[Any, list[int] | None]:
        """Take a poll like any fragment: (the whole message it completes, else None; when it
        completes none, the fragment indices held of its update, or None when nothing is held
        or the poll contradicts what is)."""

    def discard(self, client_id: int, msg_id: int, msg_type: int) -> None:
        """Forget the fragments held of a message."""


class ShardState:
    """One shard's tables, exactly-once window, log, counters and rules (module docstring).

    Args:
        cfg: the cluster config (tables, sharding policy, seed, MTU).
        shard_id: this shard's id; must be one of ``cfg.shards``.
        dedup_window: applied updates remembered for exactly-once (entries).
        dedup_age_s: seconds the exactly-once window remembers an update at most (:mod:`.window`).
        max_msg_bytes: largest request body accepted (bytes); larger are dropped ``too_large``.
        reassembly_timeout_s: incomplete requests are forgotten after this long (s).
        fixed_length: the fixed-length baseline (docs/protocol.md, "Size messages"): data
            requests must have been announced by a SIZE_REQ of their client (else dropped as
            ``unannounced``) with the same type, ``num_tables``, ``num_keys`` and ``msg_len``
            (else ``size_mismatch``, answered MALFORMED).
        checkpoint_dir: keep a write-ahead log and checkpoints in ``checkpoint_dir/shard-<id>``
            (:mod:`.durability`): an update is acknowledged only once its log record is on disk.
        checkpoint_every: checkpoint after this many logged updates (0: only on request).
        restore: load ``restore/shard-<id>`` (latest checkpoint + log replay) first; the log then
            continues there unless ``checkpoint_dir`` names another directory.
        log_fsync: ``fdatasync`` the log on each commit (False only to measure its cost).
        stores: the table store to serve (:class:`~.stores.ShardStores`); closed by :meth:`close`.
            None: opened for the config by :func:`~.stores.open_tables`.

    Raises:
        KeyError: ``shard_id`` is not in the config.
        DurabilityError: ``restore`` holds another shard's or other tables' checkpoint, or
            ``checkpoint_dir`` already holds a log (without ``restore``).
    """

    def __init__(self, cfg: ClusterConfig, shard_id: int, *, dedup_window: int = DEFAULT_DEDUP_WINDOW,
                 dedup_age_s: float = DEFAULT_MAX_AGE_S, max_msg_bytes: int = DEFAULT_MAX_MSG_BYTES,
                 reassembly_timeout_s: float = 2.0, fixed_length: bool = False, checkpoint_dir: str | None = None,
                 checkpoint_every: int = 0, restore: str | None = None, log_fsync: bool = True,
                 stores: ShardStores | None = None):
        cfg.shard(shard_id)
        self.cfg = cfg
        self.shard_id = int(shard_id)
        self.mtu = cfg.mtu
        self.dedup_window = int(dedup_window)
        self.max_msg_bytes = int(max_msg_bytes)
        self.fixed_length = bool(fixed_length)
        #: (client_id, msg_id) -> (msg_type, num_tables, num_keys, msg_len) of announced data
        self.announced: collections.OrderedDict[tuple[int, int], tuple] = collections.OrderedDict()
        if stores is None:
            stores = open_tables(cfg, self.shard_id, checkpoint_dir if checkpoint_dir is not None else restore)
        self.stores = stores
        #: every in-memory table's rows in one arena with one index (:class:`RowStore`)
        self.store = stores.store
        #: a store per table id: a :class:`TableShard` view of :attr:`store`, or a store of its own
        #: (``store = "disk"``)
        self.tables: dict[int, TableShard] = stores.tables
        self._table_vectors(cfg)
        #: the largest lookup reply (value_len) that fits MAX_FRAGS fragments at the cluster MTU
        self.max_reply_bytes = consts.MAX_FRAGS * consts.max_body_per_frame(cfg.mtu)
        #: incomplete requests are forgotten after this long (s)
        self.reassembly_timeout_s = float(reassembly_timeout_s)
        #: the largest message body a loop takes (bytes)
        self.max_msg = min(self.max_msg_bytes, MAX_MSG_LEN)
        #: the exactly-once window (:mod:`.window`): every acknowledged update by id and fingerprint
        self.window = UpdateWindow(self.dedup_window, dedup_age_s)
        self.counts: collections.Counter = collections.Counter()  #: the scalar counters (:meth:`counters`)
        self.drops = collections.Counter({r: 0 for r in consts.DROP_REASONS + SERVER_DROP_REASONS})
        self.errors: collections.Counter = collections.Counter()  #: ERROR replies by status
        self.requests: collections.Counter = collections.Counter()  #: whole requests by type
        self.replies: collections.Counter = collections.Counter()  #: reply messages by msg_type value
        self.service = ServiceTimes()
        self.durability: Durability | None = None
        self.durable_failed = False
        try:
            if checkpoint_dir is not None or restore is not None:
                self._open_durability(checkpoint_dir, restore, checkpoint_every, log_fsync)
        except BaseException:
            if self.durability is not None:
                self.durability.close()
            self.stores.close()
            raise

    def _table_vectors(self, cfg: ClusterConfig) -> None:
        """Per table id (65536 entries, read as vectors by :meth:`table_fault` and the C path): dim
        (-1: no such table), wire dtype, rows bound, every key ours (no key need be hashed),
        :func:`gradient_bound`, the optimizer, whether the rows are in :attr:`store`."""
        self.tdim = np.full(1 << 16, -1, np.int64)
        self.tdtype = np.zeros(1 << 16, np.int64)
        self.trows = np.zeros(1 << 16, np.uint64)
        self.thas_rows = np.zeros(1 << 16, bool)
        self.towns_all = np.zeros(1 << 16, bool)
        self.tgbound = np.zeros(1 << 16, np.float64)  #: per table id: gradient_bound (float64; 0: no table)
        self._tada = np.zeros(1 << 16, bool)  # row-wise Adagrad (else SGD)
        self._tlr = np.zeros(1 << 16, np.float32)
        for t in cfg.tables:
            self.tdim[t.id], self.tdtype[t.id] = t.dim, int(t.wire_dtype)
            if t.rows is not None:
                self.trows[t.id], self.thas_rows[t.id] = t.rows, True
            self.towns_all[t.id] = (bool(owns(cfg, t.id, self.shard_id, np.zeros(1, np.uint64))[0])
                                    and (len(cfg.shards) == 1 or cfg.sharding == "table"))
            self.tgbound[t.id] = gradient_bound(t)
            self._tada[t.id], self._tlr[t.id] = t.optimizer == "adagrad", np.float32(t.lr)
        self.in_store = np.zeros(1 << 16, bool)  #: per table id: its rows are in :attr:`store`
        for tid, ts in self.tables.items():
            self.in_store[tid] = isinstance(ts, TableShard) and ts.store is self.store
        #: tables whose store may take no writes for a while (the disk tier on a full disk)
        self.disk_tids = frozenset(tid for tid, ts in self.tables.items() if hasattr(ts, "writable"))
        #: the C answer path's test that an update passes every table rule as it is (set by
        #: :class:`~.canswer.CAnswer`: ``update_ok(header, body) -> bool``; True lets
        #: :meth:`admit_update` skip :meth:`table_fault`, False leaves the decision to it); None: none
        self.update_ok = None

    def _open_durability(self, checkpoint_dir, restore, checkpoint_every: int, log_fsync: bool) -> None:
        cfg = self.cfg
        self.durability = dur = Durability(checkpoint_dir if checkpoint_dir is not None else restore, self.shard_id,
                                           cfg.seed, checkpoint_every=checkpoint_every, fsync=log_fsync)
        if restore is None:
            dur.start_fresh()
            return
        if checkpoint_dir is not None and str(checkpoint_dir) != str(restore):
            src = Durability(restore, self.shard_id, cfg.seed, fsync=log_fsync)
            rep = src.restore(self.tables, self.window, self.dedup_window)
            src.close()
            dur.start_fresh()
            dur.restored = rep
            dur.checkpoint(self.tables, self.window)
        else:
            rep = dur.restore(self.tables, self.window, self.dedup_window)
        log.info("shard %d restored from %s: %s, %d updates replayed from the log%s", self.shard_id,
                 restore, f"checkpoint {rep['checkpoint']}" if rep["checkpoint"] else "no checkpoint (the log alone)",
                 rep["replayed"], "" if rep["corrupt"] is None else f"; bad log tail cut off ({rep['corrupt']['reason']})")

    # -- durability and life --------------------------------------------------------------------

    def checkpoint(self) -> str | None:
        """Write a checkpoint now (between messages: a consistent point); returns its path, or
        None without ``checkpoint_dir``.

        Raises:
            OSError: it could not be written (the log stays whole; the shard keeps serving).
        """
        if self.durability is None:
            return None
        p = str(self.durability.checkpoint(self.tables, self.window))
        log.info("shard %d: checkpoint %s", self.shard_id, p)
        return p

    def checkpoint_or_log(self) -> None:
        """:meth:`checkpoint`, a failure counted (``checkpoint_errors``) and logged: the log stays
        whole and the shard keeps serving."""
        try:
            self.checkpoint()
        except OSError as e:
            self.counts["checkpoint_errors"] += 1
            log.error("shard %d: checkpoint failed (%s); the log is kept whole", self.shard_id, e)

    def commit_log(self) -> bool:
        """Make the logged updates durable, waiting for them (then checkpoint when one is due).
        False once the disk refused (:attr:`durable_failed`): no ack may leave and the loop must
        stop."""
        return self.log_step(Durability.commit) is not None

    def log_step(self, step: Callable[[Durability], int]) -> int | None:
        """``step(durability)``, a checkpoint when one is due: the log's durable sequence (every
        update logged before it is on disk: its ack may leave; 0 without a log). ``step``:
        :meth:`.Durability.commit` (wait for every record), :meth:`.Durability.handoff` (the group
        commit's one step per wake-up: its records written, their ``fdatasync`` handed to the
        sync thread) or :meth:`.Durability.poll` (the durable sequence now). A refusal of the disk
        counted (``log_errors``), logged once and remembered (:attr:`durable_failed`): None."""
        dur = self.durability
        if dur is None or self.durable_failed:
            return None if self.durable_failed else 0
        try:
            durable = step(dur)
        except OSError as e:
            self.durable_failed = True
            self.counts["log_errors"] += 1
            log.error("shard %d: cannot write the log in %s (%s): no more acks; stopping", self.shard_id, dur.dir, e)
            return None
        if dur.due:
            self.checkpoint_or_log()
            return dur.durable
        return durable

    def close(self) -> None:
        """Close the log and the tables' disk stores (a scratch directory is removed). Idempotent."""
        if self.durability is not None:
            self.durability.close()
        self.stores.close()

    # -- observability ------------------------------------------------------------------------

    def counters(self) -> dict[str, Any]:
        """Counters of this shard (a snapshot; JSON-serialisable).

        Keys: ``shard``, ``rx_frames``, ``rx_bytes``, ``tx_frames``, ``tx_bytes`` (UDP payload
        bytes), ``requests`` (whole requests by type), ``announced``, ``lookup_keys``,
        ``updates_applied``, ``update_keys``, ``duplicates`` (re-acked, not applied),
        ``update_polls``, ``update_poll_acks`` (polls of applied updates, acked from the window:
        lost acks; not in ``duplicates``), ``update_nacks``, ``replies`` (by type), ``errors``
        (ERROR replies by status), ``drops`` (frames by reason, every reason present),
        ``reassembly`` (``pending``, ``expired``, ``evicted``, ``duplicate_frames``: zeros here, the
        loop's reassembly adds its own),
        ``internal_errors``, ``send_errors``, ``dedup_entries``, ``rows`` (materialised rows per
        table id), ``service`` (:class:`~.shard_metrics.ServiceTimes`); with disk tables
        ``stores``; with a log ``durability`` (plus ``log_errors``, ``checkpoint_errors``). The
        serving loop adds what its own parts counted.
        """
        c = self.counts
        dur = self.durability
        return {
            "shard": self.shard_id,
            "rx_frames": c["rx_frames"], "rx_bytes": c["rx_bytes"],
            "tx_frames": c["tx_frames"], "tx_bytes": c["tx_bytes"],
            "requests": {t.name: self.requests[t] for t in (MsgType.LOOKUP_REQ, MsgType.UPDATE_REQ, MsgType.SIZE_REQ)},
            "announced": len(self.announced),
            "lookup_keys": c["lookup_keys"],
            "updates_applied": c["updates_applied"], "update_keys": c["update_keys"],
            "duplicates": c["duplicates"], "update_polls": c["update_polls"],
            "update_poll_acks": c["update_poll_acks"], "update_nacks": c["update_nacks"],
            "replies": {t.name: self.replies[t] for t in sorted(consts.REPLY_TYPES)},
            "errors": {s.name: self.errors[s] for s in Status if s != Status.OK},
            "drops": dict(self.drops),
            "reassembly": {"pending": 0, "expired": 0, "evicted": 0, "duplicate_frames": 0},
            "internal_errors": c["internal_errors"], "send_errors": c["send_errors"],
            "dedup_entries": len(self.window),
            "rows": {str(tid): len(ts) for tid, ts in self.tables.items()},
            "service": self.service.as_dict(),
            **({"stores": self.stores.counters()} if self.stores.env is not None else {}),
            **({} if dur is None else {"durability": {**dur.counters(), "log_errors": c["log_errors"],
                                                       "checkpoint_errors": c["checkpoint_errors"]}}),
        }

    def state_dict(self) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``{table_id: (keys uint64 (M,) sorted, rows float32 (M, dim), acc float32 (M,))}`` of the
        rows this shard has updated (see :meth:`TableShard.state`)."""
        return {tid: ts.state() for tid, ts in self.tables.items()}

    def count_reply(self, msg_type: int, status: int = 0) -> None:
        """Count one reply message of ``msg_type`` (an ERROR also by its ``status``)."""
        if msg_type == MsgType.ERROR:
            self.errors[Status(status)] += 1
        self.replies[msg_type] += 1

    # -- one frame ------------------------------------------------------------------------------

    def take_frame(self, data: bytes, addr, reply: ReplySink, assembly: Assembly):
        """One datagram from ``addr`` through every rule a frame meets on its own (module
        docstring, 1.): dropped and counted, refused (answered through ``reply``, counted), a
        poll answered from the window (:meth:`poll_reply`), or fed to the loop's ``assembly``.
        Returns the whole message it completes (as ``assembly`` gives it), else None. Never raises (a
        fault of the shard is answered INTERNAL, :meth:`internal_error`)."""
        self.counts["rx_frames"] += 1
        self.counts["rx_bytes"] += len(data)
        try:
            h = codec.parse_header(data, expect="request")
        except FrameError as e:
            self.drops[e.reason] += 1
            self._answer_malformed(data, reply)
            return None
        try:
            return self._take(h, data, addr, reply, assembly)
        except Exception:  # noqa: BLE001 - one bad datagram must not stop the shard
            self.internal_error(h, reply, f"a frame from {addr}")
            return None

    def internal_error(self, h, reply: ReplySink, what: str) -> None:
        """A fault of the shard while serving ``what``: counted (``internal_errors``), logged with
        its traceback, and request ``h`` answered ERROR INTERNAL (when the reply can be sent)."""
        self.counts["internal_errors"] += 1
        log.exception("shard %d: internal error serving %s", self.shard_id, what)
        try:
            self.refuse(h, Status.INTERNAL, reply)
        except Exception:  # noqa: BLE001
            pass

    def _take(self, h: Header, data: bytes, addr, reply: ReplySink, assembly: Assembly):
        """:meth:`take_frame` past a header that parses."""
        if h.msg_len > self.max_msg:
            return self._drop(h, "too_large", reply, Status.MALFORMED)
        status = self.check_header(h)
        if status is not None:  # every fragment counted: the others were counted nowhere
            return self._drop(h, "refused", reply, status)
        if self.fixed_length and h.msg_type != MsgType.SIZE_REQ:
            ann = self.announced.get((h.client_id, h.msg_id))
            if ann is None:
                return self._drop(h, "unannounced", reply)
            if ann != (h.msg_type, h.num_tables, h.num_keys, h.msg_len):
                return self._drop(h, "size_mismatch", reply, Status.MALFORMED)
        if not is_poll(h):
            return assembly.feed(h, data, addr)
        self.counts["update_polls"] += 1
        msg, held = assembly.feed_poll(h, data, addr)
        if msg is not None:
            return msg
        ans = self.poll_reply(h, h.frag_offset, memoryview(data)[consts.HDR_LEN:consts.HDR_LEN + h.frag_len], held)
        if ans is not None:
            if ans[0] == MsgType.UPDATE_ACK:
                assembly.discard(h.client_id, h.msg_id, MsgType.UPDATE_REQ)
            reply(h, ans[0], 0, consts.NO_TABLE, ans[1])
        return None

    def _drop(self, h: Header, reason: str, reply: ReplySink, status: Status | None = None) -> None:
        """Drop a frame, counted by ``reason``; answered ERROR ``status`` at fragment 0 (None: never)."""
        self.drops[reason] += 1
        if status is not None and h.frag_index == 0:
            self.refuse(h, status, reply)

    def refuse(self, h: Header, status: Status, reply: ReplySink, table_id: int = consts.NO_TABLE) -> None:
        """Answer request ``h`` ERROR ``status`` naming ``table_id`` through ``reply``, counted."""
        self.count_reply(MsgType.ERROR, status)
        reply(h, MsgType.ERROR, int(status), int(table_id), b"")

    def _answer_malformed(self, data: bytes, reply: ReplySink) -> None:
        """Answer MALFORMED to a request that failed validation but whose magic, version and
        type are right (fragment 0 only); anything else is only dropped."""
        if len(data) < consts.HDR_LEN:
            return
        h = codec.unpack_header(data)
        if h.magic != consts.MAGIC or h.version != consts.VERSION or h.msg_type not in consts.REQUEST_TYPES:
            return
        if h.frag_index == 0:
            self.refuse(h, Status.MALFORMED, reply)

    def poll_reply(self, h, frag_offset: int, frag_body, held: list[int] | None) -> tuple[int, bytes] | None:
        """The answer to a poll that completed nothing (``h``: its ids and counts; ``frag_body``
        its bytes at ``frag_offset``; ``held``: the fragment indices held of its update, None
        when nothing is held or the poll contradicts it): ``(UPDATE_ACK, b"")`` when the window
        holds an update of this id whose last fragment it is, byte for byte (its ack was lost;
        the caller drops the fragments held again), else ``(UPDATE_NACK, bitmap)`` of ``held``,
        else None (not answered). Counted."""
        if self.window.poll_ack(h.client_id, h.msg_id, h.num_tables, h.num_keys, h.value_len, frag_offset, frag_body):
            self.counts["update_poll_acks"] += 1
            self.count_reply(MsgType.UPDATE_ACK)
            return MsgType.UPDATE_ACK, b""
        if held is None:
            return None
        self.counts["update_nacks"] += 1
        self.count_reply(MsgType.UPDATE_NACK)
        return MsgType.UPDATE_NACK, codec.nack_body(held)

    def check_header(self, h) -> Status | None:
        """What a fragment's header alone refuses: another shard's request (``WRONG_SHARD``), or
        a lookup whose reply (``value_len`` bytes) needs more than ``MAX_FRAGS`` fragments
        (``MALFORMED``). Everything about tables is in the body (:meth:`table_fault`)."""
        if h.shard_id != self.shard_id:
            return Status.WRONG_SHARD
        if h.msg_type == MsgType.LOOKUP_REQ and h.value_len > self.max_reply_bytes:
            return Status.MALFORMED
        return None

    # -- whole messages -------------------------------------------------------------------------

    def admit_sizes(self, h, body) -> bool:
        """SIZE_REQ ``h`` of ``body``: check every entry (a data request type, ``num_tables`` ≥ 1,
        ``num_keys`` ≥ ``num_tables``, ``msg_len`` that fits the type — a lookup exactly
        ``16·T + 8·n``, an update at least ``16·T + 10·n`` with an even value part —, within
        ``max_msg_bytes``) and remember them all: True (answer SIZE_ACK) — or remember none:
        False (answer ERROR MALFORMED). Tables are checked when the data comes."""
        e = codec.body_to_size_entries(body, h.num_keys)
        mt, nt = e["msg_type"].astype(np.int64), e["num_tables"].astype(np.int64)
        nk, ml = e["num_keys"].astype(np.int64), e["msg_len"].astype(np.int64)
        vals = ml - (consts.DIR_ENTRY * nt + consts.KEY_SIZE * nk)
        fits = np.where(mt == MsgType.LOOKUP_REQ, vals == 0, (vals >= 2 * nk) & (vals % 2 == 0))
        ok = (((mt == MsgType.LOOKUP_REQ) | (mt == MsgType.UPDATE_REQ)) & (nt >= 1) & (nk >= nt) & fits
              & (ml <= self.max_msg_bytes))
        if not bool(ok.all()):
            return False
        ann = self.announced
        for row in zip(e["msg_id"].tolist(), mt.tolist(), nt.tolist(), nk.tolist(), ml.tolist()):
            k = (h.client_id, row[0])  # one dict entry per announced message
            ann[k] = row[1:]
            ann.move_to_end(k)
        while len(ann) > self.dedup_window:
            ann.popitem(last=False)
        return True

    def admit_update(self, h, body, rb: RequestBody, last_offset: int | None = None) -> np.ndarray | None:
        """The exactly-once decision of one update, in arrival order: None for a duplicate
        (re-ack, apply nothing); else its gradients (:meth:`gradients`) once it was checked,
        logged and put in the window — the caller applies them (:meth:`rows_apply`).

        Args:
            h: the update's header (ids and counts: a :class:`Request` or a codec ``Header``);
            body: its whole body (bytes-like); rb: the parsed body. last_offset: the byte offset
                of its last fragment (0 for one fragment; None: unknown, and then no poll of it
                is acked from the window).

        Raises:
            Refused: a table of it is refused (nothing logged or remembered).
        """
        fp = fingerprint(h.num_tables, h.num_keys, h.value_len, body)
        if self.window.duplicate(h.client_id, h.msg_id, fp):
            self.counts["duplicates"] += 1
            return None
        grads = self.gradients(rb)
        if self.update_ok is None or not self.update_ok(h, body):  # else every table rule holds (C checked)
            fault = self.table_fault(rb, grads)
            if fault is None and self.disk_tids:
                fault = self.store_fault(rb)
            if fault is not None:
                raise Refused(*fault)
        if self.durability is not None:
            self.durability.append(h.client_id, h.msg_id, fp, body)
        self.counts["updates_applied"] += 1
        self.counts["update_keys"] += h.num_keys
        self.window.add(h.client_id, h.msg_id, fp, tail_of(body, last_offset))
        return grads[0]

    def store_fault(self, rb: RequestBody) -> tuple[Status, int] | None:
        """``(STORE_FULL, table)`` for the first table of update ``rb`` (directory order) whose store
        takes no writes now (a disk table on a full disk: ``writable()``, docs/server.md "Disk
        tier"), else None: refused before it is logged or remembered."""
        for tid in rb.directory["table_id"].tolist():
            if tid in self.disk_tids and not self.tables[tid].writable():
                return Status.STORE_FULL, int(tid)
        return None

    def table_fault(self, rb: RequestBody, grads: tuple | None = None) -> tuple[Status, int] | None:
        """The first bad table of a request in directory order, as ``(status, table_id)``, or
        None when every table may be served (docs/protocol.md, "Errors"). Per table, in this
        order: ``UNKNOWN_TABLE``, ``DIM_MISMATCH`` (``dim`` or ``dtype``), ``KEY_OUT_OF_RANGE``,
        ``NOT_OWNER``, and for an update ``MALFORMED`` for duplicate keys within the table or a
        gradient row :func:`~embnic.client_lib.table_numerics.gradient_rows_ok` refuses.

        Vectorised over the message's tables and keys, no per-table loop: gradients are checked
        against one bound per table (:func:`gradient_bound`), the rule itself only on the tables
        above it (:meth:`_grads_ok`).

        Args:
            rb: the parsed body (:func:`codec.parse_request_body`).
            grads: an update's gradients (:meth:`gradients`: flat float32 values, element offsets).
        """
        d = rb.directory
        tids = d["table_id"].astype(np.int64)
        ko = rb.key_offsets
        counts = np.diff(ko)
        starts = ko[:-1]
        keys = rb.keys
        tdim = self.tdim[tids]
        st = np.where(tdim < 0, int(Status.UNKNOWN_TABLE), 0)
        st[(st == 0) & ((tdim != d["dim"]) | (self.tdtype[tids] != d["dtype"]))] = Status.DIM_MISMATCH
        known = st == 0
        rows = self.thas_rows[tids] & known
        if rows.any():
            bad = np.repeat(rows, counts) & (keys >= np.repeat(self.trows[tids], counts))
            st[(st == 0) & np.logical_or.reduceat(bad, starts)] = Status.KEY_OUT_OF_RANGE
        hashed = (st == 0) & ~self.towns_all[tids]
        if hashed.any():
            sel = np.repeat(hashed, counts)
            mine = np.ones(keys.size, bool)
            mine[sel] = owns_tables(self.cfg, tids[hashed], counts[hashed], self.shard_id, keys[sel])
            st[(st == 0) & ~np.logical_and.reduceat(mine, starts)] = Status.NOT_OWNER
        if grads is not None:
            self._update_faults(st, tids, counts, starts, keys, grads)
        bad_t = np.flatnonzero(st)
        if bad_t.size == 0:
            return None
        t = int(bad_t[0])
        return Status(int(st[t])), int(tids[t])

    def _update_faults(self, st: np.ndarray, tids: np.ndarray, counts: np.ndarray, starts: np.ndarray,
                       keys: np.ndarray, grads: tuple) -> None:
        """:meth:`table_fault`'s update rules, written into ``st`` (per directory entry, 0: fine
        so far): duplicate keys within a table, gradients the optimizer must not apply."""
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
            near = (st == 0) & ~(np.maximum.reduceat(np.abs(flat), eo[:-1]) < self.tgbound[tids])
        if near.any():  # gradient_rows_ok's rule on the rows of the tables near the bound
            st[near & ~self._grads_ok(tids, counts, flat, eo, near)] = Status.MALFORMED

    def _grads_ok(self, tids: np.ndarray, counts: np.ndarray, flat: np.ndarray, eo: np.ndarray,
                  which: np.ndarray) -> np.ndarray:
        """Per directory entry, whether every gradient row of the tables ``which`` (bool (T,))
        passes :func:`~embnic.client_lib.table_numerics.gradient_rows_ok` (True for the others):
        every value finite, and the step finite in float32 (an Adagrad row's mean square, an SGD
        value times ``lr``) — over all of them at once."""
        dims = self.tdim[tids]
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
        ok[np.unique(rows_t[~row_ok])] = False
        return ok

    @staticmethod
    def gradients(rb: RequestBody) -> tuple[np.ndarray, np.ndarray]:
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

    # -- rows -----------------------------------------------------------------------------------

    def rows_lookup(self, tids: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Rows of the keys of directory segments ``tids``/``counts`` (int (S,)), ``keys`` uint64
        (Σ counts,): float32 flat (Σ counts·dim,), row after row — one search and one gather in
        :attr:`store` for every table it holds; a table in a store of its own, one call each."""
        if self.in_store[tids].all():
            return self.store.lookup_segments(tids, counts, keys)
        dims = self.tdim[tids]
        out = np.empty(int((counts * dims).sum()), np.float32)
        seg_in = self.in_store[tids]
        key_in = np.repeat(seg_in, counts)
        el_in = np.repeat(key_in, np.repeat(dims, counts))
        if seg_in.any():
            out[el_in] = self.store.lookup_segments(tids[seg_in], counts[seg_in], keys[key_in])
        ko = np.r_[0, np.cumsum(counts)]
        eo = np.r_[0, np.cumsum(counts * dims)]
        for s in np.flatnonzero(~seg_in).tolist():
            out[eo[s]:eo[s + 1]] = self.tables[int(tids[s])].lookup(keys[ko[s]:ko[s + 1]]).reshape(-1)
        return out

    def rows_apply(self, tids: np.ndarray, counts: np.ndarray, keys: np.ndarray, flat: np.ndarray) -> None:
        """Apply gradients ``flat`` (float32 (Σ counts·dim,)) to the keys of directory segments
        ``tids``/``counts`` (the segments of one or several messages in arrival order, a table's
        keys unique within a segment; a (table, key) may repeat across segments: applied in
        order) — one C call to :attr:`store` for every table it holds (:meth:`RowStore.apply_segments`);
        a table in a store of its own, one ``apply_segments`` each over its segments."""
        if self.in_store[tids].all():
            self.store.apply_segments(tids, counts, keys, flat)
            return
        dims = self.tdim[tids]
        seg_in = self.in_store[tids]
        key_in = np.repeat(seg_in, counts)
        el_in = np.repeat(key_in, np.repeat(dims, counts))
        if seg_in.any():
            self.store.apply_segments(tids[seg_in], counts[seg_in], keys[key_in], flat[el_in])
        for tid in np.unique(tids[~seg_in]).tolist():
            seg = tids == tid
            kt = np.repeat(seg, counts)
            offs = np.r_[0, np.cumsum(counts[seg])]
            self.tables[tid].apply_segments(keys[kt], flat[np.repeat(kt, np.repeat(dims, counts))].reshape(
                -1, int(self.tdim[tid])), offs)

    def to_wire(self, rows: np.ndarray, tids: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Rows float32 flat of segments ``tids``/``counts`` → their wire bytes uint8 (each
        table's dtype, little-endian, row-major): a view for fp32 tables only, one cast for fp16
        only, one scatter per dtype for both."""
        dt = self.tdtype[tids]
        if bool((dt == DType.FP32).all()):
            return rows.astype("<f4", copy=False).view(np.uint8)
        if bool((dt == DType.FP16).all()):
            with np.errstate(over="ignore"):  # |x| > 65504 becomes inf, as LocalBackend's wire_round
                return rows.astype("<f2").view(np.uint8)
        e16 = np.repeat(np.repeat(dt == DType.FP16, counts), np.repeat(self.tdim[tids], counts))
        es = np.where(e16, 2, 4)
        pos = np.cumsum(es) - es
        out = np.empty(int(es.sum()), np.uint8)
        out[pos[~e16][:, None] + np.arange(4)] = rows[~e16].astype("<f4").view(np.uint8).reshape(-1, 4)
        with np.errstate(over="ignore"):
            out[pos[e16][:, None] + np.arange(2)] = rows[e16].astype("<f2").view(np.uint8).reshape(-1, 2)
        return out
