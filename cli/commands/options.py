"""Shared click options, parameter types and command decorators, defined once for every ``embnic`` command.
The settings options default to ``None``: :mod:`embnic.control.settings` resolves them (docs/cli.md)."""
from __future__ import annotations

import contextlib
import functools
import ipaddress
import math
import os
import re
import signal
from pathlib import Path
from typing import Callable

import click

from embnic.client_lib.config import host_ipv4_problem, is_multicast_mac
from embnic.client_lib.statemap import DEFAULT_PLAN_RATE
from embnic.control.errors import MissingDependencyError, OperationalError, UsageError
from embnic.control.runstate import require_root
from embnic.control.settings import DEFAULT_NAME, DEFAULT_TARGET, NAME_RE

_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")


# --------------------------------------------------------------------------- param types
class MacType(click.ParamType):
    """An Ethernet MAC address ``aa:bb:cc:dd:ee:ff`` (normalised to lower case)."""

    name = "MAC"

    def convert(self, value, param, ctx):
        if not (isinstance(value, str) and _MAC_RE.match(value)):
            self.fail(f"{value!r} is not a MAC address (write e.g. 02:00:00:00:00:01)", param, ctx)
        if is_multicast_mac(value):
            self.fail(f"{value} is a multicast/broadcast MAC (low bit of the first octet set): give the "
                      "peer's own unicast MAC, e.g. 02:00:00:00:00:01", param, ctx)
        return value.lower()


class IPv4Type(click.ParamType):
    """A dotted-quad IPv4 address; with ``host=True`` one host's unicast address
    (:func:`embnic.client_lib.config.host_ipv4_problem`: not 0.0.0.0, multicast or broadcast)."""

    name = "IPV4"

    def __init__(self, host: bool = False):
        self.host = host

    def convert(self, value, param, ctx):
        try:
            addr = ipaddress.IPv4Address(value)
        except (ValueError, TypeError):
            self.fail(f"{value!r} is not an IPv4 address (write e.g. 10.0.0.2)", param, ctx)
        problem = host_ipv4_problem(addr) if self.host else None
        if problem:
            self.fail(f"{problem}: give the peer's own unicast IPv4 address, e.g. 10.0.0.2", param, ctx)
        return str(addr)


class NameType(click.ParamType):
    """A pipeline instance name (used in file names under the run directory)."""

    name = "NAME"

    def convert(self, value, param, ctx):
        if isinstance(value, str) and NAME_RE.match(value):
            return value
        self.fail(f"{value!r} is not a valid name (letters, digits, '_', '.', '-'; at most 64)", param, ctx)


class TargetType(click.ParamType):
    """A registered pipeline target name (:func:`embnic.control.targets.base.target_names`), checked when used
    so a target registered after import (``register_target``) is accepted too."""

    name = "TARGET"

    def get_metavar(self, param, ctx=None) -> str:
        from embnic.control.targets.base import target_names

        return "[" + "|".join(target_names()) + "]"

    def convert(self, value, param, ctx):
        from embnic.control.targets.base import get_target_class

        try:
            get_target_class(value)
        except UsageError as e:
            self.fail(e.message, param, ctx)
        return value


class OutPath(click.ParamType):
    """Where a command writes, a folder (``kind="dir"``) or a file: one rule for every output option
    (docs/cli.md, "Output paths"; :func:`out_path_problem`), each fault a usage error. ``-`` is standard
    output where ``allow_dash``. The value is returned as given (a string)."""

    def __init__(self, kind: str, example: str = "out", allow_dash: bool = False):
        if kind not in ("dir", "file"):
            raise ValueError(f"kind must be 'dir' or 'file', got {kind!r}")
        self.kind, self.example, self.allow_dash = kind, example, allow_dash
        self.name = "DIR" if kind == "dir" else "FILE"

    def convert(self, value, param, ctx):
        text = os.fspath(value) if isinstance(value, os.PathLike) else value
        if not isinstance(text, str) or not text.strip():
            self.fail(f"empty path; give a {'folder' if self.kind == 'dir' else 'file'}, e.g. {self.example}",
                      param, ctx)
        if self.allow_dash and text == "-":
            return text
        problem = out_path_problem(text, self.kind, self.example)
        if problem:
            self.fail(problem, param, ctx)
        return text


