"""Shared click options, settings resolution and command helpers, defined once for every ``embnic`` command.

Precedence of every setting: built-in default < the config file's ``[control]`` section <
environment (``EMBNIC_*``) < command-line flag. Options therefore default to ``None`` and
:func:`resolve` fills in what the user did not say.

``[control]`` section of the cluster config (optional, all fields optional)::

    [control]
    target  = "dpdk"                      # pipeline target (EMBNIC_TARGET, --target)
    name    = "embnic"                    # pipeline instance name (EMBNIC_NAME, --name)
    ctl     = "/run/embnic/embnic.sock"   # control socket (EMBNIC_CTL, --ctl)
    binary  = "dataplane/build/embnic-dp" # card binary (EMBNIC_DP, --binary)
    eal_args = "-l 0,1 --no-huge ..."     # replaces the default EAL args (EMBNIC_EAL_ARGS, --eal-args)
    card_args = ["--idle-us", "50"]       # more embnic-dp arguments after `--` (--card-args)
    vdevs   = ["net_ring0", "net_ring1"]  # one DPDK port per vdev, in port order (--vdev)
    netns   = "card"                      # run the card in this network namespace (EMBNIC_NETNS, --netns)
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import ipaddress
import math
import os
import re
import signal
from pathlib import Path
from typing import Any, Callable

import click

from embnic.client_lib.config import ClusterConfig, ConfigError, did_you_mean, host_ipv4_problem, is_multicast_mac, load_config
from embnic.control.errors import UsageError, split_args
from embnic.control.runstate import read_state, require_root, run_dir

DEFAULT_NAME = "embnic"
DEFAULT_TARGET = "dpdk"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")


class ConfigFileError(click.ClickException):
    """The cluster config given to a command is invalid (exit 2: fix the file)."""

    exit_code = 2


def load_cluster(path: str | os.PathLike) -> ClusterConfig:
    """Load and validate the cluster config at ``path``.

    Raises:
        ConfigFileError: one line naming the file and the field (exit code 2).
    """
    try:
        return load_config(path)
    except ConfigError as e:
        raise ConfigFileError(str(e)) from None


@contextlib.contextmanager
def config_errors():
    """Turn a :class:`ConfigError` raised inside the block into :class:`ConfigFileError` (exit 2)."""
    try:
        yield
    except ConfigError as e:
        raise ConfigFileError(str(e)) from None


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
        if isinstance(value, str) and _NAME_RE.match(value):
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


MAC = MacType()
IPV4 = IPv4Type()
HOST_IPV4 = IPv4Type(host=True)
NAME = NameType()
TARGET = TargetType()
UDP_PORT = click.IntRange(1, 65535)
U16 = click.IntRange(0, 0xFFFF)


# --------------------------------------------------------------------------- options
def _compose(*decorators: Callable) -> Callable:
    def apply(f):
        for d in reversed(decorators):
            f = d(f)
        return f

    return apply


class FloatRange(click.FloatRange):
    """``click.FloatRange`` that also refuses ``nan`` and ``inf``: click compares against the
    bounds only, so ``nan`` passed every range (``--loss nan`` reached netem, ``--timeout nan``
    a probe that never ends). Every float option of the CLI uses this type."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


def config_option(required: bool = False) -> Callable:
    """``--config/-c FILE`` (env ``EMBNIC_CONFIG``): the cluster config (docs/config.md)."""
    help_ = "Cluster config (TOML, docs/config.md). Env: EMBNIC_CONFIG."
    if required:
        help_ += " Required."
    return click.option("--config", "-c", "config", metavar="FILE", envvar="EMBNIC_CONFIG",
                        type=click.Path(dir_okay=False), default=None, help=help_, callback=_config_path)


def _config_path(ctx, param, value):
    """An empty ``-c ''`` is no file (it read as the current directory: "Is a directory")."""
    if value is not None and not str(value).strip():
        raise click.BadParameter("empty path; give the cluster config file, e.g. -c examples/cluster.toml",
                                 ctx=ctx, param=param)
    return value


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


# --------------------------------------------------------------------------- settings
@dataclasses.dataclass
class Settings:
    """Resolved settings of one command (see the module docstring for precedence)."""

    config: ClusterConfig | None = None
    config_path: str | None = None
    target: str = DEFAULT_TARGET
    name: str = DEFAULT_NAME
    ctl: str | None = None  #: None: from the state file, else RUN_DIR/NAME.sock
    binary: str | None = None
    eal_args: list[str] | None = None
    card_args: list[str] = dataclasses.field(default_factory=list)
    vdevs: tuple[str, ...] = ()
    netns: str | None = None
    run_dir: Path = dataclasses.field(default_factory=run_dir)


