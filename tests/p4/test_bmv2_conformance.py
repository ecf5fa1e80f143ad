"""The DPDK card's conformance cases through the P4 card on BMv2 (simple_switch, pcap files).

The same Suite as tests/dataplane/test_conformance.py: every input frame in one global order
(BMv2 reads its input pcaps by timestamp), the exact output frames per port compared frame by
frame (ARP replies included), every drop counted under the same reason, the same forwarded
types, plus what only the P4 card shows directly (the state map's slots).
Where BMv2 must differ from the DPDK card, TARGET_DIFFERENCES below says so; nothing else does.
Run alone: sudo python3 -m pytest -q tests/p4/test_bmv2_conformance.py
"""
from __future__ import annotations

import pytest

from conformance import Suite, check_outputs
from embnic.client_lib import consts
import bmv2_pcap
from embnic.control.targets.bmv2 import runtime as bmv2_runtime
from embnic.control.targets.base import Peer
from embnic.control.targets import p4program as p4prog
import p4ref

pytestmark = [pytest.mark.root, pytest.mark.slow]

#: Every way the BMv2 card differs from the DPDK card on these cases (p4/README.md, "Differences").
TARGET_DIFFERENCES = {
    "drops": "ring_full, no_mbuf, tx_full and too_long_for_port are DPDK resources (header ring, "
             "mempool, TX queue, a PMD's frame size) a P4 pipeline has none of: always 0",
    "completed": "per shard, BMv2 counts completed messages (all reply types together) and keeps "
                 "no latency histogram (its timestamps are the switch's microseconds, not TSC)",
    "tx_bytes": "BMv2 counts a frame's bytes as it entered the switch, before the Ethernet "
                "trailer is trimmed (the frames themselves are exact)",
}
CARD_MACS = {0: "02:cc:00:00:00:00", 1: "02:cc:00:00:00:01", 2: "02:cc:00:00:00:02"}


def card_program(s: Suite) -> bmv2_runtime.CardProgram:
    ports = [bmv2_runtime.CardPortAddr(p.port, CARD_MACS[p.port], p.ip) for p in s.ports.values()]
    return bmv2_runtime.card_program(ports, [Peer.from_fields(c) for c in s.route_cmds() + s.client_cmds()])


@pytest.fixture(scope="module")
def run(bmv2_ready, bmv2_channel, tmp_path_factory):
    s = Suite.default()
    frames = [(f.port, f.data) for f in s.frames]
    want = s.expected_outputs(CARD_MACS)
    r = bmv2_pcap.run_pcap_files(bmv2_ready, frames, card_program(s), tmp_path_factory.mktemp("bmv2conf"),
                                 nb_ports=len(s.ports), shards=sorted(s.shards),
                                 expect_out=sum(len(v) for v in want.values()), channel=bmv2_channel)
    assert r.channel == bmv2_channel
    return {"suite": s, "run": r, "want": want}


def test_output_frames_exact(run):
    """Every expected frame on its port and nothing else, rewritten, checksums right, bodies intact."""
    problems = check_outputs(run["suite"], run["run"].outputs, CARD_MACS)
    assert not problems, "\n".join(problems)


def test_output_frames_in_input_order(run):
    """With one global input order, every port's output is exactly the expected sequence."""
    for port, w in run["want"].items():
        assert run["run"].outputs[port] == [d for _, d in w], f"port {port}"


def test_every_drop_named(run):
    drops = run["run"].counters["drops"]
    assert list(drops) == p4prog.drop_reasons()
    want = run["suite"].expected_drops()
    assert {k: v for k, v in drops.items() if v} == want
    for reason in ("ring_full", "no_mbuf", "tx_full", "too_long_for_port"):  # TARGET_DIFFERENCES["drops"]
        assert drops[reason] == 0


def test_types_and_arp(run):
    c = run["run"].counters
    assert c["types"] == run["suite"].expected_types()
    assert c["arp"]["replies"] == run["suite"].expected_arp_replies()


