"""``embnic route add|del|list`` and ``embnic client add|del|list``: the card's peer table, one group
built per kind of peer (:func:`peer_group`) on the target's one peer API (``peer_add``, ...)."""
from __future__ import annotations

import json

import click

from embnic.cli.commands.options import U16, entry_options, json_option, pipeline_options
from embnic.control.settings import open_target, resolve
from embnic.control.targets.base import format_peers, peer_kind, resolve_peer

#: per kind: what an id is, the UDP port's default, and the ids and addresses of the examples
_EXAMPLES = {
    "shard": {"is": "a parameter-server shard id", "udp_default": " (--udp-port defaults to 7878)",
              "add": 0, "del": 1, "full": "1 --port 3 --mac 02:ee:02:00:00:01 --ip 10.77.3.2 --udp-port 7878",
              "mac": "02:ee:02:00:00:09"},
    "client": {"is": "a training client id", "udp_default": "",
               "add": 1, "del": 2, "full": "2 --port 1 --mac 02:ee:01:00:00:02 --ip 10.77.1.2 --udp-port 40000",
               "mac": "02:ee:01:00:00:09"},
}

_GROUP_HELP = """Add, delete and list the card's {noun} table ({kind} id → card port, MAC, IP, UDP port).

    Fields not given as options come from the {kind}'s [[{section}]] entry in --config.

    \b
    Examples:
      embnic {noun} add {add} --config examples/testbed.toml
      embnic {noun} add {full}
      embnic {noun} list
      embnic {noun} del {del}
    """
_ADD_HELP = """Add (or replace) the {what} {ID} ({is}).

    Without --config every field must be given{udp_default}; with it, the options override the
    {kind}'s entry. The MAC must be the {kind}'s own unicast address (the card does not resolve MACs).

    \b
    Example:
      embnic {noun} add {add} --config examples/testbed.toml --mac {mac}
    """
_DEL_HELP = """Delete the {what} {ID} (exit 2 if the card has none).

    \b
    Example:
      embnic {noun} del {del}
    """
_LIST_HELP = """List the card's {noun} table.

    \b
    Example:
      embnic {noun} list --json
    """


def peer_group(kind: str) -> click.Group:
    """The click group of one kind of peer: ``embnic route`` (``kind`` ``"shard"``) or ``embnic
    client`` (``"client"``), with ``add ID``, ``del ID`` and ``list``.

    Raises:
        ValueError: ``kind`` is neither.
    """
    k = peer_kind(kind)
    words = {"noun": k.noun, "kind": kind, "section": k.section, "what": k.what, "ID": kind.upper(), **_EXAMPLES[kind]}
    id_arg = click.argument("id_", metavar=kind.upper(), type=U16)

    @click.group(k.noun, help=_GROUP_HELP.format(**words))
    def group():
        pass

    @group.command("add", help=_ADD_HELP.format(**words))
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
            click.echo(f"{k.what} {p.id} → port {p.port}, {p.mac}, {p.ip}:{p.udp_port}")

    @group.command("del", help=_DEL_HELP.format(**words))
    @id_arg
    @pipeline_options
    def delete(id_, config, target, name, ctl):
        # NoSuchEntryError: exit 2, names `route list` / `client list`
        open_target(resolve(config, target, name, ctl)).peer_del(kind, id_)
        click.echo(f"deleted {k.what} {id_}")

    @group.command("list", help=_LIST_HELP.format(**words))
    @pipeline_options
    @json_option
    def list_(config, target, name, ctl, as_json):
        peers = open_target(resolve(config, target, name, ctl)).peer_list(kind)
        if as_json:
            click.echo(json.dumps([p.fields() for p in peers], indent=1))
        elif not peers:
            click.echo(f"no {k.noun}s (add one: embnic {k.noun} add {kind.upper()} --config FILE)")
        else:
            click.echo(format_peers(kind, peers))

    return group


route = peer_group("shard")
client = peer_group("client")
