"""The demo's report: ``OUT/report.json`` with its plots (:func:`build_report`, fields in
docs/testbed.md), and the short summaries printed at the end."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import report as R

LOSS_TOL = 1e-6  #: largest |Δ| of a step's loss through the card vs the in-process run
PROBE_TARGET = 2.0  #: target: lookup p50 at most this many times the probe RTT p50 of the same run


def build_report(run, ref, out: Path) -> dict:
    """The report dict (fields in docs/testbed.md) of ``run`` (what the demo's run through the card
    left: its options, losses, counters, failure, ...) and ``ref`` (the in-process reference run's
    result), written to ``out/report.json`` with its plots."""
    opts, res, losses, snap, failure = run.opts, run.res, run.losses, run.snap, run.failure
    card_at_end, lat, probes = run.card_at_end, run.client.stats.lookup_latency_us[:snap["latencies"]], run.probes
    done = len(losses)
    steps = opts.steps
    ref_part = np.asarray(ref.loss[:done], np.float64)
    loss_diff = float(np.max(np.abs(np.asarray(losses, np.float64) - ref_part))) if done else None
    el = snap["elapsed"]
    msgs = snap["messages_sent"] + snap["messages_received"]
    frames = snap["frames_sent"] + snap["frames_received"]
    rep = {
        "target": opts.target,
        "pmd": opts.pmd if opts.target == "dpdk" else None,
        "model": opts.model,
        "testbed": opts.name,
        "config": str(Path(opts.config).resolve()),
        "data": str(opts.data or "shipped Criteo sample (testbed/training/data)"),
        "client": run.cid,
        "other_clients": {str(r.client.client_id): r.result() for r in run.readers},
        "steps": steps,
        "steps_completed": done,
        "batch_size": opts.batch_size,
        "error": None if failure is None else {k: v for k, v in failure.items() if k != "card_dead"},
        "loss": losses,
        "loss_reference": ref.loss,
        "loss_max_abs_diff": loss_diff,
        "loss_match": loss_diff is not None and loss_diff <= LOSS_TOL,
        "auc": res.auc if res is not None else None,
        "auc_reference": ref.auc,
        "eval_loss": res.eval_loss if res is not None else None,
        "messages": msgs,
        "messages_detail": {"requests_sent": snap["messages_sent"], "replies_received": snap["messages_received"],
                            "retransmits": snap["retransmits"], "stale_replies": snap["stale_replies"],
                            "tail_probes": snap["tail_probes"],
                            "per_step": round(msgs / max(done, 1), 2), "per_s": round(msgs / el, 1)},
        "frames": frames,
        "frames_detail": {"sent": snap["frames_sent"], "received": snap["frames_received"],
                          "bytes_sent": snap["bytes_sent"], "bytes_received": snap["bytes_received"],
                          "per_s": round(frames / el, 1)},
        "rounds_per_step": snap["rounds"] / max(done, 1),
        # protocol v2: one request message per shard a round touches (tail probes, repairs and
        # re-sends aside); more only where a round was split past the per-message fragment cap
        "request_messages_per_round": round(snap.get("round_messages", 0) / max(snap.get("data_rounds", 0), 1), 2),
        "shards_per_round": round(snap.get("round_shards", 0) / max(snap.get("data_rounds", 0), 1), 2),
        "dedup_ratio": res.dedup_ratio if res is not None else None,
        "dedup_savings": 1.0 - res.dedup_ratio if res is not None else None,
        "ids": res.ids if res is not None else None,
        "unique_ids": res.unique_ids if res is not None else None,
        "lookup_latency_us": R.percentiles(lat),
        "probe_rtt_us": R.percentiles(probes),
        "probes": dict(run.probe_sent),
        "lookup_p50_over_probe_p50": ratio_p50(lat, probes),
        "latency_target": {"target": PROBE_TARGET, "measured": ratio_p50(lat, probes),
                           "met": (ratio_p50(lat, probes) or float("inf")) <= PROBE_TARGET},
        "card_drops": card_at_end.get("drops", {}),
        # bmv2: frames the card-side interfaces took in that the switch never counted (lost in
        # its capture), per port and in total; the channel that programmed its tables
        "card_lost_before_switch": (None if "lost_before_switch" not in card_at_end else
                                    {"total": card_at_end["lost_before_switch"],
                                     "by_port": {str(p["port"]): p.get("lost_before_switch")
                                                 for p in card_at_end.get("ports", [])}}),
        "card_control": card_at_end.get("control"),
        "card": {**R.card_summary(card_at_end, run.state_at_end),
                 "drops_incl_eval_and_readback": (run.card_final or {}).get("drops", {})},
        "client_drops": snap["drops"],
        "tables": run.tables,
        "netem": run.netem_rec,
        "kill_shard": opts.kill_shard,
        "kill_at_step": run.kill_at,
        "restart": bool(opts.restart),
        "timing": {**run.timing, "train_steps_s": round(el, 2), "steps_per_s": round(done / el, 2)},
    }
    title = (f"{'TorchRec DLRM' if opts.model == 'dlrm' else 'FM CTR model'} on Criteo, "
             f"{steps} steps × {opts.batch_size}")
    if failure is not None:
        title += f" (failed after {done} steps)"
    rep["plots"] = {
        "loss": str(R.plot_loss(out / "loss.png", {"through the card": losses, "in-process reference": ref.loss},
                                title)),
        "latency_cdf": str(R.plot_cdf(out / "latency_cdf.png", {"lookup message": lat},
                                      "lookup latency through the card (per message, client-measured)")),
    }
    R.write_json(out / "report.json", rep)
    return rep


def ratio_p50(lat, probes) -> float | None:
    """p50 of the lookup latencies over p50 of the probe RTTs (None if either is empty)."""
    if not len(lat) or not probes:
        return None
    return round(float(np.percentile(lat, 50)) / float(np.percentile(probes, 50)), 3)


def failure_summary(rep: dict) -> list[str]:
    """The short summary printed when the demo failed: what ran before the failure."""
    err = rep["error"]
    lat = rep["lookup_latency_us"]
    loss = rep["loss"]
    rows = [
        ("failed", f"{err['phase']}, after {rep['steps_completed']} of {rep['steps']} steps"
                   + (f" (shard {err['failing_shard']} did not answer)" if err.get("failing_shard") is not None
                      else "")),
        ("dead nodes", ", ".join(f"{d['what']} (pid {d['pid']})" for d in err["dead_nodes"]) or "none"),
        ("loss", (f"{loss[0]:.4f} → {loss[-1]:.4f}   max |Δ| vs in-process {rep['loss_max_abs_diff']:.2g}"
                  if loss else "no step completed")),
        ("messages", f"{rep['messages']}, frames {rep['frames']}, "
                     f"{rep['messages_detail']['retransmits']} retransmits"),
        ("lookup latency", f"p50 {lat['p50']} µs, p99 {lat['p99']} µs (n={lat['n']}, "
                           f"{rep['request_messages_per_round']:g} request messages/round)"),
        ("report", f"{Path(rep['plots']['loss']).parent / 'report.json'}, loss.png, latency_cdf.png"),
    ]
    return ["demo summary (FAILED):"] + R.table_lines(rows)


def target_verdict(t: dict) -> str:
    """``target ≤ 2: met`` / ``target ≤ 2: not met`` (``not measured`` without a measurement) for a
    ``latency_target`` record, worded like the README's targets."""
    verdict = "not measured" if t.get("measured") is None else "met" if t.get("met") else "not met"
    return f"target ≤ {t['target']:g}: {verdict}"


