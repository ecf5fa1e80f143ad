"""Several DLRM training workers on one set of shards, launched with ``torchrun``.

::

    torchrun --nproc-per-node 2 -m embnic.testbed.training.dlrm_workers -c CONFIG --client-id-base 1 \\
        --steps 20 --batch-size 256 --out out/workers

Rank ``r`` of ``W`` is client ``--client-id-base + r`` of the config, bound to that client's
address and port (:func:`client_ids`); its TorchRec ``DLRM`` (:mod:`.dlrm`) has the dense layers
in the process, wrapped in ``DistributedDataParallel`` over gloo, and its tables on the shards
only. Step ``k`` of every rank: look its batch up (rows ``((k·W + r)·B + [0, B)) mod N``), the
dense gradient averaged over the ranks, one SGD step; then, barrier by barrier, rank 0's per-row
gradients are sent as one update round, then rank 1's, ... So every rank sees the rows after
every update of step ``k - 1`` and none of step ``k``: the run is deterministic and equals
:func:`reference_run` (one process) within ``rtol=1e-6, atol=1e-7`` (README, "PyTorch and
TorchRec"; docs/testbed.md). ``--out DIR`` writes ``worker-<rank>.json`` and ``.pt``; exit codes
and the one-line errors: :func:`main`.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from embnic.client_lib.backend import require_backend
from embnic.client_lib.config import ClusterConfig

USAGE_EXIT, FAIL_EXIT = 2, 1
INTERRUPT_EXIT, TERM_EXIT = 130, 143  #: Ctrl-C; SIGTERM (torchrun stopping the workers)


class WorkerMappingError(ValueError):
    """The ranks do not map onto the config's clients (one line: which rank, which client, why)."""


