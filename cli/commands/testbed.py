"""``embnic testbed up|down|status|netem``: the network-namespace testbed (testbed/net/topology.py)."""
from __future__ import annotations

import json
import shlex

import click

from embnic.cli.commands.options import (FloatRange, as_param, as_usage, config_option, errors_as, needs_root,
                                         pmd_option)
from embnic.cli.commands.options import testbed_name_option as name_option
from embnic.control.errors import OperationalError
from embnic.control.netns import exec_argv

@click.group("testbed")
def testbed():
    """Bring the namespace testbed (clients, card, parameter-server shards on veth pairs) up and down
    (docs/testbed.md). All commands need root.

    \b
    Examples:
      sudo embnic testbed up --config examples/testbed.toml
      sudo embnic testbed down
    """


@testbed.command("up")
@config_option(example="examples/testbed.toml")
@name_option
@click.option("--no-card", is_flag=True, help="Only namespaces, links and shards (no embnic-dp).")
@click.option("--timeout", type=FloatRange(1, 600), default=20.0, show_default=True,
              help="Seconds each readiness probe may take.")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@pmd_option
@needs_root("testbed up")
def up(config, name, no_card, timeout, as_json, pmd):
    """Create the namespaces and veth pairs of the config, start a shard in each shard namespace
    and the card in the card namespace, program its routes and clients, and probe that every
    client reaches every shard through the card; `embnic testbed down` removes it all again.

    \b
    Examples:
      sudo embnic testbed up --config examples/testbed.toml
      sudo embnic testbed up -c examples/testbed.toml --name tb2
      sudo embnic testbed up -c examples/testbed.toml --pmd af_xdp   # the card on net_af_xdp
    """
    from embnic.client_lib.config import ConfigError, load_config
    from embnic.testbed.net import topology as T

    cfg = load_config(config)
    with errors_as((ConfigError, None), (T.PmdError, as_param()), (ValueError, as_param("--name"))):
        topo = T.Topology.from_config(cfg, name, pmd=pmd)
    tb = T.Testbed(topo)
    tb.check_free()  # a busy name is one line, before the wiring is drawn
    click.echo(topo.diagram(), err=True)
    tb = tb.up(card=not no_card, probe=not no_card, ready_timeout=timeout)
    st = T.status(name, counters=False)
    if as_json:
        click.echo(json.dumps(st, indent=1))
    else:
        rtt = st.get("probe_rtt_us") or {}
        probe = ", ".join(f"{k} {v:.0f} µs" for k, v in rtt.items()) or "skipped"
        click.echo(f"testbed {name} is up: {len(st['netns'])} namespaces, {len(st['links'])} links, "
                   f"{len(st['processes'])} processes; probe {probe}")
        c = tb.cfg.clients[0]
        click.echo(f"logs: {tb.dir}/   config every node reads: {tb.config_path}")
        if no_card:
            click.echo(f"no card (--no-card): the clients reach no shard until one runs in netns {topo.card_ns}: "
                       f"sudo embnic pipeline load -c {tb.config_path}   (pipeline {tb.cfg.raw['control']['name']}; "
                       f"`testbed down` stops it too, `sudo embnic pipeline unload --name "
                       f"{tb.cfg.raw['control']['name']}` alone)")
        else:
            train = exec_argv(topo.client_ns(c.id), ["embnic", "train", "-c", str(tb.config_path),
                                                     "--client-id", str(c.id)])
            click.echo(f"train as client {c.id}: sudo {shlex.join(train)}")
            click.echo(f"the card: sudo embnic status -c {tb.config_path}   (route list, state dump, ... likewise)")
        click.echo(f"tear down: sudo embnic testbed down --name {name}")


@testbed.command("down")
@name_option
@needs_root("testbed down")
def down_cmd(name):
    """Stop everything testbed NAME started, in reverse order, and delete its namespaces and veths
    (also after a crash, and a card `pipeline load` started after `up --no-card`). Logs stay in
    RUN_DIR/testbed-NAME/.

    \b
    Examples:
      sudo embnic testbed down
      sudo embnic testbed down --name tb2
    """
    from embnic.testbed.net import topology as T

    res = T.down(name)
    if not res["found"]:
        click.echo(f"testbed {name}: nothing to remove")
        return
    click.echo(f"testbed {name} is down: stopped {len(res['processes'])} processes, "
               f"removed {len(res['netns'])} namespaces")


