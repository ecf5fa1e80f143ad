"""The BMv2 runtime helpers that need no switch: CLI lines, output parsing, the state slot.
Run alone: python3 -m pytest -q tests/p4/test_bmv2_helpers.py
"""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from embnic.control.targets.bmv2 import switch as bmv2

import bmv2_pcap

from embnic.control.targets.bmv2 import runtime as bmv2_runtime
from embnic.control.targets.base import Peer
import p4ref


def test_table_commands_route_client_allowlist():
    cmds = bmv2_runtime.card_program([bmv2_runtime.CardPortAddr(1, "02:cc:00:00:00:01", "10.1.1.1")],
                                     [Peer("shard", 0, 1, "02:00:00:00:02:00", "10.1.1.10", 7878),
                                      Peer("client", 2, 1, "02:00:00:00:01:02", "10.1.1.2", 40002)],
                                     state_timeout_us=250000).cli_commands()
    # values in decimal (the runtime CLI takes ints for MACs and IPv4 addresses too): the same
    # entries the P4Runtime channel writes (CardProgram.entries)
    mac_c, ip_c = 0x02cc00000001, 0x0a010101
    mac_s, ip_s = 0x020000000200, 0x0a01010a
    mac_k, ip_k = 0x020000000102, 0x0a010102
    assert cmds == [
        f"table_add card_port_by_ingress set_card_port 1 => {ip_c} {mac_c}",
        f"table_add source_by_egress_port rewrite_source 1 => {mac_c} {ip_c}",
        f"table_add route_by_shard forward_to_server 0 => 1 {mac_s} {ip_s} 7878",
        f"table_add sender_allowlist allow_sender 0 0 {ip_s} 7878 =>",
        f"table_add client_by_id forward_to_client 2 => 1 {mac_k} {ip_k} 40002",
        f"table_add sender_allowlist allow_sender 1 2 {ip_k} 40002 =>",
        "register_write state_timeout_us 0 250000",
    ]


def test_card_program_entries_are_the_cli_lines():
    from embnic.control.targets.bmv2.p4runtime import TableEntry

    prog = bmv2_runtime.card_program([bmv2_runtime.CardPortAddr(0, "02:cc:00:00:00:00", "10.0.0.1")],
                                     [Peer("shard", 3, 1, "02:00:00:00:00:03", "10.0.1.3", 7878)])
    assert prog.entries() == [
        TableEntry("card_port_by_ingress", (0,), "set_card_port", (0x0a000001, 0x02cc00000000)),
        TableEntry("source_by_egress_port", (0,), "rewrite_source", (0x02cc00000000, 0x0a000001)),
        TableEntry("route_by_shard", (3,), "forward_to_server", (1, 0x020000000003, 0x0a000103, 7878)),
        TableEntry("sender_allowlist", (0, 3, 0x0a000103, 7878), "allow_sender"),
    ]
    assert prog.cli_commands() == [e.cli_add() for e in prog.entries()]  # no state timeout: no register line


def test_parse_cli_output():
    text = ("RuntimeCmd: drop_reasons[3]=  (120 bytes, 2 packets)\n"
            "RuntimeCmd: rx_frames[0]=  (0 bytes, 0 packets)\n"
            "RuntimeCmd: slot_state= 0, 2, 1\nRuntimeCmd: ring_head= 7\nRuntimeCmd: \n")
    assert bmv2_runtime.parse_counters(text) == {"drop_reasons": {3: (2, 120)}, "rx_frames": {0: (0, 0)}}
    assert bmv2_runtime.parse_registers(text) == {"slot_state": [0, 2, 1], "ring_head": [7]}


def test_state_slot_is_zlib_crc32_of_the_key():
    assert p4ref.state_slots(1, 1001, 4096) == zlib.crc32(struct.pack(">HI", 1, 1001)) % 4096
    c = np.array([0, 1, 65535], dtype=np.uint16)
    m = np.array([0, 1001, 0xFFFFFFFF], dtype=np.uint32)
    got = p4ref.state_slots(c, m, 4096)
    assert got.tolist() == [zlib.crc32(struct.pack(">HI", int(a), int(b))) % 4096 for a, b in zip(c, m)]
    assert p4ref.state_slots(65535, 0xFFFFFFFF) < 4096
    with pytest.raises(ValueError, match="16 bits"):
        p4ref.state_slots(65536, 1)
    with pytest.raises(ValueError, match="shape"):
        p4ref.state_slots(np.zeros(2), np.zeros(3))


