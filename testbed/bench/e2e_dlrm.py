"""The DLRM rows of ``embnic bench e2e``: training steps/s of TorchRec's DLRM with its tables
through the card vs the same DLRM with TorchRec's own ``EmbeddingBagCollection`` in the process.

The method: docs/bench.md, "embnic bench e2e, the DLRM rows".
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import time
import warnings

import numpy as np

from embnic.control.errors import OperationalError

N_DENSE, N_SPARSE = 13, 26


def dlrm_batches(data, starts: list[int], batch: int) -> list[tuple]:
    """(dense float32 (B, 13), KJT of C1..C26, labels float32 (B,)) for every start: rows
    ``start + [0, batch)`` of ``data`` (wrapping around)."""
    from embnic.testbed.training.dlrm import batch_inputs

    n = len(data.labels)
    return [batch_inputs(data, (np.arange(batch) + s) % n) for s in starts]


def time_steps(model, opt, batches: list[tuple]) -> list[float]:
    """Train one step per batch (forward, BCE-with-logits loss, backward, ``opt.step()``);
    returns every step's wall time in µs."""
    import torch

    out = []
    for dense, kjt, labels in batches:
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, kjt).reshape(-1), labels)
        loss.backward()
        opt.step()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _repeats(model, opt, batches: dict, repeats: int) -> dict:
    """``{batch: [step µs list per repeat]}``: a warm-up step, then the timed ones, per repeat."""
    res = {}
    for b, bl in batches.items():
        time_steps(model, opt, bl[:1])
        res[b] = [time_steps(model, opt, bl[1:]) for _ in range(repeats)]
    return res


def card_steps(client, cfg, batches: dict, repeats: int, lr_dense: float = 0.05) -> dict:
    """DLRM steps with the tables through ``client`` (docs/bench.md, side **card**).

    Args:
        client: an ``EmbeddingClient`` (in its namespace, through the card).
        cfg: the testbed's effective config; batches: ``{batch: dlrm_batches(...)}``.

    Returns:
        ``{batch: [step µs list per repeat]}``.
    """
    import torch

    from embnic.testbed.training.dlrm import build_model

    with _one_thread():
        model = build_model(cfg, client, N_DENSE, N_SPARSE, cfg.seed)
        opt = torch.optim.SGD(model.parameters(), lr=lr_dense)
        return _repeats(model, opt, batches, repeats)


def torchrec_steps(cfg, batches: dict, repeats: int, lr_dense: float = 0.05) -> dict:
    """The same DLRM steps with TorchRec's ``EmbeddingBagCollection`` in this process (docs/bench.md,
    side **torchrec**; a one-rank gloo group, file rendezvous, destroyed after).

    Returns:
        ``{batch: [step µs list per repeat], "sharding_types": [...]}``.

    Raises:
        ImportError: no embnic[torch]. OperationalError: a process group is already up.
    """
    import torch
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection

    from embnic.testbed.training.dlrm import build_model, table_configs

    if dist.is_initialized():
        raise OperationalError("bench e2e's TorchRec DLRM needs its own process group, but one is already up")
    confs, table_ids, _ = table_configs(cfg, N_SPARSE)
    fused = fused_optimizer([cfg.table(table_ids[c.name]) for c in confs])
    with tempfile.TemporaryDirectory() as d, _one_thread():
        dist.init_process_group("gloo", rank=0, world_size=1, init_method="file://" + os.path.join(d, "rdv"))
        try:
            ebc = EmbeddingBagCollection(tables=confs, device=torch.device("cpu"))
            model = build_model(cfg, None, N_DENSE, N_SPARSE, cfg.seed, ebc=ebc)
            dmp, types = table_wise_dmp(model, confs, 1, fused)
            dense = [p for n, p in dmp.named_parameters() if "embedding_bags" not in n]
            opt = torch.optim.SGD(dense, lr=lr_dense)
            res = _repeats(dmp, opt, batches, repeats)
            res["sharding_types"] = types
            res["dense_parameters"] = int(sum(p.numel() for p in dense))
            return res
        finally:
            dist.destroy_process_group()


def fused_optimizer(tables) -> dict:
    """TorchRec's ``fused_params`` of the tables' one optimizer: fbgemm's ``EXACT_SGD`` or
    ``EXACT_ROWWISE_ADAGRAD`` with their ``lr`` and ``eps``.

    Raises:
        ValueError: the tables differ in optimizer, lr or eps.
    """
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    opts = {(t.optimizer, t.lr, t.eps) for t in tables}
    if len(opts) != 1:
        raise ValueError(f"one optimizer for every table, got {sorted(opts)}")
    optimizer, lr, eps = opts.pop()
    return {"optimizer": {"sgd": EmbOptimType.EXACT_SGD, "adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD}[optimizer],
            "learning_rate": lr, "eps": eps}


def table_wise_dmp(module, confs, world: int, fused: dict) -> tuple:
    """``module`` with its ``EmbeddingBagCollection`` (tables ``confs``) sharded table-wise over the
    ``world`` CPU ranks of the process group that is up, fused optimizer ``fused``: (TorchRec's
    ``DistributedModelParallel``, the sharding types of its plan)."""
    import torch
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingType

    sharder = EmbeddingBagCollectionSharder(fused_params=fused)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=world, compute_device="cpu"),
            constraints={c.name: ParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value]) for c in confs})
        plan = planner.collective_plan(module, [sharder], dist.GroupMember.WORLD)
        dmp = DistributedModelParallel(module, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    return dmp, sorted({p.sharding_type for m in plan.plan.values() for p in m.values()})


@contextlib.contextmanager
def _one_thread():
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def summarise(runs: list[list[float]]) -> dict:
    """Repeats of step times (µs) → ``steps_per_s`` and ``step_p50_us``/``step_p99_us``
    (:func:`median_min_max` over repeats)."""
    return {"steps_per_s": median_min_max([1e6 / np.median(r) for r in runs]),
            **{f"step_p{q}_us": median_min_max([np.percentile(r, q) for r in runs]) for q in (50, 99)}}


def median_min_max(xs) -> dict:
    """``{median, min, max}`` of repeat values."""
    a = np.asarray(xs, dtype=np.float64)
    return {"median": float(np.median(a)), "min": float(a.min()), "max": float(a.max())}


def rows(card: dict, torchrec: dict, batches) -> list[dict]:
    """The ``model: "dlrm"`` rows of ``e2e.rows``: per batch ``card_steps_per_s``,
    ``torchrec_steps_per_s`` (medians of repeats), ``card_over_torchrec`` (their ratio) and the
    step p50s (µs)."""
    out = []
    for b in batches:
        c, t = summarise(card[b]), summarise(torchrec[b])
        out.append({"model": "dlrm", "batch": b,
                    "card_steps_per_s": c["steps_per_s"]["median"],
                    "torchrec_steps_per_s": t["steps_per_s"]["median"],
                    "card_over_torchrec": c["steps_per_s"]["median"] / t["steps_per_s"]["median"],
                    "card_step_p50_us": c["step_p50_us"]["median"],
                    "torchrec_step_p50_us": t["step_p50_us"]["median"]})
    return out
