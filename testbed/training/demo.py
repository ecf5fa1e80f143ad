"""The main job (``make demo`` = ``embnic demo``): train on real Criteo data through the card.

Sequence (:func:`run_demo`):

1. **reference** — the same training run with the tables in this process
   (:class:`~embnic.client_lib.local.LocalBackend`): the losses the card run must reproduce.
2. **up** — the namespace testbed of the config (:mod:`embnic.testbed.net.topology`): a shard in
   each shard namespace, ``embnic-dp`` on ``net_af_packet`` vdevs in the card namespace, routes
   and clients programmed from the config, a probe through every path. Optional faults
   (:mod:`embnic.testbed.net.netem`) go on the links now.
3. **train** — the first client's :class:`~embnic.client_lib.client.EmbeddingClient` is
   created inside its namespace (:func:`~embnic.testbed.net.topology.in_netns`), so every lookup
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
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from embnic.client_lib.config import ClusterConfig, load_config
from embnic.control.errors import OperationalError

from . import report as R
from embnic.testbed.net import topology as T

LOSS_TOL = 1e-6
DEFAULT_OUT = "out/demo"
DEFAULT_NAME = "embdemo"
REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO / "examples" / "testbed.toml"


class DemoError(OperationalError):
    """The demo failed (the message says where; ``report`` holds what was measured, if anything; exit 1)."""

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
        kill_shard, kill_at_step: kill that shard's server after that step (fault injection;
            ``kill_at_step`` defaults to 1 and must be below ``steps``, see :func:`check_options`).
        restart: with ``kill_shard``: the shards keep a write-ahead log and checkpoints
            (``--checkpoint-dir``, every ``checkpoint_every`` updates) and the killed shard is
            started again at once with ``--restore``; the run must then complete with the
            losses and final tables of the run without the fault.
        checkpoint_every: logged updates between a shard's checkpoints (with ``restart``).
        check_tables: read every updated row back through the card and compare.
        all_clients: every other client of the config looks up the embeddings of its own
            batches of ``batch_size`` samples through the card while the first one trains
            (lookups only, so the training losses still match the reference run).
        progress: show progress bars (None: when stderr is a terminal).
        rdir: run directory (default ``$EMBNIC_RUN_DIR`` or /run/embnic).
        model: ``"fm"`` (the numpy factorisation machine) or ``"dlrm"`` (TorchRec's DLRM on
            :class:`~embnic.client_lib.torch.RemoteEmbeddingBagCollection`, needs embnic[torch]).
        target: the card: ``dpdk`` (embnic-dp) or ``bmv2`` (the P4 program on simple_switch).
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
    kill_at_step: int | None = None
    restart: bool = False
    checkpoint_every: int = 16
    check_tables: bool = True
    all_clients: bool = False
    progress: bool | None = None
    rdir: Path | None = None
    model: str = "fm"
    target: str = "dpdk"


class _Reader(threading.Thread):
    """Another client's load during training: lookups of its own batches, no updates."""

    def __init__(self, client, cfg: ClusterConfig, data, batch_size: int, offset: int):
        super().__init__(daemon=True, name=f"reader-{client.client_id}")
        self.client, self.cfg, self.data, self.batch_size, self.offset = client, cfg, data, batch_size, offset
        self.stop = threading.Event()
        self.rounds = 0
        self.error: str | None = None

    def run(self) -> None:
        from .train import embed_batch

        n = len(self.data.labels)
        try:
            while not self.stop.is_set():
                idx = (self.offset + self.rounds * self.batch_size + np.arange(self.batch_size)) % n
                embed_batch(self.client, self.cfg, self.data.sparse[idx])
                self.rounds += 1
        except Exception as e:  # noqa: BLE001 - reported, the training client decides the run
            self.error = f"{type(e).__name__}: {e}"

    def result(self) -> dict:
        s = self.client.stats
        return {"lookup_rounds": self.rounds, "messages": s.messages_sent + s.messages_received,
                "requests_sent": s.messages_sent, "frames_sent": s.frames_sent, "retransmits": s.retransmits,
                "error": self.error}


