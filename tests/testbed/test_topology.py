"""The namespace testbed: declaration from the config, up/down leaves nothing behind, crash cleanup.

Run alone: python3 -m pytest -q tests/testbed/test_topology.py   (the up/down tests need root)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import tomllib

import pytest

from embnic.client_lib.config import ConfigError, load_config, parse_config
from embnic.testbed.net import topology as T
from embnic.testbed.net.toml_writer import dump_toml

from tbutil import TESTBED_TOML, assert_gone, leftovers, cleanup, needs_root, run_dir, tb_name  # noqa: F401


def _raw():
    return tomllib.loads(TESTBED_TOML.read_text())


# --------------------------------------------------------------------------- declaration
def test_link_prefix_is_the_smallest_subnet_holding_both_as_hosts():
    assert T.link_prefix("10.77.0.1", "10.77.0.2") == 30
    assert T.link_prefix("10.77.0.1", "10.77.0.5") == 29
    # .3 is the broadcast address of the /30, so a /29 is needed
    assert T.link_prefix("10.77.0.1", "10.77.0.3") == 29
    with pytest.raises(ValueError):
        T.link_prefix("10.0.0.1", "10.0.0.1")


def test_derived_macs_are_distinct_and_locally_administered():
    macs = {T.derived_mac(k, i) for k in ("card", "client", "shard") for i in (0, 1, 255, 256, 65535)}
    assert len(macs) == 15
    assert all(int(m[:2], 16) & 0x02 and not int(m[:2], 16) & 0x01 for m in macs)


def test_declaration_of_the_example_testbed():
    topo = T.Topology.from_config(load_config(TESTBED_TOML), "enX1")
    assert [n.netns for n in topo.nodes] == ["enX1-card", "enX1-c1", "enX1-c2", "enX1-s0", "enX1-s1"]
    assert [lk.port for lk in topo.links] == [0, 1, 2, 3]
    assert topo.vdevs() == [f"net_af_packet{i},iface=enX1p{i},qdisc_bypass=0,framecnt=4096" for i in range(4)]
    lk = topo.link("s1")
    assert (lk.card_if, lk.peer_if, lk.card_ip, lk.peer_ip, lk.prefix_len) == \
        ("enX1p3", "enX1s1", "10.77.3.1", "10.77.3.2", 30)
    assert lk.card_mac == "02:ee:00:00:00:03" and lk.peer_mac == "02:ee:02:00:00:01"
    assert "card port 3" in topo.diagram()


def test_jumbo_mtu_gives_the_pmd_frames_that_hold_it():
    """Above MTU 1500 the af_packet frames hold a whole frame of the MTU (the card's --mtu mbuf);
    the card gets the cluster's MTU as --mtu, 1500 too (docs/control-socket.md)."""
    import dataclasses

    from embnic.control.targets.dpdk.target import DpdkTarget

    cfg = dataclasses.replace(load_config(TESTBED_TOML), mtu=9000)
    topo = T.Topology.from_config(cfg, "enX1")
    assert topo.vdevs()[0] == "net_af_packet0,iface=enX1p0,qdisc_bypass=0,framesz=9216,blocksz=36864,framecnt=908"
    assert 9000 + 14 + 4 <= 9216 and 908 * 9216 <= 8 << 20
    argv = DpdkTarget(cfg, vdevs=topo.vdevs()).card_argv("/tmp/x.sock")
    assert argv[argv.index("--mtu") + 1] == "9000"
    argv = DpdkTarget(load_config(TESTBED_TOML), vdevs=topo.vdevs()).card_argv("/tmp/x.sock")
    assert argv[argv.index("--mtu") + 1] == "1500"


def test_effective_config_fills_macs_and_control_and_round_trips(tmp_path):
    raw = _raw()
    for e in raw["clients"] + raw["shards"] + raw["card"]["ports"]:
        del e["mac"]
    topo = T.Topology.from_config(parse_config(raw, "x.toml"), "enX2")
    eff = topo.effective_raw(tmp_path)
    text = dump_toml(eff)
    back = tomllib.loads(text)
    assert back == eff
    cfg = parse_config(back)
    assert cfg.client(2).mac == T.derived_mac("client", 2)
    assert cfg.shard(0).mac == T.derived_mac("shard", 0)
    assert cfg.card.port(1).mac == T.derived_mac("card", 1)
    assert back["control"]["vdevs"] == topo.vdevs()
    assert back["control"]["netns"] == "enX2-card"
    assert "embnic-tb-enX2" in back["control"]["eal_args"]


@pytest.mark.parametrize("mutate, field", [
    (lambda r: r["shards"][0].update(ip="10.77.0.2", mac="02:ee:01:00:00:01", card_port=0), "shards[0].ip"),
    (lambda r: r["card"]["ports"][3].update(id=7), "card.ports"),
    (lambda r: r["shards"][0].update(ip="10.77.2.1"), "shards[0].ip"),
    (lambda r: r["card"].update(enabled=False), "card"),
])
def test_declaration_errors_name_the_field(mutate, field):
    raw = _raw()
    mutate(raw)
    try:
        cfg = parse_config(raw, "t.toml")
    except ConfigError as e:  # the config layer caught it first
        assert field.split(".")[0].split("[")[0] in e.field
        return
    with pytest.raises(ConfigError) as ei:
        T.Topology.from_config(cfg, "enX3")
    assert ei.value.field == field


def test_bad_names_are_refused():
    cfg = load_config(TESTBED_TOML)
    for bad in ("", "9abc", "toolongname", "a-b"):
        with pytest.raises(ValueError):
            T.Topology.from_config(cfg, bad)


# --------------------------------------------------------------------------- up / down
def _ns_exec(ns, *argv):
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, check=True).stdout


