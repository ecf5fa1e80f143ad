"""Two DLRM workers under torchrun through the card (embnic.testbed.training.dlrm_workers).

* ``torchrun --nproc-per-node 2 -m embnic.testbed.training.dlrm_workers`` in one client host of the
  shared-port testbed (examples/testbed-shared.toml's wiring: clients 1 and 2 share host
  10.77.0.2, distinct UDP ports; the card = embnic-dp; two shards) trains 3 steps; rank 1's batch
  of step 1 has only empty bags. Both ranks' losses, their dense parameters and the rows on the
  shards (read back through the card) equal :func:`~embnic.testbed.training.dlrm_workers.reference_run`
  within ``assert_close(rtol=1e-6, atol=1e-7)``; both clients' traffic passed the card.
* A wrong rank → client mapping is a one-line error, exit 2, before any process group.

Run alone: python3 -m pytest -q tests/testbed/test_workers.py   (needs root, DPDK and embnic[torch])
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

from tbutil import REPO, assert_gone, build_dataplane, cleanup, needs_root, run_dir, tb_name  # noqa: E402,F401

from embnic.client_lib.client import EmbeddingClient  # noqa: E402
from embnic.client_lib.config import load_config, parse_config  # noqa: E402
from embnic.testbed.net import topology as T  # noqa: E402
from embnic.testbed.training import dlrm_workers as W  # noqa: E402
from embnic.testbed.training.train import load_training_data  # noqa: E402

SHARED_TOML = REPO / "examples" / "testbed-shared.toml"
TOL = dict(rtol=1e-6, atol=1e-7)
STEPS, BATCH, EMPTY = 3, 32, (1, 1)


def two_worker_cfg():
    """testbed-shared.toml cut down: clients 1, 2 (one host), shards 0, 1, three small tables."""
    raw = tomllib.loads(SHARED_TOML.read_text())
    raw["clients"] = [c for c in raw["clients"] if c["id"] in (1, 2)]
    raw["shards"] = [s for s in raw["shards"] if s["id"] in (0, 1)]
    raw["tables"] = [{"id": i, "name": n, "rows": 4096, "dim": 4, "optimizer": o, "lr": 0.05}
                     for i, (n, o) in enumerate((("a", "adagrad"), ("b", "sgd"), ("c", "adagrad")))]
    return parse_config(raw, SHARED_TOML)


@needs_root
def test_two_torchrun_workers_through_the_card_equal_the_reference(run_dir, tmp_path, cleanup):  # noqa: F811
    build_dataplane()
    cfg = two_worker_cfg()
    name = tb_name("w")
    cleanup.append(name)
    topo = T.Topology.from_config(cfg, name)
    assert topo.client_ns(1) == topo.client_ns(2)
    out = tmp_path / "workers"
    tb = T.Testbed(topo, run_dir).up()
    try:
        tb.target.reset_counters()
        argv = ["ip", "netns", "exec", topo.client_ns(1), sys.executable, "-m", "torch.distributed.run",
                "--nproc-per-node", "2", "-m", "embnic.testbed.training.dlrm_workers", "-c", str(tb.config_path),
                "--client-id-base", "1", "--steps", str(STEPS), "--batch-size", str(BATCH),
                "--empty-bags", f"{EMPTY[0]}:{EMPTY[1]}", "--out", str(out), "--check"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        counters = tb.target.counters()
        tcfg = tb.cfg
        ref = W.reference_run(tcfg, load_training_data(tcfg)[0],
                              W.Plan(world=2, steps=STEPS, batch_size=BATCH, seed=tcfg.seed,
                                     empty_bags=frozenset({EMPTY})))
        want = {t: ks for t, (ks, _, _) in ref.tables.state_dict().items() if ks.size}
        with T.in_netns(topo.client_ns(1)):
            reader = EmbeddingClient(tcfg, 1)
        with reader:
            got = reader.lookup(want)
    finally:
        tb.down()
    recs = [json.loads((out / f"worker-{k}.json").read_text()) for k in range(2)]
    for k, rec in enumerate(recs):
        assert rec["rank"] == k and rec["client_id"] == k + 1 and len(rec["loss"]) == STEPS
        torch.testing.assert_close(torch.tensor(rec["loss"], dtype=torch.float64),
                                   torch.tensor(ref.loss[k], dtype=torch.float64), **TOL)
        params = torch.load(out / f"worker-{k}.pt")
        assert params.keys() == ref.params.keys()
        for p, v in ref.params.items():
            torch.testing.assert_close(params[p], v, **TOL)
    # one host: one address, two UDP ports; each rank did its own rounds through the card
    assert recs[0]["address"][0] == recs[1]["address"][0] == "10.77.0.2"
    assert recs[0]["address"][1] != recs[1]["address"][1]
    # rank 0: a lookup and an update round per step; rank 1 none at its empty step (no ids)
    assert recs[0]["client"]["messages_sent"] > recs[1]["client"]["messages_sent"] > 0
    assert sum(len(k) for k in want.values()) > 0
    for t, keys in want.items():
        torch.testing.assert_close(torch.from_numpy(got[t]), torch.from_numpy(ref.tables.lookup({t: keys})[t]), **TOL)
    fbt = counters["types"]
    assert fbt["UPDATE_REQ"] > 0 and fbt["LOOKUP_REQ"] + fbt["UPDATE_REQ"] >= sum(
        rec["client"]["messages_sent"] for rec in recs)
    # --check: rank 0 computed the same reference and found the same
    check = recs[0]["check"]
    assert check["ok"] is True and check["rows"] == sum(len(k) for k in want.values()) and recs[1]["check"] is None
    assert "check: every rank's losses, the dense parameters and" in r.stdout and "equal the one-process" in r.stdout
    assert_gone(name)


def test_check_against_reference_finds_a_difference():
    """--check's comparison is not vacuous: one changed loss, parameter or row makes it fail."""
    cfg = two_worker_cfg()
    tr = load_training_data(cfg, max_rows=400)[0]
    plan = W.Plan(world=2, steps=2, batch_size=8, seed=cfg.seed)
    ref = W.reference_run(cfg, tr, plan)
    rows = {t: (ks, ref.tables.lookup({t: ks})[t]) for t, (ks, _, _) in ref.tables.state_dict().items() if ks.size}

    def lookup(req, bump=None):
        out = {t: rows[t][1].copy() for t in req}
        if bump is not None:
            out[bump][0, 0] += 1e-3
        return out

    assert W.check_against_reference(cfg, tr, plan, ref.loss, ref.params, lookup)["ok"] is True
    bad_loss = [list(ref.loss[0]), [x + 1e-4 for x in ref.loss[1]]]
    assert W.check_against_reference(cfg, tr, plan, bad_loss, ref.params, lookup)["ok"] is False
    first = next(k for k, v in ref.params.items() if v.numel())  # (the tables' placeholders are empty)
    bad_params = {k: v + 1e-3 if k == first else v for k, v in ref.params.items()}
    assert W.check_against_reference(cfg, tr, plan, ref.loss, bad_params, lookup)["ok"] is False
    c = W.check_against_reference(cfg, tr, plan, ref.loss, ref.params, lambda req: lookup(req, next(iter(rows))))
    assert c["ok"] is False and c["rows_max_abs_diff"] > 0 and "DIFFER" in W.check_line(c)