def _stop_readers(readers: list) -> None:
    for r in readers:
        r.stop.set()
    for r in readers:
        r.join(30)
        if not r.client.sock._closed:
            r.client.close()


def _snapshot(client) -> dict:
    s = client.stats
    return {"messages_sent": s.messages_sent, "messages_received": s.messages_received,
            "frames_sent": s.frames_sent, "frames_received": s.frames_received, "bytes_sent": s.bytes_sent,
            "bytes_received": s.bytes_received, "retransmits": s.retransmits, "rounds": s.rounds,
            "stale_replies": s.stale_replies, "latencies": len(s.lookup_latency_us),
            "drops": dict(client.drops)}


PROBE_TARGET = 2.0  #: target: lookup p50 at most this many times the probe RTT p50 of the same run
_PROBE_ID_BASE = 0xFFFE0000  #: msg ids of the between-step probes (the testbed's own probes use 0xFFFF....)


def probe_rtts(client, cfg: ClusterConfig, seq: int, timeout_s: float = 1.0, tries: int = 3,
               sent: dict | None = None) -> dict[int, float]:
    """One-key lookup round trips (µs) through the card to every shard, on the training client's
    own socket and path, between two steps (no request of the client is in flight then).

    The same probe as the testbed's readiness probe (:func:`~embnic.testbed.net.topology.probe_key`:
    a key each shard owns), so ``lookup p50 / probe p50`` compares a training lookup with the
    smallest message on the same path at the same moment of the run. A probe unanswered after
    ``tries`` × ``timeout_s`` is left out (the step's own retries report a dead path).

    Args:
        sent: counters ``sent`` (probe messages, retries included) and ``frames_sent`` to add to
            (the card counts these frames too).

    Returns:
        ``{shard_id: rtt_us}`` for the shards that answered.
    """
    import select

    from embnic.client_lib import codec as C

    out = {}
    for i, s in enumerate(cfg.shards):
        t0, key, _ = T.probe_key(cfg, s.id)
        msg_id = _PROBE_ID_BASE + ((seq * len(cfg.shards) + i) & 0xFFFF)
        frames = C.encode_lookup(msg_id=msg_id, client_id=client.client_id, table_id=t0.id, shard_id=s.id,
                                 dim=t0.dim, dtype=t0.wire_dtype, keys=key, mtu=cfg.mtu)
        dest = cfg.request_destination(client.client_id, s.id)
        for _ in range(tries):
            start = time.monotonic()
            for f in frames:
                client.sock.sendto(f, dest)
            if sent is not None:
                sent["frames_sent"] += len(frames)
                sent["sent"] += 1
            end = start + timeout_s
            got = None
            while got is None and time.monotonic() < end:
                r, _, _ = select.select([client.sock], [], [], max(0.0, end - time.monotonic()))
                if not r:
                    break
                try:
                    data = client.sock.recv(65536)
                except BlockingIOError:
                    continue
                if len(data) >= 40 and int.from_bytes(data[8:12], "big") == msg_id:
                    got = (time.monotonic() - start) * 1e6
            if got is not None:
                out[s.id] = got
                break
    return out


def reference_run(cfg: ClusterConfig, train_data, valid_data, steps: int, batch_size: int,
                  progress: bool | None = None, model: str = "fm"):
    """Train ``model`` with in-process tables. Returns (TrainResult, LocalBackend, seconds)."""
    from embnic.client_lib.local import LocalBackend

    from .train import trainer

    train = trainer(model)

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


