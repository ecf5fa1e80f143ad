"""``embnic bench``: speed benchmarks, each against a baseline measured in the same run."""
from __future__ import annotations

import importlib
from pathlib import Path

import click

from embnic.control.errors import MissingDependencyError

_out = click.option("--out", "out", type=click.Path(file_okay=False), default="out/bench", show_default=True,
                    help="Directory for bench.json (results are merged into it).")


@click.group("bench")
def bench():
    """Speed benchmarks; results are merged into DIR/bench.json with ratios to baselines run alongside.

    \b
    Example:
      embnic bench prep --out out/bench
      embnic bench dataplane --out out/bench
    """


def _fmt(v) -> str:
    if isinstance(v, bool) or not isinstance(v, float):
        return str(v)
    return f"{v:,.3f}" if abs(v) < 1000 else f"{v:,.0f}"


def _show(name: str, res: dict, indent: int = 0) -> None:
    """Print a result dict: scalars one per line, nested dicts (e.g. ``af_packet``) indented below
    their key, short lists of scalars inline; longer lists are left to bench.json."""
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
@click.option("--seconds", type=click.FloatRange(min=0.5), default=5.0, show_default=True,
              help="Measurement time per configuration.")
def dataplane(out, seconds):
    """The card on one lcore against dpdk-testpmd (io and macswap) forwarding on one lcore, on
    the same vdevs, pool and burst (net_pcap in-memory replay into net_null, and
    net_af_packet over a veth pair); a workload of distinct messages with their replies
    (every state-map entry inserted and freed: distinct_msgs_per_s); the card's two-lcore
    pipeline beside. bench.json's `targets` says which targets are met.

    \b
    Example:
      embnic bench dataplane --out out/bench --seconds 5
    """
    try:
        mod = importlib.import_module("embnic.testbed.bench.dataplane")
    except ImportError as e:
        raise MissingDependencyError(f"the dataplane benchmark is not available: {e}", dependency=e.name) from None
    res = mod.run(Path(out), seconds=seconds)
    _show("dataplane", res)
    click.echo(f"wrote {Path(out) / 'bench.json'}")


@bench.command("all")
@_out
@click.pass_context
def all_(ctx, out):
    """Every benchmark in turn.

    \b
    Example:
      embnic bench all --out out/bench
    """
    ctx.invoke(prep, out=out, batch_size=4096, repeats=7)
    ctx.invoke(dataplane, out=out, seconds=5.0)
