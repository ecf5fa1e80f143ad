"""The replay's report: per-request outcome, latencies, drops by hop, shard counters from their
logs, the report.json and plots of ``embnic replay`` and its one-screen summary.
"""
from __future__ import annotations

import collections
import json
import os
from pathlib import Path

from embnic.client_lib import consts
from embnic.client_lib.consts import MsgType
from embnic.testbed.net import topology as T
from embnic.testbed.training import report as R


def shard_counters_from_log(path: str | os.PathLike) -> dict | None:
    """The counters a shard server logged when it stopped (the last ``stopped; counters {...}``
    line of its log; :meth:`~embnic.testbed.server.ShardServer.counters`), or None if it did
    not log them (killed, or the log is gone)."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return None
    for ln in reversed(lines):
        i = ln.find(" stopped; counters ")
        if i >= 0:
            try:
                return json.loads(ln[i + len(" stopped; counters "):])
            except ValueError:
                return None
    return None


def replay_report(pcap, sidecar: dict | None, reqs, trackers, counters, state_summary, tcpr, rate, topspeed, other,
                   out: Path, ports: dict | None = None, capture_drops: dict | None = None,
                   target: str = "dpdk") -> dict:
    lat = {"LOOKUP_REQ": [], "UPDATE_REQ": []}
    reply_types = collections.Counter()
    statuses = collections.Counter()
    replies_per_client, requests_per_client, missing = {}, {}, []
    sent_t = []
    reasm_drops = collections.Counter()
    for cid, t in trackers.items():
        requests_per_client[str(cid)] = len(t.reqs)
        replies_per_client[str(cid)] = len(t.done)
        sent_t += t.sent_t
        reasm_drops.update(getattr(t.reasm, "drops", {}) or {})
        for (c, mid), r in t.reqs.items():
            d = t.done.get(mid)
            if d is None:
                missing.append({"client": c, "msg_id": mid, "type": MsgType(r["type"]).name, "shard": r["shard"]})
                continue
            reply_types[MsgType(d[1]).name] += 1
            if d[1] == MsgType.ERROR:
                try:
                    statuses[consts.Status(d[2]).name] += 1
                except ValueError:
                    statuses[str(d[2])] += 1
            if mid in t.first_sent:
                lat[MsgType(r["type"]).name].append((d[0] - t.first_sent[mid]) / 1e3)
    sent_t.sort()
    span = (sent_t[-1] - sent_t[0]) / 1e9 if len(sent_t) > 1 else 0.0
    replied = sum(replies_per_client.values())
    failed = sum(statuses.values())
    completed = replied - failed
    rep = {
        "target": target,
        "pcap": str(pcap.resolve()),
        "sidecar": sidecar,
        "replayer": "tcpreplay",
        "rate_pps": rate,
        "topspeed": topspeed,
        "frames_in_trace": sum(len(r["frags"]) for r in reqs.values()),
        "frames_sent": len(sent_t),
        "duration_s": round(span, 4),
        "frames_per_s": round(len(sent_t) / span, 1) if span > 0 else None,
        "requests": len(reqs),
        "messages_replied": replied,
        "messages_completed": completed,
        "messages_failed": failed,
        "all_replied": replied == len(reqs),
        "all_completed": completed == len(reqs),
        "requests_per_client": requests_per_client,
        "replies_per_client": replies_per_client,
        "reply_types": dict(reply_types),
        "error_statuses": dict(statuses),
        "drops": {"card": counters.get("drops", {}), "client_reassembly": dict(reasm_drops),
                  "no_reply": len(missing), "unexpected_replies": sum(t.unexpected for t in trackers.values()),
                  "mismatched_replies": sum(t.mismatched for t in trackers.values()),
                  "non_embnic_frames_in_trace": other},
        "frames_lost": _hop_losses(trackers, counters, ports or {}),
        "capture_drops": capture_drops or {},
        "missing": missing[:100],
        "lookup_latency_us": R.percentiles(lat["LOOKUP_REQ"]),
        "update_latency_us": R.percentiles(lat["UPDATE_REQ"]),
        "card": {**R.card_summary(counters, state_summary), "state": state_summary},
        "tcpreplay": {str(k): v for k, v in tcpr.items()},
    }
    rep["plots"] = {
        "latency_cdf": str(R.plot_cdf(out / "replay_latency_cdf.png",
                                      {"lookup": lat["LOOKUP_REQ"], "update": lat["UPDATE_REQ"]},
                                      "replayed requests: latency to the complete reply",
                                      "latency (µs, first request frame → last reply frame)")),
        "replies": str(R.plot_grouped_bars(out / "replay_replies.png",
                                           {"requests replayed": {f"client {c}": n for c, n in requests_per_client.items()},
                                            "replies received": {f"client {c}": n for c, n in replies_per_client.items()}},
                                           "requests replayed vs replies received, per client", "messages")),
    }
    R.write_json(out / "report.json", rep)
    return rep


def _hop_losses(trackers: dict, counters: dict, ports: dict) -> dict:
    """Frames lost per hop and client, from the client-side capture and the card's port counters:
    ``client_to_card`` = frames the client sent − frames the card received on its port (e.g. the
    af_packet RX ring overflowed), ``card_to_client`` = frames the card sent on that port − reply
    frames the client saw."""
    by_port = {int(p["port"]): p for p in counters.get("ports", []) or []}
    out = {"client_to_card": {}, "card_to_client": {}}
    for cid, t in trackers.items():
        p = by_port.get(ports.get(cid, -1))
        if p is None:
            continue
        out["client_to_card"][str(cid)] = max(0, t.sent_frames - int(p.get("rx_frames", 0)))
        out["card_to_client"][str(cid)] = max(0, int(p.get("tx_frames", 0)) - t.reply_frames)
    return out


def _per_client(d: dict) -> str:
    nz = {k: v for k, v in d.items() if v}
    return ", ".join(f"client {k}: {v}" for k, v in sorted(nz.items())) or "none"


def replay_summary(rep: dict) -> list[str]:
    """The short summary printed after a replay."""
    lk, up = rep["lookup_latency_us"], rep["update_latency_us"]
    rows = [
        ("frames", f"{rep['frames_sent']} sent in {rep['duration_s']:.3f} s"
                   + (f" = {rep['frames_per_s']:.0f} frames/s" if rep["frames_per_s"] else "")),
        ("messages", f"{rep['messages_completed']}/{rep['requests']} completed"
                     + (" (every request got its reply)" if rep["all_completed"] else
                        f" ({rep['messages_failed']} answered ERROR: {R.fmt_drops(rep['error_statuses'])}; "
                        f"{rep['requests'] - rep['messages_replied']} unanswered)")),
        ("replies per client", ", ".join(f"client {c}: {n}/{rep['requests_per_client'][c]}"
                                         for c, n in rep["replies_per_client"].items())),
        ("lookup latency", f"p50 {lk['p50']} µs, p99 {lk['p99']} µs (n={lk['n']})"),
        ("update latency", f"p50 {up['p50']} µs, p99 {up['p99']} µs (n={up['n']})"),
        ("card drops", R.fmt_drops(rep["drops"]["card"])),
        ("other drops", f"no reply {rep['drops']['no_reply']}, reassembly "
                        f"{R.fmt_drops(rep['drops']['client_reassembly'])}"),
        ("frames lost", "client→card " + _per_client(rep["frames_lost"]["client_to_card"])
                        + "; card→client " + _per_client(rep["frames_lost"]["card_to_client"])
                        + " (capture vs the card's port counters)"),
        ("report", str(Path(rep["plots"]["latency_cdf"]).parent / "report.json")),
    ]
    if rep.get("shards"):
        errs = {f"shard {sid} {st}": n for sid, c in rep["shards"].items() if c
                for st, n in (c.get("errors") or {}).items() if n}
        rows.insert(-1, ("shard errors", R.fmt_drops(errs)))
    if rep.get("dead_nodes"):
        rows.insert(2, ("dead nodes", T.describe_dead(rep["dead_nodes"])))
    return ["replay summary:"] + R.table_lines(rows)
