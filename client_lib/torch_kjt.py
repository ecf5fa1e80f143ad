"""KeyedJaggedTensor in: the checks and the reshaping :class:`RemoteEmbeddingBagCollection
<embnic.client_lib.torch.RemoteEmbeddingBagCollection>`'s forward applies to its input before the
batch becomes numpy arrays (the input half of :mod:`embnic.client_lib.torch`; needs PyTorch and
TorchRec: import that module, which says what to install when they are missing). No per-id
Python loop: every function is O(features) plus numpy/torch passes over the ids.
"""
from __future__ import annotations

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from .roundplan import concat_ranges


def check_kjt(features: KeyedJaggedTensor, wanted: list[str]) -> None:
    """The dtypes and the features of a KJT, every problem named in one ``ValueError`` (so
    ``KeyedJaggedTensor.empty()``, float values and no keys, hears of both). TorchRec's EBC takes
    int32/int64 ids only (``nn.EmbeddingBag``'s indices): float values would be truncated to ids,
    the wrong rows, silently."""
    problems = []
    v = features.values()
    if v.dtype not in (torch.int64, torch.int32):
        problems.append(f"KeyedJaggedTensor values must be integer ids (torch.int64 or torch.int32, as TorchRec's "
                        f"EmbeddingBagCollection takes), got {v.dtype}; ids >= 2**63 are int64 with the same "
                        "bits (kjt_from_dense does it)")
    ln = features.lengths()
    if ln.is_floating_point() or ln.is_complex() or ln.dtype == torch.bool:
        problems.append(f"KeyedJaggedTensor lengths must be integers, got {ln.dtype}")
    keys = features.keys()
    have = set(keys)
    missing = [f for f in wanted if f not in have]
    if missing:
        problems.append(f"KeyedJaggedTensor lacks feature(s) {missing} (has {keys})")
    if problems:
        raise ValueError("; and ".join(problems))


