"""The training loop: a CTR model whose embedding rows live on parameter-server shards.

A step is one lookup round and one update round for all tables (the path of one batch:
docs/architecture.md); the ``backend`` decides where rows live
(:class:`~embnic.client_lib.backend.Backend`: the shards through an
:class:`~embnic.client_lib.client.EmbeddingClient`, or in process,
:class:`~embnic.client_lib.local.LocalBackend`). Given the same config, data and seed both give
the same losses (bit-identical floats: everything is float32, computed in a fixed order).

The model, in numpy: a factorisation machine over pooled embeddings plus dense features. For a sample with dense features ``x`` (13,) and pooled embeddings ``e_f`` (dim,) of its F
sparse features (one bag per feature, EmbeddingBag sum pooling)::

    logit = b + w·x + Σ_f u_f·e_f + ½ Σ_k [ (Σ_f e_fk)² − Σ_f e_fk² ]
    p     = sigmoid(logit)

The last term is the second-order factorisation machine (Rendle, "Factorization Machines",
ICDM 2010, eq. 1 with the O(kn) reformulation of lemma 3.1). The loss is binary cross-entropy
averaged over the batch. Dense parameters ``b``, ``w`` (13,), ``u`` (F, dim) live in the
client and are trained with SGD; embedding rows live on the parameter-server shards, which get
``∂L/∂e_f`` aggregated per unique id and apply the table's optimizer.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np

from embnic.client_lib.batch import KeyedJaggedBatch, pool_all, pool_backward_all, prepare_batch
from embnic.client_lib.backend import Backend, require_backend
from embnic.client_lib.config import ClusterConfig

from .criteo import feature_tables
from .result import TrainResult

__all__ = ["TrainResult", "feature_tables", "train", "evaluate", "embed_batch", "trained_rows",
           "load_training_data", "trainer", "MODELS"]


# --------------------------------------------------------------------------- the model
@dataclasses.dataclass
class DenseParams:
    """Client-side parameters: bias, dense weights w (n_dense,), per-feature weights u (F, dim)
    (:func:`train` starts them at 0, 0 and N(0, 0.01²) from its seed), float32."""

    b: np.ndarray
    w: np.ndarray
    u: np.ndarray


def sigmoid(z: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function, float32 in → float32 out."""
    out = np.empty_like(z)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    ez = np.exp(z[~pos])
    out[~pos] = ez / (1.0 + ez)
    return out


def forward(params: DenseParams, dense: np.ndarray, emb: np.ndarray) -> np.ndarray:
    """Logits.

    Args:
        dense: float32 (B, n_dense).
        emb: float32 (B, F, dim) pooled embeddings.

    Returns:
        float32 (B,) logits.
    """
    s = emb.sum(axis=1)  # (B, dim)
    fm = np.float32(0.5) * ((s * s).sum(axis=1) - (emb * emb).sum(axis=(1, 2)))
    lin = dense @ params.w + (emb * params.u[None]).sum(axis=(1, 2))
    return params.b[0] + lin + fm


