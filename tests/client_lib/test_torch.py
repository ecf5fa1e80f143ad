"""embnic.client_lib.torch: RemoteEmbeddingBagCollection against TorchRec itself.

* forward equals TorchRec's ``EmbeddingBagCollection`` (same rows): sum/mean pooling, empty
  bags, per-sample weights, features shared by tables, KJTs with extra or reordered features;
* a few training steps equal TorchRec's sharded EBC with its fused fbgemm optimizer
  (``DistributedModelParallel``, one gloo rank, table-wise; ``EXACT_SGD`` and
  ``EXACT_ROWWISE_ADAGRAD``): pooled embeddings at every step within ``rtol=1e-6, atol=1e-6``
  and every row at the end within ``rtol=1e-6, atol=1e-7`` (torchref ``OUT_TOL``, ``TOL``: an
  output near zero sums rows that each differ a little; 20 weighted steps checked), rows in
  process (LocalBackend) and on UDP shards;
* ``torchrec.models.dlrm.DLRM`` accepts the module and trains; errors name the problem;
* issue 23: ``kjt_from_dense`` keeps every 64-bit id; float ids are refused (TorchRec's EBC
  refuses them too); VBE KJTs and inverse indices equal TorchRec's EBC (forward, row and weight
  gradients) or are refused by name; TorchRec's optimizer choices: tests/client_lib/test_torch_optim.py.
* issue 34: a KJT of 0 samples gives TorchRec's (0, Σ dims) output, forward and backward, and
  asks the backend nothing; ``KeyedJaggedTensor.empty()`` (float values, no features) is refused
  naming both.

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
from torchref import (TOL, TorchRecReference, all_rows, configs, make_cfg, one_rank_group, random_kjt,  # noqa: E402
                      train_both)


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
                got = all_rows(c.lookup, cfg)
                assert c.stats.rounds == 4 * 2 + 1  # one lookup and one update round per step, one read-back
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


def test_twenty_weighted_adagrad_steps_stay_within_the_stated_tolerance():
    """Issue 34 item 6: after 20 weighted-SUM row-wise-Adagrad steps the pooled outputs near zero
    differ by up to ~2.7e-7 (beyond atol 1e-7, within the README's 1e-6; train_both asserts it
    at every step) and every row stays within rtol 1e-6, atol 1e-7."""
    cfg = make_cfg("adagrad", lr=0.2)
    with one_rank_group():
        ref = TorchRecReference(cfg, configs(cfg), is_weighted=True)
        local = LocalBackend(cfg)
        ours = RemoteEmbeddingBagCollection(configs(cfg), local, is_weighted=True)
        train_both(cfg, ours, ref, np.random.default_rng(4), steps=20, weighted=True)
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


class _Spy:
    """A backend that counts what the module asks of it (and answers as ``LocalBackend``)."""

    def __init__(self, backend):
        self.backend, self.calls = backend, []
        self.cfg = backend.cfg

    def lookup_flat(self, *a):
        self.calls.append("lookup")
        return self.backend.lookup_flat(*a)

    def update_flat(self, *a):
        self.calls.append("update")
        return self.backend.update_flat(*a)

    def lookup(self, *a):
        self.calls.append("lookup")
        return self.backend.lookup(*a)

    def update(self, *a):
        self.calls.append("update")
        return self.backend.update(*a)


@pytest.mark.parametrize("case", ["sum", "mean", "weighted", "shared-feature", "extra-keys"])
def test_a_kjt_of_zero_samples_is_torchrecs_empty_output_and_sends_nothing(case):
    """Issue 34 item 3: a KJT of 0 samples (stride 0, no lengths) — TorchRec's EBC returns a
    (0, Σ dims) KeyedTensor with its keys and dims, and backward gives every table a zero
    gradient; ours returns the same, backward runs, and the backend is asked nothing."""
    cfg = make_cfg()
    feats = {"a": ["x", "y"], "b": ["y"], "c": ["z"]} if case == "shared-feature" else None
    pooling = PoolingType.MEAN if case == "mean" else PoolingType.SUM
    weighted = case == "weighted"
    confs = configs(cfg, pooling, features=feats)
    spy = _Spy(LocalBackend(cfg))
    ours = RemoteEmbeddingBagCollection(configs(cfg, pooling, features=feats), spy, is_weighted=weighted)
    ref = torchrec_ebc_with_rows(cfg, confs, weighted)
    keys = [f for c in confs for f in c.feature_names]
    keys = list(dict.fromkeys(keys)) + (["junk"] if case == "extra-keys" else [])
    w = [torch.zeros(0, requires_grad=True) for _ in range(2)] if weighted else [None, None]
    kjts = [KeyedJaggedTensor(keys=keys, values=torch.zeros(0, dtype=torch.int64),
                              lengths=torch.zeros(0, dtype=torch.int32), weights=w[i]) for i in range(2)]
    assert kjts[0].stride() == 0
    got, want = ours(kjts[0]), ref(kjts[1])
    assert got.keys() == want.keys() and got.length_per_key() == want.length_per_key()
    assert got.values().shape == want.values().shape == (0, sum(want.length_per_key()))
    assert got.values().dtype == want.values().dtype and got.values().requires_grad == want.values().requires_grad
    got.values().sum().backward()
    want.values().sum().backward()
    for c in confs:
        assert torch.count_nonzero(ref.embedding_bags[c.name].weight.grad) == 0
    if weighted:
        assert w[0].grad.shape == w[1].grad.shape == (0,)
    with torch.no_grad():
        assert ours(kjts[0]).values().shape == (0, sum(want.length_per_key()))
    assert spy.calls == [] and ours.steps_forward == 2 and ours.steps_updated == 1
    assert all(len(k) == 0 for k, _, _ in spy.backend.state_dict().values())


def test_an_empty_kjt_of_the_wrong_dtype_names_both_problems():
    """``KeyedJaggedTensor.empty()`` has float values and no keys: both are named, at once
    (TorchRec's EBC fails on it with a bare KeyError of the first feature)."""
    cfg = make_cfg()
    ours = RemoteEmbeddingBagCollection(configs(cfg), LocalBackend(cfg))
    with pytest.raises(KeyError):
        torchrec_ebc_with_rows(cfg, configs(cfg))(KeyedJaggedTensor.empty())
    with pytest.raises(ValueError, match=r"values must be integer ids .* got torch.float32.*; and KeyedJaggedTensor "
                                         r"lacks feature\(s\) \['f_a', 'f_b', 'f_c'\] \(has \[\]\)"):
        ours(KeyedJaggedTensor.empty())
    with pytest.raises(ValueError, match=r"^KeyedJaggedTensor lacks feature\(s\) \['f_a', 'f_b', 'f_c'\]"):
        ours(KeyedJaggedTensor.empty(values_dtype=torch.int64))
    assert ours.steps_forward == 0


def test_dlrm_accepts_it_and_trains():
    from torchrec.models.dlrm import DLRM

    cfg = make_cfg("adagrad", tables=tuple((f"C{i + 1}", 50, 8) for i in range(4)))
    local = LocalBackend(cfg)
    ebc = RemoteEmbeddingBagCollection.from_cluster(local)
    torch.manual_seed(0)
    model = DLRM(embedding_bag_collection=ebc, dense_in_features=13, dense_arch_layer_sizes=[16, 8],
                 over_arch_layer_sizes=[16, 1])
    tabs = {n: p for n, p in model.named_parameters() if "embedding_bags" in n}
    assert sorted(tabs) == [f"sparse_arch.embedding_bag_collection.embedding_bags.C{i + 1}.weight" for i in range(4)]
    assert all(p.shape == (0, 8) for p in tabs.values())  # TorchRec's names, no rows: they live on the shards
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rng = np.random.default_rng(8)
    ids = rng.integers(0, 50, (32, 4))
    kjt = kjt_from_dense([f"C{i + 1}" for i in range(4)], ids)
    dense = torch.from_numpy(rng.standard_normal((32, 13)).astype(np.float32))
    labels = torch.from_numpy(rng.integers(0, 2, 32).astype(np.float32))
    before = local.lookup({0: np.unique(ids[:, 0]).astype(np.uint64)})[0].copy()
    losses = []
    for _ in range(3):
        opt.zero_grad()
        logits = model(dense, kjt).squeeze(1)
        assert logits.shape == (32,)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    after = local.lookup({0: np.unique(ids[:, 0]).astype(np.uint64)})[0]
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
    want = local.lookup({0: ids[:, 0]})[0]
    torch.testing.assert_close(out, torch.from_numpy(want), rtol=0, atol=0)
    out.sum().backward()  # d/d(row) = number of occurrences; SGD lr 0.5
    keys, rows, _ = local.state_dict()[0]
    assert keys.tolist() == [7, 2**63 + 5, 2**64 - 1]
    uniq = np.array([7, 2**63 + 5, 2**64 - 1], dtype=np.uint64)
    expect = init_rows(cfg.seed, 0, uniq, 4, cfg.table(0).init_scale) - np.float32(0.5) * np.array([[1], [2], [1]], np.float32)
    np.testing.assert_array_equal(rows, expect)
    assert ours.ids == 4 and ours.unique_ids == 3


# ---- issue 23: inputs TorchRec refuses or handles, VBE -------------------------------------

def test_kjt_from_dense_keeps_every_64_bit_id():
    import warnings

    cfg = parse_config({
        "cluster": {"seed": 3}, "tables": [{"id": 0, "name": "a", "dim": 4, "optimizer": "sgd", "lr": 0.5}],
        "shards": [{"id": 0, "ip": "127.0.0.1", "port": 7950}], "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7960}]})
    ids = [[0], [2**31], [2**32 + 1], [2**48], [2**63], [2**64 - 1]]  # numpy 2 makes this list float64
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning of a float round trip either
        kjt = kjt_from_dense(["a"], ids)
    assert kjt.values().numpy().view(np.uint64).tolist() == [i[0] for i in ids]
    local = LocalBackend(cfg)
    out = RemoteEmbeddingBagCollection.from_cluster(local)(kjt).values()
    want = local.lookup({0: np.array([i[0] for i in ids], np.uint64)})[0]  # the exact rows, 2**64-1's too
    torch.testing.assert_close(out, torch.from_numpy(want), rtol=0, atol=0)
    assert not torch.equal(out[4], out[5])
    with pytest.raises(ValueError, match=r"ids must be \(B, F=1\), got shape \(6,\).*one column per key"):
        kjt_from_dense(["a"], [0, 2**31, 2**32 + 1, 2**48, 2**63, 2**64 - 1])
    with pytest.raises(ValueError, match=r"ids must be \(B, F=2\)"):
        kjt_from_dense(["a", "b"], ids)
    for bad, msg in (([[2**64]], "id 18446744073709551616"), ([[-1]], "negative id -1"), ([[1.5]], "integers")):
        with pytest.raises(ValueError, match=msg):
            kjt_from_dense(["a"], bad)
    with pytest.raises(ValueError, match=r"weights shape \(1, 6\), expected \(B, F\) = \(6, 1\)"):
        kjt_from_dense(["a"], ids, weights=np.ones((1, 6)))


def test_float_values_are_refused_as_torchrec_refuses_them():
    cfg = make_cfg()
    confs = configs(cfg)
    kjt = KeyedJaggedTensor(keys=["f_a", "f_b", "f_c"], values=torch.tensor([1.7, 2.2, 3.0]),
                            lengths=torch.tensor([1, 1, 1]), stride=1)
    with pytest.raises(RuntimeError):  # TorchRec's EBC: nn.EmbeddingBag takes Long/Int indices only
        torchrec_ebc_with_rows(cfg, confs)(kjt)
    ours = RemoteEmbeddingBagCollection(configs(cfg), LocalBackend(cfg))
    with pytest.raises(ValueError, match=r"values must be integer ids .* got torch.float32"):
        ours(kjt)
    with pytest.raises(ValueError, match=r"got torch.bool"):
        ours(KeyedJaggedTensor(keys=["f_a", "f_b", "f_c"], values=torch.tensor([True, False, True]),
                               lengths=torch.tensor([1, 1, 1]), stride=1))
    assert ours.steps_forward == 0 and ours.ids == 0  # refused before any lookup


def vbe_kjt(rng, keys, limits, strides_per_rank, b, weighted=False):
    """A VBE KJT: feature f has Σ_r strides_per_rank[f][r] bags; inverse_indices (F, b)."""
    strides = [sum(s) for s in strides_per_rank]
    lengths = rng.integers(0, 4, sum(strides))
    starts = np.cumsum([0] + strides)
    per_feat = [int(lengths[starts[f]:starts[f + 1]].sum()) for f in range(len(keys))]
    values = np.concatenate([rng.integers(0, lim, n) for lim, n in zip(limits, per_feat)])
    inv = np.stack([rng.integers(0, s, b) for s in strides])
    w = torch.from_numpy(rng.uniform(0.5, 2.0, values.size).astype(np.float32)) if weighted else None
    return KeyedJaggedTensor(keys=list(keys), values=torch.from_numpy(values.astype(np.int64)),
                             lengths=torch.from_numpy(lengths.astype(np.int32)), weights=w,
                             stride_per_key_per_rank=strides_per_rank,
                             inverse_indices=(list(keys), torch.from_numpy(inv.astype(np.int64))))


@pytest.mark.parametrize("pooling,weighted", [(PoolingType.SUM, False), (PoolingType.MEAN, False),
                                              (PoolingType.SUM, True)])
def test_vbe_equals_torchrec_ebc_forward_and_gradients(pooling, weighted):
    cfg = make_cfg("sgd", lr=1.0)
    confs = configs(cfg, pooling)
    local = LocalBackend(cfg)
    ours = RemoteEmbeddingBagCollection(configs(cfg, pooling), local, is_weighted=weighted)
    ref = torchrec_ebc_with_rows(cfg, confs, weighted)
    rng = np.random.default_rng(27)
    kjt = vbe_kjt(rng, ["f_a", "f_b", "f_c"], [60, 40, 25], [[3, 2], [4, 1], [1, 1]], 6, weighted)
    assert kjt.variable_stride_per_key()
    k1, k2 = kjt, kjt
    if weighted:
        w1, w2 = kjt.weights().clone().requires_grad_(), kjt.weights().clone().requires_grad_()
        kw = dict(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(),
                  stride_per_key_per_rank=kjt.stride_per_key_per_rank(), inverse_indices=kjt.inverse_indices())
        k1, k2 = KeyedJaggedTensor(weights=w1, **kw), KeyedJaggedTensor(weights=w2, **kw)
    got, want = ours(k1), ref(k2)
    assert got.keys() == want.keys() and got.values().shape == want.values().shape == (6, 12)
    torch.testing.assert_close(got.values(), want.values(), **TOL)
    up = torch.from_numpy(rng.standard_normal((6, 12)).astype(np.float32))
    (got.values() * up).sum().backward()
    (want.values() * up).sum().backward()
    for c in confs:  # SGD lr 1 on the shards: rows = initial - grad, TorchRec's dense grad
        t = cfg.tables[ord(c.name) - ord("a")]
        init = torch.from_numpy(init_rows(cfg.seed, t.id, np.arange(t.rows, dtype=np.uint64), t.dim, t.init_scale))
        rows = torch.from_numpy(local.lookup({t.id: np.arange(t.rows, dtype=np.uint64)})[t.id])
        torch.testing.assert_close(rows, init - ref.embedding_bags[c.name].weight.grad, **TOL)
    if weighted:
        torch.testing.assert_close(w1.grad, w2.grad, **TOL)


def test_vbe_without_inverse_indices_is_refused_by_name_unless_the_strides_agree():
    cfg = make_cfg()
    ours = RemoteEmbeddingBagCollection(configs(cfg), LocalBackend(cfg))
    kjt = vbe_kjt(np.random.default_rng(28), ["f_a", "f_b", "f_c"], [60, 40, 25], [[2], [3], [1]], 4)
    bare = KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(),
                             stride_per_key_per_rank=kjt.stride_per_key_per_rank())
    with pytest.raises(ValueError, match=r"variable batch size per feature \(VBE KeyedJaggedTensor, "
                                         r"stride_per_key_per_rank\) without inverse_indices: .* \[2, 3, 1\] bags"):
        ours(bare)
    same = vbe_kjt(np.random.default_rng(29), ["f_a", "f_b", "f_c"], [60, 40, 25], [[2, 1], [1, 2], [2, 1]], 4)
    plain = KeyedJaggedTensor(keys=same.keys(), values=same.values(), lengths=same.lengths(),
                              stride_per_key_per_rank=same.stride_per_key_per_rank())
    ref = torchrec_ebc_with_rows(cfg, configs(cfg))
    torch.testing.assert_close(ours(plain).values(), ref(plain).values(), **TOL)  # 3 bags each: TorchRec takes it
    bad = KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(),
                            stride_per_key_per_rank=kjt.stride_per_key_per_rank(),
                            inverse_indices=(kjt.keys(), torch.tensor([[0, 1, 2, 0], [0, 0, 0, 0], [0, 0, 0, 0]])))
    with pytest.raises(ValueError, match=r"inverse_indices\['f_a'\]\[2\] = 2 outside the feature's 2 bags"):
        ours(bad)


def test_inverse_indices_on_a_fixed_stride_kjt_expand_the_output_as_torchrec():
    cfg = make_cfg()
    ours = RemoteEmbeddingBagCollection(configs(cfg), LocalBackend(cfg))
    ref = torchrec_ebc_with_rows(cfg, configs(cfg))
    kjt = random_kjt(np.random.default_rng(30), ["f_a", "f_b", "f_c"], [60, 40, 25], 3)
    inv = torch.tensor([[0, 2, 2, 1, 0], [1, 1, 0, 2, 2], [2, 0, 1, 1, 0]])
    k = KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(), stride=3,
                          inverse_indices=(kjt.keys(), inv))
    assert not k.variable_stride_per_key()
    got, want = ours(k).values(), ref(k).values()
    assert got.shape == want.shape == (5, 12)
    torch.testing.assert_close(got, want, **TOL)
