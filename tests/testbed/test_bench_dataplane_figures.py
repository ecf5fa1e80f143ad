"""The dataplane benchmark's 2-lcore figures and the testpmd command line they need (no root).

Run alone: python3 -m pytest -q tests/testbed/test_bench_dataplane_figures.py
"""
from __future__ import annotations

import pytest

from embnic.control.targets.dpdk.process import eal_argv
from embnic.testbed.bench.dataplane import TESTPMD_2FWD, TESTPMD_2FWD_MAIN, _distinct_figures
from embnic.testbed.bench.testpmd import TestpmdProcess

DPCAP = {"frames": 16384, "messages": 8192, "bytes": 0, "avg_frame_bytes": 0.0}


def _card(mpps: float, msgs: float) -> dict:
    return {"mpps": mpps, "completed_per_s": msgs, "all_mpps": [mpps], "all_completed_per_s": [msgs],
            "others_cpu": [0.1], "xcore_rtt_ns": [210.0], "drops": {}, "gbps": 1.0, "mempool_ops": "ring_mp_mc"}


def _tp(mpps: float) -> dict:
    return {"mpps": mpps, "all_mpps": [mpps], "others_cpu": [0.2], "xcore_rtt_ns": [None]}


def test_two_state_lcore_figures_beside_the_one_lcore_ones():
    m = {"card_distinct": _card(2.0, 1.0e6), "card_repeated": _card(3.0, 0.0), "io_distinct": _tp(8.0),
         "card_distinct_2state": _card(3.0, 1.5e6), "io_distinct_2fwd": _tp(12.0)}
    f = _distinct_figures(m, DPCAP)
    assert f["distinct_msgs_per_s"] == 1.0e6 and f["distinct_2state_msgs_per_s"] == 1.5e6
    assert f["testpmd_io_distinct_2fwd_mpps"] == 12.0
    assert f["ratio_io_distinct_2state"] == 3.0 / 12.0
    assert f["scaling_distinct_2state_vs_1"] == 1.5 and f["scaling_testpmd_2fwd_vs_1"] == 1.5
    assert f["distinct_2state_runs"]["xcore_rtt_ns"] == [210.0]
    assert "not gated" in f["distinct_2state_setup"]
    # without the 2-lcore runs, none of their figures
    del m["card_distinct_2state"], m["io_distinct_2fwd"]
    assert not [k for k in _distinct_figures(m, DPCAP) if "2state" in k or "2fwd" in k]


def test_testpmd_with_two_forwarding_lcores_on_two_cpus():
    tp = TestpmdProcess(["net_null0", "net_null1"], lcores=TESTPMD_2FWD, main_lcore=TESTPMD_2FWD_MAIN, queues=2)
    argv = tp.process.argv
    try:
        assert argv[argv.index("--lcores") + 1] == "0@0,1@1,2@1" and "-l" not in argv
        assert {"--nb-cores=2", "--rxq=2", "--txq=2"} <= set(argv)
        assert argv[argv.index("--main-lcore") + 1] == "2"
    finally:
        tp.cleanup()
    assert eal_argv("0,1", "p")[:2] == ["-l", "0,1"]


def test_veth_path_reports_each_pmd_and_their_ratios(monkeypatch, tmp_path):
    """measure_veth: one interleaved run, the DUT on net_af_packet and net_af_xdp of the same veth end
    behind one generator; figures per PMD and af_xdp over af_packet (the runs are stand-ins here)."""
    from embnic.testbed.bench import dataplane as DP

    class Ns:
        name, a, b = "enBx", "eBax", "eBbx"

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    class Gen:
        def __init__(self, vdevs, **kw):
            self.vdevs, self.proc = vdevs, type("P", (), {"pid": 4242})()
            gens.append(self)

        def start(self):
            return self

        def cleanup(self):
            self.cleaned = True

    gens, seen = [], {}

    def fake_all(runs, repeats, rtt=True):
        out = {}
        for key, (fn, args, kw) in runs.items():
            what, pmd = key.split("/")
            seen[key] = (args[1] if fn is DP.measure_card else args[0], kw.get("other_pids"))
            mpps = {"card": 1.0, "io": 2.0, "macswap": 1.6}[what] * (1.5 if pmd == "af_xdp" else 1.0)
            out[key] = _card(mpps, 0.0) if fn is DP.measure_card else _tp(mpps)
        return out

    monkeypatch.setattr(DP, "_veth_pair", Ns)
    monkeypatch.setattr(DP, "TestpmdProcess", Gen)
    monkeypatch.setattr(DP, "_measure_all", fake_all)
    pcap = {"frames": 100, "messages": 50, "bytes": 0, "avg_frame_bytes": 0.0}
    res = DP.measure_veth(tmp_path / "embnic-dp", tmp_path / "p.pcap", pcap, DP.VETH_PMDS, 1.0, 0.0, 1)
    assert gens[0].vdevs[1] == "net_af_packet0,iface=eBax" and gens[0].cleaned  # one generator, af_packet
    assert seen["card/af_xdp"] == (["net_af_xdp0,iface=eBbx", "net_null0,no-rx=1"], [4242])
    assert seen["io/af_packet"][0] == ["net_af_packet0,iface=eBbx", "net_null0,no-rx=1"]
    assert res["af_packet"]["card_mpps"] == 1.0 and res["af_xdp"]["card_mpps"] == 1.5
    assert res["af_xdp"]["ratio_io"] == 1.5 / 3.0 and "copy mode" in res["af_xdp"]["setup"]
    assert res["af_xdp_vs_af_packet"] == pytest.approx({"card": 1.5, "testpmd_io": 1.5, "testpmd_macswap": 1.5})
    # one PMD alone: no ratio between them
    assert "af_xdp_vs_af_packet" not in DP.measure_veth(tmp_path, tmp_path, pcap, ["af_xdp"], 1.0, 0.0, 1)
