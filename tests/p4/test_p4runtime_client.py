"""The P4Runtime client (control/targets/bmv2/p4runtime.py): the P4Info p4c writes beside the JSON, entries to
P4Runtime messages and back, canonical values; and, where simple_switch_grpc is installed, one
switch programmed over P4Runtime (pipeline, every table written and read back, a refused write
named) whose registers and counters are read and written over Thrift.
Run alone: sudo python3 -m pytest -q tests/p4/test_p4runtime_client.py
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from embnic.control.targets.bmv2 import switch as bmv2

from embnic.control.targets.bmv2 import runtime as bmv2_runtime
from embnic.control.targets.base import Peer
from embnic.control.netns import Netns

p4runtime = pytest.importorskip("embnic.control.targets.bmv2.p4runtime")
if not p4runtime.available():
    pytest.skip(f"P4Runtime's Python packages are missing: {p4runtime.INSTALL_HINT}", allow_module_level=True)
from embnic.control.targets.bmv2.p4runtime import P4InfoIndex, P4RuntimeError, TableEntry, decode, encode  # noqa: E402

PROGRAM = bmv2_runtime.card_program(
    [bmv2_runtime.CardPortAddr(0, "02:cc:00:00:00:00", "10.0.0.1"),
     bmv2_runtime.CardPortAddr(1, "02:cc:00:00:00:01", "10.0.1.1")],
    [Peer("shard", 3, 1, "02:00:00:00:00:03", "10.0.1.3", 7878),
     Peer("client", 1, 0, "02:00:00:00:00:01", "10.0.0.2", 40001)], state_timeout_us=123456)


def test_canonical_values():
    assert [encode(v, 16) for v in (0, 1, 255, 256)] == [b"\x00", b"\x01", b"\xff", b"\x01\x00"]
    assert encode(0x020000000003, 48) == bytes.fromhex("020000000003")
    assert decode(b"\x00\x00\x01\x00") == 256 == decode(b"\x01\x00")
    for bad, bits in ((512, 9), (-1, 8), (1 << 48, 48)):
        with pytest.raises(ValueError, match="does not fit"):
            encode(bad, bits)


def test_p4info_beside_the_json(p4_json):
    info = bmv2.p4info_path(p4_json)
    assert info.name == "embnic.p4info.txtpb" and info.exists()
    idx = P4InfoIndex.load(info)
    assert sorted(idx.tables) == ["card_port_by_ingress", "client_by_id", "route_by_shard", "sender_allowlist",
                                  "source_by_egress_port"]


def test_every_entry_round_trips_through_p4runtime_messages(p4_json):
    idx = P4InfoIndex.load(bmv2.p4info_path(p4_json))
    for e in PROGRAM.entries():
        msg = idx.to_proto(e)
        assert msg.table_id == idx.table(e.table).id
        assert idx.from_proto(msg) == e
    # MACs and IPv4 addresses travel as their canonical big-endian bytes
    route = idx.to_proto(PROGRAM.entries()[4])
    assert [p.value for p in route.action.action.params] == [b"\x01", bytes.fromhex("020000000003"),
                                                             bytes.fromhex("0a000103"), (7878).to_bytes(2, "big")]


def test_bad_entries_are_named(p4_json):
    idx = P4InfoIndex.load(bmv2.p4info_path(p4_json))
    with pytest.raises(P4RuntimeError, match="no table 'route_by_ip'"):
        idx.to_proto(TableEntry("route_by_ip", (1,), "forward_to_server", (1, 2, 3, 4)))
    with pytest.raises(P4RuntimeError, match="table route_by_shard has no action forward_to_client"):
        idx.to_proto(TableEntry("route_by_shard", (1,), "forward_to_client", (1, 2, 3, 4)))
    with pytest.raises(P4RuntimeError, match="1 key fields and 2 parameters given, the P4Info has 1 and 4"):
        idx.to_proto(TableEntry("route_by_shard", (1,), "forward_to_server", (1, 2)))
    bits = idx.table("card_port_by_ingress").fields[0][2]
    with pytest.raises(ValueError, match=f"does not fit {bits} bits"):
        idx.to_proto(TableEntry("card_port_by_ingress", (1 << bits,), "set_card_port", (1, 2)))


def test_a_file_that_is_no_p4info_is_named(tmp_path):
    bad = tmp_path / "x.p4info.txtpb"
    bad.write_text("tables { preamble { id: 1 name: \"t\" } bogus_field: 3 }\n")
    with pytest.raises(P4RuntimeError, match=f"{bad}: not a P4Info file"):
        P4InfoIndex.load(bad)


@pytest.fixture
def grpc_switch(bmv2_ready):
    """simple_switch_grpc in a fresh netns, no program and no port; P4Runtime on a unix socket."""
    if shutil.which("simple_switch_grpc") is None:
        pytest.skip(f"simple_switch_grpc not on PATH: {bmv2.TOOL_HINTS['simple_switch_grpc']}")
    sockdir = Path(tempfile.mkdtemp(prefix="embnic-p4rt-"))
    ns = Netns.create(f"e26p{os.getpid() % 100000}")
    sw = bmv2.SimpleSwitch(None, ns, {}, log=sockdir / "sw.log", grpc_addr=f"unix:{sockdir / 'p4rt'}")
    try:
        sw.start()
        sw.wait_ready()
        yield sw
    finally:
        sw.stop()
        ns.delete()
        shutil.rmtree(sockdir, ignore_errors=True)


@pytest.mark.root
def test_program_over_p4runtime_registers_over_thrift(grpc_switch, bmv2_ready):
    sw = grpc_switch
    done = bmv2_runtime.program_p4runtime(sw, bmv2_ready, PROGRAM)
    assert done["entries"] == 8 and done["tables"] == {"sender_allowlist": 2, "route_by_shard": 1, "client_by_id": 1,
                                                        "card_port_by_ingress": 2, "source_by_egress_port": 2}
    with sw.p4runtime() as c:
        # reads need no arbitration; the P4Info comes from the switch
        assert c.read_table("route_by_shard") == [PROGRAM.entries()[4]]
        assert sorted(c.read_table("sender_allowlist"), key=lambda e: e.key) == sorted(
            [e for e in PROGRAM.entries() if e.table == "sender_allowlist"], key=lambda e: e.key)
        with pytest.raises(P4RuntimeError, match="needs arbitration first"):
            c.write(inserts=[PROGRAM.entries()[4]])
        c.become_primary()
        with pytest.raises(P4RuntimeError, match="ALREADY_EXISTS") as e:
            c.write(inserts=[PROGRAM.entries()[4]])
        assert e.value.errors and e.value.errors[0].startswith("update 0: ALREADY_EXISTS")
        moved = TableEntry("route_by_shard", (3,), "forward_to_server", (0, 0x020000000033, 0x0a000133, 7879))
        c.write(modifies=[moved])
        assert c.read_table("route_by_shard") == [moved]
        c.write(deletes=[moved])
        assert c.read_table("route_by_shard") == []
    # the same switch over Thrift: the register P4Runtime cannot read on BMv2, and counters
    regs = bmv2_runtime.parse_registers(sw.cli(["register_read state_timeout_us"]))
    assert regs["state_timeout_us"][0] == 123456
    c = bmv2_runtime.read_counters(sw, nb_ports=2)
    assert c["ports"][0]["rx_frames"] == 0 and sum(c["drops"].values()) == 0


@pytest.mark.root
def test_a_second_controller_with_the_same_election_id_is_refused(grpc_switch, bmv2_ready):
    with grpc_switch.p4runtime() as a, grpc_switch.p4runtime() as b:
        a.become_primary()
        with pytest.raises(P4RuntimeError, match="arbitration"):
            b.become_primary()


def test_a_json_without_its_p4info_is_named(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    sw = bmv2.SimpleSwitch(None, Netns("unused"), {}, log=tmp_path / "sw.log", grpc_addr="unix:/nonexistent")
    with pytest.raises(bmv2.Bmv2Error, match=r"no P4Info .*x\.p4info\.txtpb beside .*EMBNIC_BMV2_CHANNEL=thrift"):
        bmv2_runtime.program_p4runtime(sw, tmp_path / "x.json", PROGRAM)
