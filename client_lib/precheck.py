"""Checks of a whole lookup or update round, before any message of it is built or sent.

A round spans several tables and, per table, several shards (:mod:`~embnic.client_lib.routing`). A
shard refuses a bad message on its own (``KEY_OUT_OF_RANGE``, ``MALFORMED``: duplicate keys, a
gradient its optimizer must not apply — docs/protocol.md, "Reliability"), so a round checked
only by the shards can be applied in part: one shard's share applied, another's refused. What a
client can know from the cluster config alone it therefore checks here, over every table of the
call, and raises before the first frame leaves:

* the argument is ``{table_id: ...}`` of tables of the config;
* keys are 1-D integers in 0..2^64-1 and, for a table with ``rows``, below ``rows``;
* for updates: keys unique, gradients real numbers of shape ``(N, dim)`` that the table's
  optimizer may apply (:func:`~embnic.client_lib.table_numerics.gradient_rows_ok`, the rule
  the shards apply, after the wire's fp16 rounding).

Used by :class:`~embnic.client_lib.client.EmbeddingClient` (where its C plan's checks refuse a
round, to say why) and by :class:`~embnic.client_lib.local.LocalBackend`, so the in-process
reference refuses the same rounds, whole (the contract of :mod:`embnic.client_lib.backend`).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from . import consts
from .config import FLOAT32_MAX, ClusterConfig, TableConfig
from .table_numerics import table_label, validate_keys, validate_update


def _table(cfg: ClusterConfig, table_id) -> TableConfig:
    for t in cfg.tables:
        if t.id == table_id and not isinstance(table_id, bool):
            return t
    raise ValueError(f"unknown table {table_id!r} (tables of {cfg.path or 'the config'}: "
                     f"{cfg.table_ids_text()})")


def lookup_round(cfg: ClusterConfig, requests: Mapping) -> dict[int, np.ndarray]:
    """Check a lookup round; returns ``{table_id: keys uint64 (N_t,)}`` (duplicates allowed).

    Args:
        cfg: the cluster config (tables, rows).
        requests: ``{table_id: keys}``, keys any 1-D integer array or sequence of ints.

    Raises:
        ValueError: naming the table and the problem (not a mapping, unknown table, keys not
            1-D integers in 0..2^64-1, a key ``>= rows``).
    """
    if not isinstance(requests, Mapping):
        raise ValueError(f"a lookup takes {{table_id: keys}}, got {type(requests).__name__}")
    return {t.id: validate_keys(t, keys) for t, keys in ((_table(cfg, tid), k) for tid, k in requests.items())}


def update_round(cfg: ClusterConfig, updates: Mapping) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Check an update round; returns ``{table_id: (keys uint64 (N,), grads float32 (N, dim))}``.

    Args:
        cfg: the cluster config (tables: rows, dim, dtype, optimizer and lr for the gradient rule).
        updates: ``{table_id: (keys, grads)}``, keys unique.

    Raises:
        ValueError: naming the table and the problem (not a mapping, unknown table, an entry
            that is not a (keys, grads) pair, bad keys, a duplicate key, grads of another shape
            than ``(len(keys), dim)``, a gradient the shards refuse — NaN, inf, or a step that
            overflows float32).
    """
    if not isinstance(updates, Mapping):
        raise ValueError(f"an update takes {{table_id: (keys, grads)}}, got {type(updates).__name__}")
    out = {}
    for tid, entry in updates.items():
        t = _table(cfg, tid)
        if not isinstance(entry, (tuple, list)) or len(entry) != 2:
            raise ValueError(f"{table_label(t)}: an update entry is (keys, grads), got {type(entry).__name__}")
        out[t.id] = validate_update(t, entry[0], entry[1])
    return out


# -- the same checks over a whole round at once (what EmbeddingClient runs) ----------------------

_FAST_DTYPES = (np.dtype(np.uint64), np.dtype(np.int64))


