"""The ``embnic`` command line: a thin click group; one module per noun registers its commands.

Only this module and the command modules (``commands/``) know click. Library code raises the
plain errors of :mod:`embnic.control.errors`; :func:`to_click` is the one place they become
click errors and exit codes (docs/cli.md "Errors and exit codes"):

- ``usage`` → ``click.UsageError`` (exit 2; shown as one line naming the command's ``--help``);
- ``operational`` → ``click.ClickException`` (exit 1);
- ``needs-root``, ``missing-dependency`` → ``click.ClickException`` with exit 2;
- a cluster config that does not validate (:class:`~embnic.client_lib.config.ConfigError`) → exit 2.

Every command's callback is wrapped once when the command is loaded (:func:`_map_errors`), so
a usage error names the command that raised it. Click's usage errors — of its own parsing and
of :func:`to_click` alike — are shown once, by the top-level group (:class:`OneLineUsageGroup`),
as one line: ``Error: <message> (see 'embnic <cmd> --help')``, exit 2.
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


def to_click(e: Exception) -> click.ClickException:
    """The click error (message and exit code) for a library error.

    Args:
        e: a :class:`~embnic.control.errors.ControlError` (by its ``category``), a
            :class:`~embnic.client_lib.config.ConfigError` or a
            :class:`~embnic.client_lib.clib.NativeLibraryError` (exit 2, as a missing dependency).
    Returns:
        ``click.UsageError`` for the ``usage`` category (exit 2), else a ``click.ClickException``
        whose ``exit_code`` is the category's (1 operational; 2 needs-root, missing-dependency,
        and a config file that does not validate).
    Raises:
        TypeError: ``e`` is neither.
    """
    if isinstance(e, ControlError):
        if e.category == USAGE:
            return click.UsageError(e.message)
        out = click.ClickException(e.message)
        out.exit_code = e.exit_code
        return out
    if isinstance(e, ConfigError):
        out = click.ClickException(str(e))
        out.exit_code = 2
        return out
    if isinstance(e, NativeLibraryError):  # the package's C library not built or stale: its one line
        out = click.ClickException(str(e))
        out.exit_code = EXIT_CODES[MISSING_DEPENDENCY]
        return out
    raise TypeError(f"no CLI mapping for {type(e).__name__}")


def _map_errors(cmd: click.Command) -> click.Command:
    """Wrap the callbacks of ``cmd`` and its subcommands so library errors leave as :func:`to_click`'s."""
    cb = cmd.callback
    if cb is not None and not getattr(cb, "_embnic_mapped", False):
        @functools.wraps(cb)
        def mapped(*args, **kwargs):
            try:
                return cb(*args, **kwargs)
            except (ControlError, ConfigError, NativeLibraryError) as e:
                raise to_click(e) from None

        mapped._embnic_mapped = True
        cmd.callback = mapped
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            _map_errors(sub)
    return cmd

# (module, attribute) of every command or group; each module owns its nouns.
_COMMANDS = (
    ("embnic.cli.commands.config", "config"),
    ("embnic.cli.commands.server", "server"),
    ("embnic.cli.commands.train", "train"),
    ("embnic.cli.commands.bench", "bench"),
    ("embnic.cli.commands.pipeline", "pipeline"),
    ("embnic.cli.commands.peers", "route"),
    ("embnic.cli.commands.peers", "client"),
    ("embnic.cli.commands.status", "status"),
    ("embnic.cli.commands.state", "state"),
    ("embnic.cli.commands.inspect", "inspect"),
    ("embnic.cli.commands.testbed", "testbed"),
    ("embnic.cli.commands.trace", "trace"),
    ("embnic.cli.commands.trace", "replay"),  # alias of `trace replay`
    ("embnic.cli.commands.demo", "demo"),
    ("embnic.cli.commands.tables", "tables"),
    ("embnic.cli.commands.dissector", "dissector"),
    ("embnic.cli.commands.exporter", "exporter"),
    ("embnic.cli.commands.plan", "plan"),
)


def one_line_usage_error(e: click.UsageError, fallback: str = "embnic") -> click.ClickException:
    """``e`` as one line — ``<message> (see '<command path> --help')`` — with exit code 2.

    Click shows a usage error as three lines (``Usage: ...``, ``Try '... --help' for help.``,
    ``Error: ...``); the project's rule is one line that names the fix. ``fallback`` is the command
    path to name when click gives the error no context (an option missing its value).
    """
    where = e.ctx.command_path if e.ctx is not None else fallback
    msg = e.format_message()
    if msg.endswith(".") and not msg.endswith(".."):
        msg = msg[:-1]                        # click's "No such option '-x'." reads better without it
    out = click.ClickException(f"{msg} (see '{where} --help')")
    out.exit_code = e.exit_code
    return out


class OneLineUsageGroup(click.Group):
    """A group whose usage errors, and those of every command below it, are one line (exit 2).

    Parsing the group's own options happens in :meth:`make_context`; a subcommand's parsing and
    callback (nested groups included) in :meth:`invoke`. A group called without a subcommand
    still prints its help (click's ``NoArgsIsHelpError``).
    """

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
                return _map_errors(getattr(importlib.import_module(mod), attr))
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
    except (ControlError, ConfigError, NativeLibraryError) as e:  # raised outside a command callback (e.g. a parameter type)
        err = to_click(e)
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
