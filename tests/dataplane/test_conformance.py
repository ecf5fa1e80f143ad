"""Conformance of embnic-dp through net_pcap vdevs: exact output frames, counters, no leaks.

The cases live in conformance.py (reusable by the P4 target): requests from 3 clients to 3
shards, replies, multi-fragment messages, ARP, malformed frames of every kind, unauthorised
senders, and the reply path through the state map (unsolicited, wrong shard, wrong type,
duplicates, fragments tracked by bitmap, more than 256 fragments, fragments cut at another size
than their message's: overlap, gap, a reply cut so), on a 3-port card. Each lcore
layout runs once: run to completion (``-l 0``), RX/TX pipeline (``-l 0,1``) and the state map
partitioned over 2 state lcores (``-l 0,1 --state-lcores 2``: RX, TX and state lcore 0 on
lcore 0, state lcore 1 on lcore 1), where frames keep their order per message, not per port.
Run alone: sudo python3 -m pytest -q tests/dataplane/test_conformance.py
"""
from __future__ import annotations

import pytest

from conformance import StateModel, Suite, check_outputs, read_pcap
from embnic.control.targets.dpdk.process import CardProcess
from drain import wait_drained
from embnic.client_lib import consts

pytestmark = [pytest.mark.dataplane, pytest.mark.root]


LAYOUTS = {"run_to_completion": ("0", 1), "pipeline": ("0,1", 1), "partitioned": ("0,1", 2)}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def run(request, card_bin, tmp_path_factory):
    """Run the suite through the card once; returns what the tests inspect."""
    lcores, state_lcores = LAYOUTS[request.param]
    d = tmp_path_factory.mktemp("conf")
    s = Suite.default()
    inp = s.write_input_pcaps(d)
    outs = {p: d / f"out{p}.pcap" for p in s.ports}
    vdevs = [f"net_pcap{p},rx_pcap={inp[p]},tx_pcap={outs[p]}" for p in sorted(s.ports)]
    card = CardProcess(card_bin, vdevs, lcores=lcores, port_ips={p: s.ports[p].ip for p in s.ports},
                       args=["--paused", "--state-lcores", str(state_lcores)], log=d / "card.log")
    card.start()
    try:
        for c in s.route_cmds() + s.client_cmds():
            c = dict(c)
            card.call(c.pop("cmd"), **c)
        info = card.call("info")
        routes = card.call("route_list")["routes"]
        clients = card.call("client_list")["clients"]
        card.call("resume")
        # with lcores besides the control socket's, a frame is counted a moment before its mbuf
        # is freed: wait for both (a leak still fails test_no_mbuf_leak, by timeout)
        counters = wait_drained(card, len(s.frames), mbufs_back=lcores != "0")
        state = card.call("state_summary")
        dump = card.call("state_dump", limit=1000)["entries"]
    finally:
        rc = card.stop()
    card.cleanup()
    return {"suite": s, "info": info, "counters": counters, "state": state, "dump": dump, "rc": rc,
            "layout": request.param,
            "state_lcores": state_lcores,
            "macs": {p["port"]: p["mac"] for p in info["ports"]}, "routes": routes, "clients": clients,
            "out": {p: read_pcap(outs[p]) for p in s.ports}, "log": (d / "card.log").read_text()}


def test_mode_matches_lcores(run):
    assert run["info"]["mode"] == run["layout"]
    assert run["info"]["state_lcores"] == run["state_lcores"] == len(run["info"]["state_lcore_ids"])
    assert run["state"]["partitions"] == run["state_lcores"]
    assert [p["ip"] for p in run["info"]["ports"]] == ["10.1.0.1", "10.1.1.1", "10.1.2.1"]


def test_tables_programmed(run):
    s = run["suite"]
    assert [r["shard"] for r in run["routes"]] == sorted(s.shards)
    assert {(r["shard"], r["port"], r["mac"], r["ip"], r["udp_port"]) for r in run["routes"]} == {
        (p.id, p.port, p.mac, p.ip, p.udp_port) for p in s.shards.values()}
    assert {(c["client"], c["ip"], c["udp_port"]) for c in run["clients"]} == {
        (p.id, p.ip, p.udp_port) for p in s.clients.values()}


def test_output_frames_exact(run):
    """Every expected frame on its port, nothing else, rewritten, checksums right, bodies intact."""
    problems = check_outputs(run["suite"], run["out"], run["macs"],
                             order="message" if run["state_lcores"] > 1 else "port")
    assert not problems, "\n".join(problems)


def test_output_counts_per_port(run):
    want = run["suite"].expected_outputs(run["macs"])
    assert {p: len(v) for p, v in run["out"].items()} == {p: len(v) for p, v in want.items()}
    c = run["counters"]
    assert [p["tx_frames"] for p in c["ports"]] == [len(want[p]) for p in sorted(want)]
    assert [p["tx_bytes"] for p in c["ports"]] == [sum(len(d) for _, d in want[p]) for p in sorted(want)]


