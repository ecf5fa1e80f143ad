"""``embnic bench dataplane --target bmv2`` end to end, short: both DUTs forward the same frames
over the same veth path in one run, the figures land in bench.json, nothing is left behind.
A smoke test of the benchmark's wiring (rates are not checked here: benchmarks measure them).
Run alone: sudo python3 -m pytest -q tests/p4/test_bmv2_bench.py
"""
from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_both_dut_forward_over_the_same_path(bmv2_ready, bmv2_channel, tmp_path):
    from embnic.control.targets.bmv2 import switch as bmv2
    from embnic.testbed.bench import bmv2 as bench_bmv2

    res = bench_bmv2.run(tmp_path, seconds=0.5, warmup=0.3, repeats=1, frames=256, channel=bmv2_channel)
    (card,), (sw,) = res["bmv2_card_runs"], res["bmv2_runs"]
    # every frame the generator sends is a request the card's tables route to the sink
    assert card["frames"] > 0 and sw["frames"] > 0, res
    assert sw["drops"] == {} and sw["rx_frames"] >= sw["frames"]
    assert sw["channel"] == bmv2_channel
    # the build measured is recorded as the installation reports it: --version and bm/config.h
    assert res["bmv2_channel"] == bmv2_channel
    assert res["bmv2_build"] == bmv2.build_info(bmv2.CHANNEL_SWITCH[bmv2_channel])
    assert res["bmv2_build"]["prefix"]
    assert res["bmv2_mpps"] == sw["mpps"] and res["bmv2_card_mpps"] == card["mpps"]
    assert res["ratio_card_bmv2"] == pytest.approx(card["mpps"] / sw["mpps"])
    assert res["bmv2_versions"]["simple_switch"]
    d = json.loads((tmp_path / "bench.json").read_text())["dataplane"]
    assert d["bmv2_mpps"] == res["bmv2_mpps"] and d["ratio_card_bmv2"] == res["ratio_card_bmv2"]
    names = [ln.split()[0] for ln in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                     text=True).stdout.splitlines() if ln.strip()]
    path = bench_bmv2.VethPath()
    assert path.name not in names and path.gen_ns not in names