def out_path_problem(path: str | os.PathLike, kind: str, example: str = "out") -> str | None:
    """One line naming the path and the fix when a command may not write to ``path``, else None: a folder
    (``kind="dir"``) is created with its parents, so the nearest one that exists must be writable; a file's
    folder must exist. ``example`` is a name for the message's example (``e.g. DIR/example``)."""
    p = Path(path)
    if kind == "file":
        if p.is_dir():
            return f"{path} is a folder: give a file name, e.g. {p / example}"
        if not p.parent.exists():
            return f"folder {p.parent} does not exist; create it (mkdir -p {p.parent}) or write elsewhere"
        if not p.parent.is_dir():
            return f"{p.parent} is a file, not a folder: write elsewhere"
        into = p.parent
    elif p.exists():
        if not p.is_dir():
            return f"{path} is a file: give a folder (created if missing), e.g. {p.parent / example}"
        into = path
    else:
        a = p.absolute().parent
        while not a.exists():
            a = a.parent
        if not a.is_dir():
            return f"{a} is a file, so folder {path} cannot be created: write elsewhere"
        if not os.access(a, os.W_OK | os.X_OK):
            return f"cannot create folder {path}: no write permission in {a}; write elsewhere"
        return None
    if not os.access(into, os.W_OK | os.X_OK):
        return f"cannot write into folder {into} (permission denied): write elsewhere"
    return None


MAC = MacType()
IPV4 = IPv4Type()
HOST_IPV4 = IPv4Type(host=True)
NAME = NameType()
TARGET = TargetType()
UDP_PORT = click.IntRange(1, 65535)
U16 = click.IntRange(0, 0xFFFF)


# --------------------------------------------------------------------------- options
def _compose(*decorators: Callable) -> Callable:
    return lambda f: functools.reduce(lambda g, d: d(g), reversed(decorators), f)


