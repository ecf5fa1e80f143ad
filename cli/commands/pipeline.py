"""``embnic pipeline load|unload|status``: start, stop and look at the card pipeline on a target."""
from __future__ import annotations

import dataclasses
import json
import time

import click

from embnic.client_lib.statemap import state_map_plan
from embnic.cli.commands.options import (FloatRange, config_option, ctl_option, json_option, name_option,
                                         rate_option, target_option)
from embnic.control.ctlsock import CtlClient
from embnic.control.errors import OperationalError
from embnic.control.runstate import pid_matches, read_state, state_path
from embnic.control.settings import open_target, resolve
from embnic.control.targets.base import describe_state


@click.group()
def pipeline():
    """Load the embnic pipeline onto a target, unload it, show its status (its pid, control socket
    and log are recorded in RUN_DIR/NAME.json; docs/cli.md).

    \b
    Examples:
      embnic pipeline load -c examples/testbed.toml --vdev net_ring0 --vdev net_ring1 --vdev net_ring2 --vdev net_ring3
      embnic pipeline status -c examples/testbed.toml
      embnic pipeline unload -c examples/testbed.toml
    """


def _ports_line(info: dict) -> str:
    ports = info.get("ports") or []
    return ", ".join(f"{p.get('port')}: {p.get('name', '?')} {p.get('mac', '?')} {p.get('ip') or '-'}" for p in ports)


@pipeline.command("load")
@config_option(required=True)
@target_option
@name_option
@ctl_option
@click.option("--binary", metavar="PATH", default=None,
              help="embnic-dp to run (default: $EMBNIC_DP, else dataplane/build/embnic-dp).")
@click.option("--eal-args", metavar="ARGS", default=None,
              help="EAL arguments replacing the defaults '-l LCORES --no-huge --no-pci -m 256 "
                   "--file-prefix embnic-NAME-…' (one shell-quoted string). Env: EMBNIC_EAL_ARGS.")
@click.option("--vdev", "vdevs", metavar="SPEC", multiple=True,
              help="A DPDK vdev, one per card port in port order (net_ring0, net_null0, "
                   "net_af_packet0,iface=veth0, ...). Repeatable.")
@click.option("--pci", "pci", metavar="BDF", multiple=True,
              help="A NIC port by PCI address (0000:3b:00.0), one per card port, before any --vdev (default: "
                   "[card] pci of the config); bound to vfio-pci or another DPDK driver. Repeatable. docs/deploy.md.")
@click.option("--no-hugepages", is_flag=True, help="With --pci: keep --no-huge -m 256 (no hugepages reserved).")
@click.option("--card-args", metavar="ARGS", default=None,
              help="More embnic-dp arguments after '--' (one shell-quoted string), e.g. '--burst 16'.")
@click.option("--idle-us", type=click.IntRange(0, 1_000_000), default=None,
              help="dpdk target: the card sleeps this many µs when a poll finds nothing (shared cores).")
@click.option("--lcores", metavar="LIST", default=None,
              help="EAL lcore list, e.g. 0 or 0,1 (default: card.lcores of the config).")
@click.option("--netns", metavar="NS", default=None,
              help="Run the card inside this existing network namespace (needs root). Env: EMBNIC_NETNS.")
@click.option("--timeout", "ready_timeout", type=FloatRange(0.1, 600), default=30.0, show_default=True,
              help="Seconds to wait for the control socket to answer.")
@click.option("--no-program", is_flag=True, help="Do not install the config's routes and clients.")
@rate_option
@json_option
def load(config, target, name, ctl, binary, eal_args, vdevs, pci, no_hugepages, card_args, idle_us, lcores, netns,
         ready_timeout, no_program, rate, as_json):
    """Start the pipeline on a target and program the config's routes and clients.

    For the dpdk target: refuses an embnic-dp whose build info does not match the client library,
    starts it, waits until its control socket answers, then installs one route per [[shards]] and
    one client per [[clients]] (each needs `mac` and `card_port`). It then says how many messages
    in flight the card's state map allows and what fraction may go unanswered at --rate messages/s
    (with --json: `state_map`). Needs root. If the card does not start, the error quotes the line
    of its log that says why. On a real NIC give its ports with --pci (docs/deploy.md).

    \b
    Example:
      embnic pipeline load -c examples/testbed.toml --vdev net_ring0 --vdev net_ring1 --vdev net_ring2 --vdev net_ring3
    """
    s = resolve(config, target, name, ctl, binary, eal_args, vdevs, netns, card_args, require_config=True)
    if idle_us is not None:
        if s.target != "dpdk":
            raise click.UsageError(f"--idle-us is an embnic-dp option (the dpdk target); the {s.target} target "
                                   "has no idle sleep: leave it out")
        s.card_args += ["--idle-us", str(idle_us)]
    opts = {"pci": list(pci)} if pci else {}
    if no_hugepages:
        opts["hugepages"] = False
    res = open_target(s, lcores=lcores, ready_timeout=ready_timeout, **opts).load(program=not no_program)
    info = res.get("info", {})
    plan = (state_map_plan(s.config, rate, info["state_size"], info.get("state_timeout_ms", 5000))
            if s.config is not None and info.get("state_size") else None)
    if as_json:
        click.echo(json.dumps({**res, "state_map": dataclasses.asdict(plan) if plan else None}, indent=2,
                              default=str))
        return
    click.echo(f"loaded pipeline {s.name!r} on {s.target}: pid {res['pid']}, {len(info.get('ports', []))} port(s), "
               f"mode {info.get('mode', '?')}, {res['routes']} route(s), {res['clients']} client(s)")
    click.echo(f"  ports {_ports_line(info)}")
    click.echo(f"  ctl {res['ctl']}  log {res['log']}")
    if plan is not None:
        click.echo(f"  {plan.describe()}")
    for w in res.get("warnings", []):
        click.echo(f"warning: {w}", err=True)


