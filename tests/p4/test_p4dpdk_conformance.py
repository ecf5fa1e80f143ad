"""The DPDK card's conformance cases through the P4 card for PNA: p4/pna/ compiled by p4c-dpdk, run in
DPDK's SWX pipeline by embnic-swx on net_pcap vdevs (one lcore).

The same Suite as tests/dataplane/test_conformance.py and tests/p4/test_bmv2_conformance.py: the
exact output frames per port (order kept per ingress port, as net_pcap gives no order across
ports), every drop counted under the same reason, the same forwarded types, the state map's
entries; where the PNA pipeline must differ from the DPDK card, TARGET_DIFFERENCES below says so
(p4/README.md, "Differences"), nothing else does. Skips in one line where p4c-dpdk, DPDK's
pipeline headers or embnic-swx are missing.
Run alone: sudo python3 -m pytest -q tests/p4/test_p4dpdk_conformance.py
"""
from __future__ import annotations

import pytest

from conformance import Suite, check_outputs, read_pcap
from embnic.client_lib import consts
from embnic.control.targets import p4program as p4prog
from embnic.control.targets.base import Peer
from embnic.control.targets.p4dpdk.target import SwxProcess
from drain import wait_swx_drained
import p4ref

pytestmark = [pytest.mark.root, pytest.mark.slow]

#: Every way the PNA card differs from the DPDK card on these cases (p4/README.md, "Differences").
TARGET_DIFFERENCES = {
    "drops": "ring_full, no_mbuf, tx_full and too_long_for_port are the C card's resources (header ring, "
             "mempool, TX queue, a PMD's frame size) the P4 pipeline has none of: always 0 (embnic-swx "
             "counts its own ring and TX losses apart, as host counters)",
    "completed": "per shard, the P4 card counts completed messages (all reply types together) and keeps "
                 "no latency histogram",
    "order": "DPDK's SWX pipeline interleaves up to 16 frames (a thread yields at every rx and table "
             "lookup), so frames that take different paths through it can leave in another order than "
             "they came in: the order is kept per message (and for the ARP replies of a port), as on "
             "the C card with its state map split over lcores (check_outputs order='message')",
    "slot": "the state map is direct-mapped with two ways: a message is in its home slot "
            "(p4ref.state_slot) or, when another message holds that, in the neighbour home ^ 1",
}
CARD_MACS = {0: "02:cc:00:00:00:00", 1: "02:cc:00:00:00:01", 2: "02:cc:00:00:00:02"}


@pytest.fixture(scope="module")
def run(p4dpdk_pipeline, tmp_path_factory):
    s = Suite.default()
    d = tmp_path_factory.mktemp("swxconf")
    inp = s.write_input_pcaps(d)
    outs = {p: d / f"out{p}.pcap" for p in s.ports}
    vdevs = [f"net_pcap{p},rx_pcap={inp[p]},tx_pcap={outs[p]}" for p in sorted(s.ports)]
    with SwxProcess(p4dpdk_pipeline, vdevs, d) as sw:
        sw.card.program([(p.port, CARD_MACS[p.port], p.ip) for p in s.ports.values()],
                        [Peer.from_fields(c) for c in s.route_cmds() + s.client_cmds()])
        routes, clients = sw.card.peers("shard"), sw.card.peers("client")
        sw.resume()
        host = wait_swx_drained(sw, len(s.frames))
        counters = sw.card.counters(len(s.ports), sorted(s.shards))
        state = sw.card.state_map()
        rc = sw.stop()
    return {"suite": s, "counters": counters, "state": state, "host": host, "rc": rc, "routes": routes,
            "clients": clients, "out": {p: read_pcap(outs[p]) for p in s.ports}}


def test_tables_programmed(run):
    s = run["suite"]
    assert {(r.id, r.port, r.mac, r.ip, r.udp_port) for r in run["routes"]} == {
        (p.id, p.port, p.mac, p.ip, p.udp_port) for p in s.shards.values()}
    assert {(c.id, c.ip, c.udp_port) for c in run["clients"]} == {(p.id, p.ip, p.udp_port) for p in s.clients.values()}


