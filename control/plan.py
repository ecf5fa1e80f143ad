"""Capacity planning (``embnic plan``): what a cluster of tables costs per shard and per card.

The model (docs/planning.md) has three parts.

**Traffic per step** (:func:`step_traffic`) — what one client puts on the wire for one
training step (a lookup round, then an update round of the same unique ids), counted exactly
as :class:`~embnic.client_lib.client.EmbeddingClient` builds rounds under protocol v2
(docs/protocol.md): each table's unique ids of the step are routed to shards (``hash``: spread
evenly, ``table``: the owning shard), every shard's part of a round is cut into messages by the
client's own :func:`~embnic.client_lib.client.pack_parts` (one message per shard, split past
``msg_frames`` fragments or the send window), each message's body is the directory (16 B per
table), the keys (8 B each) and, for an update, the rows (``dim·esize``); a lookup reply is the
rows; an update is answered by one empty ACK; bodies are cut into fragments of
``P = MTU − 72`` bytes (:func:`~embnic.client_lib.codec.frag_geometry`), each frame carrying
the 44-byte header. After each shard's last message of a round the client sends a tail probe
(a one-key lookup of that message's first table). Byte counts are UDP payloads (header +
fragment), as ``ClientStats.bytes_sent`` counts them; Gb/s add Ethernet, IPv4, UDP, FCS,
preamble and inter-frame gap (:data:`WIRE_OVERHEAD`).

**Storage per shard** (:func:`shard_storage`) — the rows a shard holds (a table's ``rows``, or
its ``expected_rows`` where ids are unbounded), spread like the ids; memory is
``rows × (4·dim + optimizer state) × arena slack + rows × 18`` bytes: rows are float32 on the
shards whatever the wire dtype, row-wise Adagrad keeps one float32 per row, SGD none; the arena
doubles when full (``arena_slack`` 2: the worst case just after a doubling) and the shard's one
sorted index over all its tables holds a uint64 composite key, an int64 slot and a uint16 table
per row, plus an int64 arena offset per row where the shard's tables differ in dim
(``client_lib/table_numerics.py`` RowStore). Disk
(with ``--checkpoint-dir``) is two checkpoints (the old one lives until the new one is
renamed) of ``rows × (8 + 4·dim + 4)`` bytes plus the write-ahead log of
``checkpoint_every`` updates.

A table on the **disk tier** (``store = "disk"``, its own or its shard's, docs/server.md "Disk
tier") is not in that arena or index: in memory it is its cache, ``cache_rows`` slots of
``4·dim + optimizer state + 19`` bytes allocated at start whatever the rows (testbed/server/
diskstore.py ``cache_bytes``), plus once per shard with a disk table RocksDB's block cache
(``block_cache_mb``) and the fixed overhead ``bench server --disk`` measured
(:data:`DISK_FIXED_OVERHEAD`); on disk it is the live RocksDB store, ``rows × (8 + 4·dim + optimizer
state + RocksDB's per-entry overhead) × space amplification`` (assumed:
:data:`ROCKSDB_ENTRY_OVERHEAD`, :data:`ROCKSDB_SPACE_AMP`), and twice that with checkpoints (a
snapshot is hard links to the store's files, a full second copy once compaction has rewritten
them all). Its keys cost a shard ``1 / disk_keys_per_s`` each instead of ``1 / shard_keys_per_s``
(:class:`Hardware`; its default is the ratio ``bench server --disk`` measured, at the cache hit
ratio of that run's workload: the plan does not model the hit ratio).

**Rates and limits** (:func:`plan`) — ``C`` clients each doing ``steps/s`` steps: per card
frames/s, messages/s (request messages, each completed by its reply: what ``bench dataplane``'s
``distinct_msgs_per_s`` counts), Gb/s and state-map entries in flight (every message of a
round of every client, tail probes included, bounded per shard by the send window); per shard
keys/s and Gb/s. Each resource gives the steps/s it allows; the smallest binds first. The step
time is a latency model: per round, a base round-trip time plus the service time of the
busiest resource of that round (card, a shard, the client, a NIC).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.client import DEFAULT_MSG_FRAMES, DEFAULT_WINDOW_FRAMES
from embnic.client_lib.config import DEFAULT_BLOCK_CACHE_MB, ClusterConfig
from embnic.client_lib.consts import MsgType
from embnic.client_lib.routing import shard_index_of

#: bytes a frame takes on the wire beyond its UDP payload: Ethernet header 14, IPv4 20, UDP 8,
#: FCS 4, preamble + start delimiter 8, inter-frame gap 12
WIRE_OVERHEAD = 14 + consts.IPV4_HDR_LEN + consts.UDP_HDR_LEN + 4 + 8 + 12
WAL_RECORD_HEADER = 36  #: bytes of a write-ahead-log record's header (testbed/server/durability.py)
#: a shard's row store index (client_lib/table_numerics.py RowStore, one for all its tables): per row a
#: uint64 composite key, an int64 arena slot and a uint16 table
INDEX_BYTES_PER_ROW = 18
#: per row when a shard's tables differ in dim: the row's int64 offset in the store's flat arena
OFFSET_BYTES_PER_ROW = 8
OPTIMIZER_STATE_BYTES = {"adagrad": 4, "sgd": 0}  #: float32 per row of optimizer state
#: a disk table's cache slot beyond its row and optimizer state: key 8, three flags, use count 4,
#: stamp 4 (testbed/server/diskstore.py ``cache_bytes``)
CACHE_SLOT_OVERHEAD = 19
CACHE_WAYS = 8  #: a disk table's cache holds the multiple of its 8 ways not above ``cache_rows``
#: a shard's memory for its disk tier beyond the caches and the block cache: the fixed overhead
#: ``embnic bench server --disk`` measured (50.9 MiB: interpreter, numpy, engine buffers, RocksDB's
#: bookkeeping; README "Performance"), counted once per shard with a disk table
DISK_FIXED_OVERHEAD = 51 << 20
#: assumed, not measured: bytes RocksDB adds to each stored row (8-byte internal key trailer,
#: length varints, 10 bloom-filter bits, index entries: ~12 B) and the space amplification of its
#: levelled compaction (~1.11 for a 10x level fan-out: obsolete versions not yet compacted)
ROCKSDB_ENTRY_OVERHEAD = 12
ROCKSDB_SPACE_AMP = 1.11
#: what ``bench server --disk`` measured: 4096-key lookups of a disk table at 0.081 x the in-memory
#: shard (updates 0.085 x), Zipf(1.05) ids over a table 16 x its cache, cache hit ratio 0.66-0.68
#: (README "Performance"): the default ``disk_keys_per_s`` is this times ``shard_keys_per_s``
DISK_KEYS_RATIO_MEASURED = 0.08
DISK_HIT_RATIO_MEASURED = 0.66


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What one machine of each kind can do (defaults: a server-class host; measure yours).

    Attributes:
        shard_ram_gb: memory a shard may fill with tables, GB (1e9 bytes).
        shard_disk_gb: disk per shard for checkpoints and log, GB.
        nic_gbps: line rate of each host's NIC (card, shard, client), Gb/s, each direction.
        card_msgs_per_s: messages the card completes per second (``bench dataplane``
            ``distinct_msgs_per_s``).
        card_mpps: frames the card forwards per second, millions (``bench dataplane`` ``card_mpps``).
        shard_keys_per_s: keys (rows) a shard looks up or updates per second (``bench server``).
        disk_keys_per_s: keys of disk-tier tables a shard looks up or updates per second
            (``bench server --disk``; default :data:`DISK_KEYS_RATIO_MEASURED` × shard_keys_per_s,
            measured at that bench's cache hit ratio, :data:`DISK_HIT_RATIO_MEASURED`).
        client_frames_per_s: frames a client sends or receives per second (its per-frame cost).
        rtt_us: base round-trip time client → card → shard → card → client, µs, unloaded.
        arena_slack: factor on a shard's row arena for its growth (2: just after a doubling).
        checkpoint_every: updates between checkpoints (disk: the log they leave).
    """

    shard_ram_gb: float = 256.0
    shard_disk_gb: float = 2000.0
    nic_gbps: float = 100.0
    card_msgs_per_s: float = 1.0e6
    card_mpps: float = 2.0
    shard_keys_per_s: float = 2.0e6
    disk_keys_per_s: float = DISK_KEYS_RATIO_MEASURED * 2.0e6
    client_frames_per_s: float = 200_000.0
    rtt_us: float = 50.0
    arena_slack: float = 2.0
    checkpoint_every: int = 1000


