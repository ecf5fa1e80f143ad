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
def test_killed_shard_fails_naming_it_and_down_still_cleans_up(run_dir, tmp_path, cleanup):  # noqa: F811
    build_dataplane()
    name = tb_name("x")
    cleanup.append(name)
    r = subprocess.run([sys.executable, "-m", "embnic", "demo", "--steps", "6", "--out", str(tmp_path / "kill"),
                        "--name", name, "--kill-shard", "1", "--kill-at-step", "2", "--no-progress"],
                       capture_output=True, text=True, env=dict(os.environ, EMBNIC_RUN_DIR=str(run_dir)),
                       timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith("Error: ") and "shard 1" in err and "Traceback" not in r.stderr, r.stderr
    assert_gone(name)
