"""embnic.client_lib.torch and TorchRec's ways to choose a table's optimizer (issue 23):
``apply_optimizer_in_backward`` (checked against TorchRec's DMP with the same call) and a sharder's
``fused_params`` match the table's optimizer or raise naming the table — also through a real
``DistributedModelParallel`` (one gloo rank, CPU): ``RemoteEmbeddingBagCollectionSharder(
fused_params=...)`` trains as TorchRec's DMP with the same ``fused_params``, and a DMP whose
``fused_params`` cannot reach the module is refused by name; frozen tables and DDP.

Run alone: python3 -m pytest -q tests/client_lib/test_torch_optim.py   (needs the embnic[torch] extra)
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchrec = pytest.importorskip("torchrec")

from torchrec import EmbeddingBagCollection  # noqa: E402

from embnic.client_lib.local import LocalBackend  # noqa: E402
from embnic.client_lib.table_numerics import init_rows  # noqa: E402
from embnic.client_lib.torch import RemoteEmbeddingBagCollection  # noqa: E402
from torchref import TOL, TorchRecReference, all_rows, configs, make_cfg, one_rank_group, random_kjt, train_both  # noqa: E402, E501


def _apply_in_backward(params, cls, kwargs):
    import warnings

    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    with warnings.catch_warnings():  # TorchRec's own DeprecationWarning of its alias
        warnings.simplefilter("ignore", DeprecationWarning)
        apply_optimizer_in_backward(cls, params, kwargs)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_apply_optimizer_in_backward_matching_the_config_trains_like_torchrec(optimizer):
    """TorchRec's usual way (``apply_optimizer_in_backward`` on the EBC's parameters, then a
    sharder): the reference is TorchRec's DMP whose sharder gets the same choice through the
    parameters; the dense SGD over ``model.parameters()`` keeps working beside it."""
    import torchrec.optim as trec_optim

    cls, kw = ((torch.optim.SGD, {"lr": 0.2}) if optimizer == "sgd"
               else (trec_optim.RowWiseAdagrad, {"lr": 0.2, "eps": 1e-8}))
    cfg = make_cfg(optimizer, lr=0.2)
    with one_rank_group():
        ref = TorchRecReference(cfg, configs(cfg))
        local = LocalBackend(cfg)
        ours = RemoteEmbeddingBagCollection(configs(cfg), local)
        _apply_in_backward(ours.parameters(), cls, kw)
        dense = torch.optim.SGD(ours.parameters(), lr=0.1)  # README's dense optimizer: steps empty tensors
        train_both(cfg, ours, ref, np.random.default_rng(21))
        dense.step()
        for name, rows in all_rows(local.lookup, cfg).items():
            torch.testing.assert_close(rows, ref.weight(name), **TOL)
    w = ours.embedding_bags["a"].weight
    assert w._optimizer_classes == [cls] and w.shape == (0, 4) and w.grad is None  # the hook ran (a no-op)


def test_apply_optimizer_in_backward_on_torchrec_weights_with_a_dmp_equals_ours():
    """The TorchRec side of the same flow: ``apply_optimizer_in_backward`` on TorchRec's EBC before
    DMP (no fused_params in the sharder) trains as ours with the same call."""
    import warnings

    import torch.distributed as dist
    import torchrec.optim as trec_optim
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingType

    cfg = make_cfg("adagrad", lr=0.3)
    kw = {"lr": 0.3, "eps": 1e-8}
    with one_rank_group():
        confs = configs(cfg)
        ebc = EmbeddingBagCollection(tables=confs, device=torch.device("cpu"))
        _apply_in_backward(ebc.parameters(), trec_optim.RowWiseAdagrad, kw)
        sharder = EmbeddingBagCollectionSharder()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"), constraints={
                c.name: ParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value]) for c in confs})
            plan = planner.collective_plan(ebc, [sharder], dist.GroupMember.WORLD)
        dmp = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan, sharders=[sharder])

        def weight(name):
            return dmp.state_dict()[f"embedding_bags.{name}.weight"].local_shards()[0].tensor

        for t in cfg.tables:  # the sharded tables start from embnic's rows (as TorchRecReference)
            weight(t.name).copy_(torch.from_numpy(
                init_rows(cfg.seed, t.id, np.arange(t.rows, dtype=np.uint64), t.dim, t.init_scale)))
        local = LocalBackend(cfg)
        ours = RemoteEmbeddingBagCollection(configs(cfg), local)
        _apply_in_backward(ours.parameters(), trec_optim.RowWiseAdagrad, kw)
        rng = np.random.default_rng(22)
        for _ in range(3):
            kjt = random_kjt(rng, ["f_a", "f_b", "f_c"], [60, 40, 25], 16)
            got, want = ours(kjt).values(), dmp(kjt).wait().values()
            torch.testing.assert_close(got, want, **TOL)
            up = torch.from_numpy(rng.standard_normal(got.shape).astype(np.float32))
            (got * up).sum().backward()
            (want * up).sum().backward()
        for name, rows in all_rows(local.lookup, cfg).items():
            torch.testing.assert_close(rows, weight(name), **TOL)


OPTIM_MISMATCH = {  # config optimizer, class, kwargs, message
    "Adam on an Adagrad table": ("adagrad", "torch.optim.Adam", {"lr": 0.2},
                                 r"table 'a': apply_optimizer_in_backward\(Adam, ...\) asks for optimizer ADAM, "
                                 r"but the shards train cluster table 0 with row-wise Adagrad .*torchrec.optim.RowWiseAdagrad"),
    "element-wise Adagrad": ("adagrad", "torch.optim.Adagrad", {"lr": 0.2, "eps": 1e-8},
                             r"table 'a': .* optimizer EXACT_ADAGRAD, .* use torchrec.optim.RowWiseAdagrad with lr=0.2, eps=1e-08"),
    "another lr": ("adagrad", "torchrec.optim.RowWiseAdagrad", {"lr": 0.5, "eps": 1e-8}, r"table 'a': .* asks for lr 0.5,"),
    "another eps": ("adagrad", "torchrec.optim.RowWiseAdagrad", {"lr": 0.2, "eps": 1e-6}, r"asks for eps 1e-06"),
    "no lr: fbgemm's": ("adagrad", "torchrec.optim.RowWiseAdagrad", {"eps": 1e-8}, r"asks for lr 0.01 \(fbgemm default\)"),
    "SGD with momentum": ("sgd", "torch.optim.SGD", {"lr": 0.2, "momentum": 0.9}, r"table 'a': .* asks for momentum=0.9"),
    "SGD with weight decay": ("sgd", "torch.optim.SGD", {"lr": 0.2, "weight_decay": 1e-4}, r"weight_decay=0.0001"),
    "RowWiseAdagrad on an SGD table": ("sgd", "torchrec.optim.RowWiseAdagrad", {"lr": 0.2},
                                       r"optimizer EXACT_ROWWISE_ADAGRAD, .* with SGD .* use torch.optim.SGD"),
    "no fbgemm equivalent": ("sgd", "torch.optim.RMSprop", {"lr": 0.2},
                             r"table 'a': apply_optimizer_in_backward\(RMSprop\): Cannot cast"),
}


@pytest.mark.parametrize("case", sorted(OPTIM_MISMATCH))
def test_apply_optimizer_in_backward_mismatch_raises_naming_the_table_before_a_lookup(case):
    import importlib

    import torchrec.optim  # noqa: F401 (torchrec.optim.RowWiseAdagrad)

    optimizer, cls_name, kw, msg = OPTIM_MISMATCH[case]
    mod, name = cls_name.rsplit(".", 1)
    cls = getattr(importlib.import_module(mod), name)
    cfg = make_cfg(optimizer, lr=0.2)
    local = LocalBackend(cfg)
    ours = RemoteEmbeddingBagCollection(configs(cfg), local)
    _apply_in_backward([ours.embedding_bags["a"].weight], cls, kw)
    kjt = random_kjt(np.random.default_rng(23), ["f_a", "f_b", "f_c"], [60, 40, 25], 4)
    with pytest.raises(ValueError, match=msg):
        ours(kjt)
    assert ours.steps_forward == 0 and ours.ids == 0
    with pytest.raises(ValueError, match=msg):  # still, every time
        ours.check_optimizers()


def test_in_backward_choice_is_checked_in_backward_too_and_two_optimizers_are_refused():
    cfg = make_cfg("sgd", lr=0.2)
    local = LocalBackend(cfg)
    ours = RemoteEmbeddingBagCollection(configs(cfg), local)
    out = ours(random_kjt(np.random.default_rng(24), ["f_a", "f_b", "f_c"], [60, 40, 25], 4)).values()
    _apply_in_backward([ours.embedding_bags["b"].weight], torch.optim.Adam, {"lr": 0.2})  # after the forward
    with pytest.raises(ValueError, match=r"table 'b': .*Adam"):
        out.sum().backward()
    assert all(len(k) == 0 for k, _, _ in local.state_dict().values())  # no update sent
    ours2 = RemoteEmbeddingBagCollection(configs(cfg), LocalBackend(cfg))
    w = ours2.embedding_bags["c"].weight
    _apply_in_backward([w], torch.optim.SGD, {"lr": 0.2})
    ours2.check_optimizers()
    _apply_in_backward([w], torch.optim.SGD, {"lr": 0.2})
    with pytest.raises(ValueError, match=r"table 'c': 2 optimizers applied in backward \(SGD, SGD\); a table takes one"):
        ours2.check_optimizers()


def test_sharder_fused_params_match_or_raise_naming_the_table():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    cfg = make_cfg("adagrad", lr=0.2)
    good = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                                                       "learning_rate": 0.2, "eps": 1e-8})
    RemoteEmbeddingBagCollection(configs(cfg), LocalBackend(cfg), fused_params=good.fused_params)
    RemoteEmbeddingBagCollection(configs(cfg), LocalBackend(cfg),  # kernel settings are no optimizer choice
                                 fused_params={**good.fused_params, "stochastic_rounding": False})
    for fused, msg in (({"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": 0.2, "eps": 1e-8},
                        r"table 'a': fused_params asks for optimizer EXACT_ADAGRAD"),
                       ({"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.2}, "optimizer EXACT_SGD"),
                       ({"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1, "eps": 1e-8}, "lr 0.1"),
                       ({"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.2, "eps": 1e-8,
                         "weight_decay": 0.01}, "weight_decay=0.01"),
                       ({"learning_rate": 0.3}, r"asks for lr 0.3,"),
                       ({"optimizer": "lion"}, r"'lion' is not an fbgemm EmbOptimType")):
        with pytest.raises(ValueError, match=msg):
            RemoteEmbeddingBagCollection(configs(cfg), LocalBackend(cfg), fused_params=fused)
    # merged as TorchRec merges them: the parameter's kwargs over the sharder's
    ours = RemoteEmbeddingBagCollection(configs(cfg), LocalBackend(cfg), fused_params=good.fused_params)
    _apply_in_backward([ours.embedding_bags["b"].weight], torch.optim.Adagrad, {"lr": 0.2})
    with pytest.raises(ValueError, match=r"table 'b': apply_optimizer_in_backward\(Adagrad, ...\) with fused_params "
                                         r"asks for optimizer EXACT_ADAGRAD"):
        ours.check_optimizers()


# ---- a sharder's fused_params through DistributedModelParallel (issue 23, item 6) ----------

def _dmp(module, sharders=None, plan=None, **kw):
    """TorchRec's DMP of ``module`` on this one-rank gloo group (CPU)."""
    import warnings

    from torchrec.distributed.model_parallel import DistributedModelParallel

    with warnings.catch_warnings():  # the planner's advice on topology and dry runs
        warnings.simplefilter("ignore", FutureWarning)
        return DistributedModelParallel(module, device=torch.device("cpu"), sharders=sharders, plan=plan, **kw)


