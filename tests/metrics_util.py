"""What the Prometheus exporters must say, from what the card and the shards themselves say.

Shared by tests/control/test_card_metrics.py (fake card, loopback shards) and
tests/testbed/test_metrics_live.py (a namespace testbed). Each ``*_expected`` walks EVERY leaf
of a reading — the card's ``counters`` / ``state_summary`` (what ``embnic status --json``
prints), a shard's counters (what it logs when it stops) — and names the sample the exporter
must have for it; a leaf with no rule fails, so a counter added later without a metric shows.
The metric families themselves are parsed with prometheus-client's own parser.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "contrib" / "grafana" / "embnic.json"
LATENCY_BUCKETS = 24


def samples(text: str) -> dict[tuple, float]:
    """``{(sample name, ((label, value), ...) sorted): value}`` of a Prometheus text exposition."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"sample {key} twice"
            out[key] = s.value
    return out


def families(text: str) -> dict[str, str]:
    """``{family name: type}`` of an exposition (prometheus-client's parser)."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def _k(name: str, **labels) -> tuple:
    return (name, tuple(sorted((k, str(v)) for k, v in labels.items())))


def _hist(out: dict, name: str, hist: list[int], sum_value: float, **labels) -> None:
    """The ``_bucket`` (cumulative, le = 2^i µs in seconds, last +Inf), ``_count`` and ``_sum`` of
    a log2 µs histogram."""
    acc = 0
    for i, n in enumerate(hist):
        acc += n
        le = "+Inf" if i == len(hist) - 1 else floatToGoString(float(2 ** i) * 1e-6)
        out[_k(f"{name}_bucket", le=le, **labels)] = acc
    out[_k(f"{name}_count", **labels)] = acc
    out[_k(f"{name}_sum", **labels)] = sum_value


def _walk(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, path + (k,))
    elif isinstance(obj, list) and all(isinstance(x, dict) for x in obj):  # (an empty list: no leaf)
        for i, v in enumerate(obj):
            yield from _walk(v, path + (i,))
    else:
        yield path, obj


def card_expected(c: dict, st: dict) -> dict[tuple, float]:
    """The samples the card exporter must give for ``counters`` ``c`` and ``state_summary``
    ``st`` (every leaf of both; AssertionError names a leaf with no rule)."""
    out: dict[tuple, float] = {}
    ports = {i: p["port"] for i, p in enumerate(c.get("ports", []))}
    shards = {i: ("other" if s["shard"] < 0 else s["shard"]) for i, s in enumerate(c.get("shards", []))}
    parts = {i: p for i, p in enumerate(st.get("by_partition", []))}
    simple = {("ring", "size"): "embnic_card_ring_size", ("ring", "count"): "embnic_card_ring_entries",
              ("ring", "high_water"): "embnic_card_ring_high_water", ("ring", "rings"): "embnic_card_rings",
              ("ring", "logged"): "embnic_card_ring_logged_total",
              ("mempool", "size"): "embnic_card_mempool_size", ("mempool", "available"): "embnic_card_mempool_available",
              ("mempool", "in_use"): "embnic_card_mempool_in_use", ("arp", "replies"): "embnic_card_arp_replies_total",
              ("state", "entries"): "embnic_card_state_entries", ("state", "capacity"): "embnic_card_state_capacity",
              ("state", "partitions"): "embnic_card_state_partitions",
              ("state", "overflow"): "embnic_card_state_overflow_total",
              ("state", "expired"): "embnic_card_state_expired_total"}
    by_port = c.get("drops_by_port")
    if by_port is not None:  # per port and reason; the card's own totals are their sums
        for reason, n in c["drops"].items():
            assert sum(p[reason] for p in by_port) == n, f"drops.{reason} {n} is not the sum over its ports"
    ctl = c.get("control")
    if ctl:  # bmv2: the control channel as an info sample (its addresses are not exported)
        out[_k("embnic_card_control_info", channel=ctl["channel"], switch=ctl["switch"])] = 1
    for path, v in list(_walk(c)) + [(("state",) + p, v) for p, v in _walk(st)]:
        if path[0] == "control" or path == ("lost_before_switch",):
            continue  # the info sample above; the sum of the ports' lost_before_switch
        if path in simple:
            key = _k(simple[path])
        elif path[0] == "ports" and path[2] == "max_frame":
            key = _k("embnic_card_port_max_frame_bytes", port=ports[path[1]])
        elif path[0] == "ports" and path[2] != "port":
            key = _k(f"embnic_card_{path[2]}_total", port=ports[path[1]])
        elif path[0] == "ports":
            continue  # the label itself
        elif path[0] == "types":
            key = _k("embnic_card_frames_total", type=path[1])
        elif path[0] == "drops" and by_port is not None:
            continue  # checked above: the sum of drops_by_port
        elif path[0] == "drops":
            key = _k("embnic_card_drops_total", reason=path[1])
        elif path[0] == "drops_by_port":
            if path[2] == "port":
                continue
            key = _k("embnic_card_drops_total", port=by_port[path[1]]["port"], reason=path[2])
        elif path[0] == "completed":
            key = _k("embnic_card_messages_completed_total", reply_type=path[1])
        elif path[:2] == ("state", "by_state"):
            key = _k("embnic_card_state_messages", state=path[2])
        elif path[:2] == ("state", "by_partition"):
            p = parts[path[2]]
            name = {"entries": "embnic_card_state_partition_entries",
                    "completed_since_start": "embnic_card_state_partition_completed_total",
                    "expired_since_start": "embnic_card_state_partition_expired_total"}.get(path[3])
            if name is None:
                assert path[3] in ("partition", "lcore", "capacity"), path
                continue  # labels; a partition's capacity is the map's over the partitions
            key = _k(name, partition=p["partition"], lcore=p["lcore"])
        elif path[0] == "shards":
            s = shards[path[1]]
            if path[2] == "shard":
                continue
            if path[2] == "expired":
                key = _k("embnic_card_shard_expired_total", shard=s)
            elif path[2] == "completed":
                key = _k("embnic_card_shard_completed_total", shard=s)
            elif path[2] == "latency_hist":
                _hist(out, "embnic_card_shard_latency_seconds", v, c["shards"][path[1]]["latency_sum_ns"] / 1e9, shard=s)
                continue
            elif path[2] == "latency_sum_ns":
                continue  # in _hist
            else:
                key = _k("embnic_card_shard_messages_completed_total", shard=s, reply_type=path[2])
        else:
            raise AssertionError(f"card counter {'.'.join(map(str, path))} = {v!r} has no metric rule")
        assert key not in out or out[key] == v, f"{key}: {out[key]} and {v}"
        out[key] = v
    return out


#: shard counters that are not numbers to export: where the log is, the restore report, the
#: engine's configuration (embnic_shard_engine_info)
SHARD_NOT_COUNTERS = {("durability", "dir"), ("durability", "last_checkpoint"), ("durability", "restored"),
                      ("shard",)}


def shard_expected(c: dict) -> dict[tuple, float]:
    """The samples a shard's metrics endpoint must give for its counters ``c`` (every leaf)."""
    out: dict[tuple, float] = {}
    sh = c["shard"]
    e = c.get("engine")
    simple = {"rx_frames", "rx_bytes", "tx_frames", "tx_bytes", "lookup_keys", "updates_applied", "update_keys",
              "duplicates", "update_polls", "update_poll_acks", "update_nacks", "internal_errors", "send_errors"}
    wal = {"log_records": "embnic_shard_wal_records_total", "log_bytes": "embnic_shard_wal_bytes_total",
           "log_commits": "embnic_shard_wal_commits_total", "seq": "embnic_shard_wal_sequence",
           "since_checkpoint": "embnic_shard_wal_updates_since_checkpoint",
           "checkpoints": "embnic_shard_checkpoints_total", "log_errors": "embnic_shard_wal_errors_total",
           "checkpoint_errors": "embnic_shard_checkpoint_errors_total"}
    engine_skip = {"name", "intake", "answer", "gso", "batch", "send_errors"}  # info labels; summed
    for path, v in _walk({k: v for k, v in c.items() if k != "engine"}):
        if path in SHARD_NOT_COUNTERS or path[:2] in SHARD_NOT_COUNTERS:
            continue
        if len(path) == 1 and path[0] in simple:
            key = _k(f"embnic_shard_{path[0]}_total", shard=sh)
        elif path == ("dedup_entries",):
            key = _k("embnic_shard_dedup_entries", shard=sh)
        elif path == ("announced",):
            key = _k("embnic_shard_announced", shard=sh)
        elif path[0] == "requests":
            key = _k("embnic_shard_requests_total", shard=sh, type=path[1])
        elif path[0] == "replies":
            key = _k("embnic_shard_replies_total", shard=sh, type=path[1])
        elif path[0] == "errors":
            key = _k("embnic_shard_errors_total", shard=sh, status=path[1])
        elif path[0] == "drops":
            key = _k("embnic_shard_drops_total", shard=sh, reason=path[1])
        elif path[0] == "rows":
            key = _k("embnic_shard_rows", shard=sh, table=path[1])
        elif path[0] == "reassembly":
            key = _k(f"embnic_shard_reassembly_{path[1]}" + ("" if path[1] == "pending" else "_total"), shard=sh)
        elif path[0] == "durability":
            key = _k(wal[path[1]], shard=sh)
        elif path == ("service", "hist"):
            _hist(out, "embnic_shard_service_seconds", v, c["service"]["sum_ns"] / 1e9, shard=sh)
            continue
        elif path == ("service", "sum_ns"):
            continue
        else:
            raise AssertionError(f"shard counter {'.'.join(map(str, path))} = {v!r} has no metric rule")
        out[key] = v
    if e:
        for k, v in e.items():
            if k not in engine_skip:
                out[_k(f"embnic_shard_{k}_total", shard=sh)] = v
        out[_k("embnic_shard_engine_info", shard=sh, engine=e["name"], intake=e["intake"],
               answer=e.get("answer", ""), gso=str(bool(e["gso"])).lower(), batch=e["batch"])] = 1
    return out


