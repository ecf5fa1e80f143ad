"""``embnic exporter``: the card's counters for Prometheus (one scrape = one reading of the card)."""
from __future__ import annotations

import signal
import threading

import click

from embnic.control import card_metrics
from embnic.cli.commands.options import IPV4, pipeline_options
from embnic.control.settings import open_target, resolve


@click.command()
@pipeline_options
@click.option("--port", type=click.IntRange(0, 65535), default=card_metrics.DEFAULT_PORT, show_default=True,
              help="TCP port of the HTTP endpoint (/metrics).")
@click.option("--bind", type=IPV4, default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--once", is_flag=True, help="Print one reading in the Prometheus text format and exit (no server).")
def exporter(config, target, name, ctl, port, bind, once):
    """Serve the card's counters to Prometheus at http://BIND:PORT/metrics until Ctrl-C or
    SIGTERM. Every scrape reads the pipeline the way `embnic status` does. Metric names:
    docs/cli.md ("Metrics"); a Grafana dashboard: contrib/grafana/embnic.json. A card that stops
    answering shows as embnic_card_up 0 and the exporter keeps serving.

    \b
    Examples:
      embnic exporter -c examples/testbed.toml --port 9464
      embnic exporter -c /run/embnic/testbed-emb/cluster.toml     # a testbed's card
      embnic exporter --once | grep embnic_card_drops_total
    """
    s = resolve(config, target, name, ctl)
    t = open_target(s)
    collector = card_metrics.CardCollector(t, {"target": s.target, "pipeline": s.name})
    if once:
        collector.quiet = True  # the failure is this command's one Error: line, not a log line too
        click.echo(card_metrics.exposition(collector), nl=False)
        if collector.last_error is not None:  # a one-shot check: the reading failed (embnic_card_up 0)
            raise click.ClickException(f"could not read the card: {collector.last_error}")
        return
    srv = card_metrics.MetricsServer(collector, port, bind)
    stop = threading.Event()
    old = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    click.echo(f"embnic exporter: the card of pipeline {s.name!r} ({s.target}) on http://{bind}:{srv.port}/metrics "
               "(Ctrl-C stops)", err=True)
    try:
        while not stop.wait(3600):
            pass
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        srv.close()