def _print_status(st: dict) -> None:
    # `up` only while every process of it runs, else `up, degraded: the card, shard 1's server NOT RUNNING`
    dead = [d.get("what") or f"{d.get('node')} {d.get('role')}" for d in st.get("dead") or []]
    phase = f"up, degraded: {', '.join(dead)} NOT RUNNING" if st.get("phase") == "up" and dead else st.get("phase")
    click.echo(f"testbed {st['name']}: {phase}   config {st.get('config')}"
               + (f"   card on net_{st['pmd']}" if st.get("pmd") else ""))
    click.echo(f"  effective config: {st.get('effective_config')}   logs: {st.get('dir')}/")
    for ns, ok in st["netns"].items():
        click.echo(f"  netns {ns:<14} {'present' if ok else 'MISSING'}")
    for lk in st["links"]:
        click.echo(f"  link  card port {lk['port']} {lk['card_if']} <-> {lk['peer_if']} ({lk['peer']})")
    for p in st["processes"]:
        click.echo(f"  proc  {p['node']:<5} {p['role']:<7} pid {p['pid']!s:<8} "
                   f"{'running' if p['alive'] else 'NOT RUNNING'}  {p['log']}")
    card = st.get("card")
    if card is None:
        click.echo(f"  card  none (up --no-card; `embnic pipeline load -c {st.get('effective_config')}` starts one)")
    else:
        if card.get("pipeline"):
            click.echo(f"  card  pipeline {card['pipeline']} (from `pipeline load`) pid {card.get('pid')} "
                       f"{'running' if card.get('running') else 'NOT RUNNING'}  {card.get('log')}")
        if card.get("running") is False:
            click.echo(f"  card  {card['error']}")
        elif "error" in card:
            click.echo(f"  card  ctl {card.get('ctl')}: {card['error']}")
        else:
            drops = ", ".join(f"{k} {v}" for k, v in sorted(card["drops"].items())) or "none"
            ring = card.get("ring") or {}
            fbt = ", ".join(f"{k} {v}" for k, v in (card.get("frames_by_type") or {}).items()) or "none"
            click.echo(f"  card  ctl {card.get('ctl')}")
            click.echo(f"  card  frames by type: {fbt}")
            click.echo(f"  card  drops: {drops}   ring {ring.get('count')}/{ring.get('size')} "
                       f"(high water {ring.get('high_water')})")
    if st.get("netem"):
        _print_netem(st["netem"], [lk["peer"] for lk in st["links"]])


@testbed.command("status")
@name_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@needs_root("testbed status")
def status_cmd(name, as_json):
    """Show what testbed NAME runs: namespaces, links, processes, card counters, netem. Exits 1
    if a node died or a namespace is missing, naming it and its log.

    \b
    Examples:
      sudo embnic testbed status
      sudo embnic testbed status --name tb2 --json
    """
    from embnic.testbed.net import netem as N
    from embnic.testbed.net import topology as T

    st = T.status(name)
    if st.get("netem"):
        st["netem"] = N.show(name)
    if as_json:
        click.echo(json.dumps(st, indent=1))
    else:
        _print_status(st)
    if not st["healthy"]:
        what = T.describe_dead(st["dead"])
        missing = [ns for ns, ok in st["netns"].items() if not ok]
        if missing:
            what = "; ".join(filter(None, [what, f"namespace(s) {', '.join(missing)} missing"]))
        cfg = st.get("config") or "FILE"
        if not missing and all(d["role"] == "impair" for d in st["dead"]):
            raise OperationalError(f"testbed {name}: {what}. Remove the impairment with `embnic testbed netem "
                                   f"--clear --name {name}` (and set it again if you want it)")
        raise OperationalError(f"testbed {name} is broken: {what}. Restart it: `embnic testbed down --name {name}` "
                               f"then `embnic testbed up --config {cfg} --name {name}`")


@testbed.command("netem")
@name_option
@click.option("--loss", type=FloatRange(0, 100), default=0.0, show_default=True, help="% of frames dropped.")
@click.option("--reorder", type=FloatRange(0, 100), default=0.0, show_default=True, help="% of frames reordered.")
@click.option("--duplicate", type=FloatRange(0, 100), default=0.0, show_default=True, help="% of frames duplicated.")
@click.option("--delay", "delay_ms", type=FloatRange(0, 10000), default=0.0, show_default=True,
              help="Delay in ms (tc: every frame; user: only the longest hold of a reordered frame, so it "
                   "needs --reorder there; bpf: none).")
