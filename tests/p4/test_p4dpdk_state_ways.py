"""The state map's two ways on the PNA pipeline (p4/state_map.p4): messages whose home slot is
the same (DPDK's CRC-32C, p4ref.state_slot(..., arch="pna")) take the home slot, then its
neighbour (home ^ 1); a third one while both are live is state_full; a reply finds its message
in either way and frees it; a message after that takes the home slot again. And expiry: an
entry idle past state_timeout_us is expired by the next frame that looks at its slot, counted in
state_expired (DPDK 22.11 sent that count to rx_frames[0] before the build split the two-immediate
regadd). Client 2 and shard 0 share card port 1, so every frame enters on one port, in order.
Run alone: sudo python3 -m pytest -q tests/p4/test_p4dpdk_state_ways.py
"""
from __future__ import annotations

import collections

import pytest

from conformance import Suite, check_outputs, read_pcap
from embnic.client_lib.consts import MsgType
from embnic.control.targets.p4dpdk.target import SwxProcess
from drain import wait_swx_drained
from embnic.control.targets.base import Peer
import p4ref

from test_p4dpdk_conformance import CARD_MACS

pytestmark = [pytest.mark.root, pytest.mark.slow]


def same_home(client_id: int, n: int, start: int = 50_000) -> tuple[int, list[int]]:
    """A home slot and ``n`` msg_ids of ``client_id`` that all hash to it on PNA."""
    by = collections.defaultdict(list)
    for m in range(start, start + 200_000):
        s = p4ref.state_slot(client_id, m, arch="pna")
        by[s].append(m)
        if len(by[s]) == n:
            return s, by[s]
    raise AssertionError("no slot with enough msg_ids")


@pytest.fixture(scope="module")
def run(p4dpdk_pipeline, tmp_path_factory):
    s = Suite.default()
    s.frames = []
    c2, s0 = s.clients[2], s.shards[0]
    L, LR = MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY
    home, (a, b, c, d) = same_home(2, 4)
    kw = dict(client_id=2, shard_id=0, num_keys=2)
    s.add_message("A lookup (home)", c2, L, ("fwd", s0), msg_id=a, **kw)
    s.add_message("B lookup (neighbour)", c2, L, ("fwd", s0), msg_id=b, **kw)
    s.add_message("C lookup (both ways held)", c2, L, ("drop", "state_full"), msg_id=c, **kw)
    s.add_message("B reply (found in the neighbour)", s0, LR, ("fwd", c2), msg_id=b, **kw)
    s.add_message("A reply (found at home)", s0, LR, ("fwd", c2), msg_id=a, **kw)
    s.add_message("C reply (never entered)", s0, LR, ("drop", "unsolicited_reply"), msg_id=c, **kw)
    s.add_message("D lookup (home free again)", c2, L, ("fwd", s0), msg_id=d, **kw)
    d_dir = tmp_path_factory.mktemp("swxways")
    inp = s.write_input_pcaps(d_dir)
    outs = {p: d_dir / f"out{p}.pcap" for p in s.ports}
    vdevs = [f"net_pcap{p},rx_pcap={inp[p]},tx_pcap={outs[p]}" for p in sorted(s.ports)]
    with SwxProcess(p4dpdk_pipeline, vdevs, d_dir) as sw:
        sw.card.program([(p.port, CARD_MACS[p.port], p.ip) for p in s.ports.values()],
                        [Peer.from_fields(x) for x in s.route_cmds() + s.client_cmds()])
        sw.resume()
        wait_swx_drained(sw, len(s.frames))
        counters = sw.card.counters(len(s.ports), sorted(s.shards))
        state = sw.card.state_map()
        sw.stop()
    return {"suite": s, "home": home, "ids": (a, b, c, d), "counters": counters, "state": state,
            "out": {p: read_pcap(outs[p]) for p in s.ports}}


