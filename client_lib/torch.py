"""PyTorch / TorchRec front end: :class:`RemoteEmbeddingBagCollection`, TorchRec's
``EmbeddingBagCollection`` with its rows on the shards (the optional extra ``embnic[torch]``;
README, "PyTorch and TorchRec").

A forward prepares the KJT's ids with :func:`embnic.client_lib.batch.prepare_batch` (per table
the sorted ``unique`` ids, ``inverse`` and ``offsets``), looks every table's ``unique`` rows up
in one round through the backend and pools them with one ``embedding_bag`` per pooling mode
(narrower tables' rows padded to the widest dim). Backward turns the pooled output's gradient
into one gradient per unique row — ``grad_row[u] = Σ_{i: inverse[i]=u} s_i · grad_bag[bag(i)]``,
``s_i`` the sample's weight, ``1/len(bag)`` for mean pooling, else 1 — sent as one update round;
the shards apply the table's optimizer as TorchRec's fused optimizer does inside backward.
"""
from __future__ import annotations

import dataclasses

import numpy as np

INSTALL_HINT = ("PyTorch and TorchRec are not installed: pip install 'embnic[torch]' && "
                "pip install --no-deps torchrec==1.9.2 (scripts/install-deps.sh does both)")

try:
    import torch
    import torch.nn.functional as F
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.types import ModuleSharder, ShardingType
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
    from torchrec.modules.embedding_modules import get_embedding_names_by_table
    from torchrec.optim.fused import EmptyFusedOptimizer, FusedOptimizerModule
    from torchrec.optim.keyed import KeyedOptimizer
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor
except ImportError as e:  # one line naming the fix; the CLI maps it to a missing-dependency error
    raise ImportError(f"{INSTALL_HINT} ({e})", name=e.name) from e

from .batch import KeyedJaggedBatch, PreparedBatch, prepare_batch
from .config import ClusterConfig
from .backend import Backend, require_backend
from .roundplan import concat_ranges
from .torch_kjt import check_ids, check_kjt, flatten_vbe
from .torch_optim import check_fused_params, check_in_backward, forget_checks

__all__ = ["RemoteEmbeddingBagCollection", "RemoteEmbeddingBagCollectionSharder", "INSTALL_HINT", "kjt_from_dense",
           "num_embeddings", "placeholder_names"]

_MODES = {PoolingType.SUM: "sum", PoolingType.MEAN: "mean"}


def kjt_from_dense(keys: list[str], ids, weights=None) -> KeyedJaggedTensor:
    """A KJT with one id per (sample, feature) from a dense id matrix, without a per-id loop.

    Args:
        keys: F feature names.
        ids: integers (B, F) — an array, or nested lists of Python ints in 0..2^64-1 (converted
            exactly: numpy would make a list holding 2**63 and smaller ints float64, which
            loses the low bits); column ``f`` is feature ``keys[f]``.
        weights: optional (B, F) per-sample weights (float32).

    Returns:
        ``KeyedJaggedTensor`` with stride B, ``lengths`` all 1 (int32 (F*B,)), ``values``
        int64 (F*B,) feature-major (``values[f*B + b] = ids[b, f]``); an id >= 2**63 is the
        negative int64 with the same 64 bits (read back as uint64 by the module).

    Raises:
        ValueError: ``ids`` not (B, F) with F = len(keys) (1-D ids included: reshape to (B, 1)
            for one feature), not integers, an id outside 0..2^64-1, ``weights`` of another
            shape.

    Example: ``kjt_from_dense(["a"], [[0], [2**64 - 1]]).values()`` is ``tensor([0, -1])``.
    """
    try:
        batch = KeyedJaggedBatch.from_dense(list(keys), ids)
    except ValueError as e:
        try:
            ndim = np.ndim(ids)
        except ValueError:  # ragged nested lists
            ndim = None
        hint = (f" (one column per key: ids.reshape(-1, {len(keys)}), or [[id] for id in ids] for one key)"
                if ndim == 1 else "")
        raise ValueError(f"kjt_from_dense: {e}{hint}") from None
    b, f = batch.stride, len(batch.keys)
    w = None
    if weights is not None:
        wa = np.asarray(weights, dtype=np.float32)
        if wa.shape != (b, f):
            raise ValueError(f"kjt_from_dense: weights shape {wa.shape}, expected (B, F) = ({b}, {f})")
        w = torch.from_numpy(np.ascontiguousarray(wa.T).reshape(-1))
    return KeyedJaggedTensor(keys=list(keys), values=torch.from_numpy(batch.values.view(np.int64)), weights=w,
                             lengths=torch.from_numpy(batch.lengths), stride=b)


