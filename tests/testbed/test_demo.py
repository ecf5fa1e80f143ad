"""The main job: a short `embnic demo` through the card (real embnic-dp, namespaces, shards).

Asserts report.json's fields, the loss match against the in-process run (≤ 1e-6), identical
final tables, the PNGs, and that nothing of the testbed is left afterwards.

Run alone: python3 -m pytest -q tests/testbed/test_demo.py   (needs root and DPDK)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tbutil import assert_gone, build_dataplane, embnic_drops, leftovers, cleanup, needs_root, run_dir, tb_name  # noqa: F401

STEPS = 4
FIELDS = ("target", "steps", "loss", "auc", "messages", "frames", "rounds_per_step", "dedup_ratio",
          "lookup_latency_us", "probe_rtt_us", "lookup_p50_over_probe_p50", "latency_target", "card_drops")


@needs_root
def test_short_demo_report_and_loss_match(run_dir, tmp_path, cleanup):  # noqa: F811
    build_dataplane()
    name = tb_name("d")
    cleanup.append(name)
    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "embnic", "demo", "--steps", str(STEPS), "--out", str(out),
                        "--name", name, "--batch-size", "128", "--all-clients", "--no-progress"],
                       capture_output=True, text=True, env=dict(os.environ, EMBNIC_RUN_DIR=str(run_dir)),
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "demo summary:" in r.stdout and "match" in r.stdout
    rep = json.loads((out / "report.json").read_text())
    for f in FIELDS:
        assert f in rep, f
    assert rep["target"] == "dpdk" and rep["steps"] == STEPS
    verdict = "met" if rep["latency_target"]["met"] else "not met"  # the summary says which
    assert f"× probe p50 (target ≤ 2: {verdict})" in r.stdout, r.stdout
    assert len(rep["loss"]) == STEPS and len(rep["loss_reference"]) == STEPS
    assert max(abs(a - b) for a, b in zip(rep["loss"], rep["loss_reference"])) <= 1e-6
    assert rep["loss_match"] is True
    assert 0.5 < rep["auc"] <= 1.0 and abs(rep["auc"] - rep["auc_reference"]) < 1e-9
    # one lookup round and one update round per step; every message was answered
    assert rep["rounds_per_step"] == 2.0
    md = rep["messages_detail"]
    assert md["requests_sent"] == md["replies_received"] > 0
    assert rep["messages"] == md["requests_sent"] + md["replies_received"]
    assert rep["frames"] >= rep["messages"]
    assert 0.0 < rep["dedup_ratio"] < 1.0
    lat = rep["lookup_latency_us"]
    assert lat["n"] == md["requests_sent"] // 2 and 0 < lat["p50"] <= lat["p99"]
    # the card saw the traffic and dropped nothing (a retransmitted request is answered twice: the
    # second answer is unsolicited once the first freed the entry); drops are listed by reason
    drops = embnic_drops(rep["card_drops"])
    retx = md["retransmits"] + rep["other_clients"]["2"]["retransmits"]
    assert "unknown_client" in drops and sum(drops.values()) == drops["unsolicited_reply"], drops
    probe_retx = rep["probes"]["sent"] - rep["probe_rtt_us"]["n"]  # probes re-sent after their timeout
    assert drops["unsolicited_reply"] == 0 or retx + probe_retx > 0, (drops, retx)  # frames of second answers
    assert drops["state_full"] == 0
    # the card's per-type counters count frames (and say so); messages come from its state map
    assert "types" not in rep["card"]
    fbt = rep["card"]["frames_by_type"]
    # one ack per update, plus one per update retransmitted after its ack passed (a new entry)
    assert fbt["LOOKUP_REQ"] > 0 and 0 <= fbt["UPDATE_ACK"] - md["requests_sent"] // 2 <= md["retransmits"]
    other = rep["other_clients"]["2"]  # --all-clients: client 2 looked its own batches up meanwhile
    assert other["error"] is None and other["lookup_rounds"] > 0 and other["messages"] > 0, other
    probes = rep["probes"]  # one-key lookups to every shard after every step: the probe RTT
    assert probes["sent"] >= rep["probe_rtt_us"]["n"] == STEPS * 2 and rep["lookup_p50_over_probe_p50"] > 0
    assert fbt["LOOKUP_REQ"] + fbt["UPDATE_REQ"] == (rep["frames_detail"]["sent"] + other["frames_sent"]
                                                     + probes["frames_sent"])
    sm = rep["card"]["messages_in_state_map"]
    # every request of the run completed on the card (plus the testbed's readiness probes, if counted)
    assert sm["entries"] == 0, sm  # answered messages leave the map at once
    done = sum(rep["card"]["messages_completed"].values())
    # (tail probes: the clients' one-key lookups after a round's last message, messages of their own)
    sent = (md["requests_sent"] + md["tail_probes"] + other["requests_sent"] + other["tail_probes"]
            + rep["probe_rtt_us"]["n"])
    assert sent <= done <= sent + retx + probes["sent"] - rep["probe_rtt_us"]["n"]
    assert rep["error"] is None and rep["steps_completed"] == STEPS and rep["kill_shard"] is None
    assert rep["tables"]["equal"] is True and rep["tables"]["rows"] > 0
    for k in ("loss", "latency_cdf"):
        with open(rep["plots"][k], "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert_gone(name)


@needs_root
def test_short_dlrm_demo_matches_in_process(run_dir, tmp_path, cleanup):  # noqa: F811
    """`embnic demo --model dlrm`: TorchRec's DLRM through the card, same report and checks."""
    pytest.importorskip("torchrec")
    build_dataplane()
    name = tb_name("m")
    cleanup.append(name)
    out = tmp_path / "dlrm"
    r = subprocess.run([sys.executable, "-m", "embnic", "demo", "--model", "dlrm", "--steps", "3", "--out", str(out),
                        "--name", name, "--batch-size", "128", "--no-progress"],
                       capture_output=True, text=True, env=dict(os.environ, EMBNIC_RUN_DIR=str(run_dir)),
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((out / "report.json").read_text())
    for f in FIELDS:
        assert f in rep, f
    assert rep["model"] == "dlrm" and rep["steps_completed"] == 3 and rep["error"] is None
    assert rep["loss"] == rep["loss_reference"] and rep["loss_match"] is True  # bit-identical
    assert rep["auc"] == rep["auc_reference"]
    assert rep["rounds_per_step"] == 2.0
    # nothing dropped but the second answers to retransmitted requests (unsolicited once the first
    # answer freed the entry: docs/protocol.md, "The card's state map")
    drops = embnic_drops(rep["card_drops"])
    assert sum(drops.values()) == drops["unsolicited_reply"], drops
    assert drops["unsolicited_reply"] == 0 or rep["messages_detail"]["retransmits"] > 0, drops
    md = rep["messages_detail"]
    assert md["requests_sent"] == md["replies_received"] > 0
    assert rep["tables"]["equal"] is True and rep["tables"]["rows"] > 0
    for k in ("loss", "latency_cdf"):
        with open(rep["plots"][k], "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert_gone(name)


@needs_root
def test_demo_refuses_a_busy_name_before_any_work(run_dir, tmp_path, cleanup):  # noqa: F811
    """`embnic demo --name N` with testbed N up (here: namespaces only) exits 2 naming it, before
    the data is read or the in-process reference run starts, and leaves that testbed alone."""
    from embnic.client_lib.config import load_config
    from embnic.testbed.net import topology as T
    from tbutil import TESTBED_TOML

    name = tb_name("b")
    cleanup.append(name)
    T.Testbed(T.Topology.from_config(load_config(TESTBED_TOML), name), run_dir).up(servers=False, card=False,
                                                                                   probe=False)
    r = subprocess.run([sys.executable, "-m", "embnic", "demo", "--steps", "2", "--out", str(tmp_path / "d"),
                        "--name", name, "--no-progress"],
                       capture_output=True, text=True, env=dict(os.environ, EMBNIC_RUN_DIR=str(run_dir)),
                       timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"testbed {name!r} is already up" in r.stderr and "--name" in r.stderr, r.stderr
    assert "reference run" not in r.stdout and "data:" not in r.stdout, r.stdout
    assert not (tmp_path / "d").exists()
    assert T.status(name, run_dir, counters=False)["healthy"]
    T.down(name, run_dir)
    assert_gone(name)
