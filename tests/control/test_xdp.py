"""net_af_xdp ports before the card starts (control/targets/dpdk/xdp.py): devargs, and an interface whose XDP
hook is taken or that does not exist is refused in one line by `pipeline load`, before any
process or state file exists.

Run alone: sudo python3 -m pytest -q tests/control/test_xdp.py   (the refusals need root: netns, XDP)
"""
from __future__ import annotations

import os
import subprocess

import pytest

from embnic.client_lib.config import load_config
from embnic.control.errors import OperationalError
from embnic.control.netns import Netns
from embnic.control.runstate import is_root, read_state
from embnic.control.targets.dpdk.target import DpdkTarget
from embnic.control.targets.dpdk.xdp import af_xdp_problem, attached_xdp, devargs, is_af_xdp

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_devargs_and_which_vdevs_are_af_xdp():
    assert devargs("net_af_xdp0,iface=Np0,start_queue=2,queue_count=1") == {
        "iface": "Np0", "start_queue": "2", "queue_count": "1"}
    assert devargs("net_null0") == {}
    assert is_af_xdp("net_af_xdp3,iface=x") and not is_af_xdp("net_af_packet0,iface=x")
    assert af_xdp_problem(["net_af_packet0,iface=nowhere", "net_null0"]) is None  # only af_xdp ports are checked
    assert "needs iface=NAME" in af_xdp_problem(["net_af_xdp0"])


@pytest.fixture
def veth_ns():
    """A namespace ``enY<pid>`` with a veth pair ``eYa<pid>``/``eYb<pid>``; deleted afterwards."""
    if not is_root():
        pytest.skip("needs root (network namespaces, XDP)")
    tag = f"{os.getpid() % 100000}"
    ns, a, b = f"enY{tag}", f"eYa{tag}", f"eYb{tag}"
    with Netns.create(ns) as n:
        n.veth(a, b)
        n.link_up(a)
        n.link_up(b)
        yield ns, a, b


def test_a_taken_or_missing_interface_is_refused_before_the_card_starts(veth_ns, tmp_path):
    from embnic.testbed.net import bpf_loss

    ns, a, b = veth_ns
    if bpf_loss.problem():
        pytest.skip(bpf_loss.problem())
    assert attached_xdp(a, ns) is None and af_xdp_problem([f"net_af_xdp0,iface={a}"], ns) is None
    bpf_loss.attach((ns, b), (ns, a), 0.0)  # the testbed's loss program on both ends
    try:
        assert attached_xdp(a, ns)["name"] == "embnic_loss" and attached_xdp(a, ns)["mode"] == 1  # native
        why = af_xdp_problem([f"net_af_xdp0,iface={a}"], ns)
        assert why.startswith(f"--vdev net_af_xdp0,iface={a}: interface {a} in network namespace {ns} already runs "
                              "XDP program embnic_loss (id ") and "native" in why, why
        assert "embnic testbed netem --clear" in why and f"ip -n {ns} link set dev {a} xdp off" in why, why
        t = DpdkTarget(load_config(os.path.join(REPO, "examples", "testbed.toml")), vdevs=[f"net_af_xdp{i},iface={a}" for i in range(4)], netns=ns, name="xdpt",
                       run_dir=tmp_path, check_build=False)
        with pytest.raises(OperationalError, match="already runs XDP program embnic_loss"):
            t.load()
        assert read_state(tmp_path, "xdpt") is None and not list(tmp_path.glob("*.log"))  # nothing started
    finally:
        bpf_loss.detach(ns, a)
        bpf_loss.detach(ns, b)
    missing = af_xdp_problem(["net_af_xdp0,iface=nosuchif0"], ns)
    assert missing.startswith(f"--vdev net_af_xdp0,iface=nosuchif0: no interface nosuchif0 in network namespace {ns}")
