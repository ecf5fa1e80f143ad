"""Every frame accounted on af_packet ports of different frame sizes (docs/control-socket.md,
`too_long_for_port`, `max_frame`).

Two veth pairs at MTU 9000 in a namespace of their own; the card's port 0 on one (vdev
`framesz=5120`: 5088-byte frames), port 1 on the other (`framesz=4096`: 4064-byte frames), with
`--mtu 4000`. A client sends, through port 0, lookups to a shard behind port 1 in frames of
2998 and 4502 bytes: the 2998-byte ones arrive; the 4502-byte ones, which net_af_packet would
drop inside tx_burst while reporting them sent, are dropped by the card as
`too_long_for_port`, counted overall and for port 1, and every received frame is sent or
dropped by a named reason. Each port reports its real largest frame (`info`, `counters`), not
the 1518 the PMD reports; a cluster MTU a port's frames cannot carry is refused at start, naming
the vdev's `framesz` or the interface's MTU.
Run alone: sudo python3 -m pytest -q tests/dataplane/test_frame_size.py
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from embnic.client_lib import codec
from embnic.client_lib.consts import DType
from embnic.control.targets.dpdk.process import CardProcess, DpdkProcError
from embnic.control.netns import Netns, exec_argv

pytestmark = [pytest.mark.dataplane, pytest.mark.root]

TAG = f"{os.getpid() % 100000}"
NS = f"enF{TAG}"
A0, B0, A1, B1 = f"eFa{TAG}", f"eFb{TAG}", f"eFc{TAG}", f"eFd{TAG}"
CARD0, HOST0, CARD1, HOST1 = "10.98.0.1", "10.98.0.2", "10.98.1.1", "10.98.1.2"
CLIENT_PORT, SHARD_PORT = 40001, 7878


@pytest.fixture
def veths():
    """Namespace NS: A0 (client, 10.98.0.2) -- B0 (card port 0), A1 (shard, 10.98.1.2) -- B1 (card
    port 1), every veth at MTU 9000; torn down whatever happens."""
    with Netns.create(NS) as ns:
        for a, b, ip, card in ((A0, B0, HOST0, CARD0), (A1, B1, HOST1, CARD1)):
            ns.veth(a, b, mtu=9000)
            for dev in (a, b):
                ns.link_up(dev)
                ns.offloads_off(dev)  # a veth otherwise hands af_packet UDP checksums left for an offload to fill
            ns.add_address(a, f"{ip}/24")
        # the card never answers ARP for an address it does not own: the client's neighbour entry
        ns.neigh_permanent(A0, CARD0, "02:00:00:98:00:01")
        yield {"a0": ns.links(A0)[0]["address"], "a1": ns.links(A1)[0]["address"]}


def _card(card_bin, tmp_path, framesz0: int, framesz1: int, mtu: int) -> CardProcess:
    vdevs = [f"net_af_packet0,iface={B0},framesz={framesz0},blocksz={4 * framesz0},framecnt=64",
             f"net_af_packet1,iface={B1},framesz={framesz1},blocksz={4 * framesz1},framecnt=64"]
    return CardProcess(card_bin, vdevs, lcores="0", port_ips={0: CARD0, 1: CARD1}, netns=NS,
                       args=["--mtu", str(mtu), "--idle-us", "50"], log=tmp_path / "card.log")


def _lookup(msg_id: int, frame_len: int) -> bytes:
    """One single-fragment lookup datagram whose Ethernet frame is ``frame_len`` bytes."""
    keys = np.arange((frame_len - 14 - 20 - 8 - 44 - 16) // 8, dtype=np.uint64)  # a one-table directory
    (payload,) = codec.encode_table_lookup(msg_id=msg_id, client_id=1, table_id=0, shard_id=0, dim=4,
                                           dtype=DType.FP32, keys=keys, mtu=9000)
    assert 14 + 20 + 8 + len(payload) == frame_len
    return payload


def _send(datagrams: list[bytes]) -> None:
    hexes = [d.hex() for d in datagrams]
    code = ("import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            f"s.bind(('{HOST0}', {CLIENT_PORT}));\n"
            f"for h in {hexes!r}: s.sendto(bytes.fromhex(h), ('{CARD0}', 7878))")
    subprocess.run(exec_argv(NS, [sys.executable, "-c", code]), check=True)


def _shard_socket() -> subprocess.Popen:
    """A UDP socket on the shard's address in NS that prints the length of each datagram it gets."""
    code = ("import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            f"s.bind(('{HOST1}', {SHARD_PORT})); s.settimeout(20); print('ready', flush=True)\n"
            "while True:\n"
            "    try: d = s.recv(65535)\n"
            "    except socket.timeout: break\n"
            "    print(len(d), flush=True)")
    p = subprocess.Popen(exec_argv(NS, [sys.executable, "-u", "-c", code]), stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_frames_too_long_for_a_port_are_dropped_and_counted(veths, card_bin, tmp_path):
    card = _card(card_bin, tmp_path, 5120, 4096, 4000)
    shard = _shard_socket()
    card.start()
    try:
        info = {p["port"]: p for p in card.call("info")["ports"]}
        # the real largest frames: framesz less the TPACKET2 header (the PMD itself says 1518)
        assert (info[0]["max_frame"], info[0]["max_frame_by"]) == (5088, "framesz")
        assert (info[1]["max_frame"], info[1]["max_frame_by"]) == (4064, "framesz")
        card.call("client_add", client=1, port=0, mac=veths["a0"], ip=HOST0, udp_port=CLIENT_PORT)
        card.call("route_add", shard=0, port=1, mac=veths["a1"], ip=HOST1, udp_port=SHARD_PORT)
        small = [_lookup(10 + i, 2998) for i in range(3)]
        big = [_lookup(20 + i, 4502) for i in range(4)]
        _send([small[0], big[0], small[1], big[1], big[2], small[2], big[3]])
        deadline = time.monotonic() + 20
        while True:
            c = card.counters()
            if c["types"]["LOOKUP_REQ"] + c["drops"]["too_long_for_port"] >= 7 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        card.stop()
        card.cleanup()
    got = []
    try:
        out, _ = shard.communicate(timeout=1)
        got = [int(x) for x in out.split()]
    except subprocess.TimeoutExpired:
        shard.kill()
        out, _ = shard.communicate()
        got = [int(x) for x in out.split()]
    p0, p1 = c["ports"]
    assert c["types"]["LOOKUP_REQ"] == 3 and c["drops"]["too_long_for_port"] == 4, c
    assert (p0["too_long_for_port"], p1["too_long_for_port"]) == (0, 4)
    assert (p0["max_frame"], p1["max_frame"]) == (5088, 4064)
    assert p1["tx_frames"] == 3 and p1["tx_bytes"] == 3 * 2998
    # what port 1 says it sent, the shard received: the 3 small lookups, none of the big ones
    assert sorted(got) == [2998 - 42] * 3, got
    # every frame the card took in was sent or dropped by a named reason (the kernel's own
    # chatter on the veths, IPv6 router solicitations and the like, included)
    rx = sum(p["rx_frames"] for p in c["ports"])
    assert rx == sum(p["tx_frames"] for p in c["ports"]) + sum(c["drops"].values())


def test_interface_mtu_bounds_the_largest_frame(veths, card_bin, tmp_path):
    """The kernel discards what exceeds an interface's MTU + 14: port 1 on a veth of MTU 2950
    sends at most 2964-byte frames, though its framesz holds 3040."""
    Netns(NS).link_up(B1, mtu=2950)
    card = _card(card_bin, tmp_path, 3072, 3072, 2900)
    card.start()
    try:
        info = {p["port"]: p for p in card.call("info")["ports"]}
    finally:
        card.stop()
        card.cleanup()
    assert (info[1]["max_frame"], info[1]["max_frame_by"]) == (2964, "interface_mtu")
    assert (info[0]["max_frame"], info[0]["max_frame_by"]) == (3040, "framesz")


@pytest.mark.parametrize("case", ["framesz", "interface_mtu"])
def test_mtu_that_a_port_cannot_send_is_refused_at_start(veths, card_bin, tmp_path, case):
    """--mtu 9000 (the cluster's MTU) with port 1 at the PMD's default framesz (2016-byte frames),
    or on an interface of MTU 1500: the card exits at start naming what to change."""
    if case == "framesz":
        vdev1 = f"net_af_packet1,iface={B1}"
        want = ["port 1", "2016-byte frames", "framesz=2048", "--mtu 9000 needs 9014", "give the vdev framesz=9216"]
    else:
        Netns(NS).link_up(B1, mtu=1500)
        vdev1 = f"net_af_packet1,iface={B1},framesz=9216,blocksz=36864,framecnt=64"
        want = ["port 1", "1514-byte frames", f"interface {B1} has MTU 1500", f"ip link set {B1} mtu 9000"]
    card = CardProcess(card_bin, [f"net_af_packet0,iface={B0},framesz=9216,blocksz=36864,framecnt=64", vdev1],
                       lcores="0", netns=NS, args=["--mtu", "9000"], log=tmp_path / "card.log")
    with pytest.raises(DpdkProcError) as e:
        card.start()
    log = (tmp_path / "card.log").read_text()
    for w in want:
        assert w in log, (w, log[-2000:])
    assert "cannot send a frame of the MTU" in str(e.value) and not card.alive()
