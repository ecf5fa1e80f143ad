"""The ``embnic`` command line: a thin click group; one module per noun registers its commands.

Exit codes: 0 ok, 1 operational failure (:class:`~embnic.control.errors.OperationalError`),
2 usage error (click's ``UsageError``/``BadParameter``).
"""
from __future__ import annotations

import importlib
import os
import sys

import click

# (module, attribute) of every command or group; each module owns its nouns.
_COMMANDS = (
    ("embnic.control.cmd_config", "config"),
    ("embnic.control.cmd_server", "server"),
    ("embnic.control.cmd_train", "train"),
    ("embnic.control.cmd_bench", "bench"),
    ("embnic.control.cmd_pipeline", "pipeline"),
    ("embnic.control.cmd_route", "route"),
    ("embnic.control.cmd_client", "client"),
    ("embnic.control.cmd_status", "status"),
    ("embnic.control.cmd_state", "state"),
    ("embnic.control.cmd_inspect", "inspect"),
    ("embnic.control.cmd_testbed", "testbed"),
    ("embnic.control.cmd_trace", "trace"),
    ("embnic.control.cmd_replay", "replay"),
    ("embnic.control.cmd_demo", "demo"),
)


class _Group(click.Group):
    """Loads each command's module only when that command runs (fast ``--help``)."""

    def list_commands(self, ctx):
        names = []
        for mod, attr in _COMMANDS:
            if importlib.util.find_spec(mod) is not None:
                names.append(attr)
        return sorted(names)

    def get_command(self, ctx, name):
        for mod, attr in _COMMANDS:
            if attr == name:
                if importlib.util.find_spec(mod) is None:
                    return None
                return getattr(importlib.import_module(mod), attr)
        return None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="EMBNIC_DEBUG",
              help="Show tracebacks on errors (also after the subcommand, or EMBNIC_DEBUG=1).")
@click.pass_context
def cli(ctx, debug):
    """embnic: program and drive the embnic SmartNIC pipeline for embedding training.

    \b
    Examples:
      embnic config check examples/cluster.toml
      embnic server --shard 0 --config examples/cluster.toml
      embnic train --config examples/cluster.toml --data criteo.tsv --steps 50
      embnic pipeline load --target dpdk --config examples/testbed.toml --vdev net_ring0 ...
      embnic status --watch
      embnic demo --steps 20 --out out/demo
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main() -> None:
    """Console-script entry point."""
    args = sys.argv[1:]
    # --debug is accepted anywhere before a "--" (also after the subcommand), and as EMBNIC_DEBUG=1
    end = args.index("--") if "--" in args else len(args)
    debug = "--debug" in args[:end] or os.environ.get("EMBNIC_DEBUG", "") not in ("", "0")
    args = [a for a in args[:end] if a != "--debug"] + args[end:]
    if debug:
        os.environ["EMBNIC_DEBUG"] = "1"
    try:
        cli.main(args=args, standalone_mode=False, prog_name="embnic")
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - last resort: one line unless --debug
        if debug:
            raise
        click.echo(f"Error: {type(e).__name__}: {e} (run with --debug for the traceback)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
