"""The main job (``make demo`` = ``embnic demo``): train on real Criteo data through the card.

The sequence and the report's fields: docs/testbed.md. This module runs the sequence and what
it measures beside the training loop (the reference run, the probes between steps, the other
clients' load, the counters at the end of training, the tables read back), and writes the
report (``OUT/report.json`` with its plots: :func:`build_report`) and the summaries it prints.
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
from embnic.testbed.net import topology as T

from . import report as R

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "testbed.toml"
LOSS_TOL = 1e-6  #: largest |Δ| of a step's loss through the card vs the in-process run
PROBE_TARGET = 2.0  #: target: lookup p50 at most this many times the probe RTT p50 of the same run


@dataclasses.dataclass
class DemoOptions:
    """Options of :func:`~embnic.testbed.training.demo.run_demo`.

    Attributes:
        config: cluster config with an enabled ``[card]`` (default examples/testbed.toml).
        steps, batch_size: training steps and samples per step.
        out: output directory (report.json, PNGs).
        name: testbed name (prefix of namespaces and interfaces).
        data: Criteo TSV (default: the shipped sample).
        impairment: netem faults on every link during training (None: none).
        netem_backend: ``auto``, ``tc``, ``bpf`` or ``user``.
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
        pmd: the dpdk card's PMD on its veth ends: ``af_packet`` or ``af_xdp``
            (:func:`~embnic.testbed.net.wiring.card_vdev`; ``af_xdp`` needs ``target`` dpdk).
    """

    config: str | os.PathLike = DEFAULT_CONFIG
    steps: int = 40
    batch_size: int = 256
    out: str | os.PathLike = "out/demo"
    name: str = "embdemo"
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
    pmd: str = "af_packet"


class DemoError(OperationalError):
    """The demo failed (the message says where; ``report`` holds what was measured, if anything; exit 1)."""

    def __init__(self, message: str, report: dict | None = None):
        super().__init__(message)
        self.report = report


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
        DemoUsageError: faults through the ``tc`` or ``bpf`` netem backend on a card on ``net_af_xdp``
            (:func:`~embnic.testbed.net.netem.pmd_backend_problem`); ``kill_shard`` not a shard of ``cfg``; ``kill_at_step`` without
            ``kill_shard``; ``kill_at_step`` not in ``1..steps-1`` (a kill after the last step
            would hit nothing).
    """
    if opts.steps < 1:
        raise DemoUsageError(f"--steps must be at least 1, got {opts.steps}", "--steps")
    if opts.pmd == "af_xdp" and opts.netem_backend in ("tc", "bpf") and opts.impairment is not None \
            and not opts.impairment.clear:
        from embnic.testbed.net.netem import pmd_backend_problem

        raise DemoUsageError(pmd_backend_problem(opts.name, opts.netem_backend).replace("--backend", "--netem-backend"),
                             "--netem-backend")
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


# --------------------------------------------------------------------------- what the demo measures
class Reader(threading.Thread):
    """Another client's load during training: lookups of its own batches, no updates.

    ``offset``: its first sample (row of ``data``); batch ``k`` is rows ``offset + k*batch_size ...`` modulo
    the rows. ``result()`` gives its rounds, messages, frames, retransmits and error (None if none).
    """

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
        """What this reader did (see the class docstring)."""
        s = self.client.stats
        return {"lookup_rounds": self.rounds, "messages": s.messages_sent + s.messages_received,
                "requests_sent": s.messages_sent, "frames_sent": s.frames_sent, "retransmits": s.retransmits,
                "tail_probes": s.probes, "error": self.error}


def stop_readers(readers: list) -> None:
    """Stop every :class:`Reader` (its current round completes), join it (≤ 30 s) and close its client."""
    for r in readers:
        r.stop.set()
    for r in readers:
        r.join(30)
        if r.client.sock.fileno() != -1:  # not closed yet
            r.client.close()


_SNAPSHOT = ("messages_sent", "messages_received", "frames_sent", "frames_received", "bytes_sent", "bytes_received",
             "retransmits", "rounds", "data_rounds", "round_messages", "round_shards", "stale_replies")


def client_snapshot(client) -> dict:
    """The counters of an :class:`~embnic.client_lib.client.EmbeddingClient` now (message, frame and byte
    counts, retransmits, tail probes (one-key lookups after a round's last message, not among the
    messages), rounds (and of the lookup/update rounds: their request messages and the shards they
    touched), stale replies, the number of lookup latencies so far, drops by reason)."""
    s = client.stats
    return {**{k: getattr(s, k) for k in _SNAPSHOT}, "tail_probes": s.probes,
            "latencies": len(s.lookup_latency_us), "drops": dict(client.drops)}


