"""The client: lookups and updates as embnic messages over UDP, each round planned and run in C.

:class:`EmbeddingClient` turns ``{table_id: unique keys}`` into one variable-length message per
shard (protocol v2: every table the shard holds a part of, after a per-table directory), routed
as :mod:`embnic.client_lib.routing` says, fragmented to the cluster MTU and split into several
messages only where a message or its reply would need more than ``msg_frames`` fragments or
would not fit the send window; sends them in one round, reassembles the replies and puts every
row back at its key's position. The transport — send window, loss found by later answers (RACK)
and by per-message timers (RFC 6298), tail probes, lookup repair, update NACKs — is
docs/protocol.md, "Reliability". It talks to the shards directly, or through the card when the
config's ``[card]`` is enabled (:meth:`~embnic.client_lib.config.ClusterConfig.request_destination`).

The round's checks and plan are one C call (:func:`.native.prepare`, ``csrc/plan.c``), the
round itself another (:class:`.native.NativeRound`, ``csrc/round.c`` and its siblings); this
class holds the settings, the message id clock and the counters, and turns the round's outcome
into rows or errors. Without its library the client raises
:class:`~embnic.client_lib.clib.NativeLibraryError` (one line naming the rebuild command).
"""
from __future__ import annotations

import collections
import os
import socket
from collections.abc import Mapping

import numpy as np

from . import codec, consts, native, precheck
from .config import ClusterConfig
from .consts import MsgType
from .errors import EmbnicError, ShardError, ShardUnavailableError  # noqa: F401 (the client's errors)
from .msgid import MsgIds
from .roundplan import (C_FRAMES, C_MSGLEN, C_NKEYS, C_NT, C_RFRAMES, C_SHARD, C_VOFF, MSG_COLUMNS, RoundPlan,
                        TableArrays)
