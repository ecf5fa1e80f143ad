"""``embnic trace record``: record the client frames of K training batches as a pcap (testbed/traces/trace.py)."""
from __future__ import annotations

import click

from embnic.control.commands.options import check_name_param, needs_root, sigterm_as_interrupt
from embnic.control.commands.options import config_option


@click.group("trace")
def trace():
    """Record embnic traffic of real training batches as pcap traces (replay them with `embnic replay`).

    \b
    Example:
      sudo embnic trace record -c examples/testbed.toml --batches 4 --out out/t.pcap
      sudo embnic replay out/t.pcap -c examples/testbed.toml --rate 2000
    """


@trace.command("record")
@config_option(required=True)
@click.option("--data", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Criteo TSV (Kaggle train.txt layout). Default: the sample shipped with embnic.")
@click.option("--batches", "-k", type=click.IntRange(1, 10000), required=True,
              help="Training batches to record per client.")
@click.option("--out", "out", type=click.Path(dir_okay=False), required=True,
              help="The pcap to write; the sidecar JSON goes next to it (same name, .json).")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True, help="Samples per batch.")
@click.option("--client", "clients", type=int, multiple=True,
              help="Record this client (repeatable). Default: every client of the config.")
@click.option("--name", default="embrec", show_default=True, callback=check_name_param,
              help="Testbed name (namespace/interface prefix, 1-8 letters/digits).")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: when stderr is a terminal).")
@needs_root("trace record")
def record_cmd(config, data, batches, out, batch_size, clients, name, progress):
    """Bring the testbed up, train K batches from every client through the card with real shards
    answering, capture each client's frames on its veth, write them to OUT (pcap, written with
    Scapy) and a sidecar OUT.json describing the run, and bring the testbed down.

    \b
    Examples:
      sudo embnic trace record -c examples/testbed.toml --batches 4 --out out/t.pcap
      sudo embnic trace record -c examples/testbed.toml -k 10 --client 1 --out /tmp/c1.pcap
    """
    if config is None:
        raise click.UsageError("--config FILE is required (or set EMBNIC_CONFIG); see examples/testbed.toml")
    from embnic.testbed.traces import trace as TR

    from embnic.testbed.training.criteo import CriteoFormatError

    with sigterm_as_interrupt():
        try:
            TR.record(config, out, batches=batches, data=data, batch_size=batch_size, clients=list(clients) or None,
                      name=name, progress=progress, log=click.echo)
        except CriteoFormatError as e:  # --data is no Criteo TSV: read before the testbed comes up
            raise click.BadParameter(str(e), param_hint="--data") from None
