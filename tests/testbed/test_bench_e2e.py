"""``embnic bench e2e``'s measuring code on real shards (loopback, no card, no timing checked):
Criteo batches of 26 features, rounds and messages per step in both modes, the summaries.

Run alone: python3 -m pytest -q tests/testbed/test_bench_e2e.py
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

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
    # table sharding, protocol v2: one lookup and one update message per shard touched (every
    # table that shard holds in it), each answered
    shards = len({s for s in range(2) for t in cl.cfg.tables if e2e_owner(cl.cfg, t.id) == s})
    assert var["rounds"] == 2 and var["messages"] == 4 * shards
    assert var["request_messages_per_round"] == var["shards_per_round"] == shards
    # fixed length: a size round before each, one SIZE_REQ and its SIZE_ACK per shard that has data
    assert fix["rounds"] == 4 and fix["messages"] == 4 * shards + 2 * 2 * shards
    assert fix["request_messages_per_round"] == shards
    s = e2e._summ(runs[False])
    assert s["rounds_per_step"] == {"median": 2.0, "min": 2.0, "max": 2.0}
    assert s["lookup_p50_us"]["min"] <= s["lookup_p50_us"]["median"] <= s["lookup_p50_us"]["max"]
    assert s["retransmits_per_step"]["max"] == 0


def e2e_owner(cfg, table_id):
    from embnic.client_lib.routing import shard_of

    return int(shard_of(cfg, table_id, np.array([1], dtype=np.uint64))[0])


def test_dlrm_rows_train_the_same_samples_through_shards_and_torchrec():
    """The DLRM rows' two sides on real shards (loopback, no card) and TorchRec in process."""
    pytest.importorskip("torchrec")
    from embnic.testbed.bench import e2e_dlrm
    from embnic.testbed.training import criteo

    cfg = dataclasses.replace(load_config(e2e.CONFIG), sharding="table", card=None)
    rows = [t.rows for t in cfg.tables]
    sample = criteo.load_criteo(criteo.sample_path("train"), rows=rows)
    batches = e2e_dlrm.dlrm_batches(sample, e2e.sample_starts(len(sample), 3, seed=1), 16)
    # the same samples as the embedding rows of that batch size and seed
    sparse = e2e.sample_batches(16, 3, seed=1, rows=rows, data=sample)
    for (dense, kjt, labels), sp in zip(batches, sparse):
        assert dense.shape == (16, 13) and labels.shape == (16,)
        np.testing.assert_array_equal(kjt.values().numpy().view(np.uint64), sp.T.reshape(-1))
    with ServerCluster(cfg) as cl:
        with EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0), rto_min_ms=1000) as c:
            card = e2e_dlrm.card_steps(c, cl.cfg, {16: batches}, repeats=2)
            rounds = c.stats.rounds
    # a warm-up step, then 2 timed steps per repeat; a lookup and an update round per step
    assert [len(r) for r in card[16]] == [2, 2] and rounds == 2 * (1 + 2 * 2)
    tr = e2e_dlrm.torchrec_steps(cfg, {16: batches}, 2)
    assert tr["sharding_types"] == ["table_wise"] and [len(r) for r in tr[16]] == [2, 2]
    (row,) = e2e_dlrm.rows(card, tr, [16])
    assert row["model"] == "dlrm" and row["batch"] == 16
    assert row["card_steps_per_s"] > 0 and row["torchrec_steps_per_s"] > 0
    assert row["card_over_torchrec"] == row["card_steps_per_s"] / row["torchrec_steps_per_s"]


def test_cli_prints_the_embedding_and_the_dlrm_rows(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from embnic.cli.main import cli

    emb = {"model": "embeddings", "batch": 32, "varlen_p50_us": 1.0e4, "varlen_p99_us": 2.0e4, "fixed_p50_us": 3.0e4,
           "fixed_p99_us": 4.0e4, "torchrec_p50_us": 5.0e3, "torchrec_p99_us": 6.0e3, "messages_varlen": 104.0,
           "messages_fixed": 112.0, "rounds_varlen": 2.0, "rounds_fixed": 4.0,
           "request_messages_per_round_varlen": 2.0, "request_messages_per_round_fixed": 2.0, "shards_per_round": 2.0}
    dl = {"model": "dlrm", "batch": 32, "card_steps_per_s": 17.9, "torchrec_steps_per_s": 137.8,
          "card_over_torchrec": 17.9 / 137.8, "card_step_p50_us": 5.6e4, "torchrec_step_p50_us": 7.3e3}
    seen = {}

    loss = {"loss_pct_every_link": 1.0, "netem_backend": "user", "by_batch": {"32": {
        "step_p50_us": 30000.0, "step_p50_us_loss": 45000.0, "ratio": 1.5, "retransmits_per_step": 0.0,
        "retransmits_per_step_loss": 2.5, "timeouts_per_step_loss": 0.1, "repairs_per_step_loss": 0.0,
        "probes_per_step_loss": 6.0, "step_p50_us_relay": 31000.0, "ratio_vs_relay": 45000.0 / 31000.0}}}

    def fake_run(out, **kw):
        seen.update(kw)
        return {"rows": [emb] + ([dl] if kw["dlrm"] else []), "targets": {}, "machine": {"before": {}},
                "plots": ["e2e_steps.png"], "loss": loss if kw["dlrm"] else {}}

    monkeypatch.setattr(e2e, "run", fake_run)
    r = CliRunner().invoke(cli, ["bench", "e2e", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert seen["dlrm"] is True and "e2e DLRM training steps/s" in r.output
    assert "17.9" in r.output and "137.8" in r.output and "0.13" in r.output and "10,000" in r.output
    assert "2.0/2.0   (2)" in r.output  # request messages per round, varlen/fixed, and the shards touched
    assert "1% loss on every link (user netem" in r.output
    assert "loss-free 30,000 (retransmits 0), with loss 45,000 = 1.50 x" in r.output
    assert "without loss 31,000 (1.45 x)" in r.output
    r = CliRunner().invoke(cli, ["bench", "e2e", "--out", str(tmp_path), "--no-dlrm"])
    assert r.exit_code == 0 and seen["dlrm"] is False and "DLRM" not in r.output, r.output