#: hardware profiles by name (``embnic plan --hardware NAME``): ``server`` the defaults above;
#: ``testbed`` this project's namespace testbed on a shared 2-core VM — the card on
#: ``net_af_packet`` over veths, Python shards and client, what ``bench e2e`` runs on. Its round
#: trip, client frames/s and shard keys/s were fitted to one run through the card
#: (``bench e2e``'s varlen steps, table sharding, batch 32/256/4096: 7.6, 9.5, 23.2 ms a step):
#: 3 ms a round, 12.5 µs of client time per frame; the card's figures are ``bench dataplane``'s
#: veth path (docs/planning.md)
PROFILES = {
    "server": Hardware(),
    "testbed": Hardware(shard_ram_gb=4.0, shard_disk_gb=20.0, nic_gbps=10.0, card_msgs_per_s=150_000.0,
                        card_mpps=0.3, shard_keys_per_s=2_000_000.0,
                        disk_keys_per_s=DISK_KEYS_RATIO_MEASURED * 2_000_000.0, client_frames_per_s=80_000.0, rtt_us=3000.0),
}


@dataclasses.dataclass(frozen=True)
class Workload:
    """One client's step: ``batch`` samples, each with ``ids_per_feature[t]`` ids of table ``t``
    (one feature per table), of which ``unique_ratio[t]`` are unique within the batch.

    Attributes:
        batch: samples per step per client.
        ids_per_feature: ``{table_id: ids per sample}`` (pooling factor; Criteo: 1).
        unique_ratio: ``{table_id: unique ids / all ids}`` within one batch, in (0, 1].
        clients: clients stepping at once.
        steps_per_s: steps per second wanted of every client (None: report what the cluster allows).
        source: where the figures come from (``"flags"`` or the data file measured).
    """

    batch: int
    ids_per_feature: dict
    unique_ratio: dict
    clients: int = 1
    steps_per_s: float | None = None
    source: str = "flags"

    def unique_ids(self, table_id: int) -> float:
        """Expected unique ids of ``table_id`` in one client's step."""
        return self.batch * self.ids_per_feature[table_id] * self.unique_ratio[table_id]