def plain_arrays(mapping, keys_of):
    """``(table_ids int64 (T,), counts int64 (T,), keys uint64 (N,))`` of a round whose tables are
    ints (not bools: a table id of another type is no table, as in :func:`lookup_round`) and whose
    keys are 1-D uint64 (or non-negative int64) arrays, as they are — no check of the tables or the
    key ranges (the C plan makes them: native.prepare; :func:`_checked`); None for anything else
    (the per-table functions then convert, check and say why)."""
    if not isinstance(mapping, Mapping) or not mapping or not all(
            issubclass(t, (int, np.integer)) and t is not bool for t in set(map(type, mapping))):
        return None
    try:
        tids = np.fromiter(mapping.keys(), np.int64, len(mapping))
    except OverflowError:
        return None
    ks = [keys_of(v) for v in mapping.values()]
    dt = {k.dtype if isinstance(k, np.ndarray) and k.ndim == 1 else None for k in ks}
    if len(dt) > 1 or dt.pop() not in _FAST_DTYPES:
        return None
    keys = _u64_view(np.concatenate(ks))
    return None if keys is None else (tids, np.fromiter(map(len, ks), np.int64, len(ks)), keys)


def _u64_view(k: np.ndarray) -> np.ndarray | None:
    """uint64 or int64 keys ``k`` as uint64, no copy; None when an int64 key is negative."""
    if k.dtype == np.uint64:
        return k
    return None if k.size and int(k.min()) < 0 else k.view(np.uint64)


def plain_jagged(table_ids, counts, keys):
    """:func:`plain_arrays` of a round already flat, or None."""
    t = np.asarray(table_ids)
    c = np.asarray(counts)
    k = np.asarray(keys)
    if (t.dtype.kind not in "iu" or c.dtype.kind not in "iu" or t.ndim != 1 or c.shape != t.shape or k.ndim != 1
            or k.dtype not in _FAST_DTYPES or int(c.sum()) != k.size):
        return None
    k = _u64_view(k)
    return None if k is None else (np.ascontiguousarray(t, np.int64), np.ascontiguousarray(c, np.int64),
                                   np.ascontiguousarray(k))


def plain_grads(gs: list):
    """``(grads float32 (Σ,), shapes int64 (T, 2))``: every table's gradients as one array (call
    order) and the shape each came in (checked by the C plan against the keys and dims), or None
    unless each is a 2-D float32 array."""
    if any(not isinstance(g, np.ndarray) or g.dtype != np.float32 or g.ndim != 2 for g in gs):
        return None
    return np.concatenate(gs, axis=None), np.array([g.shape for g in gs], np.int64).reshape(len(gs), 2)


def _flat_keys(ta, mapping: Mapping, keys_of):
    """(tix int64 (T,), counts int64 (T,), keys uint64 (N,)) of a round :func:`plain_arrays` takes,
    of configured tables and keys in range, checked without a loop over tables; None where an
    entry is anything else or a check fails (the per-table functions above then say why)."""
    r = plain_arrays(mapping, keys_of)
    return None if r is None else _checked(ta, *r, distinct=True)  # a mapping's keys are distinct


def _checked(ta, table_ids: np.ndarray, counts: np.ndarray, keys: np.ndarray, distinct: bool = False):
    """The flat round's ``(tix, counts, keys uint64)`` when every table is configured (once) and every
    key is in range; else None."""
    tix = ta.index(table_ids)
    if (tix < 0).any() or (not distinct and np.unique(tix).size != tix.size) or keys.ndim != 1:
        return None
    keys = _u64_view(keys) if keys.dtype in _FAST_DTYPES else None
    if keys is None:
        return None
    bounded = ta.bounded[tix]
    if bounded.any() and keys.size:
        over = keys >= np.repeat(ta.rows[tix], counts)
        if (over & np.repeat(bounded, counts)).any():
            return None
    return tix, counts, keys


