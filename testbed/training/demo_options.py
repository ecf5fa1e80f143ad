"""The demo's options (:class:`DemoOptions`) and defaults: what :func:`~embnic.testbed.training.demo.run_demo`
runs with and :mod:`.demo_report` reports, in a module of their own so that neither imports the other."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

DEFAULT_OUT = "out/demo"
DEFAULT_NAME = "embdemo"
REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO / "examples" / "testbed.toml"


@dataclasses.dataclass
class DemoOptions:
    """Options of :func:`~embnic.testbed.training.demo.run_demo`.

    Attributes:
        config: cluster config with an enabled ``[card]`` (default examples/testbed.toml).
        steps, batch_size: training steps and samples per step.
        out: output directory (report.json, PNGs).
        name: testbed name (prefix of namespaces and interfaces).
        data: Criteo TSV (default: the shipped sample).
        impairment: netem faults on every link during training (None: none).
        netem_backend: ``auto``, ``tc``, ``bpf`` or ``user``.
        kill_shard, kill_at_step: kill that shard's server after that step (fault injection;
            ``kill_at_step`` defaults to 1 and must be below ``steps``, see :func:`check_options`).
        restart: with ``kill_shard``: the shards keep a write-ahead log and checkpoints
            (``--checkpoint-dir``, every ``checkpoint_every`` updates) and the killed shard is
            started again at once with ``--restore``; the run must then complete with the
            losses and final tables of the run without the fault.
        checkpoint_every: logged updates between a shard's checkpoints (with ``restart``).
        check_tables: read every updated row back through the card and compare.
        all_clients: every other client of the config looks up the embeddings of its own
            batches of ``batch_size`` samples through the card while the first one trains
            (lookups only, so the training losses still match the reference run).
        progress: show progress bars (None: when stderr is a terminal).
        rdir: run directory (default ``$EMBNIC_RUN_DIR`` or /run/embnic).
        model: ``"fm"`` (the numpy factorisation machine) or ``"dlrm"`` (TorchRec's DLRM on
            :class:`~embnic.client_lib.torch.RemoteEmbeddingBagCollection`, needs embnic[torch]).
        target: the card: ``dpdk`` (embnic-dp) or ``bmv2`` (the P4 program on simple_switch).
        pmd: the dpdk card's PMD on its veth ends: ``af_packet`` or ``af_xdp``
            (:func:`~embnic.testbed.net.wiring.card_vdev`; ``af_xdp`` needs ``target`` dpdk).
    """

    config: str | os.PathLike = DEFAULT_CONFIG
    steps: int = 40
    batch_size: int = 256
    out: str | os.PathLike = DEFAULT_OUT
    name: str = DEFAULT_NAME
    data: str | os.PathLike | None = None
    impairment: object | None = None
    netem_backend: str = "auto"
    kill_shard: int | None = None
    kill_at_step: int | None = None
    restart: bool = False
    checkpoint_every: int = 16
    check_tables: bool = True
    all_clients: bool = False
    progress: bool | None = None
    rdir: Path | None = None
    model: str = "fm"
    target: str = "dpdk"
    pmd: str = "af_packet"
