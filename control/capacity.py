"""Capacity planning (``embnic plan``): what a cluster of tables costs per shard and per card.

The model is docs/planning.md's: traffic per step (:func:`~embnic.control.traffic.step_traffic`,
in :mod:`.traffic`), storage per shard (:func:`shard_storage`: the row arena and its index, or a
disk table's cache and RocksDB store, checkpoints and log) and rates and limits (:func:`plan`:
the steps/s each resource allows, and the step time as a latency model).
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from typing import Sequence

import numpy as np

from embnic.client_lib import consts
from embnic.client_lib.client import DEFAULT_MSG_FRAMES, DEFAULT_WINDOW_FRAMES
from embnic.client_lib.config import DEFAULT_BLOCK_CACHE_MB, ClusterConfig

from .traffic import WIRE_OVERHEAD, Traffic, disk_tables, split_keys, step_traffic, stores

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

    def __post_init__(self) -> None:
        """Raise ``ValueError`` naming the first figure out of range."""
        if self.batch < 1:
            raise ValueError(f"batch must be >= 1, got {self.batch}")
        if self.clients < 1:
            raise ValueError(f"clients must be >= 1, got {self.clients}")
        if self.steps_per_s is not None and not self.steps_per_s > 0:
            raise ValueError(f"steps/s must be > 0, got {self.steps_per_s}")
        for t, v in self.ids_per_feature.items():
            if not v > 0:
                raise ValueError(f"ids per feature of table {t} must be > 0, got {v}")
        for t, v in self.unique_ratio.items():
            if not 0 < v <= 1:
                raise ValueError(f"unique ratio of table {t} must be in (0, 1], got {v}")

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
    return Workload(int(batch), ids, ratio, int(clients), steps_per_s)


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
    return Workload(int(batch), ids, ratio, int(clients), steps_per_s, source)


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
    rows, drows = np.zeros(S, np.int64), np.zeros(S, np.int64)
    arena, tier, disk, store = (np.zeros(S, np.float64) for _ in range(4))
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


def _limits(cfg, hw: Hardware, w: Workload, tr: Traffic) -> dict:
    """Steps/s of every client that each resource allows with one card (all clients stepping at once)."""
    C = w.clients
    nic = hw.nic_gbps * 1e9
    ps = tr.per_shard
    busiest = float(shard_seconds(hw, tr).max()) if len(ps) else 0.0
    shard_bits = float(8 * (np.maximum(ps[:, 1], ps[:, 2]) + WIRE_OVERHEAD * np.maximum(ps[:, 3], ps[:, 4])).max())
    card_bits = 8.0 * (max(tr.req_bytes, tr.rep_bytes) + WIRE_OVERHEAD * max(tr.req_frames, tr.rep_frames))
    inf = float("inf")
    return {
        "card_messages": hw.card_msgs_per_s / (C * (tr.req_messages + tr.probes)),
        "card_frames": hw.card_mpps * 1e6 / (C * tr.frames),
        "card_nic": nic / (C * card_bits),
        "shard_keys": 1.0 / (C * busiest) if busiest else inf,
        "shard_nic": nic / (C * shard_bits) if shard_bits else inf,
        "client_frames": hw.client_frames_per_s / tr.frames,
        "client_nic": nic / card_bits,
        "latency": 1e6 / step_bottleneck(cfg, hw, w, tr)[0],
    }


def step_bottleneck(cfg, hw: Hardware, w: Workload, tr: Traffic, cards: int = 1) -> tuple[float, str]:
    """``(estimated time of one step in µs, the resource whose service time is the largest: ``card``,
    ``shard``, ``client`` or ``nic``)``. The step time: per round, the base RTT plus the service
    time of the busiest resource of that round with every client stepping at once — the card
    (messages and frames), the busiest shard (keys: a disk-tier table's at ``disk_keys_per_s``),
    the client (frames) and the NICs (bits); the lookup and update rounds' shares are taken in
    proportion to their frames."""
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
    shards = list(cfg.shards[:n])
    top = max(s.id for s in shards)  # the new ones: ids after it (only their number and order matter to routing)
    shards += [dataclasses.replace(cfg.shards[0], id=top + k, mac=None) for k in range(1, n - len(shards) + 1)]
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
    mtu = int(mtu or cfg.mtu)
    kw = dict(mtu=mtu, msg_frames=msg_frames, window_frames=window_frames)
    unique = {t.id: w.unique_ids(t.id) for t in cfg.tables}
    tr = step_traffic(cfg, unique, **kw)
    if tr.req_messages == 0:
        raise ValueError(f"a step of batch {w.batch} has no ids (under half an id per table): raise --batch, "
                         "--ids-per-feature or --unique-ratio")
    st = shard_storage(cfg, hw)
    S = len(cfg.shards)
    lim = _limits(cfg, hw, w, tr)
    # the state map is not a rate: every message of a round of every client is in flight at once
    state_size = cfg.card.state_size if cfg.card is not None else None
    entries = w.clients * tr.inflight
    binds = min(lim, key=lim.get)
    rate = w.steps_per_s if w.steps_per_s is not None else lim[binds]
    C = w.clients
    # the log between checkpoints: one record (36-byte header + the update's body) per update of
    # every client (testbed/server/durability.py)
    disk = st["disk_bytes"] + hw.checkpoint_every * (tr.per_shard[:, 5] + WAL_RECORD_HEADER * (tr.per_shard[:, 5] > 0))
    ps = tr.per_shard
    names = {t.id: t.name for t in cfg.tables}
    gb = {"memory": st["memory_bytes"], "disk": disk, "arena_memory": st["arena_bytes"],
          "disk_tier_memory": st["disk_tier_memory_bytes"], "store": st["store_bytes"]}
    shards = [{"index": i, "id": cfg.shards[i].id, "rows": int(st["rows"][i]),
               **{f"{k}_gb": float(v[i]) / 1e9 for k, v in gb.items()}, "disk_rows": int(st["disk_rows"][i]),
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
        "limits": lim,
        "binds": binds,
        "fits": fits,
        "step_time_us": step_bottleneck(cfg, hw, w, tr)[0],
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
    # (once per table and cache_rows, in table order)
    kinds = stores(cfg)
    idle = sorted({(tid, kinds[i][tid][1]) for i in range(len(cfg.shards)) for tid in st["disk_tables"][i]
                   if kinds[i][tid][1] > int(split_keys(cfg, tid, table_rows(cfg, tid))[i])})
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
        "caches_larger_than_rows_held": [{"table": cfg.table(tid).name, "cache_rows": c} for tid, c in idle],
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

    @functools.cache
    def shard_allows(n: int) -> float:
        """Steps/s per client a shard's keys/s and NIC allow with ``n`` shards."""
        lim = _limits(cfg, hw, w, step_traffic(_with_shards(cfg, n), unique, **kw))
        return min(lim["shard_keys"], lim["shard_nic"])

    lo = hi = max(1, by["memory"], by["disk"])
    while hi < max_shards and shard_allows(hi) < want:
        hi = min(max_shards, hi * 2)
    n = None
    if shard_allows(hi) >= want:  # the smallest n in [lo, hi] that keeps up
        n = lo + bisect.bisect_left(range(lo, hi), True, key=lambda m: shard_allows(m) >= want)
    out["shards"] = n
    if n is None:
        out["shards_note"] = "; ".join(filter(None, [out.get("shards_note"), (
            f"more than {max_shards} shards would be needed: a shard's keys/s or NIC limits it "
            f"(at {max_shards} shards a shard allows {shard_allows(max_shards):.3g} steps/s per client; "
            "the busiest table of table sharding lives on one shard)")]))
    n_s = n or len(cfg.shards)
    cfg_n = _with_shards(cfg, n_s)
    tr = step_traffic(cfg_n, unique, **kw)
    lim = _limits(cfg_n, hw, w, tr)
    cards = max(math.ceil(want / lim[k]) for k in ("card_messages", "card_frames", "card_nic"))
    state_size = cfg.card.state_size if cfg.card is not None else None
    if state_size:
        cards = max(cards, math.ceil(w.clients * tr.inflight / state_size))
    cards = max(1, cards)
    # a synchronous step also waits for the round trips: add shards or cards, whichever is the
    # step's bottleneck, until the step time allows the rate (or the client itself is the limit)
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
    out["step_time_us"] = step_bottleneck(cfg_n, hw, w, tr, cards)[0]
    out["client_limit_steps_per_s"] = min(lim["client_frames"], lim["client_nic"], 1e6 / out["step_time_us"])
    out["client_keeps_up"] = out["client_limit_steps_per_s"] >= want
    return out