def _jagged(table_ids, counts, keys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A round given flat as arrays: ``(table_ids, counts int64, keys)``.

    Raises:
        ValueError: not one count per table, a negative count, or counts not adding up to the keys.
    """
    table_ids = np.asarray(table_ids)
    counts = np.asarray(counts, np.int64)
    keys = np.asarray(keys)
    if table_ids.ndim != 1 or counts.shape != table_ids.shape or (counts < 0).any() or int(counts.sum()) != keys.size:
        raise ValueError(f"{table_ids.size} tables, counts {counts.tolist()[:8]} adding up to {int(counts.sum())}, "
                         f"{keys.size} keys: one count per table, adding up to the keys")
    return table_ids, counts, keys


def _distinct(table_ids: np.ndarray) -> None:
    """Raises ValueError when a table appears twice among ``table_ids``."""
    if np.unique(table_ids).size != table_ids.size:
        raise ValueError(f"a table appears twice among {table_ids.tolist()}")


def lookup_jagged(cfg: ClusterConfig, ta, table_ids, counts, keys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`lookup_flat` of a round already flat: ``table_ids`` int (T,) distinct, ``counts`` int
    (T,), ``keys`` (Σ counts,) one table after the other. Returns ``(tix, counts, keys uint64)``.

    Raises:
        ValueError: counts that do not fit the keys; else as :func:`lookup_round` (naming the table).
    """
    table_ids, counts, keys = _jagged(table_ids, counts, keys)
    if table_ids.dtype.kind in "iu":
        r = _checked(ta, table_ids.astype(np.int64), counts, keys)
        if r is not None:
            return r
    _distinct(table_ids)
    return lookup_flat(cfg, ta, dict(zip(table_ids.tolist(), np.split(keys, np.cumsum(counts)[:-1]))))


def lookup_flat(cfg: ClusterConfig, ta, requests: Mapping) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`lookup_round` for a whole round at once: ``(tix int64 (T,), counts int64 (T,), keys
    uint64 (N,))`` — the call's tables (indices into ``ta``, a
    :class:`~embnic.client_lib.roundplan.TableArrays` of ``cfg``) in call order, their key counts and
    keys one table after the other. A fixed number of numpy calls whatever the tables when every
    entry is a 1-D uint64 (or int64) array; anything else, or a round that fails a check, goes
    through :func:`lookup_round` (which names the table and the problem).

    Raises:
        ValueError: as :func:`lookup_round`.
    """
    r = _flat_keys(ta, requests, lambda v: v)
    if r is not None:
        return r
    checked = lookup_round(cfg, requests)
    return _flatten(ta, checked, list(checked.values()))


def update_flat(cfg: ClusterConfig, ta, updates: Mapping):
    """:func:`update_round` for a whole round at once: ``(tix, counts, keys, grads)`` as
    :func:`lookup_flat`, ``grads`` float32 (Σ counts·dim_t,): every table's ``(counts[t], dim_t)``
    gradients flat, one table after the other. The fast path (a fixed number of numpy calls) takes
    rounds of 1-D uint64/int64 keys, each table's strictly increasing (sorted unique: what
    batch preparation gives), and float32 gradients of the right shapes whose largest magnitude
    no optimizer step can overflow (the sufficient test of
    :func:`~embnic.client_lib.table_numerics.gradient_rows_ok`, with the round's largest ``dim``
    and ``lr``); any other round goes through :func:`update_round` (the per-table checks, which
    name the table and the problem, or pass an unsorted unique round).

    Raises:
        ValueError: as :func:`update_round`.
    """
    if isinstance(updates, Mapping) and all(isinstance(e, tuple) and len(e) == 2 for e in updates.values()):
        r = _flat_keys(ta, updates, lambda e: e[0])
        if r is not None:
            tix, counts, keys = r
            g = _fast_grads(ta, tix, counts, keys, [e[1] for e in updates.values()])
            if g is not None:
                return tix, counts, keys, g
    checked = update_round(cfg, updates)
    tix, counts, keys = _flatten(ta, checked, [k for k, _ in checked.values()])
    grads = (np.concatenate([g for _, g in checked.values()], axis=None) if checked
             else np.zeros(0, np.float32))
    return tix, counts, keys, grads.astype(np.float32, copy=False)


def _flatten(ta, checked: dict, keys: list):
    tix = ta.index(np.fromiter(checked.keys(), np.int64, len(checked)))
    counts = np.fromiter(map(len, keys), np.int64, len(keys))
    return tix, counts, (np.concatenate(keys) if keys else np.zeros(0, np.uint64)).astype(np.uint64, copy=False)


def _fast_grads(ta, tix, counts, keys, gs: list):
    """The gradients flat float32, or None where the fast path does not vouch for them."""
    if not _sorted_unique(keys, counts):
        return None
    dims = ta.dim[tix]
    if [getattr(g, "shape", None) for g in gs] != list(zip(counts.tolist(), dims.tolist())):
        return None
    if any(not isinstance(g, np.ndarray) or g.dtype != np.float32 for g in gs):
        return None
    g = np.concatenate(gs, axis=None) if gs else np.zeros(0, np.float32)
    return g if _grads_ok(ta, tix, g) else None


def _sorted_unique(keys: np.ndarray, counts: np.ndarray) -> bool:
    """Each table's keys strictly increasing (so unique), the boundaries between tables aside."""
    n = keys.size
    if n > 1:
        inc = keys[1:] > keys[:-1]
        ko = np.cumsum(counts)[:-1]
        inc[ko[(ko > 0) & (ko < n)] - 1] = True
        return bool(inc.all())
    return True


