"""``embnic state dump|summary|ring``: the card's message state map and header ring."""
from __future__ import annotations

import json

import click

from embnic.client_lib import consts
from embnic.cli.commands.options import U16, json_option, pipeline_options
from embnic.control.settings import open_target, resolve

STATES = ("receiving", "forwarded", "replying")


def _type_name(v) -> str:
    try:
        return consts.MsgType(v).name if isinstance(v, int) else str(v)
    except ValueError:
        return str(v)


def _table_id(v) -> str:
    """A header's ``table_id``: an ERROR's table, ``-`` for :data:`consts.NO_TABLE` (every other header)."""
    return "-" if v == consts.NO_TABLE else str(v) if v is not None else "?"


def table(entries: list[dict]) -> str:
    """Fixed-width text table of state-map entries (durations in µs from the card's ns timestamps)."""
    head = (f"{'CLIENT':>6} {'MSG_ID':>10} {'TYPE':<12} {'STATE':<9} {'SHARD':>5} {'TABLES':>6} {'KEYS':>7} "
            f"{'VALUE_LEN':>9} {'FR_IN':>6} {'BYTES_IN':>10} {'FR_OUT':>6} {'BYTES_OUT':>10} {'SPAN_US':>9} "
            f"{'FRAGS_IN':>9}")
    rows = [head]
    for e in entries:
        span = (e.get("last_ns", 0) - e.get("first_ns", 0)) / 1000.0
        rows.append(f"{e.get('client', '?'):>6} {e.get('msg_id', '?'):>10} {_type_name(e.get('type')):<12} "
                    f"{e.get('state', '?'):<9} {e.get('shard', '?'):>5} {e.get('num_tables', '?'):>6} "
                    f"{e.get('num_keys', '?'):>7} {e.get('value_len', '?'):>9} "
                    f"{e.get('frames_in', 0):>6} {e.get('bytes_in', 0):>10} {e.get('frames_out', 0):>6} "
                    f"{e.get('bytes_out', 0):>10} {span:>9.1f} "
                    f"{str(e.get('frags_in', '?')) + '/' + str(e.get('frag_count', '?')):>9}")
    return "\n".join(rows)


@click.group()
def state():
    """Look at the card's message state map (one entry per message in flight; an answered
    message leaves it when its whole reply has passed, an unanswered one when it expires).

    \b
    Examples:
      embnic state dump --limit 20
      embnic state summary --json
      sudo embnic state ring --last 10 --target bmv2
    """


@state.command("dump")
@pipeline_options
@json_option
@click.option("--limit", type=click.IntRange(1, 10_000_000), default=1000, show_default=True,
              help="At most this many entries.")
@click.option("--client", "client_id", type=U16, default=None, help="Only this client's messages.")
@click.option("--state", "state_name", type=click.Choice(STATES), default=None, help="Only entries in this state.")
def dump(config, target, name, ctl, as_json, limit, client_id, state_name):
    """Print the message state map: client, msg id, type, state, shard, the request's tables, keys
    and value_len (row bytes), frames and bytes in and out (frames count duplicates, bytes each
    fragment once), time from first to last frame, request fragments seen of all.

    \b
    Example:
      embnic state dump --state forwarded --limit 50
    """
    entries = [e for e in open_target(resolve(config, target, name, ctl)).state_dump(limit)
               if (client_id is None or e.get("client") == client_id)
               and (state_name is None or e.get("state") == state_name)]
    if as_json:
        click.echo(json.dumps(entries, indent=1))
    elif not entries:
        click.echo("state map: no entries" + (" matching" if client_id is not None or state_name else ""))
    else:
        click.echo(table(entries))
        click.echo(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")


@state.command("ring")
@pipeline_options
@json_option
@click.option("--last", type=click.IntRange(1, 1 << 20), default=20, show_default=True,
              help="How many of the most recent headers.")
def ring(config, target, name, ctl, as_json, last):
    """Print the header ring: the headers of the last N frames the card accepted, newest first.

    dpdk: up to N frames still waiting in its header ring (AT "ring"), then the N it forwarded
    last (AT "sent"); bmv2: its register ring of accepted headers. TABLE: the table an ERROR
    names ("-": none).

    \b
    Examples:
      sudo embnic state ring --last 10 --target bmv2
      embnic state ring --last 10 --target dpdk
    """
    t = open_target(resolve(config, target, name, ctl))
    entries = t.ring(last)
    if as_json:
        click.echo(json.dumps(entries, indent=1))
        return
    click.echo(f"{'TYPE':<12} {'CLIENT':>6} {'MSG_ID':>10} {'SHARD':>5} {'TABLES':>6} {'KEYS':>7} "
               f"{'VALUE_LEN':>9} {'TABLE':>5} {'FRAG':>9} {'FRAG_LEN':>8} {'MSG_LEN':>9} {'PORT':>4} "
               f"{'TIME_US':>12} {'AT':<4}")
    for e in entries:
        click.echo(f"{_type_name(e['msg_type']):<12} {e['client_id']:>6} {e['msg_id']:>10} {e['shard_id']:>5} "
                   f"{e.get('num_tables', '?'):>6} {e.get('num_keys', '?'):>7} {e.get('value_len', '?'):>9} "
                   f"{_table_id(e.get('table_id')):>5} {e['frag_index']:>4}/{e['frag_count']:<4} "
                   f"{e['frag_len']:>8} {e['msg_len']:>9} {e['ingress_port']:>4} {e['time_us']:>12} "
                   f"{'ring' if e.get('in_ring') else 'sent':<4}")
    waiting = sum(1 for e in entries if e.get("in_ring"))
    click.echo(f"{len(entries)} header{'s' if len(entries) != 1 else ''}"
               + (f" ({waiting} waiting in the header ring)" if waiting else ""))


@state.command("summary")
@pipeline_options
@json_option
def summary(config, target, name, ctl, as_json):
    """Print the state map's size, capacity, overflow/expiry counts and entries per state.

    \b
    Example:
      embnic state summary
    """
    t = open_target(resolve(config, target, name, ctl))
    st = t.state_summary()
    if as_json:
        click.echo(json.dumps(st, indent=1))
        return
    by = st.get("by_state", {})
    click.echo(f"state map: {st.get('entries', 0)}/{st.get('capacity', 0)} entries, overflow {st.get('overflow', 0)}, "
               f"expired {st.get('expired', 0)}")
    for k in STATES:
        click.echo(f"  {k:<10} {by.get(k, 0)}")
    parts = st.get("by_partition", [])
    if len(parts) > 1:  # several state lcores, each owning one partition of the map
        for p in parts:
            click.echo(f"  partition {p['partition']} (lcore {p['lcore']}): {p['entries']}/{p['capacity']} entries, "
                       f"{p['completed_since_start']} completed and {p['expired_since_start']} expired since start")
