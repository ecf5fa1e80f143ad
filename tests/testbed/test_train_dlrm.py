"""`--model dlrm`: TorchRec's DLRM with its tables on the shards (embnic.testbed.training.dlrm).

* through two UDP shards it computes exactly what it computes with in-process tables (same
  losses, same AUC, identical final tables), one lookup and one update round per step;
* `embnic train --model dlrm` runs and writes its JSON; tables of different dims are a usage
  error; without the embnic[torch] extra it says in one line what to install and exits 2.

Run alone: python3 -m pytest -q tests/testbed/test_train_dlrm.py   (the torch tests need embnic[torch])
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from embnic.client_lib.config import parse_config
from embnic.cli.main import cli
from embnic.testbed.training import criteo

REPO = Path(__file__).resolve().parents[2]
CFG = str(REPO / "examples" / "cluster.toml")
STEPS = 3
BATCH = 64

# makes torch, torchrec and fbgemm_gpu unimportable in a child process
BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'torchrec', 'fbgemm_gpu'):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
from embnic.cli.main import main
sys.argv = ['embnic'] + sys.argv[1:]
main()
"""


def _cfg(tables):
    return parse_config({
        "cluster": {"seed": 5, "timeout_ms": 100, "retries": 30},
        "tables": tables,
        "shards": [{"id": i, "ip": "127.0.0.1", "port": 1 + i} for i in range(2)],
        "clients": [{"id": 3, "ip": "127.0.0.1", "port": 1}],
    })


def test_dlrm_through_udp_shards_equals_in_process():
    pytest.importorskip("torchrec")
    from embnic.client_lib.client import EmbeddingClient
    from embnic.client_lib.local import LocalBackend
    from embnic.testbed.training.dlrm import train_dlrm
    from embnic.testbed.server.runner import ServerCluster
    from embnic.testbed.training.train import load_training_data

    cfg = _cfg(criteo.default_tables(rows=4096, dim=8))
    tr, va = load_training_data(cfg, max_rows=600)
    local = LocalBackend(cfg)
    ref = train_dlrm(cfg, tr, steps=STEPS, batch_size=BATCH, backend=local, eval_data=va)
    with ServerCluster(cfg) as cl:
        with EmbeddingClient(cl.cfg, 3, bind=("127.0.0.1", 0)) as client:
            res = train_dlrm(cl.cfg, tr, steps=STEPS, batch_size=BATCH, backend=client, eval_data=va)
            stats = client.stats
    assert res.loss == ref.loss and len(res.loss) == STEPS  # bit-identical floats
    assert res.auc == ref.auc and 0.0 < res.auc < 1.0
    assert res.ids == ref.ids == STEPS * BATCH * 26  # the training steps (as the FM model counts)
    got, want = cl.state_dict(), local.state_dict()
    assert got.keys() == want.keys() and sum(len(k) for k, _, _ in want.values()) > 0
    for t in want:
        for a, b in zip(got[t], want[t]):
            np.testing.assert_array_equal(a, b)
    # a lookup round (forward) and an update round (backward) per step, then the evaluation
    assert stats.rounds == 2 * STEPS + -(-len(va.labels) // 1024)
    # the dense parameters trained too, identically
    for k, v in ref.params.items():
        assert np.array_equal(v.numpy(), res.params[k].numpy()), k


def test_cli_train_dlrm_local_writes_json(tmp_path):
    pytest.importorskip("torchrec")
    out = tmp_path / "d.json"
    r = CliRunner().invoke(cli, ["train", "-c", CFG, "--model", "dlrm", "--local", "--steps", "2",
                                 "--batch-size", "64", "--max-rows", "400", "--json-out", str(out)])
    assert r.exit_code == 0, r.output
    assert "step     2" in r.output and "final AUC" in r.output
    rep = json.loads(out.read_text())
    assert rep["model"] == "dlrm" and len(rep["loss"]) == 2 and all(np.isfinite(rep["loss"]))


def test_cli_train_dlrm_tables_of_two_dims_is_a_usage_error(tmp_path):
    pytest.importorskip("torchrec")
    tables = "\n".join(f'[[tables]]\nid = {i}\nname = "C{i + 1}"\nrows = 100\ndim = {8 if i else 4}\n' for i in range(26))
    conf = tmp_path / "c.toml"
    conf.write_text(f'[cluster]\nseed = 3\n{tables}\n[[shards]]\nid = 0\nip = "127.0.0.1"\nport = 7000\n'
                    f'[[clients]]\nid = 1\nip = "127.0.0.1"\nport = 7001\n')
    r = CliRunner().invoke(cli, ["train", "-c", str(conf), "--model", "dlrm", "--local", "--steps", "1",
                                 "--max-rows", "100"])
    assert r.exit_code == 2, r.output
    assert "DLRM needs one embedding dim for every table, got [4, 8]" in r.output


@pytest.mark.parametrize("cmd", [["train", "-c", CFG, "--model", "dlrm", "--local", "--steps", "1"]])
def test_without_the_torch_extra_one_line_and_exit_2(cmd):
    r = subprocess.run([sys.executable, "-c", BLOCK_TORCH, *cmd], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("Error: --model dlrm: ") and "pip install 'embnic[torch]'" in lines[0]
    # the FM model needs no torch
    fm = subprocess.run([sys.executable, "-c", BLOCK_TORCH, "train", "-c", CFG, "--local", "--steps", "1",
                         "--max-rows", "300"], capture_output=True, text=True, timeout=120)
    assert fm.returncode == 0, fm.stderr
