"""Jumbo frames through the card on net_af_packet (docs/control-socket.md, `--mtu`).

A veth pair at MTU 9000 in a namespace of its own: a one-frame 1114-key lookup (a 9014-byte
frame) sent by the kernel from one end reaches the card on the other end whole and leaves on its
route; without `--mtu` and the PMD's frame size from it, the same frame arrives cut short and is
dropped as `truncated` (not `bad_ip`).
Run alone: sudo python3 -m pytest -q tests/dataplane/test_jumbo.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from embnic.client_lib import codec
from embnic.client_lib.consts import DType
from embnic.control.netns import Netns, exec_argv
from embnic.testbed.bench.dataplane import BENCH_CARD_IP, BENCH_CLIENTS, CardProcess, program_card

pytestmark = [pytest.mark.dataplane, pytest.mark.root]

TAG = f"{os.getpid() % 100000}"
NS, A, B = f"enJ{TAG}", f"eJa{TAG}", f"eJb{TAG}"
MTU = 9000


@pytest.fixture
def veth():
    with Netns.create(NS) as ns:
        # A is client 1 of the benchmark's table (the card takes a request only from its client's MAC)
        ns.veth(A, B, mac=BENCH_CLIENTS[0]["mac"], mtu=MTU)
        for dev in (A, B):
            ns.link_up(dev)
        ns.add_address(A, "10.99.0.2/24")
        ns.neigh_permanent(A, BENCH_CARD_IP, "02:00:00:99:00:01")
        yield


def _send_jumbo() -> int:
    n = (MTU - 20 - 8 - 44 - 16) // 8  # 1114 keys of one table: one 9000-byte datagram
    keys = np.arange(n, dtype=np.uint64)
    directory = codec.make_directory([0], [16], [DType.FP32], [n])
    (payload,) = codec.encode_lookup(msg_id=5, client_id=1, shard_id=0, directory=directory, keys=keys, mtu=MTU)
    code = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('10.99.0.2', 40001)); "
            f"s.sendto(bytes.fromhex('{payload.hex()}'), ('{BENCH_CARD_IP}', 7878))")
    subprocess.run(exec_argv(NS, [sys.executable, "-c", code]), check=True)
    return 14 + 20 + 8 + len(payload)


def _run(card_bin, tmp_path, vdev: str, args: list[str]) -> dict:
    card = CardProcess(card_bin, [vdev, "net_null0,no-rx=1"], lcores="0", port_ips={0: BENCH_CARD_IP}, netns=NS,
                       args=args, log=tmp_path / "card.log")
    card.start()
    try:
        program_card(card, 1)
        _send_jumbo()
        # the kernel also sends IPv6/ARP chatter on the veth: wait for the lookup itself
        deadline = 30
        c = card.counters()
        t0 = time.monotonic()
        while c["types"]["LOOKUP_REQ"] + c["drops"]["truncated"] == 0 and time.monotonic() - t0 < deadline:
            time.sleep(0.05)
            c = card.counters()
        return c
    finally:
        card.stop()
        card.cleanup()


def test_jumbo_frame_passes_with_mtu(veth, card_bin, tmp_path):
    framesz = -(-(MTU + 18 + 128) // 1024) * 1024  # as the testbed gives the PMD (topology.vdevs)
    c = _run(card_bin, tmp_path, f"net_af_packet0,iface={B},framesz={framesz},blocksz={4 * framesz},framecnt=512",
             ["--mtu", str(MTU)])
    assert c["types"]["LOOKUP_REQ"] == 1, c
    assert c["ports"][1]["tx_frames"] == 1 and c["ports"][1]["tx_bytes"] == 14 + MTU
    assert c["drops"]["truncated"] == 0 and c["drops"]["bad_ip"] == 0


def test_jumbo_frame_cut_short_is_truncated(veth, card_bin, tmp_path):
    c = _run(card_bin, tmp_path, f"net_af_packet0,iface={B}", [])
    assert c["drops"]["truncated"] == 1 and c["drops"]["bad_ip"] == 0, c["drops"]
    assert c["types"]["LOOKUP_REQ"] == 0
