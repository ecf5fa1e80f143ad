"""The card's two peer tables as click groups: ``route`` (shard → peer) and ``client`` (client → peer).

Both tables hold the same entry (card port, MAC, IPv4, UDP port); this module builds the
``add|del|list`` commands for either, so ``cmd_route`` and ``cmd_client`` stay one line each.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json

import click

from embnic.client_lib import consts
from embnic.client_lib.config import ClusterConfig
from embnic.control.commands.options import HOST_IPV4, MAC, U16, UDP_PORT, Settings, json_option, open_target, pipeline_options, resolve
from embnic.control.targets.base import Entry

# "what": how messages name one entry ("route for shard 0", "client 1");
# "ex", "ex2" (with "ex2_fields"), "ex_mac": entries of examples/testbed.toml used in the help examples
_KIND = {
    "route": {"noun": "shard", "plural": "shards", "peer": "parameter-server shard", "what": "route for shard",
              "ex": 0, "ex_mac": "02:ee:02:00:00:09",
              "ex2": 1, "ex2_fields": "--port 3 --mac 02:ee:02:00:00:01 --ip 10.77.3.2 --udp-port 7878",
              "add": "route_add", "del": "route_del", "list": "route_list"},
    "client": {"noun": "client", "plural": "clients", "peer": "training client", "what": "client",
               "ex": 1, "ex_mac": "02:ee:01:00:00:09",
               "ex2": 2, "ex2_fields": "--port 1 --mac 02:ee:01:00:00:02 --ip 10.77.1.2 --udp-port 40000",
               "add": "client_add", "del": "client_del", "list": "client_list"},
}


def resolve_entry(kind: str, id_: int, cfg: ClusterConfig | None, port: int | None, mac: str | None,
                  ip: str | None, udp_port: int | None) -> Entry:
    """The table entry for ``id_``: flags first, then the config's ``[[shards]]``/``[[clients]]`` entry.

    Raises:
        click.UsageError: unknown shard/client in the config, or a field neither flag nor config gives,
            or a card port the config's [card] does not have.
    """
    k = _KIND[kind]
    noun = k["noun"]
    if cfg is not None:
        eps = cfg.shards if kind == "route" else cfg.clients
        ep = next((e for e in eps if e.id == id_), None)
        if ep is None:
            ids = ", ".join(str(e.id) for e in eps)
            raise click.UsageError(f"unknown {noun} {id_}: {cfg.path or 'the config'} has {k['plural']} {ids}; "
                                   f"add a [[{k['plural']}]] entry with id = {id_} or pick one of those")
        port = ep.card_port if port is None else port
        mac = ep.mac if mac is None else mac
        ip = ep.ip if ip is None else ip
        udp_port = ep.port if udp_port is None else udp_port
    elif kind == "route" and udp_port is None:
        udp_port = consts.UDP_PORT
    src = f" in {cfg.path or 'the config'}" if cfg is not None else " (and no --config)"
    if mac is None:
        raise click.UsageError(f"{noun} {id_} has no MAC{src}: give --mac (the card does not resolve MACs by ARP)")
    for opt, v in (("--port", port), ("--ip", ip), ("--udp-port", udp_port)):
        if v is None:
            raise click.UsageError(f"{noun} {id_} has no {opt[2:]}{src}: give {opt}")
    if ipaddress.IPv4Address(ip).is_loopback:
        raise click.UsageError(f"--ip {ip} is a loopback address, which the card cannot reach: give the {noun}'s own "
                               "address on its card port's segment")
    if cfg is not None and cfg.card is not None and cfg.card.ports:
        have = sorted(p.id for p in cfg.card.ports)
        if port not in have:
            raise click.UsageError(f"--port {port}: the card has no port {port} (card.ports in "
                                   f"{cfg.path or 'the config'}: {', '.join(map(str, have))})")
        for p in cfg.card.ports:  # the config refuses these for its own entries (docs/config.md)
            if p.ip == ip:
                raise click.UsageError(f"--ip {ip} is the card's own address on port {p.id}: give the {noun}'s own "
                                       "address (the card would send the frames to itself)")
            if p.mac and p.mac == str(mac).lower():
                raise click.UsageError(f"--mac {mac} is the MAC of card port {p.id}: give the {noun}'s own MAC")
    return Entry(id_, int(port), mac, ip, int(udp_port))


def _target(config, target, name, ctl):
    s: Settings = resolve(config, target, name, ctl)
    return s, open_target(s)


def entries_table(kind: str, entries: list[Entry]) -> str:
    """Fixed-width text table of entries."""
    head = f"{_KIND[kind]['noun'].upper():>6}  {'PORT':>4}  {'MAC':<17}  {'IP':<15}  {'UDP':>5}"
    rows = [f"{e.id:>6}  {e.port:>4}  {e.mac:<17}  {e.ip:<15}  {e.udp_port:>5}" for e in entries]
    return "\n".join([head, *rows])


def make_group(kind: str) -> click.Group:
    """The ``route`` or ``client`` click group with ``add``, ``del``, ``list``."""
    k = _KIND[kind]
    noun, NOUN = k["noun"], k["noun"].upper()
    idkey = noun

    @click.group(name=kind, help=f"""Add, delete and list the card's {kind} table ({noun} id → card port, MAC, IP, UDP port).

    Fields not given as options come from the {noun}'s [[{k['plural']}]] entry in --config.

    \b
    Examples:
      embnic {kind} add {k['ex']} --config examples/testbed.toml
      embnic {kind} add {k['ex2']} {k['ex2_fields']}
      embnic {kind} list
      embnic {kind} del {k['ex2']}
    """)
    def group():
        pass

    @group.command("add", help=f"""Add (or replace) the {k['what']} {NOUN} (a {k['peer']} id).

    Without --config every field must be given{' (--udp-port defaults to 7878)' if kind == 'route' else ''};
    with it, the options override the {noun}'s entry and an id the config does not know is refused
    (exit 2). The MAC must be the {noun}'s own unicast address (the card does not resolve MACs).

    \b
    Example:
      embnic {kind} add {k['ex']} --config examples/testbed.toml --mac {k['ex_mac']}
    """)
    @click.argument(noun, metavar=NOUN, type=U16)
    @click.option("--port", "port", type=click.IntRange(0, 1023), default=None, help="Card (DPDK) port it hangs off.")
    @click.option("--mac", type=MAC, default=None, help=f"The {noun}'s MAC address.")
    @click.option("--ip", type=HOST_IPV4, default=None, help=f"The {noun}'s IPv4 address.")
    @click.option("--udp-port", "udp_port", type=UDP_PORT, default=None, help=f"The {noun}'s UDP port.")
    @pipeline_options
    @json_option
    def add(port, mac, ip, udp_port, config, target, name, ctl, as_json, **kw):
        s, t = _target(config, target, name, ctl)
        e = resolve_entry(kind, kw[idkey], s.config, port, mac, ip, udp_port)
        getattr(t, k["add"])(e)
        if as_json:
            click.echo(json.dumps(dataclasses.asdict(e)))
        else:
            click.echo(f"{k['what']} {e.id} → port {e.port}, {e.mac}, {e.ip}:{e.udp_port}")

    @group.command("del", help=f"""Delete the {k['what']} {NOUN} (exit 2 if the card has none).

    \b
    Example:
      embnic {kind} del {k['ex2']}
    """)
    @click.argument(noun, metavar=NOUN, type=U16)
    @pipeline_options
    def delete(config, target, name, ctl, **kw):
        _, t = _target(config, target, name, ctl)
        id_ = kw[idkey]
        getattr(t, k["del"])(id_)  # NoSuchEntryError (exit 2) names the list command
        click.echo(f"deleted {k['what']} {id_}")

    @group.command("list", help=f"""List the card's {kind} table.

    \b
    Example:
      embnic {kind} list --json
    """)
    @pipeline_options
    @json_option
    def list_(config, target, name, ctl, as_json):
        _, t = _target(config, target, name, ctl)
        entries = getattr(t, k["list"])()
        if as_json:
            click.echo(json.dumps([getattr(e, f"{kind}_fields")()
                                   for e in entries], indent=1))
        elif not entries:
            click.echo(f"no {kind}s (add one: embnic {kind} add {NOUN} --config FILE)")
        else:
            click.echo(entries_table(kind, entries))

    return group
