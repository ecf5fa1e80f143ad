"""End-to-end benchmark (``embnic bench e2e``): variable-length through the card vs a length
round vs TorchRec, in one run, on the same tables, batches and sharding.

The method: docs/bench.md, "embnic bench e2e".
"""
from __future__ import annotations

import dataclasses
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from embnic.client_lib.batch import KeyedJaggedBatch, prepare_batch
from embnic.client_lib.config import load_config
from embnic.control import capacity as P
from embnic.control.errors import OperationalError
from embnic.testbed.training import criteo

from . import e2e_dlrm
from .e2e_dlrm import fused_optimizer, median_min_max, table_wise_dmp
from .results import merge_json

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "testbed.toml"
BATCHES = (32, 256, 4096)
NAMES = list(criteo.SPARSE_NAMES)


def machine() -> dict:
    """``{cores, cpu_model, loadavg}`` of this machine (loadavg: 1/5/15 min)."""
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu_model": model, "loadavg": [round(x, 2) for x in os.getloadavg()]}


def sample_starts(n: int, steps: int, seed: int) -> list[int]:
    """``steps`` random first samples in ``[0, n)`` (a batch is consecutive samples from one)."""
    rng = np.random.default_rng(seed)
    return [int(rng.integers(0, n)) for _ in range(steps)]


def sample_batches(batch: int, steps: int, seed: int, rows: list, data=None) -> list[np.ndarray]:
    """``steps`` batches uint64 (batch, 26) of Criteo sample rows (hashed into ``rows`` per
    column), consecutive samples from a random start each (:func:`sample_starts`); ``data``: the
    sample already loaded with those ``rows``."""
    if data is None:
        data = criteo.load_criteo(criteo.sample_path("train"), rows=rows)
    n = len(data)
    return [data.sparse[(np.arange(batch) + s) % n] for s in sample_starts(n, steps, seed)]


# ---------------------------------------------------------------------------- embnic client
def embnic_steps(client, cfg, sparses: list[np.ndarray]) -> dict:
    """Run one step per batch (lookup of every unique id, then an update of all of them);
    returns per-step ``lookup_us``, ``update_us``, ``step_us`` lists and per-step means of
    ``messages`` (requests sent + replies received), ``rounds``, ``retransmits`` (re-sends and
    repairs), ``timeouts`` (retransmission timers that fired), ``repairs`` and ``probes`` (tail
    probes: one-key lookups after a shard's last message of a round, not among ``messages``)."""
    ftab = criteo.feature_tables(cfg, len(NAMES))
    look, upd, step = [], [], []
    def snap(s):
        return (s.messages_sent + s.messages_received, s.rounds, s.retransmits, s.timeouts, s.repairs, s.probes,
                s.round_messages, s.data_rounds, s.round_shards)

    s0 = snap(client.stats)
    for sp in sparses:
        prep = prepare_batch(KeyedJaggedBatch.from_dense(NAMES, sp), ftab, validate=False)
        keys = {t: p.unique for t, p in prep.tables.items()}
        t0 = time.perf_counter()
        rows = client.lookup(keys)
        t1 = time.perf_counter()
        client.update({t: (k, np.full_like(rows[t], 1e-3)) for t, k in keys.items()})
        t2 = time.perf_counter()
        look.append((t1 - t0) * 1e6)
        upd.append((t2 - t1) * 1e6)
        step.append((t2 - t0) * 1e6)
    n = len(sparses)
    s1 = snap(client.stats)
    d = [(b - a) / n for a, b in zip(s0, s1)]
    return {"lookup_us": look, "update_us": upd, "step_us": step, "messages": d[0], "rounds": d[1],
            "retransmits": d[2], "timeouts": d[3], "repairs": d[4], "probes": d[5],
            # request messages per lookup/update round (probes, repairs, re-sends aside) and the
            # shards such a round touches: equal in protocol v2 unless a round was split
            "request_messages_per_round": d[6] / max(d[7], 1e-9), "shards_per_round": d[8] / max(d[7], 1e-9)}


