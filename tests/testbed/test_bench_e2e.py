"""``embnic bench e2e``'s measuring code on real shards (loopback, no card, no timing checked):
Criteo batches of 26 features, rounds and messages per step in both modes, the summaries.

Run alone: python3 -m pytest -q tests/testbed/test_bench_e2e.py
"""
from __future__ import annotations

import dataclasses

import numpy as np

from embnic.client_lib.client import EmbeddingClient
from embnic.client_lib.config import load_config
from embnic.testbed.bench import e2e
from embnic.testbed.server.runner import ServerCluster


def test_batches_steps_and_summary_on_real_shards():
    cfg = load_config(e2e.CONFIG)
    cfg = dataclasses.replace(cfg, sharding="table", card=None)
    sp = e2e.sample_batches(64, 3, seed=1, rows=[t.rows for t in cfg.tables])
    assert len(sp) == 3 and sp[0].shape == (64, 26) and sp[0].dtype == np.uint64
    assert all(int(sp[0][:, j].max()) < cfg.tables[j].rows for j in range(26))
    with ServerCluster(cfg) as cl:
        runs = {}
        for fixed in (False, True):
            with EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0), fixed_length=fixed, rto_min_ms=1000) as c:
                runs[fixed] = [e2e.embnic_steps(c, cl.cfg, sp) for _ in range(2)]
    var, fix = runs[False][0], runs[True][0]
    assert len(var["lookup_us"]) == 3 and all(x > 0 for x in var["step_us"])
    # table sharding: one lookup and one update message per table, each answered
    assert var["rounds"] == 2 and var["messages"] == 26 * 4
    # fixed length: a size round before each, one SIZE_REQ and its SIZE_ACK per shard that has data
    shards = len({s for s in range(2) for t in cl.cfg.tables if e2e_owner(cl.cfg, t.id) == s})
    assert fix["rounds"] == 4 and fix["messages"] == 26 * 4 + 2 * 2 * shards
    s = e2e._summ(runs[False])
    assert s["rounds_per_step"] == {"median": 2.0, "min": 2.0, "max": 2.0}
    assert s["lookup_p50_us"]["min"] <= s["lookup_p50_us"]["median"] <= s["lookup_p50_us"]["max"]
    assert s["retransmits_per_step"]["max"] == 0


def e2e_owner(cfg, table_id):
    from embnic.client_lib.routing import split_by_shard

    return split_by_shard(cfg, table_id, np.array([1], dtype=np.uint64))[0][0]