_PROBE_ID_BASE = 0xFFFE0000  #: msg ids of the between-step probes (the testbed's own probes use 0xFFFF....)


def probe_rtts(client, cfg: ClusterConfig, seq: int, sent: dict) -> dict[int, float]:
    """One-key lookup round trips (µs) through the card to every shard, on the training client's
    own socket and path, between two steps (no request of the client is in flight then).

    The same probe as the testbed's readiness probe (:func:`~embnic.testbed.net.topology.ask`:
    a key each shard owns), so ``lookup p50 / probe p50`` compares a training lookup with the
    smallest message on the same path at the same moment of the run. A probe unanswered after
    3 tries × 1 s is left out (the step's own retries report a dead path).

    Args:
        sent: counters ``sent`` (probe messages, retries included) and ``frames_sent`` to add to
            (the card counts these frames too).

    Returns:
        ``{shard_id: rtt_us}`` for the shards that answered.
    """
    out = {}
    for i, s in enumerate(cfg.shards):
        msg_id = _PROBE_ID_BASE + ((seq * len(cfg.shards) + i) & 0xFFFF)
        got, _, sends = T.ask(client.sock, cfg, client.client_id, s.id, msg_id, 3.0, 1.0)
        sent["frames_sent"] += sends  # a one-key lookup is one frame
        sent["sent"] += sends
        if got is not None:
            out[s.id] = got * 1e6
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
    ref = local.lookup(state) if state else {}
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


# --------------------------------------------------------------------------- the run
def _try(f, default=None):
    """``f()``, or ``default`` if it raises (the card may be dead when a failure is reported)."""
    try:
        return f()
    except Exception:  # noqa: BLE001
        return default


def run_demo(opts: DemoOptions, log: Callable[[str], None] = print) -> dict:
    """Run the main job and write its ``OUT/report.json`` (the sequence and the fields: docs/testbed.md).

    A failure during training (a shard or the card dead) still writes the report of what ran
    (losses so far, messages, latencies, plots) before :class:`DemoError` is raised.

    Raises:
        NeedsRoot: not root.
        DemoUsageError: contradictory fault options (:func:`check_options`), or ``--name`` is a testbed
            that is up (:meth:`Testbed.check_free`), before any work.
        TestbedError: the testbed did not come up (names the log).
        DemoError: training failed (a shard or the card died: the message names the dead node
            and its log), or the losses or tables do not match (the report is written first).
    """
    from .train import load_training_data

    train, user_cfg, kill_at, topo, tb = _prepare(opts)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    tr, va = load_training_data(user_cfg, opts.data)
    log(f"data: {len(tr.labels)} training rows, {len(va.labels)} held out for the AUC "
        f"({opts.data or 'shipped Criteo sample'}); {len(user_cfg.tables)} tables, {len(user_cfg.shards)} shards")

    ref, local, t_ref = reference_run(user_cfg, tr, va, opts.steps, opts.batch_size, opts.progress, opts.model)
    log(f"reference run (in-process tables): final loss {ref.loss[-1]:.6f}, AUC {ref.auc:.4f}, {t_ref:.1f} s")

    run = _CardRun(opts, tb, topo, kill_at, log)
    run.timing["reference_s"] = round(t_ref, 2)
    run.run(train, tr, va, local)
    rep = build_report(run, ref, out)
    _conclude(rep, run.failure, run.tables, out, log)
    return rep


def _prepare(opts: DemoOptions) -> tuple:
    """What is checked before any slow work: (the model's training loop, the user's config, the
    step after which a shard is killed (None), the topology, the testbed (not up)).

    Raises:
        as :func:`run_demo` (ImportError: the model's packages missing, in one line).
    """
    from .train import trainer

    train = trainer(opts.model)  # ImportError (one line: what to install) before anything runs
    T.require_net_admin("the demo (it brings the namespace testbed up)")
    user_cfg = load_config(opts.config)
    kill_at = check_options(opts, user_cfg)
    try:  # validate before the slow parts
        topo = T.Topology.from_config(user_cfg, opts.name, pmd=opts.pmd)
        tb = T.Testbed(topo, opts.rdir, target=opts.target)
    except T.PmdError as e:
        raise DemoUsageError(str(e), e.option) from None
    try:  # a busy --name is refused now, not after the reference run
        tb.check_free(owner="demo")
    except T.TestbedError as e:
        raise DemoUsageError(str(e), "--name") from None
    return train, user_cfg, kill_at, topo, tb


