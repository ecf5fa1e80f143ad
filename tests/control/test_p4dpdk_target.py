"""The p4dpdk target's library parts without p4c-dpdk: context-JSON names, the SWX entry text, the
table dump and state map decoding, the one-line message where a tool is missing.
Run alone: python3 -m pytest -q tests/control/test_p4dpdk_target.py
"""
from __future__ import annotations

import json

import pytest

from embnic.control.targets.p4dpdk import swx as p4dpdk
from embnic.control.errors import MissingDependencyError
from embnic.control.targets.base import Peer, get_target_class
from embnic.control.targets.p4dpdk.target import STATE_REGISTERS, SwxCard, decode_state_map, parse_table_dump

#: the shape p4c-dpdk's context JSON has (backends/dpdk/dpdkContext.cpp), trimmed to what is read
CONTEXT = {
    "tables": [{"name": "EmbnicIngress.forwarding.route_by_shard", "target_name": "route_by_shard_0",
                "actions": [{"name": "forwarding.forward_to_server", "target_name": "PnaMainControl.forward_to_server_0",
                             "p4_parameters": [{"name": "port"}, {"name": "mac"}, {"name": "ip"},
                                               {"name": "udp_port"}]},
                            {"name": "forwarding.no_route", "target_name": "no_route_0", "p4_parameters": []}]},
               {"name": "EmbnicIngress.forwarding.sender_allowlist", "target_name": "sender_allowlist_0",
                "actions": [{"name": "allow_sender", "target_name": "allow_sender_0", "p4_parameters": []}]}],
    "externs": [{"name": "EmbnicIngress.state_map.slot_state", "target_name": "slot_state_0", "type": "Register",
                 "attributes": {}},
                {"name": "EmbnicIngress.rx_frames", "target_name": "rx_frames_0", "type": "Counter",
                 "attributes": {"type": "packets_and_bytes"}},
                {"name": "EmbnicIngress.drop_reasons", "target_name": "drop_reasons_0", "type": "Counter",
                 "attributes": {"type": "packets"}}],
}


@pytest.fixture
def names(tmp_path):
    (tmp_path / "context.json").write_text(json.dumps(CONTEXT))
    return p4dpdk.Names.load(tmp_path / "context.json")


class FakeCtl:
    """embnic-swx's control socket for table commands: keeps entry texts like the real one."""

    def __init__(self):
        self.tables: dict[str, dict[str, str]] = {}
        self.calls: list[tuple] = []

    def call(self, cmd, **f):
        self.calls.append((cmd, f))
        t = self.tables.setdefault(f.get("table", ""), {})
        key = " ".join(f.get("entry", "").split(" action ")[0].split())
        if cmd == "table_add":
            t[key] = f["entry"]
        elif cmd == "table_delete":
            del t[key]
        elif cmd == "table_dump":
            return {"ok": True, "entries": list(t.values())}
        return {"ok": True}


def test_names_by_control_plane_name(names):
    assert names.table("route_by_shard") == "route_by_shard_0"
    assert names.action("route_by_shard", "forward_to_server") == "forward_to_server_0"
    assert names.params("route_by_shard", "forward_to_server") == ["port", "mac", "ip", "udp_port"]
    assert names.register("slot_state") == "slot_state_0"
    assert names.counter("rx_frames", "bytes") == "rx_frames_0_bytes"
    assert names.counter("drop_reasons") == "drop_reasons_0"   # a packets counter: one array
    with pytest.raises(p4dpdk.P4DpdkError, match="no table nope"):
        names.table("nope")


def test_entry_text(names):
    assert p4dpdk.entry_line(names, "route_by_shard", [3], "forward_to_server", [1, 0x020000000001, 0x0A010203, 7878]) \
        == "match 0x3 action forward_to_server_0 port 0x1 mac 0x20000000001 ip 0xa010203 udp_port 0x1ec6"
    assert p4dpdk.entry_line(names, "route_by_shard", [3]) == "match 0x3"


def test_routes_round_trip_through_the_entry_text(names):
    """A route added through SwxCard reads back the same, with its allowlist entry; a replaced
    route leaves one entry; a deleted one none."""
    ctl = FakeCtl()
    card = SwxCard(ctl, names)
    card.peer_add(Peer("shard", 2, 1, "02:00:00:00:01:0a", "10.1.1.10", 7878))
    card.peer_add(Peer("shard", 2, 0, "02:00:00:00:01:0b", "10.1.1.11", 7979))
    assert card.peers("shard") == [Peer("shard", 2, 0, "02:00:00:00:01:0b", "10.1.1.11", 7979)]
    assert card.dump("sender_allowlist") == [{"key": [0, 2, 0x0A01010B, 7979], "action": "allow_sender", "params": []}]
    assert card.peer_del("shard", 2) and card.peers("shard") == [] and card.dump("sender_allowlist") == []
    assert not card.peer_del("shard", 2)


def test_parse_table_dump():
    assert parse_table_dump(["match 0x1 0x2 action a_0 x 0x10 y 5", "# comment"]) == [
        {"key": [1, 2], "action": "a_0", "params": {"x": 16, "y": 5}}]


def test_decode_state_map():
    regs = {r: [0] * 4 for r in STATE_REGISTERS}
    regs["slot_state"][2] = 2
    regs["slot_key"][2] = (7 << 32) | 1001
    regs["slot_request_info"][2] = (1 << 32) | (3 << 16) | 2
    regs["slot_frags_in"][2] = 2
    e, = decode_state_map(regs)
    assert (e["slot"], e["client_id"], e["msg_id"], e["state"], e["msg_type"], e["num_tables"], e["frag_count"],
            e["frags_in"]) == (2, 7, 1001, "forwarded", 1, 3, 2, 2)


def test_registered_target():
    assert get_target_class("p4dpdk").name == "p4dpdk"


def test_p4c_dpdk_is_not_needed(monkeypatch, tmp_path):
    """The target runs the committed p4/build/pna: with no p4c-dpdk on PATH nothing about it is
    missing (the headers and embnic-swx are what missing() can name)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    why = p4dpdk.missing()
    assert why is None or "p4c" not in why


def test_missing_headers_named(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBNIC_DPDK_PIPELINE_INCLUDE", str(tmp_path / "none"))
    why = p4dpdk.missing()
    assert "scripts/dpdk-pipeline-headers.sh" in why and "\n" not in why
    with pytest.raises(MissingDependencyError, match="the p4dpdk target needs DPDK's pipeline headers"):
        p4dpdk.require()
