"""The client transport: lookups and updates as embnic messages over UDP.

:class:`EmbeddingClient` turns ``{table_id: unique keys}`` into one variable-length message per
shard (protocol v2: every table the shard holds a part of travels in that message, after a
per-table directory) — routed by :mod:`embnic.client_lib.routing`, fragmented to the cluster MTU
by :mod:`embnic.client_lib.codec`, and split into several messages only where a message or its
reply would need more than ``msg_frames`` fragments (at most ``consts.MAX_FRAGS``, 256) or would
not fit the send window — sends them in one round,
reassembles the replies and puts every row back at its key's position. A reply is taken only
from the shard its request went to (others are counted as ``wrong_shard_reply``).

**Transport** (docs/protocol.md, "Reliability"). What is in flight to one shard is bounded by a
send window (``window_frames``: request frames plus the reply frames they will draw); the
next message of a shard goes out when a reply frees room, so a batch-4096 round does not
overrun the card's or the shard's queues. A shard's messages leave largest first: the last
ones of a round are the ones no later answer can show lost, so they should be the ones least
likely to lose a frame.

Loss is found two ways. **By later answers** (RACK, RFC 8985, by transmission order): a shard
answers in the order it was asked (per worker process), so a message whose latest transmission
went out before an answered message of its shard (or one whose reply has begun to come) lost
a frame; it is recovered once a reordering window (a quarter of the shard's shortest RTT, at
least 1 ms: a shard's ``--workers`` answer by client and table, so answers of different tables may pass each
other) has passed without its answer. **By its timer**: every message has its own retransmission timer, set from
the measured round-trip time of its shard and type as in RFC 6298 (:class:`RttEstimator`: SRTT,
RTTVAR, ``RTO = SRTT + 4·RTTVAR`` within ``[rto_min, rto_max]`` (default 50 ms, 10 s), Karn's
rule: no sample from a re-sent message; the first RTO is the config's ``timeout_ms``), doubled
each time it fires (exponential backoff); a reply from a shard restarts the timers of its
other messages in flight (RFC 6298 5.3: they may be queued behind the one answered); when
timers fire only the shard's message sent first is re-sent (5.4), so a shard stalled on a busy
machine costs one needless re-send, not one per message in flight. **Tail probes**: a shard's
last message of a round (and any re-send after it) is followed at once by a one-key lookup
whose answer shows whether what went before it was lost (RFC 8985's tail loss probe; the round
does not wait for it). Messages are kept to ``msg_frames`` fragments each way (default 64):
a round of the Criteo demo at batch 256 is then one message per shard, and what a loss costs
is the lost fragments, not the message (below).

**Recovery.** A lookup whose reply came in part is *repaired*: a new lookup message (its own
id) asks for only the rows of the missing fragments, and their rows complete the first reply
(a lost fragment of a 90-fragment reply costs one small message, not the whole reply again,
whose own loss odds would be as high). A lost update of several fragments is *polled*: its last
fragment is sent again (``RETRANSMIT``); the shard acks it if it applied the update, or answers
``UPDATE_NACK`` with the fragments it holds, and the client re-sends only the others. Any other
lost message (a one-fragment update, a SIZE_REQ) is sent again whole with the
``RETRANSMIT`` flag (a shard keeps the fragments it has, so the new copy fills the gaps);
updates likewise until acked (the servers apply each update exactly once). After ``retries``
tries the client raises :class:`ShardUnavailableError` naming the shard.

It talks to the shards directly, or through the card when the config's ``[card]`` is enabled
(see :meth:`embnic.client_lib.config.ClusterConfig.request_destination`).
"""
from __future__ import annotations

import collections
import errno
from collections.abc import Mapping
import itertools
import os
import select
import socket
import time
from typing import Callable

import numpy as np

from . import codec, consts, precheck
from .batch import as_ids
from .config import ClusterConfig
from .consts import MsgType
from .reassembly import Message, Reassembler
from .routing import split_by_shard
from . import native
from .roundplan import (C_DIR0, C_FRAMES, C_KA, C_KB, C_MSGLEN, C_NKEYS, C_NT, C_RFRAMES, C_SHARD, C_VLEN, C_VOFF,
                        MSG_COLUMNS, RoundPlan, TableArrays, plan_round)
from .msgid import MsgIds
from .outstanding import Outstanding as _Out
from .errors import EmbnicError, ShardError, ShardUnavailableError  # noqa: F401 (the client's errors)
from .rtt import DEFAULT_RTO_MAX_MS, DEFAULT_RTO_MIN_MS, REO_WND_MIN_MS, RttEstimator
from .sockets import set_socket_buffers
from .stats import ClientStats

_REPLY = {MsgType.LOOKUP_REQ: MsgType.LOOKUP_REPLY, MsgType.UPDATE_REQ: MsgType.UPDATE_ACK,
          MsgType.SIZE_REQ: MsgType.SIZE_ACK}  # the reply type that answers each request type
DEFAULT_WINDOW_FRAMES = 512  #: frames in flight per shard (requests + the replies they draw)
DEFAULT_MSG_FRAMES = 64  #: most fragments of a message or of its reply (a round is split past it)


