"""The header ring: run to completion never fills it with its own frames; a full ring drops and
counts (ring_full), never blocks, and loses no mbuf.

Run to completion (``-l 0``) each port's burst leaves the ring before the next port is read, so
three ports that deliver a burst each at once (3 × 3000 lookups from pcap files, as fast as
net_pcap reads them) give no ``ring_full`` — with the default ring and burst, and with a ring of
one burst (``--ring-size 64 --burst 64``). Before, the RX stage read a burst from every port
and the TX stage took one: 1960 ``ring_full`` of 9000 frames.
With RX and TX on two lcores and the TX stage paused (``pause {"stage": "tx"}``), the ring
(64) fills and the rest of 128 frames is dropped as ``ring_full``; after ``resume`` the 64 that
waited leave.
Run alone: sudo python3 -m pytest -q tests/dataplane/test_ring_full.py
"""
from __future__ import annotations

import time

import pytest

from conformance import CardPort, Peer, Suite, read_pcap, write_pcap
from embnic.client_lib.consts import MsgType
from embnic.control.targets.dpdk.process import CardProcess
from drain import wait_drained

pytestmark = [pytest.mark.dataplane, pytest.mark.root]

C1 = Peer("client", 1, 0, "02:00:00:00:01:01", "10.3.0.2", 40001)
S0 = Peer("shard", 0, 2, "02:00:00:00:02:00", "10.3.2.10", 7878)
PORTS = [CardPort(0, "10.3.0.1"), CardPort(1, "10.3.1.1"), CardPort(2, "10.3.2.1"), CardPort(3, "10.3.3.1")]
#: one client per input port, the shard behind port 3 (net_null: takes every frame)
CLIENTS = [Peer("client", 1 + p, p, f"02:00:00:00:01:0{p}", f"10.3.{p}.2", 40001 + p) for p in range(3)]
SHARD = Peer("shard", 0, 3, "02:00:00:00:02:00", "10.3.3.10", 7878)
PER_PORT = 3000


def _program(card: CardProcess, peers) -> None:
    for p in peers:
        c = p.cmd()
        card.call(c.pop("cmd"), **c)


@pytest.mark.parametrize("ring_burst", [None, (64, 64)], ids=["default", "ring64_burst64"])
def test_run_to_completion_never_fills_the_ring_with_its_own_frames(card_bin, tmp_path, ring_burst):
    s = Suite(PORTS, CLIENTS, [SHARD])
    vdevs = []
    for c in CLIENTS:
        frames = [s.message(c, MsgType.LOOKUP_REQ, msg_id=c.id << 20 | m, client_id=c.id, shard_id=0,
                            num_keys=4)[0] for m in range(PER_PORT)]
        write_pcap(tmp_path / f"in{c.port}.pcap", frames)
        vdevs.append(f"net_pcap{c.port},rx_pcap={tmp_path / f'in{c.port}.pcap'},"
                     f"tx_pcap={tmp_path / f'out{c.port}.pcap'}")
    vdevs.append("net_null0,no-rx=1")
    args = ["--paused"] + (["--ring-size", str(ring_burst[0]), "--burst", str(ring_burst[1])] if ring_burst else [])
    card = CardProcess(card_bin, vdevs, lcores="0", args=args, log=tmp_path / "card.log")
    card.start()
    try:
        _program(card, CLIENTS + [SHARD])
        card.call("resume")
        c = wait_drained(card, 3 * PER_PORT, timeout=120)
    finally:
        rc = card.stop()
        card.cleanup()
    assert rc == 0
    assert c["drops"]["ring_full"] == 0, c["drops"]
    assert {k: v for k, v in c["drops"].items() if v} == {}
    assert c["ports"][3]["tx_frames"] == 3 * PER_PORT and c["types"]["LOOKUP_REQ"] == 3 * PER_PORT
    assert c["ring"]["high_water"] <= (ring_burst[1] if ring_burst else 32)
    assert c["mempool"]["in_use"] == 0


def test_full_ring_drops_and_counts(card_bin, tmp_path):
    s = Suite([CardPort(0, "10.3.0.1"), CardPort(1, "10.3.1.1"), CardPort(2, "10.3.2.1")], [C1], [S0])
    frames = [s.message(C1, MsgType.LOOKUP_REQ, msg_id=m, client_id=1, shard_id=0, num_keys=4)[0]
              for m in range(128)]
    write_pcap(tmp_path / "in0.pcap", frames)
    write_pcap(tmp_path / "empty.pcap", [])
    vdevs = [f"net_pcap0,rx_pcap={tmp_path / 'in0.pcap'},tx_pcap={tmp_path / 'out0.pcap'}",
             f"net_pcap1,rx_pcap={tmp_path / 'empty.pcap'},tx_pcap={tmp_path / 'out1.pcap'}",
             f"net_pcap2,rx_pcap={tmp_path / 'empty.pcap'},tx_pcap={tmp_path / 'out2.pcap'}"]
    card = CardProcess(card_bin, vdevs, lcores="0,1", args=["--paused", "--ring-size", "64", "--burst", "64"],
                       log=tmp_path / "card.log")
    card.start()
    try:
        _program(card, [S0, C1])
        card.call("pause", stage="tx")
        card.call("resume", stage="rx")
        deadline = time.monotonic() + 30
        while True:  # RX reads all 128: 64 wait in the ring, 64 are dropped
            c = card.counters()
            if c["ports"][0]["rx_frames"] == 128 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        held = c
        card.call("resume", stage="tx")
        c = wait_drained(card, len(frames), mbufs_back=True)
    finally:
        rc = card.stop()
        card.cleanup()
    assert rc == 0
    assert held["ring"]["count"] == 64 and held["drops"]["ring_full"] == 64, held
    assert c["ring"]["size"] == 64 and c["ring"]["high_water"] == 64
    assert {k: v for k, v in c["drops"].items() if v} == {"ring_full": 64}
    assert c["ports"][2]["tx_frames"] == 64 == len(read_pcap(tmp_path / "out2.pcap"))
    assert c["mempool"]["in_use"] == 0, "dropped mbufs not returned to the pool"
