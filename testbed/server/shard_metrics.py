"""Prometheus metrics of a shard (``embnic server --metrics-port P``).

:class:`ShardCollector` reads the shard's counters at every scrape (``read()``: taken on the
serving thread between wake-ups) and
:func:`shard_families` turns them into ``embnic_shard_*`` families labelled ``shard`` (docs/server.md,
"Metrics", lists them); the data path pays one counter increment per reply and one histogram
update per wake-up (:class:`ServiceTimes`).
"""
from __future__ import annotations

import logging
from typing import Callable

from embnic.control.card_metrics import MetricsServer, log2_us_bucket, log2_us_histogram

log = logging.getLogger("embnic.server")

SERVICE_BUCKETS = 24  #: log2 µs buckets of the service time histogram (as the card's latency histograms)


class ServiceTimes:
    """Per-message service time: from the receipt of the datagram that completed a request to
    its reply handed to the kernel, as a log2 µs histogram (bucket ``i``: ``[2^(i-1), 2^i)`` µs).

    The serving loop adds once per wake-up — every reply of a wake-up leaves in its one
    ``sendmmsg``, so they share the wake-up's time (the tests' reference shard: once per datagram).
    """

    __slots__ = ("hist", "sum_ns")

    def __init__(self):
        self.hist = [0] * SERVICE_BUCKETS
        self.sum_ns = 0

    def add(self, ns: int, n: int = 1) -> None:
        """Count ``n`` messages served in ``ns`` nanoseconds each."""
        self.hist[log2_us_bucket(ns, SERVICE_BUCKETS)] += n
        self.sum_ns += ns * n

    def as_dict(self) -> dict:
        """``{"hist": [counts per bucket], "sum_ns": total}`` (what ``counters()`` carries)."""
        return {"hist": list(self.hist), "sum_ns": self.sum_ns}


class _Families:
    """The metric families of one reading, being built: every one labelled ``shard``."""

    def __init__(self, shard: str):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        self.shard = shard
        self.out: list = []
        self.C, self.G = CounterMetricFamily, GaugeMetricFamily

    def fam(self, cls, name, doc, rows, labels=()):
        f = cls(f"embnic_shard_{name}", doc, labels=["shard", *labels])
        for values, v in rows:
            f.add_metric([self.shard, *(str(x) for x in values)], v)
        self.out.append(f)

    def gauge(self, name, doc, value):
        self.fam(self.G, name, doc, [((), value)])


def shard_families(c: dict) -> list:
    """Metric families of one reading of a shard's counters (``BatchShardServer.counters()``).

    Returns:
        prometheus_client metric families (``embnic_shard_*``, every one labelled ``shard``);
        the write-ahead log's only when the shard keeps one, the disk tier's only with disk tables.
    """
    from prometheus_client.core import HistogramMetricFamily

    f = _Families(str(c["shard"]))
    _traffic_families(f, c)
    e = c.get("engine")
    if e:  # the serving loop's configuration and counters
        f.fam(f.G, "engine_info", "The shard's engine (value 1).",
              [((e.get("name", "batch"), e.get("intake", ""), e.get("answer", ""), str(bool(e.get("gso"))).lower(),
                 e.get("batch", 0)), 1)], ["engine", "intake", "answer", "gso", "batch"])
        for key, doc in _ENGINE_COUNTERS:
            if key in e:
                f.fam(f.C, key, doc, [((), e[key])])
    d = c.get("durability")
    if d is not None:  # the write-ahead log and checkpoints
        for kind, key, name, doc in _DURABILITY:
            f.fam(f.C if kind == "C" else f.G, name, doc, [((), d.get(key, 0))])
    if c.get("stores"):
        _store_families(f, c["stores"])
    svc = c.get("service")
    if svc is not None:
        h = HistogramMetricFamily("embnic_shard_service_seconds", "Per message: receipt of the datagram that "
                                  "completed the request to its reply handed to the kernel.", labels=["shard"])
        h.add_metric([f.shard], log2_us_histogram(svc["hist"]), svc["sum_ns"] / 1e9)
        f.out.append(h)
    return f.out


