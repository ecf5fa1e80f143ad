"""``embnic client add|del|list``: the card's client table (client → card port, MAC, IPv4, UDP port)."""
from __future__ import annotations

import dataclasses
import json

import click

from embnic.cli.commands.options import U16, entry_options, json_option, pipeline_options
from embnic.control.settings import open_target, resolve
from embnic.control.targets.base import format_entries, resolve_entry


@click.group("client")
def client():
    """Add, delete and list the card's client table (client id → card port, MAC, IP, UDP port).

    Fields not given as options come from the client's [[clients]] entry in --config.

    \b
    Examples:
      embnic client add 1 --config examples/testbed.toml
      embnic client add 2 --port 1 --mac 02:ee:01:00:00:02 --ip 10.77.1.2 --udp-port 40000
      embnic client list
      embnic client del 2
    """


@client.command("add")
@click.argument("client_id", metavar="CLIENT", type=U16)
@entry_options("client")
@pipeline_options
@json_option
def add(client_id, port, mac, ip, udp_port, config, target, name, ctl, as_json):
    """Add (or replace) the client CLIENT (a training client id).

    Without --config every field must be given;
    with it, the options override the client's entry and an id the config does not know is refused
    (exit 2). The MAC must be the client's own unicast address (the card does not resolve MACs).

    \b
    Example:
      embnic client add 1 --config examples/testbed.toml --mac 02:ee:01:00:00:09
    """
    s = resolve(config, target, name, ctl)
    t = open_target(s)
    e = resolve_entry("client", client_id, s.config, port, mac, ip, udp_port)
    t.client_add(e)
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(e)))
    else:
        click.echo(f"client {e.id} → port {e.port}, {e.mac}, {e.ip}:{e.udp_port}")


@client.command("del")
@click.argument("client_id", metavar="CLIENT", type=U16)
@pipeline_options
def delete(client_id, config, target, name, ctl):
    """Delete the client CLIENT (exit 2 if the card has none).

    \b
    Example:
      embnic client del 2
    """
    open_target(resolve(config, target, name, ctl)).client_del(client_id)  # NoSuchEntryError: exit 2, names `client list`
    click.echo(f"deleted client {client_id}")


@client.command("list")
@pipeline_options
@json_option
def list_(config, target, name, ctl, as_json):
    """List the card's client table.

    \b
    Example:
      embnic client list --json
    """
    entries = open_target(resolve(config, target, name, ctl)).client_list()
    if as_json:
        click.echo(json.dumps([e.client_fields() for e in entries], indent=1))
    elif not entries:
        click.echo("no clients (add one: embnic client add CLIENT --config FILE)")
    else:
        click.echo(format_entries("client", entries))