def uniform_workload(cfg: ClusterConfig, batch: int, *, ids_per_feature: float = 1.0, unique_ratio: float = 1.0,
                     clients: int = 1, steps_per_s: float | None = None) -> Workload:
    """A :class:`Workload` with the same pooling factor and unique ratio for every table.

    Raises:
        ValueError: batch < 1, ids_per_feature <= 0, unique_ratio not in (0, 1], clients < 1,
            steps_per_s <= 0.
    """
    ids = {t.id: float(ids_per_feature) for t in cfg.tables}
    ratio = {t.id: float(unique_ratio) for t in cfg.tables}
    w = Workload(int(batch), ids, ratio, int(clients), steps_per_s)
    check_workload(w)
    return w


def check_workload(w: Workload) -> None:
    """Raise ``ValueError`` naming the first figure of ``w`` out of range."""
    if w.batch < 1:
        raise ValueError(f"batch must be >= 1, got {w.batch}")
    if w.clients < 1:
        raise ValueError(f"clients must be >= 1, got {w.clients}")
    if w.steps_per_s is not None and not w.steps_per_s > 0:
        raise ValueError(f"steps/s must be > 0, got {w.steps_per_s}")
    for t, v in w.ids_per_feature.items():
        if not v > 0:
            raise ValueError(f"ids per feature of table {t} must be > 0, got {v}")
    for t, v in w.unique_ratio.items():
        if not 0 < v <= 1:
            raise ValueError(f"unique ratio of table {t} must be in (0, 1], got {v}")


def measure_workload(cfg: ClusterConfig, sparse: np.ndarray, feature_tables: Sequence[int], batch: int, *,
                     batches: int = 32, clients: int = 1, steps_per_s: float | None = None,
                     source: str = "data") -> Workload:
    """Measure ids per feature and the unique/all ratio of every table from samples.

    Args:
        sparse: uint64 (N, F) categorical ids, one per sample and feature (Criteo: F = 26,
            already hashed into the tables' rows).
        feature_tables: table id of each of the F features (several features may share a table).
        batch: samples per step; ``batches`` batches of consecutive samples, evenly spaced over
            the file, are measured and their unique counts averaged.

    Returns:
        a :class:`Workload` (``ids_per_feature[t]`` = features of table t, one id each per
        sample; ``unique_ratio[t]`` = mean unique ids / ids of table t per batch).

    Raises:
        ValueError: fewer samples than one batch, or ``feature_tables`` not of length F.
    """
    sparse = np.asarray(sparse)
    n, f = sparse.shape
    if len(feature_tables) != f:
        raise ValueError(f"{f} features in the data but {len(feature_tables)} feature tables")
    if n < batch:
        raise ValueError(f"the data has {n} samples, fewer than one batch of {batch}: lower --batch")
    starts = np.unique(np.linspace(0, n - batch, max(1, int(batches))).astype(np.int64))
    tabs = np.asarray(feature_tables)
    ids: dict[int, float] = {}
    ratio: dict[int, float] = {}
    for t in sorted(set(tabs.tolist())):
        cols = np.flatnonzero(tabs == t)
        u = [np.unique(sparse[s:s + batch, cols]).size for s in starts.tolist()]
        ids[t] = float(len(cols))
        ratio[t] = float(np.mean(u)) / (batch * len(cols))
    for t in cfg.tables:  # tables no feature uses: no ids
        if t.id not in ids:
            ids[t.id], ratio[t.id] = 1e-12, 1.0
    w = Workload(int(batch), ids, ratio, int(clients), steps_per_s, source)
    check_workload(w)
    return w


