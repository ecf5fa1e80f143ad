"""Benchmark of the client's round (``embnic bench client``): does a round's work grow with the
number of tables it spans?

The method: docs/bench.md, "embnic bench client: the client's round".
"""
from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from embnic.client_lib.client import EmbeddingClient
from embnic.client_lib.config import parse_config
from embnic.testbed.net.toml_writer import dump_toml

from .e2e import machine
from .loadgen import ShardProcess
from .results import merge_json

KEYS = (832, 6656, 26624)
TABLES = (2, 26)
TARGET = 1.2


def _cluster(n_tables: int = 26) -> dict:
    """The bench cluster: ``n_tables`` tables of dim 8 fp32 (Adagrad), two loopback shards, hash sharding."""
    return {"cluster": {"name": "bench-client", "mtu": 1500, "seed": 5, "sharding": "hash", "timeout_ms": 500,
                        "retries": 10},
            "tables": [{"id": t, "name": f"C{t + 1}", "dim": 8, "dtype": "fp32", "optimizer": "adagrad",
                        "lr": 0.01} for t in range(n_tables)],
            "shards": [{"id": s, "ip": "127.0.0.1", "port": 17960 + s} for s in range(2)],
            "clients": [{"id": 1, "ip": "127.0.0.1", "port": 17969}]}


def _round_keys(rng, k: int, n_tables: int, sets: int) -> list[dict]:
    """``sets`` lookup rounds of ``k`` keys in all, ``k / n_tables`` distinct random ids per table."""
    per = k // n_tables
    return [{t: np.unique(rng.integers(0, 2**63, per * 2, dtype=np.uint64))[:per] for t in range(n_tables)}
            for _ in range(sets)]


def measure(cfg, shard_cpu: Callable[[], float], rounds: int, keys=None, tables=TABLES, seed: int = 1) -> dict:
    """Per (op, K, tables): medians of the client's CPU µs, wall µs and the shards' CPU µs per round
    (``shard_cpu()``: the shards' CPU seconds so far)."""
    keys = KEYS if keys is None else keys
    rng = np.random.default_rng(seed)
    work = {(k, t): _round_keys(rng, k, t, 4) for k in keys for t in tables}
    out: dict = {}
    with EmbeddingClient(cfg, 1, bind=("127.0.0.1", 0)) as c:
        grads = {kt: [{t: (v, np.full((len(v), 8), 1e-3, np.float32)) for t, v in r.items()} for r in rs]
                 for kt, rs in work.items()}
        for kt, rs in work.items():  # make every row once, untimed
            for r, g in zip(rs, grads[kt]):
                c.lookup(r)
                c.update(g)
        acc: dict = {}
        for i in range(rounds):
            for k in keys:
                for t in (tables if i % 2 == 0 else tables[::-1]):
                    r, g = work[k, t][i % 4], grads[k, t][i % 4]
                    for op in ("lookup", "update"):
                        s0, w0, c0 = shard_cpu(), time.perf_counter(), time.thread_time()
                        c.lookup(r) if op == "lookup" else c.update(g)
                        c1, w1, s1 = time.thread_time(), time.perf_counter(), shard_cpu()
                        acc.setdefault((op, k, t), []).append(((c1 - c0) * 1e6, (w1 - w0) * 1e6, (s1 - s0) * 1e6))
        msgs = c.stats.messages_per_round()
    for (op, k, t), v in acc.items():
        a = np.asarray(v)
        out[f"{op}_{k}_{t}"] = {"client_cpu_us": float(np.median(a[:, 0])), "wall_us": float(np.median(a[:, 1])),
                                "shard_cpu_us": float(np.median(a[:, 2]))}
    out["request_messages_per_round"], out["shards_per_round"] = msgs
    return out


def run(out_dir: Path, *, rounds: int = 40, keys=None, log=print) -> dict:
    """Run the benchmark and merge ``client`` into ``out_dir/bench.json``.

    Returns:
        ``{native: {<op>_<K>_<T>: {client_cpu_us, wall_us, shard_cpu_us}, ...},
        ratios: {native: {ratio_cpu_<op>_<K>, ratio_wall_<op>_<K>}}, targets, machine, config}``.

    Raises:
        OperationalError: a shard did not start. NativeLibraryError: the client's C library is
            missing or stale.
    """
    keys = KEYS if keys is None else keys
    m0 = machine()
    res: dict = {}
    cfg = parse_config(_cluster())
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stop:
        procs = []  # the config's shards as processes on free loopback ports, the config pointed at them
        for s in cfg.shards:
            procs.append(ShardProcess(Path(d), f"client-shard{s.id}", dump_toml(_cluster()), shard=s.id))
            stop.callback(procs[-1].stop)
            procs[-1].start()
        cfg = dataclasses.replace(cfg, shards=tuple(dataclasses.replace(s, port=p.port)
                                                    for s, p in zip(cfg.shards, procs)))
        log(f"client: C round, {rounds} rounds of each of {len(keys)} sizes x {len(TABLES)} table counts")
        res["native"] = measure(cfg, lambda: sum(p.cpu() for p in procs), rounds, keys)
    ratios = {name: {f"ratio_{m}_{op}_{k}": res[name][f"{op}_{k}_26"][f"{mk}"] / res[name][f"{op}_{k}_2"][f"{mk}"]
                     for op in ("lookup", "update") for k in keys
                     for m, mk in (("cpu", "client_cpu_us"), ("wall", "wall_us"), ("shard_cpu", "shard_cpu_us"))}
              for name in res}
    worst = max(v for k, v in ratios["native"].items() if k.startswith("ratio_cpu_"))
    out = {**res, "ratios": ratios,
           "targets": {"client_round_26_over_2_tables_le_1.2": {"ratio": worst, "met": worst <= TARGET}},
           "machine": {"before": m0, "after": machine()},
           "config": {"tables": 26, "dim": 8, "shards": 2, "sharding": "hash", "rounds": rounds, "keys": list(keys),
                      "how": "same total keys over 2 or 26 tables; client CPU = thread_time of the client's calls"}}
    merge_json(Path(out_dir) / "bench.json", "client", out)  # (it makes the directory)
    return out