#: counters that move without traffic: the idle serving loop's empty recvmmsg calls (a scrape
#: taken before the shard's exit line may show fewer)
IDLE_COUNTERS = frozenset({"embnic_shard_recv_calls_total"})


def assert_agree(got: dict[tuple, float], want: dict[tuple, float], what: str) -> None:
    """Every expected sample is there with the value (floats to 1e-9 relative), and nothing else;
    an :data:`IDLE_COUNTERS` sample may be below ``want`` (read earlier), never above."""
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing, f"{what}: the exporter lacks {missing[:8]}"
    assert not extra, f"{what}: the exporter has samples no counter gives: {extra[:8]}"
    bad = [(k, got[k], want[k]) for k in want
           if not (k[0] in IDLE_COUNTERS and 0 < got[k] <= want[k])
           and abs(got[k] - want[k]) > 1e-9 * max(1.0, abs(want[k]))]
    assert not bad, f"{what}: values differ (sample, exporter, counters): {bad[:8]}"


def dashboard_queries(path: Path = DASHBOARD) -> list[str]:
    """Every PromQL ``expr`` of the Grafana dashboard."""
    d = json.loads(path.read_text())
    out = []

    def walk(panels):
        for p in panels:
            out.extend(t["expr"] for t in p.get("targets", []) if "expr" in t)
            walk(p.get("panels", []))

    walk(d["panels"])
    return out


_NAME = re.compile(r"\bembnic_[a-z0-9_]+\b")
_BY = re.compile(r"\bby\s*\(([^)]*)\)")


def check_dashboard(emitted_text: str, path: Path = DASHBOARD) -> int:
    """Every metric a dashboard query names is one the exporters emit (a sample name: ``_total``,
    ``_bucket``, ``_sum``, ``_count`` included), and every label it groups by is one of theirs.

    Returns:
        the number of queries checked.
    """
    got = samples(emitted_text)
    names = {n for n, _ in got}
    labels: dict[str, set] = {}
    for n, ls in got:
        labels.setdefault(n, set()).update(k for k, _ in ls)
    queries = dashboard_queries(path)
    assert queries
    for q in queries:
        used = _NAME.findall(q)
        assert used, f"query names no embnic metric: {q}"
        for n in used:
            assert n in names, f"dashboard query names {n}, which the exporters do not emit: {q}"
        for group in _BY.findall(q):
            for lab in (x.strip() for x in group.split(",")):
                assert any(lab in labels[n] for n in used) or lab == "le" and any(n.endswith("_bucket") for n in used), \
                    f"dashboard query groups by {lab!r}, a label none of {used} has: {q}"
    return len(queries)
