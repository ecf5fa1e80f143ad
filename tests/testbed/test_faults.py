"""Faults in the testbed: 1% loss with reordering and duplicates on every link, and a shard killed mid-run.

* Under ``netem`` faults the demo still completes, its losses match the in-process run and the
  final embedding tables on the shards equal the loss-free (in-process) run's bit for bit:
  updates are applied exactly once. The test also checks the faults really happened.
* Killing a shard's server mid-run makes the client fail with an error naming the shard, and
  the testbed is still removed completely.

Run alone: python3 -m pytest -q tests/testbed/test_faults.py   (needs root and DPDK)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tbutil import assert_gone, build_dataplane, cleanup, needs_root, run_dir, tb_name  # noqa: F401


@needs_root
def test_demo_under_loss_reorder_duplicates_keeps_tables_exact(run_dir, tmp_path, cleanup):  # noqa: F811
    build_dataplane()
    name = tb_name("l")
    cleanup.append(name)
    out = tmp_path / "lossy"
    r = subprocess.run([sys.executable, "-m", "embnic", "demo", "--steps", "8", "--batch-size", "256",
                        "--out", str(out), "--name", name, "--loss", "1", "--reorder", "5", "--duplicate", "1",
                        "--no-progress"],
                       capture_output=True, text=True, env=dict(os.environ, EMBNIC_RUN_DIR=str(run_dir)),
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["loss_match"] is True
    t = rep["tables"]
    assert t["equal"] is True and t["max_abs_diff"] == 0.0 and t["rows"] > 1000
    ne = rep["netem"]
    assert ne["impairment"]["loss"] == 1.0 and sorted(ne["links"]) == ["c1", "c2", "s0", "s1"]
    c = ne.get("counters") or {}
    if ne["backend"] == "user":  # the helpers count what they did (tc netem keeps no such counters)
        tot = {k: sum(v[d][k] for v in c.values() for d in ("out", "in")) for k in ("dropped", "duplicated",
                                                                                    "reordered")}
        assert tot["dropped"] > 0 and tot["duplicated"] > 0 and tot["reordered"] > 0, tot
    # lost frames were recovered by retransmission
    assert rep["messages_detail"]["retransmits"] > 0
    assert_gone(name)


@needs_root
def test_killed_shard_fails_naming_it_writes_the_report_and_down_still_cleans_up(run_dir, tmp_path,  # noqa: F811
                                                                               cleanup):  # noqa: F811
    build_dataplane()
    name = tb_name("x")
    cleanup.append(name)
    out = tmp_path / "kill"
    r = subprocess.run([sys.executable, "-m", "embnic", "demo", "--steps", "6", "--out", str(out),
                        "--name", name, "--kill-shard", "1", "--kill-at-step", "2", "--no-progress"],
                       capture_output=True, text=True, env=dict(os.environ, EMBNIC_RUN_DIR=str(run_dir)),
                       timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith("Error: ") and "shard 1" in err and "Traceback" not in r.stderr, r.stderr
    assert "after 2 of 6 steps" in err and "shard 1's server, pid" in err and "is not running" in err
    assert str(out / "report.json") in err
    # the report of what ran: the error, the steps completed, their losses, the plots
    rep = json.loads((out / "report.json").read_text())
    e = rep["error"]
    assert e["phase"] == "training" and e["failing_shard"] == 1 and e["failed_at_step"] == 3
    assert [d["what"] for d in e["dead_nodes"]] == ["shard 1's server"]
    assert e["dead_nodes"][0]["log"].endswith("s1.log")
    assert rep["kill_shard"] == 1 and rep["kill_at_step"] == 2 and rep["steps"] == 6
    assert rep["steps_completed"] == 2 and len(rep["loss"]) == 2 and rep["loss_match"] is True
    assert rep["auc"] is None and rep["messages"] > 0 and rep["lookup_latency_us"]["n"] > 0
    assert rep["card"]["frames_by_type"]["LOOKUP_REQ"] > 0
    for k in ("loss", "latency_cdf"):
        with open(rep["plots"][k], "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "demo summary (FAILED):" in r.stdout
    assert_gone(name)


@needs_root
def test_killed_shard_restarted_from_its_log_gives_the_fault_free_run(run_dir, tmp_path, cleanup):  # noqa: F811
    """--kill-shard 1 --kill-at-step 3 --restart: SIGKILL, restart with --restore from the shard's
    write-ahead log and checkpoints, and the run completes with the losses and final tables of
    the in-process run without the fault."""
    build_dataplane()
    name = tb_name("r")
    cleanup.append(name)
    out = tmp_path / "restart"
    r = subprocess.run([sys.executable, "-m", "embnic", "demo", "--steps", "6", "--out", str(out), "--batch-size",
                        "128", "--name", name, "--kill-shard", "1", "--kill-at-step", "3", "--restart",
                        "--checkpoint-every", "4", "--no-progress"],
                       capture_output=True, text=True, env=dict(os.environ, EMBNIC_RUN_DIR=str(run_dir)),
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "restarted from" in r.stdout
    rep = json.loads((out / "report.json").read_text())
    assert rep["error"] is None and rep["steps_completed"] == 6 and rep["restart"] is True
    assert rep["kill_shard"] == 1 and rep["kill_at_step"] == 3
    assert rep["loss"] == rep["loss_reference"]  # identical, not merely close
    assert rep["tables"]["equal"] is True and rep["tables"]["rows"] > 0 and rep["tables"]["max_abs_diff"] == 0
    assert_gone(name)


@needs_root
def test_a_dead_card_is_named_not_the_shard_the_client_blames(run_dir, tmp_path, cleanup, monkeypatch):  # noqa: F811
    """The card dies mid-run: every shard still runs, so the error must name the card (the client
    alone only knows that some shard did not answer)."""
    import signal

    from embnic.testbed.training import demo as D
    from embnic.testbed.net import topology as T

    build_dataplane()
    name = tb_name("c")
    cleanup.append(name)
    killed = {}

    def kill_the_card(self, shard_id, sig=signal.SIGKILL):  # the --kill-shard hook kills the card instead
        rec = next(p for p in self.state["procs"] if p["role"] == "card")
        os.kill(rec["pid"], signal.SIGKILL)
        killed.update(rec)

    monkeypatch.setattr(T.Testbed, "kill_server", kill_the_card)
    out = tmp_path / "card"
    opts = D.DemoOptions(steps=4, batch_size=128, out=out, name=name, kill_shard=0, kill_at_step=1,
                         progress=False, rdir=run_dir)
    with pytest.raises(D.DemoError) as ei:
        D.run_demo(opts, log=lambda s: None)
    msg = str(ei.value)
    assert f"the card, pid {killed['pid']}, is not running: see {killed['log']}" in msg, msg
    assert "shard 0 was killed" not in msg and "server, pid" not in msg
    rep = json.loads((out / "report.json").read_text())
    assert [d["what"] for d in rep["error"]["dead_nodes"]] == ["the card"]
    assert rep["steps_completed"] == 1
    assert_gone(name, [killed["pid"]])