def test_frames_and_drops(run):
    problems = check_outputs(run["suite"], run["out"], CARD_MACS, order="message")
    assert not problems, "\n".join(problems)
    assert {k: v for k, v in run["counters"]["drops"].items() if v} == {"state_full": 1, "unsolicited_reply": 1}


def test_both_ways_completed_and_the_home_slot_reused(run):
    assert run["counters"]["completed"]["LOOKUP_REPLY"] == 2
    assert run["counters"]["state"]["expired"] == 0
    d = run["ids"][3]
    assert [(e["slot"], e["client_id"], e["msg_id"], e["state"]) for e in run["state"]] == [
        (run["home"], 2, d, "forwarded")]


#: the entry timeout of the expiry run, and the frames between a request and its late reply: each
#: takes the pipeline microseconds (0.13 Mpps here), so 3000 of them outlast the timeout many times
EXPIRY_TIMEOUT_US = 200
SPACERS = 3000


@pytest.fixture(scope="module")
def expiry(p4dpdk_pipeline, tmp_path_factory):
    """A request answered at once (completes), and a request whose reply comes after SPACERS
    ARP frames the card ignores (its entry expired by then: counted, the reply unsolicited)."""
    from scapy.layers.l2 import ARP, Ether

    s = Suite.default()
    s.frames = []
    c2, s0 = s.clients[2], s.shards[0]
    L, LR = MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY
    kw = dict(client_id=2, shard_id=0, num_keys=2)
    s.add_message("A lookup", c2, L, ("fwd", s0), msg_id=70_001, **kw)
    s.add_message("A reply at once", s0, LR, ("fwd", c2), msg_id=70_001, **kw)
    s.add_message("B lookup", c2, L, ("fwd", s0), msg_id=70_002, **kw)
    spacer = bytes(Ether(src=c2.mac, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=c2.mac, psrc=c2.ip, pdst="10.1.1.99"))
    for i in range(SPACERS):
        s.add(f"spacer {i}", c2.port, spacer, ("drop", "arp_ignored"))
    s.add_message("B reply after its entry expired", s0, LR, ("drop", "unsolicited_reply"), msg_id=70_002, **kw)
    d_dir = tmp_path_factory.mktemp("swxexpiry")
    inp = s.write_input_pcaps(d_dir)
    outs = {p: d_dir / f"out{p}.pcap" for p in s.ports}
    vdevs = [f"net_pcap{p},rx_pcap={inp[p]},tx_pcap={outs[p]}" for p in sorted(s.ports)]
    with SwxProcess(p4dpdk_pipeline, vdevs, d_dir) as sw:
        sw.card.program([(p.port, CARD_MACS[p.port], p.ip) for p in s.ports.values()],
                        [Peer.from_fields(x) for x in s.route_cmds() + s.client_cmds()],
                        state_timeout_us=EXPIRY_TIMEOUT_US)
        sw.resume()
        wait_swx_drained(sw, len(s.frames))
        counters = sw.card.counters(len(s.ports), sorted(s.shards))
        state = sw.card.state_map()
        sw.stop()
    return {"suite": s, "counters": counters, "state": state, "out": {p: read_pcap(outs[p]) for p in s.ports}}


def test_an_idle_entry_expires_and_is_counted(expiry):
    """The late reply's slot was live: the frame that looks at it expires the entry (state_expired
    1), frees it (nothing left in the map) and is dropped as unsolicited_reply; the answered
    message completed before (its entry was young)."""
    c = expiry["counters"]
    assert c["state"]["expired"] == 1
    assert {k: v for k, v in c["drops"].items() if v} == {"arp_ignored": SPACERS, "unsolicited_reply": 1}
    assert c["completed"]["LOOKUP_REPLY"] == 1
    assert expiry["state"] == []
    problems = check_outputs(expiry["suite"], expiry["out"], CARD_MACS, order="message")
    assert not problems, "\n".join(problems)