def summary(rep: dict) -> list[str]:
    """The short summary printed at the end of the demo."""
    lat = rep["lookup_latency_us"]
    tb = rep.get("tables") or {}
    rows = [
        ("card", f"{rep.get('target', 'dpdk')}" + (f" on net_{rep['pmd']}" if rep.get("pmd") else "")),
        ("steps", f"{rep['steps']} × {rep['batch_size']} samples, {rep['timing']['steps_per_s']:.2f} steps/s"),
        ("loss", f"{rep['loss'][0]:.4f} → {rep['loss'][-1]:.4f}   max |Δ| vs in-process "
                 f"{rep['loss_max_abs_diff']:.2g} ({'match' if rep['loss_match'] else 'MISMATCH'})"),
        ("AUC", f"{rep['auc']:.4f} (in-process {rep['auc_reference']:.4f})"),
        ("messages", f"{rep['messages']} ({rep['messages_detail']['per_s']:.0f}/s), frames {rep['frames']}, "
                     f"{rep['rounds_per_step']:.1f} rounds/step, {rep['request_messages_per_round']:g} "
                     f"request messages/round ({rep['shards_per_round']:g} shards), "
                     f"{rep['messages_detail']['retransmits']} retransmits"),
        ("dedup", f"unique/all ids {rep['dedup_ratio']:.3f} (saves {100 * rep['dedup_savings']:.1f}% of the ids)"),
        ("lookup latency", f"p50 {lat['p50']} µs, p99 {lat['p99']} µs (n={lat['n']}, "
                           f"{rep['request_messages_per_round']:g} request messages/round)"),
        ("probe RTT", f"p50 {rep['probe_rtt_us']['p50']} µs, p99 {rep['probe_rtt_us']['p99']} µs "
                      f"(n={rep['probe_rtt_us']['n']}, one-key lookups between steps): lookup p50 = "
                      f"{rep['lookup_p50_over_probe_p50']} × probe p50 ({target_verdict(rep['latency_target'])})"),
        ("card drops", R.fmt_drops(rep["card_drops"])),
    ]
    lost = rep.get("card_lost_before_switch")
    if lost is not None:
        rows.append(("lost before card", f"{lost['total']} frames the card's interfaces took in that the switch "
                                         "never counted (by port: " + ", ".join(
                                             f"{k}: {v}" for k, v in lost["by_port"].items()) + ")"
                                         + (f"; tables over {rep['card_control']['channel']}"
                                            if rep.get("card_control") else "")))
    if tb:
        rows.append(("final tables", f"{tb['rows']} rows read back through the card: "
                                     f"{'identical' if tb['equal'] else 'DIFFERENT'} to the in-process run"))
    if rep.get("netem"):
        imp = rep["netem"].get("impairment", {})
        rows.append(("faults", f"loss {imp.get('loss')}% reorder {imp.get('reorder')}% duplicate "
                               f"{imp.get('duplicate')}% ({rep['netem'].get('backend')})"))
    rows.append(("report", f"{Path(rep['plots']['loss']).parent / 'report.json'}, loss.png, latency_cdf.png"))
    return ["demo summary:"] + R.table_lines(rows)