def _grads_ok(ta, tix, g: np.ndarray) -> bool:
    """No row of the flat float32 gradients ``g`` can be refused: the sufficient test of
    :func:`~embnic.client_lib.table_numerics.gradient_rows_ok` with the round's largest dim and lr."""
    if not g.size:
        return True
    m = float(np.abs(g).max())  # NaN when any value is NaN: refused below
    fp16 = ta.dtype[tix] == consts.DType.FP16
    if fp16.any():
        if not m <= 65504.0:
            return False
        m *= 1.001  # fp16 rounding may grow a value by 2^-11 of it
    if not m < math.inf:
        return False
    ada = ta.adagrad[tix]
    dims = ta.dim[tix]
    if ada.any() and not 2.0 * float(dims[ada].max()) * m * m < FLOAT32_MAX:
        return False
    if (~ada).any() and not float(np.abs(ta.lr[tix][~ada]).max()) * m * (1 + 2.0 ** -20) < FLOAT32_MAX:
        return False
    return True


def update_jagged(cfg: ClusterConfig, ta, table_ids, counts, keys, grads):
    """:func:`update_flat` of a round already flat: ``table_ids``, ``counts``, ``keys`` as
    :func:`lookup_jagged`, ``grads`` float32 (Σ counts·dim_t,) one table after the other.
    Returns ``(tix, counts, keys uint64, grads float32)``.

    Raises:
        ValueError: counts or gradients that do not fit the keys; else as :func:`update_round`.
    """
    table_ids, counts, keys = _jagged(table_ids, counts, keys)
    grads = np.asarray(grads).reshape(-1)
    if table_ids.dtype.kind in "iu":
        r = _checked(ta, table_ids.astype(np.int64), counts, keys)
        if r is not None:
            tix, counts, k = r
            if (grads.dtype == np.float32 and grads.size == int((counts * ta.dim[tix]).sum())
                    and _sorted_unique(k, counts) and _grads_ok(ta, tix, grads)):
                return tix, counts, k, grads
    _distinct(table_ids)
    tix = ta.index(table_ids)
    dims = np.where(tix >= 0, ta.dim[tix], 0)
    vo = np.concatenate([[0], np.cumsum(counts * dims)])
    if int(vo[-1]) != grads.size:
        raise ValueError(f"{grads.size} gradient values for {int(vo[-1])} (one row of each table's dim per key)")
    ks = np.split(keys, np.cumsum(counts)[:-1])
    gs = [grads[a:b].reshape(-1, d) if d else grads[a:b] for a, b, d in zip(vo[:-1].tolist(), vo[1:].tolist(),
                                                                           dims.tolist())]
    return update_flat(cfg, ta, {t: (k, g) for t, k, g in zip(table_ids.tolist(), ks, gs)})