def num_embeddings(table) -> int:
    """``num_embeddings`` of an ``EmbeddingBagConfig`` for cluster table ``table``: its ``rows``,
    or ``2**63 - 1`` for a table without rows (any 64-bit id; ids >= 2**63 travel in the KJT's
    int64 values as negative numbers with the same bits)."""
    return table.rows if table.rows is not None else 2**63 - 1


@dataclasses.dataclass
class _Step:
    """One forward's prepared batch and looked-up rows, flat over every table (what backward
    needs; ``U`` unique ids, ``n`` ids, ``G`` bags, ``D`` the widest dim)."""

    prep: PreparedBatch
    rows: torch.Tensor  # float32 (U, D): every table's value array, rows padded to D with zeros
    gidx: torch.Tensor  # int64 (n,): each id's row in ``rows`` (tables grouped as in prep)
    weights: torch.Tensor | None  # float32 (n,) in slot order, or None
    wperm: np.ndarray | None  # int64 (n,): slot-order position of each grouped id (None: the same order)
    gpos: np.ndarray  # int64 (S,): each slot's place among prep's features (grouped by table)


class _RemotePooling(torch.autograd.Function):
    """Pooled embeddings of one prepared step; backward sends the per-row gradients.

    Inputs: the weights (or None), the module, the step, then every table's placeholder
    ``weight`` (module order): the output depends on them, so autograd calls backward when
    any of them requires grad, and each receives an empty (0, dim) gradient — so DDP and every
    torch optimizer see a parameter that took part, and a table whose placeholder does not
    require grad (frozen, as a TorchRec table with ``requires_grad_(False)``) is not updated.
    """

    @staticmethod
    def forward(ctx, weights, ebc, step, *tables):  # noqa: D401 - torch API
        ctx.ebc, ctx.step = ebc, step
        ctx.weights_need_grad = weights is not None and weights.requires_grad
        ctx.placeholders = [(t.shape, t.dtype) for t in tables]
        return ebc._pool(step)

    @staticmethod
    def backward(ctx, grad_out):
        trained = {tid for tid, need in zip(ctx.ebc._table_ids, ctx.needs_input_grad[3:]) if need}
        g_w = ctx.ebc._backward(ctx.step, grad_out.contiguous(), ctx.weights_need_grad, trained)
        return (g_w, None, None, *[torch.zeros(s, dtype=d) if need else None
                                   for (s, d), need in zip(ctx.placeholders, ctx.needs_input_grad[3:])])


