"""``embnic route add|del|list``: the card's route table (shard → card port, MAC, IPv4, UDP port)."""
from __future__ import annotations

import dataclasses
import json

import click

from embnic.cli.commands.options import U16, entry_options, json_option, pipeline_options
from embnic.control.settings import open_target, resolve
from embnic.control.targets.base import format_entries, resolve_entry


@click.group("route")
def route():
    """Add, delete and list the card's route table (shard id → card port, MAC, IP, UDP port).

    Fields not given as options come from the shard's [[shards]] entry in --config.

    \b
    Examples:
      embnic route add 0 --config examples/testbed.toml
      embnic route add 1 --port 3 --mac 02:ee:02:00:00:01 --ip 10.77.3.2 --udp-port 7878
      embnic route list
      embnic route del 1
    """


@route.command("add")
@click.argument("shard_id", metavar="SHARD", type=U16)
@entry_options("shard")
@pipeline_options
@json_option
def add(shard_id, port, mac, ip, udp_port, config, target, name, ctl, as_json):
    """Add (or replace) the route for shard SHARD (a parameter-server shard id).

    Without --config every field must be given (--udp-port defaults to 7878);
    with it, the options override the shard's entry and an id the config does not know is refused
    (exit 2). The MAC must be the shard's own unicast address (the card does not resolve MACs).

    \b
    Example:
      embnic route add 0 --config examples/testbed.toml --mac 02:ee:02:00:00:09
    """
    s = resolve(config, target, name, ctl)
    t = open_target(s)
    e = resolve_entry("route", shard_id, s.config, port, mac, ip, udp_port)
    t.route_add(e)
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(e)))
    else:
        click.echo(f"route for shard {e.id} → port {e.port}, {e.mac}, {e.ip}:{e.udp_port}")


@route.command("del")
@click.argument("shard_id", metavar="SHARD", type=U16)
@pipeline_options
def delete(shard_id, config, target, name, ctl):
    """Delete the route for shard SHARD (exit 2 if the card has none).

    \b
    Example:
      embnic route del 1
    """
    open_target(resolve(config, target, name, ctl)).route_del(shard_id)  # NoSuchEntryError: exit 2, names `route list`
    click.echo(f"deleted route for shard {shard_id}")


@route.command("list")
@pipeline_options
@json_option
def list_(config, target, name, ctl, as_json):
    """List the card's route table.

    \b
    Example:
      embnic route list --json
    """
    entries = open_target(resolve(config, target, name, ctl)).route_list()
    if as_json:
        click.echo(json.dumps([e.route_fields() for e in entries], indent=1))
    elif not entries:
        click.echo("no routes (add one: embnic route add SHARD --config FILE)")
    else:
        click.echo(format_entries("route", entries))