def test_port_counters_and_conservation(run):
    s, c, want = run["suite"], run["run"].counters, run["want"]
    inputs = s.inputs_by_port()
    assert [p["rx_frames"] for p in c["ports"]] == [len(inputs[p]) for p in sorted(inputs)]
    assert [p["rx_bytes"] for p in c["ports"]] == [sum(len(f.data) for f in inputs[p]) for p in sorted(inputs)]
    assert [p["tx_frames"] for p in c["ports"]] == [len(want[p]) for p in sorted(want)]
    # TARGET_DIFFERENCES["tx_bytes"]: the bytes of each output frame as it came in
    assert [p["tx_bytes"] for p in c["ports"]] == [sum(len(f.data) for f, _ in want[p]) for p in sorted(want)]
    assert sum(p["rx_frames"] for p in c["ports"]) == (sum(p["tx_frames"] for p in c["ports"])
                                                        + sum(c["drops"].values()))


def test_state_map_tracked(run):
    """The map holds exactly the messages in flight, in the reference model's states, each in the
    slot the control plane computes; answered messages are gone."""
    st, model = run["run"].state, run["suite"].state_model()
    by = {k: 0 for k in ("receiving", "forwarded", "replying")}
    for e in st:
        by[e["state"]] += 1
    assert {"entries": len(st), "by_state": by} == run["suite"].expected_state()
    assert {(e["client_id"], e["msg_id"]) for e in st} == set(model.entries)
    for e in st:
        assert e["slot"] == p4ref.state_slots(e["client_id"], e["msg_id"])
        m = model.entries[(e["client_id"], e["msg_id"])]
        assert e["shard_id"] == m["shard"] and e["frag_count"] == m["n_in"]
        # the request's v2 header as the card recorded it (a LOOKUP_REPLY's length is checked
        # against value_len), as tests/dataplane/test_conformance.py checks the DPDK card's dump
        assert (e["msg_type"], e["num_tables"], e["num_keys"], e["value_len"], e["msg_len"]) == (
            m["type"], m["num_tables"], m["num_keys"], m["value_len"], m["msg_len"]), (e["client_id"], e["msg_id"])
    c = run["run"].counters
    assert c["drops"]["state_full"] == 0 and c["state"]["expired"] == 0


def test_state_map_bytes(run):
    """Every slot's body bytes each way are the model's (each distinct fragment once): never more
    than ``msg_len`` (a fragment cut at another size than its message's is dropped, never
    counted), exactly ``msg_len`` once ``forwarded`` — as on the DPDK card
    (tests/dataplane/test_conformance.py)."""
    model = run["suite"].state_model().entries
    for e in run["run"].state:
        m = model[(e["client_id"], e["msg_id"])]
        assert (e["msg_len"], e["bytes_in"], e["bytes_out"]) == (m["msg_len"], m["bytes_in"],
                                                                 m["bytes_out"]), e
        assert e["bytes_in"] <= e["msg_len"]
        if e["state"] == "forwarded":
            assert e["bytes_in"] == e["msg_len"], e


def test_completed_messages(run):
    """Messages whose whole reply passed, by reply type and per shard."""
    c, want = run["run"].counters, run["suite"].expected_completed()
    # every reply type, SIZE_ACK included, with the DPDK card's keys (tests/dataplane/test_conformance.py)
    assert c["completed"] == {t.name: want["all"].get(t.name, 0) for t in sorted(consts.REPLY_TYPES)}
    assert c["completed"]["SIZE_ACK"] == 1  # the suite's "s0 SIZE_ACK c2"
    # TARGET_DIFFERENCES["completed"]: per shard a total, no latency histogram
    assert {str(s["shard"]): s["completed"] for s in c["shards"]} == {
        str(sid): sum(want.get(str(sid), {}).values()) for sid in run["suite"].shards}
