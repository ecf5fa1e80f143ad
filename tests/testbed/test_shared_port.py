"""Many hosts per card port (issue 11): examples/testbed-shared.toml, 4 clients and 4 shards on
2 card ports. Clients 1,2 share one host (namespace, IPv4, MAC; distinct UDP ports), 3,4 another;
each card port's hosts are on a Linux bridge in the card's namespace.

Run alone: python3 -m pytest -q tests/testbed/test_shared_port.py   (the demo needs root and DPDK)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from embnic.client_lib.config import load_config
from embnic.testbed.net import topology as T

from tbutil import REPO, assert_gone, build_dataplane, embnic_drops, leftovers, cleanup, needs_root, run_dir, tb_name  # noqa: F401

SHARED_TOML = REPO / "examples" / "testbed-shared.toml"
STEPS = 4


def test_declaration_bridges_each_card_port_and_shares_host_namespaces():
    topo = T.Topology.from_config(load_config(SHARED_TOML), "enS1")
    assert topo.client_ns(1) == topo.client_ns(2) == "enS1-c1" != topo.client_ns(3) == topo.client_ns(4)
    assert len({topo.shard_ns(s) for s in range(4)}) == 4
    assert [(lk.port, lk.peer, lk.members, lk.bridge) for lk in topo.links] == [
        (0, "c1", ("c1", "c2"), "enS1b0"), (0, "c3", ("c3", "c4"), "enS1b0"),
        (1, "s0", ("s0",), "enS1b1"), (1, "s1", ("s1",), "enS1b1"), (1, "s2", ("s2",), "enS1b1"),
        (1, "s3", ("s3",), "enS1b1")]
    assert topo.link("c2") is topo.link("c1") and topo.link("c2").card_if == "enS1c1x"
    assert {lk.prefix_len for lk in topo.links} == {29}  # one subnet per segment holds all its hosts
    # one DPDK port per card port, not per host
    assert topo.vdevs() == ["net_af_packet0,iface=enS1p0,qdisc_bypass=0,framecnt=4096",
                           "net_af_packet1,iface=enS1p1,qdisc_bypass=0,framecnt=4096"]
    # clients of one host share its MAC in the effective config
    raw = topo.effective_raw(REPO)
    macs = {c["id"]: c["mac"] for c in raw["clients"]}
    assert macs[1] == macs[2] != macs[3] == macs[4]
    # the example testbed keeps its point-to-point links (no bridge)
    ex = T.Topology.from_config(load_config(REPO / "examples" / "testbed.toml"), "enS2")
    assert all(lk.bridge is None and lk.card_if == lk.port_if for lk in ex.links)


@needs_root
def test_demo_through_shared_card_ports_matches_in_process(run_dir, tmp_path, cleanup):  # noqa: F811
    build_dataplane()
    name = tb_name("h")
    cleanup.append(name)
    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "embnic", "demo", "--config", str(SHARED_TOML), "--steps", str(STEPS),
                        "--out", str(out), "--name", name, "--batch-size", "128", "--all-clients", "--no-progress"],
                       capture_output=True, text=True, env=dict(os.environ, EMBNIC_RUN_DIR=str(run_dir)),
                       timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((out / "report.json").read_text())
    assert len(rep["loss"]) == STEPS
    assert max(abs(a - b) for a, b in zip(rep["loss"], rep["loss_reference"])) <= 1e-6
    assert rep["loss_match"] is True and rep["tables"]["equal"] is True and rep["tables"]["rows"] > 0
    # every client of both hosts was served: client 1 trained, 2-4 looked their batches up meanwhile
    md = rep["messages_detail"]
    assert md["requests_sent"] == md["replies_received"] > 0 and md["stale_replies"] == 0
    others = rep["other_clients"]
    assert sorted(others) == ["2", "3", "4"]
    for cid, o in others.items():
        assert o["error"] is None and o["lookup_rounds"] > 0 and o["requests_sent"] > 0, (cid, o)
    drops = embnic_drops(rep["card_drops"])
    retx = md["retransmits"] + sum(o["retransmits"] for o in others.values())
    # only second answers to re-sent requests are refused (unsolicited once the first answer freed the
    # entry); the counter counts frames, and one re-sent lookup's second answer may be many frames
    probe_retx = rep["probes"]["sent"] - rep["probe_rtt_us"]["n"]
    assert sum(drops.values()) == drops["unsolicited_reply"], drops
    assert drops["unsolicited_reply"] == 0 or retx + probe_retx > 0, (drops, retx, probe_retx)
    assert_gone(name)


def _neigh(ns: str, ip: str, dev: str) -> str:
    return subprocess.run(["ip", "-n", ns, "neigh", "show", ip, "dev", dev], capture_output=True, text=True,
                          check=True).stdout.strip()


@needs_root
def test_the_card_answers_arp_on_a_bridged_segment(run_dir, cleanup):  # noqa: F811
    """Without the testbed's static neighbour entry, a client host and a shard host resolve the
    card port's address by ARP across the bridge: the card answers with its port MAC."""
    build_dataplane()
    name = tb_name("a")
    cleanup.append(name)
    env = dict(os.environ, EMBNIC_RUN_DIR=str(run_dir))
    r = subprocess.run([sys.executable, "-m", "embnic", "testbed", "up", "--config", str(SHARED_TOML), "--name", name],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        for node, card_ip, card_mac in (("c3", "10.77.0.1", "02:ee:00:00:00:00"),
                                        ("s2", "10.77.1.1", "02:ee:00:00:00:01")):
            ns, dev = f"{name}-{node}", f"{name}{node}"
            assert "PERMANENT" in _neigh(ns, card_ip, dev)
            subprocess.run(["ip", "-n", ns, "neigh", "del", card_ip, "dev", dev], check=True)
            assert _neigh(ns, card_ip, dev) == ""
            # any datagram to the card makes the kernel ARP for it (the card drops the datagram itself)
            subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c",
                            "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                            f".sendto(b'x' * 64, ('{card_ip}', 7878))"], check=True)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and f"lladdr {card_mac}" not in _neigh(ns, card_ip, dev):
                time.sleep(0.1)
            got = _neigh(ns, card_ip, dev)
            assert f"lladdr {card_mac}" in got and "FAILED" not in got, got
    finally:
        subprocess.run([sys.executable, "-m", "embnic", "testbed", "down", "--name", name], env=env, timeout=120)
    assert_gone(name)
