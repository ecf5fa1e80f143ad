"""``embnic bench``: speed benchmarks, each against a baseline measured in the same run."""
from __future__ import annotations

import importlib
from pathlib import Path

import click

from embnic.client_lib.config import MTU_LIMITS
from embnic.cli.commands.options import FloatRange, OutPath, as_missing, as_operational, errors_as
from embnic.control.errors import UsageError

_out = click.option("--out", "out", type=OutPath("dir", "bench"), default="out/bench", show_default=True,
                    help="Directory for bench.json (results are merged into it; created if missing).")


@click.group("bench")
def bench():
    """Speed benchmarks; results are merged into DIR/bench.json with ratios to baselines run alongside.

    \b
    Example:
      embnic bench prep --out out/bench
      embnic bench dataplane --out out/bench
      embnic bench server --out out/bench
    """


def _fmt(v) -> str:
    if isinstance(v, bool) or not isinstance(v, float):
        return str(v)
    return f"{v:,.3f}" if abs(v) < 1000 else f"{v:,.0f}"


def _show(name: str, res: dict, indent: int = 0) -> None:
    """Print a result dict: scalars one per line, nested dicts indented below their key, short lists
    inline; longer lists are left to bench.json."""
    pad = "  " * indent
    click.echo(f"{pad}{name}:")
    for k, v in res.items():
        if isinstance(v, dict) and v:
            _show(k, v, indent + 1)
        elif isinstance(v, dict):
            click.echo(f"{pad}  {k:24s} {{}}")
        elif isinstance(v, (list, tuple)):
            if len(v) <= 8 and all(not isinstance(x, (dict, list, tuple)) for x in v):
                click.echo(f"{pad}  {k:24s} [{', '.join(_fmt(x) for x in v)}]")
        else:
            click.echo(f"{pad}  {k:24s} {_fmt(v)}")


def _metrics(name: str, res: dict, width: int, keep: tuple | None = None) -> None:
    """Print ``name:`` and one line per configuration of ``res``: its figures (those in ``keep``)."""
    click.echo(f"  {name}:")
    for k, v in res.items():
        if isinstance(v, dict):
            click.echo(f"    {k:{width}s} " + "  ".join(f"{m} {_fmt(float(x))}" for m, x in v.items()
                                                   if keep is None or m in keep))


@bench.command("prep")
@_out
@click.option("--batch-size", type=click.IntRange(min=1), default=4096, show_default=True, help="Samples per batch.")
@click.option("--repeats", type=click.IntRange(min=1), default=7, show_default=True, help="Timed repetitions (median).")
def prep(out, batch_size, repeats):
    """Batch preparation (sort → value/index/offset arrays, routing) on Criteo batches of
    BATCH_SIZE × 26 features, against a bare np.unique(return_inverse=True) on the same ids.

    \b
    Example:
      embnic bench prep --out out/bench
    """
    from embnic.testbed.bench import prep as bench_prep

    res = bench_prep.run(Path(out), batch_size=batch_size, repeats=repeats)
    _show("prep", res)
    click.echo(f"wrote {Path(out) / 'bench.json'}")


@bench.command("dataplane")
@_out
@click.option("--seconds", type=FloatRange(min=0.5), default=5.0, show_default=True,
              help="Measurement time per configuration.")
@click.option("--target", type=click.Choice(["dpdk", "bmv2"]), default="dpdk", show_default=True,
              help="bmv2: the same frames through simple_switch and the DPDK card over one veth path.")
@click.option("--state-lcores", type=click.IntRange(1, 2), default=2, show_default=True,
              help="2: also the distinct workload with 2 state lcores against testpmd on 2; 1: skip it.")
@click.option("--p4dpdk/--no-p4dpdk", "p4dpdk", default=True, show_default=True,
              help="Also the P4 card for PNA in DPDK's SWX pipeline (skipped, saying why, where it cannot run).")
