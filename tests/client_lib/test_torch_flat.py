"""RemoteEmbeddingBagCollection pools and trains every table at once (one ``embedding_bag`` per
pooling mode, one ``index_add_``, one flat lookup and update round); checked bit for bit against
the per-table computation it replaced (:func:`pool_per_table`, :func:`backward_per_table`: one
``embedding_bag`` and one ``index_add_`` per table) on tables of mixed dims and pooling modes,
features shared by tables and listed out of table order, module tables out of id order, empty
bags, per-sample weights and a frozen table.

Run alone: python3 -m pytest -q tests/client_lib/test_torch_flat.py   (needs the embnic[torch] extra)
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

import torch.nn.functional as F  # noqa: E402
from torchrec import EmbeddingBagConfig  # noqa: E402
from torchrec.modules.embedding_configs import PoolingType  # noqa: E402

from embnic.client_lib.batch import KeyedJaggedBatch, prepare_batch  # noqa: E402
from embnic.client_lib.config import parse_config  # noqa: E402
from embnic.client_lib.local import LocalBackend  # noqa: E402
from embnic.client_lib.torch import RemoteEmbeddingBagCollection  # noqa: E402
from torchref import random_kjt  # noqa: E402

SUM, MEAN = PoolingType.SUM, PoolingType.MEAN


def make(dims_modes, features, weighted=False, order=None):
    """Cluster tables t0.. of the given (dim, pooling), module tables in ``order`` of them."""
    cfg = parse_config({"cluster": {"seed": 4}, "tables": [
        {"id": 10 + i, "name": f"t{i}", "rows": 50 + 7 * i, "dim": d, "optimizer": "adagrad", "lr": 0.1,
         "init_scale": 0.5} for i, (d, _) in enumerate(dims_modes)],
        "shards": [{"id": 0, "ip": "127.0.0.1", "port": 7950}], "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7960}]})
    order = order or list(range(len(dims_modes)))
    confs = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=dims_modes[i][0], num_embeddings=50 + 7 * i,
                                feature_names=features[i], pooling=dims_modes[i][1]) for i in order]
    backend = Recorder(cfg)
    return cfg, backend, RemoteEmbeddingBagCollection(confs, backend, is_weighted=weighted)


class Recorder(LocalBackend):
    """LocalBackend that keeps every update it applies: ``{table_id: (keys, grads (N, dim))}``."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.seen: dict = {}

    def update_flat(self, table_ids, counts, keys, grads):
        dims = [self.cfg.table(t).dim for t in np.asarray(table_ids).tolist()]
        ko = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        vo = np.concatenate([[0], np.cumsum(np.asarray(counts) * dims)]).astype(int)
        for i, t in enumerate(np.asarray(table_ids).tolist()):
            self.seen[t] = (np.array(keys[ko[i]:ko[i + 1]]), np.array(grads[vo[i]:vo[i + 1]]).reshape(-1, dims[i]))
        super().update_flat(table_ids, counts, keys, grads)


def pool_per_table(ebc, prep, rows, weights, b, starts):
    """The per-table pooling (one embedding_bag per table) the module used before."""
    out = torch.empty((b, int(ebc._col[-1])), dtype=torch.float32)
    for t, p in prep.tables.items():
        dim, nf = ebc._dim[t], len(p.features)
        r = torch.from_numpy(np.asarray(rows[t], dtype=np.float32))
        psw = None if weights is None else weights.detach()[torch.arange(int(starts[p.features[0]]),
                                                                          int(starts[p.features[-1] + 1]))]
        if len(p.unique):
            pooled = F.embedding_bag(torch.from_numpy(p.inverse), r, torch.from_numpy(p.offsets),
                                     mode=ebc._mode[t], per_sample_weights=psw, include_last_offset=True)
        else:
            pooled = torch.zeros((nf * b, dim), dtype=torch.float32)
        c0 = int(ebc._col[p.features[0]])
        out[:, c0:c0 + nf * dim] = pooled.reshape(nf, b, dim).permute(1, 0, 2).reshape(b, nf * dim)
    return out


