"""TorchRec's DLRM on Criteo with its embedding tables on the shards (``--model dlrm``).

The model is ``torchrec.models.dlrm.DLRM`` (Naumov et al., "Deep Learning Recommendation
Model for Personalization and Recommendation Systems", 2019): the 13 dense features through the
bottom MLP (13 → 64 → D), the 26 sparse features ``C1..C26`` as one KJT (one id per bag, sum
pooling) through an :class:`~embnic.client_lib.torch.RemoteEmbeddingBagCollection` (looked up
from the backend, updated there by the table's optimizer in backward), dot interaction and the
top MLP (→ 64 → 1) to a logit; binary cross-entropy with logits, averaged over the batch.

The dense parameters train here with ``torch.optim.SGD`` from ``torch.manual_seed(seed)``, so
two runs with the same seed, data and rows compute the same floats (the in-process reference and
the run through the card). Batches are taken as in :func:`embnic.testbed.training.train.train`.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

# first: without the torch extra this raises the ImportError that says what to install
from embnic.client_lib.torch import RemoteEmbeddingBagCollection, kjt_from_dense, num_embeddings  # isort: skip

import torch
from torchrec.models.dlrm import DLRM
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from embnic.client_lib.config import ClusterConfig

from .criteo import feature_tables
from .result import TrainResult

DENSE_HIDDEN = 64  #: width of the hidden layer of the bottom and the top MLP


def table_configs(cfg: ClusterConfig, n_sparse: int) -> tuple[list[EmbeddingBagConfig], dict[str, int], int]:
    """The DLRM's tables: one ``EmbeddingBagConfig`` per cluster table a feature reads.

    Feature ``C{j+1}`` reads table :func:`~embnic.testbed.training.criteo.feature_tables` gives it; a
    table read by several features gets one ``EmbeddingBagConfig`` listing them all.

    Returns:
        (configs, ``{config name: cluster table id}``, the embedding dim D).

    Raises:
        ValueError: the tables' dims differ (DLRM's interaction needs one D).
    """
    ftab = feature_tables(cfg, n_sparse)
    dims = {cfg.table(t).dim for t in ftab}
    if len(dims) != 1:
        raise ValueError(f"DLRM needs one embedding dim for every table, got {sorted(dims)}")
    dim = dims.pop()
    order = list(dict.fromkeys(ftab))
    confs = [EmbeddingBagConfig(name=cfg.table(t).name, embedding_dim=dim, num_embeddings=num_embeddings(cfg.table(t)),
                                feature_names=[f"C{j + 1}" for j in range(n_sparse) if ftab[j] == t])
             for t in order]
    return confs, {cfg.table(t).name: t for t in order}, dim


def build_model(cfg: ClusterConfig, backend, n_dense: int, n_sparse: int, seed: int, *, ebc=None) -> DLRM:
    """DLRM with ``n_sparse`` sparse features on the cluster's tables (module docstring,
    tables from :func:`table_configs`).

    Args:
        cfg: cluster config; every table a feature uses must have the same ``dim`` (D).
        backend: an ``EmbeddingClient`` or a ``LocalBackend`` holding the rows.
        n_dense, n_sparse: feature counts (13 and 26 for Criteo).
        seed: seed of the dense parameters.
        ebc: another ``EmbeddingBagCollection`` on :func:`table_configs`' tables instead of a
            :class:`~embnic.client_lib.torch.RemoteEmbeddingBagCollection` on ``backend``
            (the benchmark's TorchRec peer; ``backend`` is then unused).

    Raises:
        ValueError: the tables' dims differ (DLRM's interaction needs one D).
    """
    confs, table_ids, dim = table_configs(cfg, n_sparse)
    if ebc is None:
        ebc = RemoteEmbeddingBagCollection(confs, backend, table_ids=table_ids)
    torch.manual_seed(seed)
    return DLRM(embedding_bag_collection=ebc, dense_in_features=n_dense,
                dense_arch_layer_sizes=[DENSE_HIDDEN, dim], over_arch_layer_sizes=[DENSE_HIDDEN, 1])


def batch_inputs(data, idx) -> tuple[torch.Tensor, object, torch.Tensor]:
    """(dense float32 (B, 13), KJT of the 26 features, labels float32 (B,)) of rows ``idx``."""
    sparse = data.sparse[idx]
    names = [f"C{j + 1}" for j in range(sparse.shape[1])]
    return (torch.from_numpy(np.ascontiguousarray(data.dense[idx], dtype=np.float32)),
            kjt_from_dense(names, sparse), torch.from_numpy(np.ascontiguousarray(data.labels[idx], dtype=np.float32)))


def evaluate(model: DLRM, data, batch_size: int = 1024) -> tuple[float, float]:
    """(ROC AUC, mean BCE) of ``model`` on ``data``: lookups only (no_grad: no updates)."""
    from sklearn.metrics import roc_auc_score

    logits = []
    model.eval()
    with torch.no_grad():
        for s in range(0, len(data.labels), batch_size):
            dense, kjt, _ = batch_inputs(data, np.arange(s, min(s + batch_size, len(data.labels))))
            logits.append(model(dense, kjt).reshape(-1))
    model.train()
    z = torch.cat(logits)
    y = torch.from_numpy(np.asarray(data.labels, dtype=np.float32))
    loss = float(torch.nn.functional.binary_cross_entropy_with_logits(z, y))
    yn = y.numpy()
    auc = float(roc_auc_score(yn, z.numpy())) if 0 < yn.sum() < len(yn) else float("nan")
    return auc, loss


def train_dlrm(cfg: ClusterConfig, data, *, steps: int, batch_size: int = 512, backend,
               eval_data=None, lr_dense: float = 0.05, seed: int | None = None,
               progress: Callable[[int, float], None] | None = None, threads: int | None = 1) -> TrainResult:
    """Train TorchRec's DLRM for ``steps`` steps with its tables on ``backend``.

    Same arguments and result as :func:`embnic.testbed.training.train.train` (the FM model); every
    step is one lookup round (forward) and one update round (backward) through ``backend``.
    ``TrainResult.params`` is the DLRM's dense ``state_dict()``.

    ``threads``: torch intra-op threads during the run (restored after; None: leave as is).
    One by default: the card and the shards need the other core here, and an OpenMP region of
    2 threads on a loaded 2-core machine took ~19 ms where one thread took 18 µs (a 256-id
    ``repeat_interleave``).

    Raises:
        ValueError: no training rows; tables of different dims.
        embnic.client_lib.client.EmbnicError: a shard failed (from the backend).
    """
    n = len(data.labels)
    if n == 0:
        raise ValueError("no training rows")
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        model = build_model(cfg, backend, data.dense.shape[1], data.sparse.shape[1],
                            cfg.seed if seed is None else seed)
        ebc = model.sparse_arch.embedding_bag_collection
        opt = torch.optim.SGD(model.parameters(), lr=lr_dense)
        losses, times = [], []
        for step in range(steps):
            t0 = time.perf_counter()
            dense, kjt, labels = batch_inputs(data, (np.arange(batch_size) + step * batch_size) % n)
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, kjt).reshape(-1), labels)
            loss.backward()  # sends this step's per-row gradients to the shards
            opt.step()
            losses.append(loss.item())
            times.append(time.perf_counter() - t0)
            if progress is not None:
                progress(step, losses[-1])
        ids, uniq = ebc.ids, ebc.unique_ids
        auc = ev_loss = None
        if eval_data is not None and len(eval_data.labels):
            auc, ev_loss = evaluate(model, eval_data)
        return TrainResult(losses, auc, ev_loss, ids, uniq, times, model.state_dict())
    finally:
        torch.set_num_threads(old_threads)
