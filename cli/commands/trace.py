"""``embnic trace record|replay`` (and ``embnic replay``, the same command object): record the client frames
of K training batches as a pcap, replay such a trace into the card of a testbed (testbed/traces/trace.py)."""
from __future__ import annotations

import click

from embnic.cli.commands.options import (FloatRange, OutPath, as_param, card_option, check_name_param,
                                         config_option, errors_as, needs_root, sigterm_as_interrupt)
from embnic.control.errors import OperationalError


@click.group("trace")
def trace():
    """Record embnic traffic of real training batches as pcap traces, and replay them
    (`embnic trace replay`, also `embnic replay`).

    \b
    Example:
      sudo embnic trace record -c examples/testbed.toml --batches 4 --out out/t.pcap
      sudo embnic trace replay out/t.pcap -c examples/testbed.toml --rate 2000
    """


@trace.command("record")
@config_option(example="examples/testbed.toml")
@click.option("--data", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Criteo TSV (Kaggle train.txt layout). Default: the sample shipped with embnic.")
@click.option("--batches", "-k", type=click.IntRange(1, 10000), required=True,
              help="Training batches to record per client.")
@click.option("--out", "out", type=OutPath("file", "t.pcap"), required=True,
              help="The pcap to write (its folder must exist); the sidecar JSON goes next to it (same name, .json).")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True, help="Samples per batch.")
@click.option("--client", "clients", type=int, multiple=True,
              help="Record this client (repeatable). Default: every client of the config.")
@click.option("--name", default="embrec", show_default=True, callback=check_name_param,
              help="Testbed name (namespace/interface prefix, 1-8 letters/digits).")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: when stderr is a terminal).")
@needs_root("trace record")
def record_cmd(config, out, clients, **opts):
    """Bring the testbed up, train K batches from every client through the card with real shards
    answering, write each client's frames to OUT (pcap) and a sidecar OUT.json describing the run,
    and bring the testbed down.

    \b
    Examples:
      sudo embnic trace record -c examples/testbed.toml --batches 4 --out out/t.pcap
      sudo embnic trace record -c examples/testbed.toml -k 10 --client 1 --out /tmp/c1.pcap
    """
    from embnic.testbed.traces import trace as TR
    from embnic.testbed.training.criteo import CriteoFormatError

    # --data no Criteo TSV: read before the testbed comes up
    with sigterm_as_interrupt(), errors_as((CriteoFormatError, as_param("--data"))):
        TR.record(config, out, clients=list(clients) or None, log=click.echo, **opts)


def _check_pcap(ctx, param, value):
    """Click callback: PCAP must be a classic pcap file (exit 2 otherwise, before root is checked)."""
    from embnic.control.pcap import check_pcap

    with errors_as((ValueError, lambda e: click.BadParameter(f"{e}: give a trace recorded by `embnic trace "
                                                             "record`")),
                   (OSError, lambda e: click.BadParameter(f"cannot read {value}: {e.strerror or e}"))):
        check_pcap(value)
    return value


@trace.command("replay")
@click.argument("pcap", type=click.Path(dir_okay=False, exists=True), callback=_check_pcap)
@config_option(example="examples/testbed.toml")
@click.option("--rate", type=FloatRange(min=1), default=None, metavar="PPS",
              help="Total frames/s over all clients (default: the recorded timing).")
@click.option("--topspeed", is_flag=True, help="As fast as tcpreplay can (overrides --rate).")
@click.option("--out", "out", type=OutPath("dir", "replay"), default="out/replay", show_default=True,
              help="Directory for report.json and the PNG plots (created if missing).")
@click.option("--wait", "wait_s", type=FloatRange(0.1, 600), default=5.0, show_default=True,
              help="Seconds to wait for missing replies after the last frame.")
@click.option("--name", default="embrpl", show_default=True, callback=check_name_param,
              help="Testbed name (namespace/interface prefix, 1-8 letters/digits).")
@click.option("--force", is_flag=True,
              help="Replay even if the trace's sidecar (PCAP with .json) says it was recorded with another config.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: when stderr is a terminal).")
@card_option
@needs_root("replay")
def replay_cmd(pcap, config, out, **opts):
    """Replay PCAP (from `embnic trace record`) into the card of a fresh namespace testbed with
    tcpreplay on each client's veth, with real shards answering; report frames/s, messages
    completed, replies per client, drops by reason and latency percentiles (OUT/report.json + PNG
    plots).

    The config must be the one the trace was recorded with (the sidecar PCAP.json has its hash):
    otherwise it exits 2, unless --force. Exits 1 if a recorded request got no reply (naming the
    node that died, if one did) or was answered with ERROR.

    \b
    Examples:
      sudo embnic replay out/t.pcap -c examples/testbed.toml
      sudo embnic replay out/t.pcap -c examples/testbed.toml --rate 5000 --out out/replay5k
      sudo embnic replay out/t.pcap -c other.toml --force   # not the config it was recorded with
      sudo embnic replay out/t.pcap -c examples/testbed.toml --target bmv2   # through the P4 card
    """
    from embnic.testbed.traces import trace as TR

    with sigterm_as_interrupt():
        rep = TR.replay(pcap, config, out=out, log=click.echo, **opts)
    if not rep["all_replied"]:
        from embnic.testbed.net.topology import describe_dead

        why = f" ({describe_dead(rep['dead_nodes'])})" if rep.get("dead_nodes") else ""
        raise OperationalError(f"{rep['requests'] - rep['messages_replied']} of {rep['requests']} replayed "
                               f"requests got no reply{why} (report: {out}/report.json)")
    if not rep["all_completed"]:
        st = ", ".join(f"{k} {v}" for k, v in sorted(rep["error_statuses"].items()))
        raise OperationalError(f"{rep['messages_failed']} of {rep['requests']} replayed requests were answered "
                               f"with ERROR ({st}) (report: {out}/report.json)")


#: ``embnic replay``: ``trace replay`` at the top level (one command object)
replay = replay_cmd