def client_ids(cfg: ClusterConfig, base: int, world: int, local_world: int) -> list[int]:
    """Client id of every rank: ``base + rank``, checked against the config.

    The ranks ``[n·L, (n+1)·L)`` of node ``n`` (``L`` = ``local_world``, torchrun's
    ``--nproc-per-node``) run on one host, so their clients must share one IPv4 address (and
    have distinct UDP ports, which the config guarantees for clients of one address).

    Args:
        cfg: the cluster config.
        base: client id of rank 0.
        world, local_world: ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` (≥ 1, ``world`` a multiple
            of ``local_world``).

    Returns:
        ``[client id of rank 0, ..., of rank world-1]``.

    Raises:
        WorkerMappingError: a rank's client id is not in the config, or two ranks of one node
            map to clients of different hosts.
    """
    if world < 1 or local_world < 1 or world % local_world:
        raise WorkerMappingError(f"WORLD_SIZE {world} is not a multiple of LOCAL_WORLD_SIZE {local_world} "
                                 "(run under torchrun --nproc-per-node N)")
    known = {c.id: c for c in cfg.clients}
    ids = [base + r for r in range(world)]
    for r, cid in enumerate(ids):
        if cid not in known:
            raise WorkerMappingError(
                f"rank {r} maps to client {cid} (--client-id-base {base} + rank), which is not in "
                f"{cfg.path or 'the config'} (clients: {', '.join(str(c) for c in sorted(known))})")
    for node in range(world // local_world):
        ranks = range(node * local_world, (node + 1) * local_world)
        ips = {known[ids[r]].ip for r in ranks}
        if len(ips) > 1:
            desc = ", ".join(f"rank {r} -> client {ids[r]} at {known[ids[r]].ip}" for r in ranks)
            raise WorkerMappingError(f"the ranks of one host must be clients of one address, but {desc}; "
                                     "pick --client-id-base so that they are the clients of this host")
    return ids


def batch_rows(n: int, step: int, rank: int, world: int, batch_size: int) -> np.ndarray:
    """int64 (batch_size,): rank ``rank``'s rows at step ``step``: ``((step·W + rank)·B + [0, B)) mod n``."""
    return (np.arange(batch_size, dtype=np.int64) + (step * world + rank) * batch_size) % n


class DeferredUpdates:
    """A backend (:class:`~embnic.client_lib.backend.Backend`) whose lookups go through at once and
    whose update rounds wait for :meth:`flush`.

    What :class:`~embnic.client_lib.torch.RemoteEmbeddingBagCollection` is given, so that its
    backward computes the per-row gradients without sending them: the worker sends them in its
    turn of the sparse phase. ``inner``: the backend that holds the rows (an ``EmbeddingClient``
    or a ``LocalBackend``); a held round is checked by ``inner`` when it is sent.

    Raises:
        TypeError: ``inner`` is not a backend.
    """

    def __init__(self, inner):
        self.cfg = require_backend(inner, "DeferredUpdates").cfg
        self._inner = inner
        self.pending: list[Callable[[], None]] = []
        self.lookup, self.lookup_flat = inner.lookup, inner.lookup_flat  #: the rows now, from ``inner``

    def update(self, updates: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Hold ``{table: (keys uint64 (N,), grads float32 (N, dim))}`` until :meth:`flush`."""
        self.pending.append(functools.partial(self._inner.update, updates))

    def update_flat(self, table_ids, counts, keys, grads) -> None:
        """Hold a flat update round (grads float32 (Σ counts·dim,)) until :meth:`flush`."""
        self.pending.append(functools.partial(self._inner.update_flat, table_ids, counts, keys, grads))

    def take(self) -> list[Callable[[], None]]:
        """The held update rounds, oldest first, no longer held (each sends itself when called)."""
        out, self.pending = self.pending, []
        return out

    def flush(self) -> int:
        """Send the held update rounds (oldest first, each waits for its acks); returns how many."""
        rounds = self.take()
        for send_round in rounds:
            send_round()
        return len(rounds)


@dataclasses.dataclass
class Plan:
    """What ``W`` workers run: ``steps`` steps of ``batch_size`` rows per rank, dense SGD at
    ``lr_dense``, dense parameters from ``seed``; ``empty_bags``: (rank, step) pairs whose batch
    has only empty bags."""

    world: int
    steps: int
    batch_size: int
    lr_dense: float = 0.05
    seed: int = 0
    empty_bags: frozenset = frozenset()


def _model(cfg: ClusterConfig, backend, data, plan: Plan):
    """(``backend`` behind :class:`DeferredUpdates`, the DLRM on it); ValueError: no rows."""
    from .dlrm import build_model

    if not len(data.labels):
        raise ValueError("no training rows")
    deferred = DeferredUpdates(backend)
    return deferred, build_model(cfg, deferred, data.dense.shape[1], data.sparse.shape[1], plan.seed)


def _backward(model, data, plan: Plan, step: int, rank: int) -> float:
    """Forward and backward of rank ``rank``'s batch at ``step`` (gradients zeroed first); its loss."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from .dlrm import batch_inputs

    rows = batch_rows(len(data.labels), step, rank, plan.world, plan.batch_size)
    dense, kjt, labels = batch_inputs(data, rows)
    if (rank, step) in plan.empty_bags:  # every bag empty (lengths 0, no values): no sample has a sparse feature
        kjt = KeyedJaggedTensor(keys=kjt.keys(), values=torch.zeros(0, dtype=torch.int64),
                                lengths=torch.zeros(len(kjt.keys()) * len(rows), dtype=torch.int32),
                                stride=len(rows))
    model.zero_grad()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, kjt).reshape(-1), labels)
    loss.backward()
    return loss.item()


def run_worker(cfg: ClusterConfig, data, plan: Plan, *, rank: int, backend, barrier: Callable[[], None],
               progress: Callable[[int, float], None] | None = None):
    """Train as rank ``rank`` of ``plan.world`` (module docstring); the gloo process group must be up.

    Args:
        cfg: cluster config; data: :class:`~embnic.testbed.training.criteo.CriteoData` rows.
        backend: this rank's ``EmbeddingClient`` (or a ``LocalBackend`` in tests).
        barrier: ``torch.distributed.barrier`` (a callable, so a test can count the phases).
        progress: called ``(step, loss)`` after every step.

    Returns:
        (losses of this rank per step, the dense ``state_dict``).

    Raises:
        embnic.client_lib.client.EmbnicError: a shard failed; ValueError: no rows.
    """
    import torch
    from torch.nn.parallel import DistributedDataParallel

    deferred, model = _model(cfg, backend, data, plan)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=plan.lr_dense)
    losses = []
    for k in range(plan.steps):
        losses.append(_backward(ddp, data, plan, k, rank))  # dense: DDP's all-reduce (mean); sparse: held
        opt.step()
        barrier()  # every rank's lookups of step k are done
        for turn in range(plan.world):
            if turn == rank:
                deferred.flush()
            barrier()
        if progress is not None:
            progress(k, losses[-1])
    return losses, model.state_dict()


@dataclasses.dataclass
class ReferenceResult:
    """Outcome of :func:`reference_run`: ``loss[r][k]`` of rank ``r`` at step ``k``, the dense
    ``state_dict`` (every rank's, they are equal) and the in-process tables (``LocalBackend``)."""

    loss: list
    params: dict
    tables: object


