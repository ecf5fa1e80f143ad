"""The BMv2 runtime helpers that need no switch: CLI lines, output parsing, the state slot.
Run alone: python3 -m pytest -q tests/p4/test_bmv2_helpers.py
"""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from embnic.control import bmv2, bmv2_pcap, bmv2_runtime


def test_table_commands_route_client_allowlist():
    cmds = bmv2_runtime.table_commands([bmv2_runtime.CardPortAddr(1, "02:cc:00:00:00:01", "10.1.1.1")],
                                       [bmv2_runtime.PeerEntry(0, 1, "02:00:00:00:02:00", "10.1.1.10", 7878)],
                                       [bmv2_runtime.PeerEntry(2, 1, "02:00:00:00:01:02", "10.1.1.2", 40002)],
                                       state_timeout_us=250000)
    assert cmds == [
        "table_add card_port_by_ingress set_card_port 1 => 10.1.1.1 02:cc:00:00:00:01",
        "table_add source_by_egress_port rewrite_source 1 => 02:cc:00:00:00:01 10.1.1.1",
        "table_add route_by_shard forward_to_server 0 => 1 02:00:00:00:02:00 10.1.1.10 7878",
        "table_add sender_allowlist allow_sender 0 0 10.1.1.10 7878 =>",
        "table_add client_by_id forward_to_client 2 => 1 02:00:00:00:01:02 10.1.1.2 40002",
        "table_add sender_allowlist allow_sender 1 2 10.1.1.2 40002 =>",
        "register_write state_timeout_us 0 250000",
    ]


def test_parse_cli_output():
    text = ("RuntimeCmd: drop_reasons[3]=  (120 bytes, 2 packets)\n"
            "RuntimeCmd: rx_frames[0]=  (0 bytes, 0 packets)\n"
            "RuntimeCmd: slot_state= 0, 2, 1\nRuntimeCmd: ring_head= 7\nRuntimeCmd: \n")
    assert bmv2_runtime.parse_counters(text) == {"drop_reasons": {3: (2, 120)}, "rx_frames": {0: (0, 0)}}
    assert bmv2_runtime.parse_registers(text) == {"slot_state": [0, 2, 1], "ring_head": [7]}


def test_state_slot_is_zlib_crc32_of_the_key():
    assert bmv2_runtime.state_slot(1, 1001, 4096) == zlib.crc32(struct.pack(">HI", 1, 1001)) % 4096
    c = np.array([0, 1, 65535], dtype=np.uint16)
    m = np.array([0, 1001, 0xFFFFFFFF], dtype=np.uint32)
    got = bmv2_runtime.state_slot(c, m, 4096)
    assert got.tolist() == [zlib.crc32(struct.pack(">HI", int(a), int(b))) % 4096 for a, b in zip(c, m)]
    assert bmv2_runtime.state_slot(65535, 0xFFFFFFFF) < 4096
    with pytest.raises(ValueError, match="16 bits"):
        bmv2_runtime.state_slot(65536, 1)
    with pytest.raises(ValueError, match="shape"):
        bmv2_runtime.state_slot(np.zeros(2), np.zeros(3))


def test_missing_tool_names_it_and_how(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert bmv2.missing_tools() == ["p4c", "simple_switch", "simple_switch_CLI"]
    with pytest.raises(bmv2.ToolMissingError, match=r"^p4c not found on PATH: build p4lang/p4c"):
        bmv2.find_tool("p4c")


def test_pcap_order_roundtrip(tmp_path):
    frames = [(5, b"\x01" * 60), (1_000_002, b"\x02" * 61)]
    bmv2_pcap.write_pcap_ordered(tmp_path / "x.pcap", frames)
    assert bmv2_pcap.read_pcap_frames(tmp_path / "x.pcap") == [b"\x01" * 60, b"\x02" * 61]
    data = (tmp_path / "x.pcap").read_bytes()
    assert struct.unpack_from("<II", data, 24) == (1, 5)
    assert struct.unpack_from("<II", data, 24 + 16 + 60) == (2, 2)