class DemoUsageError(ValueError):
    """Options that contradict each other or the config (``param``: the CLI option to blame)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def check_options(opts: DemoOptions, cfg: ClusterConfig) -> int | None:
    """Check the fault options against each other and the config, before anything runs.

    Returns:
        the step after which ``kill_shard`` is killed (``kill_at_step``, default 1), or None.

    Raises:
        DemoUsageError: ``kill_shard`` not a shard of ``cfg``; ``kill_at_step`` without
            ``kill_shard``; ``kill_at_step`` not in ``1..steps-1`` (a kill after the last step
            would hit nothing).
    """
    if opts.steps < 1:
        raise DemoUsageError(f"--steps must be at least 1, got {opts.steps}", "--steps")
    if opts.kill_shard is None:
        if opts.restart:
            raise DemoUsageError("--restart needs --kill-shard ID (the shard to kill and restart)", "--restart")
        if opts.kill_at_step is not None:
            raise DemoUsageError("--kill-at-step needs --kill-shard ID (the shard to kill)", "--kill-at-step")
        return None
    ids = [sh.id for sh in cfg.shards]
    if opts.kill_shard not in ids:
        raise DemoUsageError(f"no shard {opts.kill_shard} in {cfg.path or 'the config'} (shards: "
                             f"{', '.join(map(str, ids))})", "--kill-shard")
    at = 1 if opts.kill_at_step is None else opts.kill_at_step
    if not 1 <= at < opts.steps:
        raise DemoUsageError(f"--kill-at-step {at} must be between 1 and --steps - 1 = {opts.steps - 1}: the shard "
                             "is killed after that step and a later step must run into it", "--kill-at-step")
    return at


def _try(f, default=None):
    """``f()``, or ``default`` if it raises (the card may be dead when a failure is reported)."""
    try:
        return f()
    except Exception:  # noqa: BLE001
        return default


def run_demo(opts: DemoOptions, log: Callable[[str], None] = print) -> dict:
    """Run the main job (see the module docstring) and write its report.

    Report fields (``OUT/report.json``): ``target`` (``"dpdk"``), ``model`` (``"fm"``/``"dlrm"``), ``testbed``, ``config``,
    ``other_clients`` (with ``all_clients``: per client id ``lookup_rounds``, ``messages``,
    ``requests_sent``, ``frames_sent``, ``retransmits``, ``error``; they stop at the last
    training step, before the card's counters are read),
    ``steps``, ``steps_completed``, ``batch_size``, ``loss`` (per completed step, through the
    card), ``loss_reference``, ``loss_max_abs_diff`` (over the completed steps), ``loss_match``
    (≤ 1e-6), ``auc``, ``auc_reference``, ``messages`` (requests sent + replies received by the
    client during the training steps), ``messages_detail``, ``frames`` (frames sent + received),
    ``frames_detail``, ``rounds_per_step``, ``dedup_ratio`` (unique ids / ids),
    ``dedup_savings`` (1 − ratio), ``lookup_latency_us`` (``p50``, ``p90``, ``p99``, ``max``,
    ``mean``, ``n``), ``probe_rtt_us`` (the same percentiles of one-key lookups to every shard
    on the training client's path, one per shard after every step: :func:`probe_rtts`),
    ``probes`` (probe messages and frames sent: the card counts them too),
    ``lookup_p50_over_probe_p50`` and ``latency_target`` (target ≤ 2, measured, met),
    ``card_drops`` (every reason), ``card`` (``frames_by_type``: frames the
    card forwarded per message type; ports, ring, state map; ``messages_completed``: messages
    whose whole reply passed the card, by reply type; ``latency_by_shard``: the card's per-shard
    completions, expiries and request->reply latency histogram; ``messages_in_state_map``:
    messages — not frames — still in flight in the card's state map at the end of training,
    ``entries`` and by state ``receiving``/``forwarded``/``replying``: an answered message
    leaves it when its reply has passed, so after a clean run it is empty),
    ``tables`` (rows read back, max |Δ|, equal), ``netem``, ``kill_shard``, ``kill_at_step``,
    ``error`` (None, or what failed: ``message``, ``phase``, ``failed_at_step``,
    ``failing_shard``, ``dead_nodes``), ``timing``, ``plots``.

    A failure during training (a shard or the card dead) still writes the report of what ran
    (losses so far, messages, latencies, plots) before :class:`DemoError` is raised.

    Raises:
        NeedsRoot: not root.
        DemoUsageError: contradictory fault options (:func:`check_options`).
        TestbedError: the testbed did not come up (names the log).
        DemoError: training failed (a shard or the card died: the message names the dead node
            and its log), or the losses or tables do not match (the report is written first).
    """
    from embnic.client_lib.client import EmbeddingClient, EmbnicError

    from embnic.testbed.net import netem as N
    from .train import load_training_data, trainer

    train = trainer(opts.model)  # ImportError (one line: what to install) before anything runs
    T.require_net_admin("the demo (it brings the namespace testbed up)")
    user_cfg = load_config(opts.config)
    kill_at = check_options(opts, user_cfg)
    topo = T.Topology.from_config(user_cfg, opts.name)  # validate before the slow parts
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    tr, va = load_training_data(user_cfg, opts.data)
    log(f"data: {len(tr.labels)} training rows, {len(va.labels)} held out for the AUC "
        f"({opts.data or 'shipped Criteo sample'}); {len(user_cfg.tables)} tables, {len(user_cfg.shards)} shards")

    ref, local, t_ref = reference_run(user_cfg, tr, va, opts.steps, opts.batch_size, opts.progress, opts.model)
    log(f"reference run (in-process tables): final loss {ref.loss[-1]:.6f}, AUC {ref.auc:.4f}, {t_ref:.1f} s")

    tb = T.Testbed(topo, opts.rdir, target=opts.target)
    timing = {"reference_s": round(t_ref, 2)}
    t_up = time.monotonic()
    ckdir = None
    server_argv = None
    if opts.restart:
        ckdir = tb.dir / "shard-state"

        def server_argv(sid, config_path, ip):
            return [sys.executable, "-m", "embnic.testbed.server", "--shard", str(sid), "--config", config_path,
                    "--bind", ip, "--checkpoint-dir", str(ckdir), "--checkpoint-every", str(opts.checkpoint_every)]
    tb.up(owner="demo", server_argv=server_argv)
    timing["up_s"] = round(time.monotonic() - t_up, 2)
    losses: list[float] = []
    probes: list[float] = []
    probe_sent = {"sent": 0, "frames_sent": 0}
    snap: dict = {}
    card_at_end: dict = {}
    state_at_end: dict | None = None
    card_final: dict | None = None
    res = tables = netem_rec = failure = client = None
    readers: list[_Reader] = []
    try:
        cfg = tb.cfg
        cid = cfg.clients[0].id
        log(f"testbed {opts.name} up in {timing['up_s']:.1f} s: probe RTT "
            + ", ".join(f"{k} {v:.0f} µs" for k, v in tb.state.get("probe_rtt_us", {}).items()))
        if opts.impairment is not None and not opts.impairment.clear:
            netem_rec = N.apply(opts.name, opts.impairment, backend=opts.netem_backend, rdir=tb.rdir)
            imp = opts.impairment
            log(f"faults on every link ({netem_rec['backend']} netem): loss {imp.loss:g}% reorder "
                f"{imp.reorder:g}% duplicate {imp.duplicate:g}%")
        tb.target.reset_counters()
        with T.in_netns(topo.client_ns(cid)):
            client = EmbeddingClient(cfg, cid)
        if opts.all_clients:
            for k, c in enumerate(cfg.clients[1:], 1):
                with T.in_netns(topo.client_ns(c.id)):
                    readers.append(_Reader(EmbeddingClient(cfg, c.id), cfg, tr, opts.batch_size,
                                           k * len(tr.labels) // len(cfg.clients)))
            for r in readers:
                r.start()
            log(f"clients {', '.join(str(r.client.client_id) for r in readers)} look up their own batches "
                f"through the card while client {cid} trains")
        t0 = time.monotonic()
        with client, R.Progress(opts.steps, f"train through the card (client {cid})", enabled=opts.progress) as bar:
            def progress(i: int, loss: float) -> None:
                nonlocal state_at_end
                losses.append(float(loss))
                s = client.stats
                el = max(time.monotonic() - t0, 1e-9)
                bar.update(1, loss=f"{loss:.4f}", msg_s=f"{(s.messages_sent + s.messages_received) / el:.0f}")
                if kill_at is None or i + 1 < kill_at:  # the probe RTT of this moment of the run
                    for sid, rtt in probe_rtts(client, cfg, i, sent=probe_sent).items():
                        probes.append(rtt)
                if kill_at is not None and i + 1 == kill_at:
                    log(f"fault: killing shard {opts.kill_shard}'s server after step {i + 1}")
                    tb.kill_server(opts.kill_shard)
                    if opts.restart:
                        rec = tb.restart_server(opts.kill_shard, ["--restore", str(ckdir)])
                        log(f"fault: shard {opts.kill_shard}'s server restarted from {ckdir} (pid {rec['pid']})")
                if i + 1 == opts.steps:
                    _stop_readers(readers)  # their last round completes: the card's counters are whole
                    snap.update(_snapshot(client), elapsed=el)
                    card_at_end.update(tb.target.counters())
                    state_at_end = _try(tb.target.state_summary)

            phase = "training"
            try:
                res = train(cfg, tr, steps=opts.steps, batch_size=opts.batch_size, backend=client,
                            eval_data=va, progress=progress)
                timing["train_s"] = round(time.monotonic() - t0, 2)
                _stop_readers(readers)
                if opts.check_tables:
                    phase = "table read-back"
                    tables = compare_tables(client, local)
            except EmbnicError as e:
                if phase == "training" and len(losses) == opts.steps:
                    phase = "evaluation"
                failure = _failure(e, phase, tb, client, losses, opts, kill_at)
                if not snap:
                    snap.update(_snapshot(client), elapsed=max(time.monotonic() - t0, 1e-9))
                    if not failure["card_dead"]:
                        card_at_end.update(_try(tb.target.counters, {}))
                        state_at_end = _try(tb.target.state_summary)
        if netem_rec is not None:
            netem_rec = N.show(opts.name, rdir=tb.rdir)
        if failure is None or not failure["card_dead"]:
            card_final = _try(tb.target.counters)
    finally:
        _stop_readers(readers)
        t_down = time.monotonic()
        tb.down()
        timing["down_s"] = round(time.monotonic() - t_down, 2)

    rep = _report(opts, cid, ref, res, losses, snap, card_at_end, state_at_end, card_final, tables, netem_rec,
                  timing, client.stats.lookup_latency_us[:snap["latencies"]], kill_at, failure, out,
                  {str(r.client.client_id): r.result() for r in readers}, probes, probe_sent)
    if failure is not None:
        for line in failure_summary(rep):
            log(line)
        raise DemoError(f"{failure['message']} (report of what ran: {out / 'report.json'})", rep)
    for line in summary(rep):
        log(line)
    problems = []
    if not rep["loss_match"]:
        problems.append(f"losses differ from the in-process run by up to {rep['loss_max_abs_diff']:.3g} "
                        f"(> {LOSS_TOL:g})")
    if tables is not None and not tables["equal"]:
        problems.append(f"final tables differ from the in-process run (max |Δ| {tables['max_abs_diff']:.3g})")
    if problems:
        raise DemoError("; ".join(problems) + f" (report: {out / 'report.json'})", rep)
    return rep


def _failure(e: Exception, phase: str, tb: "T.Testbed", client, losses: list, opts: DemoOptions,
             kill_at: int | None) -> dict:
    """What failed, checked while the testbed still runs: the client's error plus which of the
    card and the servers are dead (the client alone cannot tell a dead card from a dead shard)."""
    dead = tb.dead_nodes()
    done = len(losses)
    where = (f"after {done} of {opts.steps} steps" if phase == "training" else
             f"in the {phase} after all {opts.steps} steps")
    msg = f"{phase} through the card failed {where}: {e}"
    if dead:
        msg += f" ({T.describe_dead(dead)}"
        if kill_at is not None and any(d["node"] == f"s{opts.kill_shard}" for d in dead):
            msg += f"; shard {opts.kill_shard} was killed on purpose by --kill-shard after step {kill_at}"
        msg += ")"
    else:
        msg += f" (the card and every shard still run; see the logs in {tb.dir})"
    return {"message": msg, "client_error": str(e), "phase": phase, "steps_completed": done,
            "failed_at_step": done + 1 if phase == "training" else None,
            "failing_shard": getattr(e, "shard_id", None), "dead_nodes": dead,
            "card_dead": any(d["role"] == "card" for d in dead)}


def _report(opts: DemoOptions, cid: int, ref, res, losses: list, snap: dict, card_at_end: dict,
            state_at_end: dict | None, card_final: dict | None, tables: dict | None, netem_rec: dict | None,
            timing: dict, lat: list, kill_at: int | None, failure: dict | None, out: Path,
            others: dict | None = None, probes: list | None = None, probe_sent: dict | None = None) -> dict:
    """The report dict (fields in :func:`run_demo`), written to ``out/report.json`` with its plots."""
    done = len(losses)
    steps = opts.steps
    ref_part = np.asarray(ref.loss[:done], np.float64)
    loss_diff = float(np.max(np.abs(np.asarray(losses, np.float64) - ref_part))) if done else None
    el = snap["elapsed"]
    msgs = snap["messages_sent"] + snap["messages_received"]
    frames = snap["frames_sent"] + snap["frames_received"]
    state_sum = state_at_end or {}
    rep = {
        "target": opts.target,
        "model": opts.model,
        "testbed": opts.name,
        "config": str(Path(opts.config).resolve()),
        "data": str(opts.data or "shipped Criteo sample (testbed/training/data)"),
        "client": cid,
        "other_clients": others or {},
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
                            "per_step": round(msgs / max(done, 1), 2), "per_s": round(msgs / el, 1)},
        "frames": frames,
        "frames_detail": {"sent": snap["frames_sent"], "received": snap["frames_received"],
                          "bytes_sent": snap["bytes_sent"], "bytes_received": snap["bytes_received"],
                          "per_s": round(frames / el, 1)},
        "rounds_per_step": snap["rounds"] / max(done, 1),
        "dedup_ratio": res.dedup_ratio if res is not None else None,
        "dedup_savings": 1.0 - res.dedup_ratio if res is not None else None,
        "ids": res.ids if res is not None else None,
        "unique_ids": res.unique_ids if res is not None else None,
        "lookup_latency_us": R.percentiles(lat),
        "probe_rtt_us": R.percentiles(probes or []),
        "probes": dict(probe_sent or {}),
        "lookup_p50_over_probe_p50": _ratio_p50(lat, probes),
        "latency_target": {"target": PROBE_TARGET, "measured": _ratio_p50(lat, probes),
                           "met": (_ratio_p50(lat, probes) or float("inf")) <= PROBE_TARGET},
        "card_drops": card_at_end.get("drops", {}),
        "card": {"frames_by_type": card_at_end.get("types"), "ports": card_at_end.get("ports"),
                 "ring": card_at_end.get("ring"), "mempool": card_at_end.get("mempool"),
                 "state": card_at_end.get("state"),
                 "messages_completed": card_at_end.get("completed"),
                 "latency_by_shard": card_at_end.get("shards"),
                 "messages_in_state_map": ({"entries": state_sum.get("entries"), **(state_sum.get("by_state") or {})}
                                           if state_sum else None),
                 "drops_incl_eval_and_readback": (card_final or {}).get("drops", {})},
        "client_drops": snap["drops"],
        "tables": tables,
        "netem": netem_rec,
        "kill_shard": opts.kill_shard,
        "kill_at_step": kill_at,
        "restart": bool(opts.restart),
        "timing": {**timing, "train_steps_s": round(el, 2), "steps_per_s": round(done / el, 2)},
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


def _ratio_p50(lat, probes) -> float | None:
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
        ("lookup latency", f"p50 {lat['p50']} µs, p99 {lat['p99']} µs (n={lat['n']})"),
        ("report", f"{Path(rep['plots']['loss']).parent / 'report.json'}, loss.png, latency_cdf.png"),
    ]
    return ["demo summary (FAILED):"] + R.table_lines(rows)


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
        ("probe RTT", f"p50 {rep['probe_rtt_us']['p50']} µs, p99 {rep['probe_rtt_us']['p99']} µs "
                      f"(n={rep['probe_rtt_us']['n']}, one-key lookups between steps): lookup p50 = "
                      f"{rep['lookup_p50_over_probe_p50']} × probe p50 (target ≤ {PROBE_TARGET:g})"),
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
