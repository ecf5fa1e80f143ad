"""Exactly once through the card under heavy faults (docs/protocol.md, "Reliability"): update
messages of several tables, at most 4 fragments each, cross 30 % loss, 10 % duplication and
20 % reordering on every link of the testbed (the user-space netem backend, both directions) and
each is applied once; the rows read back equal the in-process run bit for bit.

Lost updates are recovered by polls and UPDATE_NACKs (only the missing fragments again), lost
lookup replies by repairs. The client gets retries enough that a message cannot fail by chance
(each try's odds of getting through are above 1 %; 1000 tries).

Run alone: python3 -m pytest -q tests/testbed/test_exactly_once_netem.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tbutil import TESTBED_TOML, assert_gone, build_dataplane, cleanup, needs_root, run_dir, tb_name  # noqa: F401

from embnic.testbed.traces.trace import shard_counters_from_log

CLIENT = r"""
import json, sys
import numpy as np
from embnic.client_lib.client import EmbeddingClient
from embnic.client_lib.config import load_config
from embnic.client_lib.local import LocalBackend

cfg = load_config(sys.argv[1])
ref = LocalBackend(cfg)
rng = np.random.default_rng(7)
tables = [t.id for t in cfg.tables][:8]
seen = {t: [] for t in tables}
with EmbeddingClient(cfg, 1, msg_frames=4, retries=1000, rto_min_ms=20) as c:
    updates = 0
    for _ in range(4):
        upd = {}
        for t in tables:
            k = np.unique(rng.integers(0, 500, 12, dtype=np.uint64))
            upd[t] = (k, rng.standard_normal((k.size, cfg.table(t).dim)).astype(np.float32))
            seen[t].append(k)
        before = c.stats.round_messages
        c.update(upd)
        updates += c.stats.round_messages - before
        ref.update(upd)
    keys = {t: np.unique(np.concatenate(seen[t])) for t in tables}
    got = c.lookup(keys)
    want = ref.lookup(keys)
    equal = all(np.array_equal(got[t], want[t]) for t in keys)
    s = c.stats
    print(json.dumps({"equal": equal, "update_messages": updates, "retransmits": s.retransmits,
                      "update_polls": s.update_polls, "nacks": s.nacks, "repairs": s.repairs,
                      "frames_resent": s.frames_resent}))
"""


@needs_root
def test_multi_table_updates_exactly_once_under_30pct_loss(run_dir, cleanup):  # noqa: F811
    build_dataplane()
    name = tb_name("x")
    cleanup.append(name)
    env = dict(os.environ, EMBNIC_RUN_DIR=str(run_dir))
    cli = [sys.executable, "-m", "embnic"]
    r = subprocess.run(cli + ["testbed", "up", "--config", str(TESTBED_TOML), "--name", name],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        r = subprocess.run(cli + ["testbed", "netem", "--name", name, "--loss", "30", "--duplicate", "10",
                                  "--reorder", "20", "--backend", "user", "--seed", "3"],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        cfg = run_dir / f"testbed-{name}" / "cluster.toml"
        r = subprocess.run(["ip", "netns", "exec", f"{name}-c1", sys.executable, "-c", CLIENT, str(cfg)],
                           capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        res = json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        down = subprocess.run(cli + ["testbed", "down", "--name", name], capture_output=True, text=True, env=env,
                              timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert res["equal"] is True, res
    # the faults were felt and recovered fragment by fragment
    assert res["retransmits"] > 0 and res["update_polls"] > 0 and res["nacks"] > 0, res
    counters = [shard_counters_from_log(run_dir / f"testbed-{name}" / f"s{i}.log") for i in (0, 1)]
    assert all(c is not None for c in counters), counters
    # every update message applied exactly once over both shards; duplicates only re-acked
    assert sum(c["updates_applied"] for c in counters) == res["update_messages"], (counters, res)
    assert_gone(name)