def dataplane(out, seconds, target, state_lcores, p4dpdk):
    """The card on one lcore against dpdk-testpmd (io and macswap) on one lcore, on the same vdevs,
    pool and burst (net_null, and over a veth pair on net_af_packet and net_af_xdp); a workload of
    distinct messages (every state-map entry inserted and freed), also over 2 state lcores; the
    card's two-lcore pipeline; the P4 card for PNA in DPDK's SWX pipeline (`p4dpdk`). bench.json's
    `targets` says which targets are met (README, "Performance").

    \b
    Example:
      embnic bench dataplane --out out/bench --seconds 5
      sudo embnic bench dataplane --target bmv2 --out out/bench
    """
    if target == "bmv2":
        from embnic.testbed.bench import bmv2 as bench_bmv2

        _show("dataplane (bmv2)", bench_bmv2.run(Path(out), seconds=seconds))
    else:
        with errors_as((ImportError, as_missing("the dataplane benchmark is not available: "))):
            mod = importlib.import_module("embnic.testbed.bench.dataplane")
        _show("dataplane", mod.run(Path(out), seconds=seconds, state_lcores=state_lcores, p4dpdk=p4dpdk))
    click.echo(f"wrote {Path(out) / 'bench.json'}")


def _disk_run(out, rows, cache_rows, block_cache_mb, window, scale, repeats, mtu) -> None:
    from embnic.testbed.bench import shard_disk

    if rows < 8 * cache_rows:
        raise UsageError(f"--disk-rows {rows} is less than 8 x --disk-cache-rows {cache_rows}: the disk-tier run "
                         "measures a table larger than 8 x its cache")
    with errors_as((RuntimeError, as_operational)):
        res = shard_disk.run(Path(out), rows=rows, cache_rows=cache_rows, block_cache_mb=block_cache_mb,
                             window=window, messages=max(20, int(300 * scale)), repeats=repeats, mtu=mtu,
                             log=click.echo)
    _show("server_disk", {k: v for k, v in res.items() if k in ("targets", "load", "budget", "fixed_overhead")})
    for k in ("lookup_4096", "update_4096"):
        v = res[k]
        click.echo(f"  {k:12s} disk {_fmt(v['disk_rows_per_s'])} rows/s  memory {_fmt(v['memory_rows_per_s'])} rows/s  "
                   f"ratio {v['ratio']:.3f}  hit ratio {v['hit_ratio']:.3f}")
    mb = res["memory_bound"]
    click.echo(f"  RssAnon max {mb['rss_anon_max'] / 2**20:.1f} MiB (bound {mb['bound'] / 2**20:.1f} MiB: "
               f"{'within' if mb['within'] else 'OVER'}), table on disk {mb['disk_bytes'] / 2**20:.1f} MiB = "
               f"{mb['disk_over_budget']:.1f} x the budget; the memory shard {mb['memory_shard_rss_anon'] / 2**20:.1f} MiB")


@bench.command("server")
@_out
@click.option("--window", type=click.IntRange(min=1), default=4, show_default=True,
              help="Messages in flight in the throughput runs.")
@click.option("--scale", type=FloatRange(min=0.01), default=1.0, show_default=True,
              help="Multiplies the number of messages per measurement.")
@click.option("--mtu", type=click.IntRange(*MTU_LIMITS), default=1500, show_default=True, help="Cluster MTU (bytes).")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Throughput runs per configuration, each followed by LocalBackend's; rows/s are medians.")
@click.option("--disk", "disk", is_flag=True,
              help="Also the disk-tier run (`server_disk`, a few minutes; needs embnic[disk]; `bench all` runs it).")
@click.option("--disk-only", is_flag=True, help="Only the disk-tier run.")
@click.option("--disk-rows", type=click.IntRange(min=4096), default=1 << 21, show_default=True,
              help="Rows of the disk-tier run's table.")
@click.option("--disk-cache-rows", type=click.IntRange(min=8192), default=1 << 17, show_default=True,
              help="The disk table's cache of hot rows.")  # at least two messages of 4096 keys
@click.option("--disk-block-cache-mb", type=click.IntRange(min=1), default=4, show_default=True,
              help="RocksDB's block cache (memtables charged to it), MiB.")
