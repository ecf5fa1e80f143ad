"""``embnic plan``: capacity planning of a cluster config (docs/planning.md)."""
from __future__ import annotations

import dataclasses
import itertools
import json
import math

import click

from embnic.client_lib.config import MTU_LIMITS, ConfigError, load_config
from embnic.control import capacity as P
from embnic.cli.commands.options import FloatRange, as_usage, config_option, errors_as, json_option


# The bounds of the numeric options are well past any real cluster, so that an absurd figure is a
# usage error naming the range, not an overflow or a plan of 300-digit counts.
def _hw_opt(name: str, lo: float, hi: float, help_: str):
    """``--<name>``: a figure of the hardware profile (in its unit, ``lo``..``hi``) overridden."""
    return click.option("--" + name.replace("_", "-"), name, type=FloatRange(min=lo, max=hi), default=None,
                        help=f"{help_} [server: {getattr(P.PROFILES['server'], name):g}, "
                             f"testbed: {getattr(P.PROFILES['testbed'], name):g}]")


@click.command("plan")
@config_option(example="examples/testbed.toml")
@click.option("--batch", type=click.IntRange(min=1, max=10**8), default=4096, show_default=True,
              help="Samples per step of each client.")
@click.option("--ids-per-feature", type=FloatRange(min=0, max=10**5, min_open=True), default=1.0, show_default=True,
              help="Ids per sample of every table (pooling factor); measured with --data.")
@click.option("--unique-ratio", type=FloatRange(min=0, max=1, min_open=True), default=1.0, show_default=True,
              help="Unique ids / all ids of a table within one batch; measured with --data.")
@click.option("--data", "data", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Criteo TSV (plain or compressed): measure ids per feature and the unique ratio of every "
                   "table at --batch from its samples (features C1..C26 to the tables as `embnic train` maps them).")
@click.option("--data-samples", type=click.IntRange(min=1, max=10**10), default=1_000_000, show_default=True,
              help="Samples of --data read at most.")
@click.option("--clients", type=click.IntRange(min=1, max=10**6), default=None,
              help="Clients stepping at once [default: the config's [[clients]]].")
@click.option("--steps-per-s", type=FloatRange(min=0, max=10**6, min_open=True), default=None,
              help="Steps per second wanted of every client: size shards and cards for it.")
@click.option("--hardware", type=click.Choice(sorted(P.PROFILES)), default="server", show_default=True,
              help="Hardware profile the options below override.")
@_hw_opt("shard_ram_gb", 1e-3, 1e6, "Memory per shard for tables, GB.")
@_hw_opt("shard_disk_gb", 1e-3, 1e8, "Disk per shard for checkpoints and log, GB.")
@_hw_opt("nic_gbps", 1e-3, 1e5, "NIC line rate of every host, Gb/s each direction.")
@_hw_opt("card_msgs_per_s", 1.0, 1e12, "Messages/s one card completes (`bench dataplane` distinct_msgs_per_s).")
@_hw_opt("card_mpps", 1e-6, 1e6, "Million frames/s one card forwards (`bench dataplane` card_mpps).")
@_hw_opt("shard_keys_per_s", 1.0, 1e12, "Keys/s one shard looks up or updates (`bench server`).")
@_hw_opt("disk_keys_per_s", 1e-3, 1e12, "Keys/s one shard looks up or updates of disk-tier tables (`bench server "
         "--disk`; default: 0.08 x --shard-keys-per-s, measured at a cache hit ratio of 0.66).")
@_hw_opt("client_frames_per_s", 1.0, 1e12, "Frames/s one client sends or receives.")
@_hw_opt("rtt_us", 1e-3, 1e8, "Base round trip client-card-shard-card-client, µs.")
@click.option("--mtu", type=click.IntRange(*MTU_LIMITS), default=None,
              help=f"Link MTU, {MTU_LIMITS[0]}..{MTU_LIMITS[1]} as [cluster] mtu [default: the config's].")