@needs_root
def test_up_down_leaves_no_namespace_veth_or_process(run_dir, cleanup):  # noqa: F811
    name = tb_name("u")
    cleanup.append(name)
    topo = T.Topology.from_config(load_config(TESTBED_TOML), name)
    tb = T.Testbed(topo).up(card=False, probe=False)
    pids = []
    try:
        st = T.status(name, counters=False)
        assert all(st["netns"].values()) and len(st["netns"]) == 5
        pids = [p["pid"] for p in st["processes"]]
        assert len(pids) == 2 and all(p["alive"] for p in st["processes"])
        # wiring: MACs, addresses, default route, permanent neighbour, offloads off
        link = json.loads(_ns_exec(f"{name}-s1", "ip", "-j", "addr", "show", "dev", f"{name}s1"))[0]
        assert link["address"] == "02:ee:02:00:00:01"
        assert {(a["local"], a["prefixlen"]) for a in link["addr_info"] if a["family"] == "inet"} == {("10.77.3.2", 30)}
        assert "inet6" not in {a["family"] for a in link["addr_info"]}
        neigh = _ns_exec(f"{name}-s1", "ip", "neigh", "show", "dev", f"{name}s1")
        assert "10.77.3.1 lladdr 02:ee:00:00:00:03 PERMANENT" in neigh
        assert "default via 10.77.3.1" in _ns_exec(f"{name}-s1", "ip", "route")
        card_if = json.loads(_ns_exec(f"{name}-card", "ip", "-j", "link", "show", "dev", f"{name}p3"))[0]
        assert card_if["address"] == "02:ee:00:00:00:03"
        for ns, ifname in ((f"{name}-card", f"{name}p0"), (f"{name}-c1", f"{name}c1")):
            k = _ns_exec(ns, "ethtool", "-k", ifname)
            assert "rx-checksumming: off" in k and "tx-checksumming: off" in k
        # one log per node, the effective config every node reads
        assert (tb.dir / "s0.log").exists() and (tb.dir / "s1.log").exists()
        assert load_config(tb.config_path).shard(1).mac == "02:ee:02:00:00:01"
        # a second `up` of the same name is refused; the CLI says so in one line, before drawing the wiring
        with pytest.raises(T.TestbedError, match="already up"):
            T.Testbed(topo).up(card=False, probe=False)
        from click.testing import CliRunner

        from embnic.cli.main import cli

        r = CliRunner().invoke(cli, ["testbed", "up", "-c", str(TESTBED_TOML), "--name", name])
        assert r.exit_code == 1 and "already up" in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1, r.output
    finally:
        res = T.down(name)
    assert sorted(res["netns"]) == sorted(f"{name}-{n}" for n in ("card", "c1", "c2", "s0", "s1"))
    assert_gone(name, pids)
    assert T.down(name)["found"] is False  # idempotent


