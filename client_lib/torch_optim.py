"""TorchRec's ways to choose a table's optimizer, checked against the cluster config: a sharder's
``fused_params`` and ``apply_optimizer_in_backward`` on a table's placeholder weight, merged as
TorchRec's sharders merge them, must name what the shards apply (the table's optimizer, lr and
eps). The optimizer half of :mod:`embnic.client_lib.torch` (needs PyTorch and TorchRec; import
that module, which says what to install when they are missing).
"""
from __future__ import annotations

import numpy as np
from torchrec.optim.fused import EmptyFusedOptimizer

from .config import ClusterConfig

#: the fbgemm optimizer (``EmbOptimType`` member name) that equals each config optimizer
_FUSED_TYPE = {"sgd": "EXACT_SGD", "adagrad": "EXACT_ROWWISE_ADAGRAD"}
_WHAT = {"sgd": "SGD", "adagrad": "row-wise Adagrad"}
_USE = {"sgd": "torch.optim.SGD or torchrec.optim.SGD", "adagrad": "torchrec.optim.RowWiseAdagrad"}
#: settings that change an update unless they are off (0 / False / None): the shards apply none
_MUST_BE_OFF = ("weight_decay", "weight_decay_mode", "lr_decay", "initial_accumulator_value", "momentum",
                "dampening", "nesterov", "maximize", "gradient_clipping")
_FBGEMM_LR, _FBGEMM_EPS = 0.01, 1.0e-8  #: fbgemm's defaults when an optimizer is named without them


def _is_off(v) -> bool:
    v = getattr(v, "value", v)  # an enum (fbgemm's WeightDecayMode.NONE is 0)
    return v is None or v is False or (isinstance(v, (int, float, np.number)) and not isinstance(v, bool) and v == 0)


