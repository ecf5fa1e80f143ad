"""TorchRec's own EmbeddingBagCollection with its fused optimizer, as the reference the torch
tests compare embnic against. Not a test file; also the batch generator and training loop the comparisons share.

:class:`TorchRecReference` shards a TorchRec ``EmbeddingBagCollection`` with
``DistributedModelParallel`` on one gloo rank, table-wise (the sharding TorchRec offers on CPU),
with fbgemm's fused ``EXACT_SGD`` or ``EXACT_ROWWISE_ADAGRAD`` (learning rate and eps from the
embnic table config), and sets every table's rows to embnic's initial rows
(:func:`embnic.client_lib.table_numerics.init_rows`), so both start from the same tables.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import warnings

import numpy as np
import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import PoolingType

from embnic.client_lib.config import parse_config
from embnic.client_lib.table_numerics import init_rows

#: rows (and pooled outputs of the same rows) against TorchRec's: every row agrees within it after
#: training, and a forward of the same rows differs only by summation order
TOL = dict(rtol=1e-6, atol=1e-7)
#: pooled outputs during training (README, "PyTorch and TorchRec"): an output sums rows that each
#: agree within TOL, so one near zero (terms that cancel) is off by their errors, not by 1e-6 of
#: itself: up to 2.7e-7 after 20 weighted-SUM row-wise-Adagrad steps (issue 34), hence atol 1e-6
OUT_TOL = dict(rtol=1e-6, atol=1e-6)

# one intra-op thread: on this 2-core machine, shared with the card and the shards, a 2-thread
# OpenMP region of a tiny op waits for a busy core (ms instead of µs); results do not change
torch.set_num_threads(1)
OPTIM = {"sgd": EmbOptimType.EXACT_SGD, "adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD}


def make_cfg(optimizer="adagrad", lr=0.1, shards=2, tables=(("a", 60, 4), ("b", 40, 4), ("c", 25, 4))):
    """A cluster of ``tables`` ((name, rows, dim), one ``optimizer`` and ``lr``) on ``shards``
    loopback shards and one client, the config the torch comparisons share."""
    return parse_config({
        "cluster": {"seed": 11, "sharding": "hash", "timeout_ms": 200, "retries": 10},
        "tables": [{"id": i, "name": n, "rows": r, "dim": d, "optimizer": optimizer, "lr": lr, "eps": 1e-8,
                    "init_scale": 0.5} for i, (n, r, d) in enumerate(tables)],
        "shards": [{"id": i, "ip": "127.0.0.1", "port": 7950 + i} for i in range(shards)],
        "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7960}],
    })



@contextlib.contextmanager
def one_rank_group():
    """A gloo process group of world size 1 (file rendezvous in a temp dir), destroyed after."""
    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("gloo", rank=0, world_size=1, init_method="file://" + os.path.join(d, "rdv"))
        try:
            yield
        finally:
            dist.destroy_process_group()


class TorchRecReference:
    """TorchRec's sharded EBC (DMP, 1 rank, table-wise, fused fbgemm optimizer) with embnic's rows.

    Args:
        cfg: the embnic cluster config; every table must have the same optimizer, lr and eps
            (one fused optimizer per sharder), fp32.
        configs: the ``EmbeddingBagConfig`` list (as given to RemoteEmbeddingBagCollection).
        is_weighted: per-sample weights.
    """

    def __init__(self, cfg, configs: list[EmbeddingBagConfig], is_weighted: bool = False):
        by_name = {t.name: t for t in cfg.tables}
        tabs = [by_name[c.name] for c in configs]
        opts = {(t.optimizer, t.lr, t.eps) for t in tabs}
        assert len(opts) == 1, f"one optimizer for every table, got {opts}"
        opt, lr, eps = opts.pop()
        self.cfg, self.tabs = cfg, tabs
        confs = [EmbeddingBagConfig(name=c.name, embedding_dim=c.embedding_dim, num_embeddings=c.num_embeddings,
                                    feature_names=list(c.feature_names), pooling=c.pooling) for c in configs]
        ebc = EmbeddingBagCollection(tables=confs, is_weighted=is_weighted, device=torch.device("cpu"))
        sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": OPTIM[opt], "learning_rate": lr, "eps": eps})
        with warnings.catch_warnings():  # the planner's advice on dry runs; this is no dry run
            warnings.simplefilter("ignore", FutureWarning)
            planner = EmbeddingShardingPlanner(
                topology=Topology(world_size=1, compute_device="cpu"),
                constraints={c.name: ParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value])
                             for c in confs})
            plan = planner.collective_plan(ebc, [sharder], dist.GroupMember.WORLD)
        self.plan = plan
        self.dmp = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan, sharders=[sharder])
        for t in tabs:
            self.weight(t.name).copy_(torch.from_numpy(
                init_rows(cfg.seed, t.id, np.arange(t.rows, dtype=np.uint64), t.dim, t.init_scale)))

    def sharding_types(self) -> set[str]:
        """Sharding types the planner chose (``{"table_wise"}``)."""
        return {p.sharding_type for m in self.plan.plan.values() for p in m.values()}

    def weight(self, name: str) -> torch.Tensor:
        """The table's rows as fbgemm holds them (a view: writes go to the table)."""
        st = self.dmp.state_dict()[f"embedding_bags.{name}.weight"]
        return st.local_shards()[0].tensor

    def __call__(self, kjt):
        """Pooled embeddings (a KeyedTensor)."""
        return self.dmp(kjt).wait()