@pipeline.command("unload")
@config_option()
@target_option
@name_option
@click.option("--timeout", "stop_timeout", type=FloatRange(0.1, 600), default=10.0, show_default=True,
              help="Seconds to wait after SIGTERM before SIGKILL.")
@json_option
def unload(config, target, name, stop_timeout, as_json):
    """Stop the pipeline NAME cleanly (SIGTERM, wait, SIGKILL only if it hangs) and remove its state.
    NAME is --name, else the [control] name of the config given with -c, else 'embnic'.

    \b
    Examples:
      embnic pipeline unload --name embnic
      embnic pipeline unload -c examples/testbed.toml
    """
    s = resolve(config, target, name)
    st = read_state(s.run_dir, s.name)
    if target is None and st and isinstance(st.get("target"), str):
        s.target = st["target"]
    res = open_target(s, stop_timeout=stop_timeout).unload()
    if as_json:
        click.echo(json.dumps(res, indent=2, default=str))
        return
    if res.get("corrupt"):
        click.echo(f"pipeline {s.name!r}: removed an unreadable state file")
    elif not res["was_running"]:
        click.echo(f"pipeline {s.name!r} was not running (pid {res['pid']} gone); removed its stale state file")
    elif res["killed"]:
        click.echo(f"unloaded pipeline {s.name!r}: pid {res['pid']} did not stop within {stop_timeout:g}s of "
                   f"SIGTERM and was killed (SIGKILL); see its log {res['log']}")
    else:
        ex = f", exit code {res['exit']}" if res.get("exit") is not None else ""
        click.echo(f"unloaded pipeline {s.name!r}: pid {res['pid']} stopped{ex}")


@pipeline.command("status")
@config_option()
@target_option
@name_option
@ctl_option
@json_option
def status(config, target, name, ctl, as_json):
    """Say whether pipeline NAME runs: pid, control socket, log, ports, mode (exit 1 if not running).
    NAME and the socket are found as `pipeline load` finds them; for counters use `embnic status`.

    \b
    Examples:
      embnic pipeline status --json
      embnic pipeline status -c examples/testbed.toml
    """
    s = resolve(config, target, name, ctl)
    dpdk = s.target == "dpdk"  # asked over its control socket; another target (bmv2) is asked itself
    t = None if dpdk else open_target(s)
    st = read_state(s.run_dir, s.name) if dpdk else t.state()
    ok = bool(st) and not st.get("corrupt")
    if not dpdk and not ok:
        st = None
    path = (s.ctl or (st or {}).get("ctl") or str(s.run_dir / f"{s.name}.sock")) if dpdk else (st or {}).get("ctl")
    out = {"name": s.name, "state_file": str(state_path(s.run_dir, s.name)) if st else None,
           "state": st, "ctl": path, "running": ok and pid_matches(st), "answers": False, "info": None}
    try:
        if dpdk:
            owner = st if ok and st.get("ctl") == path else None
            out["info"] = {k: v for k, v in CtlClient(path, timeout=2.0, owner=owner).call("info").items() if k != "ok"}
        elif out["running"]:
            out["info"] = t.info()
        out["answers"] = out["info"] is not None
    except OperationalError as e:  # CtlError too
        out["error"] = str(e)
    if as_json:
        click.echo(json.dumps(out, indent=2, default=str))
        if not out["answers"]:
            raise click.exceptions.Exit(1)
        return
    if not out["answers"]:
        if ok and not out["running"]:
            raise OperationalError(f"pipeline {s.name!r} is not running: pid {st.get('pid')} is gone (see its log "
                                   f"{st.get('log')}); `embnic pipeline unload --name {s.name}` removes the stale state")
        if out["running"]:
            raise OperationalError(f"pipeline {s.name!r} runs (pid {st.get('pid')}) but {out.get('error')}")
        raise OperationalError(f"pipeline {s.name!r} is not loaded: run `embnic pipeline load "
                               f"{'' if dpdk else f'--target {s.target} '}--config FILE"
                               f"{'' if s.name == 'embnic' else ' --name ' + s.name}`")
    info = out["info"]
    if st:
        up = time.time() - st.get("started", time.time())
        click.echo(f"pipeline {s.name!r}: running ({describe_state(st)}, up {up:.0f}s)")
        click.echo(f"  log {st.get('log')}")
    else:
        click.echo(f"pipeline {s.name!r}: a card answers on {path} (no state file: not started by `pipeline load`)")
    if not dpdk:
        ifaces = st.get("interfaces") or {}
        click.echo(f"  ports {', '.join(f'{k}: {v}' for k, v in sorted(ifaces.items(), key=lambda kv: int(kv[0])))}")
        return
    b = info.get("build") or {}
    click.echo(f"  mode {info.get('mode', '?')}, lcores {info.get('lcores', '?')}, state lcores "
               f"{info.get('state_lcores', 1)}, protocol v{b.get('proto_version', '?')}, "
               f"git {str(b.get('git_rev', '?'))[:12]}")
    click.echo(f"  ports {_ports_line(info)}")
