"""The card's PMD on the testbed's veths: net_af_packet or net_af_xdp (`--pmd`, docs/deploy.md).

Declarations and refusals without root; then, as root, the two PMDs' send paths (one card on a
veth pair: whether what it sends passes the interface's qdisc, which `netem --backend tc`
relies on) and the demo trained through a card on net_af_xdp with loss on every link (netem's
`auto` picks the user backend there), matching the in-process run.

Run alone: sudo python3 -m pytest -q tests/testbed/test_pmd.py
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from embnic.client_lib.config import load_config
from embnic.cli.main import cli
from embnic.control.targets.dpdk.process import CardProcess
from embnic.control.targets.dpdk.process import DpdkProcError
from embnic.control.targets.dpdk.xdp import AF_XDP_MAX_FRAME, AF_XDP_MAX_MTU, PMD_MAX_RX_PKTLEN, VETH_XDP_MAX_MTU
from embnic.control.netns import Netns
from embnic.testbed.net import netem as N
from embnic.testbed.net import topology as T
from embnic.testbed.net.wiring import card_vdev, check_pmd
from embnic.testbed.training import demo as D

from tbutil import (TESTBED_TOML, assert_gone, build_dataplane, cleanup, needs_root, run_dir,  # noqa: F401
                    tb_name)


def test_vdevs_of_each_pmd():
    topo = T.Topology.from_config(load_config(TESTBED_TOML), "enX1", pmd="af_xdp")
    assert topo.pmd == "af_xdp"
    assert topo.vdevs() == [f"net_af_xdp{i},iface=enX1p{i}" for i in range(4)]
    assert "(net_af_xdp)" in topo.diagram().splitlines()[0]
    # the effective config every node reads carries them: `pipeline load -c` of it runs the same PMD
    assert topo.effective_raw(TESTBED_TOML.parent)["control"]["vdevs"] == topo.vdevs()
    assert T.Topology.from_config(load_config(TESTBED_TOML), "enX1").pmd == "af_packet"
    assert card_vdev("af_packet", 2, "x", 1500) == "net_af_packet2,iface=x,qdisc_bypass=0,framecnt=4096"


def test_af_xdp_is_refused_where_it_cannot_run():
    cfg = load_config(TESTBED_TOML)
    assert check_pmd("af_xdp", VETH_XDP_MAX_MTU) == "af_xdp"
    with pytest.raises(T.PmdError, match=r"mtu = 3507: a veth takes the PMD's XDP program only up to MTU 3506.*"
                                         r"use --pmd af_packet, or mtu <= 3506") as e:
        T.Topology.from_config(dataclasses.replace(cfg, mtu=VETH_XDP_MAX_MTU + 1), "enX1", pmd="af_xdp")
    assert e.value.option == "--pmd" and e.value.exit_code == 2
    with pytest.raises(T.PmdError, match="runs the card on af_packet or af_xdp"):
        T.Topology.from_config(cfg, "enX1", pmd="af_vhost")
    with pytest.raises(T.PmdError, match="the bmv2 card reads the veths itself: drop --pmd"):
        T.Testbed(T.Topology.from_config(cfg, "enX1", pmd="af_xdp"), target="bmv2")
    # the jumbo config through the CLI: exit 2 naming --pmd, before anything is created
    jumbo = TESTBED_TOML.read_text().replace("mtu = 1500 ", "mtu = 9000 ")
    assert "mtu = 9000" in jumbo
    with CliRunner().isolated_filesystem():
        open("j.toml", "w").write(jumbo)
        r = CliRunner().invoke(cli, ["testbed", "up", "-c", "j.toml", "--name", "enX9", "--pmd", "af_xdp"])
    assert r.exit_code == 2 and "--pmd" in r.output and "mtu = 9000" in r.output, r.output
    assert not [n for n in T.netns_list() if n.startswith("enX9-")]


def test_demo_refuses_tc_or_bpf_faults_on_an_af_xdp_card_before_any_work():
    cfg = load_config(TESTBED_TOML)
    for backend in ("tc", "bpf"):
        opts = D.DemoOptions(pmd="af_xdp", netem_backend=backend, impairment=N.Impairment(loss=1))
        with pytest.raises(D.DemoUsageError, match=f"--netem-backend {backend}: .*net_af_xdp.*"
                                                   "use --netem-backend user") as e:
            D.check_options(opts, cfg)
        assert e.value.param == "--netem-backend"
    # without faults, or with the user backend, it is fine
    assert D.check_options(D.DemoOptions(pmd="af_xdp", netem_backend="bpf"), cfg) is None
    assert D.check_options(D.DemoOptions(pmd="af_xdp", netem_backend="user", impairment=N.Impairment(loss=1)),
                           cfg) is None


@needs_root
def test_netem_refuses_tc_and_bpf_on_an_af_xdp_testbed_by_name(run_dir, cleanup):  # noqa: F811
    """The refusal reads the testbed's state (what `up --pmd` recorded), before anything changes:
    a testbed without card or servers is enough."""
    name = tb_name("x")
    cleanup.append(name)
    T.Testbed(T.Topology.from_config(load_config(TESTBED_TOML), name, pmd="af_xdp")).up(
        servers=False, card=False, probe=False)
    try:
        assert T.testbed_state(name)["pmd"] == "af_xdp" and T.status(name, counters=False)["pmd"] == "af_xdp"
        for backend, why in (("bpf", "XDP hook of the card's end"), ("tc", "sends around the card's end's qdisc")):
            r = CliRunner().invoke(cli, ["testbed", "netem", "--name", name, "--loss", "1", "--backend", backend])
            assert r.exit_code == 2 and why in r.output and "use --backend user" in r.output, r.output
            assert N.show(name) is None
    finally:
        T.down(name)
    assert_gone(name)


def _arp_reply_through_qdisc(card_bin, pmd: str, tag: str) -> tuple[int, str | None]:
    """One veth pair in a namespace of its own, the card on one end with vdev ``card_vdev(pmd)``
    and a ``pfifo`` root qdisc there; the other end sends a datagram to the card's address, so
    the kernel asks by ARP and the card answers. Returns (frames the card's end's qdisc sent,
    the frames the card counted sent meanwhile)."""
    ns, a, b = f"enQ{tag}", f"eQa{tag}", f"eQb{tag}"
    nsx = Netns.create(ns)  # IPv6 off: no router solicitations or MLD reports of the kernel's own
    card = None
    try:
        nsx.veth(a, b)
        for dev in (a, b):
            nsx.link_up(dev)
        nsx.add_address(b, "10.97.0.2/30")
        run_q = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", a, "root", "pfifo", "limit", "100"],
                               capture_output=True, text=True)
        if run_q.returncode != 0:
            pytest.skip(f"no pfifo qdisc here: {run_q.stderr.strip()}")
        card = CardProcess(card_bin, [card_vdev(pmd, 0, a, 1500)], port_ips={0: "10.97.0.1"}, netns=ns)
        card.start()
        mac = card.call("info")["ports"][0]["mac"].lower()

        def sent() -> int:
            out = subprocess.run(["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", a], capture_output=True,
                                 text=True, check=True).stdout
            return sum(q.get("packets", 0) for q in json.loads(out) if q.get("kind") == "pfifo")

        before, tx0 = sent(), card.counters()["ports"][0]["tx_frames"]
        with T.in_netns(ns):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        learnt = None
        with s:
            deadline = time.monotonic() + 10
            while learnt is None and time.monotonic() < deadline:
                s.sendto(b"x", ("10.97.0.1", 9))
                time.sleep(0.2)
                neigh = json.loads(subprocess.run(["ip", "-n", ns, "-j", "neigh", "show", "10.97.0.1"],
                                                  capture_output=True, text=True, check=True).stdout)
                learnt = next((n["lladdr"].lower() for n in neigh if n.get("lladdr")), None)
        assert learnt == mac, (learnt, mac, card.log())
        return sent() - before, card.counters()["ports"][0]["tx_frames"] - tx0
    finally:
        if card is not None:
            card.stop()
            card.cleanup()
        nsx.delete()


@needs_root
def test_what_each_pmd_sends_passes_the_qdisc_or_not():
    """net_af_packet with the testbed's qdisc_bypass=0 sends through the qdisc of its interface
    (so tc netem on the card's end impairs the card's frames); net_af_xdp sends around it
    (__dev_direct_xmit), which is why `netem --backend tc` is refused on such a card."""
    card_bin = build_dataplane()
    tag = f"{os.getpid() % 100000}"
    through, sent = _arp_reply_through_qdisc(card_bin, "af_packet", tag)
    assert through == sent >= 1, (through, sent)
    around, sent = _arp_reply_through_qdisc(card_bin, "af_xdp", tag)
    assert around == 0 and sent >= 1, (around, sent)


@needs_root
def test_demo_through_an_af_xdp_card_with_loss_matches_in_process(run_dir, tmp_path, cleanup):  # noqa: F811
    build_dataplane()
    name = tb_name("p")
    cleanup.append(name)
    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "embnic", "demo", "--steps", "3", "--out", str(out), "--name", name,
                        "--batch-size", "128", "--pmd", "af_xdp", "--loss", "1", "--no-progress"],
                       capture_output=True, text=True, env=dict(os.environ, EMBNIC_RUN_DIR=str(run_dir)), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dpdk on net_af_xdp" in r.stdout and "(user netem)" in r.stdout, r.stdout
    rep = json.loads((out / "report.json").read_text())
    assert rep["pmd"] == "af_xdp" and rep["loss_match"] is True and rep["tables"]["equal"] is True
    assert rep["netem"]["backend"] == "user" and sum(
        c["out"]["dropped"] + c["in"]["dropped"] for c in rep["netem"]["counters"].values()) > 0
    # every port of the card was a net_af_xdp port: its largest frame is a page less headers
    # (not the PMD's max_rx_pktlen less the CRC, nor an af_packet frame's MTU + 14 = 1514)
    assert {p["max_frame"] for p in rep["card"]["ports"]} == {AF_XDP_MAX_FRAME} != {PMD_MAX_RX_PKTLEN - 4}
    assert rep["messages_detail"]["requests_sent"] == rep["messages_detail"]["replies_received"] > 0
    assert_gone(name)


@needs_root
def test_af_xdp_card_at_its_largest_mtu_carries_full_frames(run_dir, tmp_path, cleanup):  # noqa: F811
    """Issue 24 item 5: at MTU 2927..3506 an af_xdp card failed to start ("Failed to create umem":
    its mbufs exceeded a page), at 2850..2926 it started but the kernel dropped the shards' larger
    replies unseen. At the largest allowed MTU (3506, a veth's XDP limit too) the demo trains and
    the shards' replies arrive in frames longer than the old limit (2940 bytes)."""
    assert AF_XDP_MAX_MTU == VETH_XDP_MAX_MTU == 3506 and AF_XDP_MAX_FRAME == 3520
    build_dataplane()
    name = tb_name("m")
    cleanup.append(name)
    cfg = TESTBED_TOML.read_text().replace("mtu = 1500 ", f"mtu = {AF_XDP_MAX_MTU} ")
    assert f"mtu = {AF_XDP_MAX_MTU}" in cfg
    (tmp_path / "big.toml").write_text(cfg)
    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "embnic", "demo", "--steps", "2", "--out", str(out), "--name", name,
                        "-c", str(tmp_path / "big.toml"), "--batch-size", "1024", "--pmd", "af_xdp",
                        "--no-table-check", "--no-progress"],
                       capture_output=True, text=True, env=dict(os.environ, EMBNIC_RUN_DIR=str(run_dir)), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["loss_match"] is True and not any(rep["card_drops"].values()), rep["card_drops"]
    assert rep["messages_detail"]["requests_sent"] == rep["messages_detail"]["replies_received"] > 0
    ports = rep["card"]["ports"]
    assert {p["max_frame"] for p in ports} == {AF_XDP_MAX_FRAME}
    assert all(p["too_long_for_port"] == 0 for p in ports)
    # the shards' ports (2, 3): replies averaging more than the old largest frame, so many longer
    for p in ports[2:]:
        assert p["rx_frames"] > 0 and p["rx_bytes"] / p["rx_frames"] > 2940, p
    assert_gone(name)


