"""The state map's two ways on the PNA pipeline (p4/state_map.p4): messages whose home slot is
the same (DPDK's CRC-32C, p4prog.state_slot(..., arch="pna")) take the home slot, then its
neighbour (home ^ 1); a third one while both are live is state_full; a reply finds its message
in either way and frees it; a message after that takes the home slot again. Client 2 and shard
0 share card port 1, so every frame enters on one port, in order.
Run alone: sudo python3 -m pytest -q tests/p4/test_p4dpdk_state_ways.py
"""
from __future__ import annotations

import collections

import pytest

from conformance import Suite, check_outputs, read_pcap
from embnic.client_lib.consts import MsgType
from embnic.control.targets import p4program as p4prog
from embnic.control.targets.p4dpdk.target import SwxProcess

from test_p4dpdk_conformance import CARD_MACS, _entry

pytestmark = [pytest.mark.root, pytest.mark.slow]


def same_home(client_id: int, n: int, start: int = 50_000) -> tuple[int, list[int]]:
    """A home slot and ``n`` msg_ids of ``client_id`` that all hash to it on PNA."""
    by = collections.defaultdict(list)
    for m in range(start, start + 200_000):
        s = p4prog.state_slot(client_id, m, arch="pna")
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
                        [_entry(x) for x in s.route_cmds()], [_entry(x) for x in s.client_cmds()])
        sw.resume()
        sw.wait_drained(len(s.frames))
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