# ---------------------------------------------------------------------------- traffic
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
    """The messages :func:`~embnic.client_lib.client.pack_parts` cuts one shard's round into,
    counted without a key: ``parts`` is ``[(table_id, keys), ...]`` (counts, int), the result
    ``[(first table id, tables, keys, value bytes, multiplicity), ...]`` in send order, runs of
    identical full one-table messages collapsed into one entry with their multiplicity.

    The same cutting rule as ``pack_parts`` (its loop, state for state), but a table's run of
    full messages past the first is counted by division, so time and memory grow with the
    tables, not the keys: a step of 10^12 ids costs what one of 10^4 does.

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
                # next key (no room left after it), as pack_parts' loop does one by one
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
    inflight = []
    for mt in (MsgType.LOOKUP_REQ, MsgType.UPDATE_REQ):
        round_frames = 0
        round_inflight = 0
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
            tr.req_messages += totals[0]
            tr.rep_messages += totals[1]
            tr.req_frames += totals[2]
            tr.rep_frames += totals[3]
            tr.req_bytes += totals[4]
            tr.rep_bytes += totals[5]
            tr.probes += totals[6]
            round_frames += frames
            round_inflight += n_in
        tr.round_frames.append(round_frames)
        inflight.append(round_inflight)
    tr.per_shard[:] = np.array(acc, np.float64).reshape(S, 6)
    tr.inflight = max(inflight) if inflight else 0
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
        tot[0] += m
        tot[1] += m
        tot[2] += m * fq
        tot[3] += m * fp
        tot[4] += m * (req + consts.HDR_LEN * fq)
        tot[5] += m * (rep + consts.HDR_LEN * fp)
        for i, v in enumerate((n, req + consts.HDR_LEN * fq, rep + consts.HDR_LEN * fp, fq, fp, 0 if lookup else req)):
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
        tot[6] += 1
        tot[2] += 1
        tot[3] += _frames(prep, mtu)
        tot[4] += preq + consts.HDR_LEN
        tot[5] += prep + consts.HDR_LEN * _frames(prep, mtu)
        for i, v in enumerate((1, preq + consts.HDR_LEN, prep + consts.HDR_LEN, 1, _frames(prep, mtu), 0)):
            acc[i] += float(v)
        frames += 1 + _frames(prep, mtu)
        n_in += 1
    return tuple(tot), acc, frames, n_in


# ---------------------------------------------------------------------------- storage
def table_rows(cfg: ClusterConfig, table_id: int) -> int:
    """Rows the shards will hold of a table: its ``expected_rows`` if set, else its ``rows``.

    Raises:
        ValueError: neither is set (ids unbounded and no expectation), naming the key to add.
    """
    t = cfg.table(table_id)
    n = getattr(t, "expected_rows", None) or t.rows
    if n is None:
        raise ValueError(f"table {t.name!r} (id {t.id}) has no rows bound: give it expected_rows = N in its "
                         "[[tables]] entry so the planner can size its shards")
    return int(n)


def cache_bytes(dim: int, optimizer: str, cache_rows: int) -> int:
    """Bytes of a disk table's cache on one shard: its capacity (the multiple of its ways not above
    ``cache_rows``) × (4·dim + optimizer state + :data:`CACHE_SLOT_OVERHEAD`), allocated when the
    shard starts whatever the rows it holds (testbed/server/diskstore.py ``cache_bytes``)."""
    ways = max(1, min(CACHE_WAYS, int(cache_rows)))
    cap = max(1, int(cache_rows) // ways) * ways
    return cap * (4 * int(dim) + OPTIMIZER_STATE_BYTES.get(optimizer, 4) + CACHE_SLOT_OVERHEAD)


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


def shard_storage(cfg: ClusterConfig, hw: Hardware) -> dict:
    """Rows, memory and disk of every shard, in-memory and disk-tier tables apart (module docstring).

    Returns:
        by shard index (hash sharding: each table's rows spread evenly; table sharding: on the
        owner): ``rows`` int64 (S,); ``memory_bytes`` float64 (S,) = ``arena_bytes`` (the in-memory
        tables: rows with slack, index, offsets) + ``disk_tier_memory_bytes`` (the disk tables'
        caches, the block cache and :data:`DISK_FIXED_OVERHEAD`, where the shard has a disk
        table); ``disk_bytes`` float64 (S,) = checkpoints of the in-memory tables + ``store_bytes``
        (the disk tables' live RocksDB stores) × 2 (their snapshots); ``disk_rows`` int64 (S,),
        rows held on the disk tier; ``disk_tables`` (:func:`disk_tables`). Disk excludes the log
        (added by :func:`plan`, which knows the update bytes).
    """
    S = len(cfg.shards)
    rows = np.zeros(S, np.int64)
    drows = np.zeros(S, np.int64)
    arena = np.zeros(S, np.float64)
    tier = np.zeros(S, np.float64)
    disk = np.zeros(S, np.float64)
    store = np.zeros(S, np.float64)
    dims: list[set] = [set() for _ in range(S)]
    on_disk = disk_tables(cfg)
    kinds = stores(cfg)
    for t in cfg.tables:
        r = split_keys(cfg, t.id, table_rows(cfg, t.id))
        opt = OPTIMIZER_STATE_BYTES.get(t.optimizer, 4)
        rows += r
        for i in range(S):
            kind, cache_rows = kinds[i][t.id]
            if kind == "disk":
                # every shard opens every disk table's cache, whatever it holds of the table
                tier[i] += cache_bytes(t.dim, t.optimizer, cache_rows)
                store[i] += r[i] * (consts.KEY_SIZE + 4 * t.dim + opt + ROCKSDB_ENTRY_OVERHEAD) * ROCKSDB_SPACE_AMP
                drows[i] += r[i]
            else:
                arena[i] += r[i] * ((4 * t.dim + opt) * hw.arena_slack + INDEX_BYTES_PER_ROW)
                disk[i] += 2 * r[i] * (consts.KEY_SIZE + 4 * t.dim + 4)
                if r[i]:
                    dims[i].add(t.dim)
    mem_rows = rows - drows
    arena += mem_rows * OFFSET_BYTES_PER_ROW * np.array([len(d) > 1 for d in dims])
    for i, sh in enumerate(cfg.shards):
        if on_disk[i]:
            mb = sh.block_cache_mb or DEFAULT_BLOCK_CACHE_MB
            tier[i] += (mb << 20) + DISK_FIXED_OVERHEAD
    disk += 2 * store
    return {"rows": rows, "memory_bytes": arena + tier, "disk_bytes": disk, "arena_bytes": arena,
            "disk_tier_memory_bytes": tier, "store_bytes": store, "disk_rows": drows, "disk_tables": on_disk}


# ---------------------------------------------------------------------------- the plan
def shard_seconds(hw: Hardware, tr: Traffic) -> np.ndarray:
    """Seconds of key work of one client's step on every shard: float64 (S,) — its in-memory
    tables' keys (tail probes included) at ``shard_keys_per_s``, its disk-tier tables' at
    ``disk_keys_per_s``."""
    ps = tr.per_shard
    dk = tr.disk_keys if tr.disk_keys is not None else np.zeros(len(ps))
    return (ps[:, 0] - dk) / hw.shard_keys_per_s + dk / hw.disk_keys_per_s


def _limits(cfg, hw: Hardware, w: Workload, tr: Traffic, S: int, cards: int) -> dict:
    """Steps/s of every client that each resource allows (all clients stepping at once)."""
    C = w.clients
    nic = hw.nic_gbps * 1e9
    ps = tr.per_shard
    busiest = float(shard_seconds(hw, tr).max()) if len(ps) else 0.0
    shard_bits = float(8 * (np.maximum(ps[:, 1], ps[:, 2]) + WIRE_OVERHEAD * np.maximum(ps[:, 3], ps[:, 4])).max())
    card_bits = 8.0 * (max(tr.req_bytes, tr.rep_bytes) + WIRE_OVERHEAD * max(tr.req_frames, tr.rep_frames))
    client_bits = card_bits
    inf = float("inf")
    return {
        "card_messages": cards * hw.card_msgs_per_s / (C * (tr.req_messages + tr.probes)),
        "card_frames": cards * hw.card_mpps * 1e6 / (C * tr.frames),
        "card_nic": cards * nic / (C * card_bits),
        "shard_keys": 1.0 / (C * busiest) if busiest else inf,
        "shard_nic": nic / (C * shard_bits) if shard_bits else inf,
        "client_frames": hw.client_frames_per_s / tr.frames,
        "client_nic": nic / client_bits,
        "latency": 1e6 / step_time_us(cfg, hw, w, tr, cards),
    }


def step_time_us(cfg, hw: Hardware, w: Workload, tr: Traffic, cards: int = 1) -> float:
    """Estimated time of one step (µs): per round, the base RTT plus the service time of the
    busiest resource of that round with every client stepping at once — the card (messages and
    frames), the busiest shard (keys: a disk-tier table's at ``disk_keys_per_s``), the client (frames) and the NICs (bits); the lookup and
    update rounds' shares are taken in proportion to their frames. :func:`step_bottleneck` names
    the busiest."""
    return step_bottleneck(cfg, hw, w, tr, cards)[0]


def step_bottleneck(cfg, hw: Hardware, w: Workload, tr: Traffic, cards: int = 1) -> tuple[float, str]:
    """(:func:`step_time_us`, the resource whose service time is the largest: ``card``,
    ``shard``, ``client`` or ``nic``)."""
    C = w.clients
    total = max(tr.frames, 1)
    ps = tr.per_shard
    t = 0.0
    svc = {}
    for rf in tr.round_frames:
        share = rf / total
        svc = {"card": max(C * (tr.req_messages + tr.probes) * share / (cards * hw.card_msgs_per_s),
                           C * tr.frames * share / (cards * hw.card_mpps * 1e6)),
               "shard": C * float(shard_seconds(hw, tr).max()) * share if len(ps) else 0.0,
               "client": tr.frames * share / hw.client_frames_per_s,
               "nic": C * tr.wire_bits * share / (cards * hw.nic_gbps * 1e9)}
        t += hw.rtt_us * 1e-6 + max(svc.values())
    return t * 1e6, (max(svc, key=svc.get) if svc else "client")


def _with_shards(cfg: ClusterConfig, n: int) -> ClusterConfig:
    """``cfg`` with ``n`` shards (hash sharding keeps spreading; table sharding keeps t mod S)."""
    base = cfg.shards[0]
    shards = list(cfg.shards[:n])
    top = max(s.id for s in shards)
    for _ in range(len(shards), n):  # only their number and order matter to routing
        top += 1
        shards.append(dataclasses.replace(base, id=top, mac=None))
    return dataclasses.replace(cfg, shards=tuple(shards))


def plan(cfg: ClusterConfig, w: Workload, hw: Hardware = Hardware(), *, mtu: int | None = None,
         msg_frames: int | None = DEFAULT_MSG_FRAMES, window_frames: int = DEFAULT_WINDOW_FRAMES,
         max_shards: int = 4096) -> dict:
    """The capacity plan of ``cfg`` under workload ``w`` on hardware ``hw`` (module docstring).

    Returns:
        a JSON-able dict: ``per_step`` (one client's traffic), ``shards`` (per shard: rows,
        memory and disk bytes, keys/s and Gb/s at the rate planned), ``card`` (frames/s,
        messages/s, Gb/s, state-map entries in flight), ``limits`` (steps/s each resource
        allows with the config's shards and one card), ``binds`` (the smallest),
        ``step_time_us``, ``rate`` (steps/s per client the figures are for: the wanted one, or
        the binding limit), ``needed`` (shards and cards for the wanted steps/s, or for memory
        and disk alone), ``state_map`` and ``hardware``/``workload`` (the inputs).

    Raises:
        ValueError: a table without rows or expected_rows; a bad workload figure; a step without ids.
    """
    check_workload(w)
    mtu = int(mtu or cfg.mtu)
    kw = dict(mtu=mtu, msg_frames=msg_frames, window_frames=window_frames)
    unique = {t.id: w.unique_ids(t.id) for t in cfg.tables}
    tr = step_traffic(cfg, unique, **kw)
    if tr.req_messages == 0:
        raise ValueError(f"a step of batch {w.batch} has no ids (under half an id per table): raise --batch, "
                         "--ids-per-feature or --unique-ratio")
    st = shard_storage(cfg, hw)
    S = len(cfg.shards)
    lim = _limits(cfg, hw, w, tr, S, 1)
    # the state map is not a rate: every message of a round of every client is in flight at once
    state_size = cfg.card.state_size if cfg.card is not None else None
    entries = w.clients * tr.inflight
    limits_ok = {k: v for k, v in lim.items()}
    binds = min(limits_ok, key=limits_ok.get)
    rate = w.steps_per_s if w.steps_per_s is not None else limits_ok[binds]
    C = w.clients
    # the log between checkpoints: one record (36-byte header + the update's body) per update of
    # every client (testbed/server/durability.py)
    disk = st["disk_bytes"] + hw.checkpoint_every * (tr.per_shard[:, 5] + WAL_RECORD_HEADER * (tr.per_shard[:, 5] > 0))
    ps = tr.per_shard
    names = {t.id: t.name for t in cfg.tables}
    shards = [{"index": i, "id": cfg.shards[i].id, "rows": int(st["rows"][i]),
               "memory_gb": float(st["memory_bytes"][i]) / 1e9, "disk_gb": float(disk[i]) / 1e9,
               "arena_memory_gb": float(st["arena_bytes"][i]) / 1e9,
               "disk_tier_memory_gb": float(st["disk_tier_memory_bytes"][i]) / 1e9,
               "store_gb": float(st["store_bytes"][i]) / 1e9, "disk_rows": int(st["disk_rows"][i]),
               "tables_on_disk": [names[t] for t in st["disk_tables"][i]],
               "keys_per_s": float(C * rate * ps[i, 0]), "disk_keys_per_s": float(C * rate * tr.disk_keys[i]),
               "gbps_in": float(C * rate * 8 * (ps[i, 1] + WIRE_OVERHEAD * ps[i, 3]) / 1e9),
               "gbps_out": float(C * rate * 8 * (ps[i, 2] + WIRE_OVERHEAD * ps[i, 4]) / 1e9)} for i in range(S)]
    card = {"frames_per_s": C * rate * tr.frames,
            "messages_per_s": C * rate * (tr.req_messages + tr.probes),
            "gbps": C * rate * 8 * (max(tr.req_bytes, tr.rep_bytes)
                                    + WIRE_OVERHEAD * max(tr.req_frames, tr.rep_frames)) / 1e9,
            "state_entries_in_flight": entries, "state_size": state_size}
    needed = _needed(cfg, w, hw, st, disk, kw, rate if w.steps_per_s is not None else None, max_shards)
    if needed["shards_for_memory"] is None:  # no number of shards fits: the disk tier's memory alone is too much
        needed["shards"] = None
    mem_max = max(s["memory_gb"] for s in shards)
    disk_max = max(s["disk_gb"] for s in shards)
    fits = {"memory": mem_max <= hw.shard_ram_gb, "disk": disk_max <= hw.shard_disk_gb,
            "state_map": state_size is None or entries <= state_size}
    return {
        "disk_tier": _disk_tier(cfg, hw, st, w),
        "per_step": {"request_messages": tr.req_messages, "request_frames": tr.req_frames,
                     "request_bytes": tr.req_bytes, "reply_messages": tr.rep_messages, "reply_frames": tr.rep_frames,
                     "reply_bytes": tr.rep_bytes, "probes": tr.probes, "rounds": tr.rounds,
                     "unique_ids": float(sum(unique.values())), "wire_bits": tr.wire_bits},
        "shards": shards,
        "card": card,
        "limits": limits_ok,
        "binds": binds,
        "fits": fits,
        "step_time_us": step_time_us(cfg, hw, w, tr, 1),
        "rate": rate,
        "needed": needed,
        "hardware": dataclasses.asdict(hw),
        "workload": {"batch": w.batch, "clients": w.clients, "steps_per_s": w.steps_per_s, "source": w.source,
                     "ids_per_step": float(sum(w.batch * v for v in w.ids_per_feature.values())),
                     "unique_ratio": float(sum(unique.values())
                                           / max(sum(w.batch * v for v in w.ids_per_feature.values()), 1e-12))},
        "config": {"tables": len(cfg.tables), "shards": S, "sharding": cfg.sharding, "mtu": mtu,
                   "rows": int(sum(table_rows(cfg, t.id) for t in cfg.tables)),
                   "msg_frames": msg_frames, "window_frames": window_frames},
    }


def _disk_tier(cfg: ClusterConfig, hw: Hardware, st: dict, w: Workload) -> dict:
    """What the plan assumes of the disk tier, and what it leaves out (the ``disk_tier`` of :func:`plan`)."""
    n_disk = len({t for ts in st["disk_tables"] for t in ts})
    out = {"tables_on_disk": n_disk, "shards_with_disk_tables": sum(bool(ts) for ts in st["disk_tables"]),
           "rows_on_disk": int(st["disk_rows"].sum())}
    if not n_disk:
        return out
    # a cache with more slots than the rows the shard holds of its table: memory spent on nothing
    idle = []
    kinds = stores(cfg)
    for i in range(len(cfg.shards)):
        for tid in st["disk_tables"][i]:
            cache_rows = kinds[i][tid][1]
            held = int(split_keys(cfg, tid, table_rows(cfg, tid))[i])
            if cache_rows > held:
                idle.append((i, tid, cache_rows, held))
    seen: dict = {}
    for _, tid, c, _ in idle:  # in table order, once per (table, cache_rows)
        seen.setdefault((tid, c), (cfg.table(tid).name, c))
    uniq = [seen[k] for k in sorted(seen)]
    out.update({
        "assumptions": {
            "cache_slot_bytes": "4*dim + optimizer state + %d, cache_rows slots allocated at start" % CACHE_SLOT_OVERHEAD,
            "fixed_overhead_bytes": DISK_FIXED_OVERHEAD,
            "rocksdb_entry_overhead_bytes": ROCKSDB_ENTRY_OVERHEAD, "rocksdb_space_amplification": ROCKSDB_SPACE_AMP,
            "checkpoint_copies": 2,
            "disk_keys_per_s": hw.disk_keys_per_s,
            "disk_keys_per_s_source": (f"bench server --disk measured disk-tier lookups at ~{DISK_KEYS_RATIO_MEASURED} x "
                                       f"the in-memory shard at a cache hit ratio of {DISK_HIT_RATIO_MEASURED} "
                                       "(Zipf 1.05 over a table 16 x its cache); the plan does not model the hit "
                                       "ratio: measure your workload's and give --disk-keys-per-s"),
        },
        "caches_larger_than_rows_held": [{"table": n, "cache_rows": c} for n, c in uniq],
    })
    return out


def _needed(cfg, w: Workload, hw: Hardware, st: dict, disk: np.ndarray, kw: dict, want: float | None,
            max_shards: int) -> dict:
    """Shards and cards for memory, disk and (``want``) the wanted steps/s per client."""
    # the in-memory tables' arena spreads over the shards; a shard's disk tier (its caches, block
    # cache and fixed overhead) does not shrink with more shards
    total_arena = float(st["arena_bytes"].sum())
    per_shard = float(st["disk_tier_memory_bytes"].max())
    total_disk = float(disk.sum())
    room = hw.shard_ram_gb * 1e9 - per_shard
    by = {"memory": max(1, math.ceil(total_arena / room)) if room > 0 else None,
          "disk": math.ceil(total_disk / (hw.shard_disk_gb * 1e9))}
    out = {"shards_for_memory": by["memory"], "shards_for_disk": by["disk"]}
    if by["memory"] is None:
        out["shards_note"] = (f"a shard's disk-tier memory alone ({per_shard / 1e9:.1f} GB: its tables' caches, "
                              "block cache, fixed overhead) exceeds its RAM: lower cache_rows")
        by["memory"] = 0
    if cfg.sharding == "table":
        # a table lives on one shard: the largest table must fit one shard
        big = max(float(st["memory_bytes"].max()), 0.0)
        out["largest_table_fits_one_shard"] = big <= hw.shard_ram_gb * 1e9
    if want is None:
        out["shards"] = max(1, by["memory"], by["disk"])
        return out
    unique = {t.id: w.unique_ids(t.id) for t in cfg.tables}

    def _shard_limits(n: int) -> tuple[float, float]:
        tr = step_traffic(_with_shards(cfg, n), unique, **kw)
        lim = _limits(cfg, hw, w, tr, n, 1)
        return lim["shard_keys"], lim["shard_nic"]

    def shard_ok(n: int) -> bool:
        return min(_shard_limits(n)) >= want

    lo = max(1, by["memory"], by["disk"])
    n = lo
    if not shard_ok(n):
        hi = lo
        while hi < max_shards and not shard_ok(hi):
            hi = min(max_shards, hi * 2)
        if not shard_ok(hi):
            out["shards"] = None
            out["shards_note"] = "; ".join(filter(None, [out.get("shards_note"), (
                f"more than {max_shards} shards would be needed: a shard's keys/s or NIC limits it "
                f"(at {max_shards} shards a shard allows {min(_shard_limits(max_shards)):.3g} steps/s per client; "
                "the busiest table of table sharding lives on one shard)")]))
            n = None
        else:
            while lo < hi:  # smallest n in (lo, hi] that keeps up
                mid = (lo + hi) // 2
                if shard_ok(mid):
                    hi = mid
                else:
                    lo = mid + 1
            n = hi
    if n is not None:
        out["shards"] = n
    cfg_n = _with_shards(cfg, n or len(cfg.shards))
    tr = step_traffic(cfg_n, unique, **kw)
    lim = _limits(cfg_n, hw, w, tr, n or len(cfg.shards), 1)
    cards = max(math.ceil(want / lim[k]) for k in ("card_messages", "card_frames", "card_nic"))
    state_size = cfg.card.state_size if cfg.card is not None else None
    if state_size:
        cards = max(cards, math.ceil(w.clients * tr.inflight / state_size))
    cards = max(1, cards)
    # a synchronous step also waits for the round trips: add shards or cards, whichever is the
    # step's bottleneck, until the step time allows the rate (or the client itself is the limit)
    n_s = n or len(cfg.shards)
    for _ in range(256):
        t_us, neck = step_bottleneck(cfg_n, hw, w, tr, cards)
        if 1e6 / t_us >= want or neck == "client" or n is None:
            break
        if neck == "shard":
            n_s = min(max_shards, n_s + max(1, n_s // 8))
            cfg_n = _with_shards(cfg, n_s)
            tr = step_traffic(cfg_n, unique, **kw)
        else:
            cards += 1
    if n is not None:
        out["shards"] = n_s
    out["cards"] = cards
    # what one client manages with those shards and cards: its own frames and NIC, and the step
    # time with the load spread over the cards
    out["step_time_us"] = step_time_us(cfg_n, hw, w, tr, out["cards"])
    out["client_limit_steps_per_s"] = min(lim["client_frames"], lim["client_nic"], 1e6 / out["step_time_us"])
    out["client_keeps_up"] = out["client_limit_steps_per_s"] >= want
    return out
