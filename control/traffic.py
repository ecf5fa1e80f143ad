"""One client's traffic per training step (``embnic plan``'s traffic model, docs/planning.md
"Traffic per step"): a lookup round, then an update round of the same unique ids, counted as
:class:`~embnic.client_lib.client.EmbeddingClient` builds rounds under protocol v2.

Each table's unique ids of the step are routed to shards (:func:`split_keys`); every shard's
part of a round is cut into messages by the client's own rule (:func:`pack_counts`, a closed
form of the C plan's cut), tail probes included. Byte counts are UDP payloads (header +
fragment), as ``ClientStats.bytes_sent`` counts them; Gb/s add :data:`WIRE_OVERHEAD`. Which
tables a shard keeps on the disk tier (:func:`stores`, :func:`disk_tables`) sets which of its
keys are disk keys. The rest of the plan is :mod:`.capacity`.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.client import DEFAULT_MSG_FRAMES, DEFAULT_WINDOW_FRAMES
from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.consts import MsgType
from embnic.client_lib.routing import shard_index_of

#: bytes a frame takes on the wire beyond its UDP payload: Ethernet header 14, IPv4 20, UDP 8,
#: FCS 4, preamble + start delimiter 8, inter-frame gap 12
WIRE_OVERHEAD = 14 + consts.IPV4_HDR_LEN + consts.UDP_HDR_LEN + 4 + 8 + 12
#: the :class:`Traffic` counts a shard's round adds to, in the order of :func:`_shard_round`'s totals
_TOTALS = ("req_messages", "rep_messages", "req_frames", "rep_frames", "req_bytes", "rep_bytes", "probes")


@dataclasses.dataclass
class Traffic:
    """One client's traffic of one step (a lookup round and an update round), by direction.

    ``req_*``: client → shard (through the card), tail probes included in frames and bytes;
    ``rep_*``: shard → client. Messages exclude probes (``ClientStats.messages_sent`` does);
    ``probes`` counts them. Bytes are UDP payloads. ``per_shard``: per shard index ``[keys
    (lookup + update), request bytes, reply bytes, request frames, reply frames, update request
    body bytes]`` of the step (probes included but in the last); ``inflight``: messages of the step's largest round in flight at once
    (probes included, bounded per shard by the send window).
    """

    req_messages: int = 0
    req_frames: int = 0
    req_bytes: int = 0
    rep_messages: int = 0
    rep_frames: int = 0
    rep_bytes: int = 0
    probes: int = 0
    rounds: int = 2
    per_shard: np.ndarray | None = None
    inflight: int = 0
    disk_keys: np.ndarray | None = None  # per shard index: keys of the step (lookup + update) of disk-tier tables
    round_frames: list = dataclasses.field(default_factory=list)  # (lookup, update) frames both ways

    @property
    def frames(self) -> int:
        return self.req_frames + self.rep_frames

    @property
    def wire_bits(self) -> float:
        """Bits on the wire of the step, both directions (Ethernet to inter-frame gap)."""
        return 8.0 * (self.req_bytes + self.rep_bytes + WIRE_OVERHEAD * self.frames)


def _frames(body: int, mtu: int) -> int:
    return codec.frag_geometry(body, mtu)[1]


def split_keys(cfg: ClusterConfig, table_id: int, unique: float) -> np.ndarray:
    """Integer keys of ``table_id`` per shard index for ``unique`` expected unique ids: int64 (S,).

    ``table`` sharding: all on the owning shard; ``hash``: as even as integers allow (the first
    ``u mod S`` shards, rotated by table id, get one more), so the keys add up to ``round(unique)``.
    """
    s = len(cfg.shards)
    u = int(round(unique))
    out = np.zeros(s, np.int64)
    if cfg.sharding == "table":
        out[int(shard_index_of(cfg, table_id, np.zeros(1, np.uint64))[0])] = u
        return out
    out[:] = u // s
    extra = (np.arange(u % s) + table_id) % s
    out[extra] += 1
    return out


def pack_counts(cfg: ClusterConfig, msg_type: int, parts: list, *, mtu: int,
                msg_frames: int | None = DEFAULT_MSG_FRAMES,
                window_frames: int = DEFAULT_WINDOW_FRAMES) -> list[tuple[int, int, int, int, int]]:
    """The messages the client's cut (``client_lib/csrc/plan.c``, :func:`embnic.client_lib.native.prepare`)
    makes of one shard's round, counted without a key: ``parts`` is ``[(table_id, keys), ...]``
    (counts, int), the result ``[(first table id, tables, keys, value bytes, multiplicity), ...]``
    in send order, runs of identical full one-table messages collapsed into one entry with their
    multiplicity.

    A closed form of that cut (as many keys as fit, in table order; a new message only where the
    next key would overflow ``msg_frames`` fragments either way or the send window), with a
    table's run of full messages past the first counted by division, so time and memory grow
    with the tables, not the keys: a step of 10^12 ids costs what one of 10^4 does.
    ``tests/control/test_plan.py`` checks it equal to the C plan, message for message, on
    random rounds.

    Raises:
        KeyError: a table not in ``cfg``. ValueError: an MTU without room for a body byte.
    """
    P = consts.max_body_per_frame(mtu)
    frags = consts.MAX_FRAGS if not msg_frames else min(msg_frames, consts.MAX_FRAGS)
    B = frags * P
    W = (window_frames - 2) * P if window_frames >= 3 else None
    lookup = msg_type == MsgType.LOOKUP_REQ
    out: list = []
    cur: list = []  # (table_id, keys, value bytes) of the message being filled
    req = rep = 0

    def room_of(rk: int, pk: int, req: int, rep: int) -> int:
        room = (B - req - consts.DIR_ENTRY) // rk
        if pk:
            room = min(room, (B - rep) // pk)
        if W is not None:
            room = min(room, (W - req - rep - consts.DIR_ENTRY) // (rk + pk))
        return room

    def close():
        out.append((cur[0][0], len(cur), sum(k for _, k, _ in cur), sum(v for _, _, v in cur), 1))

    for table_id, n in parts:
        t = cfg.table(table_id)
        row = t.dim * consts.esize(t.wire_dtype)
        rk, pk = (consts.KEY_SIZE, row) if lookup else (consts.KEY_SIZE + row, 0)
        a, n = 0, int(n)
        while a < n:
            if not cur:
                # a run of full one-table messages: each takes `full` keys and is closed by the
                # next key (no room left after it), as the C plan's loop does key by key
                full = room_of(rk, pk, 0, 0)
                if full >= 1 and n - a > 2 * full \
                        and room_of(rk, pk, consts.DIR_ENTRY + full * rk, full * pk) <= 0:
                    m = (n - a) // full - 1
                    out.append((table_id, 1, full, full * row, m))
                    a += m * full
            room = room_of(rk, pk, req, rep)
            if room <= 0 and cur:
                close()
                cur, req, rep = [], 0, 0
                continue
            k = min(n - a, max(1, room))
            cur.append((table_id, k, k * row))
            req += consts.DIR_ENTRY + k * rk
            rep += k * pk
            a += k
    if cur:
        close()
    return out


def step_traffic(cfg: ClusterConfig, unique: dict, *, mtu: int | None = None,
                 msg_frames: int | None = DEFAULT_MSG_FRAMES, window_frames: int = DEFAULT_WINDOW_FRAMES,
                 tail_probes: bool = True) -> Traffic:
    """Messages, frames and bytes of one client's step (lookup round + update round) under
    protocol v2, as :class:`~embnic.client_lib.client.EmbeddingClient` builds them.

    Args:
        cfg: the cluster (tables, shards, sharding; ``mtu`` defaults to its ``[cluster] mtu``).
        unique: ``{table_id: unique ids in the step}`` (floats are rounded per table).
        msg_frames, window_frames, tail_probes: the client's settings (its defaults).

    Returns:
        a :class:`Traffic`.

    Raises:
        KeyError: a table not in ``cfg``. ValueError: an MTU without room for a body byte.
    """
    mtu = int(mtu or cfg.mtu)
    consts.max_body_per_frame(mtu)  # an MTU without room for a body byte: ValueError here
    S = len(cfg.shards)
    tids = [t.id for t in cfg.tables if unique.get(t.id, 0) >= 0.5]
    keys = np.array([split_keys(cfg, t, unique[t]) for t in tids], np.int64).reshape(len(tids), S)
    row = {t.id: t.dim * consts.esize(t.wire_dtype) for t in cfg.tables}
    tr = Traffic(per_shard=np.zeros((S, 6), np.float64))
    on_disk = disk_tables(cfg)
    disk_mask = np.array([[t in on_disk[s] for s in range(S)] for t in tids], bool).reshape(len(tids), S)
    tr.disk_keys = 2.0 * np.where(disk_mask, keys, 0).sum(axis=0, dtype=np.int64)
    by_shard = keys.T.tolist()
    # per shard as plain floats (float64 arithmetic, added in the same order as before), so that
    # shards with the same part of the round share one computation (_shard_round): hash sharding
    # gives at most a few distinct parts however many shards (`plan`'s shard search at 4096 shards)
    acc = [[0.0] * 6 for _ in range(S)]
    memo: dict = {}
    for mt in (MsgType.LOOKUP_REQ, MsgType.UPDATE_REQ):
        round_frames = round_inflight = 0
        for s in range(S):
            parts = tuple((t, k) for t, k in zip(tids, by_shard[s]) if k)
            if not parts:
                continue
            key = (mt, parts, tuple(acc[s]))
            got = memo.get(key)
            if got is None:
                got = memo[key] = _shard_round(cfg, mt, parts, acc[s], mtu=mtu, msg_frames=msg_frames,
                                               window_frames=window_frames, tail_probes=tail_probes, row=row)
            totals, acc[s], frames, n_in = got
            for field, v in zip(_TOTALS, totals):
                setattr(tr, field, getattr(tr, field) + v)
            round_frames += frames
            round_inflight += n_in
        tr.round_frames.append(round_frames)
        tr.inflight = max(tr.inflight, round_inflight)  # the step's largest round
    tr.per_shard[:] = np.array(acc, np.float64).reshape(S, 6)
    return tr


def _shard_round(cfg: ClusterConfig, mt: int, parts: tuple, start: list, *, mtu: int, msg_frames: int | None,
                 window_frames: int, tail_probes: bool, row: dict) -> tuple[tuple, list, int, int]:
    """One shard's part of one round (``parts``: ``((table_id, keys), ...)``) for :func:`step_traffic`.

    Returns:
        ``(totals, per_shard, frames, in_flight)``: totals ``(request messages, reply messages,
        request frames, reply frames, request bytes, reply bytes, probes)`` of the round,
        the shard's :attr:`Traffic.per_shard` row ``start`` plus the round's (float64 sums
        in message order), its frames both ways and its messages in flight at once.
    """
    lookup = mt == MsgType.LOOKUP_REQ
    acc = list(start)
    tot = [0] * 7
    frames = 0
    costs: dict = {}
    for first, T, n, vl, m in pack_counts(cfg, mt, list(parts), mtu=mtu, msg_frames=msg_frames,
                                          window_frames=window_frames):
        req = consts.expected_msg_len(mt, T, n, vl)
        rep = vl if lookup else 0
        fq, fp = _frames(req, mtu), _frames(rep, mtu)
        qb, pb = req + consts.HDR_LEN * fq, rep + consts.HDR_LEN * fp
        for i, v in enumerate((1, 1, fq, fp, qb, pb)):
            tot[i] += m * v
        for i, v in enumerate((n, qb, pb, fq, fp, 0 if lookup else req)):
            acc[i] += float(v) * float(m)
        frames += m * (fq + fp)
        costs[fq + fp] = costs.get(fq + fp, 0) + m
        last_first_table = first  # the probe asks for one key of the last message's first table
    # the send window: messages of this shard in flight at once (the largest go first)
    held = n_in = 0
    for c in sorted(costs, reverse=True):
        m = costs[c]
        if not n_in:
            held, n_in, m = c, 1, m - 1
        j = min(m, max(0, (window_frames - held) // c))
        held += j * c
        n_in += j
        if j < m:
            break
    if tail_probes:
        preq = consts.expected_msg_len(MsgType.LOOKUP_REQ, 1, 1, row[last_first_table])
        prep = row[last_first_table]
        fp = _frames(prep, mtu)
        tot = [a + v for a, v in zip(tot, (0, 0, 1, fp, preq + consts.HDR_LEN, prep + consts.HDR_LEN * fp, 1))]
        for i, v in enumerate((1, preq + consts.HDR_LEN, prep + consts.HDR_LEN, 1, fp, 0)):
            acc[i] += float(v)
        frames += 1 + fp
        n_in += 1
    return tuple(tot), acc, frames, n_in


def stores(cfg: ClusterConfig) -> list[dict[int, tuple[str, int | None]]]:
    """``cfg.store_of`` of every table on every shard: by shard index, ``{table_id: (store, cache_rows)}``.

    A shard's own part of the answer is its ``store`` and ``cache_rows``, so ``store_of`` is asked
    once per distinct pair (not once per shard: ``cfg.store_of`` finds the shard by id, which made
    a plan of 4096 shards quadratic).
    """
    by_kind: dict = {}
    out = []
    for sh in cfg.shards:
        k = (sh.store, sh.cache_rows)
        if k not in by_kind:
            by_kind[k] = {t.id: cfg.store_of(t.id, sh.id) for t in cfg.tables}
        out.append(by_kind[k])
    return out


def disk_tables(cfg: ClusterConfig) -> list[list[int]]:
    """Table ids on the disk tier of every shard, by shard index (``cfg.store_of``)."""
    return [[t.id for t in cfg.tables if st[t.id][0] == "disk"] for st in stores(cfg)]