def reference_run(cfg: ClusterConfig, data, plan: Plan) -> ReferenceResult:
    """What ``plan.world`` workers compute, in one process with in-process tables.

    Step ``k``: for every rank ``r`` the forward of its batch on the rows after step ``k - 1``
    and the backward, its dense gradient ``g_r`` and per-row gradients held; the dense gradient
    ``Σ_r g_r / W`` (summed in rank order: DDP's ``g_r / W`` all-reduced) and one SGD step; then the
    per-row gradients of rank 0, 1, ... applied to the tables in that order.

    Raises:
        ValueError: no rows.
    """
    import torch

    from embnic.client_lib.local import LocalBackend

    tables = LocalBackend(cfg)
    deferred, model = _model(cfg, tables, data, plan)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=plan.lr_dense)
    losses = [[] for _ in range(plan.world)]
    for k in range(plan.steps):
        grads, held = [], []
        for r in range(plan.world):
            losses[r].append(_backward(model, data, plan, k, r))
            grads.append([p.grad.detach().clone() for p in params])
            held.append(deferred.take())
        scale = 1.0 / plan.world
        for i, p in enumerate(params):
            p.grad = sum((g[i] * scale for g in grads[1:]), grads[0][i] * scale)
        opt.step()
        for send_round in (s for rounds in held for s in rounds):  # rank 0's, then rank 1's, ...
            send_round()
    return ReferenceResult(losses, model.state_dict(), tables)


RTOL, ATOL = 1e-6, 1e-7  #: the tolerance of ``--check`` (torch.testing.assert_close's rule)


def _excess(pairs) -> tuple[float, bool]:
    """(max |got - want|, every element within ``ATOL + RTOL·|want|``) over ``(got, want)`` pairs of
    float arrays ((0.0, True) for none; (inf, False) if a pair's shapes differ)."""
    worst, ok = 0.0, True
    for got, want in pairs:
        g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
        if g.shape != w.shape:
            return float("inf"), False
        d = np.abs(g - w)
        worst = max(worst, float(d.max()) if d.size else 0.0)
        ok = ok and bool(np.all(d <= ATOL + RTOL * np.abs(w)))
    return worst, ok


def check_against_reference(cfg: ClusterConfig, data, plan: Plan, losses: list, params: dict,
                            lookup: Callable[[dict], dict]) -> dict:
    """Compare a finished run with :func:`reference_run` (``--check``).

    Args:
        losses: every rank's losses, ``losses[r][k]``; params: the dense ``state_dict`` (any rank's).
        lookup: ``{table: keys}`` → ``{table: rows}`` of the tables as the run left them (a client).

    Returns:
        ``{"ok", "loss_max_abs_diff", "params_max_abs_diff", "rows", "rows_max_abs_diff"}``;
        ``ok``: all three within ``ATOL + RTOL·|reference|`` element-wise.
    """
    ref = reference_run(cfg, data, plan)
    l_d, l_ok = _excess([(losses, ref.loss)])
    p_d, p_ok = _excess((params[k].detach().numpy(), v.detach().numpy())
                        for k, v in ref.params.items() if k in params)
    want = {t: ks for t, (ks, _, _) in ref.tables.state_dict().items() if ks.size}
    got = lookup(want) if want else {}
    exp = ref.tables.lookup(want)
    r_d, r_ok = _excess((got[t], exp[t]) for t in want)
    return {"ok": l_ok and p_ok and params.keys() == ref.params.keys() and r_ok, "loss_max_abs_diff": l_d, "params_max_abs_diff": p_d,
            "rows": int(sum(len(k) for k in want.values())), "rows_max_abs_diff": r_d}


def check_line(check: dict) -> str:
    """One line saying what :func:`check_against_reference` found."""
    verdict = "equal the one-process reference" if check["ok"] else "DIFFER from the one-process reference"
    return (f"check: every rank's losses, the dense parameters and {check['rows']} updated rows {verdict} "
            f"(max |Δ| {check['loss_max_abs_diff']:.3g} / {check['params_max_abs_diff']:.3g} / "
            f"{check['rows_max_abs_diff']:.3g}; rtol {RTOL:g}, atol {ATOL:g})")