def _summ(runs: list[dict]) -> dict:
    """Repeats of :func:`embnic_steps` → medians with min/max."""
    p = lambda key, q: median_min_max([np.percentile(r[key], q) for r in runs])  # noqa: E731
    of = lambda key: median_min_max([r.get(key, 0.0) for r in runs])  # noqa: E731 (TorchRec's runs: 0)
    return {**{f"{k}_p{q}_us": p(f"{k}_us", q) for k in ("lookup", "update") for q in (50, 99)},
            "step_p50_us": p("step_us", 50),
            "steps_per_s": median_min_max([1e6 / np.median(r["step_us"]) for r in runs]),
            "messages_per_step": of("messages"), "rounds_per_step": of("rounds"),
            "request_messages_per_round": of("request_messages_per_round"), "shards_per_round": of("shards_per_round"),
            **{f"{k}_per_step": of(k) for k in ("retransmits", "timeouts", "repairs", "probes")}}


def run_card(config_text: str, name: str, batches: dict, repeats: int, loss_pct: float, log,
             dlrm_batches: dict | None = None) -> dict:
    """Bring the testbed up with ``config_text``; after one untimed pass over every step (the
    shards make their rows), per repeat: varlen and fixed (order alternating) at every batch size,
    then varlen with ``loss_pct`` % loss on every link (and through the user-space netem helpers
    with nothing dropped, where they carry the loss) (docs/bench.md); then the DLRM's training
    steps through the card (``dlrm_batches``: ``{B: e2e_dlrm.dlrm_batches(...)}``, None: skip).

    Returns ``{"varlen": {B: summary}, "fixed": {...}, "varlen_loss": {...}, "varlen_relay":
    {...} (user backend only), "netem_backend", "dlrm": {B: [step µs per repeat]} (or None),
    "card": counters subset, "shard_engine": ...}``.
    """
    from embnic.client_lib.client import EmbeddingClient
    from embnic.testbed.net import netem as N
    from embnic.testbed.net import topology as T

    T.require_net_admin("bench e2e (it brings the namespace testbed up)")
    backend = None
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench-e2e.toml"
        path.write_text(config_text)
        cfg0 = load_config(path)
        topo = T.Topology.from_config(cfg0, name)
        tb = T.Testbed(topo)
        tb.up(owner="bench-e2e")
        try:
            cfg = tb.cfg
            cid = cfg.clients[0].id

            def client(fixed: bool):
                with T.in_netns(topo.client_ns(cid)):
                    return EmbeddingClient(cfg, cid, fixed_length=fixed)

            def timed(mode: str, impairment=None, **netem_kw) -> dict | None:
                """``mode``'s steps timed, with ``impairment`` on every link (cleared after): its netem record."""
                rec = N.apply(name, impairment, rdir=tb.rdir, **netem_kw) if impairment else None
                try:
                    with client(mode == "fixed") as c:
                        for b, sp in batches.items():
                            embnic_steps(c, cfg, sp[:1])  # warm-up step
                            runs[mode][b].append(embnic_steps(c, cfg, sp[1:]))
                finally:
                    if impairment:
                        N.clear(name, rdir=tb.rdir)
                return rec

            runs = {m: {b: [] for b in batches} for m in ("varlen", "fixed", "varlen_loss", "varlen_relay")}
            card = None
            # one untimed pass over every step's ids first: a shard makes the rows of ids it has not
            # seen on their first lookup and stores them on their first update, work that only the
            # mode timed first would pay (with --repeats 1 always varlen, with 3 varlen twice)
            with client(False) as c:
                for sp in batches.values():
                    embnic_steps(c, cfg, sp)
            for rep in range(repeats):
                order = ("varlen", "fixed") if rep % 2 == 0 else ("fixed", "varlen")
                for mode in order:
                    timed(mode)
                if rep == repeats - 1:
                    card = _card_subset(tb)  # the loss-free runs' counters
                if loss_pct > 0:
                    backend = timed("varlen_loss", N.Impairment(loss=loss_pct))["backend"]
                    if backend == "user":  # the helpers forwarding every frame, dropping none
                        timed("varlen_relay", N.Impairment(loss=0.0, delay_ms=5.0), backend="user")
                log(f"  e2e {cfg.sharding}: repeat {rep + 1}/{repeats} done"
                    + (f" (with {loss_pct:g}% loss on every link, {backend} netem)" if loss_pct > 0 else ""))
            dlrm = None
            if dlrm_batches:
                with client(False) as c:
                    dlrm = e2e_dlrm.card_steps(c, cfg, dlrm_batches, repeats)
                log(f"  e2e {cfg.sharding}: DLRM training steps through the card done")
        finally:
            tb.down()
    return {**{m: {str(b): _summ(r) for b, r in v.items() if r} for m, v in runs.items()},
            "netem_backend": backend, "card": card, "dlrm": dlrm,
            "shard_engine": "batch (python -m embnic.testbed.server default)"}