from .rtt import DEFAULT_RTO_MAX_MS, DEFAULT_RTO_MIN_MS, rto_bounds_s
from .sockets import set_socket_buffers
from .stats import ClientStats

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
        tail_probes: send a tail probe after a shard's last message of a round (never in the
            fixed-length mode, whose shards take only announced messages).
        fixed_length: the fixed-length baseline (docs/protocol.md, "Size messages"): every
            round is preceded by a size round (one SIZE_REQ per shard, and every SIZE_ACK).

    Raises:
        KeyError: unknown ``client_id``.
        ValueError: ``window_frames`` < 1, ``msg_frames`` < 1 or bad RTO bounds.
        OSError: the address cannot be bound.
        NativeLibraryError: the client's C library is missing or stale (:mod:`.clib`; one line
            naming the rebuild command).
    """

    def __init__(self, cfg: ClusterConfig, client_id: int, *, bind: tuple[str, int] | None = None,
                 timeout_ms: int | None = None, retries: int | None = None, mtu: int | None = None,
                 window_frames: int = DEFAULT_WINDOW_FRAMES, rto_min_ms: float = DEFAULT_RTO_MIN_MS,
                 rto_max_ms: float = DEFAULT_RTO_MAX_MS, fixed_length: bool = False,
                 msg_frames: int | None = DEFAULT_MSG_FRAMES, tail_probes: bool = True):
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
        #: bounds of every retransmission timer (s); one estimator per (shard, request type) in C
        self.rto_min_s, self.rto_max_s = rto_bounds_s(rto_min_ms, rto_max_ms)
        lib = native.load()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        set_socket_buffers(self.sock)
        self.sock.bind(bind if bind is not None else (me.ip, me.port))
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()
        self._stats = ClientStats()  # (the `stats` property: the C round's counters added when read)
        # message ids follow the id clock (msgid.py, docs/protocol.md "Message ids"): never
        # reused while a shard's exactly-once window may remember them, in this run or the next
        self._ids = MsgIds(client_id)
        self._dest = {s.id: cfg.request_destination(client_id, s.id) for s in cfg.shards}
        self.via_card = cfg.card is not None and cfg.card.enabled
        self._largest_answered = 0  # largest datagram (bytes) of an answered message or its reply
        self._ta = TableArrays(cfg)
        self._shard_ids = np.array([s.id for s in cfg.shards], np.int64)
        self._shard_index = {s.id: i for i, s in enumerate(cfg.shards)}
        self._native = native.NativeRound(
            lib, self.sock, client_id, mtu=self.mtu, window_frames=self.window_frames, retries=self.retries,
            timeout_s=self.timeout_s, rto_min_s=self.rto_min_s, rto_max_s=self.rto_max_s,
            tail_probes=self.tail_probes, fixed_length=self.fixed_length, shard_ids=[s.id for s in cfg.shards],
            dests=[self._dest[s.id] for s in cfg.shards])
        self._native_seen = self._native.counters()
        self._ws = native.Workspace()  # the C plan's arrays, reused from round to round

    # -- public API -------------------------------------------------------------------------

    @property
    def stats(self) -> ClientStats:
        """This client's counters (:class:`ClientStats`); the C round's are added when they are read."""
        self._sync_counters()
        return self._stats

    @stats.setter
    def stats(self, value: ClientStats) -> None:
        self._sync_counters()  # what the C round counted so far belongs to the old object
        self._stats = value

    def lookup(self, requests: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        """Fetch rows for every table in one round, one message per shard touched
        (:meth:`Backend.lookup <embnic.client_lib.backend.Backend.lookup>`, which says what it
        raises; rows are views of one buffer holding every table's rows)."""
        plan = self._plan(MsgType.LOOKUP_REQ, precheck.plain_arrays(requests, lambda v: v), None,
                          lambda: precheck.lookup_flat(self.cfg, self._ta, requests))
        return plan.split(self._run(plan))

    def lookup_flat(self, table_ids, counts, keys) -> np.ndarray:
        """:meth:`lookup` of a round given flat, with no step per table
        (:meth:`Backend.lookup_flat <embnic.client_lib.backend.Backend.lookup_flat>`)."""
        return self._run(self._plan(MsgType.LOOKUP_REQ, precheck.plain_jagged(table_ids, counts, keys), None,
                                    lambda: precheck.lookup_jagged(self.cfg, self._ta, table_ids, counts, keys)))

    def update(self, updates: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Push gradients for every table in one round, one message per shard touched, and return
        once every shard acked (:meth:`Backend.update <embnic.client_lib.backend.Backend.update>`:
        checked whole before anything is sent, so no shard applies its part of an update another
        shard would refuse)."""
        flat = g = None
        if isinstance(updates, Mapping) and all(isinstance(e, tuple) and len(e) == 2 for e in updates.values()):
            flat = precheck.plain_arrays(updates, lambda e: e[0])
            g = precheck.plain_grads([e[1] for e in updates.values()]) if flat is not None else None
        grads, gshape = g or (None, None)
        self._run(self._plan(MsgType.UPDATE_REQ, flat if g else None, grads,
                             lambda: precheck.update_flat(self.cfg, self._ta, updates), gshape=gshape))

    def update_flat(self, table_ids, counts, keys, grads) -> None:
        """:meth:`update` of a round given flat, with no step per table
        (:meth:`Backend.update_flat <embnic.client_lib.backend.Backend.update_flat>`)."""
        flat = precheck.plain_jagged(table_ids, counts, keys)
        g = np.asarray(grads)
        plain = flat is not None and g.dtype == np.float32 and g.ndim == 1 and g.flags.c_contiguous
        self._run(self._plan(MsgType.UPDATE_REQ, flat if plain else None, g, lambda: precheck.update_jagged(
            self.cfg, self._ta, table_ids, counts, keys, grads)))

    def rtt(self, shard_id: int, msg_type: int = MsgType.LOOKUP_REQ) -> dict:
        """``{"srtt_ms", "rttvar_ms", "rto_ms", "samples"}`` of the round-trip time estimator (RFC
        6298) of one shard and request type (``srtt_ms`` None before the first sample).
        Raises KeyError for an unknown shard or a type that is not a request."""
        srtt, rttvar, rto, _, samples = self._native.rtt(self._shard_index[shard_id], int(msg_type))
        if int(msg_type) not in consts.REQUEST_TYPES:
            raise KeyError(msg_type)
        return {"srtt_ms": None if srtt is None else srtt * 1e3, "rttvar_ms": rttvar * 1e3, "rto_ms": rto * 1e3,
                "samples": samples}

    @property
    def drops(self) -> collections.Counter:
        """Frames dropped by reason (reassembly's reasons, mismatched and wrong-shard replies)."""
        return collections.Counter(self.stats.drops)

    def close(self) -> None:
        """Close the socket (and free the C round engine's context; its counters stay in :attr:`stats`)."""
        self._sync_counters()
        self._native.close()
        self.sock.close()

    def __enter__(self) -> "EmbeddingClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------

    def _prepare(self, msg_type: int, table_ids, counts, keys, grads, gshape=None,
                 trusted: bool = False) -> RoundPlan | None:
        """The round checked and planned in one C call (:func:`native.prepare`), or None when a
        check fails (the per-table checks of :mod:`.precheck` then say why, or pass it on)."""
        first = self._ids.next()
        plan = native.prepare(self._native.lib, self._ta, self._ws, msg_type, table_ids, counts, keys, grads,
                              mtu=self.mtu, msg_frames=self.msg_frames, window_frames=self.window_frames,
                              next_id=first, gshape=gshape, trusted=trusted)
        if plan is not None:
            plan.first_id = first  # its ids are first .. plan.next_id - 1 (taken when it runs)
            if grads is not None and plan.vals is None and plan.num_msgs:  # fp16 tables: rounded in numpy
                plan.vals = plan.values(grads)
        return plan

    def _plan(self, msg_type: int, flat, grads, checked, gshape=None) -> RoundPlan:
        """The round planned: by the C plan, which checks it, when it came as plain arrays (``flat``,
        ``grads``, ``gshape``: :mod:`.precheck`'s ``plain_*``; None: it did not), else — or when the C
        plan refuses it — after :mod:`.precheck`'s per-table checks (``checked()``: ``(tix, counts,
        keys[, grads float32 flat])``, which raises naming the table and the problem), trusting them
        (an update's keys may come in any order)."""
        plan = self._prepare(msg_type, *flat, grads, gshape=gshape) if flat is not None else None
        if plan is not None:
            return plan
        tix, counts, keys, *grads = checked()
        plan = self._prepare(msg_type, np.ascontiguousarray(self._ta.ids[tix], np.int64),
                             np.ascontiguousarray(counts, np.int64), np.ascontiguousarray(keys, np.uint64),
                             np.ascontiguousarray(grads[0], np.float32) if grads else None, trusted=True)
        if plan is None:  # the per-table checks and the C plan's disagree: a bug, never a round half-sent
            raise AssertionError("the C plan refused a round precheck passed")
        return plan

    def _run(self, plan: RoundPlan) -> np.ndarray | None:
        """Send a planned round (an update's values ``plan.vals``) and wait for every answer: its
        message ids taken from the id clock, a size round first in the fixed-length mode, then the
        round's messages in the send queue's order (``plan.qorder``), counted and exchanged
        (:meth:`_exchange`). Returns a lookup's rows, every table's flat (:meth:`RoundPlan.finish`
        of the buffer :meth:`RoundPlan.out_layout` lays out), None for an update."""
        lookup = plan.msg_type == MsgType.LOOKUP_REQ
        dst, _, nbytes = plan.out_layout() if lookup else (None, 0, 0)
        out = np.empty(nbytes, np.uint8) if lookup else None
        if plan.num_msgs:
            self._ids.advance(plan.first_id, plan.next_id)
            if self.fixed_length:
                self._size_round(plan, plan.tab[:, len(MSG_COLUMNS)])
            tab, st = plan.tab[plan.qorder] if len(plan.tab) > 1 else plan.tab, self._stats
            st.rounds += 1
            st.data_rounds += 1
            st.round_messages += len(tab)
            st.round_shards += len(set(tab[:, C_SHARD].tolist())) if len(tab) > 1 else 1
            self._exchange(tab, plan.dir, plan.keys, plan.vals, dst, plan.rb, plan.so, out, lookup)
        return plan.finish(out) if lookup else None

    def _exchange(self, tab, directory, keys, vals, dst, rb, so, out, record_latency: bool) -> None:
        """Send the round's messages (``tab`` in queue order) and wait for every answer in the C
        engine (:meth:`native.NativeRound.run`): its outcome raised as :class:`ShardError`,
        :class:`ShardUnavailableError` or OSError, its latencies into :attr:`stats`."""
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
            self._give_up(int(self._shard_ids[res[R["shard"]]]), int(res[R["type"]]), int(res[R["tries"]]),
                          res[R["elapsed_ns"]] / 1e9, int(res[R["nmsg"]]), int(res[R["big"]]))
        if kind == native.KIND_OS_ERROR:
            e = int(res[R["errno"]])
            raise OSError(e, os.strerror(e))

    def _give_up(self, shard_id: int, msg_type: int, tries: int, elapsed_s: float, n: int, big: int) -> None:
        """Raise :class:`ShardUnavailableError` for ``shard_id``, whose message of ``msg_type`` was
        tried ``tries`` times while ``n`` messages of the round to it (of ``big``-byte datagrams at
        most) went unanswered (a path-MTU hint when smaller messages were answered)."""
        what = "lookup" if msg_type == MsgType.LOOKUP_REQ else ("update" if msg_type == MsgType.UPDATE_REQ else "size")
        hint = None
        if 0 < self._largest_answered < big:
            hint = (f"Messages whose datagrams were at most {self._largest_answered} bytes were answered, "
                    f"these need {big}-byte datagrams: the path may not carry MTU {self.mtu} (every "
                    f"link's MTU, the card's --mtu and its ports' frame size; `embnic status` counts "
                    f"frames the card got cut short as `truncated`).")
        raise ShardUnavailableError(shard_id, self._dest[shard_id], tries, elapsed_s, f"{n} {what} messages",
                                    via_card=self.via_card, path_mtu_hint=hint, config_path=self.cfg.path)

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
        i0 = self._ids.take(len(parts))  # the SIZE_REQs' ids, consecutive in the id clock's cycle
        self._stats.size_rounds += 1
        self._stats.rounds += 1
        tab = np.zeros((len(parts), native.NCOL), np.int64)
        P = consts.max_body_per_frame(self.mtu)
        for j, (si, a, b) in enumerate(parts):  # per SIZE_REQ (one per shard, bar 256-fragment splits)
            n = b - a
            tab[j, [C_SHARD, C_NKEYS, C_VOFF, C_MSGLEN, C_FRAMES, C_RFRAMES]] = (
                si, n, a * consts.SIZE_ENTRY, n * consts.SIZE_ENTRY, -(-n * consts.SIZE_ENTRY // P), 1)
        tab[:, len(MSG_COLUMNS)] = (i0 - 1 + np.arange(len(parts), dtype=np.int64)) % 0xFFFFFFFF + 1
        tab[:, len(MSG_COLUMNS) + 1] = MsgType.SIZE_REQ
        tab = tab[np.argsort(-(tab[:, C_FRAMES] + tab[:, C_RFRAMES]), kind="stable")]  # the largest first
        self._exchange(tab, np.zeros(0, codec.DIR_DTYPE), np.zeros(0, np.uint64), e.view(np.uint8), None, None, None,
                       None, record_latency=False)

    def _sync_counters(self) -> None:
        """Add what the C engine counted since the last look to :attr:`stats`."""
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
