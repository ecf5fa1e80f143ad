"""`embnic demo --target p4dpdk`: the training job through the P4 card for PNA (p4/pna/ in DPDK's
SWX pipeline, run by embnic-swx on the testbed's veths, namespace testbed, real shards): losses
equal to the in-process run (max |Δ| 0), identical final tables, every request answered without a
retransmit, no drop, every state-map entry completed and freed (none expired), nothing left
behind. Skips in one line where p4c-dpdk, DPDK's pipeline headers or embnic-swx are missing.
Run alone: sudo python3 -m pytest -q tests/p4/test_p4dpdk_demo.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]
STEPS = 3


def test_demo_through_p4dpdk(p4dpdk_pipeline, tmp_path):
    name = f"pd{os.getpid() % 10000}"
    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "embnic", "demo", "--target", "p4dpdk", "--steps", str(STEPS),
                        "--out", str(out), "--name", name, "--batch-size", "128", "--no-progress"],
                       capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, EMBNIC_RUN_DIR=str(tmp_path / "run")))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads((out / "report.json").read_text())
    assert rep["target"] == "p4dpdk" and rep["steps"] == STEPS
    assert rep["loss_max_abs_diff"] == 0 and rep["loss"] == rep["loss_reference"]
    assert rep["loss_match"] is True
    assert "identical to the in-process run" in r.stdout
    md = rep["messages_detail"]
    assert md["requests_sent"] == md["replies_received"] > 0 and md["retransmits"] == 0
    card = rep["card"]
    # every message the card saw was completed and its entry freed (a reply that found no entry
    # would be an unsolicited_reply drop and a retransmit; an entry never freed would stay)
    assert not any(card["drops_incl_eval_and_readback"].values()), card["drops_incl_eval_and_readback"]
    assert card["state"]["entries"] == 0 and card["state"]["expired"] == 0
    assert sum(card["messages_completed"].values()) > 0
    # nothing of the testbed is left: no namespace, no embnic-swx
    assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "run") not in ps
