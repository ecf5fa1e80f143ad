"""The ``embnic`` command line: a thin click group; one module per noun registers its commands.

Library errors become click errors and exit codes in one place, :func:`to_click`; usage errors are
shown as one line by :class:`OneLineUsageGroup` (docs/cli.md "Errors and exit codes").
"""
from __future__ import annotations

import functools
import importlib
import os
import sys

import click

from embnic.client_lib.clib import NativeLibraryError
from embnic.client_lib.config import ConfigError
from embnic.control.errors import EXIT_CODES, MISSING_DEPENDENCY, USAGE, ControlError

#: the library's errors, each mapped to a click error by :func:`to_click`
LIBRARY_ERRORS = (ControlError, ConfigError, NativeLibraryError)


def to_click(e: Exception) -> click.ClickException:
    """The click error for a library error: ``click.UsageError`` for a ``ControlError`` of the ``usage``
    category, else a ``click.ClickException`` with the category's exit code (a ``ConfigError`` or a
    ``NativeLibraryError`` exits 2). Raises TypeError for any other exception."""
    if isinstance(e, ControlError):
        if e.category == USAGE:
            return click.UsageError(e.message)
        message, code = e.message, e.exit_code
    elif isinstance(e, ConfigError):
        message, code = str(e), 2
    elif isinstance(e, NativeLibraryError):  # the package's C library not built or stale
        message, code = str(e), EXIT_CODES[MISSING_DEPENDENCY]
    else:
        raise TypeError(f"no CLI mapping for {type(e).__name__}")
    out = click.ClickException(message)
    out.exit_code = code
    return out


def _map_errors(cmd: click.Command) -> click.Command:
    """Wrap the callbacks of ``cmd`` and its subcommands so library errors leave as :func:`to_click`'s."""
    cb = cmd.callback
    if cb is not None and not getattr(cb, "_embnic_mapped", False):
        @functools.wraps(cb)
        def mapped(*args, **kwargs):
            try:
                return cb(*args, **kwargs)
            except LIBRARY_ERRORS as e:
                raise to_click(e) from None

        mapped._embnic_mapped = True
        cmd.callback = mapped
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            _map_errors(sub)
    return cmd


# every noun and the module that owns it (`replay` is `trace replay`)
_OWNERS = {"route": "peers", "client": "peers", "replay": "trace"}
_COMMANDS = {noun: f"embnic.cli.commands.{_OWNERS.get(noun, noun)}" for noun in (
    "config", "server", "train", "bench", "pipeline", "route", "client", "status", "state", "inspect", "testbed",
    "trace", "replay", "demo", "tables", "dissector", "exporter", "plan")}


def one_line_usage_error(e: click.UsageError, fallback: str = "embnic") -> click.ClickException:
    """``e`` as one line, ``<message> (see '<command path> --help')``, exit code 2 (click shows three).
    ``fallback`` is the command path to name when click gives the error no context."""
    where = e.ctx.command_path if e.ctx is not None else fallback
    msg = e.format_message()
    if msg.endswith(".") and not msg.endswith(".."):
        msg = msg[:-1]                        # click's "No such option '-x'." reads better without it
    out = click.ClickException(f"{msg} (see '{where} --help')")
    out.exit_code = e.exit_code
    return out


class OneLineUsageGroup(click.Group):
    """A group whose usage errors, and those of every command below it, are one line (exit 2); called
    without a subcommand it still prints its help (click's ``NoArgsIsHelpError``)."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as e:
            raise one_line_usage_error(e) from None

    def invoke(self, ctx):
        args = [*getattr(ctx, "_protected_args", ()), *ctx.args]
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as e:
            # click raises "Option '--x' requires an argument" with no context: name the (nested)
            # subcommand the arguments lead to
            path, cmd = ctx.command_path, self
            for a in args:
                sub = cmd.get_command(ctx, a) if isinstance(cmd, click.Group) else None
                if sub is None:
                    break
                path, cmd = f"{path} {a}", sub
            raise one_line_usage_error(e, path) from None


class _Group(OneLineUsageGroup):
    """Loads each command's module only when that command runs (fast ``--help``)."""

    def list_commands(self, ctx):
        return sorted(_COMMANDS)

    def get_command(self, ctx, name):
        mod = _COMMANDS.get(name)
        return None if mod is None else _map_errors(getattr(importlib.import_module(mod), name))


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="EMBNIC_DEBUG",
              help="Show tracebacks on errors (also after the subcommand, or EMBNIC_DEBUG=1).")
def cli(debug):  # --debug is acted on by main(), before click parses
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
    except (click.ClickException, *LIBRARY_ERRORS) as e:  # a library error also outside a callback (a parameter type)
        err = e if isinstance(e, click.ClickException) else to_click(e)
        err.show()
        sys.exit(err.exit_code)
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
