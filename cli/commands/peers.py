"""``embnic route add|del|list`` and ``embnic client add|del|list``: the card's peer table.

The two nouns are one shape (:func:`peer_group`): ``route`` programs the route of a shard (shard →
card port, MAC, IPv4, UDP port), ``client`` a training client (client → the same); both go
through the target's one peer API (:class:`~embnic.control.targets.base.Peer`, ``peer_add``,
``peer_del``, ``peer_list``).
"""
from __future__ import annotations

import json

import click

from embnic.cli.commands.options import U16, entry_options, json_option, pipeline_options
from embnic.control.settings import open_target, resolve
from embnic.control.targets.base import format_peers, peer_kind, resolve_peer

#: per kind: the group's help, ``add``'s and ``del``'s, and what ``add`` and ``del`` print
_TEXTS = {
    "shard": {
        "group": """Add, delete and list the card's route table (shard id → card port, MAC, IP, UDP port).

    Fields not given as options come from the shard's [[shards]] entry in --config.

    \b
    Examples:
      embnic route add 0 --config examples/testbed.toml
      embnic route add 1 --port 3 --mac 02:ee:02:00:00:01 --ip 10.77.3.2 --udp-port 7878
      embnic route list
      embnic route del 1
    """,
        "add": """Add (or replace) the route for shard SHARD (a parameter-server shard id).

    Without --config every field must be given (--udp-port defaults to 7878);
    with it, the options override the shard's entry and an id the config does not know is refused
    (exit 2). The MAC must be the shard's own unicast address (the card does not resolve MACs).

    \b
    Example:
      embnic route add 0 --config examples/testbed.toml --mac 02:ee:02:00:00:09
    """,
        "del": """Delete the route for shard SHARD (exit 2 if the card has none).

    \b
    Example:
      embnic route del 1
    """,
        "added": "route for shard {id} → port {port}, {mac}, {ip}:{udp_port}",
        "deleted": "deleted route for shard {id}",
        "none": "no routes (add one: embnic route add SHARD --config FILE)",
    },
    "client": {
        "group": """Add, delete and list the card's client table (client id → card port, MAC, IP, UDP port).

    Fields not given as options come from the client's [[clients]] entry in --config.

    \b
    Examples:
      embnic client add 1 --config examples/testbed.toml
      embnic client add 2 --port 1 --mac 02:ee:01:00:00:02 --ip 10.77.1.2 --udp-port 40000
      embnic client list
      embnic client del 2
    """,
        "add": """Add (or replace) the client CLIENT (a training client id).

    Without --config every field must be given;
    with it, the options override the client's entry and an id the config does not know is refused
    (exit 2). The MAC must be the client's own unicast address (the card does not resolve MACs).

    \b
    Example:
      embnic client add 1 --config examples/testbed.toml --mac 02:ee:01:00:00:09
    """,
        "del": """Delete the client CLIENT (exit 2 if the card has none).

    \b
    Example:
      embnic client del 2
    """,
        "added": "client {id} → port {port}, {mac}, {ip}:{udp_port}",
        "deleted": "deleted client {id}",
        "none": "no clients (add one: embnic client add CLIENT --config FILE)",
    },
}


def peer_group(kind: str) -> click.Group:
    """The click group of one kind of peer: ``embnic route`` (``kind`` ``"shard"``) or ``embnic
    client`` (``"client"``), with ``add ID``, ``del ID`` and ``list``.

    Raises:
        ValueError: ``kind`` is neither.
    """
    noun, text = peer_kind(kind).noun, _TEXTS[kind]
    id_arg = click.argument("id_", metavar=kind.upper(), type=U16)

    @click.group(noun, help=text["group"])
    def group():
        pass

    @group.command("add", help=text["add"])
    @id_arg
    @entry_options(kind)
    @pipeline_options
    @json_option
    def add(id_, port, mac, ip, udp_port, config, target, name, ctl, as_json):
        s = resolve(config, target, name, ctl)
        t = open_target(s)
        p = resolve_peer(kind, id_, s.config, port, mac, ip, udp_port)
        t.peer_add(p)
        if as_json:
            click.echo(json.dumps({"id": p.id, **p.address()}))
        else:
            click.echo(text["added"].format(id=p.id, **p.address()))

    @group.command("del", help=text["del"])
    @id_arg
    @pipeline_options
    def delete(id_, config, target, name, ctl):
        # NoSuchEntryError: exit 2, names `route list` / `client list`
        open_target(resolve(config, target, name, ctl)).peer_del(kind, id_)
        click.echo(text["deleted"].format(id=id_))

    @group.command("list", help=f"""List the card's {noun} table.

    \b
    Example:
      embnic {noun} list --json
    """)
    @pipeline_options
    @json_option
    def list_(config, target, name, ctl, as_json):
        peers = open_target(resolve(config, target, name, ctl)).peer_list(kind)
        if as_json:
            click.echo(json.dumps([p.fields() for p in peers], indent=1))
        elif not peers:
            click.echo(text["none"])
        else:
            click.echo(format_peers(kind, peers))

    return group


route = peer_group("shard")
client = peer_group("client")
