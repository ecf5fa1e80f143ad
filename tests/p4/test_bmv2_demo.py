"""`embnic demo --target bmv2`: the training job through the P4 card on BMv2 (namespace testbed,
real shards), on each control channel installed: losses equal to the in-process run within
1e-6, identical final tables, every frame the card's interfaces took in counted by the switch
(none lost before it), nothing left behind. Skips where p4c/simple_switch are absent.
Run alone: sudo python3 -m pytest -q tests/p4/test_bmv2_demo.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]
STEPS = 3


def test_demo_through_bmv2(bmv2_ready, channel_env, tmp_path):
    name = f"p4d{os.getpid() % 10000}"
    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "embnic", "demo", "--target", "bmv2", "--steps", str(STEPS),
                        "--out", str(out), "--name", name, "--batch-size", "128", "--no-progress"],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, EMBNIC_RUN_DIR=str(tmp_path / "run")))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads((out / "report.json").read_text())
    assert rep["target"] == "bmv2" and rep["steps"] == STEPS
    assert max(abs(a - b) for a, b in zip(rep["loss"], rep["loss_reference"])) <= 1e-6
    assert rep["loss_match"] is True
    assert "identical to the in-process run" in r.stdout
    md = rep["messages_detail"]
    assert md["requests_sent"] == md["replies_received"] > 0
    # the switch's capture rings hold a step's bursts (offloads off on its ports): nothing is lost
    # before the switch, on any port
    assert rep["card_control"]["channel"] == channel_env
    assert rep["card_lost_before_switch"] == {"total": 0, "by_port": {"0": 0, "1": 0, "2": 0, "3": 0}}, rep["card"]["ports"]
    assert "lost before card  0 frames" in r.stdout
    # nothing of the testbed is left: no namespace, no switch
    assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "run") not in ps
