"""The main job (``make demo`` = ``embnic demo``): train on real Criteo data through the card.

Sequence (:func:`run_demo`):

1. **reference** — the same training run with the tables in this process
   (:class:`~embnic.client_lib.tables.LocalBackend`): the losses the card run must reproduce.
2. **up** — the namespace testbed of the config (:mod:`embnic.testbed.topology`): a shard in
   each shard namespace, ``embnic-dp`` on ``net_af_packet`` vdevs in the card namespace, routes
   and clients programmed from the config, a probe through every path. Optional faults
   (:mod:`embnic.testbed.netem`) go on the links now.
3. **train** — the first client's :class:`~embnic.client_lib.client.EmbeddingClient` is
   created inside its namespace (:func:`~embnic.testbed.topology.in_netns`), so every lookup
   and update of every step is a variable-length embnic message client → card → shard →
   card → client. A progress bar shows step, loss and messages/s.
4. **check** — per-step losses against the reference (max |Δ| ≤ 1e-6), and the final
   embedding rows on the shards (read back through the card) against the reference tables
   (exactly equal: exactly-once updates, also under loss/reordering/duplicates).
5. **down** — always, also on errors (a killed shard, Ctrl-C).
6. **report** — ``OUT/report.json`` (fields in :func:`run_demo`), ``OUT/loss.png`` (loss
   curves of both runs), ``OUT/latency_cdf.png`` (lookup latency CDF), a short summary.
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Callable

import numpy as np

from embnic.client_lib.config import ClusterConfig, load_config

from . import report as R
from . import topology as T

LOSS_TOL = 1e-6
DEFAULT_OUT = "out/demo"
DEFAULT_NAME = "embdemo"
REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "examples" / "testbed.toml"


class DemoError(RuntimeError):
    """The demo failed (the message says where; ``report`` holds what was measured, if anything)."""

    def __init__(self, message: str, report: dict | None = None):
        super().__init__(message)
        self.report = report


@dataclasses.dataclass
class DemoOptions:
    """Options of :func:`run_demo`.

    Attributes:
        config: cluster config with an enabled ``[card]`` (default examples/testbed.toml).
        steps, batch_size: training steps and samples per step.
        out: output directory (report.json, PNGs).
        name: testbed name (prefix of namespaces and interfaces).
        data: Criteo TSV (default: the shipped sample).
        impairment: netem faults on every link during training (None: none).
        netem_backend: ``auto``, ``tc`` or ``user``.
        kill_shard, kill_at_step: kill that shard's server after that step (fault injection).
        check_tables: read every updated row back through the card and compare.
        progress: show progress bars (None: when stderr is a terminal).
        rdir: run directory (default ``$EMBNIC_RUN_DIR`` or /run/embnic).
    """

    config: str | os.PathLike = DEFAULT_CONFIG
    steps: int = 40
    batch_size: int = 256
    out: str | os.PathLike = DEFAULT_OUT
    name: str = DEFAULT_NAME
    data: str | os.PathLike | None = None
    impairment: object | None = None
    netem_backend: str = "auto"
    kill_shard: int | None = None
    kill_at_step: int = 1
    check_tables: bool = True
    progress: bool | None = None
    rdir: Path | None = None


def _snapshot(client) -> dict:
    s = client.stats
    return {"messages_sent": s.messages_sent, "messages_received": s.messages_received,
            "frames_sent": s.frames_sent, "frames_received": s.frames_received, "bytes_sent": s.bytes_sent,
            "bytes_received": s.bytes_received, "retransmits": s.retransmits, "rounds": s.rounds,
            "stale_replies": s.stale_replies, "latencies": len(s.lookup_latency_us),
            "drops": dict(client.drops)}


def reference_run(cfg: ClusterConfig, train_data, valid_data, steps: int, batch_size: int,
                  progress: bool | None = None):
    """Train with in-process tables. Returns (TrainResult, LocalBackend, seconds)."""
    from embnic.client_lib.tables import LocalBackend

    from .train import train

    local = LocalBackend(cfg)
    t0 = time.monotonic()
    with R.Progress(steps, "reference (in-process tables)", enabled=progress) as bar:
        res = train(cfg, train_data, steps=steps, batch_size=batch_size, backend=local, eval_data=valid_data,
                    progress=lambda i, loss: bar.update(1, loss=f"{loss:.4f}"))
    return res, local, time.monotonic() - t0


def compare_tables(client, local, tables_per_round: int = 2) -> dict:
    """Read every row the reference run updated back from the shards (through ``client``) and
    compare with the reference tables.

    Returns:
        ``{"rows": N, "max_abs_diff": float, "equal": bool, "tables": T}`` (equal = bitwise).
    """
    state = {t: ks for t, (ks, _, _) in local.state_dict().items() if ks.size}
    ref = {t: local.lookup(t, ks) for t, ks in state.items()}
    ids = sorted(state)
    n, worst, equal = 0, 0.0, True
    for i in range(0, len(ids), tables_per_round):
        chunk = {t: state[t] for t in ids[i:i + tables_per_round]}
        got = client.lookup(chunk)
        for t in chunk:
            d = np.abs(got[t].astype(np.float64) - ref[t].astype(np.float64))
            worst = max(worst, float(d.max()) if d.size else 0.0)
            equal = equal and bool(np.array_equal(got[t], ref[t]))
            n += len(chunk[t])
    return {"rows": n, "tables": len(ids), "max_abs_diff": worst, "equal": equal}


def run_demo(opts: DemoOptions, log: Callable[[str], None] = print) -> dict:
    """Run the main job (see the module docstring) and write its report.

    Report fields (``OUT/report.json``): ``target`` (``"dpdk"``), ``testbed``, ``config``,
    ``steps``, ``batch_size``, ``loss`` (per step, through the card), ``loss_reference``,
    ``loss_max_abs_diff``, ``loss_match`` (≤ 1e-6), ``auc``, ``auc_reference``, ``messages``
    (requests sent + replies received by the client during the training steps),
    ``messages_detail``, ``frames`` (frames sent + received), ``frames_detail``,
    ``rounds_per_step``, ``dedup_ratio`` (unique ids / ids), ``dedup_savings`` (1 − ratio),
    ``lookup_latency_us`` (``p50``, ``p90``, ``p99``, ``max``, ``mean``, ``n``),
    ``card_drops`` (every reason), ``card`` (per-type frames, ports, ring, state map),
    ``tables`` (rows read back, max |Δ|, equal), ``netem``, ``timing``, ``plots``.

    Raises:
        NeedsRoot: not root.
        TestbedError: the testbed did not come up (names the log).
        DemoError: training failed (e.g. a shard died: the message names it), or the losses
            or tables do not match (the report is written first).
    """
    from embnic.client_lib.client import EmbeddingClient, EmbnicError

    from . import netem as N
    from .train import load_training_data, train

    T.require_net_admin("the demo (it brings the namespace testbed up)")
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    user_cfg = load_config(opts.config)
    topo = T.Topology.from_config(user_cfg, opts.name)  # validate before the slow parts
    tr, va = load_training_data(user_cfg, opts.data)
    log(f"data: {len(tr.labels)} training rows, {len(va.labels)} held out for the AUC "
        f"({opts.data or 'shipped Criteo sample'}); {len(user_cfg.tables)} tables, {len(user_cfg.shards)} shards")

    ref, local, t_ref = reference_run(user_cfg, tr, va, opts.steps, opts.batch_size, opts.progress)
    log(f"reference run (in-process tables): final loss {ref.loss[-1]:.6f}, AUC {ref.auc:.4f}, {t_ref:.1f} s")

    tb = T.Testbed(topo, opts.rdir)
    timing = {"reference_s": round(t_ref, 2)}
    t_up = time.monotonic()
    tb.up(owner="demo")
    timing["up_s"] = round(time.monotonic() - t_up, 2)
    rep: dict = {}
    try:
        cfg = tb.cfg
        cid = cfg.clients[0].id
        log(f"testbed {opts.name} up in {timing['up_s']:.1f} s: probe RTT "
            + ", ".join(f"{k} {v:.0f} µs" for k, v in tb.state.get("probe_rtt_us", {}).items()))
        netem_rec = None
        if opts.impairment is not None and not opts.impairment.clear:
            netem_rec = N.apply(opts.name, opts.impairment, backend=opts.netem_backend, rdir=tb.rdir)
            imp = opts.impairment
            log(f"faults on every link ({netem_rec['backend']} netem): loss {imp.loss:g}% reorder "
                f"{imp.reorder:g}% duplicate {imp.duplicate:g}%")
        tb.target.reset_counters()
        with T.in_netns(topo.client_ns(cid)):
            client = EmbeddingClient(cfg, cid)
        snap: dict = {}
        card_at_end: dict = {}
        t0 = time.monotonic()
        with client, R.Progress(opts.steps, f"train through the card (client {cid})", enabled=opts.progress) as bar:
            def progress(i: int, loss: float) -> None:
                s = client.stats
                el = max(time.monotonic() - t0, 1e-9)
                bar.update(1, loss=f"{loss:.4f}", msg_s=f"{(s.messages_sent + s.messages_received) / el:.0f}")
                if opts.kill_shard is not None and i + 1 == opts.kill_at_step:
                    log(f"fault: killing shard {opts.kill_shard}'s server after step {i + 1}")
                    tb.kill_server(opts.kill_shard)
                if i + 1 == opts.steps:
                    snap.update(_snapshot(client), elapsed=el)
                    card_at_end.update(tb.target.counters())

            try:
                res = train(cfg, tr, steps=opts.steps, batch_size=opts.batch_size, backend=client,
                            eval_data=va, progress=progress)
            except EmbnicError as e:
                raise DemoError(f"training through the card failed: {e}") from None
            timing["train_s"] = round(time.monotonic() - t0, 2)
            tables = None
            if opts.check_tables:
                tables = compare_tables(client, local)
        if netem_rec is not None:
            netem_rec = N.show(opts.name, rdir=tb.rdir)
        card_final = tb.target.counters()
        state_summary = tb.target.state_summary()
    finally:
        t_down = time.monotonic()
        tb.down()
        timing["down_s"] = round(time.monotonic() - t_down, 2)

    steps = opts.steps
    loss_diff = float(np.max(np.abs(np.asarray(res.loss, np.float64) - np.asarray(ref.loss, np.float64))))
    lat = client.stats.lookup_latency_us[:snap["latencies"]]
    el = snap["elapsed"]
    msgs = snap["messages_sent"] + snap["messages_received"]
    frames = snap["frames_sent"] + snap["frames_received"]
    rep = {
        "target": "dpdk",
        "testbed": opts.name,
        "config": str(Path(opts.config).resolve()),
        "data": str(opts.data or "shipped Criteo sample (testbed/data)"),
        "client": cid,
        "steps": steps,
        "batch_size": opts.batch_size,
        "loss": res.loss,
        "loss_reference": ref.loss,
        "loss_max_abs_diff": loss_diff,
        "loss_match": loss_diff <= LOSS_TOL,
        "auc": res.auc,
        "auc_reference": ref.auc,
        "eval_loss": res.eval_loss,
        "messages": msgs,
        "messages_detail": {"requests_sent": snap["messages_sent"], "replies_received": snap["messages_received"],
                            "retransmits": snap["retransmits"], "stale_replies": snap["stale_replies"],
                            "per_step": round(msgs / steps, 2), "per_s": round(msgs / el, 1)},
        "frames": frames,
        "frames_detail": {"sent": snap["frames_sent"], "received": snap["frames_received"],
                          "bytes_sent": snap["bytes_sent"], "bytes_received": snap["bytes_received"],
                          "per_s": round(frames / el, 1)},
        "rounds_per_step": snap["rounds"] / steps,
        "dedup_ratio": res.dedup_ratio,
        "dedup_savings": 1.0 - res.dedup_ratio,
        "ids": res.ids,
        "unique_ids": res.unique_ids,
        "lookup_latency_us": R.percentiles(lat),
        "card_drops": card_at_end.get("drops", {}),
        "card": {"types": card_at_end.get("types"), "ports": card_at_end.get("ports"),
                 "ring": card_at_end.get("ring"), "mempool": card_at_end.get("mempool"),
                 "state": card_at_end.get("state"), "state_summary_at_end": state_summary,
                 "drops_incl_eval_and_readback": card_final.get("drops", {})},
        "client_drops": snap["drops"],
        "tables": tables,
        "netem": netem_rec,
        "kill_shard": opts.kill_shard,
        "timing": {**timing, "train_steps_s": round(el, 2), "steps_per_s": round(steps / el, 2)},
    }
    rep["plots"] = {
        "loss": str(R.plot_loss(out / "loss.png", {"through the card": res.loss, "in-process reference": ref.loss},
                                f"FM CTR model on Criteo, {steps} steps × {opts.batch_size}")),
        "latency_cdf": str(R.plot_cdf(out / "latency_cdf.png", {"lookup message": lat},
                                      "lookup latency through the card (per message, client-measured)")),
    }
    R.write_json(out / "report.json", rep)
    for line in summary(rep):
        log(line)
    problems = []
    if not rep["loss_match"]:
        problems.append(f"losses differ from the in-process run by up to {loss_diff:.3g} (> {LOSS_TOL:g})")
    if tables is not None and not tables["equal"]:
        problems.append(f"final tables differ from the in-process run (max |Δ| {tables['max_abs_diff']:.3g})")
    if problems:
        raise DemoError("; ".join(problems) + f" (report: {out / 'report.json'})", rep)
    return rep


def summary(rep: dict) -> list[str]:
    """The short summary printed at the end of the demo."""
    lat = rep["lookup_latency_us"]
    tb = rep.get("tables") or {}
    rows = [
        ("steps", f"{rep['steps']} × {rep['batch_size']} samples, {rep['timing']['steps_per_s']:.2f} steps/s"),
        ("loss", f"{rep['loss'][0]:.4f} → {rep['loss'][-1]:.4f}   max |Δ| vs in-process "
                 f"{rep['loss_max_abs_diff']:.2g} ({'match' if rep['loss_match'] else 'MISMATCH'})"),
        ("AUC", f"{rep['auc']:.4f} (in-process {rep['auc_reference']:.4f})"),
        ("messages", f"{rep['messages']} ({rep['messages_detail']['per_s']:.0f}/s), frames {rep['frames']}, "
                     f"{rep['rounds_per_step']:.1f} rounds/step, {rep['messages_detail']['retransmits']} retransmits"),
        ("dedup", f"unique/all ids {rep['dedup_ratio']:.3f} (saves {100 * rep['dedup_savings']:.1f}% of the ids)"),
        ("lookup latency", f"p50 {lat['p50']} µs, p99 {lat['p99']} µs (n={lat['n']})"),
        ("card drops", R.fmt_drops(rep["card_drops"])),
    ]
    if tb:
        rows.append(("final tables", f"{tb['rows']} rows read back through the card: "
                                     f"{'identical' if tb['equal'] else 'DIFFERENT'} to the in-process run"))
    if rep.get("netem"):
        imp = rep["netem"].get("impairment", {})
        rows.append(("faults", f"loss {imp.get('loss')}% reorder {imp.get('reorder')}% duplicate "
                               f"{imp.get('duplicate')}% ({rep['netem'].get('backend')})"))
    rows.append(("report", f"{Path(rep['plots']['loss']).parent / 'report.json'}, loss.png, latency_cdf.png"))
    return ["demo summary:"] + R.table_lines(rows)
