"""RemoteEmbeddingBagCollection through the real card equals TorchRec's fused optimizer.

A namespace testbed (examples/testbed.toml's wiring: 2 clients, the card = embnic-dp on
af_packet vdevs, 2 hash-sharded shards) with three small tables; a few training steps of
:class:`embnic.client_lib.torch.RemoteEmbeddingBagCollection` whose client lives in client 1's
namespace, so every lookup and update is client → card → shard → card → client. The same steps
on TorchRec's sharded EmbeddingBagCollection (DistributedModelParallel, one gloo rank,
table-wise, fbgemm EXACT_ROWWISE_ADAGRAD / EXACT_SGD) give the same pooled embeddings at every
step and the same rows at the end (read back through the card), within
``assert_close``'s ``rtol=1e-6, atol=1e-6`` (outputs) and ``rtol=1e-6, atol=1e-7`` (rows:
torchref ``OUT_TOL``, ``TOL``); the card's counters show the traffic passed it.

Run alone: python3 -m pytest -q tests/testbed/test_torch_card.py   (needs root, DPDK and embnic[torch])
"""
from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client_lib"))  # torchref

from tbutil import TESTBED_TOML, assert_gone, build_dataplane, cleanup, needs_root, run_dir, tb_name  # noqa: E402,F401
from torchref import TOL, TorchRecReference, all_rows, configs, one_rank_group, train_both  # noqa: E402
from torchrec.modules.embedding_configs import PoolingType  # noqa: E402

from embnic.client_lib.client import EmbeddingClient  # noqa: E402
from embnic.client_lib.config import parse_config  # noqa: E402
from embnic.client_lib.torch import RemoteEmbeddingBagCollection  # noqa: E402
from embnic.testbed.net import topology as T  # noqa: E402


def small_testbed_cfg(optimizer: str):
    raw = tomllib.loads(TESTBED_TOML.read_text())
    raw["tables"] = [{"id": i, "name": n, "rows": r, "dim": 4, "optimizer": optimizer, "lr": 0.2, "eps": 1e-8,
                      "init_scale": 0.5} for i, (n, r) in enumerate((("a", 60), ("b", 40), ("c", 25)))]
    return parse_config(raw, TESTBED_TOML)


@needs_root
@pytest.mark.parametrize("optimizer,pooling", [("adagrad", PoolingType.SUM), ("sgd", PoolingType.MEAN)])
def test_training_through_the_card_equals_torchrec(optimizer, pooling, run_dir, cleanup):  # noqa: F811
    build_dataplane()
    cfg = small_testbed_cfg(optimizer)
    name = tb_name("t")
    cleanup.append(name)
    topo = T.Topology.from_config(cfg, name)
    with one_rank_group():
        ref = TorchRecReference(cfg, configs(cfg, pooling))
        tb = T.Testbed(topo, run_dir).up()
        try:
            tcfg = tb.cfg
            tb.target.reset_counters()
            with T.in_netns(topo.client_ns(1)):
                client = EmbeddingClient(tcfg, 1)
            with client:
                assert client.via_card
                ours = RemoteEmbeddingBagCollection(configs(tcfg, pooling), client)
                train_both(tcfg, ours, ref, np.random.default_rng(12), steps=4)
                got = all_rows(client.lookup, tcfg)
                assert client.stats.rounds == 4 * 2 + 1  # a lookup and an update round per step, one read-back
                sent = client.stats.messages_sent
            counters = tb.target.counters()
        finally:
            tb.down()
    for n, rows in got.items():
        torch.testing.assert_close(rows, ref.weight(n), **TOL)
    fbt = counters["types"]
    assert fbt["LOOKUP_REQ"] > 0 and fbt["UPDATE_REQ"] > 0 and fbt["UPDATE_ACK"] > 0
    assert fbt["LOOKUP_REQ"] + fbt["UPDATE_REQ"] >= sent
    assert_gone(name)