def _conclude(rep: dict, failure: dict | None, tables: dict | None, out: Path, log: Callable[[str], None]) -> None:
    """Log the summary of the report.

    Raises:
        DemoError: training failed, or the losses or tables differ from the in-process run.
    """
    for line in (summary if failure is None else failure_summary)(rep):
        log(line)
    if failure is not None:
        raise DemoError(f"{failure['message']} (report of what ran: {out / 'report.json'})", rep)
    problems = []
    if not rep["loss_match"]:
        problems.append(f"losses differ from the in-process run by up to {rep['loss_max_abs_diff']:.3g} "
                        f"(> {LOSS_TOL:g})")
    if tables is not None and not tables["equal"]:
        problems.append(f"final tables differ from the in-process run (max |Δ| {tables['max_abs_diff']:.3g})")
    if problems:
        raise DemoError("; ".join(problems) + f" (report: {out / 'report.json'})", rep)


class _CardRun:
    """Training through the card on the testbed, and what it leaves for the report: the losses,
    probe RTTs, the client's and the card's counters at the last step, the card's final counters,
    the training result, the tables read back, the impairment's record, the failure (None), the
    other clients' readers, the timing."""

    def __init__(self, opts: DemoOptions, tb: "T.Testbed", topo: "T.Topology", kill_at: int | None,
                 log: Callable[[str], None]):
        self.opts, self.tb, self.topo, self.kill_at, self.log = opts, tb, topo, kill_at, log
        self.timing, self.snap, self.card_at_end = {}, {}, {}
        self.losses, self.probes, self.readers = [], [], []  # floats, floats, Reader
        self.probe_sent = {"sent": 0, "frames_sent": 0}
        self.res = self.tables = self.netem_rec = self.failure = self.client = self.cid = None
        self.state_at_end = self.card_final = None  # dict
        self.ckdir = tb.dir / "shard-state" if opts.restart else None
        self.t0 = 0.0

    def _server_argv(self, sid, config_path, ip) -> list[str]:
        """A shard's command line with its checkpoints in :attr:`ckdir` (``--restart``)."""
        return [sys.executable, "-m", "embnic.testbed.server", "--shard", str(sid), "--config", config_path,
                "--bind", ip, "--checkpoint-dir", str(self.ckdir), "--checkpoint-every",
                str(self.opts.checkpoint_every)]

    def run(self, train, tr, va, local) -> None:
        """Bring the testbed up, train through the card (with the other clients' lookups, the
        faults asked for), read the counters, bring it down."""
        t_up = time.monotonic()
        self.tb.up(owner="demo", server_argv=self._server_argv if self.opts.restart else None)
        self.timing["up_s"] = round(time.monotonic() - t_up, 2)
        try:
            self._start(tr)
            self._train(train, tr, va, local)
            self._end_faults()
            if self.failure is None or not self.failure["card_dead"]:
                self.card_final = _try(self.tb.target.counters)
        finally:
            stop_readers(self.readers)
            t_down = time.monotonic()
            self.tb.down()
            self.timing["down_s"] = round(time.monotonic() - t_down, 2)

    def _start(self, tr) -> None:
        """The impairment on every link, the card's counters zeroed, the training client and the
        other clients' readers (``--all-clients``) started."""
        from embnic.client_lib.client import EmbeddingClient
        from embnic.testbed.net import netem as N

        opts, tb, cfg = self.opts, self.tb, self.tb.cfg
        self.cid = cid = cfg.clients[0].id
        self.log(f"testbed {opts.name} up in {self.timing['up_s']:.1f} s: probe RTT "
                 + ", ".join(f"{k} {v:.0f} µs" for k, v in tb.state.get("probe_rtt_us", {}).items()))
        if opts.impairment is not None and not opts.impairment.clear:
            self.netem_rec = N.apply(opts.name, opts.impairment, backend=opts.netem_backend, rdir=tb.rdir)
            imp = opts.impairment
            self.log(f"faults on every link ({self.netem_rec['backend']} netem): loss {imp.loss:g}% reorder "
                     f"{imp.reorder:g}% duplicate {imp.duplicate:g}%")
        tb.target.reset_counters()
        with T.in_netns(self.topo.client_ns(cid)):
            self.client = EmbeddingClient(cfg, cid)
        if opts.all_clients:
            for k, c in enumerate(cfg.clients[1:], 1):
                with T.in_netns(self.topo.client_ns(c.id)):
                    self.readers.append(Reader(EmbeddingClient(cfg, c.id), cfg, tr, opts.batch_size,
                                               k * len(tr.labels) // len(cfg.clients)))
            for r in self.readers:
                r.start()
            self.log(f"clients {', '.join(str(r.client.client_id) for r in self.readers)} look up their own "
                     f"batches through the card while client {cid} trains")

    def _progress(self, bar, i: int, loss: float) -> None:
        """After step ``i``: its loss, a probe RTT per shard, the shard killed (and restarted) at
        ``--kill-at-step``, the counters at the last step."""
        opts, kill_at = self.opts, self.kill_at
        self.losses.append(float(loss))
        s = self.client.stats
        el = max(time.monotonic() - self.t0, 1e-9)
        bar.update(1, loss=f"{loss:.4f}", msg_s=f"{(s.messages_sent + s.messages_received) / el:.0f}")
        if kill_at is None or i + 1 < kill_at:  # the probe RTT of this moment of the run
            self.probes.extend(probe_rtts(self.client, self.tb.cfg, i, self.probe_sent).values())
        if kill_at is not None and i + 1 == kill_at:
            self.log(f"fault: killing shard {opts.kill_shard}'s server after step {i + 1}")
            self.tb.kill_server(opts.kill_shard)
            if opts.restart:
                rec = self.tb.restart_server(opts.kill_shard, ["--restore", str(self.ckdir)])
                self.log(f"fault: shard {opts.kill_shard}'s server restarted from {self.ckdir} (pid {rec['pid']})")
        if i + 1 == opts.steps:
            stop_readers(self.readers)  # their last round completes: the card's counters are whole
            self.snap.update(client_snapshot(self.client), elapsed=el)
            self.card_at_end.update(self.tb.target.counters())
            self.state_at_end = _try(self.tb.target.state_summary)

    def _train(self, train, tr, va, local) -> None:
        """The training steps through the card, then the tables read back (``--check-tables``);
        a client error becomes :attr:`failure`, the counters read while the testbed still runs."""
        from embnic.client_lib.client import EmbnicError

        opts, client = self.opts, self.client
        self.t0 = time.monotonic()
        with client, R.Progress(opts.steps, f"train through the card (client {self.cid})",
                                enabled=opts.progress) as bar:
            phase = "training"
            try:
                self.res = train(self.tb.cfg, tr, steps=opts.steps, batch_size=opts.batch_size, backend=client,
                                 eval_data=va, progress=lambda i, loss: self._progress(bar, i, loss))
                self.timing["train_s"] = round(time.monotonic() - self.t0, 2)
                stop_readers(self.readers)
                if opts.check_tables:
                    phase = "table read-back"
                    self.tables = compare_tables(client, local)
            except EmbnicError as e:
                if phase == "training" and len(self.losses) == opts.steps:
                    phase = "evaluation"
                self.failure = _failure(e, phase, self.tb, self.losses, opts, self.kill_at)
                if not self.snap:
                    self.snap.update(client_snapshot(client), elapsed=max(time.monotonic() - self.t0, 1e-9))
                    if not self.failure["card_dead"]:
                        self.card_at_end.update(_try(self.tb.target.counters, {}))
                        self.state_at_end = _try(self.tb.target.state_summary)

    def _end_faults(self) -> None:
        """The run is over: take the impairment off, so the user-space helpers' counters are their
        final ones (a live read sees the last 0.5 s dump, which a short fast run may predate)."""
        from embnic.testbed.net import netem as N

        if self.netem_rec is None:
            return
        name, rdir = self.opts.name, self.tb.rdir
        self.netem_rec = N.show(name, rdir=rdir)
        cleared = _try(lambda: N.clear(name, rdir=rdir))
        if self.netem_rec is not None and cleared and cleared.get("helpers"):
            self.netem_rec["counters"] = {**(self.netem_rec.get("counters") or {}),
                                          **{k: v for k, v in cleared["helpers"].items() if v is not None}}


def _failure(e: Exception, phase: str, tb: "T.Testbed", losses: list, opts: DemoOptions,
             kill_at: int | None) -> dict:
    """What failed, checked while the testbed still runs: the client's error plus which of the
    card and the servers are dead (the client alone cannot tell a dead card from a dead shard)."""
    dead = tb.dead_nodes()
    done = len(losses)
    where = (f"after {done} of {opts.steps} steps" if phase == "training" else
             f"in the {phase} after all {opts.steps} steps")
    why = tb.why_no_answer(dead)
    if kill_at is not None and any(d["node"] == f"s{opts.kill_shard}" for d in dead):
        why += f"; shard {opts.kill_shard} was killed on purpose by --kill-shard after step {kill_at}"
    return {"message": f"{phase} through the card failed {where}: {e} ({why})", "client_error": str(e),
            "phase": phase, "steps_completed": done,
            "failed_at_step": done + 1 if phase == "training" else None,
            "failing_shard": getattr(e, "shard_id", None), "dead_nodes": dead,
            "card_dead": any(d["role"] == "card" for d in dead)}


# --------------------------------------------------------------------------- the report and summaries
def build_report(run, ref, out: Path) -> dict:
    """The report dict (fields in docs/testbed.md) of ``run`` (what the demo's run through the card
    left: its options, losses, counters, failure, ...) and ``ref`` (the in-process reference run's
    result), written to ``out/report.json`` with its plots."""
    opts, res, losses, snap, failure = run.opts, run.res, run.losses, run.snap, run.failure
    card_at_end, lat, probes = run.card_at_end, run.client.stats.lookup_latency_us[:snap["latencies"]], run.probes
    done = len(losses)
    ref_part = np.asarray(ref.loss[:done], np.float64)
    loss_diff = float(np.max(np.abs(np.asarray(losses, np.float64) - ref_part))) if done else None
    el = snap["elapsed"]
    msgs = snap["messages_sent"] + snap["messages_received"]
    frames = snap["frames_sent"] + snap["frames_received"]
    # p50 of the lookup latencies over p50 of the probe RTTs (None if either is empty)
    ratio = (round(float(np.percentile(lat, 50)) / float(np.percentile(probes, 50)), 3)
             if len(lat) and probes else None)
    rep = {
        "target": opts.target,
        "pmd": opts.pmd if opts.target == "dpdk" else None,
        "model": opts.model,
        "testbed": opts.name,
        "config": str(Path(opts.config).resolve()),
        "data": str(opts.data or "shipped Criteo sample (testbed/training/data)"),
        "client": run.cid,
        "other_clients": {str(r.client.client_id): r.result() for r in run.readers},
        "steps": opts.steps,
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
        "lookup_p50_over_probe_p50": ratio,
        "latency_target": {"target": PROBE_TARGET, "measured": ratio,
                           "met": (ratio or float("inf")) <= PROBE_TARGET},
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
             f"{opts.steps} steps × {opts.batch_size}")
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


def summary(rep: dict) -> list[str]:
    """The short summary printed at the end of the demo."""
    lat = rep["lookup_latency_us"]
    tb = rep.get("tables") or {}
    t = rep["latency_target"]  # worded like the README's targets
    verdict = "not measured" if t.get("measured") is None else "met" if t.get("met") else "not met"
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
                      f"{rep['lookup_p50_over_probe_p50']} × probe p50 (target ≤ {t['target']:g}: {verdict})"),
        ("card drops", R.fmt_drops(rep["card_drops"])),
    ]
    if (lost := rep.get("card_lost_before_switch")) is not None:
        by_port = ", ".join(f"{k}: {v}" for k, v in lost["by_port"].items())
        over = f"; tables over {rep['card_control']['channel']}" if rep.get("card_control") else ""
        rows.append(("lost before card", f"{lost['total']} frames the card's interfaces took in that the switch "
                                         f"never counted (by port: {by_port}){over}"))
    if tb:
        rows.append(("final tables", f"{tb['rows']} rows read back through the card: "
                                     f"{'identical' if tb['equal'] else 'DIFFERENT'} to the in-process run"))
    if rep.get("netem"):
        imp = rep["netem"].get("impairment", {})
        rows.append(("faults", f"loss {imp.get('loss')}% reorder {imp.get('reorder')}% duplicate "
                               f"{imp.get('duplicate')}% ({rep['netem'].get('backend')})"))
    rows.append(("report", f"{Path(rep['plots']['loss']).parent / 'report.json'}, loss.png, latency_cdf.png"))
    return ["demo summary:"] + R.table_lines(rows)
