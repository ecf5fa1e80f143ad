"""``embnic server``: run one parameter-server shard in the foreground."""
from __future__ import annotations

import logging

import click

from embnic.control.errors import OperationalError
from embnic.client_lib.config import load_config
from embnic.cli.commands.options import as_operational, as_usage, config_option, errors_as


def _no_workers(value) -> None:
    """``--workers`` (gone: one process per shard) refused in one line naming the fix."""
    if value is not None:
        raise click.UsageError("--workers is gone: a shard is one process; to use more cores, run more shards "
                               "(more [[shards]] in the config, one `embnic server` each; docs/server.md, "
                               "'More cores: more shards')")


@click.command("server")
@click.option("--shard", "shard_id", type=click.IntRange(0, 0xFFFF), required=True,
              help="Id of the shard to serve (one of the config's [[shards]]).")
@config_option(example="examples/cluster.toml")
@click.option("--bind", default=None, help="IPv4 address to listen on (default: the shard's ip in the config).")
@click.option("--port", type=int, default=None,
              help="UDP port (default: the shard's port in the config; 0 picks a free one).")
@click.option("--dedup-window", type=int, default=65536, show_default=True,
              help="Applied updates remembered to apply each exactly once.")
@click.option("--workers", type=int, hidden=True, expose_value=False, callback=lambda ctx, p, v: _no_workers(v))
@click.option("--fixed-length", is_flag=True,
              help="Fixed-length baseline: data requests must be announced by a SIZE_REQ of their client "
                   "(docs/protocol.md, 'Size messages'); unannounced ones are dropped and counted.")
@click.option("--checkpoint-dir", metavar="DIR", default=None,
              help="Keep a write-ahead log and checkpoints in DIR/shard-<id> (an update is acknowledged once on "
                   "disk). SIGUSR1 writes a checkpoint now.")
@click.option("--checkpoint-every", type=int, default=0, show_default=True,
              help="Checkpoint after this many logged updates (0: only on SIGUSR1); the log is cut behind it.")
@click.option("--restore", metavar="DIR", default=None,
              help="Before serving, load DIR/shard-<id>'s latest checkpoint and replay its log; the log continues "
                   "there unless --checkpoint-dir says otherwise.")
@click.option("--metrics-port", type=int, default=None,
              help="Serve Prometheus metrics on this TCP port (GET /metrics; docs/server.md, 'Metrics').")
@click.option("--metrics-bind", default="0.0.0.0", show_default=True, help="Address of the metrics endpoint.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True, help="Log verbosity (stderr).")
def server(shard_id, config, bind, port, log_level, **opts):
    """Serve shard I's rows of every table of the cluster over UDP until SIGTERM or Ctrl-C: answer
    lookups, apply updates exactly once (docs/server.md). At exit it logs its counters as one
    JSON line and exits 0.

    \b
    Examples:
      embnic server --shard 0 --config examples/cluster.toml
      embnic server --shard 1 -c examples/cluster.toml --bind 127.0.0.1 --port 17881
      embnic server --shard 0 -c examples/cluster.toml --fixed-length
      embnic server --shard 0 -c examples/cluster.toml --checkpoint-dir /var/lib/embnic --checkpoint-every 10000
      embnic server --shard 0 -c examples/cluster.toml --restore /var/lib/embnic
      embnic server --shard 0 -c examples/cluster.toml --metrics-port 9465
    """
    from embnic.cli.commands.tables import store_error
    from embnic.client_lib.clib import NativeLibraryError
    from embnic.testbed.server.durability import DurabilityError
    from embnic.testbed.server.foreground import (LOG_FORMAT, ServerOptionError, bind_error_message,
                                                  check_server_options, run_server)
    from embnic.testbed.server.stores import StoreSetupError, disk_tables, load_diskstore

    cfg = load_config(config)
    # the one set of checks, shared with python -m embnic.testbed.server
    with errors_as((ServerOptionError, as_usage)):
        check_server_options(cfg, shard_id, config_name=config, bind=bind, port=port, **opts)
    if disk_tables(cfg, shard_id):  # before the shard starts: the dependency, in one line
        with errors_as((StoreSetupError, store_error)):
            load_diskstore()
    me = cfg.shard(shard_id)
    ip = bind or me.ip
    p = me.port if port is None else port
    logging.basicConfig(level=getattr(logging, log_level.upper()), format=LOG_FORMAT)
    with errors_as(((DurabilityError, NativeLibraryError), as_operational), (StoreSetupError, store_error),
                   (OSError, lambda e: OperationalError(bind_error_message(e, ip, p)))):
        code = run_server(cfg, shard_id, ip, p, **opts)
    if code:
        raise SystemExit(code)