def flatten_vbe(features: KeyedJaggedTensor, slot_features: list[str]) -> KeyedJaggedTensor:
    """A variable-batch (VBE) KJT as the fixed-stride KJT of the slots that TorchRec's EBC
    output describes: slot ``s``, output row ``b`` is a copy of bag
    ``inverse_indices[f(s), b]`` of its feature (its ids, lengths and weights gathered with
    one index array; weights through torch indexing, so their gradient flows back).
    Pooling a copied bag gives TorchRec's ``pooled_f[inverse_indices[f, b]]``, and the
    rows' gradient is the same sum (in another order). O(F·B + n), no per-id loop.

    Args:
        features: the VBE KJT (``stride_per_key_per_rank``, ``inverse_indices`` or not), with
            every feature of the slots (:func:`check_kjt`).
        slot_features: the feature of every slot, in output order.

    Raises:
        ValueError: features of different batch sizes without
            ``inverse_indices``, inverse indices of the wrong shape or range, lengths of the
            wrong shape.
    """
    index = {k: i for i, k in enumerate(features.keys())}
    strides = np.asarray(features.stride_per_key(), dtype=np.int64)  # bags per key, over ranks
    inv = features.inverse_indices_or_none()
    kidx = np.array([index[f] for f in slot_features], dtype=np.int64)
    if inv is None:
        if len(set(strides[kidx].tolist())) > 1:
            raise ValueError(
                "variable batch size per feature (VBE KeyedJaggedTensor, stride_per_key_per_rank) without "
                f"inverse_indices: features {slot_features} have {strides[kidx].tolist()} bags, which "
                "cannot form one (B, Σ dims) output (TorchRec's EmbeddingBagCollection fails on it too); "
                "pass inverse_indices=(keys, int tensor (F, B)) mapping every output row to its bag")
        b = int(strides[kidx[0]]) if kidx.size else 0
        bag = (np.concatenate([[0], np.cumsum(strides)])[kidx][:, None] + np.arange(b)[None, :])
    else:
        inv_keys, inv_t = inv
        ipos = {k: i for i, k in enumerate(inv_keys)}
        lacking = [f for f in slot_features if f not in ipos]
        if lacking:
            raise ValueError(f"VBE KeyedJaggedTensor: inverse_indices lack feature(s) {lacking} "
                             f"(have {list(inv_keys)})")
        inv_np = inv_t.detach().cpu().numpy()
        if inv_np.ndim != 2 or inv_np.shape[0] != len(inv_keys) or inv_np.dtype.kind not in "iu":
            raise ValueError(f"VBE KeyedJaggedTensor: inverse_indices must be integers of shape "
                             f"({len(inv_keys)}, B), got {inv_t.dtype} {tuple(inv_t.shape)}")
        b = inv_np.shape[1]
        sel = inv_np[[ipos[f] for f in slot_features]].astype(np.int64)  # (S, B)
        lim = strides[kidx][:, None]
        out_of = (sel < 0) | (sel >= lim)
        if out_of.any():
            s_, b_ = (int(x[0]) for x in np.nonzero(out_of))
            raise ValueError(f"VBE KeyedJaggedTensor: inverse_indices[{slot_features[s_]!r}][{b_}] = "
                             f"{int(sel[s_, b_])} outside the feature's {int(lim[s_, 0])} bags")
        bag = np.concatenate([[0], np.cumsum(strides)])[kidx][:, None] + sel
    lengths = features.lengths().detach().numpy().astype(np.int64, copy=False)
    if lengths.shape != (int(strides.sum()),):
        raise ValueError(f"VBE KeyedJaggedTensor: lengths has shape {tuple(lengths.shape)}, expected "
                         f"({int(strides.sum())},) = Σ stride_per_key_per_rank")
    bag = bag.reshape(-1)
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    new_len = lengths[bag]
    if int(offsets[-1]) != features.values().numel():
        raise ValueError(f"sum(lengths)={int(offsets[-1])} != len(values)={features.values().numel()}")
    pos = torch.from_numpy(concat_ranges(offsets[:-1][bag], new_len))  # every copied bag's ids
    w = features.weights_or_none()
    return KeyedJaggedTensor(keys=list(slot_features), values=features.values()[pos],
                             lengths=torch.from_numpy(new_len.astype(np.int32)),
                             weights=None if w is None else w[pos], stride=b)


def check_ids(vals: np.ndarray, lens: np.ndarray, b: int, weights, slot_features: list[str],
              slot_limit: np.ndarray) -> None:
    """Check a fixed-stride batch of ``b`` samples of the slots ``slot_features`` (TorchRec's
    output order of (table, feature)): ``lens`` int (S*b,) non-negative summing to ``vals.size``
    (int64 (n,) ids), ``weights`` float32 (n,) or None, every id of slot ``s`` in
    ``[0, slot_limit[s])`` (int64 (S,), -1: a table without rows, any id). O(n).

    Raises:
        ValueError: naming the first problem (the feature and id of an id out of range).
    """
    nf = len(slot_features)
    if lens.shape != (nf * b,):
        raise ValueError(f"lengths has shape {tuple(lens.shape)}, expected ({nf}*{b},)")
    if lens.size and int(lens.min()) < 0:
        raise ValueError("negative length")
    n = int(lens.sum())
    if n != vals.size:
        raise ValueError(f"sum(lengths)={n} != len(values)={vals.size}")
    if weights is not None and weights.shape != (n,):
        raise ValueError(f"weights has shape {tuple(weights.shape)}, expected ({n},)")
    if n:
        per_feat = lens.reshape(nf, b).sum(axis=1)
        limit = np.repeat(slot_limit, per_feat)
        bad = ((vals < 0) | (vals >= limit)) & (limit >= 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            f = int(np.searchsorted(np.cumsum(per_feat), i, side="right"))
            raise ValueError(f"feature {slot_features[f]!r}: id {int(vals[i])} outside "
                             f"[0, num_embeddings={int(slot_limit[f])})")
