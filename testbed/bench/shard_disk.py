"""The disk tier under load (``embnic bench server``, its disk-tier run; ``--disk-only`` alone).

The method: docs/bench.md, "embnic bench server --disk: the disk tier under load".
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import numpy as np

from embnic.client_lib.config import TableConfig
from embnic.client_lib.splitmix import splitmix64
from embnic.control.capacity import cache_bytes
from embnic.control.errors import MissingDependencyError
from embnic.testbed.net.toml_writer import dump_toml

from .loadgen import LoadGen, Requests, ShardProcess
from .results import at_least, load_since, merge_json

DIM = 8
ROWS = 1 << 21  #: rows of the table (every one materialised)
CACHE_ROWS = 1 << 17  #: the disk table's cache of hot rows
BLOCK_CACHE_MB = 4  #: RocksDB's block cache (memtables charged to it)
KEYS = 4096
ZIPF_S = 1.05
TARGET_LOOKUP = 0.3  #: disk ÷ memory lookup rows/s at 4096 keys per message
TARGET_DISK_OVER_BUDGET = 8.0
#: the disk tier's samples of a shard's metrics (:meth:`ShardProcess.metrics`)
METRICS = ("embnic_shard_store_", "embnic_shard_lookup_keys_total", "embnic_shard_update_keys_total")
HITS, MISSES = "embnic_shard_store_cache_hits_total", "embnic_shard_store_cache_misses_total"


def dir_bytes(d: Path) -> int:
    """Bytes of the files under ``d`` (the store's SST, MANIFEST and log files)."""
    total = 0
    for root, _, files in os.walk(d):
        for f in files:
            with contextlib.suppress(OSError):  # a file compacted away meanwhile
                total += os.stat(os.path.join(root, f)).st_size
    return total


def bench_shard(workdir: Path, store: str, cache_rows: int, block_cache_mb: int) -> ShardProcess:
    """A shard process (not started) of the bench cluster, table 0 (dim 8 fp32, Adagrad) kept in
    ``store`` (``"disk"``: ``cache_rows``, ``block_cache_mb``, in ``workdir/disk-store``, or
    ``"memory"``), with its metrics endpoint."""
    disk = {"cache_rows": cache_rows} if store == "disk" else {}
    table = {"id": 0, "dim": DIM, "dtype": "fp32", "optimizer": "adagrad", "lr": 0.01, "store": store, **disk}
    shard = {"id": 0, "ip": "127.0.0.1", "port": 17871,
             **({"block_cache_mb": block_cache_mb, "store_dir": str(workdir / "disk-store")} if disk else {})}
    toml = dump_toml({"cluster": {"name": "bench-disk", "seed": 11}, "tables": [table], "shards": [shard],
                      "clients": [{"id": 1, "ip": "127.0.0.1"}]})
    return ShardProcess(workdir, store, toml, metrics=True, stop_wait=60.0)


class Zipf:
    """Ids of a table of ``n`` rows drawn Zipf(``s``) by rank: rank r (0 = hottest) is id
    ``splitmix64(r)``; a message holds ``keys`` distinct ids (a batch's unique ids)."""

    def __init__(self, n: int, s: float, rng: np.random.Generator):
        self.rng = rng
        self.cdf = np.cumsum(np.arange(1, n + 1, dtype=np.float64) ** -s)
        self.cdf /= self.cdf[-1]
        self.ids = splitmix64(np.arange(n, dtype=np.uint64))

    def message(self, keys: int) -> np.ndarray:
        got = np.empty(0, np.int64)
        while got.size < keys:  # draw until `keys` distinct ranks, in the order drawn
            d = np.concatenate([got, np.minimum(np.searchsorted(self.cdf, self.rng.random(4 * keys)),
                                                self.cdf.size - 1)])
            _, first = np.unique(d, return_index=True)
            got = d[np.sort(first)]
        return np.sort(self.ids[got[:keys]])


class _Run:
    """The two shards of one run, their load generators and what the steps share."""

    def __init__(self, workdir: Path, cache_rows: int, block_cache_mb: int, budget: dict, window: int, mtu: int,
                 rng: np.random.Generator):
        self.budget, self.window, self.mtu, self.rng = budget, window, mtu, rng
        self.next_id = 1
        self.shards = {"disk": bench_shard(workdir, "disk", cache_rows, block_cache_mb),
                       "memory": bench_shard(workdir, "memory", cache_rows, block_cache_mb)}
        self.gens: dict[str, LoadGen] = {}

    def start(self) -> None:
        for sh in self.shards.values():
            sh.start(timeout=120.0)
        self.gens = {n: LoadGen(sh.port) for n, sh in self.shards.items()}

    def close(self) -> None:
        for g in self.gens.values():
            g.close()
        for sh in self.shards.values():
            sh.stop()

    def msgs(self, op: str, keys: list[np.ndarray]) -> Requests:
        """Requests of table 0 for ``keys`` (updates: gradients 0.01 × standard normal), new ids."""
        grads = ([(self.rng.standard_normal((k.size, DIM)) * 0.01).astype("<f4") for k in keys]
                 if op == "update" else None)
        m = Requests(op, [0] * len(keys), keys, grads, DIM, self.mtu, self.next_id)
        self.next_id += len(keys)
        return m

    def send(self, name: str, w: Requests) -> float:
        """Seconds the shard ``name`` takes for ``w`` (``window`` in flight)."""
        return self.gens[name].run(w, self.window)[0]

    def sample(self, rows_now: int) -> dict:
        """The disk shard's memory, block cache in use and bytes on disk, the table at ``rows_now`` rows."""
        disk = self.shards["disk"]
        m, t = disk.mem(), disk.metrics(METRICS)
        in_use = int(t.get("embnic_shard_store_block_cache_bytes", 0))
        return {"rows": rows_now, "rss_anon": m["rss_anon"], "rss_file": m["rss_file"],
                "block_cache_in_use": in_use, "beyond_budget": m["rss_anon"] - self.budget["cache_bytes"] - in_use,
                "disk_bytes": dir_bytes(disk.cfg_path.parent / "disk-store")}


def _fixed_overhead(r: _Run, zipf: Zipf, order: np.ndarray, cache_rows: int, rows: int, secs: dict) -> dict:
    """Step 1: the table grown to 1.5 × the cache on the memory shard and, sampled every 8
    messages, on the disk shard; then Zipf traffic over it (every code path: reads from the store,
    evictions, write-backs, compactions). Returns ``fixed_overhead`` (``table_rows``: the rows held)."""
    first = min(rows, 3 * cache_rows // 2)  # past the cache: evictions and write-backs at full size
    small = Zipf(first, ZIPF_S, r.rng)
    small.ids = zipf.ids[order[:first]]
    grow0 = [np.sort(zipf.ids[order[a:min(first, a + KEYS)]]) for a in range(0, first, KEYS)]
    secs["memory"] += r.send("memory", r.msgs("update", grow0))
    samples = []
    for a in range(0, len(grow0), 8):
        secs["disk"] += r.send("disk", r.msgs("update", grow0[a:a + 8]))
        samples.append(r.sample(min(first, (a + 8) * KEYS)))
    for op in ("update", "lookup") * 4:  # as much store traffic per sample as later (writes: compactions)
        for _ in range(4):
            r.send("disk", r.msgs(op, [small.message(KEYS) for _ in range(8)]))
            samples.append(r.sample(first))
    return {"bytes": max(x["beyond_budget"] for x in samples), "table_rows": first, "samples": samples,
            "how": "the largest RssAnon minus the cache's arrays (written at start) and the "
                   "block cache in use, sampled after every 8 messages while the table "
                   "grew to 1.5 x the rows the cache holds and then served 256 Zipf "
                   "updates and 256 lookups of 4096 keys over it (reads from the store, "
                   "evictions, write-backs, flushes, compactions)"}


def _growth(r: _Run, zipf: Zipf, order: np.ndarray, first: int, rows: int, samples: int, secs: dict,
            cpu0: dict) -> dict:
    """Step 2: every row materialised on both shards, in random order, the disk shard
    sampled after each of ``samples`` slices. Returns ``growth``."""
    per = -(-(rows - first) // samples)
    growth = []
    for lo in range(first, rows, per):
        part = order[lo:lo + per]
        keys = [np.sort(zipf.ids[part[a:a + KEYS]]) for a in range(0, part.size, KEYS)]
        for name in r.shards:
            secs[name] += r.send(name, r.msgs("update", keys))
        growth.append({**r.sample(int(min(rows, lo + per))),
                       "memory_shard_rss_anon": r.shards["memory"].mem()["rss_anon"]})
    return {"samples": growth, "rows_per_s": {n: rows / max(s, 1e-9) for n, s in secs.items()},
            "shard_cpu_s": {n: p.cpu() - cpu0[n] for n, p in r.shards.items()}}


def _zipf_op(r: _Run, zipf: Zipf, op: str, messages: int, repeats: int, rows: int, res: dict) -> dict:
    """Step 3 for ``op``: a warm-up pass, then ``repeats`` runs of ``messages`` Zipf messages
    against the memory and the disk shard in turn, the disk shard sampled after each
    (into ``res["zipf_samples"]`` and ``res["memory_bound"]``). Returns the ``<op>_4096`` figures."""
    warm = r.msgs(op, [zipf.message(KEYS) for _ in range(messages)])
    for name in r.shards:
        r.gens[name].run(warm, r.window)
    runs = {n: [] for n in r.shards}
    hits = keys_ = 0.0
    cpu = {n: 0.0 for n in r.shards}
    bound = res["memory_bound"]["bound"]
    for _ in range(repeats):
        w = r.msgs(op, [zipf.message(KEYS) for _ in range(messages)])
        for name in ("memory", "disk"):
            sh = r.shards[name]
            before = sh.metrics(METRICS) if name == "disk" else None
            c0 = sh.cpu()
            sec = r.send(name, w)
            cpu[name] += sh.cpu() - c0
            runs[name].append(w.rows / sec)
            if before is not None:
                after = sh.metrics(METRICS)
                h = after[HITS] - before[HITS]
                hits, keys_ = hits + h, keys_ + h + after[MISSES] - before[MISSES]
        g = r.sample(rows)
        res["zipf_samples"] = res.get("zipf_samples", []) + [g]
        res["memory_bound"]["rss_anon_max"] = max(res["memory_bound"]["rss_anon_max"], g["rss_anon"])
        res["memory_bound"]["within"] &= g["rss_anon"] <= bound
    d, m = (float(np.median(runs[n])) for n in ("disk", "memory"))
    return {"disk_rows_per_s": d, "memory_rows_per_s": m, "ratio": d / m,
            "disk_rows_per_s_runs": runs["disk"], "memory_rows_per_s_runs": runs["memory"],
            "hit_ratio": hits / max(keys_, 1.0),
            "disk_shard_cpu_s": cpu["disk"], "memory_shard_cpu_s": cpu["memory"],
            "ratio_cpu": (cpu["memory"] / max(cpu["disk"], 1e-9))}


def _policy_stream(tables: dict, msgs: list[np.ndarray], top: np.ndarray) -> dict:
    """Lookups of ``msgs`` sent to every policy's table in turn, message by message (a noisy machine
    slows each alike). Returns per policy ``hit_ratio``, ``rows_per_s`` (wall) and ``rows_per_cpu_s``
    (this thread's CPU: the lookups read and install rows, nothing is written), and
    ``static_best_hit_ratio``: the share of the keys among ``top``, the rows a cache of the same
    size would hold if it knew the popularity in advance."""
    got = {p: {"wall": 0.0, "cpu": 0.0, "hits": dt.stats["hits"], "misses": dt.stats["misses"]}
           for p, dt in tables.items()}
    for m in msgs:
        for p, dt in tables.items():
            w0, c0 = time.perf_counter(), time.thread_time()
            dt.lookup(m)
            got[p]["wall"] += time.perf_counter() - w0
            got[p]["cpu"] += time.thread_time() - c0
    n = sum(m.size for m in msgs)
    out = {"static_best_hit_ratio": float(np.isin(np.concatenate(msgs), top).mean()), "policies": {}}
    for p, dt in tables.items():
        g = got[p]
        h, mi = dt.stats["hits"] - g["hits"], dt.stats["misses"] - g["misses"]
        out["policies"][p] = {"hit_ratio": h / max(h + mi, 1), "rows_per_s": n / max(g["wall"], 1e-9),
                              "rows_per_cpu_s": n / max(g["cpu"], 1e-9)}
    out["best"] = max(out["policies"], key=lambda p: out["policies"][p]["hit_ratio"])
    return out


def compare_policies(rows: int, cache_rows: int, block_cache_mb: int, messages: int, rng: np.random.Generator,
                     log=print) -> dict:
    """Step 4: the cache's replacement policies (:data:`~embnic.testbed.server.rowcache.POLICIES`)
    on the same Zipf streams, in this process. One disk table with the run's budget (``cache_rows``,
    ``block_cache_mb``) grown to ``rows`` rows and snapshotted; a copy of the snapshot (hard links)
    behind each policy's cache, each with a block cache of its own; then the same lookups of
    ``KEYS`` Zipf ids to each: ``messages`` to warm the caches, ``messages`` timed
    (``stationary``), and ``messages`` drawn from a new popularity order (``shifted``: the same
    Zipf over the ids permuted — how fast a policy forgets).

    Returns:
        ``{"kept", "messages", "stationary", "shifted"}``: per stream the ``policies``
        (:func:`_policy_stream`), the ``best`` by hit ratio and the ``static_best_hit_ratio``.
    """
    from embnic.testbed.server.diskstore import scratch_env
    from embnic.testbed.server.disktable import DiskTable
    from embnic.testbed.server.rowcache import POLICIES

    table = TableConfig(id=0, name="policies", rows=None, dim=DIM, optimizer="adagrad", lr=0.01)
    envs = {p: scratch_env(block_cache_mb, prefix=f"embnic-bench-{p}-") for p in POLICIES}
    try:
        tables = {p: DiskTable(table, 11, envs[p], cache_rows, p) for p in POLICIES}
        grower = tables[POLICIES[0]]
        zipf = Zipf(rows, ZIPF_S, rng)
        order = rng.permutation(rows)
        for a in range(0, rows, KEYS):
            k = np.sort(zipf.ids[order[a:a + KEYS]])
            grower.apply(k, (rng.standard_normal((k.size, DIM)) * 0.01).astype(np.float32))
        snap = envs[POLICIES[0]].root / "snapshot"
        grower.snapshot(snap)
        for dt in tables.values():
            dt.load_snapshot(snap)  # every cache empty, every store the same rows
        top = zipf.ids[:tables[POLICIES[0]].capacity]
        _policy_stream(tables, [zipf.message(KEYS) for _ in range(messages)], top)  # warm-up
        res = {"kept": POLICIES[0], "messages": messages,
               "stationary": _policy_stream(tables, [zipf.message(KEYS) for _ in range(messages)], top)}
        zipf.ids = zipf.ids[rng.permutation(rows)]
        res["shifted"] = _policy_stream(tables, [zipf.message(KEYS) for _ in range(messages)],
                                        zipf.ids[:tables[POLICIES[0]].capacity])
    finally:
        for e in envs.values():
            e.close()
    for s in ("stationary", "shifted"):
        log(f"  cache policies, {s} Zipf: " + ", ".join(
            f"{p} hit {v['hit_ratio']:.3f} ({v['rows_per_cpu_s'] / 1e3:,.0f} k rows per CPU s)"
            for p, v in res[s]["policies"].items()) + f"; static best {res[s]['static_best_hit_ratio']:.3f}")
    return res


def _check(rows: int, cache_rows: int) -> None:
    """Raises ValueError or MissingDependencyError as :func:`run` says."""
    if cache_rows < 2 * KEYS or rows < 8 * cache_rows:
        raise ValueError(f"the disk-tier run needs cache_rows >= {2 * KEYS} and rows >= 8 x cache_rows, got "
                         f"cache_rows {cache_rows}, rows {rows}")
    for mod, extra in (("rocksdict", "disk"), ("prometheus_client", "metrics")):
        try:
            __import__(mod)
        except ImportError:
            raise MissingDependencyError(f"bench server's disk-tier run needs {mod}: pip install 'embnic[{extra}]'",
                                         mod) from None


def _targets(res: dict) -> dict:
    mb = res["memory_bound"]
    return {
        "lookup_4096_disk_vs_memory": at_least(TARGET_LOOKUP, res[f"lookup_{KEYS}"]["ratio"]),
        "rss_anon_within_budget_plus_fixed": {"target": mb["bound"], "measured": mb["rss_anon_max"],
                                              "met": mb["within"]},
        "table_on_disk_over_budget": at_least(TARGET_DISK_OVER_BUDGET, mb["disk_over_budget"]),
    }


def run(out_dir: Path, *, rows: int = ROWS, cache_rows: int = CACHE_ROWS, block_cache_mb: int = BLOCK_CACHE_MB,
        window: int = 4, messages: int = 300, repeats: int = 3, mtu: int = 1500, samples: int = 24, seed: int = 0,
        log=print) -> dict:
    """Run the disk-tier benchmark (docs/bench.md) and merge ``server_disk`` into ``out_dir/bench.json``.

    Args:
        rows: rows of the table; cache_rows, block_cache_mb: the disk table's memory budget.
        messages: Zipf messages per timed run (4096 keys each); repeats: timed runs per shard.
        samples: memory samples while the table grows.

    Returns:
        the ``server_disk`` result: ``config``, ``budget`` (bytes: cache, block cache, total),
        ``fixed_overhead``, ``growth`` (samples), ``memory_bound``, ``lookup_4096``/``update_4096``
        (rows/s of both shards, ``ratio``, the disk shard's ``hit_ratio``), ``policies`` (the cache's
        replacement policies compared: :func:`compare_policies`), ``targets``, ``load``.

    Raises:
        ValueError: ``cache_rows`` below 2 × 4096 or ``rows`` below 8 × ``cache_rows``.
        MissingDependencyError: rocksdict or prometheus-client missing (the extras named).
        OperationalError: a shard did not start or answered with an error.
    """
    _check(rows, cache_rows)
    out_dir = Path(out_dir)
    workdir = out_dir / "server-logs"
    workdir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    budget = {"cache_bytes": cache_bytes(DIM, "adagrad", cache_rows), "block_cache_bytes": block_cache_mb << 20}
    budget["bytes"] = budget["cache_bytes"] + budget["block_cache_bytes"]
    load0 = os.getloadavg()
    r = _Run(workdir, cache_rows, block_cache_mb, budget, window, mtu, rng)
    res: dict = {"config": {"rows": rows, "cache_rows": cache_rows, "block_cache_mb": block_cache_mb, "dim": DIM,
                            "dtype": "fp32", "optimizer": "adagrad", "keys_per_message": KEYS, "zipf_s": ZIPF_S,
                            "window": window, "messages_per_run": messages, "repeats": repeats, "mtu": mtu},
                 "budget": budget}
    try:
        r.start()
        zipf = Zipf(rows, ZIPF_S, rng)
        log(f"bench server --disk: fixed overhead (rows {rows:,}, cache {cache_rows:,} rows, block cache "
            f"{block_cache_mb} MiB) ...")
        order = rng.permutation(rows)
        secs = {n: 0.0 for n in r.shards}
        cpu0 = {n: sh.cpu() for n, sh in r.shards.items()}
        res["fixed_overhead"] = _fixed_overhead(r, zipf, order, cache_rows, rows, secs)
        log(f"bench server --disk: growing the table to {rows:,} rows on both shards ...")
        first = res["fixed_overhead"]["table_rows"]
        res["growth"] = _growth(r, zipf, order, first, rows, samples, secs, cpu0)
        g = res["growth"]["samples"]
        bound = res["fixed_overhead"]["bytes"] + budget["bytes"]
        res["memory_bound"] = {
            "bound": bound,
            **{f"{k}_max": max(x[k] for x in g) for k in ("rss_anon", "beyond_budget", "block_cache_in_use")},
            "within": all(x["rss_anon"] <= bound for x in g), "disk_bytes": g[-1]["disk_bytes"],
            "disk_over_budget": g[-1]["disk_bytes"] / budget["bytes"], "rows_over_cache_rows": rows / cache_rows,
            "memory_shard_rss_anon": g[-1]["memory_shard_rss_anon"]}
        for op in ("lookup", "update"):  # 3. Zipf lookups and updates, alternating the shards
            log(f"bench server --disk: Zipf({ZIPF_S}) {op}s of {KEYS} keys ...")
            res[f"{op}_{KEYS}"] = _zipf_op(r, zipf, op, messages, repeats, rows, res)
    finally:
        r.close()
    log(f"bench server --disk: the cache's policies on the same Zipf({ZIPF_S}) lookups, in process ...")
    res["policies"] = compare_policies(rows, cache_rows, block_cache_mb, messages, rng, log)
    res["targets"] = _targets(res)
    res["load"] = load_since(load0)
    res["logs"] = {n: str(sh.log_path) for n, sh in r.shards.items()}
    merge_json(out_dir / "bench.json", "server_disk", res)
    return res