def configs(cfg, pooling=PoolingType.SUM, features=None) -> list[EmbeddingBagConfig]:
    """One EmbeddingBagConfig per cluster table; features ``{table name: [feature, ...]}``
    (default one feature ``f_<table>`` each)."""
    features = features or {t.name: [f"f_{t.name}"] for t in cfg.tables}
    return [EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                               feature_names=list(features[t.name]), pooling=pooling) for t in cfg.tables]


def random_kjt(rng, keys, limits, b, weighted=False, max_len=3):
    """A KJT of ``len(keys)`` features × ``b`` samples, 0..max_len ids per bag (so empty bags too)."""
    lengths = rng.integers(0, max_len + 1, len(keys) * b)
    per_feat = lengths.reshape(len(keys), b).sum(axis=1)
    values = np.concatenate([rng.integers(0, lim, n) for lim, n in zip(limits, per_feat)])
    w = torch.from_numpy(rng.uniform(0.5, 2.0, values.size).astype(np.float32)) if weighted else None
    return KeyedJaggedTensor(keys=list(keys), values=torch.from_numpy(values.astype(np.int64)),
                             lengths=torch.from_numpy(lengths.astype(np.int32)), weights=w, stride=b)


def all_rows(lookup, cfg) -> dict:
    """``{table name: every row as a tensor}`` through a backend's ``lookup({table_id: keys})`` (one round)."""
    rows = lookup({t.id: np.arange(t.rows, dtype=np.uint64) for t in cfg.tables})
    return {t.name: torch.from_numpy(np.asarray(rows[t.id])) for t in cfg.tables}


def train_both(cfg, ours, ref, rng, steps=4, weighted=False, b=32) -> None:
    """``steps`` training steps of ``ours`` (RemoteEmbeddingBagCollection) and ``ref`` on the same
    random batches and upstream gradients; pooled embeddings must agree at every step (within
    :data:`OUT_TOL`)."""
    keys = [f for c in ours.embedding_bag_configs() for f in c.feature_names]
    limits = [c.num_embeddings for c in ours.embedding_bag_configs() for _ in c.feature_names]
    for _ in range(steps):
        kjt = random_kjt(rng, keys, limits, b, weighted)
        got, want = ours(kjt).values(), ref(kjt).values()
        torch.testing.assert_close(got, want, **OUT_TOL)
        up = torch.from_numpy(rng.standard_normal(got.shape).astype(np.float32))
        (got * up).sum().backward()
        (want * up).sum().backward()