def _opt_type_name(value) -> str:
    """``EmbOptimType`` member name of ``value`` (the enum, its value ``"exact_sgd"`` or its name)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    if isinstance(value, EmbOptimType):
        return value.name
    for m in EmbOptimType:
        if value in (m.value, m.name) or str(value).upper() == m.name:
            return m.name
    raise ValueError(f"optimizer {value!r} is not an fbgemm EmbOptimType")


def table_fused_params(fused_params: dict | None, optimizer_class=None, optimizer_kwargs: dict | None = None) -> dict:
    """One table's fused params as TorchRec's sharders merge them
    (``torchrec/distributed/embeddingbag.py``: ``optimizer_type_to_emb_opt_type`` of the
    parameter's ``_optimizer_classes[0]``, then ``utils.merge_fused_params``): the sharder's
    ``fused_params``, updated with the ``apply_optimizer_in_backward`` kwargs of the table's
    parameter (``lr`` → ``learning_rate``) and ``optimizer`` = the class's fbgemm type.
    Nothing given is mutated.

    Raises:
        ValueError: a class with no fbgemm equivalent (TorchRec's own error: e.g. ``RMSprop``).
    """
    merged = dict(fused_params or {})
    kw = dict(optimizer_kwargs or {})
    if optimizer_class is not None and "optimizer" not in kw:
        from torchrec.distributed.utils import optimizer_type_to_emb_opt_type

        kw["optimizer"] = optimizer_type_to_emb_opt_type(optimizer_class)
    if "lr" in kw:
        kw["learning_rate"] = kw.pop("lr")
    merged.update(kw)
    return merged


def optimizer_mismatch(table, fused: dict) -> list[str]:
    """What in ``fused`` (one table's merged fused params, :func:`table_fused_params`) the shards
    would not do for cluster table ``table``; empty when it matches.

    Checked: ``optimizer`` (``EXACT_SGD`` for ``sgd``, ``EXACT_ROWWISE_ADAGRAD`` for ``adagrad``);
    ``learning_rate`` and, for Adagrad, ``eps`` — equal in float32, the shards' precision; when
    an optimizer is named without them, fbgemm's defaults (0.01, 1e-8) are what TorchRec would
    train with, so those are compared; and :data:`_MUST_BE_OFF` (weight decay, momentum, ...)
    off. An SGD table has no ``eps`` (fbgemm's ``EXACT_SGD`` ignores it too). Other keys
    configure fbgemm's kernel and cache (precision, cache sizes, prefetch), which do not run
    here, and are not optimizer choices.
    """
    bad = []
    named = "optimizer" in fused
    if named:
        try:
            got = _opt_type_name(fused["optimizer"])
        except ValueError as e:
            return [str(e)]
        if got != _FUSED_TYPE[table.optimizer]:
            bad.append(f"optimizer {got}")
    if "learning_rate" in fused or named:
        lr = fused.get("learning_rate", _FBGEMM_LR)
        if np.float32(lr) != np.float32(table.lr):
            bad.append(f"lr {lr}{'' if 'learning_rate' in fused else ' (fbgemm default)'}")
    if table.optimizer == "adagrad" and ("eps" in fused or named):
        eps = fused.get("eps", _FBGEMM_EPS)
        if np.float32(eps) != np.float32(table.eps):
            bad.append(f"eps {eps}{'' if 'eps' in fused else ' (fbgemm default)'}")
    bad += [f"{k}={fused[k]!r}" for k in _MUST_BE_OFF if k in fused and not _is_off(fused[k])]
    return bad


def mismatch_error(name: str, table, source: str, bad: list[str], cfg: ClusterConfig) -> ValueError:
    """The error that names table ``name`` (cluster table ``table``), what ``source`` asked for
    (``bad``, :func:`optimizer_mismatch`) and the fix (the optimizer, lr and eps of the config
    ``cfg``)."""
    want = f"lr={table.lr}" + (f", eps={table.eps}" if table.optimizer == "adagrad" else "")
    where = f" in {cfg.path}" if cfg.path else ""
    return ValueError(
        f"table {name!r}: {source} asks for {', '.join(bad)}, but the shards train cluster table {table.id} with "
        f"{_WHAT[table.optimizer]} (optimizer = {table.optimizer!r}, {want}); use {_USE[table.optimizer]} with "
        f"{want}, or change [[tables]] id = {table.id}{where}")


def check_fused_params(cfg: ClusterConfig, configs: list, table_ids: list[int], fused: dict, source: str) -> None:
    """Check a sharder's ``fused_params`` against every table (:func:`optimizer_mismatch`):
    ``configs`` the module's ``EmbeddingBagConfig`` of each table, ``table_ids`` its cluster table
    id; ``source`` how the error names where ``fused`` came from.

    Raises:
        ValueError: naming the first table whose optimizer, lr or eps they contradict (or a
            setting the shards do not apply).
    """
    for conf, tid in zip(configs, table_ids):
        bad = optimizer_mismatch(cfg.table(tid), table_fused_params(fused))
        if bad:
            raise mismatch_error(conf.name, cfg.table(tid), source, bad, cfg)


def check_in_backward(cfg: ClusterConfig, configs: list, table_ids: list[int], weights: list,
                      fused_params: dict | None) -> None:
    """Check the ``apply_optimizer_in_backward`` choice on each table's placeholder ``weight``
    (``_optimizer_classes`` / ``_optimizer_kwargs``, in ``configs`` order), merged with
    ``fused_params`` (None: none), against the table's config; make a matching one TorchRec's
    no-op ``EmptyFusedOptimizer`` (the shards apply it) and mark the weight checked, so a weight
    is checked again only when its choice changes (:func:`forget_checks`). O(tables).

    Raises:
        ValueError: naming the table: more than one optimizer on a table (TorchRec's
            sharders take one), an optimizer class without an fbgemm equivalent, or
            another optimizer type, lr or eps than the config's, or a setting the shards
            do not apply (weight decay, momentum, ...).
    """
    for conf, tid, w in zip(configs, table_ids, weights):
        classes = getattr(w, "_optimizer_classes", None)
        if not classes or getattr(w, "_embnic_checked", None) == len(classes):
            continue
        table = cfg.table(tid)
        if len(classes) != 1:
            raise ValueError(f"table {conf.name!r}: {len(classes)} optimizers applied in backward "
                             f"({', '.join(c.__name__ for c in classes)}); a table takes one, as TorchRec's "
                             "sharders")
        try:
            fused = table_fused_params(fused_params, classes[0], w._optimizer_kwargs[0])
        except ValueError as e:
            raise ValueError(f"table {conf.name!r}: apply_optimizer_in_backward({classes[0].__name__}): {e}; "
                             f"the shards train it with {_WHAT[table.optimizer]}: use {_USE[table.optimizer]}") from None
        bad = optimizer_mismatch(table, fused)
        if bad:
            src = f"apply_optimizer_in_backward({classes[0].__name__}, ...)"
            raise mismatch_error(conf.name, table, src + (" with fused_params" if fused_params else ""), bad, cfg)
        w._in_backward_optimizers = [EmptyFusedOptimizer()]  # the shards apply it
        w._embnic_checked = len(classes)


def forget_checks(weights: list) -> None:
    """Have :func:`check_in_backward` check ``weights`` again (their ``fused_params`` changed)."""
    for w in weights:
        if hasattr(w, "_embnic_checked"):
            del w._embnic_checked