def _parse_empty(text: str) -> tuple[int, int]:
    try:
        r, k = text.split(":")
        return int(r), int(k)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--empty-bags takes RANK:STEP (e.g. 1:0), got {text!r}") from None


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node N -m embnic.testbed.training.dlrm_workers",
        description="Train TorchRec's DLRM with N workers (torchrun), each an embnic client of its own "
                    "(client id = --client-id-base + RANK); dense parameters averaged with "
                    "DistributedDataParallel over gloo, sparse tables only on the shards.",
        epilog="Example: torchrun --nproc-per-node 2 -m embnic.testbed.training.dlrm_workers "
               "-c examples/testbed-shared.toml --client-id-base 1 --steps 20 --out out/workers")
    p.add_argument("-c", "--config", required=True, help="cluster config (the same file on every worker)")
    p.add_argument("--client-id-base", type=int, required=True,
                   help="client id of rank 0; rank r is client BASE + r (the ranks of one host: clients of one address)")
    p.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    p.add_argument("--batch-size", type=int, default=256, help="samples per step and rank (default 256)")
    p.add_argument("--lr-dense", type=float, default=0.05, help="SGD learning rate of the dense layers")
    p.add_argument("--data", default=None, help="Criteo TSV (default: the shipped sample)")
    p.add_argument("--max-rows", type=int, default=None, help="read at most this many rows of --data")
    p.add_argument("--empty-bags", type=_parse_empty, action="append", default=[], metavar="RANK:STEP",
                   help="rank RANK's batch at step STEP has only empty bags (repeatable)")
    p.add_argument("--out", default=None, help="write worker-<rank>.json and worker-<rank>.pt here")
    p.add_argument("--check", action="store_true",
                   help="rank 0 then computes the run in one process (reference_run) and compares every rank's "
                        "losses, the dense parameters and every updated row (read back through its client); exit 1 "
                        "if they differ beyond rtol 1e-6, atol 1e-7")
    a = p.parse_args(argv)
    if a.steps < 1 or a.batch_size < 1:
        p.error("--steps and --batch-size must be at least 1")
    return a


def _env(name: str) -> int:
    v = os.environ.get(name)
    if v is None:
        raise WorkerMappingError(f"${name} is not set: start the workers with "
                                 "torchrun --nproc-per-node N -m embnic.testbed.training.dlrm_workers ...")
    return int(v)


class Stopped(Exception):
    """SIGTERM arrived: torchrun ends every worker when one of them failed or it was interrupted."""


def _raise_stopped(signum, frame):
    _ending()  # once: a second SIGTERM must not interrupt the handling of the first
    raise Stopped


def _ending() -> None:
    """The worker is ending with its one line: torchrun's SIGTERM, which follows a failure of any
    rank, is ignored from here (raised now, it would interrupt the destructors that run when the
    handled exception is dropped — ``Exception ignored in ... __del__`` with a traceback)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


#: words of the errors torch.distributed (gloo) raises when a peer rank's process is gone
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused",
              "Socket closed", "Timed out waiting", "timed out")


def peer_lost(e: BaseException) -> bool:
    """Whether ``e`` is torch.distributed's error for a collective whose peer rank is gone (a
    ``DistError``, or gloo's ``RuntimeError`` naming a closed or reset connection)."""
    try:
        from torch.distributed import DistError
    except ImportError:  # torch without it (< 2.2): by its words only
        DistError = ()
    return isinstance(e, DistError) or (isinstance(e, RuntimeError) and any(w in str(e) for w in _PEER_LOST))


def _first_line(e: BaseException) -> str:
    """The gist of ``e``'s message: its first non-empty line without gloo's C++ source location
    (``[.../pair.cc:545] ``) and advice (``. This is typically caused by ...``)."""
    for line in str(e).splitlines():
        line = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", line.strip())
        line = line.split(". This is typically")[0].rstrip(".")
        if line:
            return line[:300]
    return type(e).__name__


def main(argv: list[str] | None = None) -> int:
    """The torchrun entry point (module docstring). Returns the exit code: 0, 1 (a run failed,
    or a peer rank died), 2 (usage: bad config, wrong rank → client mapping, an address this host
    does not have), 130 (Ctrl-C) or 143 (SIGTERM: torchrun stopping the workers). Each ending
    other than 0 is one line on stderr, never a traceback."""
    a = _args(argv)
    rank = os.environ.get("RANK", "?")
    old = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        return _main(a)
    except KeyboardInterrupt:
        _ending()
        print(f"rank {rank}: interrupted (Ctrl-C); the shards keep the updates of the steps done", file=sys.stderr,
              flush=True)
        return INTERRUPT_EXIT
    except Stopped:
        _ending()
        print(f"rank {rank}: stopped by SIGTERM (torchrun stops every worker when one failed or was interrupted: "
              "see that rank's line)", file=sys.stderr, flush=True)
        return TERM_EXIT
    except Exception as e:  # noqa: BLE001 - a dead peer is one line; anything else stays a traceback (a bug)
        if not peer_lost(e):
            raise
        _ending()
        print(f"error: rank {rank}: a peer rank is gone ({_first_line(e)}); its own line (or torchrun's summary) "
              "says why", file=sys.stderr, flush=True)
        return FAIL_EXIT
    finally:
        signal.signal(signal.SIGTERM, old)


