"""embnic.client_lib.torch: RemoteEmbeddingBagCollection against TorchRec itself.

* forward equals TorchRec's ``EmbeddingBagCollection`` (same rows): sum/mean pooling, empty
  bags, per-sample weights, features shared by tables, KJTs with extra or reordered features;
* a few training steps equal TorchRec's sharded EBC with its fused fbgemm optimizer
  (``DistributedModelParallel``, one gloo rank, table-wise; ``EXACT_SGD`` and
  ``EXACT_ROWWISE_ADAGRAD``) within ``assert_close(rtol=1e-6, atol=1e-7)``: pooled embeddings
  at every step and every row at the end, rows in process (LocalBackend) and on UDP shards;
* ``torchrec.models.dlrm.DLRM`` accepts the module and trains; errors name the problem.

The same comparison through the card: tests/testbed/test_torch_card.py.
Run alone: python3 -m pytest -q tests/client_lib/test_torch.py   (needs the embnic[torch] extra)
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchrec = pytest.importorskip("torchrec")

from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor  # noqa: E402
from torchrec.modules.embedding_configs import PoolingType  # noqa: E402

from embnic.client_lib import batch as batch_mod  # noqa: E402
from embnic.client_lib.client import EmbeddingClient  # noqa: E402
from embnic.client_lib.config import parse_config  # noqa: E402
from embnic.client_lib.local import LocalBackend  # noqa: E402
from embnic.client_lib.table_numerics import init_rows  # noqa: E402
from embnic.client_lib.torch import RemoteEmbeddingBagCollection, kjt_from_dense  # noqa: E402
from embnic.testbed.server.runner import ServerCluster  # noqa: E402
from torchref import TOL, TorchRecReference, all_rows, configs, one_rank_group, random_kjt, train_both  # noqa: E402


def make_cfg(optimizer="adagrad", lr=0.1, shards=2, tables=(("a", 60, 4), ("b", 40, 4), ("c", 25, 4))):
    return parse_config({
        "cluster": {"seed": 11, "sharding": "hash", "timeout_ms": 200, "retries": 10},
        "tables": [{"id": i, "name": n, "rows": r, "dim": d, "optimizer": optimizer, "lr": lr, "eps": 1e-8,
                    "init_scale": 0.5} for i, (n, r, d) in enumerate(tables)],
        "shards": [{"id": i, "ip": "127.0.0.1", "port": 7950 + i} for i in range(shards)],
        "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7960}],
    })


def torchrec_ebc_with_rows(cfg, confs, is_weighted=False):
    """TorchRec's unsharded EBC whose rows are embnic's initial rows."""
    ebc = EmbeddingBagCollection(tables=confs, is_weighted=is_weighted)
    by_name = {t.name: t for t in cfg.tables}
    with torch.no_grad():
        for c in confs:
            t = by_name[c.name]
            ebc.embedding_bags[c.name].weight.copy_(torch.from_numpy(
                init_rows(cfg.seed, t.id, np.arange(t.rows, dtype=np.uint64), t.dim, t.init_scale)))
    return ebc


# ---- forward against TorchRec's EmbeddingBagCollection ------------------------------------

@pytest.mark.parametrize("pooling,weighted", [(PoolingType.SUM, False), (PoolingType.MEAN, False),
                                              (PoolingType.SUM, True)])  # weights need sum pooling
def test_forward_equals_torchrec_ebc(pooling, weighted):
    cfg = make_cfg()
    confs = configs(cfg, pooling)
    ours = RemoteEmbeddingBagCollection(configs(cfg, pooling), LocalBackend(cfg), is_weighted=weighted)
    ref = torchrec_ebc_with_rows(cfg, confs, weighted)
    rng = np.random.default_rng(1)
    keys = [c.feature_names[0] for c in confs]
    for b in (1, 7, 64):
        kjt = random_kjt(rng, keys, [c.num_embeddings for c in confs], b, weighted)
        got, want = ours(kjt), ref(kjt)
        assert got.keys() == want.keys() and got.length_per_key() == want.length_per_key()
        assert got.values().shape == (b, 12)
        torch.testing.assert_close(got.values(), want.values(), **TOL)
        # an empty bag pools to 0
        empty = kjt.lengths().reshape(3, b) == 0
        for f in range(3):
            assert torch.all(got.values()[empty[f], 4 * f:4 * f + 4] == 0)


def test_shared_feature_extra_and_reordered_keys_int32_values():
    cfg = make_cfg()
    feats = {"a": ["x", "y"], "b": ["y"], "c": ["z"]}  # y feeds two tables: "y@a", "y@b"
    confs = configs(cfg, features=feats)
    ours = RemoteEmbeddingBagCollection(configs(cfg, features=feats), LocalBackend(cfg))
    ref = torchrec_ebc_with_rows(cfg, confs)
    rng = np.random.default_rng(2)
    kjt = random_kjt(rng, ["z", "junk", "y", "x"], [25, 1000, 40, 40], 9)
    kjt = KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values().to(torch.int32), lengths=kjt.lengths(), stride=9)
    got, want = ours(kjt), ref(kjt)
    assert got.keys() == ["x", "y@a", "y@b", "z"] == want.keys()
    torch.testing.assert_close(got.values(), want.values(), **TOL)


def test_batch_prep_gets_the_kjt_values_without_a_copy(monkeypatch):
    cfg = make_cfg()
    ours = RemoteEmbeddingBagCollection(configs(cfg), LocalBackend(cfg))
    seen = []
    real = batch_mod.prepare_batch

    def spy(batch, ftab, **kw):
        seen.append(batch)
        return real(batch, ftab, **kw)

    monkeypatch.setattr("embnic.client_lib.torch.prepare_batch", spy)
    kjt = random_kjt(np.random.default_rng(3), ["f_a", "f_b", "f_c"], [60, 40, 25], 16)
    ours(kjt)
    v = seen[0].values
    assert v.dtype == np.uint64 and np.shares_memory(v, kjt.values().numpy())


# ---- training against TorchRec's fused optimizer (DMP, fbgemm) ----------------------------

@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
@pytest.mark.parametrize("where", ["in-process", "udp-shards"])
def test_training_equals_torchrec_fused_optimizer(optimizer, pooling, where):
    cfg = make_cfg(optimizer, lr=0.2)
    rng = np.random.default_rng(4)
    with one_rank_group():
        ref = TorchRecReference(cfg, configs(cfg, pooling))
        assert ref.sharding_types() == {"table_wise"}
        if where == "in-process":
            local = LocalBackend(cfg)
            ours = RemoteEmbeddingBagCollection(configs(cfg, pooling), local)
            train_both(cfg, ours, ref, rng)
            got = all_rows(local.lookup, cfg)
            assert sum(len(k) for k, _, _ in local.state_dict().values()) > 0
        else:
            with ServerCluster(cfg) as cl, EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0)) as c:
                ours = RemoteEmbeddingBagCollection(configs(cfg, pooling), c)
                train_both(cfg, ours, ref, rng)
                got = all_rows(lambda t, k: c.lookup({t: k})[t], cfg)
                assert c.stats.rounds == 4 * 2 + 3  # one lookup and one update round per step
        for name, rows in got.items():
            torch.testing.assert_close(rows, ref.weight(name), **TOL)
            assert not torch.equal(rows, torch.from_numpy(init_rows(
                cfg.seed, cfg.tables[ord(name) - ord("a")].id, np.arange(rows.shape[0], dtype=np.uint64), 4, 0.5)))


def test_weighted_training_equals_torchrec():
    cfg = make_cfg("adagrad", lr=0.2)
    with one_rank_group():
        ref = TorchRecReference(cfg, configs(cfg), is_weighted=True)
        local = LocalBackend(cfg)
        ours = RemoteEmbeddingBagCollection(configs(cfg), local, is_weighted=True)
        train_both(cfg, ours, ref, np.random.default_rng(5), weighted=True)
        for name, rows in all_rows(local.lookup, cfg).items():
            torch.testing.assert_close(rows, ref.weight(name), **TOL)


def test_weight_gradient_equals_torch_embedding_bag():
    cfg = make_cfg()
    local = LocalBackend(cfg)
    confs = configs(cfg)
    ours = RemoteEmbeddingBagCollection(configs(cfg), local, is_weighted=True)
    ref = torchrec_ebc_with_rows(cfg, confs, is_weighted=True)
    kjt = random_kjt(np.random.default_rng(6), ["f_a", "f_b", "f_c"], [60, 40, 25], 8, weighted=True)
    w1 = kjt.weights().clone().requires_grad_()
    w2 = kjt.weights().clone().requires_grad_()
    k1 = KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(), weights=w1, stride=8)
    k2 = KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(), weights=w2, stride=8)
    up = torch.randn(8, 12)
    (ours(k1).values() * up).sum().backward()
    (ref(k2).values() * up).sum().backward()
    torch.testing.assert_close(w1.grad, w2.grad, **TOL)


# ---- behaviour ----------------------------------------------------------------------------

def test_no_grad_forward_sends_no_update_and_empty_batch_is_zero():
    cfg = make_cfg()
    local = LocalBackend(cfg)
    ours = RemoteEmbeddingBagCollection.from_cluster(local)
    kjt = random_kjt(np.random.default_rng(7), ["a", "b", "c"], [60, 40, 25], 16)
    with torch.no_grad():
        out = ours(kjt).values()
    assert not out.requires_grad
    assert all(len(k) == 0 for k, _, _ in local.state_dict().values())
    empty = KeyedJaggedTensor(keys=["a", "b", "c"], values=torch.zeros(0, dtype=torch.int64),
                              lengths=torch.zeros(3 * 5, dtype=torch.int32), stride=5)
    out = ours(empty).values()
    assert out.shape == (5, 12) and torch.all(out == 0)
    out.sum().backward()  # nothing to update: no round at all
    assert all(len(k) == 0 for k, _, _ in local.state_dict().values())
    assert ours.steps_updated == 1


def test_dlrm_accepts_it_and_trains():
    from torchrec.models.dlrm import DLRM

    cfg = make_cfg("adagrad", tables=tuple((f"C{i + 1}", 50, 8) for i in range(4)))
    local = LocalBackend(cfg)
    ebc = RemoteEmbeddingBagCollection.from_cluster(local)
    torch.manual_seed(0)
    model = DLRM(embedding_bag_collection=ebc, dense_in_features=13, dense_arch_layer_sizes=[16, 8],
                 over_arch_layer_sizes=[16, 1])
    names = [n for n, _ in model.named_parameters()]
    assert names and not any("embedding" in n for n in names)  # the tables live on the shards
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rng = np.random.default_rng(8)
    ids = rng.integers(0, 50, (32, 4))
    kjt = kjt_from_dense([f"C{i + 1}" for i in range(4)], ids)
    dense = torch.from_numpy(rng.standard_normal((32, 13)).astype(np.float32))
    labels = torch.from_numpy(rng.integers(0, 2, 32).astype(np.float32))
    before = local.lookup(0, np.unique(ids[:, 0]).astype(np.uint64)).copy()
    losses = []
    for _ in range(3):
        opt.zero_grad()
        logits = model(dense, kjt).squeeze(1)
        assert logits.shape == (32,)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    after = local.lookup(0, np.unique(ids[:, 0]).astype(np.uint64))
    assert not np.array_equal(before, after) and np.isfinite(after).all()
    assert losses[-1] < losses[0]
    assert ebc.steps_updated == 3


def test_errors_name_the_problem():
    cfg = make_cfg()
    local = LocalBackend(cfg)
    with pytest.raises(ValueError, match="'nope' is not in the cluster config"):
        RemoteEmbeddingBagCollection([EmbeddingBagConfig(name="nope", embedding_dim=4, num_embeddings=60,
                                                         feature_names=["f"])], local)
    with pytest.raises(ValueError, match="embedding_dim 8 but cluster table 0 has dim 4"):
        RemoteEmbeddingBagCollection([EmbeddingBagConfig(name="a", embedding_dim=8, num_embeddings=60,
                                                         feature_names=["f"])], local)
    with pytest.raises(ValueError, match="num_embeddings 61 but cluster table 0 has rows 60"):
        RemoteEmbeddingBagCollection([EmbeddingBagConfig(name="a", embedding_dim=4, num_embeddings=61,
                                                         feature_names=["f"])], local)
    with pytest.raises(ValueError, match="per-sample weights need SUM"):
        RemoteEmbeddingBagCollection(configs(cfg, PoolingType.MEAN), local, is_weighted=True)
    ours = RemoteEmbeddingBagCollection(configs(cfg), local)
    kjt = random_kjt(np.random.default_rng(9), ["f_a", "f_b"], [60, 40], 4)
    with pytest.raises(ValueError, match=r"lacks feature\(s\) \['f_c'\]"):
        ours(kjt)
    bad = KeyedJaggedTensor(keys=["f_a", "f_b", "f_c"], values=torch.tensor([1, 2, 40]),
                            lengths=torch.tensor([1, 1, 1]), stride=1)
    with pytest.raises(ValueError, match=r"feature 'f_b': id 2|feature 'f_c': id 40 outside \[0, num_embeddings=25\)"):
        ours(bad)
    neg = KeyedJaggedTensor(keys=["f_a", "f_b", "f_c"], values=torch.tensor([1, -2, 4]),
                            lengths=torch.tensor([1, 1, 1]), stride=1)
    with pytest.raises(ValueError, match=r"feature 'f_b': id -2 outside"):
        ours(neg)
    w = RemoteEmbeddingBagCollection(configs(cfg), local, is_weighted=True)
    with pytest.raises(ValueError, match="has no weights"):
        w(random_kjt(np.random.default_rng(9), ["f_a", "f_b", "f_c"], [60, 40, 25], 4))


def test_table_without_rows_takes_full_64_bit_ids():
    cfg = parse_config({
        "cluster": {"seed": 3}, "tables": [{"id": 0, "name": "u", "dim": 4, "optimizer": "sgd", "lr": 0.5}],
        "shards": [{"id": 0, "ip": "127.0.0.1", "port": 7950}], "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7960}]})
    local = LocalBackend(cfg)
    ours = RemoteEmbeddingBagCollection.from_cluster(local)
    ids = np.array([[2**64 - 1], [2**63 + 5], [7], [2**63 + 5]], dtype=np.uint64)
    out = ours(kjt_from_dense(["u"], ids)).values()
    want = local.lookup(0, ids[:, 0])
    torch.testing.assert_close(out, torch.from_numpy(want), rtol=0, atol=0)
    out.sum().backward()  # d/d(row) = number of occurrences; SGD lr 0.5
    keys, rows, _ = local.state_dict()[0]
    assert keys.tolist() == [7, 2**63 + 5, 2**64 - 1]
    uniq = np.array([7, 2**63 + 5, 2**64 - 1], dtype=np.uint64)
    expect = init_rows(cfg.seed, 0, uniq, 4, cfg.table(0).init_scale) - np.float32(0.5) * np.array([[1], [2], [1]], np.float32)
    np.testing.assert_array_equal(rows, expect)
    assert ours.ids == 4 and ours.unique_ids == 3