def backward_per_table(ebc, prep, rows, weights, b, starts, grad_out, trained):
    """The per-table backward the module used before: ({table: (keys, grads)}, weight gradient)."""
    updates = {}
    g_w = torch.zeros_like(weights) if weights is not None else None
    for t, p in prep.tables.items():
        if not len(p.unique):
            continue
        dim, nf = ebc._dim[t], len(p.features)
        c0 = int(ebc._col[p.features[0]])
        g_bags = grad_out[:, c0:c0 + nf * dim].reshape(b, nf, dim).permute(1, 0, 2).reshape(nf * b, dim)
        lens = torch.from_numpy(p.lengths)
        bag_of_id = torch.from_numpy(np.repeat(np.arange(nf * b, dtype=np.int64), p.lengths))
        g_ids = g_bags[bag_of_id]
        if ebc._mode[t] == "mean":
            g_ids = g_ids / lens.clamp(min=1).to(torch.float32)[bag_of_id, None]
        inverse = torch.from_numpy(p.inverse)
        if weights is not None:
            pos = torch.arange(int(starts[p.features[0]]), int(starts[p.features[-1] + 1]))
            r = torch.from_numpy(np.asarray(rows[t], dtype=np.float32))
            g_w[pos] = (g_ids * r[inverse]).sum(dim=1)
            g_ids = g_ids * weights.detach()[pos, None]
        if t in trained:
            g_rows = torch.zeros((len(p.unique), dim), dtype=torch.float32).index_add_(0, inverse, g_ids)
            updates[t] = (p.unique, g_rows.numpy())
    return updates, g_w


CASES = {
    "mixed dims and modes, shared feature": dict(
        dims_modes=[(4, SUM), (8, MEAN), (3, SUM), (8, SUM)],
        features=[["x", "y"], ["y"], ["z"], ["w", "v"]], order=[2, 0, 3, 1]),
    "one dim, features out of table order": dict(
        dims_modes=[(8, SUM), (8, SUM), (8, SUM)], features=[["a"], ["b", "c"], ["d"]], order=[1, 2, 0]),
    "weighted, mixed dims": dict(
        dims_modes=[(4, SUM), (16, SUM), (2, SUM)], features=[["x", "y"], ["z"], ["w"]], order=[1, 0, 2],
        weighted=True),
    "one dim, config order (the fast path)": dict(
        dims_modes=[(8, SUM), (8, SUM), (8, SUM)], features=[["a"], ["b"], ["c"]]),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("b", [1, 9, 64])
def test_every_table_at_once_equals_per_table_bit_for_bit(case, b):
    spec = dict(CASES[case])
    weighted = spec.pop("weighted", False)
    cfg, backend, ebc = make(**spec, weighted=weighted)
    rng = np.random.default_rng(b)
    keys = ebc._slot_features
    limits = ebc._slot_limit.tolist()
    frozen = ebc._configs[-1].name if case.startswith("mixed") else None
    if frozen:
        ebc.embedding_bags[frozen].weight.requires_grad_(False)
    for _ in range(3):
        # an extra feature the module ignores (not with weights that need a gradient: fbgemm's
        # permute backward cannot drop a key), the KJT's keys in another order
        extra = [] if weighted else ["extra"]
        kjt = random_kjt(rng, extra + keys[::-1], [5] * len(extra) + limits[::-1], b, weighted)
        if weighted:
            kjt.weights().requires_grad_(True)
        sel = ebc._select(kjt)
        vals = sel.values().numpy().view(np.uint64)
        lens = sel.lengths().numpy()
        prep = prepare_batch(KeyedJaggedBatch(list(keys), vals, lens, b), ebc._slot_tables)
        rows = {t: backend.lookup({t: p.unique})[t] for t, p in prep.tables.items()}
        starts = np.concatenate([[0], np.cumsum(lens.reshape(len(keys), b).sum(axis=1))])
        w = sel.weights() if weighted else None
        want = pool_per_table(ebc, prep, rows, w, b, starts)
        got = ebc(kjt).values()
        assert torch.equal(got, want)
        up = torch.from_numpy(rng.standard_normal(got.shape).astype(np.float32))
        trained = {tid for c, tid in zip(ebc._configs, ebc._table_ids) if c.name != frozen}
        want_upd, want_gw = backward_per_table(ebc, prep, rows, w, b, starts, up, trained)
        backend.seen.clear()
        (got * up).sum().backward()
        assert set(backend.seen) == set(want_upd)
        for t, (k, g) in want_upd.items():
            assert np.array_equal(backend.seen[t][0], k) and np.array_equal(backend.seen[t][1], g), t
        if weighted:
            gw = kjt.weights().grad
            # the KJT's weights in slot order: the module's gradient went through its permute
            assert gw is not None
            got_gw = ebc._select(KeyedJaggedTensor_like(kjt, gw)).weights()
            assert torch.equal(got_gw, want_gw)
            kjt.weights().grad = None


def KeyedJaggedTensor_like(kjt, weights):
    from torchrec import KeyedJaggedTensor

    return KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(), weights=weights,
                             stride=kjt.stride())