def _card_subset(tb) -> dict:
    try:
        c = tb.target.counters()
    except Exception as e:  # noqa: BLE001 - the figures stand without it
        return {"error": str(e)}
    return {"types": c.get("types"), "completed": c.get("completed"),
            "drops": {k: v for k, v in (c.get("drops") or {}).items() if v}}


# ---------------------------------------------------------------------------- TorchRec
def _torchrec_rank(rank: int, world: int, rdv: str, cfg_path: str, batches: dict, repeats: int, q) -> None:
    """One rank of the TorchRec run (spawned): DMP table-wise on gloo, timed steps."""
    import torch
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method="file://" + rdv)
    try:
        cfg = load_config(cfg_path)
        confs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                    feature_names=[t.name]) for t in cfg.tables]
        ebc = EmbeddingBagCollection(tables=confs, device=torch.device("cpu"))
        dmp, types = table_wise_dmp(ebc, confs, world, fused_optimizer(cfg.tables))
        res = {"sharding_types": types}
        for b, sparses in batches.items():
            local = b // world
            kjts = []
            for sp in sparses:
                part = sp[rank * local:(rank + 1) * local]
                vals = part.T.reshape(-1).astype(np.int64)  # feature-major, one id per bag
                kjts.append(KeyedJaggedTensor(keys=NAMES, values=torch.from_numpy(vals),
                                              lengths=torch.ones(vals.size, dtype=torch.int32), stride=local))
            reps = []
            for _ in range(repeats):
                look, upd, step = [], [], []
                for i, kjt in enumerate(kjts):
                    dist.barrier()
                    t_a = time.perf_counter()
                    out = dmp(kjt).wait().values()
                    t_b = time.perf_counter()
                    out.sum().backward()
                    t_c = time.perf_counter()
                    if i:  # the first batch is the warm-up
                        look.append((t_b - t_a) * 1e6)
                        upd.append((t_c - t_b) * 1e6)
                        step.append((t_c - t_a) * 1e6)
                reps.append({"lookup_us": look, "update_us": upd, "step_us": step})  # no messages: _summ's 0
            res[str(b)] = reps
        if rank == 0:
            q.put(res)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_torchrec(config_text: str, batches: dict, repeats: int, world: int = 2) -> dict:
    """TorchRec's sharded EBC of the cluster config ``config_text`` (TOML) on ``world`` gloo ranks
    (processes); rank 0's timings summarised.

    Raises:
        ImportError: torch/torchrec/fbgemm_gpu missing (the ``embnic[torch]`` extra).
        OperationalError: a rank failed.
    """
    import torch.multiprocessing as mp

    import torchrec  # noqa: F401 - fail before spawning

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as d:
        cfg_path = Path(d) / "table.toml"
        cfg_path.write_text(config_text)
        procs = [ctx.Process(target=_torchrec_rank, args=(r, world, os.path.join(d, "rdv"), str(cfg_path),
                                                          batches, repeats, q)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(1800)
        bad = [p.exitcode for p in procs if p.exitcode != 0]
        if bad or q.empty():
            raise OperationalError(f"TorchRec ranks failed (exit codes {[p.exitcode for p in procs]})")
        res = q.get()
    return {"sharding_types": res.pop("sharding_types"), "world_size": world, "per_rank_batch": "batch / world",
            **{b: _summ(reps) for b, reps in res.items()}}


# ---------------------------------------------------------------------------- the planner beside it
def plan_rows(cfg, sample, batches, measured: dict) -> dict:
    """``embnic plan``'s estimate beside the measurement: per batch, the plan of ``cfg`` (the
    sharding the run used, one client) on the ``testbed`` hardware profile with the workload
    measured from ``sample`` at that batch, and the run's figures.

    Args:
        cfg: the cluster config the run used; sample: the :class:`~embnic.testbed.training.criteo.CriteoData`
            its batches come from; measured: ``{str(B): _summ(...)}`` of the varlen runs.

    Returns:
        ``{str(B): {plan_step_us, step_p50_us, plan_over_measured, plan_messages_per_step,
        messages_per_step, plan_request_frames_per_step, plan_request_bytes_per_step, binds}}``
        (batches not in ``measured`` are left out).
    """
    out = {}
    one = dataclasses.replace(cfg, clients=cfg.clients[:1])
    for b in batches:
        m = measured.get(str(b))
        if not m:
            continue
        w = P.measure_workload(one, sample.sparse, criteo.feature_tables(one, len(NAMES)), b)
        pl = P.plan(one, w, P.PROFILES["testbed"])
        ps = pl["per_step"]
        step = m["step_p50_us"]["median"]
        out[str(b)] = {"plan_step_us": pl["step_time_us"], "step_p50_us": step,
                       "plan_over_measured": pl["step_time_us"] / step if step else None,
                       "plan_messages_per_step": ps["request_messages"] + ps["reply_messages"],
                       "messages_per_step": m["messages_per_step"]["median"],
                       "plan_request_frames_per_step": ps["request_frames"],
                       "plan_request_bytes_per_step": ps["request_bytes"], "binds": pl["binds"]}
    return out


# ---------------------------------------------------------------------------- the run
def run(out_dir: Path, *, repeats: int = 3, steps: int = 10, batches=BATCHES, loss_pct: float = 1.0,
        hash_row: bool = True, dlrm: bool = True, name: str = "embe2e", log=print) -> dict:
    """Run the benchmark, write the PNGs and merge ``e2e`` into ``out_dir/bench.json``.

    Returns:
        the ``e2e`` object of bench.json (its keys: docs/bench.md).

    Raises:
        NeedsRoot: not root. TestbedError: the testbed did not come up. ImportError: no
        embnic[torch] (TorchRec). OperationalError: a TorchRec rank failed.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    m0 = machine()
    text = CONFIG.read_text()
    cfg = load_config(CONFIG)
    rows = [t.rows for t in cfg.tables]
    sample = criteo.load_criteo(criteo.sample_path("train"), rows=rows)
    data = {b: sample_batches(b, steps + 1, seed=b, rows=rows, data=sample) for b in batches}
    dlrm_data = dlrm_tr = None
    if dlrm:
        # the same samples as the embedding rows (same starts), with their dense features and labels
        dlrm_data = {b: e2e_dlrm.dlrm_batches(sample, sample_starts(len(sample), steps + 1, seed=b), b)
                     for b in batches}
        log("e2e: TorchRec's DLRM with its EmbeddingBagCollection in process (DMP, 1 rank, fused row-wise Adagrad)")
        dlrm_tr = e2e_dlrm.torchrec_steps(cfg, dlrm_data, repeats)
    table_text = text.replace('sharding = "hash"', 'sharding = "table"', 1)
    assert table_text != text, "examples/testbed.toml no longer says sharding = \"hash\""
    log("e2e: TorchRec (DMP, gloo, 2 ranks, table-wise)")
    t_tr = time.monotonic()
    tr = run_torchrec(table_text, data, repeats)
    t_tr = time.monotonic() - t_tr
    log("e2e: embnic through the card, sharding table")
    t_card = time.monotonic()
    card = run_card(table_text, name, data, repeats, loss_pct, log, dlrm_batches=dlrm_data)
    t_card = time.monotonic() - t_card
    hsh = None
    if hash_row:
        log("e2e: embnic through the card, sharding hash")
        hsh = run_card(text, name, data, repeats, 0.0, log)
    m1 = machine()
    rows_out = _embedding_rows(batches, card, tr)
    targets = _targets({r["batch"]: r for r in rows_out}, card, tr)
    loss = _loss_rows(batches, card)
    if loss:
        targets["no_retransmits_loss_free"] = {"met": all(v["retransmits_per_step"] == 0 for v in loss.values())}
        targets[f"step_with_{loss_pct:g}pct_loss_le_1.5x"] = {
            "ratio": max(v["ratio"] for v in loss.values()), "met": all(v["ratio"] <= 1.5 for v in loss.values())}
    dlrm_rows = e2e_dlrm.rows(card["dlrm"], dlrm_tr, batches) if dlrm else []
    for r in (r for r in dlrm_rows if r["batch"] == 4096):
        targets["dlrm_card_ge_0.8x_torchrec_steps_at_4096"] = {"ratio": r["card_over_torchrec"],
                                                               "met": r["card_over_torchrec"] >= 0.8}
    plan = _plan(cfg, sample, batches, card, hsh, rows_out)
    res = {
        "rows": rows_out + dlrm_rows,
        "plan": plan,
        "dlrm": None if not dlrm else {
            "card": {str(b): e2e_dlrm.summarise(card["dlrm"][b]) for b in batches},
            "torchrec": {str(b): e2e_dlrm.summarise(dlrm_tr[b]) for b in batches},
            "torchrec_sharding_types": dlrm_tr["sharding_types"], "dense_parameters": dlrm_tr["dense_parameters"],
            "step": "forward + BCE loss + backward (row updates: card round / fused fbgemm) + dense SGD step"},
        "detail": {"varlen": card["varlen"], "fixed": card["fixed"], "torchrec": tr},
        "hash": None if hsh is None else {"varlen": hsh["varlen"], "fixed": hsh["fixed"]},
        "loss": {"loss_pct_every_link": loss_pct, "netem_backend": card.get("netem_backend"), "by_batch": loss,
                 "how": "per repeat: varlen and fixed loss-free, then varlen with the loss (and, with the "
                        "user-space netem, varlen through its helpers with nothing dropped: step_p50_us_relay)"},
        "targets": targets,
        "card": card["card"],
        "shard_engine": card["shard_engine"],
        "machine": {"before": m0, "after": m1},
        "config": {"tables": len(cfg.tables), "rows": rows[0], "dim": cfg.tables[0].dim,
                   "optimizer": cfg.tables[0].optimizer, "shards": len(cfg.shards), "repeats": repeats,
                   "steps": steps, "batches": list(batches), "torchrec_world_size": 2,
                   "lookup_latency": "per step: wall time of the whole lookup (both rounds in fixed mode)"},
        "timing_s": {"torchrec": round(t_tr, 1), "card": round(t_card, 1)},
    }
    res["plots"] = plots(out_dir, res)
    merge_json(out_dir / "bench.json", "e2e", res)
    return res


def _embedding_rows(batches, card: dict, tr: dict) -> list[dict]:
    """One ``model: "embeddings"`` row per batch: the medians of lookup latency, messages and
    rounds of the card's variable- and fixed-length runs and of TorchRec's."""
    rows_out = []
    for b in batches:
        s = {"varlen": card["varlen"][str(b)], "fixed": card["fixed"][str(b)], "torchrec": tr[str(b)]}
        row = {"model": "embeddings", "batch": b,
               **{f"{m}_{q}_us": s[m][f"lookup_{q}_us"]["median"] for m in s for q in ("p50", "p99")}}
        for name, key in (("messages", "messages_per_step"), ("rounds", "rounds_per_step"),
                          ("request_messages_per_round", "request_messages_per_round")):
            row.update({f"{name}_{m}": s[m][key]["median"] for m in ("varlen", "fixed")})
        rows_out.append({**row, "shards_per_round": s["varlen"]["shards_per_round"]["median"]})
    return rows_out


def _targets(by_b: dict, card: dict, tr: dict) -> dict:
    """The latency targets of issue "the round at the speed of the path": variable-length lookup
    p50 <= 0.6 x fixed-length at batch 32, <= 0.8 x at 256; lookup p50 <= 1.0 x TorchRec's at
    4096, <= 1.5 x at 256; the step <= 2 x TorchRec's at 4096 (each where its batch ran)."""
    targets = {}
    for b, bound, peer in ((32, 0.6, "fixed"), (256, 0.8, "fixed"),
                           (256, 1.5, "torchrec"), (4096, 1.0, "torchrec")):
        if b in by_b:
            v, p = by_b[b]["varlen_p50_us"], by_b[b][f"{peer}_p50_us"]
            targets[f"varlen_p50_le_{bound:g}x_{peer}_at_{b}"] = {"ratio": v / p, "met": v <= bound * p}
    if 4096 in by_b:
        v = card["varlen"]["4096"]["step_p50_us"]["median"]
        t = tr["4096"]["step_p50_us"]["median"]
        targets["varlen_step_le_2x_torchrec_at_4096"] = {"ratio": v / t, "met": v <= 2 * t}
    return targets


def _loss_rows(batches, card: dict) -> dict:
    """Per batch run with loss: the variable-length step and lookup with the loss beside the
    loss-free ones, retransmits, timeouts, repairs and probes per step (and the step through the
    user-space helpers with nothing dropped, where it ran)."""
    loss = {}
    for k in (str(b) for b in batches if str(b) in card.get("varlen_loss", {})):
        a, l_ = ({key: v["median"] for key, v in card[m][k].items()} for m in ("varlen", "varlen_loss"))
        loss[k] = {"step_p50_us": a["step_p50_us"], "step_p50_us_loss": l_["step_p50_us"],
                   "ratio": l_["step_p50_us"] / a["step_p50_us"],
                   "lookup_p50_us": a["lookup_p50_us"], "lookup_p50_us_loss": l_["lookup_p50_us"],
                   "retransmits_per_step": a["retransmits_per_step"],
                   **{f"{x}_per_step_loss": l_[f"{x}_per_step"]
                      for x in ("retransmits", "timeouts", "repairs", "probes")},
                   "probes_per_step": a["probes_per_step"]}
        r_ = card.get("varlen_relay", {}).get(k)
        if r_:  # the user-space helpers on the path, nothing dropped
            loss[k]["step_p50_us_relay"] = r_["step_p50_us"]["median"]
            loss[k]["ratio_vs_relay"] = l_["step_p50_us"] / r_["step_p50_us"]["median"]
    return loss


def _plan(cfg, sample, batches, card: dict, hsh: dict | None, rows_out: list[dict]) -> dict:
    """``embnic plan``'s step time and messages beside the run's (:func:`plan_rows`); the
    embedding rows get ``plan_step_us`` and ``step_p50_us``."""
    tcfg = dataclasses.replace(cfg, sharding="table")
    plan = {"how": "embnic plan on the 'testbed' hardware profile, one client, table sharding, the workload "
                   "measured from the Criteo sample at each batch (docs/planning.md); step_p50_us: this run's "
                   "varlen step through the card",
            "by_batch": plan_rows(tcfg, sample, batches, card["varlen"]),
            # the hash-sharded run beside its own plan (the profile was fitted to table sharding)
            "hash_by_batch": plan_rows(cfg, sample, batches, hsh["varlen"]) if hsh is not None else {}}
    for r in rows_out:
        pb = plan["by_batch"].get(str(r["batch"]))
        if pb:
            r["plan_step_us"] = pb["plan_step_us"]
            r["step_p50_us"] = pb["step_p50_us"]
    return plan


def plots(out_dir: Path, res: dict) -> list[str]:
    """``e2e_lookup.png``, ``e2e_update.png``, ``e2e_steps.png``: per mode vs batch, medians with
    min-max bars. Returns the file names."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    det = res["detail"]
    bs = [r["batch"] for r in res["rows"] if r["model"] == "embeddings"]
    names = []
    for fig_name, key, ylabel in (("e2e_lookup.png", "lookup_p50_us", "lookup p50 per step (µs)"),
                                  ("e2e_update.png", "update_p50_us", "update p50 per step (µs)"),
                                  ("e2e_steps.png", "steps_per_s", "steps/s")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for mode, label in (("varlen", "embnic variable-length (card)"), ("fixed", "embnic fixed-length + size round (card)"),
                            ("torchrec", "TorchRec DMP table-wise (gloo, 2 ranks)")):
            s = [det[mode][str(b)][key] for b in bs]
            med = np.array([x["median"] for x in s])
            lo = med - np.array([x["min"] for x in s])
            hi = np.array([x["max"] for x in s]) - med
            ax.errorbar(bs, med, yerr=[lo, hi], marker="o", capsize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set(yscale="log", xlabel="batch size (samples, 26 features)", ylabel=ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / fig_name, dpi=110)
        plt.close(fig)
        names.append(fig_name)
    return names