def test_output_frames_exact(run):
    """Every expected frame on its port and nothing else, rewritten, checksums right, bodies
    intact, Ethernet trailers cut (the host's output port, by the pipeline's send length)."""
    problems = check_outputs(run["suite"], run["out"], CARD_MACS, order="message")  # TARGET_DIFFERENCES["order"]
    assert not problems, "\n".join(problems)


def test_every_drop_named(run):
    drops = run["counters"]["drops"]
    assert list(drops) == p4prog.drop_reasons()
    assert {k: v for k, v in drops.items() if v} == run["suite"].expected_drops()
    for reason in ("ring_full", "no_mbuf", "tx_full", "too_long_for_port"):  # TARGET_DIFFERENCES["drops"]
        assert drops[reason] == 0


def test_types_and_arp(run):
    c = run["counters"]
    assert c["types"] == run["suite"].expected_types()
    assert c["arp"]["replies"] == run["suite"].expected_arp_replies()


def test_port_counters_and_conservation(run):
    """rx = tx + drops per the pipeline's counters; bytes as the DPDK card counts them (tx: the
    bytes sent, after the trailer is cut); the host lost nothing and sent what the pipeline did."""
    s, c, want = run["suite"], run["counters"], run["suite"].expected_outputs(CARD_MACS)
    inputs = s.inputs_by_port()
    assert [p["rx_frames"] for p in c["ports"]] == [len(inputs[p]) for p in sorted(inputs)]
    assert [p["rx_bytes"] for p in c["ports"]] == [sum(len(f.data) for f in inputs[p]) for p in sorted(inputs)]
    assert [p["tx_frames"] for p in c["ports"]] == [len(want[p]) for p in sorted(want)]
    assert [p["tx_bytes"] for p in c["ports"]] == [sum(len(d) for _, d in want[p]) for p in sorted(want)]
    assert sum(p["rx_frames"] for p in c["ports"]) == (sum(p["tx_frames"] for p in c["ports"])
                                                        + sum(c["drops"].values()))
    host = run["host"]["ports"]
    assert [p["tx_frames"] for p in host] == [p["tx_frames"] for p in c["ports"]]
    assert sum(p["rx_ring_full"] + p["rx_no_headroom"] + p["tx_full"] + p["tx_bad_meta"] for p in host) == 0


def test_state_map_tracked(run):
    """The map holds exactly the messages in flight, in the reference model's states, with the
    request's v2 header, fragments and body bytes as the model has them."""
    st, model = run["state"], run["suite"].state_model()
    by = {k: 0 for k in ("receiving", "forwarded", "replying")}
    for e in st:
        by[e["state"]] += 1
    assert {"entries": len(st), "by_state": by} == run["suite"].expected_state()
    assert {(e["client_id"], e["msg_id"]) for e in st} == set(model.entries)
    for e in st:
        m = model.entries[(e["client_id"], e["msg_id"])]
        assert (e["msg_type"], e["shard_id"], e["num_tables"], e["num_keys"], e["value_len"], e["msg_len"]) == (
            m["type"], m["shard"], m["num_tables"], m["num_keys"], m["value_len"], m["msg_len"]), e
        assert (e["frag_count"], e["frags_in"], e["frags_out"]) == (m["n_in"], len(m["in"]), len(m["out"])), e
        assert (e["bytes_in"], e["bytes_out"]) == (m["bytes_in"], m["bytes_out"]), e
        home = p4ref.state_slot(e["client_id"], e["msg_id"], arch="pna")
        assert e["slot"] in (home, home ^ 1)                                    # TARGET_DIFFERENCES["slot"]
    c = run["counters"]
    assert c["drops"]["state_full"] == 0 and c["state"]["expired"] == 0


def test_completed_messages(run):
    c, want = run["counters"], run["suite"].expected_completed()
    assert c["completed"] == {t.name: want["all"].get(t.name, 0) for t in sorted(consts.REPLY_TYPES)}
    # TARGET_DIFFERENCES["completed"]: per shard a total, no latency histogram
    assert {str(s["shard"]): s["completed"] for s in c["shards"]} == {
        str(sid): sum(want.get(str(sid), {}).values()) for sid in run["suite"].shards}


def test_clean_exit(run):
    assert run["rc"]["exit"] == 0