def test_missing_tool_names_it_and_how(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert bmv2.missing_tools() == ["simple_switch", "simple_switch_CLI"]
    for tool in ("p4c", "simple_switch", "simple_switch_grpc", "simple_switch_CLI"):
        with pytest.raises(bmv2.ToolMissingError, match=rf"^{tool} not found on PATH: .*p4/README.md, \"P4 tools\""):
            bmv2.find_tool(tool)
        # a pointer to the docs, never a build recipe
        assert not any(w in bmv2.TOOL_HINTS[tool] for w in ("make ", "cmake", "clone", "build p4lang"))


def test_pcap_order_roundtrip(tmp_path):
    frames = [(5, b"\x01" * 60), (1_000_002, b"\x02" * 61)]
    bmv2_pcap.write_pcap_ordered(tmp_path / "x.pcap", frames)
    assert bmv2_pcap.read_pcap_frames(tmp_path / "x.pcap") == [b"\x01" * 60, b"\x02" * 61]
    data = (tmp_path / "x.pcap").read_bytes()
    assert struct.unpack_from("<II", data, 24) == (1, 5)
    assert struct.unpack_from("<II", data, 24 + 16 + 60) == (2, 2)


class _FakeSwitch:
    """What simple_switch_CLI prints for ``register_read NAME``: one line per register."""

    def __init__(self, regs: dict[str, list[int]]):
        self.regs = regs

    def cli(self, commands):
        # a register the program lacks: the CLI prints an error line, no values
        return "".join(f"RuntimeCmd: {c.split()[1]}= {', '.join(map(str, self.regs[c.split()[1]]))}\n"
                       if c.split()[1] in self.regs else "RuntimeCmd: Error: Invalid register name\n"
                       for c in commands)


def test_read_state_map_unpacks_the_v2_request_registers():
    """slot_request_info = msg_type[39:32] ++ num_tables[31:16] ++ frag_count[15:0] (p4/state_map.p4);
    num_keys and value_len (the reply's announced length) have registers of their own."""
    n = 3
    regs = {r: [0] * n for r in bmv2_runtime.STATE_REGISTERS}
    regs["slot_state"] = [0, 2, 0]
    regs["slot_key"][1] = (65535 << 32) | 0xFFFFFFFF
    regs["slot_request_info"][1] = (3 << 32) | (65535 << 16) | 256
    regs["slot_shard"][1], regs["slot_msg_len"][1] = 7, 0xFFFFFFFF
    regs["slot_num_keys"][1], regs["slot_value_len"][1] = 0xFFFFFFFE, 88
    (e,) = bmv2_runtime.read_state_map(_FakeSwitch(regs))
    assert {k: e[k] for k in ("slot", "client_id", "msg_id", "state", "msg_type", "num_tables", "frag_count",
                              "shard_id", "msg_len", "num_keys", "value_len")} == {
        "slot": 1, "client_id": 65535, "msg_id": 0xFFFFFFFF, "state": "forwarded", "msg_type": 3,
        "num_tables": 65535, "frag_count": 256, "shard_id": 7, "msg_len": 0xFFFFFFFF,
        "num_keys": 0xFFFFFFFE, "value_len": 88}
    del regs["slot_value_len"]
    with pytest.raises(bmv2.Bmv2Error, match="slot_value_len"):
        bmv2_runtime.read_state_map(_FakeSwitch(regs))


def test_read_ring_has_the_v2_header_fields_newest_first():
    size = 1024
    regs = {f"ring_{f}": [0] * size for f in bmv2_runtime.RING_FIELDS}
    regs["ring_head"] = [size + 2]      # wrapped once: the newest entries are in cells 1 and 0
    for i, (nt, vl) in enumerate([(2, 88), (1, 18)]):
        regs["ring_num_tables"][i], regs["ring_value_len"][i], regs["ring_msg_id"][i] = nt, vl, 100 + i
    got = bmv2_runtime.read_ring(_FakeSwitch(regs), 3)
    assert [(e["msg_id"], e["num_tables"], e["value_len"]) for e in got] == [(101, 1, 18), (100, 2, 88), (0, 0, 0)]
    assert {"num_tables", "table_id", "num_keys", "value_len", "msg_len"} <= set(got[0])


def test_build_info_is_what_the_installed_switch_reports(monkeypatch, tmp_path):
    """bmv2_build: the binary's --version and the compile-time switches of the bm/config.h BMv2
    installs beside it; no file of ours."""
    (tmp_path / "bin").mkdir()
    sw = tmp_path / "bin" / "simple_switch"
    sw.write_text("#!/bin/sh\necho 1.15.5-693e69e6\n")
    sw.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    info = bmv2.build_info("simple_switch")
    assert info == {"prefix": str(tmp_path), "version": "1.15.5-693e69e6", "config": None, "flags": {}, "fast": None}
    (tmp_path / "include" / "bm").mkdir(parents=True)
    cfg = tmp_path / "include" / "bm" / "config.h"
    cfg.write_text("#define BM_THRIFT_ON 1\n/* #undef BM_LOG_DEBUG_ON */\n/* #undef BM_LOG_TRACE_ON */\n")
    info = bmv2.build_info("simple_switch")
    assert info["fast"] is True and info["flags"]["thrift"] and not info["flags"]["log_debug"]
    cfg.write_text("#define BM_THRIFT_ON 1\n#define BM_LOG_DEBUG_ON 1\n#define BM_LOG_TRACE_ON 1\n#define BM_ELOG_ON 1\n")
    info = bmv2.build_info("simple_switch")
    assert info["fast"] is False and info["flags"]["event_logger"] and info["config"] == str(cfg)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert bmv2.build_info("simple_switch") is None