@needs_root
def test_down_cleans_up_after_the_creator_was_killed(run_dir, cleanup):  # noqa: F811
    """`up` in a process that is then SIGKILLed: the state file alone lets `down` remove everything."""
    name = tb_name("k")
    cleanup.append(name)
    code = textwrap.dedent(f"""
        import sys, time
        from embnic.client_lib.config import load_config
        from embnic.testbed.net import topology as T
        topo = T.Topology.from_config(load_config({str(TESTBED_TOML)!r}), {name!r})
        T.Testbed(topo).up(card=False, probe=False)
        print("UP", flush=True)
        time.sleep(600)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, EMBNIC_RUN_DIR=str(run_dir)))
    try:
        assert p.stdout.readline().strip() == "UP"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    state = T.testbed_state(name)
    pids = [r["pid"] for r in state["procs"]]
    assert all(T.proc_starttime(x) is not None for x in pids)  # the shards outlived their creator
    assert len(leftovers(name)["netns"]) == 5
    r = subprocess.run([sys.executable, "-m", "embnic", "testbed", "down", "--name", name],
                       capture_output=True, text=True, env=dict(os.environ, EMBNIC_RUN_DIR=str(run_dir)))
    assert r.returncode == 0, r.stderr
    assert "removed 5 namespaces" in r.stdout
    assert_gone(name, pids)


@needs_root
def test_a_failing_node_names_its_log_and_up_cleans_up(run_dir, cleanup):  # noqa: F811
    name = tb_name("f")
    cleanup.append(name)
    topo = T.Topology.from_config(load_config(TESTBED_TOML), name)
    # a "server" that exits at once: the readiness probe must say so and point at the log
    try:
        with pytest.raises(T.TestbedError) as ei:
            T.Testbed(topo).up(card=False, probe=False, ready_timeout=5,
                               server_argv=lambda i, cfg, ip: [sys.executable, "-m", "embnic", "server", "--shard",
                                                               str(i), "--config", cfg, "--bind", "192.0.2.99"])
    finally:
        left = leftovers(name)
        T.down(name)
    assert left["netns"] == [], "up did not clean up after the failure"
    msg = str(ei.value)
    assert "shard 0" in msg and "s0.log" in msg
    assert_gone(name)


@needs_root
def test_in_netns_puts_sockets_in_the_namespace_and_comes_back(run_dir, cleanup):  # noqa: F811
    name = tb_name("n")
    cleanup.append(name)
    topo = T.Topology.from_config(load_config(TESTBED_TOML), name)
    T.Testbed(topo).up(servers=False, card=False, probe=False)
    try:
        import socket

        home = os.readlink("/proc/thread-self/ns/net")
        with T.in_netns(f"{name}-c1"):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            inside = os.readlink("/proc/thread-self/ns/net")
        assert inside != home and os.readlink("/proc/thread-self/ns/net") == home
        s.bind(("10.77.0.2", 0))  # only exists in the client namespace
        s.close()
        with pytest.raises(T.NetnsError, match="does not exist"):
            with T.in_netns(f"{name}-nope"):
                pass
    finally:
        T.down(name)
    assert_gone(name)


@needs_root
def test_check_free_says_busy_stale_or_free_without_changing_anything(run_dir, cleanup):  # noqa: F811
    """`Testbed.check_free` (what the demo asks before its reference run) agrees with `up`: a
    testbed that is up is busy for anyone; one left by a dead run of the same owner is "stale"
    (up removes it), for another owner busy; nothing changes until `up`."""
    name = tb_name("f")
    cleanup.append(name)
    topo = T.Topology.from_config(load_config(TESTBED_TOML), name)
    assert T.Testbed(topo).check_free(owner="demo") is None
    T.Testbed(topo).up(servers=False, card=False, probe=False, owner="demo")
    for owner in ("demo", None, "trace"):  # its creator (this process) runs: busy for everyone
        with pytest.raises(T.TestbedError, match="already up"):
            T.Testbed(topo).check_free(owner=owner)
    st = T.testbed_state(name)
    dead = subprocess.Popen(["true"])
    dead.wait()
    st["creator_pid"], st["creator_starttime"] = dead.pid, 1
    T.save_testbed_state(st)
    assert T.Testbed(topo).check_free(owner="demo") == "stale"
    with pytest.raises(T.TestbedError, match="already up"):
        T.Testbed(topo).check_free(owner=None)
    assert T.status(name, counters=False)["healthy"]  # untouched
    T.Testbed(topo).up(servers=False, card=False, probe=False, owner="demo")  # replaces the stale one
    assert T.testbed_state(name)["creator_pid"] == os.getpid()
    T.down(name)
    assert_gone(name)


def test_effective_config_makes_store_dir_absolute(tmp_path):
    """The testbed's effective config lives in RUN_DIR/testbed-NAME/: a relative store_dir of the
    user's config must still name the folder beside that config."""
    raw = _raw()
    raw["shards"][0]["store_dir"] = "rows"
    topo = T.Topology.from_config(parse_config(raw, tmp_path / "cfg" / "x.toml"), "enX3")
    eff = topo.effective_raw(tmp_path / "run")
    assert eff["shards"][0]["store_dir"] == str(tmp_path / "cfg" / "rows")
    assert "store_dir" not in eff["shards"][1]
    assert parse_config(eff, tmp_path / "run" / "cluster.toml").shard(0).store_dir == str(tmp_path / "cfg" / "rows")
