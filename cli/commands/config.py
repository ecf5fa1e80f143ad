"""``embnic config check|show``: validate and print the cluster config."""
from __future__ import annotations

import dataclasses
import json
import os

import click

from embnic.client_lib import consts
from embnic.client_lib.config import ClusterConfig, ConfigError, load_config
from embnic.client_lib.statemap import state_map_plan
from embnic.cli.commands.options import json_option, rate_option
from embnic.control.settings import control_section
from embnic.control.targets.base import PEER_KINDS, peers_from_config


def _file_options(f):
    """``[FILE]`` and ``-c/--config FILE``: the config file, either way."""
    f = click.option("-c", "--config", "config_opt", metavar="FILE",
                     help="The config file, as other commands take it (the same as the FILE argument).")(f)
    return click.argument("file", required=False, metavar="[FILE]")(f)


def _file_arg(file: str | None, config_opt: str | None = None) -> str:
    if file and config_opt and file != config_opt:
        raise click.UsageError(f"two config files: FILE {file!r} and -c {config_opt!r}; give one")
    if file or config_opt:
        return file or config_opt
    env = os.environ.get("EMBNIC_CONFIG")
    if not env:
        raise click.UsageError("no config file: give FILE (or -c FILE) or set EMBNIC_CONFIG")
    return env


def card_warnings(cfg: ClusterConfig) -> list[str]:
    """What ``pipeline load`` would still need from a valid config (MACs, card ports, lcores this
    machine has), one line each."""
    if cfg.card is None or not cfg.card.enabled:
        return []
    from embnic.control.targets.dpdk.target import lcores_problem

    out = []
    bad = lcores_problem(cfg.card.lcores)
    if bad:
        out.append(f"card.lcores: {bad}")
    for kind in PEER_KINDS:  # the first problem of each table
        try:
            peers_from_config(cfg, (kind,))
        except ConfigError as e:
            out.append(f"{e.field}: {e.message}")
    return out


def summary(cfg: ClusterConfig) -> str:
    """One paragraph describing a config: every ``[card]`` setting but ``state_timeout_ms`` (the state
    map's line states it)."""
    card = "none (clients talk to shards directly)"
    if cfg.card is not None:
        ports = ", ".join(f"{p.id}={p.ip}" for p in cfg.card.ports) or "no ports"
        card = (f"{'enabled' if cfg.card.enabled else 'disabled'}, ports {ports}, ring {cfg.card.ring_size}, "
                f"state {cfg.card.state_size}, lcores {cfg.card.lcores}, state lcores {cfg.card.state_lcores}")
    lines = [
        f"cluster {cfg.name!r}: {len(cfg.tables)} table(s), {len(cfg.shards)} shard(s), {len(cfg.clients)} "
        f"client(s), sharding {cfg.sharding}, UDP port {cfg.udp_port}, MTU {cfg.mtu} "
        f"({consts.max_body_per_frame(cfg.mtu)} body bytes/frame)",
        f"card: {card}",
    ]
    disk = [(t.name, s.id, cfg.store_of(t.id, s.id)[1]) for s in cfg.shards for t in cfg.tables
            if cfg.store_of(t.id, s.id)[0] == "disk"]
    if disk:  # the disk tier (docs/server.md): which tables, with what cache
        per = {}
        for name, sid, rows in disk:
            per.setdefault((name, rows), []).append(str(sid))
        lines.append("disk tables: " + "; ".join(f"{n} on shard(s) {','.join(ss)}, cache {r:,} rows"
                                                 for (n, r), ss in per.items()))
    return "\n".join(lines)


@click.group()
def config():
    """Check and show the cluster config (one TOML file, docs/config.md).

    \b
    Examples:
      embnic config check examples/cluster.toml
      embnic config show --json examples/cluster.toml
    """


@config.command("check")
@_file_options
@click.option("--strict", is_flag=True, help="Also fail on what `pipeline load` would need (shard/client MACs, "
                                             "lcores this machine has).")
@rate_option
def check(file, config_opt, strict, rate):
    """Validate FILE (default $EMBNIC_CONFIG): exit 0 if valid, 2 with the offending field if not.

    Unknown sections and fields are errors (with the closest valid name). Warns about what loading
    the card would still need (--strict makes these errors); with a [card] it says how many
    messages in flight its state map allows and what fraction may go unanswered at --rate.

    \b
    Example:
      embnic config check examples/cluster.toml
      embnic config check --rate 500000 examples/testbed.toml
    """
    path = _file_arg(file, config_opt)
    cfg = load_config(path)
    control_section(cfg)
    warns = card_warnings(cfg)
    if strict and warns:
        raise ConfigError("", warns[0], path)
    for w in warns:
        click.echo(f"warning: {path}: {w}", err=True)
    click.echo(f"{path}: ok")
    click.echo(summary(cfg))
    if cfg.card is not None:
        click.echo(state_map_plan(cfg, rate).describe())


@config.command("show")
@_file_options
@json_option
def show(file, config_opt, as_json):
    """Print the parsed config FILE (default $EMBNIC_CONFIG) with every default filled in.

    \b
    Example:
      embnic config show --json examples/cluster.toml
    """
    cfg = load_config(_file_arg(file, config_opt))
    if as_json:
        d = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "raw"}
        click.echo(json.dumps({**d, "control": control_section(cfg)}, indent=2, default=list))
        return
    click.echo(summary(cfg))
    click.echo("tables:")
    for t in cfg.tables:
        where = f", shard {t.shard}" if t.shard is not None else ""
        click.echo(f"  {t.id:>3} {t.name:<10} rows {t.rows if t.rows is not None else 'any u64':<10} dim {t.dim:<4} {t.dtype} {t.optimizer} lr {t.lr:g}{where}")
    for kind, eps in (("shards", cfg.shards), ("clients", cfg.clients)):
        click.echo(f"{kind}:")
        for e in eps:
            via = f" via card port {e.card_port}" if e.card_port is not None else ""
            click.echo(f"  {e.id:>3} {e.ip}:{e.port} mac {e.mac or '-'}{via}")
    ctl = control_section(cfg)
    if ctl:
        click.echo("control: " + ", ".join(f"{k} = {v!r}" for k, v in ctl.items()))