def server(out, window, scale, mtu, repeats, disk, disk_only, disk_rows, disk_cache_rows,
           disk_block_cache_mb):
    """One parameter-server shard on loopback without the card: rows/s, messages/s and p50/p99
    latency of lookups and updates at 1, 64 and 4096 keys per message, against the in-process
    LocalBackend doing the same work; then two shards on this host (the same messages, each to
    the shard owning its keys): rows/s and rows per shard CPU second against one.

    The disk-tier run (`server_disk`, docs/server.md "Disk tier"): a shard keeping the table on
    disk behind a cache against one keeping it in memory (Zipf ids, a table larger than 8 x the
    disk shard's memory budget): rows/s, the cache's hit ratio and the disk shard's memory.

    \b
    Examples:
      embnic bench server --out out/bench
      embnic bench server --disk --out out/bench
      embnic bench server --disk-only --out out/bench
    """
    from embnic.testbed.bench import shard_serving as bench_server

    if disk or disk_only:
        _disk_run(out, disk_rows, disk_cache_rows, disk_block_cache_mb, window, scale, repeats, mtu)
        if disk_only:
            return
    with errors_as((RuntimeError, as_operational)):
        res = bench_server.run(Path(out), mtu=mtu, window=window, scale=scale, repeats=repeats, log=click.echo)
    _show("server", {k: v for k, v in res.items() if not isinstance(v, dict) or k in ("targets", "load")})
    rd = res.get("rounds") or {}
    if rd:
        click.echo(f"  rounds (shard CPU per round of {rd['total_ids']} ids, one message, median µs):")
        for op in ("lookup", "update"):
            click.echo(f"    {op:6s}  2 tables {rd[f'{op}_2_us']:8,.0f}   26 tables {rd[f'{op}_26_us']:8,.0f}   "
                       f"26/2 = {rd[f'ratio_26_vs_2_{op}']:.2f} (target ≤ {rd['target']})")
    for part in ("shards_1", "shards_1_wal", "shards_2", "local"):
        if part in res:
            _metrics(part, res[part], 12, keep=("rows_per_s", "msgs_per_s", "p50_us", "p99_us", "rows_per_shard_cpu_s",
                                                "rows_per_cpu_s", "shard_cpu_s", "loadgen_cpu_s", "machine_idle_share"))
    click.echo(f"wrote {Path(out) / 'bench.json'}")


@bench.command("client")
@_out
@click.option("--rounds", type=click.IntRange(min=3), default=40, show_default=True,
              help="Timed rounds of each size and table count (medians).")
def client(out, rounds):
    """The client's round over 2 tables and over 26 with the same total keys, against two shards on
    loopback without the card: the client's CPU and wall time per lookup and update round.

    \b
    Example:
      embnic bench client --out out/bench
    """
    from embnic.testbed.bench import client_round as bench_client

    res = bench_client.run(Path(out), rounds=rounds, log=click.echo)
    _metrics("native", res["native"], 16)
    _show("native ratios (26 tables / 2)", res["ratios"]["native"], indent=2)
    _show("targets", res["targets"])
    click.echo(f"wrote {Path(out) / 'bench.json'}")


@bench.command("e2e")
@_out
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Repeats of every figure (median, min, max).")
@click.option("--steps", type=click.IntRange(min=2), default=10, show_default=True,
              help="Timed steps per repeat and batch size (after one warm-up step).")
@click.option("--loss", "loss_pct", type=FloatRange(0, 50), default=1.0, show_default=True,
              help="Percent loss on every link for the transport-under-loss run (0: skip it).")
@click.option("--hash/--no-hash", "hash_row", default=True, show_default=True,
              help="Also measure embnic with hash sharding (a second testbed).")
@click.option("--dlrm/--no-dlrm", "dlrm", default=True, show_default=True,
              help="Also measure training steps/s of TorchRec's DLRM, tables through the card vs in process.")