@json_option
def plan(config, batch, ids_per_feature, unique_ratio, data, data_samples, clients, steps_per_s, hardware, mtu,
         as_json, **hw_over):
    """Size a cluster: per shard rows, memory and disk; per card frames/s, messages/s, Gb/s and
    state-map entries; which limit binds first; shards and cards for --steps-per-s.

    Traffic is counted as the client builds its rounds; tables are sized by `expected_rows`, else
    `rows` (a table with neither needs `expected_rows`); a table on the disk tier costs its shard
    its cache in memory and its keys at --disk-keys-per-s (docs/planning.md).

    \b
    Examples:
      embnic plan -c examples/testbed.toml --batch 256 --data testbed/training/data/criteo_kaggle_train_sample.tsv
      embnic plan -c examples/plan-criteo1tb.toml --batch 8192 --unique-ratio 0.35 --steps-per-s 10 --json
    """
    cfg = load_config(config)
    over = {k: v for k, v in hw_over.items() if v is not None}
    if "shard_keys_per_s" in over and "disk_keys_per_s" not in over:  # the measured ratio, of the shard given
        over["disk_keys_per_s"] = P.DISK_KEYS_RATIO_MEASURED * over["shard_keys_per_s"]
    hw = dataclasses.replace(P.PROFILES[hardware], **over)
    n_clients = clients or max(1, len(cfg.clients))
    with errors_as((ConfigError, None), (ValueError, as_usage)):  # a ConfigError: exit 2 naming the field
        if data:
            from embnic.testbed.training import criteo
            from embnic.testbed.training.train import feature_tables

            rows = [t.rows for t in cfg.tables] if len(cfg.tables) == criteo.NUM_SPARSE else None
            d = criteo.load_criteo(data, rows=rows, max_rows=data_samples)
            w = P.measure_workload(cfg, d.sparse, feature_tables(cfg, d.sparse.shape[1]), batch,
                                   clients=n_clients, steps_per_s=steps_per_s, source=str(data))
        else:
            w = P.uniform_workload(cfg, batch, ids_per_feature=ids_per_feature, unique_ratio=unique_ratio,
                                   clients=n_clients, steps_per_s=steps_per_s)
        res = P.plan(cfg, w, hw, mtu=mtu)
    if as_json:
        click.echo(json.dumps(_finite(res), indent=1, allow_nan=False))
        return
    click.echo(render(res))


