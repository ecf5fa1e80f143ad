"""``embnic bench dataplane --target bmv2``: the same frames through the P4 card on BMv2 and
through the DPDK card, in one run.

Both read the dataplane benchmark's pcap (:func:`embnic.testbed.bench.dataplane.make_bench_pcap`:
2048 request frames, lookups and 2-fragment updates, clients 1-2 → shards 0-3) from a file and
forward every frame to one output port:

* DPDK card: ``embnic-dp`` on one lcore, ``net_pcap`` (infinite_rx) → ``net_null``; frames/s from
  its counters over ``seconds`` (:func:`~embnic.testbed.bench.dataplane.measure_card`).
* BMv2: ``simple_switch --use-files`` reading the pcap ``passes`` times (fresh message ids each
  pass), writing the output pcap; frames/s = forwarded frames over the span of the output
  pcap's timestamps (BMv2 stamps each frame when it writes it).

Results merge into ``bench.json`` under ``dataplane``: ``bmv2_mpps``, ``bmv2_frames``,
``bmv2_card_mpps`` (the DPDK card's figure of the same run) and ``ratio_card_bmv2``.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from embnic.control import bmv2, bmv2_pcap, bmv2_runtime
from embnic.control.runstate import require_root
from embnic.testbed.bench.dataplane import (BENCH_CARD_IP, BENCH_CLIENTS, BENCH_SHARDS, CARD_1LCORE,
                                            make_bench_pcap, measure_card)
from embnic.testbed.bench.results import merge_json


def _pcap_records(path: Path) -> list[tuple[float, bytes]]:
    """(timestamp s, frame) of every record of a classic little-endian pcap."""
    data = Path(path).read_bytes()
    out, off = [], 24
    while off + 16 <= len(data):
        sec, usec, incl, _ = struct.unpack_from("<IIII", data, off)
        out.append((sec + usec / 1e6, data[off + 16:off + 16 + incl]))
        off += 16 + incl
    return out


def _with_msg_id_offset(frame: bytes, add: int) -> bytes:
    """``frame`` with ``add`` added to its embnic msg_id (Ethernet+IPv4+UDP, header at 42)."""
    mid = struct.unpack_from(">I", frame, 42 + 8)[0]
    return frame[:50] + struct.pack(">I", (mid + add) & 0xFFFFFFFF) + frame[54:]


def measure_bmv2(pcap: Path, workdir: Path, passes: int = 2) -> dict:
    """BMv2 forwarding rate on the bench pcap: ``{mpps, frames, seconds, drops}``.

    Raises:
        Bmv2Error / MissingDependencyError: the tools are missing or the switch failed.
    """
    json_path = bmv2.compile_program(workdir / "p4")
    frames = [f for _, f in _pcap_records(pcap)]
    n_msgs = max(struct.unpack_from(">I", f, 50)[0] for f in frames) + 1
    seq = [(0, _with_msg_id_offset(f, p * n_msgs)) for p in range(passes) for f in frames]
    ports = [bmv2_runtime.CardPortAddr(0, "02:00:00:99:00:01", BENCH_CARD_IP),
             bmv2_runtime.CardPortAddr(1, "02:00:00:99:00:03", "10.99.1.1")]
    routes = [bmv2_runtime.PeerEntry(s["shard"], 1, s["mac"], s["ip"], s["udp_port"]) for s in BENCH_SHARDS]
    clients = [bmv2_runtime.PeerEntry(c["client"], 1, c["mac"], c["ip"], c["udp_port"]) for c in BENCH_CLIENTS]
    r = bmv2_pcap.run_pcap_files(json_path, seq, bmv2_runtime.table_commands(ports, routes, clients), workdir / "run",
                                 nb_ports=2, timeout=600)
    out = _pcap_records(workdir / "run" / "p1_out.pcap")
    span = out[-1][0] - out[0][0] if len(out) > 1 else 0.0
    return {"mpps": (len(out) - 1) / span / 1e6 if span > 0 else 0.0, "frames": len(out), "seconds": span,
            "input_frames": len(seq), "drops": {k: v for k, v in r.counters["drops"].items() if v}}


def run(out_dir: Path, seconds: float = 5.0, **kw: Any) -> dict:
    """Measure both cards on the same frames and merge the figures into ``out_dir/bench.json``.

    Returns:
        ``{bmv2_mpps, bmv2_frames, bmv2_seconds, bmv2_drops, bmv2_card_mpps, ratio_card_bmv2, setup}``.
    Raises:
        NeedsRootError: not root. MissingDependencyError: p4c/simple_switch missing.
    """
    require_root("the bmv2 dataplane benchmark", why="it runs DPDK (EAL) and network namespaces",
                 example="sudo embnic bench dataplane --target bmv2")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from embnic.control.dpdk_proc import build_card

    pcap_path = out_dir / "bench_dataplane.pcap"
    make_bench_pcap(pcap_path, int(kw.get("frames", 2048)))
    b = measure_bmv2(pcap_path, out_dir / "bench_bmv2", passes=int(kw.get("passes", 2)))
    binary = Path(kw["binary"]) if kw.get("binary") else build_card()
    c = measure_card(binary, [f"net_pcap0,rx_pcap={pcap_path},infinite_rx=1", "net_null0,no-rx=1"],
                     CARD_1LCORE, seconds, float(kw.get("warmup", 1.0)))
    res = {"bmv2_mpps": b["mpps"], "bmv2_frames": b["frames"], "bmv2_seconds": round(b["seconds"], 3),
           "bmv2_drops": b["drops"], "bmv2_card_mpps": c["mpps"],
           "ratio_card_bmv2": c["mpps"] / b["mpps"] if b["mpps"] else None,
           "bmv2_setup": "same pcap: embnic-dp -l 0 net_pcap(infinite_rx) -> net_null, counters over "
                         f"{seconds:g} s; simple_switch --use-files reading it {kw.get('passes', 2)}x "
                         "(fresh msg ids per pass), rate from the output pcap's timestamps"}
    path = out_dir / "bench.json"
    cur = {}
    if path.exists():
        try:
            cur = json.loads(path.read_text()).get("dataplane", {})
        except json.JSONDecodeError:
            cur = {}
    merge_json(path, "dataplane", {**cur, **res})
    return res
