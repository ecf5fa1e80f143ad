"""``--vdev`` specs are checked before DPDK starts (issue 34; control/targets/dpdk/vdevs.py): a
malformed spec, a device given twice and more vdevs than the config's card has ports are one
usage line naming the fix (exit 2), and no card is started. Before, they reached the EAL.

Run alone: python3 -m pytest -q tests/control/test_vdevs.py
"""
from __future__ import annotations

import os

import pytest

from embnic.control.runstate import read_state
from embnic.control.targets.dpdk.target import DpdkTarget
from embnic.control.targets.dpdk.vdevs import vdev_problem, vdevs_problem

VDEVS3 = ["net_ring0", "net_ring1", "net_ring2"]


@pytest.fixture
def dp(fake_dp_factory, monkeypatch):
    """The stand-in embnic-dp (no EAL): loads as any user."""
    if os.geteuid() != 0:
        monkeypatch.setattr(DpdkTarget, "NEEDS_ROOT", False)
    return fake_dp_factory()


@pytest.mark.parametrize("spec", [
    "net_ring0", "net_null1", "eth_ring0", "net_af_packet0,iface=veth-c0,qdisc_bypass=0,framecnt=4096",
    "net_af_xdp1,iface=emb-c1", "net_pcap0,rx_pcap=/tmp/x.pcap,infinite_rx=1", "net_tap0,iface=tap.0",
    "net_bonding0,mode=1,slave=[net_ring0,net_ring1]", "net_ring0,nodeaction=r1:0:CREATE"])
def test_well_formed_specs_pass(spec):
    assert vdev_problem(spec) is None


@pytest.mark.parametrize("spec,needle", [
    ("", "empty"), ("   ", "empty"), ("net ring0", "no spaces"), ("net_ring0, iface=x", "no spaces"),
    ("ring0", "not an ethdev vdev name"), ("crypto_null0", "not an ethdev vdev name"),
    ("net_", "not an ethdev vdev name"), ("NET-RING0", "not an ethdev vdev name"),
    ("net_ring0,", "an empty argument"), ("net_ring0,,iface=a", "an empty argument"),
    ("net_af_packet0,iface=", "iface= has no value"), ("net_af_packet0,=veth0", "is not KEY=VALUE"),
    ("net_bonding0,slave=[net_ring0", "unbalanced brackets"), ("--vdev=net_ring0", "not an ethdev vdev name"),
    # an argument with no '=' reaches the PMD with no value: net_af_packet crashed on it (signal 11)
    ("net_af_packet0,iface", "'iface' has no value"), ("net_af_packet0,iface=nx0,qpairs", "'qpairs' has no value")])
def test_malformed_specs_are_named(spec, needle):
    bad = vdev_problem(spec)
    assert bad and needle in bad and "\n" not in bad, bad


def test_the_list_twice_and_past_the_cards_ports():
    assert vdevs_problem(VDEVS3, [0, 1, 2]) is None
    assert vdevs_problem(VDEVS3, None) is None
    bad = vdevs_problem(["net_ring0", "net_ring1", "net_ring0"], [0, 1, 2])
    assert "device net_ring0 is given twice (vdevs 0 and 2)" in bad and "net_ring3" in bad, bad
    bad = vdevs_problem(VDEVS3 + ["net_ring3"], [0, 1, 2])
    assert bad.startswith("4 vdevs given but the card has 3 DPDK port(s) (card.ports ids 0, 1, 2): drop "
                          "--vdev net_ring3"), bad
    bad = vdevs_problem(["net_ring0", "net_ring1", "net_ring2", "net_ring3"], [0, 1, 2], n_pci=1)
    assert "1 PCI device(s) and 4 vdev(s)" in bad and "drop --vdev net_ring2 --vdev net_ring3" in bad, bad
    assert vdevs_problem(VDEVS3 + ["net_ring3"], None) is None  # --eal-args: the count is not known


@pytest.mark.parametrize("vdevs,needle", [
    (VDEVS3 + ["net_ring3"], "4 vdevs given but the card has 3 DPDK port(s)"),
    (["net_ring0", "net ring1", "net_ring2"], "a vdev spec holds no spaces"),
    (["net_ring0", "net_ring1", "net_ring1"], "device net_ring1 is given twice"),
    (["net_ring0", "net_ring1", "bogus2"], "'bogus2' is not an ethdev vdev name")])
def test_pipeline_load_refuses_before_dpdk_starts(invoke, env, dp, card_config, vdevs, needle):
    args = [a for v in vdevs for a in ("--vdev", v)]
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *args)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "pipeline load --help')" in lines[0], r.output
    assert read_state(env, "embnic") is None  # nothing started
    assert not list(env.glob("embnic.log"))


def test_the_python_target_checks_the_same(card_config, dp):
    from embnic.client_lib.config import load_config
    from embnic.control.errors import UsageError

    with pytest.raises(UsageError, match="drop --vdev net_ring3"):
        DpdkTarget(load_config(card_config), binary=dp, vdevs=VDEVS3 + ["net_ring3"], name="x").load()
