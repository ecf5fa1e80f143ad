"""``python -m embnic.testbed.server --shard I --config FILE [--bind IP] [--port P]``: one shard.

What the namespace testbed starts in every shard namespace (the library, not the CLI); users
run the same through ``embnic server``. Logs like it (:data:`~embnic.testbed.server.foreground.LOG_FORMAT`),
stops on SIGTERM/SIGINT with its counters as one JSON line, exits 0; a bad config or shard id
exits 2, an address it cannot bind, a store directory it cannot use or a missing shard library 1, each with one line naming the fix.
"""
from __future__ import annotations

import argparse
import logging
import sys

from embnic.client_lib.clib import NativeLibraryError
from embnic.client_lib.config import ConfigError, load_config
from embnic.control.errors import ControlError
from embnic.testbed.server.durability import DurabilityError
from embnic.testbed.server.foreground import (LOG_FORMAT, ServerOptionError, bind_error_message,
                                              check_server_options, run_server)
from embnic.testbed.server.stores import StoreDependencyError, StoreSetupError


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line plus a hint (not argparse's whole usage), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\nTry '{self.prog} --help' for the options.\n")


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the shard; returns the exit code.

    The options are checked by :func:`~embnic.testbed.server.foreground.check_server_options`,
    the same checks ``embnic server`` makes: a bad one is one ``Error:`` line and exit 2.
    """
    ap = _Parser(prog="python -m embnic.testbed.server",
                 description="Serve one parameter-server shard over UDP until SIGTERM.")
    ap.add_argument("--shard", type=int, required=True, help="id of one of the config's [[shards]]")
    ap.add_argument("--config", "-c", required=True, help="cluster config (TOML)")
    ap.add_argument("--bind", default=None, help="IPv4 address (default: the shard's ip)")
    ap.add_argument("--port", type=int, default=None, help="UDP port (default: the shard's port)")
    ap.add_argument("--dedup-window", type=int, default=65536, help="applied updates remembered")
    ap.add_argument("--fixed-length", action="store_true",
                    help="fixed-length baseline: data must be announced by a SIZE_REQ (docs/protocol.md)")
    ap.add_argument("--checkpoint-dir", default=None, help="write-ahead log and checkpoints in DIR/shard-<id>")
    ap.add_argument("--checkpoint-every", type=int, default=0, help="checkpoint after N logged updates (0: SIGUSR1 only)")
    ap.add_argument("--restore", default=None, help="load DIR/shard-<id> (checkpoint + log) before serving")
    ap.add_argument("--no-log-fsync", action="store_true", help="no fdatasync of the log (to measure its cost)")
    ap.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this TCP port")
    ap.add_argument("--metrics-bind", default="0.0.0.0", help="address of the metrics endpoint")
    ap.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    opts = {k: getattr(args, k) for k in ("dedup_window", "fixed_length", "checkpoint_dir", "checkpoint_every",
                                          "restore", "metrics_port", "metrics_bind")}
    try:
        check_server_options(cfg, args.shard, config_name=args.config, bind=args.bind, port=args.port, **opts)
    except ServerOptionError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    me = cfg.shard(args.shard)
    ip = args.bind or me.ip
    port = me.port if args.port is None else args.port
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), format=LOG_FORMAT)
    try:
        return run_server(cfg, args.shard, ip, port, log_fsync=not args.no_log_fsync, **opts)
    except ControlError as e:  # the metrics endpoint: port taken, address not ours, prometheus-client missing
        print(f"Error: {e}", file=sys.stderr)
        return e.exit_code
    except (DurabilityError, NativeLibraryError) as e:  # the log's directory; the shard's C library (one line)
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except StoreSetupError as e:  # the disk tier's directory or dependency: one line, no traceback
        print(f"Error: {e}", file=sys.stderr)
        return 2 if isinstance(e, StoreDependencyError) else 1
    except OSError as e:
        print(f"Error: {bind_error_message(e, ip, port)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