def control_section(cfg: ClusterConfig | None) -> dict[str, Any]:
    """The validated ``[control]`` section of ``cfg`` (empty dict when absent).

    Raises:
        ConfigFileError: naming the field (``control.vdevs: must be a list of strings``).
    """
    if cfg is None:
        return {}
    sec = cfg.raw.get("control", {})
    where = f"{cfg.path}: " if cfg.path else ""
    if not isinstance(sec, dict):
        raise ConfigFileError(f"{where}control: must be a table [control]")
    out: dict[str, Any] = {}
    for key in ("target", "name", "ctl", "binary", "netns"):
        if key in sec:
            if not isinstance(sec[key], str) or not sec[key]:
                raise ConfigFileError(f"{where}control.{key}: must be a non-empty string, got {sec[key]!r}")
            out[key] = sec[key]
    if "target" in out:
        from embnic.control.targets.base import target_names

        if out["target"] not in target_names():
            raise ConfigFileError(f"{where}control.target: no target {out['target']!r}; available: "
                                  f"{', '.join(target_names())}")
    if "name" in out and not _NAME_RE.match(out["name"]):
        raise ConfigFileError(f"{where}control.name: {out['name']!r} is not a valid name "
                              "(letters, digits, '_', '.', '-')")
    for key in ("eal_args", "card_args"):
        if key in sec:
            v = sec[key]
            if isinstance(v, str):
                out[key] = split_args(v, f"{where}control.{key}:", fix="close the quote, or give a list of strings",
                                      error=ConfigFileError)
            elif isinstance(v, list) and all(isinstance(a, str) for a in v):
                out[key] = list(v)
            else:
                raise ConfigFileError(f"{where}control.{key}: must be a string or a list of strings")
    if "vdevs" in sec:
        v = sec["vdevs"]
        if not isinstance(v, list) or not all(isinstance(a, str) and a for a in v):
            raise ConfigFileError(f"{where}control.vdevs: must be a list of strings like \"net_ring0\"")
        out["vdevs"] = tuple(v)
    known = ("target", "name", "ctl", "binary", "eal_args", "card_args", "vdevs", "netns")
    unknown = sorted(set(sec) - set(known))
    if unknown:
        raise ConfigFileError(f"{where}control.{unknown[0]}: unknown field{did_you_mean(unknown[0], known)}; "
                              f"known: {', '.join(known)}")
    return out


def resolve(config: str | None = None, target: str | None = None, name: str | None = None,
            ctl: str | None = None, binary: str | None = None, eal_args: str | None = None,
            vdevs: tuple[str, ...] | None = None, netns: str | None = None,
            card_args: str | None = None, require_config: bool = False, **_ignored: Any) -> Settings:
    """Resolve settings from flags/env (the arguments; ``None`` = not given), the config file, defaults.

    Raises:
        click.UsageError: ``require_config`` and no config given (exit 2).
        UsageError: ``--eal-args``/``EMBNIC_EAL_ARGS``/``--card-args`` does not split like a shell (exit 2).
        ConfigFileError: the config file is invalid (exit 2).
    """
    cfg = None
    if config is None and require_config:
        raise click.UsageError("no cluster config: pass --config FILE or set EMBNIC_CONFIG "
                               "(example: examples/testbed.toml)")
    if config is not None:
        cfg = load_cluster(config)
    sec = control_section(cfg)
    s = Settings(config=cfg, config_path=config)
    s.name = name or sec.get("name") or DEFAULT_NAME
    # not said anywhere: the target pipeline NAME was loaded on (its state file), else dpdk
    st = read_state(s.run_dir, s.name) or {} if not (target or sec.get("target")) else {}
    s.target = target or sec.get("target") or (st.get("target") if isinstance(st.get("target"), str) else None) \
        or DEFAULT_TARGET
    s.ctl = ctl or sec.get("ctl")
    if binary or os.environ.get("EMBNIC_DP"):
        s.binary = binary or os.environ["EMBNIC_DP"]
    elif sec.get("binary"):
        # a relative path in the config file is relative to the file
        b = Path(sec["binary"])
        s.binary = str(b if b.is_absolute() or not cfg.path else Path(cfg.path).parent / b)
    if eal_args is not None:
        s.eal_args = split_args(eal_args, "--eal-args")
    elif os.environ.get("EMBNIC_EAL_ARGS"):
        s.eal_args = split_args(os.environ["EMBNIC_EAL_ARGS"], "EMBNIC_EAL_ARGS")
    else:
        s.eal_args = sec.get("eal_args")
    s.card_args = split_args(card_args, "--card-args") if card_args is not None else list(sec.get("card_args", []))
    s.vdevs = tuple(vdevs) if vdevs else tuple(sec.get("vdevs", ()))
    s.netns = netns or os.environ.get("EMBNIC_NETNS") or sec.get("netns")
    return s


def open_target(s: Settings, **opts: Any):
    """Construct the :class:`~embnic.control.targets.base.Target` named by ``s.target`` for ``s``.

    Raises:
        UsageError: an option the target does not take.
    """
    from embnic.control.targets.base import get_target_class

    cls = get_target_class(s.target)
    return cls.from_settings(s, **opts)


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

    try:
        return check_name(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


testbed_name_option = click.option("--name", "-n", "name", default=DEFAULT_TESTBED_NAME, envvar="EMBNIC_TESTBED", show_default=True,
                           callback=check_name_param,
                           help="Testbed name: prefix of every namespace and interface (1-8 letters/digits). "
                                "Env: EMBNIC_TESTBED.")

pmd_option = click.option("--pmd", type=click.Choice(["af_packet", "af_xdp"]), default="af_packet", show_default=True,
                          envvar="EMBNIC_PMD",
                          help="The card's DPDK PMD on its veth ends: af_packet (net_af_packet, any MTU) or af_xdp "
                               "(net_af_xdp: an AF_XDP socket behind an XDP program; copy mode on a veth, MTU at most "
                               "3506: one 4 KiB page per frame, and a veth's XDP limit; netem then uses the user backend). docs/deploy.md says when to pick which. "
                               "Env: EMBNIC_PMD.")