def test_every_drop_named(run):
    """The drop counters equal the suite's expectation exactly, every reason listed (zeros too)."""
    drops = run["counters"]["drops"]
    for reason in ("too_short", "bad_ether", "bad_ip", "ip_options", "not_udp", "bad_udp", "bad_port",
                   "bad_magic", "bad_version", "bad_type", "bad_length", "unknown_client",
                   "unknown_server", "unknown_shard", "ring_full", "no_mbuf", "tx_full", "state_full",
                   "arp_ignored", "wrong_dst", "frag_mismatch", "too_many_frags", "unsolicited_reply",
                   "wrong_shard_reply", "wrong_reply_type", "bad_reply_len", "truncated", "too_long_for_port",
                   "wrong_port"):
        assert reason in drops, f"drop reason {reason} missing from counters"
    want = run["suite"].expected_drops()
    assert {k: v for k, v in drops.items() if v} == want


def test_drops_by_port(run):
    """Each drop is counted on the port the frame came in on; every reason on every port."""
    by_port = run["counters"]["drops_by_port"]
    assert [p["port"] for p in by_port] == sorted(run["suite"].ports)
    assert all(set(p) == set(run["counters"]["drops"]) | {"port"} for p in by_port)
    got = {p["port"]: {k: v for k, v in p.items() if k != "port" and v} for p in by_port}
    assert got == run["suite"].expected_drops_by_port()


def test_types_and_arp(run):
    c = run["counters"]
    assert c["types"] == run["suite"].expected_types()
    assert c["arp"]["replies"] == run["suite"].expected_arp_replies()


def test_conservation(run):
    """rx = tx + drops: every frame the card received is accounted exactly once."""
    s, c = run["suite"], run["counters"]
    rx = [p["rx_frames"] for p in c["ports"]]
    assert rx == [len(v) for _, v in sorted(s.inputs_by_port().items())]
    assert [p["rx_bytes"] for p in c["ports"]] == [sum(len(f.data) for f in v)
                                                   for _, v in sorted(s.inputs_by_port().items())]
    assert sum(rx) == sum(p["tx_frames"] for p in c["ports"]) + sum(c["drops"].values())


def test_no_mbuf_leak(run):
    """After the run drains, every mbuf is back in the mempool and the ring is empty."""
    c = run["counters"]
    assert c["mempool"]["in_use"] == 0, c["mempool"]
    assert c["mempool"]["available"] == c["mempool"]["size"]
    assert c["ring"]["count"] == 0
    assert 0 < c["ring"]["high_water"] <= c["ring"]["size"]


def test_state_map_tracked(run):
    """The map holds exactly the messages in flight, in the states of the reference model.

    Answered messages are gone; a request missing a fragment (or seen twice) stays receiving.
    """
    st = run["state"]
    assert st["overflow"] == 0 and st["expired"] == 0
    want = run["suite"].expected_state()
    assert {"entries": st["entries"], "by_state": st["by_state"]} == want


def test_state_dump_records_the_header(run):
    """Each entry left in the map records its request's v2 header as the reference model does:
    type, shard, num_tables, num_keys, value_len (what its reply's length is checked against),
    msg_len, fragments seen."""
    model = run["suite"].state_model().entries
    got = {(e["client"], e["msg_id"]): e for e in run["dump"]}
    assert set(got) == set(model)
    for key, m in model.items():
        e = got[key]
        assert (e["type"], e["shard"], e["num_tables"], e["num_keys"], e["value_len"], e["msg_len"]) == (
            consts.MsgType(m["type"]).name, m["shard"], m["num_tables"], m["num_keys"], m["value_len"],
            m["msg_len"]), key
        assert (e["frag_count"], e["frags_in"], e["frags_out"]) == (m["n_in"], len(m["in"]), len(m["out"])), key


def test_state_map_bytes(run):
    """Every entry holds the model's fragments and body bytes: never more than ``msg_len`` (a
    fragment cut at another size than its message's is dropped, never counted), exactly
    ``msg_len`` once ``forwarded``."""
    model = run["suite"].state_model().entries
    got = {(e["client"], e["msg_id"]): e for e in run["dump"]}
    assert set(got) == set(model)
    for key, e in got.items():
        m = model[key]
        assert (e["state"], e["msg_len"], e["frags_in"], e["bytes_in"], e["frags_out"], e["bytes_out"]) == (
            StateModel.state_of(m), m["msg_len"], len(m["in"]), m["bytes_in"], len(m["out"]),
            m["bytes_out"]), key
        assert e["bytes_in"] <= e["msg_len"]
        if e["state"] == "forwarded":
            assert e["bytes_in"] == e["msg_len"], key
    # the suite's fragment-geometry cases end forwarded with exactly their 16 + 3200 bytes
    assert sum(1 for e in got.values() if e["state"] == "forwarded" and e["msg_len"] == 3216) >= 3


def test_completed_messages(run):
    """Messages whose whole reply passed are counted by reply type, overall and per shard, with
    one latency sample each in their shard's histogram."""
    c, want = run["counters"], run["suite"].expected_completed()
    replies = [t.name for t in sorted(consts.REPLY_TYPES)]
    assert c["completed"] == {t: want["all"].get(t, 0) for t in replies}
    shards = {str(s["shard"]): s for s in c["shards"]}
    assert set(shards) == {str(i) for i in run["suite"].shards}
    for sid, s in shards.items():
        done = {t: s[t] for t in replies if s[t]}
        assert done == dict(want.get(sid, {})), sid
        assert sum(s["latency_hist"]) == sum(done.values())
        assert len(s["latency_hist"]) == 24 and s["expired"] == 0


def test_clean_exit(run):
    assert run["rc"] == 0, run["log"][-2000:]
    assert "embnic-dp: bye" in run["log"]