class FloatRange(click.FloatRange):
    """``click.FloatRange`` that also refuses ``nan`` and ``inf`` (click compares against the bounds only).
    Every float option of the CLI uses this type."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


@contextlib.contextmanager
def errors_as(*rules: tuple):
    """Within the block, an exception of a command's own (not a library category) leaves as the CLI error
    that says it in one line: ``rules`` are ``(exception types, make)`` pairs tried in order, as ``except``
    clauses are; the first that matches raises ``make(e)`` in its place, or ``e`` itself when ``make`` is
    None (a subclass a later rule would catch). An exception no rule matches passes unchanged."""
    try:
        yield
    except Exception as e:
        make = next((m for types, m in rules if isinstance(e, types)), False)
        if not make:
            raise
        raise make(e) from None


def as_operational(e: Exception) -> OperationalError:
    """An :func:`errors_as` rule's ``make``: the error's text, exit 1."""
    return OperationalError(str(e))


def as_usage(e: Exception) -> click.UsageError:
    """An :func:`errors_as` rule's ``make``: the error's text as a usage error, exit 2."""
    return click.UsageError(str(e))


def as_param(hint: str | None = None) -> Callable[[Exception], click.BadParameter]:
    """An :func:`errors_as` rule's ``make``: the error's text as a bad value of option ``hint`` (by default
    the one the error names, its ``option``, else the parameter being converted), exit 2."""
    return lambda e: click.BadParameter(str(e), param_hint=hint or getattr(e, "option", None))


def as_missing(prefix: str) -> Callable[[ImportError], MissingDependencyError]:
    """An :func:`errors_as` rule's ``make`` for an ``ImportError``: ``prefix`` and its text, naming the
    missing module as the dependency, exit 2."""
    return lambda e: MissingDependencyError(f"{prefix}{e}", dependency=e.name)


def config_option(required: bool = False, example: str | None = None) -> Callable:
    """``--config/-c FILE`` (env ``EMBNIC_CONFIG``): the cluster config (docs/config.md). With ``example``
    the command cannot run without it: none given is a usage error naming that example config."""

    def check(ctx, param, value):
        if value is not None and not str(value).strip():  # `-c ''` would read as the current directory
            raise click.BadParameter("empty path; give the cluster config file, e.g. -c examples/cluster.toml",
                                     ctx=ctx, param=param)
        if value is None and example:
            raise click.UsageError(f"--config FILE is required (or set EMBNIC_CONFIG); see {example}", ctx=ctx)
        return value

    help_ = "Cluster config (TOML, docs/config.md). Env: EMBNIC_CONFIG." + (" Required." if required or example else "")
    return click.option("--config", "-c", "config", metavar="FILE", envvar="EMBNIC_CONFIG",
                        type=click.Path(dir_okay=False), default=None, help=help_, callback=check)


#: ``--rate``: where ``pipeline load`` and ``config check`` state what the state map tolerates
rate_option = click.option("--rate", type=FloatRange(min=1), default=DEFAULT_PLAN_RATE, show_default=True,
                           metavar="MSGS_PER_S", help="Messages/s through the card at which to state the state "
                                                      "map's loss tolerance.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")

name_option = click.option("--name", "name", type=NAME, envvar="EMBNIC_NAME", default=None,
                           help=f"Pipeline instance name (default {DEFAULT_NAME!r}). Env: EMBNIC_NAME.")
ctl_option = click.option("--ctl", "ctl", metavar="PATH", envvar="EMBNIC_CTL", default=None,
                          help="Control socket of the running card (default: from the pipeline's "
                               "state file, else RUN_DIR/NAME.sock). Env: EMBNIC_CTL.")
target_option = click.option("--target", "target", envvar="EMBNIC_TARGET", default=None, type=TARGET,
                             help=f"Pipeline target (default: the one pipeline NAME was loaded on, else {DEFAULT_TARGET!r}): "
                                  "dpdk runs embnic-dp, bmv2 the P4 program on simple_switch, p4dpdk "
                                  "the P4 program for PNA in DPDK's SWX pipeline (embnic-swx). Env: EMBNIC_TARGET.")

#: options of every command that talks to a loaded pipeline
pipeline_options = _compose(config_option(), target_option, name_option, ctl_option)


def entry_options(noun: str) -> Callable:
    """``--port --mac --ip --udp-port``: the fields of a route (``noun`` = ``"shard"``) or client table
    entry, each ``None`` when not given (:func:`embnic.control.targets.base.resolve_peer` fills them in)."""
    return _compose(
        click.option("--port", "port", type=click.IntRange(0, 1023), default=None, help="Card (DPDK) port it hangs off."),
        click.option("--mac", type=MAC, default=None, help=f"The {noun}'s MAC address."),
        click.option("--ip", type=HOST_IPV4, default=None, help=f"The {noun}'s IPv4 address."),
        click.option("--udp-port", "udp_port", type=UDP_PORT, default=None, help=f"The {noun}'s UDP port."))


# --------------------------------------------------------------------------- testbed-style commands
# (testbed, trace, replay, demo: they need root and bring a namespace testbed up and down)
DEFAULT_TESTBED_NAME = "emb"


def needs_root(what: str):
    """Decorator: the command checks for root (CAP_NET_ADMIN) first and exits 2 without it."""

    def deco(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            require_root(what, why="CAP_NET_ADMIN, for network namespaces and veth pairs",
                         example=f"sudo embnic {what} ...")
            return f(*args, **kwargs)

        return wrapper

    return deco


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Within the block SIGTERM raises KeyboardInterrupt, so ``finally`` blocks (testbed down) run."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def check_name_param(ctx, param, value):
    """Click callback: a testbed name must be 1-8 letters/digits starting with a letter (exit 2 otherwise)."""
    from embnic.testbed.net.topology import check_name

    with errors_as((ValueError, as_param())):
        return check_name(value)


testbed_name_option = click.option("--name", "-n", "name", default=DEFAULT_TESTBED_NAME, envvar="EMBNIC_TESTBED", show_default=True,
                           callback=check_name_param,
                           help="Testbed name: prefix of every namespace and interface (1-8 letters/digits). "
                                "Env: EMBNIC_TESTBED.")

pmd_option = click.option("--pmd", type=click.Choice(["af_packet", "af_xdp"]), default="af_packet", show_default=True,
                          envvar="EMBNIC_PMD",
                          help="The card's DPDK PMD on its veth ends: af_packet (any MTU) or af_xdp (MTU at most 3506; "
                               "netem then uses the user backend). docs/deploy.md says when to pick which. Env: EMBNIC_PMD.")
#: ``--target``, the card of a testbed (trace replay, demo)
card_option = click.option("--target", type=click.Choice(["dpdk", "bmv2", "p4dpdk"]), default="dpdk",
                           show_default=True, help="The card: dpdk (embnic-dp), bmv2 (the P4 program on simple_switch, "
                                                   "p4/) or p4dpdk (the P4 program for PNA in DPDK's SWX pipeline, embnic-swx).")
#: ``--model``, the CTR model trained (train, demo)
model_option = click.option("--model", type=click.Choice(["fm", "dlrm"]), default="fm", show_default=True,
                            help="fm: the numpy factorisation machine; dlrm: TorchRec's DLRM with its tables on the "
                                 "shards (needs the embnic[torch] extra).")
