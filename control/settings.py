"""The settings of a command that drives a pipeline: target, name, control socket, card binary, EAL.

Precedence of every setting: built-in default < the config file's ``[control]`` section <
environment (``EMBNIC_*``) < command-line flag; the CLI's options therefore default to ``None``
and :func:`resolve` fills in what the user did not say (docs/cli.md, "Settings and where they
come from", has every setting, its flag, variable and key).

Example::

    s = resolve("examples/testbed.toml", name="tb")   # flags not given are None
    t = open_target(s)                                 # the Target named by s.target
"""
from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from embnic.client_lib.config import ClusterConfig, ConfigError, did_you_mean, load_config
from embnic.control.errors import UsageError, split_args
from embnic.control.runstate import read_state, run_dir

DEFAULT_NAME = "embnic"
DEFAULT_TARGET = "dpdk"
#: a pipeline instance name (used in file names under the run directory)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


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
        ConfigError: naming the field (``control.vdevs: must be a list of strings``; exit 2 in the CLI).
    """
    if cfg is None:
        return {}
    sec = cfg.raw.get("control", {})
    if not isinstance(sec, dict):
        raise ConfigError("control", "must be a table [control]", cfg.path)
    out: dict[str, Any] = {}
    for key in ("target", "name", "ctl", "binary", "netns"):
        if key in sec:
            if not isinstance(sec[key], str) or not sec[key]:
                raise ConfigError(f"control.{key}", f"must be a non-empty string, got {sec[key]!r}", cfg.path)
            out[key] = sec[key]
    if "target" in out:
        from embnic.control.targets.base import target_names

        if out["target"] not in target_names():
            raise ConfigError("control.target", f"no target {out['target']!r}; available: "
                              f"{', '.join(target_names())}", cfg.path)
    if "name" in out and not NAME_RE.match(out["name"]):
        raise ConfigError("control.name", f"{out['name']!r} is not a valid name (letters, digits, '_', '.', '-')",
                          cfg.path)
    where = f"{cfg.path}: " if cfg.path else ""
    for key in ("eal_args", "card_args"):
        if key in sec:
            v = sec[key]
            if isinstance(v, str):
                out[key] = split_args(v, f"{where}control.{key}:", fix="close the quote, or give a list of strings",
                                      error=lambda msg: ConfigError("", msg))
            elif isinstance(v, list) and all(isinstance(a, str) for a in v):
                out[key] = list(v)
            else:
                raise ConfigError(f"control.{key}", "must be a string or a list of strings", cfg.path)
    if "vdevs" in sec:
        v = sec["vdevs"]
        if not isinstance(v, list) or not all(isinstance(a, str) and a for a in v):
            raise ConfigError("control.vdevs", "must be a list of strings like \"net_ring0\"", cfg.path)
        out["vdevs"] = tuple(v)
    known = ("target", "name", "ctl", "binary", "eal_args", "card_args", "vdevs", "netns")
    unknown = sorted(set(sec) - set(known))
    if unknown:
        raise ConfigError(f"control.{unknown[0]}", f"unknown field{did_you_mean(unknown[0], known)}; "
                          f"known: {', '.join(known)}", cfg.path)
    return out


def resolve(config: str | None = None, target: str | None = None, name: str | None = None,
            ctl: str | None = None, binary: str | None = None, eal_args: str | None = None,
            vdevs: tuple[str, ...] | None = None, netns: str | None = None,
            card_args: str | None = None, require_config: bool = False, **_ignored: Any) -> Settings:
    """Resolve settings from flags/env (the arguments; ``None`` = not given), the config file, defaults.

    Raises:
        UsageError: ``require_config`` and no config given; ``--eal-args``/``EMBNIC_EAL_ARGS``/
            ``--card-args`` does not split like a shell (exit 2).
        ConfigError: the config file is invalid (exit 2).
    """
    if config is None and require_config:
        raise UsageError("no cluster config: pass --config FILE or set EMBNIC_CONFIG "
                         "(example: examples/testbed.toml)")
    cfg = load_config(config) if config is not None else None
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
        UsageError: an unknown target, or an option the target does not take.
    """
    from embnic.control.targets.base import get_target_class

    return get_target_class(s.target).from_settings(s, **opts)