def _main(a: argparse.Namespace) -> int:
    """:func:`main` after the argument parsing, inside its handlers of Ctrl-C, SIGTERM and a dead peer."""
    try:
        # first: without the torch extra this raises the ImportError that says what to install
        import embnic.client_lib.torch  # noqa: F401
    except ImportError as e:
        print(f"error: {e}", file=sys.stderr)
        return USAGE_EXIT
    import torch
    import torch.distributed as dist

    from embnic.client_lib.client import EmbeddingClient, EmbnicError
    from embnic.client_lib.config import ConfigError, load_config

    from .criteo import CriteoFormatError
    from .train import load_training_data

    try:
        rank, world, local_world = _env("RANK"), _env("WORLD_SIZE"), _env("LOCAL_WORLD_SIZE")
        cfg = load_config(a.config)
        ids = client_ids(cfg, a.client_id_base, world, local_world)
        bad = [f"{r}:{k}" for r, k in a.empty_bags if not (0 <= r < world and 0 <= k < a.steps)]
        if bad:
            raise WorkerMappingError(f"--empty-bags {', '.join(bad)}: rank must be in 0..{world - 1} and step in "
                                     f"0..{a.steps - 1}")
    except (WorkerMappingError, ConfigError, OSError) as e:
        # every rank finds the same: said once per host (by local rank 0), not once per rank
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"error: {e}", file=sys.stderr)
        return USAGE_EXIT
    cid = ids[rank]
    me = cfg.client(cid)
    try:
        client = EmbeddingClient(cfg, cid)
    except OSError as e:
        print(f"error: rank {rank}: cannot bind client {cid} to {me.ip}:{me.port}: {e.strerror} (is this host that "
              "client's address? pick --client-id-base)", file=sys.stderr)
        return USAGE_EXIT
    torch.set_num_threads(1)  # the card and the shards need the other core (see dlrm.train_dlrm)
    plan = Plan(world=world, steps=a.steps, batch_size=a.batch_size, lr_dense=a.lr_dense, seed=cfg.seed,
                empty_bags=frozenset(a.empty_bags))
    with client:
        try:
            tr, _ = load_training_data(cfg, a.data, max_rows=a.max_rows)
        except (OSError, CriteoFormatError) as e:
            print(f"error: rank {rank}: cannot read training data: {e}", file=sys.stderr)
            return FAIL_EXIT
        dist.init_process_group("gloo")
        try:
            def progress(k: int, loss: float) -> None:
                print(f"rank {rank} client {cid} step {k + 1:4d} loss {loss:.6f}", flush=True)

            losses, params = run_worker(cfg, tr, plan, rank=rank, backend=client, barrier=dist.barrier,
                                        progress=progress)
            check = None
            if a.check:  # (the same on every rank, so every rank takes part in the gather)
                all_losses = [None] * world
                dist.all_gather_object(all_losses, losses)
                if rank == 0:  # every rank's updates are applied (run_worker's last barrier)
                    check = check_against_reference(cfg, tr, plan, all_losses, params, client.lookup)
                    print(check_line(check), flush=True)
        except EmbnicError as e:
            print(f"error: rank {rank} (client {cid}): {e}", file=sys.stderr)
            return FAIL_EXIT
        finally:
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - gloo after a dead peer: the error that ended the run is the one said
                pass
        if a.out:
            out = Path(a.out)
            out.mkdir(parents=True, exist_ok=True)
            rec = {"rank": rank, "world": world, "client_id": cid, "address": list(client.address),
                   "steps": a.steps, "batch_size": a.batch_size, "empty_bags": sorted(map(list, a.empty_bags)),
                   "loss": losses, "client": client.stats.as_dict(), "check": check}
            (out / f"worker-{rank}.json").write_text(json.dumps(rec, indent=1))
            torch.save(params, out / f"worker-{rank}.pt")
    return FAIL_EXIT if check is not None and not check["ok"] else 0


if __name__ == "__main__":
    sys.exit(main())
