"""A full header ring drops and counts (ring_full) and never blocks; no mbuf is lost.

Run to completion with --ring-size 64 --burst 64: each loop the RX stage reads a burst of 64
frames on port 0 (the ring is then full) and 64 on port 1 (all dropped as ring_full) before the
TX stage empties the ring, so exactly 64 of the 128 frames are dropped.
Run alone: sudo python3 -m pytest -q tests/dataplane/test_ring_full.py
"""
from __future__ import annotations

import pytest

from conformance import CardPort, Peer, Suite, read_pcap, write_pcap
from embnic.client_lib.consts import MsgType
from embnic.control.dpdk_proc import CardProcess, wait_drained

pytestmark = [pytest.mark.dataplane, pytest.mark.root]

C1 = Peer("client", 1, 0, "02:00:00:00:01:01", "10.3.0.2", 40001)
S0 = Peer("shard", 0, 2, "02:00:00:00:02:00", "10.3.2.10", 7878)


def test_ring_full_drops_and_counts(card_bin, tmp_path):
    s = Suite([CardPort(0, "10.3.0.1"), CardPort(1, "10.3.1.1"), CardPort(2, "10.3.2.1")], [C1], [S0])
    frames = [s.message(C1, MsgType.LOOKUP_REQ, msg_id=m, client_id=1, shard_id=0, num_keys=4)[0]
              for m in range(128)]
    write_pcap(tmp_path / "in0.pcap", frames[:64])
    write_pcap(tmp_path / "in1.pcap", frames[64:])
    write_pcap(tmp_path / "empty.pcap", [])
    vdevs = [f"net_pcap0,rx_pcap={tmp_path / 'in0.pcap'},tx_pcap={tmp_path / 'out0.pcap'}",
             f"net_pcap1,rx_pcap={tmp_path / 'in1.pcap'},tx_pcap={tmp_path / 'out1.pcap'}",
             f"net_pcap2,rx_pcap={tmp_path / 'empty.pcap'},tx_pcap={tmp_path / 'out2.pcap'}"]
    card = CardProcess(card_bin, vdevs, lcores="0", args=["--paused", "--ring-size", "64", "--burst", "64"])
    card.start()
    try:
        for p in (S0, C1):
            c = p.cmd()
            card.call(c.pop("cmd"), **c)
        card.call("resume")
        c = wait_drained(card, len(frames))
    finally:
        rc = card.stop()
        card.cleanup()
    assert rc == 0
    assert c["ring"]["size"] == 64 and c["ring"]["high_water"] == 64
    assert c["drops"]["ring_full"] == 64
    assert {k: v for k, v in c["drops"].items() if v} == {"ring_full": 64}
    assert c["ports"][2]["tx_frames"] == 64 == len(read_pcap(tmp_path / "out2.pcap"))
    assert c["mempool"]["in_use"] == 0, "dropped mbufs not returned to the pool"
