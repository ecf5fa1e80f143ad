"""The backend contract: where a training job's embedding rows live, one round of every table at once.

Every backend implements :class:`Backend` — the parameter-server shards through
:class:`~embnic.client_lib.client.EmbeddingClient` and the in-process reference
:class:`~embnic.client_lib.local.LocalBackend` — and every caller (the training loop, the
PyTorch front end, the DLRM workers) takes one.

A call is a **round**: the keys of every table of a training step at once, never one table at a
time. It comes in two equivalent layouts:

* **mapping** — ``lookup({table_id: keys})`` → ``{table_id: rows}``, ``update({table_id: (keys,
  grads)})``;
* **flat** (TorchRec's jagged layout) — ``table_ids`` int (T,) distinct configured tables,
  ``counts`` int (T,) keys of each, ``keys`` uint64 (Σ counts,) one table after the other; rows
  and gradients float32 (Σ counts_t·dim_t,), table ``t``'s ``(counts_t, dim_t)`` row-major block
  after the previous table's.

Keys are ids in 0..2^64-1 (a table with ``rows`` takes only ``< rows``). Rows are float32 as a
client receives them (an fp16 table's values rounded to float16 and widened back). An update's
keys are unique within a table, one gradient row per key; the backend applies each table's
optimizer (SGD or row-wise Adagrad, :mod:`embnic.client_lib.table_numerics`) — the same floats,
bit for bit, whichever backend.

**Whole rounds.** A round is checked over every table before anything of it is applied
(:mod:`embnic.client_lib.precheck`): a round one table of which is refused raises ``ValueError``
naming that table and changes no table. So a backend applies an update round whole or not at
all (shard failures aside: :class:`~embnic.client_lib.errors.ShardUnavailableError`, raised by
the network backend when a shard stops answering mid-round).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from .config import ClusterConfig

#: what :func:`require_backend` looks for
METHODS = ("lookup", "lookup_flat", "update", "update_flat")


@runtime_checkable
class Backend(Protocol):
    """Where embedding rows live (module docstring): one round of every table per call.

    Attributes:
        cfg: the cluster config whose tables (ids, ``dim``, ``rows``, dtype, optimizer) the
            backend serves.

    Every method raises ``ValueError`` before anything is applied or sent, naming the table and
    the problem: an unknown table, a table twice (flat), counts that do not add up to the keys,
    keys not 1-D integers in 0..2^64-1, a key ``>= rows``; for updates also duplicate keys of a
    table, gradients not of shape ``(counts_t, dim_t)``, a gradient the optimizer must not apply
    (NaN, inf, a step that overflows float32: :func:`~embnic.client_lib.table_numerics.gradient_rows_ok`).
    The network backend also raises :class:`~embnic.client_lib.errors.ShardUnavailableError` (a
    shard did not answer after its retries) and :class:`~embnic.client_lib.errors.ShardError` (a
    shard answered ERROR).
    """

    cfg: ClusterConfig

    def lookup(self, requests: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        """``{table_id: keys uint64 (N_t,)}`` (duplicates allowed) → ``{table_id: float32 (N_t, dim_t)}``,
        rows in key order, tables in call order."""
        ...

    def lookup_flat(self, table_ids, counts, keys) -> np.ndarray:
        """Flat round (module docstring) → float32 (Σ counts_t·dim_t,): every table's rows in key
        order, one table after the other."""
        ...

    def update(self, updates: Mapping[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Apply ``{table_id: (keys uint64 (N_t,) unique, grads float32 (N_t, dim_t))}``; returns once
        every table's rows are updated (the network backend: once every shard acked)."""
        ...

    def update_flat(self, table_ids, counts, keys, grads) -> None:
        """:meth:`update` of a flat round: ``grads`` float32 (Σ counts_t·dim_t,), one table's rows
        after the other."""
        ...


def require_backend(obj, who: str) -> Backend:
    """``obj`` if it implements :class:`Backend` (``cfg`` and the four methods), for callers that
    take one (``who``: the caller, named in the error).

    Raises:
        TypeError: naming what ``obj`` lacks, e.g. an object with only per-table
            ``lookup(table_id, keys)`` methods.
    """
    missing = [m for m in ("cfg",) + METHODS if not hasattr(obj, m)]
    if missing:
        raise TypeError(f"{who} needs a backend (embnic.client_lib.backend.Backend: an EmbeddingClient or a "
                        f"LocalBackend), got {type(obj).__name__} without {', '.join(missing)}")
    return obj
