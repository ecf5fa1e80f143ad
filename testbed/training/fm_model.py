"""A CTR model in numpy: a factorisation machine over pooled embeddings plus dense features.

For a sample with dense features ``x`` (13,) and pooled embeddings ``e_f`` (dim,) of its F
sparse features (one bag per feature, EmbeddingBag sum pooling)::

    logit = b + w·x + Σ_f u_f·e_f + ½ Σ_k [ (Σ_f e_fk)² − Σ_f e_fk² ]
    p     = sigmoid(logit)

The last term is the second-order factorisation machine (Rendle, "Factorization Machines",
ICDM 2010, eq. 1 with the O(kn) reformulation of lemma 3.1). The loss is binary cross-entropy
averaged over the batch. Dense parameters ``b``, ``w`` (13,), ``u`` (F, dim) live in the
client and are trained with SGD; embedding rows live on the parameter-server shards, which get
``∂L/∂e_f`` aggregated per unique id and apply the table's optimizer.

Everything is float32 and computed in a fixed order, so two runs that see the same rows
produce bit-identical losses, whichever backend serves the rows.
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class DenseParams:
    """Client-side parameters: bias, dense weights w (n_dense,), per-feature weights u (F, dim)."""

    b: np.ndarray
    w: np.ndarray
    u: np.ndarray

    @classmethod
    def init(cls, n_dense: int, n_features: int, dim: int, seed: int = 0) -> "DenseParams":
        rng = np.random.default_rng(seed)
        return cls(np.zeros(1, np.float32),
                   np.zeros(n_dense, np.float32),
                   (rng.standard_normal((n_features, dim)) * 0.01).astype(np.float32))


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