class _RemoteTable(torch.nn.Module):
    """Stands in for TorchRec's ``nn.EmbeddingBag`` of one table in ``embedding_bags``: a
    ``weight`` Parameter of shape ``(0, embedding_dim)`` (the rows are on the shards) that
    carries what TorchRec attaches to a table's weight (``apply_optimizer_in_backward``'s
    ``_optimizer_classes`` / ``_optimizer_kwargs``) and its ``requires_grad``."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = torch.nn.Parameter(torch.empty((0, embedding_dim), dtype=torch.float32))

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, rows on the shards"


class RemoteEmbeddingBagCollection(torch.nn.Module, FusedOptimizerModule):
    """TorchRec's ``EmbeddingBagCollection``, with its rows on embnic shards (README, "PyTorch
    and TorchRec"). Every table has a placeholder ``weight`` of shape ``(0, dim)`` under
    TorchRec's name, which carries TorchRec's optimizer choices (checked against the cluster
    config at every forward and backward: :meth:`check_optimizers`) and its ``requires_grad``
    (False freezes the table). Under DMP, shard it with
    :class:`RemoteEmbeddingBagCollectionSharder`, else :attr:`fused_optimizer` refuses it.

    Args:
        tables: one ``torchrec.EmbeddingBagConfig`` per table (``pooling`` SUM or MEAN). Each
            maps to the cluster table of the same ``name`` unless ``table_ids`` says otherwise;
            ``embedding_dim`` must equal that table's ``dim`` and ``num_embeddings`` its
            ``rows`` (when the config gives rows).
        backend: where rows live (:class:`~embnic.client_lib.backend.Backend`); every forward
            is one ``lookup_flat`` round, every backward one ``update_flat`` round.
        is_weighted: use the KJT's per-sample weights (float32 (n,)) in sum pooling.
        table_ids: ``{config name: cluster table id}`` overriding the match by name.
        validate: check every input KJT (lengths, ids in ``[0, num_embeddings)``); ``False``
            for trusted callers (the dtype and VBE checks always run: they are O(F)).
        fused_params: a TorchRec sharder's ``fused_params``, checked for every table
            (:func:`~embnic.client_lib.torch_optim.optimizer_mismatch`).

    Raises:
        ValueError: no tables, duplicate names, a table not in the cluster config, a dim or
            row-count mismatch, two configs on one cluster table, an unsupported pooling,
            ``is_weighted`` with a MEAN table (as ``torch.nn.EmbeddingBag``), or
            ``fused_params`` that choose another optimizer, lr or eps than a table's config.
        TypeError: ``backend`` is not a :class:`~embnic.client_lib.backend.Backend`.
    """

    def __init__(self, tables: list[EmbeddingBagConfig], backend: Backend, *, is_weighted: bool = False,
                 table_ids: dict[str, int] | None = None, validate: bool = True,
                 fused_params: dict | None = None):
        super().__init__()
        cfg: ClusterConfig = require_backend(backend, "RemoteEmbeddingBagCollection").cfg
        if not tables:
            raise ValueError("RemoteEmbeddingBagCollection needs at least one EmbeddingBagConfig")
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate table name in {names}")
        by_name = {t.name: t.id for t in cfg.tables}
        ids: list[int] = []
        for t in tables:
            if not t.feature_names:
                t.feature_names = [t.name]
            tid = (table_ids or {}).get(t.name, by_name.get(t.name))
            if tid is None:
                raise ValueError(f"table {t.name!r} is not in the cluster config "
                                 f"(tables: {', '.join(sorted(by_name))}); pass table_ids={{name: id}}")
            ct = cfg.table(tid)
            if ct.dim != t.embedding_dim:
                raise ValueError(f"table {t.name!r}: embedding_dim {t.embedding_dim} but cluster table {tid} "
                                 f"has dim {ct.dim}")
            if ct.rows is not None and ct.rows != t.num_embeddings:
                raise ValueError(f"table {t.name!r}: num_embeddings {t.num_embeddings} but cluster table {tid} "
                                 f"has rows {ct.rows}")
            if t.pooling not in _MODES:
                raise ValueError(f"table {t.name!r}: pooling {t.pooling} is not supported (SUM or MEAN)")
            if is_weighted and t.pooling != PoolingType.SUM:
                raise ValueError(f"table {t.name!r}: per-sample weights need SUM pooling (as torch.nn.EmbeddingBag)")
            if "." in t.name or not t.name:
                raise ValueError(f"table name {t.name!r}: a module name cannot be empty or contain '.' "
                                 "(as for TorchRec's EmbeddingBagCollection)")
            ids.append(tid)
        if len(set(ids)) != len(ids):
            raise ValueError(f"two EmbeddingBagConfigs map to one cluster table: {dict(zip(names, ids))}")
        self._fused_params = None
        self._sharded_by: str | None = None  #: the sharder DMP sharded this module with, if any
        self.cfg = cfg
        self._configs = list(tables)
        self._table_ids = ids
        if fused_params:
            self.use_fused_params(fused_params)
        self.backend = backend
        self._lookup, self._update = backend.lookup_flat, backend.update_flat
        self._is_weighted = bool(is_weighted)
        self._validate = validate
        #: one placeholder per table, TorchRec's names (class docstring, "Parameters")
        self.embedding_bags = torch.nn.ModuleDict({t.name: _RemoteTable(t.num_embeddings, t.embedding_dim)
                                                   for t in tables})
        # slots: one per (table, feature) in TorchRec's output order
        self._slot_features = [f for t in tables for f in t.feature_names]
        self._slot_tables = [tid for t, tid in zip(tables, ids) for _ in t.feature_names]
        # ids of a table with rows are checked against num_embeddings; a table without rows takes
        # any 64-bit id (the KJT's int64 values are its bit patterns, read back as uint64)
        self._slot_limit = np.array([t.num_embeddings if cfg.table(tid).rows is not None else -1
                                     for t, tid in zip(tables, ids) for _ in t.feature_names], dtype=np.int64)
        self._embedding_names = [n for names in get_embedding_names_by_table(tables) for n in names]
        self._lengths_per_key = [t.embedding_dim for t in tables for _ in t.feature_names]
        self._col = np.concatenate([[0], np.cumsum(self._lengths_per_key)]).astype(np.int64)
        self._mode = {tid: _MODES[t.pooling] for t, tid in zip(tables, ids)}
        self._dim = {tid: t.embedding_dim for t, tid in zip(tables, ids)}
        # per table in ascending id (prepare_batch's order): dim, pooling; every table at its widest dim
        order = sorted(ids)
        self._tdim = np.array([self._dim[t] for t in order], dtype=np.int64)
        self._tmode = np.array([self._mode[t] for t in order])
        self._modes = sorted(set(self._tmode.tolist()), key=lambda m: m != "sum")  # sum first
        self._dmax = int(self._tdim.max())
        self._uniform = bool((self._tdim == self._dmax).all())
        # every output column's slot and column within the slot
        self._colslot = np.repeat(np.arange(len(self._lengths_per_key)), self._lengths_per_key).astype(np.int64)
        self._colc = np.arange(int(self._col[-1]), dtype=np.int64) - self._col[:-1][self._colslot]
        self._out_idx_cache: dict = {}
        self.steps_forward = 0  #: forwards run
        self.steps_updated = 0  #: backwards run (each sent one update round, if any row had an id)
        self.ids = 0  #: ids looked up, over all forwards
        self.unique_ids = 0  #: distinct (table, id) pairs looked up, summed over forwards

    @classmethod
    def from_cluster(cls, backend: Backend, *, table_ids: list[int] | None = None,
                     pooling: PoolingType = PoolingType.SUM, **kw) -> "RemoteEmbeddingBagCollection":
        """One ``EmbeddingBagConfig`` per cluster table (``name``, ``dim``, ``rows``), with one
        feature of the table's own name.

        Args:
            backend: as for the constructor.
            table_ids: which cluster tables, in this order (default: all, config order).
            pooling: SUM or MEAN for every table.
            kw: passed to the constructor (``is_weighted``, ``validate``, ``fused_params``).

        A table without ``rows`` gets ``num_embeddings = 2**63 - 1`` (TorchRec needs a number;
        ids are not bounded by it, see :func:`num_embeddings`).
        """
        cfg = require_backend(backend, "RemoteEmbeddingBagCollection").cfg
        chosen = [cfg.table(i) for i in table_ids] if table_ids is not None else list(cfg.tables)
        confs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=num_embeddings(t),
                                    feature_names=[t.name], pooling=pooling) for t in chosen]
        return cls(confs, backend, **kw)

    # -- TorchRec's EmbeddingBagCollection interface ------------------------------------------

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        """The tables' configs, as TorchRec's ``EmbeddingBagCollection.embedding_bag_configs``."""
        return self._configs

    def is_weighted(self) -> bool:
        """Whether per-sample weights are used."""
        return self._is_weighted

    def use_fused_params(self, fused_params: dict | None, source: str = "fused_params") -> None:
        """Take a TorchRec sharder's ``fused_params`` (``None`` or ``{}``: none) after checking
        them against every table's config; in-backward choices are then checked again with them.

        Raises:
            ValueError: naming the first table whose optimizer, lr or eps they contradict (or a
                setting the shards do not apply); nothing is taken then.
        """
        fused = dict(fused_params) if fused_params else None
        if fused is not None:
            check_fused_params(self.cfg, self._configs, self._table_ids, fused, source)
        self._fused_params = fused
        forget_checks(self._placeholders() if hasattr(self, "embedding_bags") else [])

    @property
    def fused_optimizer(self) -> KeyedOptimizer:
        """TorchRec's ``FusedOptimizerModule`` interface: the optimizer that updates the rows in
        backward, which ``DistributedModelParallel`` collects into its ``fused_optimizer`` right
        after sharding. The shards apply it, so it is TorchRec's no-op ``EmptyFusedOptimizer``
        (its ``step`` does nothing, its state is empty).

        Raises:
            ValueError: DMP did not shard this module with :class:`RemoteEmbeddingBagCollectionSharder`
                (not among its ``sharders``, or its ``plan`` has no entry for the module), so a
                sharder's ``fused_params`` could not reach it; names the tables and the fix.
        """
        if self._sharded_by is None:
            names = ", ".join(repr(c.name) for c in self._configs)
            raise ValueError(
                f"tables {names}: DistributedModelParallel did not shard this RemoteEmbeddingBagCollection with "
                "RemoteEmbeddingBagCollectionSharder, so a sharder's fused_params cannot reach it (DMP hands a module "
                "only to the sharder of its exact type; EmbeddingBagCollectionSharder's fused_params would be "
                "ignored): add embnic.client_lib.torch.RemoteEmbeddingBagCollectionSharder(fused_params=...) to "
                "sharders=[...] (fused_params=None if you give none), and plan with the same sharders")
        return EmptyFusedOptimizer()

    def check_optimizers(self) -> None:
        """Check what TorchRec's ways to choose a table optimizer attached to the tables'
        placeholder weights against the cluster config, and make a matching in-backward optimizer
        TorchRec's no-op (:func:`~embnic.client_lib.torch_optim.check_in_backward`, which says
        what it raises). Runs at every forward and backward; O(tables).
        """
        check_in_backward(self.cfg, self._configs, self._table_ids, self._placeholders(), self._fused_params)

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Pooled embeddings of every (table, feature).

        Args:
            features: ``KeyedJaggedTensor`` with (at least) every feature of the tables,
                stride B; ``values`` int64 or int32 ids (n,) (floats are refused, as by
                TorchRec), ``lengths`` (F*B,), ``weights`` float32 (n,) when ``is_weighted``.
                A variable-batch KJT (VBE) is taken as TorchRec's EBC takes it: its
                ``inverse_indices`` (F, B) say which bag each output row pools.

        Returns:
            ``KeyedTensor`` with TorchRec's embedding names as keys, ``length_per_key`` = the
            dims, values float32 (B, Σ dims); an empty bag is 0. Backward sends the updates. A
            batch without ids sends nothing.

        Raises:
            ValueError: values not integer ids, lengths not integers, features missing from the
                KJT, a VBE KJT without ``inverse_indices`` whose features have different batch
                sizes or with inverse indices of the wrong shape or range; bad lengths, an id
                outside ``[0, num_embeddings)``, missing weights (validated inputs only); an
                optimizer choice that does not match the cluster config (:meth:`check_optimizers`).
            embnic.client_lib.client.EmbnicError: a shard failed (lookup).
        """
        self.check_optimizers()
        check_kjt(features, self._slot_features)
        vbe = features.variable_stride_per_key() or features.inverse_indices_or_none() is not None
        kjt = flatten_vbe(features, self._slot_features) if vbe else self._select(features)
        b = kjt.stride()
        vals = kjt.values().detach().numpy().astype(np.int64, copy=False)
        lens = kjt.lengths().detach().numpy()
        weights = None
        if self._is_weighted:
            weights = kjt.weights_or_none()
            if weights is None:
                raise ValueError("is_weighted=True but the KeyedJaggedTensor has no weights")
            weights = weights.to(torch.float32)
        if self._validate:
            check_ids(vals, lens, b, weights, self._slot_features, self._slot_limit)
        batch = KeyedJaggedBatch(list(self._slot_features), vals.view(np.uint64), lens, b)
        prep = prepare_batch(batch, self._slot_tables, validate=False)  # checked above (_check)
        self.ids += prep.num_ids
        self.unique_ids += prep.num_unique
        step = self._step(prep, weights, lens)
        self.steps_forward += 1
        placeholders = self._placeholders()
        if torch.is_grad_enabled() and (any(p.requires_grad for p in placeholders)
                                        or (weights is not None and weights.requires_grad)):
            out = _RemotePooling.apply(weights, self, step, *placeholders)
        else:
            out = self._pool(step)
        return KeyedTensor(keys=list(self._embedding_names), length_per_key=list(self._lengths_per_key),
                           values=out, key_dim=1)

    def _placeholders(self) -> list:
        return [self.embedding_bags[c.name].weight for c in self._configs]

    def _step(self, prep: PreparedBatch, weights, lens: np.ndarray) -> _Step:
        """Look every table's ``unique`` ids up in one round and lay the rows out for pooling: one
        ``(U, D)`` matrix (rows of narrower tables padded with zeros), each id's row index;
        ``lens`` the KJT's lengths (F*B,)."""
        counts = np.diff(prep.unique_offsets)
        D, U = self._dmax, prep.num_unique
        # no id (0 samples, or only empty bags): no round, nothing sent, no rows
        vals = self._lookup(prep.table_ids, counts, prep.unique) if U else np.zeros(0, np.float32)
        if self._uniform:
            rows = torch.from_numpy(np.asarray(vals, np.float32).reshape(U, D))
        else:
            rows = torch.zeros((U, D), dtype=torch.float32)
            rowdim = np.repeat(self._tdim, counts)
            rows.view(-1)[torch.from_numpy(concat_ranges(np.arange(U, dtype=np.int64) * D, rowdim))] = torch.from_numpy(
                np.asarray(vals, np.float32))
        fperm = prep.features
        gpos = np.argsort(fperm)  # (the inverse permutation)
        wperm = None
        if not np.array_equal(fperm, np.arange(fperm.size)):
            # where every slot's ids start in values, and how many it has
            per_slot = lens.reshape(fperm.size, -1).sum(axis=1) if len(lens) else np.zeros(fperm.size, np.int64)
            wperm = concat_ranges((np.cumsum(per_slot) - per_slot)[fperm], per_slot[fperm])
        return _Step(prep, rows, torch.from_numpy(prep.row_index), weights, wperm, gpos)

    # -- internals ----------------------------------------------------------------------------

    def _select(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """The KJT (every slot's feature in it: :func:`check_kjt`) restricted/reordered to the slots
        (a no-op when it already is)."""
        keys = features.keys()
        if keys == self._slot_features:
            return features
        index = {k: i for i, k in enumerate(keys)}
        return features.permute([index[f] for f in self._slot_features])

    def _grouped_weights(self, step: _Step) -> torch.Tensor | None:
        """The per-sample weights (detached) in prep's grouped order of ids."""
        if step.weights is None:
            return None
        w = step.weights.detach()
        return w if step.wperm is None else w[torch.from_numpy(step.wperm)]

    def _out_index(self, step: _Step) -> torch.Tensor | None:
        """int64 (B, Σ dims): where each output value is in the pooled ``(G, D)`` matrix (flat);
        None when the output is the pooled matrix's (S, B, D) permuted (one dim, slots grouped
        as prep groups its features)."""
        b = step.prep.stride
        if self._uniform and step.wperm is None and np.array_equal(step.gpos, np.arange(step.gpos.size)):
            return None
        key = (b, step.gpos.tobytes())
        idx = self._out_idx_cache.get(key)
        if idx is None:
            base = step.gpos[self._colslot] * b  # (Σ dims,)
            idx = torch.from_numpy((base[None, :] + np.arange(b, dtype=np.int64)[:, None]) * self._dmax
                                   + self._colc[None, :])
            if len(self._out_idx_cache) > 8:
                self._out_idx_cache.clear()
            self._out_idx_cache[key] = idx
        return idx

    def _pool(self, step: _Step) -> torch.Tensor:
        """float32 (B, Σ dims): every table's bags pooled into their feature's columns, all tables
        in one ``embedding_bag`` per pooling mode (each bag's sum over the same rows in the same
        order as a call per table)."""
        b, prep, D = step.prep.stride, step.prep, self._dmax
        psw, offsets = self._grouped_weights(step), torch.from_numpy(prep.offsets)
        pooled = None  # (G, D); a step without ids pools every bag to 0 (embedding_bag of no ids)
        for mode in self._modes:  # at most two: sum, mean
            p = F.embedding_bag(step.gidx, step.rows, offsets, mode=mode, per_sample_weights=psw,
                                include_last_offset=True)
            pooled = p if pooled is None else torch.where(self._bag_is(step, mode)[:, None], p, pooled)
        idx = self._out_index(step)
        S = step.gpos.size  # slots: shapes spelled out, so a batch of 0 samples gives (0, Σ dims)
        if idx is None:
            return pooled.reshape(S, b, D).permute(1, 0, 2).reshape(b, S * D)
        return pooled.reshape(-1)[idx]

    def _bag_is(self, step: _Step, mode: str) -> torch.Tensor:
        """bool (G,): bags of tables pooled with ``mode``."""
        return torch.from_numpy(np.repeat(self._tmode == mode, np.diff(step.prep.bag_offsets)))

    def _backward(self, step: _Step, grad_out: torch.Tensor, weights_need_grad: bool, trained: set):
        """Per-row gradients of every table in ``trained`` → one update round; returns the
        weights' gradient (of every table's ids). Every table at once: the bags' gradients from
        the output with one index, each id's with another, the rows' with one ``index_add_``."""
        self.check_optimizers()  # before the placeholders' in-backward optimizers would run
        b, prep, D = step.prep.stride, step.prep, self._dmax
        G = prep.lengths.size
        idx = self._out_index(step)
        if idx is None:
            g_bags = grad_out.reshape(b, step.gpos.size, D).permute(1, 0, 2).reshape(G, D)
        else:
            g_bags = torch.zeros((G, D), dtype=torch.float32)
            g_bags.view(-1)[idx.reshape(-1)] = grad_out.reshape(-1)
        g_w = torch.zeros_like(step.weights) if weights_need_grad else None
        if not prep.num_ids or (not trained and g_w is None):
            self.steps_updated += 1
            return g_w
        # numpy's repeat: torch.repeat_interleave took ~70 µs on 32 ids
        bag_of_id = torch.from_numpy(np.repeat(np.arange(G, dtype=np.int64), prep.lengths))
        g_ids = g_bags[bag_of_id]  # (n, D): the gradient every id occurrence receives
        if "mean" in self._modes:
            lens = torch.from_numpy(prep.lengths).clamp(min=1).to(torch.float32)
            denom = torch.where(self._bag_is(step, "mean"), lens, torch.ones_like(lens))
            g_ids = g_ids / denom[bag_of_id, None]
        if step.weights is not None:
            w = self._grouped_weights(step)
            if g_w is not None:
                gw = (g_ids * step.rows[step.gidx]).sum(dim=1)
                g_w = gw if step.wperm is None else g_w.index_copy_(0, torch.from_numpy(step.wperm), gw)
            g_ids = g_ids * w[:, None]
        keep = np.array([t in trained for t in prep.table_ids.tolist()], bool)
        counts = np.diff(prep.unique_offsets)
        if keep.any():
            g_rows = torch.zeros((prep.num_unique, D), dtype=torch.float32).index_add_(0, step.gidx, g_ids)
            rowdim = np.repeat(self._tdim, counts)
            if keep.all():
                sel_rows, keys = None, prep.unique
            else:
                sel_rows = concat_ranges(prep.unique_offsets[:-1][keep], counts[keep])
                keys = prep.unique[sel_rows]
            if self._uniform:
                grads = (g_rows.numpy() if sel_rows is None else g_rows.numpy()[sel_rows]).reshape(-1)
            else:
                r = np.arange(prep.num_unique, dtype=np.int64) if sel_rows is None else sel_rows
                grads = g_rows.numpy().reshape(-1)[concat_ranges(r * D, rowdim[r])]
            if keys.size:
                nz = keep & (counts > 0)
                self._update(prep.table_ids[nz], counts[nz], keys, grads)
        self.steps_updated += 1
        return g_w


def placeholder_names(model: torch.nn.Module) -> list[str]:
    """Fully qualified names of the ``(0, dim)`` placeholder weights of every
    :class:`RemoteEmbeddingBagCollection` in ``model`` (``"ebc.embedding_bags.a.weight"``, ...),
    for DDP's ``params_to_ignore`` (README, "PyTorch and TorchRec": its in-backward optimizers
    need CUDA).
    """
    return [f"{path}.embedding_bags.{c.name}.weight" if path else f"embedding_bags.{c.name}.weight"
            for path, m in model.named_modules() if isinstance(m, RemoteEmbeddingBagCollection)
            for c in m.embedding_bag_configs()]


class RemoteEmbeddingBagCollectionSharder(ModuleSharder[RemoteEmbeddingBagCollection]):
    """TorchRec's ``ModuleSharder`` for :class:`RemoteEmbeddingBagCollection`, with the
    ``fused_params`` a TorchRec sharder carries; give it to DMP beside TorchRec's sharders
    (README, "PyTorch and TorchRec"). The planner sees the tables' ``(0, dim)`` placeholders,
    ``data_parallel`` with the ``dense`` kernel (0 bytes); :meth:`shard` checks ``fused_params``
    against every table and keeps the module as it is.

    Args:
        fused_params: as TorchRec's sharders take them (``optimizer`` an fbgemm
            ``EmbOptimType``, ``learning_rate``, ``eps``, ...); None for none.
        qcomm_codecs_registry: TorchRec's argument of every sharder (no communication here).
    """

    def __init__(self, fused_params: dict | None = None, qcomm_codecs_registry: dict | None = None):
        super().__init__(qcomm_codecs_registry)
        self._fused_params = dict(fused_params) if fused_params else None

    @property
    def fused_params(self) -> dict | None:
        """The ``fused_params`` given (as TorchRec's ``BaseEmbeddingSharder.fused_params``)."""
        return self._fused_params

    @property
    def module_type(self) -> type:
        """:class:`RemoteEmbeddingBagCollection`: DMP's key for this sharder."""
        return RemoteEmbeddingBagCollection

    def shardable_parameters(self, module: RemoteEmbeddingBagCollection) -> dict[str, torch.nn.Parameter]:
        """``{table name: its (0, dim) placeholder weight}``, in table order."""
        return {c.name: module.embedding_bags[c.name].weight for c in module.embedding_bag_configs()}

    def sharding_types(self, compute_device_type: str) -> list[str]:
        """``["data_parallel"]``: every rank holds the same empty placeholders."""
        return [ShardingType.DATA_PARALLEL.value]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        """``["dense"]``: the placeholders are plain tensors (TorchRec's data-parallel kernel)."""
        return [EmbeddingComputeKernel.DENSE.value]

    def shard(self, module: RemoteEmbeddingBagCollection, params, env, device=None,
              module_fqn: str | None = None) -> RemoteEmbeddingBagCollection:
        """Check ``fused_params`` against every table and return ``module`` itself (class docstring).

        Args:
            module: the module DMP found at ``module_fqn``.
            params: its plan (``EmbeddingModuleShardingPlan``: one ``data_parallel``
                ``ParameterSharding`` per table).
            env, device: DMP's sharding environment and device (unused: nothing is placed).

        Raises:
            ValueError: naming the table whose optimizer, lr or eps ``fused_params`` contradict
                (:meth:`RemoteEmbeddingBagCollection.use_fused_params`), or a plan that places a
                table another way than ``data_parallel``.
        """
        other = {name: p.sharding_type for name, p in params.items()
                 if p.sharding_type != ShardingType.DATA_PARALLEL.value}
        if other:
            name, how = next(iter(other.items()))
            raise ValueError(f"table {name!r}: the plan shards it {how}, but RemoteEmbeddingBagCollection's tables "
                             "are data_parallel placeholders (their rows are on the embnic shards): plan with "
                             "RemoteEmbeddingBagCollectionSharder and constraints that allow data_parallel")
        src = f"{type(self).__name__}(fused_params=...)" + (f" of {module_fqn}" if module_fqn else "")
        module.use_fused_params(self._fused_params, source=src)
        module._sharded_by = type(self).__name__
        return module