def _finite(x):
    """``x`` with every infinite float (a limit nothing reaches) as None: strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _ids(ids: list) -> str:
    """Shard ids as ranges: 0-3, 7."""
    runs = [[v for _, v in g] for _, g in itertools.groupby(enumerate(ids), lambda iv: iv[1] - iv[0])]
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _n(x: float) -> str:
    """A figure for people: 1,234 or 1.23e+09."""
    if x == float("inf"):
        return "unbounded"
    if abs(x) >= 1e7:
        return f"{x:.3g}"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.3g}"


def render(res: dict) -> str:
    """The text form of a :func:`embnic.control.capacity.plan` result."""
    c, w, s, card = res["config"], res["workload"], res["per_step"], res["card"]
    out = [f"cluster: {c['tables']} tables, {_n(c['rows'])} rows, {c['shards']} shards ({c['sharding']}), MTU {c['mtu']}",
           f"workload: batch {w['batch']}, {w['clients']} client(s), {_n(w['ids_per_step'])} ids/step, "
           f"unique {w['unique_ratio']:.3f} ({w['source']})",
           f"per step and client: {s['request_messages']} request messages + {s['probes']} tail probes, "
           f"{s['request_frames']} request frames / {_n(s['request_bytes'])} B, {s['reply_frames']} reply frames / "
           f"{_n(s['reply_bytes'])} B, {s['rounds']} rounds",
           f"rate planned: {_n(res['rate'])} steps/s per client "
           + ("(wanted)" if w["steps_per_s"] is not None else f"(the binding limit: {res['binds']})"),
           "", f"{'shard':>6} {'rows':>14} {'memory GB':>10} {'disk GB':>9} {'keys/s':>10} {'Gb/s in':>8} {'Gb/s out':>8}"]
    a = res["shards"]
    for sh in a[:3] + [None] + a[-1:] if len(a) > 8 else a:  # more than 8: the first three, the last, the range
        if sh is None:
            out.append(f"{'...':>6} {len(a) - 4} more; over all {len(a)}: rows {min(x['rows'] for x in a):,}.."
                       f"{max(x['rows'] for x in a):,}, memory {min(x['memory_gb'] for x in a):.2f}.."
                       f"{max(x['memory_gb'] for x in a):.2f} GB")
            continue
        out.append(f"{sh['id']:>6} {sh['rows']:>14,} {sh['memory_gb']:>10.2f} {sh['disk_gb']:>9.2f} "
                   f"{_n(sh['keys_per_s']):>10} {sh['gbps_in']:>8.2f} {sh['gbps_out']:>8.2f}")
    dt = res["disk_tier"]
    if dt["tables_on_disk"]:
        a = dt["assumptions"]
        groups: dict = {}
        for sh in res["shards"]:
            groups.setdefault(tuple(sh["tables_on_disk"]), []).append(sh["id"])
        out += ["", f"disk tier: {dt['tables_on_disk']} table(s) on disk on {dt['shards_with_disk_tables']} shard(s), "
                    f"{_n(dt['rows_on_disk'])} rows; memory = their caches + block cache + "
                    f"{a['fixed_overhead_bytes'] / 2**20:.0f} MiB fixed overhead, disk = RocksDB stores "
                    f"(+{a['rocksdb_entry_overhead_bytes']} B a row, x{a['rocksdb_space_amplification']} assumed) "
                    "x 2 for checkpoints"]
        for tabs, ids in groups.items():
            what = (", ".join(tabs) if len(tabs) <= 8 else f"{len(tabs)} tables: " + ", ".join(tabs[:6]) + ", ...") \
                if tabs else "none (all in memory)"
            out.append(f"  shard{'s' if len(ids) > 1 else ''} {_ids(ids)}: on disk {what}")
        sh0 = max(res["shards"], key=lambda x: x["memory_gb"])
        out.append(f"  memory of shard {sh0['id']}: {sh0['arena_memory_gb']:.2f} GB in-memory tables + "
                   f"{sh0['disk_tier_memory_gb']:.2f} GB disk tier; its stores {sh0['store_gb']:.2f} GB")
        if dt["caches_larger_than_rows_held"]:
            c = dt["caches_larger_than_rows_held"]
            out.append(f"  {len(c)} table(s) cache more rows than a shard holds of them (memory on empty slots): "
                       + ", ".join(f"{x['table']} ({_n(x['cache_rows'])})" for x in c[:6]) + (", ..." if len(c) > 6 else ""))
        out.append(f"  disk-tier keys at {_n(a['disk_keys_per_s'])}/s per shard (assumed: {a['disk_keys_per_s_source']})")
    st = card["state_size"]
    out += ["", f"card: {_n(card['frames_per_s'])} frames/s, {_n(card['messages_per_s'])} messages/s, "
                f"{card['gbps']:.2f} Gb/s, {card['state_entries_in_flight']:,} state-map entries in flight"
                + (f" (of {st:,})" if st else ""),
            "", "steps/s per client each limit allows (config's shards, one card):"]
    for k, v in sorted(res["limits"].items(), key=lambda kv: kv[1]):
        out.append(f"  {k:<14} {_n(v):>12}" + ("   <- binds first" if k == res["binds"] else ""))
    out.append(f"step time estimate: {res['step_time_us']:,.0f} µs")
    bad = [k for k, ok in res["fits"].items() if not ok]
    if bad:
        out.append("does not fit: " + ", ".join(bad))
    n = res["needed"]
    mem_alone = n["shards_for_memory"] if n["shards_for_memory"] is not None else "none suffice"
    if n.get("shards") is None:  # no number of shards meets the rate or the memory: the note says what limits it
        line = (f"needed: no shard count meets it: {n.get('shards_note') or 'see the limits above'} "
                f"(memory alone {mem_alone}, disk {n['shards_for_disk']})")
    else:
        line = f"needed: {n['shards']} shard(s) (memory alone {mem_alone}, disk {n['shards_for_disk']})"
    if "cards" in n:
        line += (f", {n['cards']} card(s) for {_n(w['steps_per_s'])} steps/s per client (step time then "
                 f"{n['step_time_us']:,.0f} µs)")
        if not n["client_keeps_up"]:
            line += (f"; a client manages only {_n(n['client_limit_steps_per_s'])} steps/s (its frames, NIC or "
                     "latency): more clients with smaller batches")
    if n.get("shards_note") and n.get("shards") is not None:
        line += f"; {n['shards_note']}"
    out.append(line)
    return "\n".join(out)