def _main(monkeypatch, capsys, config, base, world=2, local=2, rank=0):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    rc = W.main(["-c", str(config), "--client-id-base", str(base), "--steps", "1"])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_a_wrong_rank_to_client_mapping_is_one_line_exit_2(monkeypatch, capsys):
    # clients 2 and 3 are on two hosts: two ranks of one torchrun host cannot be both
    rc, err = _main(monkeypatch, capsys, SHARED_TOML, 2)
    assert rc == 2 and len(err) == 1, err
    assert "rank 0 -> client 2 at 10.77.0.2, rank 1 -> client 3 at 10.77.0.3" in err[0]
    # said once per host: local rank 1 finds the same and exits 2 quietly
    monkeypatch.setenv("LOCAL_RANK", "1")
    rc, err = _main(monkeypatch, capsys, SHARED_TOML, 2, rank=1)
    assert rc == 2 and err == []
    monkeypatch.delenv("LOCAL_RANK")
    # client 5 does not exist
    rc, err = _main(monkeypatch, capsys, SHARED_TOML, 4)
    assert rc == 2 and len(err) == 1 and "rank 1 maps to client 5" in err[0] and "clients: 1, 2, 3, 4" in err[0]
    # two nodes of two ranks: clients 1,2 on one host and 3,4 on the other is right (it gets as far
    # as binding: this host has no 10.77.0.2, one line naming the client and its address)
    rc, err = _main(monkeypatch, capsys, SHARED_TOML, 1, world=4, local=2, rank=0)
    assert rc == 2 and len(err) == 1 and "cannot bind client 1 to 10.77.0.2:40001" in err[0], err
    # outside torchrun
    monkeypatch.delenv("RANK", raising=False)
    assert W.main(["-c", str(SHARED_TOML), "--client-id-base", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "$RANK is not set" in err[0] and "torchrun" in err[0]


def test_batches_of_the_ranks_tile_the_data_and_mapping_is_checked_in_order():
    rows = [W.batch_rows(10, k, r, 2, 3) for k in range(2) for r in range(2)]
    np.testing.assert_array_equal(np.concatenate(rows), np.arange(12) % 10)
    cfg = load_config(SHARED_TOML)
    assert W.client_ids(cfg, 1, 4, 2) == [1, 2, 3, 4]
    assert W.client_ids(cfg, 3, 2, 2) == [3, 4]
    with pytest.raises(W.WorkerMappingError, match="not a multiple"):
        W.client_ids(cfg, 1, 3, 2)


def test_the_documented_entry_point_runs_the_workers():
    """``-m embnic.testbed.training.dlrm_workers``: its usage, and one line and exit 2 outside torchrun."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    r = subprocess.run([sys.executable, "-m", "embnic.testbed.training.dlrm_workers", "--help"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "-m embnic.testbed.training.dlrm_workers" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "embnic.testbed.training.dlrm_workers", "-c", str(SHARED_TOML),
                        "--client-id-base", "1"], capture_output=True, text=True, env=env, timeout=120)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and "$RANK is not set" in err[0], r.stderr