def _traffic_families(f: _Families, c: dict) -> None:
    """Frames, requests, replies, errors, drops, rows, reassembly: what every shard counts."""
    for kind, key, doc in _TRAFFIC:
        f.fam(f.C if kind == "C" else f.G, key, doc, [((), c.get(key, 0))])
    for key, label, doc in _BY_LABEL:
        f.fam(f.G if key == "rows" else f.C, key, doc, [((k,), n) for k, n in c.get(key, {}).items()], [label])
    for key, doc in _REASSEMBLY:
        f.fam(f.G if key == "pending" else f.C, f"reassembly_{key}", doc, [((), c["reassembly"][key])])


def _store_families(f: _Families, st: dict) -> None:
    """The disk tier (store = "disk" tables): its cache per table and RocksDB's memory and files."""
    tabs = st.get("tables", {})
    for key, name, doc in _STORE_COUNTERS:
        f.fam(f.C, name, doc, [((t,), v[key]) for t, v in tabs.items()], ["table"])
    for key, name, doc in _STORE_GAUGES:
        f.fam(f.G, name, doc, [((t,), v[key]) for t, v in tabs.items()], ["table"])
    f.gauge("store_block_cache_bytes", "RocksDB block cache in use (memtables charged to it), bytes.",
            st["block_cache_bytes"])
    f.gauge("store_block_cache_capacity_bytes", "RocksDB block cache capacity (block_cache_mb), bytes.",
            st["block_cache_capacity"])
    f.gauge("store_memtable_bytes", "RocksDB memtables of the disk tables, bytes.", st["memtable_bytes"])
    f.gauge("store_sst_bytes", "Bytes of the disk tables' SST files (the rows on disk).", st["sst_bytes"])


#: every shard's scalar counters (C) and gauges (G): (kind, key in the counters = metric name, help)
_TRAFFIC = (
    ("C", "rx_frames", "Datagrams received."),
    ("C", "rx_bytes", "UDP payload bytes received."),
    ("C", "tx_frames", "Datagrams sent."),
    ("C", "tx_bytes", "UDP payload bytes sent."),
    ("C", "lookup_keys", "Keys looked up."),
    ("C", "updates_applied", "Update messages applied."),
    ("C", "update_keys", "Keys updated."),
    ("C", "duplicates", "Updates answered as duplicates without applying them again (exactly once)."),
    ("C", "update_polls", "Polls: re-sent last fragments of updates a client saw no ack for."),
    ("C", "update_poll_acks", "Polls of updates already applied, acked from the exactly-once window."),
    ("C", "update_nacks", "Polls of incomplete updates answered UPDATE_NACK with the fragments held."),
    ("G", "dedup_entries", "Applied updates remembered in the exactly-once window."),
    ("C", "internal_errors", "Requests answered INTERNAL or batches lost to a fault of the shard."),
    ("C", "send_errors", "Failed sends."),
    ("G", "announced", "SIZE_REQ announcements waiting for their data (fixed-length mode)."),
)
#: the counters by a label: (key in the counters = metric name, label, help); ``rows`` a gauge
_BY_LABEL = (
    ("requests", "type", "Complete request messages, by type."),
    ("replies", "type", "Reply messages sent, by type."),
    ("errors", "status", "ERROR replies, by status."),
    ("drops", "reason", "Frames dropped, by reason."),
    ("rows", "table", "Rows held per table (materialised rows)."),
)
#: ``reassembly_<key>`` (``pending`` a gauge): (key in counters["reassembly"], help)
_REASSEMBLY = (
    ("pending", "Messages waiting for fragments."),
    ("expired", "Incomplete messages dropped by the reassembly timeout."),
    ("evicted", "Incomplete messages evicted for room."),
    ("duplicate_frames", "Fragments received twice."),
)
#: the write-ahead log's: (kind, key in counters["durability"], metric, help)
_DURABILITY = (
    ("C", "log_records", "wal_records", "Updates appended to the write-ahead log."),
    ("C", "log_bytes", "wal_bytes", "Bytes appended to the write-ahead log."),
    ("C", "log_commits", "wal_commits", "Commits (fdatasync) of the write-ahead log."),
    ("G", "seq", "wal_sequence", "Sequence number of the current log file."),
    ("G", "since_checkpoint", "wal_updates_since_checkpoint", "Updates logged since the last checkpoint."),
    ("C", "checkpoints", "checkpoints", "Checkpoints written."),
    ("C", "log_errors", "wal_errors", "Log writes the disk refused (the shard then stops acking)."),
    ("C", "checkpoint_errors", "checkpoint_errors", "Checkpoints that failed."),
)
#: the serving loop's counters: (key in the engine's counters = metric name, help)
_ENGINE_COUNTERS = (
    ("wakeups", "Wake-ups of the serving loop (each: one recvmmsg batch)."),
    ("recv_calls", "recvmmsg calls."),
    ("send_calls", "sendmmsg calls."),
    ("gso_sends", "Replies sent as UDP GSO super-datagrams."),
    ("gso_fallbacks", "GSO sends the kernel refused (sent frame by frame)."),
    ("messages_whole", "Multi-fragment messages gathered whole from one wake-up."),
    ("answered_in_c", "Lookups answered by the C answer path (rows gathered, reply built in C)."),
    ("answered_from_rx", "Of those, answered straight from the receive buffer."),
)


