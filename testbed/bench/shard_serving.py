"""Benchmark of one parameter-server shard on loopback, without the card (``embnic bench server``).

The method: docs/bench.md, "embnic bench server: one shard on loopback".
"""
from __future__ import annotations

import contextlib
import os
import platform
import shutil
import time
from pathlib import Path

import numpy as np

from embnic.client_lib.config import parse_config
from embnic.client_lib.local import LocalBackend
from embnic.client_lib.routing import shard_of
from embnic.testbed.net.toml_writer import dump_toml
from embnic.testbed.server import udpio

from . import shard_rounds
from .loadgen import LoadGen, Requests, ShardProcess, machine_idle
from .results import at_least, load_since, merge_json

KEYS = (1, 64, 4096)
OPS = ("lookup", "update")
DIM = 8
POOL = 65536
TARGET_LOOKUP_4096 = 0.7  #: 4096-key lookup rows/s of the shard ÷ LocalBackend's (issue "the round at the speed of the path")
TARGET_LOOKUP_1 = 0.3  #: 1-key lookups, likewise
#: rows per shard CPU second of 2 shards on one host ÷ of 1 (issue #36 item 3; rows per second, 1.6 ×
#: where two cores are free besides the load generator, is reported, not a target here)
TARGET_SHARDS2_CPU = 0.9
#: update rows/s with the write-ahead log ÷ without, at 4096 and at 1 key per message (issue #36 item 2)
TARGET_WAL_4096, TARGET_WAL_1 = 0.8, 0.5
WARM_STEP = 2048  #: ids per update message when the pools are materialised

TABLES = [{"id": t, "dim": DIM, "dtype": "fp32", "optimizer": "adagrad", "lr": 0.01} for t in (0, 1)]


def _cluster(mtu: int, shards: int = 1, **client: int) -> dict:
    """The bench cluster as parsed TOML: tables 0 and 1 (dim 8 fp32, Adagrad, any uint64 id, hash
    sharded), ``shards`` shards on 127.0.0.1:17870, 17871, ...; ``client``: the client's settings
    (``timeout_ms``, ``retries``)."""
    return {"cluster": {"name": "bench-server", "mtu": mtu, "seed": 11, **client}, "tables": TABLES,
            "shards": [{"id": s, "ip": "127.0.0.1", "port": 17870 + s} for s in range(shards)],
            "clients": [{"id": 1, "ip": "127.0.0.1"}]}