class EmbeddingClient:
    """Embedding lookups and updates against the parameter-server shards of a cluster.

    Args:
        cfg: the cluster config.
        client_id: this client's id (must be in ``cfg.clients``).
        bind: (ip, port) to bind; default the config's address of this client. Port 0 picks one.
        timeout_ms, retries, mtu: override the config's ``[cluster]`` values (``timeout_ms`` is
            the first retransmission timeout, before any round-trip time was measured).
        window_frames: frames in flight per shard at most (request frames plus the reply
            frames they draw); messages are split so that each fits it (from 3 frames up);
            one message is always allowed, however large.
        rto_min_ms, rto_max_ms: bounds of the retransmission timeout (ms).
        msg_frames: most fragments of a message or of its reply (None: only ``MAX_FRAGS`` and the
            window bound it); a round is split into several messages to a shard only past it.
            Loss is found by later answers only while some messages in flight get through, so
            a batch-4096 round is still several messages; a lost fragment costs itself (lookup
            repair, update NACK), not its message.
        tail_probes: send a tail probe after a shard's last message of a round (see above; never
            in the fixed-length mode, whose shards take only announced messages).
        fixed_length: the fixed-length baseline (docs/protocol.md, "Size messages"), modelled
            on TorchRec's ``KJTAllToAll``: every round of lookups or updates is preceded by a
            size round — one SIZE_REQ per shard listing the round's data messages to it, and
            a wait for every shard's SIZE_ACK. Two rounds per lookup instead of one.

    Raises:
        KeyError: unknown ``client_id``.
        ValueError: ``window_frames`` < 1, ``msg_frames`` < 1 or bad RTO bounds.
        OSError: the address cannot be bound.
    """

    def __init__(self, cfg: ClusterConfig, client_id: int, *, bind: tuple[str, int] | None = None,
                 timeout_ms: int | None = None, retries: int | None = None, mtu: int | None = None,
                 window_frames: int = DEFAULT_WINDOW_FRAMES, rto_min_ms: float = DEFAULT_RTO_MIN_MS,
                 rto_max_ms: float = DEFAULT_RTO_MAX_MS, fixed_length: bool = False,
                 msg_frames: int | None = DEFAULT_MSG_FRAMES, tail_probes: bool = True, native_io: bool = True):
        self.cfg = cfg
        self.client_id = client_id
        me = cfg.client(client_id)
        self.timeout_s = (timeout_ms or cfg.timeout_ms) / 1000.0
        self.retries = retries or cfg.retries
        self.mtu = mtu or cfg.mtu
        if int(window_frames) < 1:
            raise ValueError(f"window_frames must be >= 1, got {window_frames}")
        self.window_frames = int(window_frames)
        if msg_frames is not None and int(msg_frames) < 1:
            raise ValueError(f"msg_frames must be >= 1 or None, got {msg_frames}")
        self.msg_frames = None if msg_frames is None else int(msg_frames)
        self.tail_probes = bool(tail_probes) and not fixed_length  # (the fixed-length shard takes only announced messages)
        self.fixed_length = bool(fixed_length)
        # one estimator per (shard, request type): a 1-frame SIZE_REQ and a 200-frame lookup do
        # not share a round-trip time
        self._rtt = {(s.id, t): RttEstimator(self.timeout_s, rto_min_ms / 1000.0, rto_max_ms / 1000.0)
                     for s in cfg.shards for t in consts.REQUEST_TYPES}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        set_socket_buffers(self.sock)
        self.sock.bind(bind if bind is not None else (me.ip, me.port))
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()
        self._stats = ClientStats()  # (the `stats` property: the C round's counters added when read)
        self._late_probes: collections.OrderedDict[int, None] = collections.OrderedDict()  # probe ids after their round
        self._reasm = Reassembler(max_pending=65536, timeout_s=max(1.0, 4 * self.timeout_s), expect="reply")
        # message ids follow the id clock (msgid.py, docs/protocol.md "Message ids"): never
        # reused while a shard's exactly-once window may remember them, in this run or the next
        self._ids = MsgIds(client_id)
        self._buf = bytearray(65536)
        self._dest = {s.id: cfg.request_destination(client_id, s.id) for s in cfg.shards}
        self.via_card = cfg.card is not None and cfg.card.enabled
        self._largest_answered = 0  # largest datagram (bytes) of an answered message or its reply
        self._seqs = itertools.count()  # the current round's transmission order (_round)
        self._ta = TableArrays(cfg)
        self._shard_ids = np.array([s.id for s in cfg.shards], np.int64)
        self._shard_index = {s.id: i for i, s in enumerate(cfg.shards)}
        self._nodir = np.zeros(0, codec.DIR_DTYPE)
        self._nokeys = np.zeros(0, np.uint64)
        lib = native.load() if native_io else None
        self._native = None if lib is None else native.NativeRound(
            lib, self.sock, client_id, mtu=self.mtu, window_frames=self.window_frames, retries=self.retries,
            timeout_s=self.timeout_s, rto_min_s=rto_min_ms / 1000.0, rto_max_s=rto_max_ms / 1000.0,
            tail_probes=self.tail_probes, fixed_length=self.fixed_length, shard_ids=[s.id for s in cfg.shards],
            dests=[self._dest[s.id] for s in cfg.shards])
        self._native_seen = None if self._native is None else self._native.counters()
        self._ws = native.Workspace()  # the C plan's arrays, reused from round to round

    # -- public API -------------------------------------------------------------------------

    @property
    def stats(self) -> ClientStats:
        """This client's counters (:class:`ClientStats`); the C round's are added when they are read."""
        if self._native is not None:
            self._sync_native()
        return self._stats

    @stats.setter
    def stats(self, value: ClientStats) -> None:
        if self._native is not None:
            self._sync_native()  # what the C round counted so far belongs to the old object
        self._stats = value

    @property
    def native(self) -> bool:
        """True when rounds run in the C engine (:mod:`.native`), False on the numpy path."""
        return self._native is not None

    def lookup(self, requests: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        """Fetch rows for every table in one round: one message per shard touched, carrying every
        table that shard holds keys of (docs/protocol.md, version 2).

        Args:
            requests: ``{table_id: keys}``, keys uint64 (N_t,), any of 0..2^64-1 (typically the
                sorted value array; Python ints are converted exactly, see
                :func:`~embnic.client_lib.batch.as_ids`).

        Returns:
            ``{table_id: rows}``, rows float32 (N_t, dim_t) in the order of the keys (views of one
            buffer holding every table's rows, :meth:`lookup_flat`).

        Raises:
            ShardUnavailableError: a shard did not answer after ``retries`` tries.
            ShardError: a shard answered ERROR (naming the table where it is one table's).
            ValueError: before anything is sent, naming the table: an unknown table, keys not
                1-D integers in 0..2^64-1, a key ``>= rows`` (:func:`precheck.lookup_round`).
        """
        if self._native is not None:
            flat = precheck.plain_arrays(requests, lambda v: v)
            plan = self._prepare(MsgType.LOOKUP_REQ, *flat, None) if flat is not None else None
            if plan is not None:
                return plan.split(self._lookup_run(plan))
        tix, counts, keys = precheck.lookup_flat(self.cfg, self._ta, requests)
        plan = self._plan(MsgType.LOOKUP_REQ, tix, counts, keys)
        return plan.split(self._lookup_run(plan))

    def lookup_flat(self, table_ids, counts, keys) -> np.ndarray:
        """:meth:`lookup` of a round given flat, TorchRec's jagged layout, with no step per table.

        Args:
            table_ids: int (T,) distinct configured tables; counts: int (T,) keys of each;
            keys: uint64 (Σ counts,) every table's keys one table after the other.

        Returns:
            float32 (Σ counts_t·dim_t,): table ``t``'s rows ``(counts_t, dim_t)`` one table after
            the other, in key order.

        Raises:
            as :meth:`lookup`; ValueError also for counts that do not add up to the keys
            (:func:`precheck.lookup_jagged`).
        """
        if self._native is not None:
            flat = precheck.plain_jagged(table_ids, counts, keys)
            plan = self._prepare(MsgType.LOOKUP_REQ, *flat, None) if flat is not None else None
            if plan is not None:
                return self._lookup_run(plan)
        plan = self._plan(MsgType.LOOKUP_REQ, *precheck.lookup_jagged(self.cfg, self._ta, table_ids, counts, keys))
        return self._lookup_run(plan)

    def _prepare(self, msg_type: int, table_ids, counts, keys, grads, gshape=None) -> RoundPlan | None:
        """The round checked and planned in one C call (:func:`native.prepare`), or None when a
        check fails (the per-table checks of :mod:`.precheck` then say why, or pass it on)."""
        first = self._ids.next()
        plan = native.prepare(self._native.lib, self._ta, self._ws, msg_type, table_ids, counts, keys, grads,
                              mtu=self.mtu, msg_frames=self.msg_frames, window_frames=self.window_frames,
                              next_id=first, gshape=gshape)
        if plan is not None:
            plan.first_id = first  # its ids are first .. plan.next_id - 1 (taken when it runs)
        return plan

    def _plan(self, msg_type: int, tix, counts, keys) -> RoundPlan:
        """The round's plan from checked arrays (:func:`~.roundplan.plan_round`; the C engine's
        :func:`native.prepare` makes the same plan)."""
        return plan_round(self._ta, msg_type, tix, counts, keys, mtu=self.mtu, msg_frames=self.msg_frames,
                          window_frames=self.window_frames)

    def _lookup_run(self, plan: RoundPlan) -> np.ndarray:
        """Run a planned lookup round; returns every table's rows flat (:meth:`RoundPlan.finish`)."""
        dst, _, nbytes = plan.out_layout()
        out = np.empty(nbytes, np.uint8)
        self._run(plan, out=out, dst=dst, record_latency=True)
        return plan.finish(out)

    def update(self, updates: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Push gradients for every table in one round — one message per shard touched, carrying
        every table's part — and return once every shard acked.

        Args:
            updates: ``{table_id: (keys uint64 (N,), grads float32 (N, dim))}``; keys unique.

        Raises:
            ShardUnavailableError, ShardError: as :meth:`lookup`.
            ValueError: before anything is sent, naming the table (:func:`precheck.update_round`):
                an unknown table, bad or duplicate keys, a key ``>= rows``, grads not of shape
                ``(len(keys), dim)``, a gradient the shards refuse (NaN, inf, overflowing step).
                So no shard applies its part of an update another shard would refuse.
        """
        if self._native is not None and isinstance(updates, Mapping) and updates and all(
                isinstance(e, tuple) and len(e) == 2 for e in updates.values()):
            flat = precheck.plain_arrays(updates, lambda e: e[0])
            g = precheck.plain_grads([e[1] for e in updates.values()]) if flat is not None else None
            plan = self._prepare(MsgType.UPDATE_REQ, *flat, g[0], gshape=g[1]) if g is not None else None
            if plan is not None:
                return self._update_run(plan, g[0])
        tix, counts, keys, grads = precheck.update_flat(self.cfg, self._ta, updates)
        self._update_run(self._plan(MsgType.UPDATE_REQ, tix, counts, keys), grads)

    def _update_run(self, plan: RoundPlan, grads: np.ndarray) -> None:
        if plan.num_msgs:
            vals = getattr(plan, "vals", None)
            self._run(plan, vals=plan.values(grads) if vals is None else vals, record_latency=False)

    def update_flat(self, table_ids, counts, keys, grads) -> None:
        """:meth:`update` of a round given flat, with no step per table.

        Args:
            table_ids: int (T,) distinct configured tables; counts: int (T,) keys of each;
            keys: uint64 (Σ counts,) one table after the other, unique within a table;
            grads: float32 (Σ counts_t·dim_t,) each table's ``(counts_t, dim_t)`` rows, one table
                after the other.

        Raises:
            as :meth:`update` (:func:`precheck.update_jagged`).
        """
        if self._native is not None:
            flat = precheck.plain_jagged(table_ids, counts, keys)
            g = np.asarray(grads)
            if flat is not None and g.dtype == np.float32 and g.ndim == 1 and g.flags.c_contiguous:
                plan = self._prepare(MsgType.UPDATE_REQ, *flat, g)
                if plan is not None:
                    return self._update_run(plan, g)
        tix, counts, keys, grads = precheck.update_jagged(self.cfg, self._ta, table_ids, counts, keys, grads)
        self._update_run(self._plan(MsgType.UPDATE_REQ, tix, counts, keys), grads)

    def _run(self, plan: RoundPlan, *, out=None, dst=None, vals=None, record_latency: bool) -> None:
        """Send a planned round and wait for every answer: message ids in plan order, a size round
        first in the fixed-length mode, then the C round (:mod:`.native`) or :meth:`_round`."""
        M = plan.num_msgs
        if not M:
            return
        tab = getattr(plan, "tab", None)
        if tab is not None:  # native.prepare gave the ids and the queue's order
            ids = tab[:, len(MSG_COLUMNS)]
            self._ids.advance(plan.first_id, plan.next_id)
        else:
            ids = self._alloc_ids(M)
        if self.fixed_length:
            self._size_round(plan, ids)
        if self._native is not None:
            if tab is None:
                tab = np.empty((M, native.NCOL), np.int64)
                tab[:, :len(MSG_COLUMNS)] = plan.msgs
                tab[:, len(MSG_COLUMNS)] = ids
                tab[:, len(MSG_COLUMNS) + 1] = plan.msg_type
                queue = None
            else:
                queue = plan.qorder
            self._round_native(tab, plan.dir, plan.keys, vals, dst, plan.rb, plan.so, out, record_latency,
                               queue=queue)
            return
        self._round(self._outs(plan, ids, out, dst, vals), record_latency=record_latency)

    def _outs(self, plan: RoundPlan, ids: np.ndarray, out, dst, vals) -> list[_Out]:
        """The round's messages as :class:`_Out` (the numpy path): frames encoded by the codec, a
        lookup's reply scattered to its rows in ``out`` (:meth:`RoundPlan.scatter_index`)."""
        msgs: list[_Out] = []
        lookup = plan.msg_type == MsgType.LOOKUP_REQ
        for m, (r, msg_id) in enumerate(zip(plan.msgs.tolist(), ids.tolist())):  # per message
            sid = int(self._shard_ids[r[C_SHARD]])
            d, k = plan.directory(m), plan.msg_keys(m)
            if lookup:
                def fill(msg: Message, ka=r[C_KA], kb=r[C_KB]) -> None:
                    if plan.uniform:
                        rows = np.frombuffer(msg.body, "<f4").reshape(kb - ka, plan.dim)
                        out.view(np.float32).reshape(-1, plan.dim)[plan.order[ka:kb]] = rows
                    else:
                        out[plan.scatter_index(ka, kb, dst)] = np.frombuffer(msg.body, np.uint8)

                msgs.append(self._lookup_out(sid, d, k, fill, self._dest[sid], msg_id=msg_id))
            else:
                v = vals[r[C_VOFF]:r[C_VOFF] + r[C_VLEN]]
                frames = codec.encode_update(msg_id=msg_id, client_id=self.client_id, shard_id=sid, directory=d,
                                             keys=k, values=v, mtu=self.mtu)
                msgs.append(_Out(msg_id, MsgType.UPDATE_REQ, sid, d, len(k), self._dest[sid], frames,
                                 lambda m: None, datagram=self._datagram(frames, 0), keys=k, value_len=len(v)))
        return msgs

    def _round_native(self, tab, directory, keys, vals, dst, rb, so, out, record_latency: bool,
                      data: bool = True, queue: np.ndarray | None = None) -> None:
        """One round through the C engine (:class:`native.NativeRound`): its counters into
        :attr:`stats`, its errors raised as :meth:`_round` raises them. ``queue``: the rows in the
        send queue's order (None: sorted here, a shard's largest message first)."""
        if len(tab) > 1:
            tab = tab[queue if queue is not None else np.argsort(-(tab[:, C_FRAMES] + tab[:, C_RFRAMES]),
                                                                 kind="stable")]
        self._count_round(len(tab), len(set(tab[:, C_SHARD].tolist())) if len(tab) > 1 else 1, data)
        first = self._ids.next()
        res, lat = self._native.run(tab, directory, keys, vals, dst, rb, so, out, record_latency, first)
        R = native.R
        self._ids.advance(first, res[R["next_id"]])
        self._largest_answered = res[R["largest"]]
        if record_latency and lat.size:
            self._stats.lookup_latency_us.extend(lat.tolist())
        kind = int(res[R["kind"]])
        if kind == native.KIND_SHARD_ERROR:
            raise ShardError(int(self._shard_ids[res[R["shard"]]]), res[R["table"]], res[R["status"]])
        if kind == native.KIND_GIVE_UP:
            sid = int(self._shard_ids[res[R["shard"]]])
            t = int(res[R["type"]])
            what = "lookup" if t == MsgType.LOOKUP_REQ else ("update" if t == MsgType.UPDATE_REQ else "size")
            raise ShardUnavailableError(sid, self._dest[sid], int(res[R["tries"]]), res[R["elapsed_ns"]] / 1e9,
                                        f"{int(res[R['nmsg']])} {what} messages", via_card=self.via_card,
                                        path_mtu_hint=self._mtu_hint(int(res[R["big"]])), config_path=self.cfg.path)
        if kind == native.KIND_OS_ERROR:
            e = int(res[R["errno"]])
            raise OSError(e, os.strerror(e))

    def _sync_native(self) -> None:
        """Add what the C engine counted since the last round to :attr:`stats`."""
        now = self._native.counters()
        delta = now - self._native_seen
        self._native_seen = now
        st = self._stats
        names = self._native.stat_names
        for i in np.flatnonzero(delta).tolist():  # the counters that moved
            name, v = names[i], int(delta[i])
            if name == "max_inflight_frames":
                st.max_inflight_frames = max(st.max_inflight_frames, int(now[i]))
            elif name == "duplicates":
                continue
            elif name.startswith("drop_"):
                st.drops[name[5:]] += v
            else:
                setattr(st, name, getattr(st, name) + v)

    def _count_round(self, n_msgs: int, n_shards: int, data: bool) -> None:
        self._stats.rounds += 1
        if data:
            self._stats.data_rounds += 1
            self._stats.round_messages += n_msgs
            self._stats.round_shards += n_shards

    def _alloc_ids(self, n: int) -> np.ndarray:
        """``n`` consecutive message ids of the id clock (:class:`~.msgid.MsgIds`; wrapping at
        2^32, never 0): uint32 (n,)."""
        i0 = self._ids.take(n)
        return ((i0 - 1 + np.arange(n, dtype=np.int64)) % 0xFFFFFFFF + 1).astype(np.uint32)

    def _by_shard(self, keys_of: dict[int, np.ndarray]) -> dict[int, list]:
        """Every table's keys grouped by owning shard, for one round: ``{shard_id: [(table_id,
        positions int64 (k,), keys uint64 (k,)), ...]}``, tables in the order given, keys in their
        order within a table (:func:`~embnic.client_lib.routing.split_by_shard`); ``positions``
        index the table's keys. The per-table reference of :func:`~.roundplan.plan_round` (tests)."""
        by_shard: dict[int, list] = {}
        for table_id, keys in keys_of.items():
            for shard_id, pos, skeys in split_by_shard(self.cfg, table_id, as_ids(keys)):
                by_shard.setdefault(shard_id, []).append((table_id, pos, skeys))
        return by_shard

    def _pack(self, msg_type: int, parts: list) -> list[list]:
        """Cut one shard's ``parts`` into the messages of a round: :func:`pack_parts` at this
        client's MTU, ``msg_frames`` and ``window_frames``."""
        return pack_parts(self.cfg, msg_type, parts, mtu=self.mtu, msg_frames=self.msg_frames,
                          window_frames=self.window_frames)

    def close(self) -> None:
        """Close the socket (and free the C round engine's context; its counters stay in :attr:`stats`)."""
        if self._native is not None:
            self._sync_native()
            self._native.close()
        self.sock.close()

    def __enter__(self) -> "EmbeddingClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------

    def _size_round(self, plan: RoundPlan, ids: np.ndarray) -> None:
        """Fixed-length mode: announce the sizes of the round's messages (``ids`` uint32 (M,)):
        one SIZE_REQ per shard, split only past :data:`consts.MAX_FRAGS` fragments, and wait for
        every shard's SIZE_ACK."""
        M = plan.num_msgs
        e = np.zeros(M, codec.SIZE_ENTRY_DTYPE)
        e["msg_id"] = ids
        e["msg_type"] = plan.msg_type
        e["num_tables"] = plan.msgs[:, C_NT]
        e["num_keys"] = plan.msgs[:, C_NKEYS]
        e["msg_len"] = plan.msgs[:, C_MSGLEN]
        cap = consts.MAX_FRAGS * consts.max_body_per_frame(self.mtu) // consts.SIZE_ENTRY
        shard = plan.msgs[:, C_SHARD]
        cut = np.flatnonzero(np.r_[True, shard[1:] != shard[:-1]])  # a plan's messages are grouped by shard
        parts = [(int(shard[a]), a2, min(a2 + cap, b)) for a, b in zip(cut.tolist(), np.r_[cut[1:], M].tolist())
                 for a2 in range(a, b, cap)]  # per shard (and per cap entries)
        sids = self._alloc_ids(len(parts))
        self._stats.size_rounds += 1
        if self._native is not None:
            tab = np.zeros((len(parts), native.NCOL), np.int64)
            P = consts.max_body_per_frame(self.mtu)
            for j, (si, a, b) in enumerate(parts):
                n = b - a
                tab[j, [C_SHARD, C_NKEYS, C_VOFF, C_MSGLEN, C_FRAMES, C_RFRAMES]] = (
                    si, n, a * consts.SIZE_ENTRY, n * consts.SIZE_ENTRY, -(-n * consts.SIZE_ENTRY // P), 1)
            tab[:, len(MSG_COLUMNS)] = sids
            tab[:, len(MSG_COLUMNS) + 1] = MsgType.SIZE_REQ
            self._round_native(tab, self._nodir, self._nokeys, e.view(np.uint8), None, None, None, None,
                               record_latency=False, data=False)
            return
        size_msgs: list[_Out] = []
        for (si, a, b), msg_id in zip(parts, sids.tolist()):
            shard_id = int(self._shard_ids[si])
            frames = codec.encode_size(msg_id=msg_id, client_id=self.client_id, shard_id=shard_id,
                                       entries=e[a:b], mtu=self.mtu)
            size_msgs.append(_Out(msg_id, MsgType.SIZE_REQ, shard_id, None, b - a, self._dest[shard_id],
                                  frames, lambda m: None))
        self._round(size_msgs, record_latency=False, data=False)

    def _datagram(self, frames: list, reply_len: int) -> int:
        """Largest IPv4 datagram (bytes) of a request's ``frames`` (UDP payloads) or of its reply
        of ``reply_len`` body bytes: what the path must carry for the message to be answered."""
        reply = consts.HDR_LEN + min(reply_len, consts.max_body_per_frame(self.mtu))
        return consts.IPV4_HDR_LEN + consts.UDP_HDR_LEN + max(max(len(f) for f in frames), reply)

    def _alloc_id(self) -> int:
        """One message id of the id clock (:class:`~.msgid.MsgIds`)."""
        return self._ids.take(1)

    def _send(self, m: _Out, retransmit: bool, frames: list | None = None, tries: bool = True) -> None:
        """Send ``m``'s frames (or only ``frames``, some of them: an update's poll or the fragments
        a shard lacks), with ``RETRANSMIT`` set if ``retransmit``; counts a try of ``m`` (and a
        retransmit) unless ``tries`` is False (the fragments an UPDATE_NACK asks for: the second
        half of the poll's try)."""
        for f in (m.frames if frames is None else frames):
            if retransmit:
                f = f[:4] + bytes([f[4] | consts.Flags.RETRANSMIT]) + f[5:]
            while True:
                try:
                    self.sock.sendto(f, m.dest)
                    break
                except BlockingIOError:
                    select.select([], [self.sock], [], self.timeout_s)
                except OSError as e:
                    if e.errno in (errno.ENOBUFS, errno.EAGAIN):
                        time.sleep(0.0005)
                        continue
                    raise
            self._stats.frames_sent += 1
            self._stats.bytes_sent += len(f)
        if not tries:
            return
        m.tries += 1
        if retransmit:
            self._stats.retransmits += 1

    def _round(self, msgs: list[_Out], record_latency: bool, data: bool = True) -> None:
        """Send ``msgs`` and wait for every reply: one round (see the module docstring for the
        window, the send order, the per-message timers and the loss detection); ``data``: a lookup
        or update round (counted in ``stats.data_rounds``), not a size round.

        Raises:
            ShardUnavailableError: a message was tried ``retries`` times without a reply.
            ShardError: a shard answered ERROR.
        """
        if not msgs:
            return
        self._count_round(len(msgs), len({m.shard_id for m in msgs}), data)
        queues: dict[int, collections.deque] = {}
        # largest first per shard (a stable sort keeps a table's pieces in order): the last messages
        # a shard gets in a round have no later answer to show them lost, only their timer, so they
        # should be the ones least likely to lose a frame
        for m in sorted(msgs, key=lambda m: -m.cost):
            queues.setdefault(m.shard_id, collections.deque()).append(m)
        inflight = dict.fromkeys(queues, 0)  # frames held in each shard's window
        seqs = self._seqs = itertools.count()  # order of every transmission in the round, re-sends included
        pending: dict[int, _Out] = {}
        live = [0]  # messages of the round not answered yet (probes aside)
        probes = self.tail_probes
        probe_src: dict[int, _Out] = {}  # per shard due a tail probe: the message it follows
        t0 = time.monotonic()

        def fill(shard_id: int) -> None:
            q = queues[shard_id]
            m = None
            while q and (inflight[shard_id] == 0 or inflight[shard_id] + q[0].cost <= self.window_frames):
                m = q.popleft()
                now = time.monotonic()
                m.t_first = m.t_sent = now  # latency: from this message's first frame to its reply
                m.seq0 = m.seq = next(seqs)
                m.rto = self._rtt[shard_id, m.msg_type].rto
                self._send(m, retransmit=False)
                m.deadline = time.monotonic() + m.rto
                self._stats.messages_sent += 1
                pending[m.msg_id] = m
                live[0] += 1
                inflight[shard_id] += m.cost
                if inflight[shard_id] > self._stats.max_inflight_frames:
                    self._stats.max_inflight_frames = inflight[shard_id]
            if m is not None and not q and probes:
                # the shard's last message of the round: nothing sent later could show it lost, so
                # a probe follows it (RFC 8985 7's tail loss probe, sent at once: it costs one
                # small message, and waiting for a probe timeout of 2·SRTT would cost more than a
                # whole round where a round is window-bound)
                probe_src[shard_id] = m

        def resend(m: _Out) -> None:
            """Recover ``m``: ask for the missing rows of a partly received lookup reply in a repair
            message (:meth:`_repair`), else send ``m`` again."""
            r = self._repair(m) if m.msg_type == MsgType.LOOKUP_REQ and not self.fixed_length else None
            if r is not None:
                del pending[m.msg_id]
                m = pending[r.msg_id] = r
                self._stats.repairs += 1
            m.seq = next(seqs)
            if r is not None:
                m.seq0 = m.seq  # a new message: its answer shows what was sent before it
            m.lost_at = 0.0
            m.t_sent = time.monotonic()
            poll = m.msg_type == MsgType.UPDATE_REQ and len(m.frames) > 1
            if poll:
                # an update of several fragments: one of them asks the shard what it holds (ACK if
                # applied, else UPDATE_NACK with its fragments, answered in _drain with the rest)
                self._stats.update_polls += 1
            self._send(m, retransmit=r is None, frames=m.frames[-1:] if poll else None)
            if r is not None:
                self._stats.retransmits += 1
            m.deadline = time.monotonic() + m.rto
            if probes and not queues[m.shard_id]:
                probe_src[m.shard_id] = m  # a probe right behind it: its answer shows a second loss

        def probe(shard_id: int) -> None:
            src = probe_src.pop(shard_id)
            if src.keys is None or not any(x.shard_id == shard_id and not x.probe for x in pending.values()):
                return
            now = time.monotonic()
            one = src.directory[:1].copy()
            one["num_keys"] = 1
            p = self._lookup_out(shard_id, one, src.keys[:1], lambda r: None, src.dest, t_first=now,
                                 t_sent=now, rto=self._rtt[shard_id, MsgType.LOOKUP_REQ].rto, probe=True)
            p.seq0 = p.seq = next(seqs)
            self._send(p, retransmit=False)
            p.deadline = time.monotonic() + p.rto
            pending[p.msg_id] = p
            self._stats.probes += 1

        for sid in queues:
            fill(sid)
        for sid in list(probe_src):
            probe(sid)
        while live[0] > 0:
            wait = min(min(m.deadline, m.lost_at or m.deadline) for m in pending.values()) - time.monotonic()
            if wait > 0:
                select.select([self.sock], [], [], wait)
            # read before any timer is acted on: a reply that arrived while this process was not
            # scheduled (a busy machine) is taken, not answered with a retransmission
            done, partial = self._drain(pending, record_latency)
            now = time.monotonic()
            for m in done:
                if m.probe:
                    continue
                live[0] -= 1
                inflight[m.shard_id] -= (m.root or m).cost  # a repair holds its round message's room
                if m.tries == 1 and m.root is None:  # Karn: a re-sent or repair message gives no sample
                    self._rtt[m.shard_id, m.msg_type].sample(now - m.t_first)
                fill(m.shard_id)
            if done or partial:
                # Loss detection (RACK, RFC 8985, by transmission order): a shard answers in the
                # order it was asked (per worker process), so a message whose latest transmission
                # went out before the first transmission of an answered message of its shard (or of
                # one whose reply has begun to come; or a probe's) lost a frame — unless its answer
                # is merely reordered (a shard's --workers answer by client and table): it is recovered once the
                # shard's reordering window (_reo_wnd) has passed without its answer.
                # RFC 6298 5.3 per shard: a shard that answers (a whole reply or a fragment) is making
                # progress, so the timers of its other messages restart (they may be queued behind).
                ev = dict(partial)  # a fragment of a later message's reply shows it as well
                for m in done:
                    # which transmission was answered: the latest, unless the answer came sooner than
                    # the shortest round trip seen after it (then it may be the first's; RFC 8985 6.2)
                    e = self._rtt[m.shard_id, m.msg_type]
                    s = m.seq if e.min_rtt is not None and now - m.t_sent >= e.min_rtt else m.seq0
                    ev[m.shard_id] = max(ev.get(m.shard_id, -1), s)
                for x in pending.values():
                    e = ev.get(x.shard_id)
                    if e is None or x.probe:
                        continue
                    if x.seq < e and not x.lost_at:
                        x.lost_at = now + self._reo_wnd(x)
                    if x.deadline < now + x.rto:
                        x.deadline = now + x.rto
            now = time.monotonic()
            for x in [x for x in pending.values() if x.lost_at and x.lost_at <= now]:
                if x.tries >= self.retries:  # later answers (probes too) keep showing it lost: a bound
                    self._give_up(x, pending, now, t0)
                self._stats.fast_retransmits += 1
                resend(x)
            for sid in list(probe_src):
                probe(sid)
            if done or live[0] == 0:
                continue  # read again before a timer is acted on (replies may have come meanwhile)
            now = time.monotonic()
            if min(m.deadline for m in pending.values()) <= now:
                self._expire(pending, now, t0, resend)
        for m in pending.values():  # probes still out: their answers are no stale replies
            self._late_probes[m.msg_id] = None
        while len(self._late_probes) > 4096:
            self._late_probes.popitem(last=False)

    def _repair(self, m: _Out) -> _Out | None:
        """A repair of lookup ``m`` whose reply came in part: a new LOOKUP_REQ (its own ``msg_id``)
        for only the keys whose rows lie in ``m``'s missing reply fragments, of whichever tables.
        Its reply's rows and the fragments already held make ``m``'s whole reply, handed to
        ``m.on_reply``. Lookups are idempotent reads, so asking again for some keys under a new id
        is safe; the card and the shards see an ordinary message. Returns None when no fragment
        of ``m``'s reply is held (its request may not have arrived: re-send ``m`` instead)."""
        part = self._reasm.partial(self.client_id, m.msg_id, MsgType.LOOKUP_REPLY)
        if part is None:
            return None
        h, parts, p = part
        d = m.directory
        total = m.value_len
        if (p <= 0 or d is None or h.msg_len != total or h.num_keys != m.num_keys
                or h.num_tables != len(d) or h.shard_id != m.shard_id or m.keys is None):
            return None  # not a reply of m's shape: let the whole message be asked again
        # every key's row: its table, its byte range [ks, ks + kl) in the reply body
        counts = d["num_keys"].astype(np.int64)
        tix = np.repeat(np.arange(len(d)), counts)
        kl = codec.row_bytes(d)[tix]
        ks = np.zeros(m.num_keys, np.int64)
        np.cumsum(kl[:-1], out=ks[1:])
        missing = np.ones(h.frag_count, bool)
        missing[np.fromiter(parts.keys(), np.int64, len(parts))] = False
        cm = np.zeros(h.frag_count + 1, np.int64)
        np.cumsum(missing, out=cm[1:])
        f0, f1 = ks // p, (ks + kl - 1) // p  # the fragments a row spans
        idx = np.flatnonzero(cm[f1 + 1] - cm[f0] > 0)
        body = bytearray(total)
        for j, b in parts.items():  # per fragment held (at most MAX_FRAGS)
            body[j * p:j * p + len(b)] = b
        self._reasm.discard(self.client_id, m.msg_id, MsgType.LOOKUP_REPLY)
        sub_counts = np.bincount(tix[idx], minlength=len(d))
        sub = d[sub_counts > 0].copy()
        sub["num_keys"] = sub_counts[sub_counts > 0]
        # where each byte of the repair's reply goes in the whole reply
        lens = kl[idx]
        dst = np.repeat(ks[idx] - np.concatenate(([0], np.cumsum(lens)[:-1])), lens) + np.arange(int(lens.sum()))

        def assemble(r: Message, body=body, dst=dst, target=m, h=h) -> None:
            np.frombuffer(body, np.uint8)[dst] = np.frombuffer(r.body, np.uint8)
            target.on_reply(Message(h, bytes(body), r.addr))

        root = m.root or m
        return self._lookup_out(m.shard_id, sub, m.keys[idx], assemble, m.dest, t_first=root.t_first,
                                t_sent=time.monotonic(), rto=m.rto, tries=m.tries, root=root)

    def _lookup_out(self, shard_id: int, directory: np.ndarray, keys: np.ndarray,
                    on_reply: Callable[[Message], None], dest: tuple[str, int], msg_id: int | None = None,
                    **kw) -> _Out:
        """A LOOKUP_REQ of ``keys`` (uint64 (n,), table by table as ``directory`` —
        :data:`codec.DIR_DTYPE` (T,) — says) to ``shard_id`` via ``dest``, under a new message id,
        encoded to the MTU, with its reply's fragment count and largest datagram (bytes); ``kw``
        sets more :class:`_Out` fields (times, a repair's ``root``, ``probe``). Every lookup message
        is made here: a round's (``msg_id`` given), a repair's and a tail probe's."""
        msg_id = self._alloc_id() if msg_id is None else msg_id
        frames = codec.encode_lookup(msg_id=msg_id, client_id=self.client_id, shard_id=shard_id,
                                     directory=directory, keys=keys, mtu=self.mtu)
        reply_len = codec.value_len_of(directory)
        return _Out(msg_id, MsgType.LOOKUP_REQ, shard_id, directory, len(keys), dest, frames, on_reply,
                    reply_frames=codec.frag_geometry(reply_len, self.mtu)[1],
                    datagram=self._datagram(frames, reply_len), keys=keys, value_len=reply_len, **kw)

    def _give_up(self, m: _Out, pending: dict, now: float, t0: float) -> None:
        """Raise :class:`ShardUnavailableError` for ``m``, tried ``retries`` times (a path-MTU hint
        when smaller messages were answered)."""
        what = "lookup" if m.msg_type == MsgType.LOOKUP_REQ else (
            "update" if m.msg_type == MsgType.UPDATE_REQ else "size")
        n = sum(1 for x in pending.values() if x.shard_id == m.shard_id and not x.probe)
        big = max(x.datagram for x in pending.values() if x.shard_id == m.shard_id)
        hint = self._mtu_hint(big)
        raise ShardUnavailableError(m.shard_id, m.dest, m.tries, now - t0,
                                    f"{n} {what} messages", via_card=self.via_card, path_mtu_hint=hint,
                                    config_path=self.cfg.path)

    def _mtu_hint(self, big: int) -> str | None:
        """What to say when messages of ``big``-byte datagrams go unanswered while smaller ones were
        answered (None otherwise)."""
        if 0 < self._largest_answered < big:
            return (f"Messages whose datagrams were at most {self._largest_answered} bytes were answered, "
                    f"these need {big}-byte datagrams: the path may not carry MTU {self.mtu} (every "
                    f"link's MTU, the card's --mtu and its ports' frame size; `embnic status` counts "
                    f"frames the card got cut short as `truncated`).")
        return None

    def _reo_wnd(self, m: _Out) -> float:
        """Reordering window (s) of ``m``'s shard and type (RFC 8985 6.2): a quarter of its shortest
        round trip seen (of its RTO before any sample), at least :data:`REO_WND_MIN_MS` — room for
        the answers of other tables that a shard's ``--workers`` let pass each other. (RFC 8985
        widens it on proof of a needless re-send; here an answer sooner than usual proves nothing:
        a lone re-sent message is answered faster than one queued in a burst.)"""
        e = self._rtt[m.shard_id, m.msg_type]
        return max(REO_WND_MIN_MS / 1000.0, (e.min_rtt if e.min_rtt is not None else e.rto) / 4)

    def _expire(self, pending: dict, now: float, t0: float, resend: Callable[[_Out], None]) -> None:
        """Timers that fired: per shard, re-send only the fired message transmitted first (RFC
        6298 5.4: a shard that stalled on a busy machine costs one spurious re-send, not one per
        message in flight; a real loss of the others shows when the re-sent one is answered, or by
        their own timers, restarted here) and double that message's timer (5.5, per message: the
        shard's estimate is left to the next sample, so one lossy message does not slow every
        other message's timer)."""
        self._reasm.expire()
        for m in [m for m in pending.values() if m.probe and m.deadline <= now]:
            del pending[m.msg_id]  # a probe is never re-sent: the timers of what it followed cover it
            self._late_probes[m.msg_id] = None
        fired = [m for m in pending.values() if m.deadline <= now]
        for m in fired:
            if m.tries >= self.retries:
                self._give_up(m, pending, now, t0)
        first: dict[int, _Out] = {}  # per shard, the fired message transmitted first
        for m in fired:
            if m.shard_id not in first or m.seq < first[m.shard_id].seq:
                first[m.shard_id] = m
        for m in fired:
            if first[m.shard_id] is not m:
                m.deadline = now + m.rto  # its turn comes if the one re-sent does not show progress
                continue
            self._stats.timeouts += 1
            m.rto = min(m.rto * 2, self._rtt[m.shard_id, m.msg_type].rto_max)
            resend(m)

    def _drain(self, pending: dict, record_latency: bool) -> tuple[list[_Out], dict[int, int]]:
        """Read every waiting datagram. Returns the messages whose reply completed and, per shard,
        the latest first transmission (``seq0``) of a pending message of which a reply fragment
        came without completing it (its shard answered everything sent before it)."""
        buf = self._buf
        done: list[_Out] = []
        partial: dict[int, int] = {}
        while True:
            try:
                n, addr = self.sock.recvfrom_into(buf)
            except (BlockingIOError, InterruptedError):
                return done, partial
            self._stats.frames_received += 1
            self._stats.bytes_received += n
            payload = bytes(buf[:n])
            try:
                fh = codec.parse_header(payload, expect="reply")
            except codec.FrameError:
                fh = None  # the reassembler counts it by reason
            msg = self._reasm.feed(payload, addr, header=fh)
            if msg is None:
                if fh is not None and fh.frag_count > 1:
                    m = pending.get(fh.msg_id)
                    if (m is not None and fh.client_id == self.client_id and fh.shard_id == m.shard_id
                            and fh.msg_type == _REPLY[m.msg_type] and m.seq0 > partial.get(m.shard_id, -1)):
                        partial[m.shard_id] = m.seq0
                continue
            h = msg.header
            m = pending.get(h.msg_id)
            if m is None or h.client_id != self.client_id:
                if m is None and h.client_id == self.client_id and h.msg_id in self._late_probes:
                    del self._late_probes[h.msg_id]  # a probe's answer after its round
                    continue
                self._stats.stale_replies += 1
                continue
            if h.shard_id != m.shard_id:  # docs/protocol.md, "The card's state map"
                self._stats.drops["wrong_shard_reply"] += 1
                continue
            if h.msg_type == MsgType.ERROR:
                raise ShardError(m.shard_id, h.table_id, h.status)
            if h.msg_type == MsgType.UPDATE_NACK and m.msg_type == MsgType.UPDATE_REQ:
                self._answer_nack(m, msg)
                if m.seq0 > partial.get(m.shard_id, -1):
                    partial[m.shard_id] = m.seq0  # the shard answered: what it was sent before m arrived
                continue
            if (h.msg_type != _REPLY[m.msg_type] or h.num_keys != m.num_keys or h.num_tables != m.num_tables
                    or h.value_len != m.value_len):
                self._stats.drops["mismatched_reply"] += 1
                continue
            self._largest_answered = max(self._largest_answered, m.datagram)
            m.on_reply(msg)
            del pending[h.msg_id]
            done.append(m)
            if m.probe:
                continue
            self._stats.messages_received += 1
            if record_latency:
                self._stats.lookup_latency_us.append((time.monotonic() - m.t_first) * 1e6)

    def _answer_nack(self, m: _Out, msg: Message) -> None:
        """An UPDATE_NACK for update ``m``: re-send (``RETRANSMIT``) exactly the fragments the shard
        does not hold, at once; ``m`` stays pending until its UPDATE_ACK, under its timer."""
        h = msg.header
        if h.num_keys != m.num_keys or h.value_len != m.value_len or len(msg.body) != consts.NACK_LEN:
            self._stats.drops["mismatched_reply"] += 1
            return
        held = codec.nack_held(msg.body, len(m.frames))
        missing = [f for f, have in zip(m.frames, held.tolist()) if not have]
        self._stats.nacks += 1
        if missing:
            # a transmission of its own: answers of what was sent before it (a tail probe after
            # the poll) must not show it lost again
            m.seq = next(self._seqs)
            m.lost_at = 0.0
            self._send(m, retransmit=True, frames=missing, tries=False)
            self._stats.tries_by_nack += 1
            self._stats.frames_resent += len(missing)
        m.t_sent = time.monotonic()
        m.deadline = m.t_sent + m.rto

    def rtt(self, shard_id: int, msg_type: int = MsgType.LOOKUP_REQ) -> dict:
        """``{"srtt_ms", "rttvar_ms", "rto_ms", "samples"}`` of the :class:`RttEstimator` of one
        shard and request type (``srtt_ms`` None before the first sample).
        Raises KeyError for an unknown shard or a type that is not a request."""
        if self._native is not None:
            srtt, rttvar, rto, _, samples = self._native.rtt(self._shard_index[shard_id], int(msg_type))
            if int(msg_type) not in consts.REQUEST_TYPES:
                raise KeyError(msg_type)
            return {"srtt_ms": None if srtt is None else srtt * 1e3, "rttvar_ms": rttvar * 1e3, "rto_ms": rto * 1e3,
                    "samples": samples}
        e = self._rtt[shard_id, msg_type]
        return {"srtt_ms": None if e.srtt is None else e.srtt * 1e3, "rttvar_ms": e.rttvar * 1e3,
                "rto_ms": e.rto * 1e3, "samples": e.samples}

    @property
    def drops(self) -> collections.Counter:
        """Frames dropped by the reassembler by reason, plus mismatched replies."""
        c = collections.Counter(self._reasm.drops)
        c.update(self.stats.drops)
        return c


def pack_parts(cfg: ClusterConfig, msg_type: int, parts: list, *, mtu: int,
               msg_frames: int | None = DEFAULT_MSG_FRAMES, window_frames: int = DEFAULT_WINDOW_FRAMES) -> list[list]:
    """Cut one shard's ``parts`` — ``[(table_id, positions, keys), ...]``, every table it holds
    keys of (positions int64 (k,), keys uint64 (k,); anything with ``len`` and slicing, e.g.
    ``range``, serves a planner that needs only the counts) — into the messages of a round: as
    few as fit, in table order, a table's keys split across two messages only where one would
    overflow. A message fits when it and its reply each take at most ``msg_frames`` (and
    :data:`consts.MAX_FRAGS`) fragments of ``P = mtu - 72`` bytes and, where the send window
    allows it, both together leave the window room (``window_frames - 2`` frames of ``P``
    bytes). What :class:`EmbeddingClient` sends (its ``_pack``) and what ``embnic plan`` counts.

    Returns:
        the pieces, each a list of ``(table_id, positions, keys)`` slices (views, no copies).

    Raises:
        KeyError: a table not in ``cfg``. ValueError: an MTU without room for a body byte.
    """
    P = consts.max_body_per_frame(mtu)
    frags = consts.MAX_FRAGS if not msg_frames else min(msg_frames, consts.MAX_FRAGS)
    B = frags * P
    W = (window_frames - 2) * P if window_frames >= 3 else None
    lookup = msg_type == MsgType.LOOKUP_REQ
    pieces: list[list] = []
    cur: list = []
    req = rep = 0
    for table_id, pos, keys in parts:
        t = cfg.table(table_id)
        row = t.dim * consts.esize(t.wire_dtype)
        rk, pk = (consts.KEY_SIZE, row) if lookup else (consts.KEY_SIZE + row, 0)
        a, n = 0, len(keys)
        while a < n:
            room = (B - req - consts.DIR_ENTRY) // rk
            if pk:
                room = min(room, (B - rep) // pk)
            if W is not None:
                room = min(room, (W - req - rep - consts.DIR_ENTRY) // (rk + pk))
            if room <= 0 and cur:
                pieces.append(cur)
                cur, req, rep = [], 0, 0
                continue
            k = min(n - a, max(1, room))
            cur.append((table_id, pos[a:a + k], keys[a:a + k]))
            req += consts.DIR_ENTRY + k * rk
            rep += k * pk
            a += k
    if cur:
        pieces.append(cur)
    return pieces