@needs_root
def test_af_xdp_card_refuses_the_next_mtu_up():
    """--mtu 3507 on a card with a net_af_xdp port: exit 2 before any port starts, one line naming
    the limit (3520-byte frames, MTU <= 3506) and the fix; 3506 starts."""
    card_bin = build_dataplane()
    tag = f"{os.getpid() % 100000}"
    ns, a, b = f"enU{tag}", f"eUa{tag}", f"eUb{tag}"
    with Netns.create(ns) as nsx:
        nsx.veth(a, b, mtu=AF_XDP_MAX_MTU)
        for dev in (a, b):
            nsx.link_up(dev)
        card = CardProcess(card_bin, [card_vdev("af_xdp", 0, a, AF_XDP_MAX_MTU)], port_ips={0: "10.98.0.1"},
                           netns=ns, args=["--mtu", str(AF_XDP_MAX_MTU + 1)])
        with pytest.raises(DpdkProcError) as e:
            card.start()
        assert card.returncode == 2, (card.returncode, str(e.value))
        assert (f"--mtu {AF_XDP_MAX_MTU + 1}: a net_af_xdp port receives at most {AF_XDP_MAX_FRAME}-byte frames"
                f" (one 4096-byte page per frame, DPDK 22.11): MTU <= {AF_XDP_MAX_MTU}, or run the port on "
                "net_af_packet") in str(e.value), str(e.value)
        card = CardProcess(card_bin, [card_vdev("af_xdp", 0, a, AF_XDP_MAX_MTU)], port_ips={0: "10.98.0.1"},
                           netns=ns, args=["--mtu", str(AF_XDP_MAX_MTU)])
        card.start()
        try:
            assert [p["max_frame"] for p in card.counters()["ports"]] == [AF_XDP_MAX_FRAME]
        finally:
            card.stop()
            card.cleanup()