def e2e(out, **opts):
    """The claim, measured: lookup and update latency per step and steps/s at batch sizes 32, 256
    and 4096 of the Criteo sample for variable-length messages through the card, the fixed-length
    baseline (a size round first) and TorchRec's sharded EmbeddingBagCollection; and training
    steps/s of TorchRec's DLRM with its tables through the card vs in process. e2e.rows in
    bench.json, e2e_*.png beside it. Needs root (the namespace testbed) and embnic[torch].

    \b
    Example:
      sudo embnic bench e2e --out out/bench --repeats 3
    """
    from embnic.testbed.bench import e2e as bench_e2e

    with errors_as((ImportError, as_missing("bench e2e needs the embnic[torch] extra (TorchRec as the peer): ")),
                   (RuntimeError, as_operational)):
        res = bench_e2e.run(Path(out), log=click.echo, **opts)
    click.echo("e2e (lookup latency per step, µs, medians of repeats):")
    click.echo(f"  {'batch':>6} {'varlen p50':>11} {'p99':>9} {'fixed p50':>10} {'p99':>9} {'torchrec p50':>13} "
               f"{'p99':>9} {'msgs var/fix':>13} {'rounds var/fix':>15} {'req msgs/round var/fix (shards)':>32}")
    for r in (r for r in res["rows"] if r["model"] == "embeddings"):
        click.echo(f"  {r['batch']:>6} {r['varlen_p50_us']:>11,.0f} {r['varlen_p99_us']:>9,.0f} "
                   f"{r['fixed_p50_us']:>10,.0f} {r['fixed_p99_us']:>9,.0f} {r['torchrec_p50_us']:>13,.0f} "
                   f"{r['torchrec_p99_us']:>9,.0f} {r['messages_varlen']:>6.0f}/{r['messages_fixed']:<6.0f} "
                   f"{r['rounds_varlen']:>7.0f}/{r['rounds_fixed']:<7.0f} "
                   f"{r['request_messages_per_round_varlen']:>14.1f}/{r['request_messages_per_round_fixed']:<5.1f} "
                   f"({r['shards_per_round']:.0f})")
    pb = (res.get("plan") or {}).get("by_batch") or {}
    if pb:
        click.echo("e2e step time, embnic plan's estimate (testbed profile) beside the measurement (varlen, µs):")
        for b, v in pb.items():
            click.echo(f"  {b:>6} plan {v['plan_step_us']:>9,.0f}  measured {v['step_p50_us']:>9,.0f}  "
                       f"= {v['plan_over_measured']:.2f} x   messages/step plan {v['plan_messages_per_step']:.0f}"
                       f" measured {v['messages_per_step']:.0f}   (binds: {v['binds']})")
    dlrm_rows = [r for r in res["rows"] if r["model"] == "dlrm"]
    if dlrm_rows:
        click.echo("e2e DLRM training steps/s (medians of repeats): tables through the card vs TorchRec's EBC in process")
        click.echo(f"  {'batch':>6} {'card':>9} {'torchrec':>9} {'card/torchrec':>14}")
        for r in dlrm_rows:
            click.echo(f"  {r['batch']:>6} {r['card_steps_per_s']:>9.1f} {r['torchrec_steps_per_s']:>9.1f} "
                       f"{r['card_over_torchrec']:>14.2f}")
    lo = res.get("loss") or {}
    if lo.get("by_batch"):
        click.echo(f"e2e transport, varlen with {lo['loss_pct_every_link']:g}% loss on every link "
                   f"({lo['netem_backend']} netem; step p50 µs, per step: retransmits, timer expiries, "
                   f"repairs, tail probes):")
        for b, v in lo["by_batch"].items():
            relay = (f", through the netem helpers without loss {v['step_p50_us_relay']:,.0f} "
                     f"({v['ratio_vs_relay']:.2f} x)" if "step_p50_us_relay" in v else "")
            click.echo(f"  {b:>6} loss-free {v['step_p50_us']:,.0f} (retransmits {v['retransmits_per_step']:g}), "
                       f"with loss {v['step_p50_us_loss']:,.0f} = {v['ratio']:.2f} x (retransmits "
                       f"{v['retransmits_per_step_loss']:.1f}, timers {v['timeouts_per_step_loss']:.1f}, repairs "
                       f"{v['repairs_per_step_loss']:.1f}, probes {v['probes_per_step_loss']:.1f}){relay}")
    _show("targets", res["targets"])
    click.echo(f"  machine {res['machine']['before']}")
    click.echo(f"wrote {Path(out) / 'bench.json'} and {', '.join(res['plots'])}")


@bench.command("all")
@_out
@click.pass_context
def all_(ctx, out):
    """Every benchmark in turn: prep, client, dataplane, server (with its disk-tier run), e2e (needs root,
    embnic[torch] and embnic[disk]).

    \b
    Example:
      embnic bench all --out out/bench
    """
    for cmd in (prep, client, dataplane, server, e2e):  # each with its defaults; server with its disk-tier run
        ctx.invoke(cmd, out=out, **({"disk": True} if cmd is server else {}))
