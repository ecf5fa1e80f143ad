"""Benchmark of batch preparation on Criteo batches (``embnic bench prep``).

The method: docs/bench.md, "embnic bench prep: batch preparation".
"""
from __future__ import annotations

import platform
import time
from pathlib import Path

import numpy as np

from embnic.client_lib.batch import KeyedJaggedBatch, prepare_batch
from embnic.client_lib.config import parse_config
from embnic.client_lib.roundplan import TableArrays, shard_index

from embnic.testbed.bench.results import merge_json
from embnic.testbed.training import criteo


def bench_config(num_shards: int = 2, rows: int = 65536, dim: int = 8):
    """A cluster config with the 26 Criteo tables and ``num_shards`` (loopback) shards."""
    return parse_config({
        "cluster": {"name": "bench", "sharding": "hash"},
        "tables": criteo.default_tables(rows=rows, dim=dim),
        "shards": [{"id": i, "ip": "127.0.0.1", "port": 17880 + i} for i in range(num_shards)],
        "clients": [{"id": 1, "ip": "127.0.0.1", "port": 17890}],
    })


def run(out_dir: Path, *, batch_size: int = 4096, batches: int = 8, repeats: int = 7,
        num_shards: int = 2, seed: int = 0) -> dict:
    """Run the benchmark and merge ``prep`` into ``out_dir/bench.json``.

    Returns:
        ``{ids_per_s, np_unique_ids_per_s, ratio, dedup_ratio, batch_size, features, ...}``;
        ``ids_per_s`` counts every id of a batch (duplicates included) per second of wall time.
    """
    cfg = bench_config(num_shards)
    ftab = list(range(criteo.NUM_SPARSE))
    data = criteo.load_criteo(criteo.sample_path("train"), rows=[t.rows for t in cfg.tables])
    rng = np.random.default_rng(seed)
    names = list(criteo.SPARSE_NAMES)
    kjts = [KeyedJaggedBatch.from_dense(names, data.sparse[rng.integers(0, len(data), batch_size)])
            for _ in range(batches)]
    n_ids = sum(len(k.values) for k in kjts)

    ta = TableArrays(cfg)
    tix = ta.index(np.unique(ftab))

    def ours():
        for k in kjts:
            p = prepare_batch(k, ftab)
            sidx = shard_index(ta, tix, np.diff(p.unique_offsets), p.unique)
            np.argsort(sidx.astype(np.uint8), kind="stable")

    def baseline():
        for k in kjts:
            np.unique(k.values, return_inverse=True)

    ours(), baseline()  # warm up
    t_ours, t_base = [], []
    for _ in range(repeats):
        for fn, acc in ((ours, t_ours), (baseline, t_base)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    whole = prepare_batch(KeyedJaggedBatch.from_dense(names, data.sparse), ftab)
    ids_per_s = n_ids / float(np.median(t_ours))
    base_per_s = n_ids / float(np.median(t_base))
    res = {
        "ids_per_s": ids_per_s,
        "np_unique_ids_per_s": base_per_s,
        "ratio": ids_per_s / base_per_s,
        "dedup_ratio": whole.dedup_ratio,
        "batch_size": batch_size,
        "features": criteo.NUM_SPARSE,
        "batches": batches,
        "repeats": repeats,
        "num_shards": num_shards,
        "numpy": np.__version__,
        "machine": platform.machine(),
    }
    merge_json(Path(out_dir) / "bench.json", "prep", res)
    return res
