"""The P4 card for PNA (p4/pna/, DPDK's SWX pipeline in ``embnic-swx``) in ``embnic bench dataplane``.

The method: docs/bench.md, "embnic bench dataplane, p4dpdk: the P4 card in DPDK's SWX pipeline".
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from embnic.control.targets.p4dpdk import swx as p4dpdk
from embnic.control.targets.base import Peer
from embnic.control.targets.dpdk.process import unique_prefix
from embnic.control.targets.p4dpdk.target import SwxProcess

#: the card's two ports: 0 faces the clients (the frames' destination), 1 the sink
CARD_PORTS = ((0, "02:00:00:99:00:01", "10.99.0.1"), (1, "02:00:00:99:00:04", "10.99.1.1"))


def available() -> str | None:
    """None when the PNA pipeline can be measured here, else one line saying what is missing."""
    return p4dpdk.missing()


def measure_swx(pipe: p4dpdk.Pipeline, vdevs: Sequence[str], seconds: float, warmup: float, *,
                clients: Sequence[dict], shards: Sequence[dict], out_port: int = 1, log_dir: Path,
                window, other_pids: Sequence[int] = (), mbufs: int | None = None) -> dict:
    """The SWX pipeline's rates on ``vdevs``: ``{mpps, gbps, frames, completed_per_s, drops,
    host_drops, others_cpu}`` — frames the pipeline sent on ``out_port`` per second (its port
    statistics; gbps without the 4-byte tx pseudo-header), messages whose whole reply passed per
    second (the P4 card's counter); ``window`` is the benchmark's measuring function
    (``dataplane.rate_window``)."""
    with SwxProcess(pipe, vdevs, log_dir / f"swx-{unique_prefix('s')}", burst=32, mbufs=mbufs) as sw:
        card = sw.card
        # clients behind port 0, where the frames come in (the card takes a request only from its
        # client's port); shards behind out_port (0 too for a workload with replies, which come
        # in on port 0: dataplane.program_card)
        card.program(CARD_PORTS, [Peer.from_fields({**s, "port": out_port}, "shard") for s in shards]
                     + [Peer.from_fields({**c, "port": 0}, "client") for c in clients])
        sw.resume()
        snaps: list[tuple[int, int]] = []  # (bytes out, messages completed) at the window's start and end

        def sample() -> int:
            h = sw.host_counters()["ports"][out_port]
            snaps.append((h["pipeline_out_bytes"] - 4 * h["pipeline_out_frames"],
                          sum(card.counter("messages_completed", 0, 16))))
            return h["pipeline_out_frames"]

        w = window(sample, seconds, warmup, [sw.proc.pid, *other_pids])
        drops = {k: v for k, v in card.counters(len(CARD_PORTS))["drops"].items() if v}
        host = sw.host_counters()
    (b0, m0), (b1, m1) = snaps
    hd = {k: sum(p[k] for p in host["ports"]) for k in ("rx_ring_full", "rx_no_headroom", "tx_full", "tx_bad_meta")}
    return {"mpps": w["rate"] / 1e6, "gbps": (b1 - b0) * 8 / w["dt"] / 1e9, "frames": w["frames"],
            "completed_per_s": (m1 - m0) / w["dt"], "drops": drops,
            "host_drops": {k: v for k, v in hd.items() if v}, "others_cpu": w["others_cpu"], "mempool_ops": None}