def _local(lb: LocalBackend, w: Requests) -> tuple[float, float]:
    """(wall seconds, CPU seconds) LocalBackend takes for the same messages (a round of one
    table per message, as the messages are)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    for i, (t, k) in enumerate(zip(w.tables, w.keys)):
        lb.lookup({t: k}) if w.op == "lookup" else lb.update({t: (k, w.grads[i])})
    return time.perf_counter() - t0, time.thread_time() - c0


def _pool_chunks(pools: dict):
    """(table, owner (of 2 shards), sorted ids, zero gradients) of every pool, :data:`WARM_STEP`
    ids at a time (``pools``: (table, owner) -> uint64 ids)."""
    for (t, o), pool in pools.items():
        for a in range(0, pool.size, WARM_STEP):
            k = np.sort(pool[a:a + WARM_STEP])
            yield t, o, k, np.zeros((k.size, DIM), np.float32)


def measure_shard(workdir: Path, shards: int, loads: dict, pools: dict, mtu: int,
                  window: int, lb_times: dict | None, lb: LocalBackend | None, wal: bool = False) -> dict:
    """Run every workload against ``shards`` shard processes of the bench config (one host: one
    process per shard, docs/server.md "More cores: more shards"), every pool row materialised
    first (one update each); message ``i`` goes to the shard owning its keys (of 2: ``(i // 2) %
    2``; of 1: shard 0), each shard with ``window`` messages in flight. LocalBackend runs
    alternate with them when ``lb`` is given (their seconds go into ``lb_times``); ``wal``: the
    shard keeps its write-ahead log (``--checkpoint-dir`` ``workdir/wal-<tag>``, emptied: a
    record appended per update, group commit: each ack held until an ``fdatasync`` of the log's
    sync thread covers its record), no periodic checkpoint.

    Args:
        shards: 1 or 2.
        loads: ``(op, keys per message)`` -> (throughput runs' :class:`Requests`, the latency
            run's), each a dict by ``shards``.

    Returns:
        ``{"<op>_<keys>": figures, "log": shard 0's log}``: rows/s and messages/s (median of the
        throughput runs), latency percentiles (µs), the CPU of the shards (summed) and of the load
        generator.

    Raises:
        OperationalError: the shard did not start, answered with an error or stopped answering.
    """
    tag = f"shards-{shards}" + ("-wal" if wal else "")
    args = []
    if wal:
        shutil.rmtree(Path(workdir) / f"wal-{tag}", ignore_errors=True)
        args += ["--checkpoint-dir", str(Path(workdir) / f"wal-{tag}")]
    toml = dump_toml(_cluster(mtu, shards))
    with contextlib.ExitStack() as stack:
        sps = []
        for s in range(shards):
            sps.append(ShardProcess(workdir, f"{tag}-{s}", toml, args, shard=s))
            stack.callback(sps[-1].stop)
            sps[-1].start()
        return _measure(sps, loads, pools, mtu, window, lb_times, lb)


def _measure(sps: list, loads: dict, pools: dict, mtu: int, window: int, lb_times: dict | None,
             lb: LocalBackend | None) -> dict:
    """:func:`measure_shard`'s runs against the started shards ``sps`` (shard ``s`` is ``sps[s]``)."""
    def shard_cpu() -> float:
        return sum(sp.cpu() for sp in sps)

    S = len(sps)
    out: dict = {}
    with contextlib.closing(LoadGen([sp.port for sp in sps])) as gen:
        for j, (t, o, k, g) in enumerate(_pool_chunks(pools)):
            gen.run(Requests("update", [t], [k], [g], DIM, mtu, 0x7F000000 + j, shards=[o % S]), 1)
        for (op, nk), (w_thrs, w_lat) in loads.items():
            w_thrs, w_lat = [w[S] for w in w_thrs], w_lat[S]
            cpu0, gen0, idle0 = shard_cpu(), time.process_time(), machine_idle()
            secs = []
            for w_thr in w_thrs:  # repeats, each with its own message ids, LocalBackend in between
                secs.append(gen.run(w_thr, window * S)[0])  # each shard ``window`` in flight, as one has
                if lb is not None:
                    lb_times.setdefault((op, nk), []).append(_local(lb, w_thr))
            cpu, gen_cpu, idle1 = shard_cpu() - cpu0, time.process_time() - gen0, machine_idle()
            _, lat = gen.run(w_lat, 1)
            n, sec = w_thrs[0].count, float(np.median(secs))
            out[f"{op}_{nk}"] = {
                "rows_per_s": n * nk / sec, "msgs_per_s": n / sec,
                "p50_us": float(np.percentile(lat, 50)), "p99_us": float(np.percentile(lat, 99)),
                "messages": n * len(w_thrs), "repeats": len(w_thrs),
                "rows_per_s_runs": [n * nk / x for x in secs],
                "request_frames_per_msg": float(w_thrs[0].counts.mean()),
                "reply_frames_per_msg": w_thrs[0].reply_frames, "seconds": sec, "shard_cpu_s": cpu,
                "rows_per_shard_cpu_s": n * len(w_thrs) * nk / max(cpu, 1e-9), "loadgen_cpu_s": gen_cpu,
                "machine_idle_share": (idle1[0] - idle0[0]) / max(idle1[1] - idle0[1], 1.0)}
    out["log"] = str(sps[0].log_path)
    return out


def _loads(pools: dict, mtu: int, scale: float, repeats: int, rng: np.random.Generator) -> dict:
    """``(op, keys per message)`` -> (``repeats`` throughput workloads of about 600k rows (at least
    60, at most 3000 messages, × scale), a latency workload), every message id distinct; each
    workload as ``{1: Requests to 1 shard, 2: the same messages to 2 shards}``. Message i asks
    table i % 2 for distinct ids of the pool of owner (i // 2) % 2 (``pools``: (table, owner of 2
    shards) -> uint64 ids); an update's gradients are 0.1 × standard normal."""
    loads, first = {}, 1

    def workload(op: str, nk: int, count: int) -> dict[int, Requests]:
        nonlocal first
        tables = [i % 2 for i in range(count)]
        owners = np.arange(count) // 2 % 2
        keys = [np.sort(rng.choice(pools[(t, o)], nk, replace=False)) for t, o in zip(tables, owners.tolist())]
        grads = ([rng.standard_normal((nk, DIM)).astype(np.float32) * np.float32(0.1) for _ in keys]
                 if op == "update" else None)
        first += count
        return {1: Requests(op, tables, keys, grads, DIM, mtu, first - count),
                2: Requests(op, tables, keys, grads, DIM, mtu, first - count, shards=owners)}

    for op in OPS:
        for nk in KEYS:
            c = max(10, int(max(60, min(3000, 600_000 // nk)) * scale))
            loads[(op, nk)] = ([workload(op, nk, c) for _ in range(repeats)],
                               workload(op, nk, max(20, min(c, 300))))
    return loads


def _local_figures(lb_times: dict, loads: dict) -> dict:
    """LocalBackend's rows/s, messages/s and rows per CPU second of every workload (medians)."""
    out = {}
    for (op, nk), ts in lb_times.items():
        wall = float(np.median([t[0] for t in ts]))
        cpu = float(np.median([t[1] for t in ts]))
        n = loads[(op, nk)][0][0][1].count
        out[f"{op}_{nk}"] = {"rows_per_s": n * nk / wall, "msgs_per_s": n / wall,
                             "rows_per_cpu_s": n * nk / max(cpu, 1e-9), "runs": len(ts)}
    return out


def _ratios(res: dict) -> None:
    """The ``ratio_*`` keys of ``res`` (docs/bench.md), from the figures they name."""
    def ratio(name: str, k: str, a: str, b: str, fa: str = "rows_per_s", fb: str = "rows_per_s") -> None:
        res[f"{name}_{k}"] = res[a][k][fa] / res[b][k][fb]

    for k in (f"{op}_{nk}" for op in OPS for nk in KEYS):
        ratio("ratio", k, "shards_1", "local")
        ratio("ratio_cpu", k, "shards_1", "local", "rows_per_shard_cpu_s", "rows_per_cpu_s")
        ratio("ratio_shards2", k, "shards_2", "shards_1")
        ratio("ratio_shards2_cpu", k, "shards_2", "shards_1", "rows_per_shard_cpu_s", "rows_per_shard_cpu_s")
    for k in (f"update_{nk}" for nk in KEYS):
        ratio("ratio_wal", k, "shards_1_wal", "shards_1")
        ratio("ratio_wal_cpu", k, "shards_1_wal", "shards_1", "rows_per_shard_cpu_s", "rows_per_shard_cpu_s")


def _targets(res: dict) -> dict:
    """Each target: what it asks, what was measured, whether it was met."""
    rd = res["rounds"]
    return {
        **{f"wal_update_{k}_vs_no_wal": at_least(t, res[f"ratio_wal_update_{k}"],
                                                   "update rows/s with the write-ahead log (group commit: each "
                                                   "ack held until its record is durable) ÷ without")
           for k, t in ((4096, TARGET_WAL_4096), (1, TARGET_WAL_1))},
        "lookup_4096_vs_local": at_least(TARGET_LOOKUP_4096, res["ratio_lookup_4096"]),
        "lookup_1_vs_local": at_least(TARGET_LOOKUP_1, res["ratio_lookup_1"]),
        "rounds_26_vs_2_tables": {"target": shard_rounds.TARGET_RATIO,
                                  "measured": max(rd["ratio_26_vs_2_lookup"], rd["ratio_26_vs_2_update"]),
                                  "met": rd["met"],
                                  "note": "the shard's CPU for one round (lookup, update) of the same ids over 26 "
                                          "tables ÷ over 2 tables (the larger of the two ratios)"},
        "shards2_vs_shards1_per_cpu": at_least(
            TARGET_SHARDS2_CPU, min(res[f"ratio_shards2_cpu_{op}_{nk}"] for op in OPS for nk in (64, 4096)),
            "rows per shard CPU second of 2 shards on this host ÷ of 1, the least of lookups and updates "
            "at 64 and 4096 keys"),
    }


def run(out_dir: Path, *, mtu: int = 1500, window: int = 4, scale: float = 1.0, seed: int = 0, repeats: int = 3,
        log=print) -> dict:
    """Run the benchmark and merge ``server`` into ``out_dir/bench.json`` (docs/bench.md).

    Args:
        out_dir: where bench.json (and the shards' logs, under ``server-logs/``) go.
        mtu: the cluster MTU (bytes).
        window: messages in flight per shard in the throughput runs (the two-shard run keeps
            ``2 × window`` in flight: each shard as many as the lone one, as clients' rounds,
            one message per shard each, give every shard its own).
        scale: multiplies the number of messages per measurement.
        repeats: throughput runs per configuration, each followed by LocalBackend doing the
            same work; rows/s are the medians (``rows_per_s_runs``: every run's).

    Returns:
        the ``server`` result (``shards_1``, ``shards_1_wal``, ``shards_2``, ``rounds``, ``local``, the
        ``ratio_*`` keys, ``targets`` and ``load``).

    Raises:
        OperationalError: a shard did not start, answered with an error or stopped answering.
    """
    out_dir = Path(out_dir)
    workdir = out_dir / "server-logs"
    workdir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    two = parse_config(_cluster(mtu, 2))
    pools = {}
    for t in (0, 1):  # each table's pool split by its owner of 2 shards
        ids = np.unique(rng.integers(0, 2**64 - 1, POOL + 64, dtype=np.uint64, endpoint=True))[:POOL]
        owner = shard_of(two, t, ids)
        pools.update({(t, o): ids[owner == o] for o in (0, 1)})
    loads = _loads(pools, mtu, scale, repeats, rng)
    load0 = os.getloadavg()
    lb = LocalBackend(parse_config(_cluster(mtu, timeout_ms=500, retries=10)))  # the client's timeout 500 ms
    for t, _, k, g in _pool_chunks(pools):  # materialise the pool in the reference (as _warm does in the shard)
        lb.update({t: (k, g)})
    lb_times: dict = {}
    res: dict = {}
    log("bench server: one shard and LocalBackend, alternating ...")
    res["shards_1"] = measure_shard(workdir, 1, loads, pools, mtu, window, lb_times, lb)
    log("bench server: one shard with the write-ahead log (--checkpoint-dir), updates ...")
    upd = {k: v for k, v in loads.items() if k[0] == "update"}
    res["shards_1_wal"] = measure_shard(workdir, 1, upd, pools, mtu, window, None, None, wal=True)
    log("bench server: two shards on this host, the same messages split by owner ...")
    res["shards_2"] = measure_shard(workdir, 2, loads, pools, mtu, window, lb_times, lb)
    log("bench server: a round of the same ids over 2 and over 26 tables, the shard's CPU ...")
    res["rounds"] = shard_rounds.run(rounds=max(10, int(200 * scale)))
    res["local"] = _local_figures(lb_times, loads)
    _ratios(res)
    res["targets"] = _targets(res)
    res["load"] = load_since(load0)
    res.update({"mtu": mtu, "dim": DIM, "dtype": "fp32", "optimizer": "adagrad", "window": window,
                "pool_rows_per_table": POOL, "gso": udpio.available(), "loadgen_udp_gro": True,
                "numpy": np.__version__,
                "machine": platform.machine()})
    merge_json(out_dir / "bench.json", "server", res)
    return res