class _Head(torch.nn.Module):
    """A model with a dense part over the pooled embeddings (the module sits one level down)."""

    def __init__(self, ebc):
        super().__init__()
        self.ebc = ebc
        self.top = torch.nn.Linear(sum(c.embedding_dim for c in ebc.embedding_bag_configs()), 1)

    def forward(self, kjt):
        return self.top(self.ebc(kjt).values())


def test_dmp_with_our_sharder_trains_as_torchrecs_dmp_with_the_same_fused_params():
    """The sharder DMP really calls for our module type: its fused_params equal to the config's
    train exactly as TorchRec's EBC under DMP with the same fused_params (TorchRecReference)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.optim.fused import EmptyFusedOptimizer

    from embnic.client_lib.torch import RemoteEmbeddingBagCollectionSharder

    cfg = make_cfg("adagrad", lr=0.2)
    fp = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.2, "eps": 1e-8}
    with one_rank_group():
        ref = TorchRecReference(cfg, configs(cfg))  # TorchRec's EBC, EmbeddingBagCollectionSharder(fused_params=fp)
        local = LocalBackend(cfg)
        ebc = RemoteEmbeddingBagCollection(configs(cfg), local)
        ours = RemoteEmbeddingBagCollectionSharder(fused_params=fp)
        dmp = _dmp(ebc, [EmbeddingBagCollectionSharder(fused_params=fp), ours])
        assert {n: p.sharding_type for n, p in dmp.plan.plan[""].items()} == {
            "a": "data_parallel", "b": "data_parallel", "c": "data_parallel"}
        assert ebc._sharded_by == "RemoteEmbeddingBagCollectionSharder" and ebc._fused_params == fp
        # DMP collected our fused optimizer: TorchRec's no-op (the shards apply the updates)
        assert [type(o) for _, o in dmp.fused_optimizer._optims] == [EmptyFusedOptimizer]

        class Adapter:  # train_both's view of the DMP: the module's configs, DMP's forward
            embedding_bag_configs = ebc.embedding_bag_configs

            def __call__(self, kjt):
                return dmp(kjt)

        train_both(cfg, Adapter(), ref, np.random.default_rng(31))
        dmp.fused_optimizer.step()  # a no-op, as for TorchRec's fused tables
        for name, rows in all_rows(local.lookup, cfg).items():
            torch.testing.assert_close(rows, ref.weight(name), **TOL)
        assert sum(len(k) for k, _, _ in local.state_dict().values()) > 0


def test_dmp_never_ignores_a_sharders_fused_params_naming_the_tables():
    """fused_params only TorchRec's EBC sharder holds cannot reach our module (DMP hands it only
    to the sharder of its exact type): DMP is refused, naming the tables, before anything is
    sent — as it is when our sharder brings fused_params that contradict a table, or the plan
    has no entry for the module. The README's dense-only SGD path needs no sharder at all."""
    import warnings

    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

    import torchrec.optim  # noqa: F401 (torchrec.optim.RowWiseAdagrad)
    from torchrec.distributed.model_parallel import DefaultDataParallelWrapper

    from embnic.client_lib.torch import RemoteEmbeddingBagCollectionSharder as Ours
    from embnic.client_lib.torch import placeholder_names

    cfg = make_cfg("adagrad", lr=0.2)
    local = LocalBackend(cfg)
    fp = {"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": 0.5}
    not_ours = r"tables 'a', 'b', 'c': DistributedModelParallel did not shard this RemoteEmbeddingBagCollection " \
               r"with RemoteEmbeddingBagCollectionSharder.*add embnic.client_lib.torch.RemoteEmbeddingBagCollectionSharder"
    with one_rank_group():
        with pytest.raises(ValueError, match=not_ours):  # the case: silently ignored before
            _dmp(_Head(RemoteEmbeddingBagCollection(configs(cfg), local)), [EmbeddingBagCollectionSharder(fused_params=fp)])
        with pytest.raises(ValueError, match=not_ours):  # TorchRec's default sharders
            _dmp(_Head(RemoteEmbeddingBagCollection(configs(cfg), local)))
        model = _Head(RemoteEmbeddingBagCollection(configs(cfg), local))
        with warnings.catch_warnings():  # a plan made without our sharder, given to a DMP that has it
            warnings.simplefilter("ignore", FutureWarning)
            plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu")).collective_plan(
                model, [EmbeddingBagCollectionSharder()], dist.GroupMember.WORLD)
        with pytest.raises(ValueError, match=not_ours):
            _dmp(model, [EmbeddingBagCollectionSharder(), Ours()], plan=plan)
        for bad, msg in ((fp, r"table 'a': RemoteEmbeddingBagCollectionSharder\(fused_params=...\) of ebc asks for "
                              r"optimizer EXACT_ADAGRAD, lr 0.5, .*row-wise Adagrad"),
                         ({"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.2, "eps": 1e-6},
                          r"table 'a': .* asks for eps 1e-06")):
            with pytest.raises(ValueError, match=msg):
                _dmp(_Head(RemoteEmbeddingBagCollection(configs(cfg), local)), [Ours(fused_params=bad)])
        # our sharder's fused_params merge with apply_optimizer_in_backward's kwargs, as TorchRec's
        # (DDP kept off the placeholders: on CPU it cannot run in-backward optimizers)
        ok = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.2, "eps": 1e-8}
        head = _Head(RemoteEmbeddingBagCollection(configs(cfg), local))
        _apply_in_backward([head.ebc.embedding_bags["b"].weight], torch.optim.Adagrad, {"lr": 0.2})
        assert placeholder_names(head) == [f"ebc.embedding_bags.{n}.weight" for n in "abc"]
        dmp = _dmp(head, [Ours(fused_params=ok)],
                   data_parallel_wrapper=DefaultDataParallelWrapper(params_to_ignore=placeholder_names(head)))
        kjt = random_kjt(np.random.default_rng(32), ["f_a", "f_b", "f_c"], [60, 40, 25], 4)
        with pytest.raises(ValueError, match=r"table 'b': apply_optimizer_in_backward\(Adagrad, ...\) with fused_params "
                                             r"asks for optimizer EXACT_ADAGRAD"):
            dmp(kjt)
        assert all(len(k) == 0 for k, _, _ in local.state_dict().values())  # nothing was sent
        # matching in-backward choices train through DMP (DDP off the placeholders), merged with
        # the sharder's fused_params; no fused_params at all: the config's optimizer
        for fused in (ok, None):
            head = _Head(RemoteEmbeddingBagCollection(configs(cfg), local))
            _apply_in_backward(head.ebc.parameters(), torchrec.optim.RowWiseAdagrad, {"lr": 0.2, "eps": 1e-8})
            dmp = _dmp(head, [Ours(fused_params=fused)],
                       data_parallel_wrapper=DefaultDataParallelWrapper(params_to_ignore=placeholder_names(head)))
            dmp(kjt).sum().backward()
            assert sum(len(k) for k, _, _ in local.state_dict().values()) > 0
        head = _Head(RemoteEmbeddingBagCollection(configs(cfg), local))  # and with DDP on the placeholders
        dmp = _dmp(head, [Ours()])
        dmp(kjt).sum().backward()
    # the README's path: no DMP, a dense optimizer over every parameter (the placeholders are empty)
    head = _Head(RemoteEmbeddingBagCollection(configs(cfg), LocalBackend(cfg)))
    opt = torch.optim.SGD(head.parameters(), lr=0.05)
    before = head.top.weight.detach().clone()
    head(kjt).sum().backward()
    opt.step()
    assert not torch.equal(before, head.top.weight) and head.ebc.embedding_bags["a"].weight.shape == (0, 4)


def test_a_frozen_table_is_not_updated_and_ddp_takes_the_placeholders():
    from torch.nn.parallel import DistributedDataParallel

    cfg = make_cfg("sgd", lr=0.2)
    local = LocalBackend(cfg)
    ours = RemoteEmbeddingBagCollection(configs(cfg), local)
    ours.embedding_bags["b"].weight.requires_grad_(False)
    with one_rank_group():
        ddp = DistributedDataParallel(ours)
        for _ in range(2):  # DDP expects every parameter that requires grad to get one, each step
            ddp(random_kjt(np.random.default_rng(25), ["f_a", "f_b", "f_c"], [60, 40, 25], 8)).values().sum().backward()
    st = local.state_dict()
    assert len(st[0][0]) > 0 and len(st[1][0]) == 0 and len(st[2][0]) > 0
    assert ours.embedding_bags["a"].weight.grad.shape == (0, 4)
    ours.requires_grad_(False)  # all frozen (and no weights): no backward, no update
    out = ours(random_kjt(np.random.default_rng(26), ["f_a", "f_b", "f_c"], [60, 40, 25], 8)).values()
    assert not out.requires_grad