def bce_loss(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean binary cross-entropy with logits (stable form), as a Python float."""
    z = logits.astype(np.float32)
    y = labels.astype(np.float32)
    l = np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))
    return float(l.mean(dtype=np.float32))


def backward(params: DenseParams, dense: np.ndarray, emb: np.ndarray, logits: np.ndarray,
             labels: np.ndarray) -> tuple[DenseParams, np.ndarray]:
    """Gradients of the mean BCE loss.

    Returns:
        (gradients of the dense parameters as a :class:`DenseParams`,
         float32 (B, F, dim) gradient w.r.t. the pooled embeddings).
    """
    bsz = logits.shape[0]
    dz = (sigmoid(logits) - labels.astype(np.float32)) / np.float32(bsz)  # (B,)
    s = emb.sum(axis=1, keepdims=True)  # (B, 1, dim)
    g_emb = dz[:, None, None] * (params.u[None] + s - emb)
    grads = DenseParams(np.array([dz.sum()], np.float32), dense.T @ dz,
                        (dz[:, None, None] * emb).sum(axis=0))
    return grads, g_emb.astype(np.float32)


def sgd_step(params: DenseParams, grads: DenseParams, lr: float) -> None:
    """In-place SGD on the dense parameters."""
    lr = np.float32(lr)
    params.b -= lr * grads.b
    params.w -= lr * grads.w
    params.u -= lr * grads.u


# --------------------------------------------------------------------------- the loop
def _embeddings(backend: Backend, cfg: ClusterConfig, sparse: np.ndarray, ftab: list[int]):
    """Look up and pool, every table at once: returns (pooled float32 (B, F, dim), prepared batch,
    rows float32 (U, dim): every table's value array one after the other)."""
    b, f = sparse.shape
    names = [f"C{j + 1}" for j in range(f)]
    prep = prepare_batch(KeyedJaggedBatch.from_dense(names, sparse), ftab)
    dims = {cfg.table(t).dim for t in set(ftab)}
    if len(dims) != 1:
        raise ValueError(f"the FM model needs one embedding dim for every table, got {sorted(dims)}")
    dim = dims.pop()
    rows = backend.lookup_flat(prep.table_ids, np.diff(prep.unique_offsets), prep.unique).reshape(-1, dim)
    emb = np.empty((b, f, dim), dtype=np.float32)
    # every table's bags at once, features grouped by table (prep.features)
    emb[:, prep.features, :] = pool_all(rows, prep).reshape(f, b, dim).transpose(1, 0, 2)
    return emb, prep, rows


def embed_batch(backend: Backend, cfg: ClusterConfig, sparse: np.ndarray) -> np.ndarray:
    """Look up and pool the embeddings of one batch, no update.

    Args:
        backend: where rows live (:class:`~embnic.client_lib.backend.Backend`).
        cfg: cluster config (feature ``j`` uses :func:`feature_tables`).
        sparse: uint64 (B, F) sparse ids of the batch.

    Returns:
        float32 (B, F, dim): pooled embeddings.
    """
    return _embeddings(require_backend(backend, "embed_batch"), cfg, sparse, feature_tables(cfg, sparse.shape[1]))[0]


def evaluate(backend: Backend, cfg: ClusterConfig, params: DenseParams, data,
             batch_size: int = 1024) -> tuple[float, float]:
    """(ROC AUC, mean BCE) of the model on ``data`` (lookups only, no updates)."""
    from sklearn.metrics import roc_auc_score

    backend = require_backend(backend, "evaluate")
    ftab = feature_tables(cfg, data.sparse.shape[1])
    logits = []
    for s in range(0, len(data.labels), batch_size):
        sl = slice(s, s + batch_size)
        emb, _, _ = _embeddings(backend, cfg, data.sparse[sl], ftab)
        logits.append(forward(params, data.dense[sl], emb))
    z = np.concatenate(logits)
    y = data.labels
    auc = float(roc_auc_score(y, z)) if 0 < y.sum() < len(y) else float("nan")
    return auc, bce_loss(z, y)


def train(cfg: ClusterConfig, data, *, steps: int, batch_size: int = 512, backend: Backend,
          eval_data=None, lr_dense: float = 0.05, seed: int | None = None,
          progress: Callable[[int, float], None] | None = None) -> TrainResult:
    """Train the FM CTR model for ``steps`` steps.

    Args:
        cfg: cluster config (tables; the Criteo column ``j`` uses :func:`feature_tables`).
        data: training rows with ``labels`` float32 (N,), ``dense`` float32 (N, 13) and
            ``sparse`` uint64 (N, 26) (see :mod:`embnic.testbed.training.criteo`); batches are taken in
            order and wrap around.
        steps: optimizer steps.
        batch_size: samples per step (B).
        backend: where rows live (:class:`~embnic.client_lib.backend.Backend`).
        eval_data: rows for the final AUC (same layout), or None.
        lr_dense: SGD learning rate of the client-side dense parameters.
        seed: seed of the dense parameters (default ``cfg.seed``).
        progress: called after every step with (step index, loss).

    Returns:
        :class:`TrainResult`.

    Raises:
        embnic.client_lib.client.EmbnicError: a shard failed (from the backend).
        TypeError: ``backend`` is not a :class:`~embnic.client_lib.backend.Backend`.
    """
    backend = require_backend(backend, "train")
    n = len(data.labels)
    if n == 0:
        raise ValueError("no training rows")
    ftab = feature_tables(cfg, data.sparse.shape[1])
    dim = cfg.table(ftab[0]).dim
    rng = np.random.default_rng(cfg.seed if seed is None else seed)
    params = DenseParams(np.zeros(1, np.float32), np.zeros(data.dense.shape[1], np.float32),
                         (rng.standard_normal((data.sparse.shape[1], dim)) * 0.01).astype(np.float32))
    losses, times, ids, uniq = [], [], 0, 0
    for step in range(steps):
        t0 = time.perf_counter()
        idx = (np.arange(batch_size) + step * batch_size) % n
        emb, prep, _ = _embeddings(backend, cfg, data.sparse[idx], ftab)
        dense, labels = data.dense[idx], data.labels[idx]
        logits = forward(params, dense, emb)
        loss = bce_loss(logits, labels)
        g_params, g_emb = backward(params, dense, emb, logits, labels)
        g_bags = g_emb[:, prep.features, :].transpose(1, 0, 2).reshape(-1, dim)
        backend.update_flat(prep.table_ids, np.diff(prep.unique_offsets), prep.unique,
                            pool_backward_all(g_bags, prep))
        sgd_step(params, g_params, lr_dense)
        ids += prep.num_ids
        uniq += prep.num_unique
        losses.append(loss)
        times.append(time.perf_counter() - t0)
        if progress is not None:
            progress(step, loss)
    auc = ev_loss = None
    if eval_data is not None and len(eval_data.labels):
        auc, ev_loss = evaluate(backend, cfg, params, eval_data)
    return TrainResult(losses, auc, ev_loss, ids, uniq, times, params)


def trained_rows(backend: Backend, cfg: ClusterConfig, data, batch_size: int) -> tuple[int, int]:
    """How many rows the first training step reads already differ from their initial values:
    (changed, read). Nonzero means the shards hold an earlier run's updates, which a new run
    continues from.

    The rows of step 0 (``data.sparse`` rows ``0..batch_size-1``, wrapping, tables by
    :func:`feature_tables`) are looked up once (one round; a lookup changes nothing) and
    compared with :func:`~embnic.client_lib.table_numerics.init_rows` after the wire's rounding —
    what a shard returns for a row never updated (rows start as a pure function of
    (seed, table, id)). Vectorised per table.

    Raises:
        embnic.client_lib.client.EmbnicError: a shard failed.
    """
    from embnic.client_lib.table_numerics import init_rows, wire_round

    backend = require_backend(backend, "trained_rows")
    n = len(data.labels)
    if n == 0:
        return 0, 0
    sparse = data.sparse[np.arange(batch_size) % n]
    ftab = feature_tables(cfg, sparse.shape[1])
    prep = prepare_batch(KeyedJaggedBatch.from_dense([f"C{j + 1}" for j in range(sparse.shape[1])], sparse), ftab)
    rows = backend.lookup({t: p.unique for t, p in prep.tables.items()})
    changed = read = 0
    for t, p in prep.tables.items():
        tc = cfg.table(t)
        init = wire_round(init_rows(cfg.seed, t, p.unique, tc.dim, tc.init_scale), tc.dtype)
        changed += int(np.count_nonzero(np.any(rows[t] != init, axis=1)))
        read += len(p.unique)
    return changed, read


def load_training_data(cfg: ClusterConfig, path=None, *, valid_fraction: float = 0.2,
                       max_rows: int | None = None):
    """Criteo rows for :func:`train`: (train, valid) split by time.

    Column ``Cj`` is hashed into the id space of the table :func:`feature_tables` gives it.

    Args:
        path: a Criteo TSV file (raw Kaggle ``train.txt`` layout); default the shipped sample.
        valid_fraction: the last fraction of rows (later in time) held out for the AUC.
        max_rows: read at most this many rows (for the full public dataset).

    Raises:
        OSError: unreadable file.
        embnic.testbed.training.criteo.CriteoFormatError: malformed, unlabelled, or fewer than 2 rows.
    """
    from . import criteo

    ftab = feature_tables(cfg, criteo.NUM_SPARSE)
    rows = [cfg.table(t).rows for t in ftab]
    path = path or criteo.sample_path("train")
    data = criteo.load_criteo(path, rows=rows, max_rows=max_rows)
    if len(data) and not data.has_labels:
        raise criteo.CriteoFormatError(f"{path} has no label column ({criteo.NUM_DENSE + criteo.NUM_SPARSE} "
                                       f"fields: the Kaggle test.txt layout); training needs labelled rows "
                                       f"({criteo.NUM_DENSE + criteo.NUM_SPARSE + 1} fields, train.txt layout)")
    if len(data) < 2:
        raise criteo.CriteoFormatError(f"{path} has {len(data)} rows; training and evaluation need at least 2")
    return criteo.time_split(data, valid_fraction)


MODELS = ("fm", "dlrm")  #: ``--model`` choices: the numpy FM, TorchRec's DLRM (embnic[torch])


def trainer(model: str) -> Callable:
    """The training function of ``model``: :func:`train` (``"fm"``) or
    :func:`embnic.testbed.training.dlrm.train_dlrm` (``"dlrm"``); both take the same arguments and
    return a :class:`TrainResult`.

    Raises:
        ValueError: unknown model.
        ImportError: ``"dlrm"`` without the ``embnic[torch]`` extra; the message says in one
            line what to install.
    """
    if model == "fm":
        return train
    if model == "dlrm":
        from .dlrm import train_dlrm

        return train_dlrm
    raise ValueError(f"unknown model {model!r} (models: {', '.join(MODELS)})")