#: the disk tier's per-table counters: (key in DiskTable.counters(), metric, help)
_STORE_COUNTERS = (
    ("hits", "store_cache_hits", "Keys of lookups and updates found in a disk table's cache of hot rows."),
    ("misses", "store_cache_misses", "Keys read from the disk table's store (RocksDB) into its cache."),
    ("evictions", "store_cache_evictions", "Cached rows evicted to make room."),
    ("writebacks", "store_cache_writebacks", "Dirty cached rows written to the store (at eviction or flush)."),
    ("store_writes", "store_rows_written", "Rows written to the store."),
    ("write_through", "store_write_through", "Keys served past the cache (no free way in their set)."),
    ("store_write_errors", "store_write_errors", "Writes the disk table's store refused (a full disk)."),
)
_STORE_GAUGES = (
    ("cache_rows", "store_cache_capacity_rows", "Rows a disk table's cache holds at most (cache_rows)."),
    ("cached", "store_cache_rows", "Rows in a disk table's cache."),
    ("dirty", "store_cache_dirty_rows", "Cached rows not yet written to the store."),
    ("full", "store_full", "1 while the disk table's store takes no writes (its disk is full): updates of it are "
     "refused STORE_FULL."),
    ("pending", "store_pending_rows", "Rows updated while the store was full, kept in memory until it takes them."),
)


class ShardCollector:
    """A prometheus_client collector that reads a shard's counters at every scrape.

    Args:
        read: returns the shard's counters (``BatchShardServer.counters()``'s shape); called on the
            metrics server's thread, so it must hand the reading to the serving thread itself.
    """

    def __init__(self, read: Callable[[], dict]):
        self.read = read

    def describe(self):
        return []

    def collect(self):
        yield from shard_families(self.read())


def serve_metrics(read: Callable[[], dict], port: int, bind: str = "0.0.0.0") -> MetricsServer:
    """Serve a shard's metrics on ``bind:port`` (``GET /metrics``) from a thread of this process.

    Raises:
        MissingDependencyError, UsageError, OperationalError: as :class:`~embnic.control.card_metrics.MetricsServer`
            (the port taken names ``--metrics-port``).
    """
    srv = MetricsServer(ShardCollector(read), port, bind, option="--metrics-port")
    log.info("metrics on http://%s:%d/metrics", bind, srv.port)
    return srv
