"""The demo's printed summary (no root, no card): what it says about the latency target."""
from __future__ import annotations

import pytest

from embnic.testbed.training import demo as DR


def _rep(ratio, met):
    return {
        "steps": 4, "batch_size": 128, "timing": {"steps_per_s": 3.0}, "loss": [0.7, 0.6],
        "loss_max_abs_diff": 0.0, "loss_match": True, "auc": 0.6, "auc_reference": 0.6, "messages": 10,
        "messages_detail": {"per_s": 5.0, "retransmits": 0}, "frames": 12, "rounds_per_step": 2.0,
        "request_messages_per_round": 2.0, "shards_per_round": 2.0,
        "dedup_ratio": 0.5, "dedup_savings": 0.5, "lookup_latency_us": {"p50": 213, "p99": 400, "n": 4},
        "probe_rtt_us": {"p50": 100, "p99": 150, "n": 8}, "lookup_p50_over_probe_p50": ratio,
        "latency_target": {"target": DR.PROBE_TARGET, "measured": ratio, "met": met}, "card_drops": {},
        "tables": None, "netem": None, "plots": {"loss": "/tmp/x/loss.png"},
    }


@pytest.mark.parametrize("ratio, met, says", [(2.13, False, "(target ≤ 2: not met)"), (1.4, True, "(target ≤ 2: met)"),
                                              (None, False, "(target ≤ 2: not measured)")])
def test_summary_says_whether_the_latency_target_was_met(ratio, met, says):
    lines = DR.summary(_rep(ratio, met))
    line = next(ln for ln in lines if "probe RTT" in ln)
    assert f"lookup p50 = {ratio} × probe p50 {says}" in line, line
    # protocol v2: request messages per round beside the rounds and the latency
    assert "2 request messages/round (2 shards)" in next(ln for ln in lines if "rounds/step" in ln)
    assert "2 request messages/round)" in next(ln for ln in lines if "lookup latency" in ln)