@click.option("--link", "links", multiple=True, metavar="NODE",
              help="Set (or with --clear remove) only this node's link (c1, s0, ...; nodes of one host share it), "
                   "leaving the other links' impairments as they are; repeatable. Default: every link.")
@click.option("--backend", type=click.Choice(["auto", "tc", "bpf", "user"]), default="auto", show_default=True,
              help="tc netem; for kernels without sch_netem, bpf (loss only, in the kernel) or the user-space "
                   "helper (everything). auto: tc, else bpf for --loss alone, else user.")
@click.option("--seed", type=int, default=1, show_default=True,
              help="Seed of the user-space helper's random decisions; only the user backend uses it.")
@click.option("--clear", "clear_", is_flag=True, help="Remove the impairment (of every link, or of the --link ones).")
@needs_root("testbed netem")
def netem_cmd(name, loss, reorder, duplicate, delay_ms, links, backend, seed, clear_):
    """Impair the testbed's veth links (both directions): loss, reordering, duplicates.

    Impairments are per link: with --link NODE only that link's is set (or with --clear removed),
    the other links keep theirs. Every argument is checked before anything changes. Uses Linux
    `tc netem` where the kernel has it, else an eBPF program (loss alone) or a user-space helper
    per link (docs/testbed.md).

    \b
    Examples:
      sudo embnic testbed netem --loss 1 --reorder 5 --duplicate 1   # every link
      sudo embnic testbed netem --loss 2 --link s1                    # s1 only; the rest keep 1%
      sudo embnic testbed netem --clear --link s1                     # s1 unimpaired again
      sudo embnic testbed netem --clear                               # every link
    """
    from embnic.testbed.net import netem as N
    from embnic.testbed.net import topology as T

    links = list(links) or None
    if clear_ and (loss or reorder or duplicate or delay_ms):
        raise click.UsageError("--clear removes impairments: give it no --loss/--reorder/--duplicate/--delay")
    with errors_as((N.UnknownLink, as_param("--link")), (N.UnsupportedImpairment, as_param())):
        if clear_:
            res = N.clear(name, links=links)
            click.echo(f"testbed {name}: netem cleared on {', '.join(res['links'])}" if res else
                       f"testbed {name}: no impairment was set on {', '.join(links) if links else 'any link'}")
        else:
            with errors_as((ValueError, as_usage)):
                imp = N.Impairment(loss, reorder, duplicate, delay_ms, seed)
            rec = N.apply(name, imp, backend=backend, links=links, strict_delay=True)
            if not rec.get("backend"):
                click.echo(f"testbed {name}: netem cleared on {', '.join(rec['links'])}")
            else:
                click.echo(f"testbed {name}: {rec['backend']} netem {fmt_impairment(rec['impairment'])} on "
                           f"{', '.join(rec['links'])}")
        for note in N.sharing(name, links):
            click.echo(f"testbed {name}: {note}")
    wired = sorted((T.testbed_state(name) or {}).get("links", []), key=lambda lk: lk.get("port", 0))
    _print_netem(N.show(name), [lk["peer"] for lk in wired], counters=False)


def fmt_impairment(imp: dict | None) -> str:
    """``loss 1% reorder 5% duplicate 1%`` (+ ``delay D ms`` when set)."""
    imp = imp or {}
    s = f"loss {imp.get('loss', 0):g}% reorder {imp.get('reorder', 0):g}% duplicate {imp.get('duplicate', 0):g}%"
    return s + (f" delay {imp['delay_ms']:g} ms" if imp.get("delay_ms") else "")


def _print_netem(ne: dict | None, links: list[str], counters: bool = True) -> None:
    """One line per link: its backend and impairment (or none), and the helper's counters."""
    per = (ne or {}).get("per_link", {})
    counts = (ne or {}).get("counters") or {} if counters else {}
    for link in links or list(per):
        r = per.get(link)
        if r is None:
            click.echo(f"  netem {link:<4} none")
            continue
        click.echo(f"  netem {link:<4} {r.get('backend')}: {fmt_impairment(r.get('impairment'))}")
        c = counts.get(link)
        if c:
            click.echo(f"  netem {link:<4} " + "   ".join(
                f"{d} {c[d]['in']} frames -> {c[d]['out']} (dropped {c[d]['dropped']}, duplicated "
                f"{c[d]['duplicated']}, reordered {c[d]['reordered']})" for d in ("out", "in")))
