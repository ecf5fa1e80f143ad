"""What p4c made of the program (the committed p4/build/, on every machine) has the control-plane
names, sizes and instructions embnic relies on. That it compiles clean and byte for byte the same
is test_p4_compiled.py's.
Run alone: python3 -m pytest -q tests/p4/test_p4_compile.py
"""
from __future__ import annotations

import json

from embnic.control.targets import p4program as p4prog


def test_names_and_sizes(p4_json):
    j = json.loads(p4_json.read_text())
    tables = {t["name"]: t for p in j["pipelines"] for t in p["tables"]}
    for name in ("card_port_by_ingress", "sender_allowlist", "route_by_shard", "client_by_id",
                 "source_by_egress_port"):
        assert name in tables, name
        assert tables[name]["with_counters"], name
    assert tables["route_by_shard"]["max_size"] == 4096
    assert [k["name"] for k in tables["sender_allowlist"]["key"]] == ["is_request", "id", "ip", "udp_port"]
    regs = {r["name"]: r for r in j["register_arrays"]}
    c = p4prog.constants()
    assert regs["slot_key"]["size"] == c["STATE_SLOTS"] and regs["slot_key"]["bitwidth"] == 48
    # a fragment bitmap is FRAG_WORDS registers of 64 bits per slot (no register wider than 64 bits)
    assert regs["slot_request_frags"]["bitwidth"] == 64
    assert regs["slot_request_frags"]["size"] == c["STATE_SLOTS"] * c["FRAG_WORDS"]
    assert c["FRAG_WORDS"] * 64 == c["EMBNIC_MAX_FRAGS"] and 1 << c["FRAG_WORD_SHIFT"] == c["FRAG_WORDS"]
    assert max(r["bitwidth"] for r in regs.values()) <= 64
    assert regs["ring_msg_id"]["size"] == c["RING_SLOTS"]
    counters = {x["name"]: x for x in j["counter_arrays"]}
    assert counters["drop_reasons"]["size"] == len(p4prog.drop_reasons()) + 1


def test_the_only_hash_is_crc32(p4_json):
    """The state map slot is v1model's crc32 (zlib's, fixed parameters: what p4ref.state_slots
    computes); the IPv4 header checksum is the common code's arithmetic (p4/arith.p4), not a
    checksum unit of the architecture."""
    j = json.loads(p4_json.read_text())
    assert sorted(c["algo"] for c in j["calculations"]) == ["crc32"]


def test_registers_the_control_plane_reads_fit_thrift(p4_json):
    """BMv2's Thrift API reads a register cell as a 64-bit integer (p4/README.md, quirks): every
    register bmv2_runtime reads — the state map's (the v2 request's num_tables, num_keys,
    value_len among them) and the header ring's — is at most 64 bits wide and sized as its array."""
    from embnic.control.targets.bmv2 import runtime as bmv2_runtime

    j = json.loads(p4_json.read_text())
    regs = {r["name"]: r for r in j["register_arrays"]}
    c = p4prog.constants()
    for name in bmv2_runtime.STATE_REGISTERS:
        assert regs[name]["bitwidth"] <= 64 and regs[name]["size"] == c["STATE_SLOTS"], name
    for f in bmv2_runtime.RING_FIELDS:
        assert regs[f"ring_{f}"]["bitwidth"] <= 64 and regs[f"ring_{f}"]["size"] == c["RING_SLOTS"], f
    assert regs["slot_request_info"]["bitwidth"] == 8 + 16 + 16  # msg_type, num_tables, frag_count
    assert {n: regs[f"slot_{n}"]["bitwidth"] for n in ("num_keys", "value_len", "msg_len", "shard")} == {
        "num_keys": 32, "value_len": 32, "msg_len": 32, "shard": 16}


def test_pna_spec_relocates_and_names():
    """p4c-dpdk's spec of p4/pna/embnic.p4, relocated, keeps the metadata an SWX instruction can
    address; its context JSON names every table, counter and register the target reads."""
    from embnic.control.targets import p4compiled
    from embnic.control.targets.p4dpdk import swx as p4dpdk

    out = p4compiled.outputs("pna")
    spec, ctx = out.path("spec"), out.path("context")
    text, info = p4dpdk.relocate_metadata(spec.read_text())
    assert info["metadata_bytes"] < p4dpdk.STRUCT_ADDRESSABLE
    assert "header scratch0 instanceof scratch0_t" in text
    names = p4dpdk.Names.load(ctx)
    assert {"route_by_shard", "client_by_id", "sender_allowlist", "card_port_by_ingress",
            "source_by_egress_port"} <= set(names.tables)
    assert names.counter("rx_frames", "bytes").endswith("_bytes") and "slot_state" in names.registers
    # no regadd with an immediate index and value is left (DPDK 22.11 drops its array id)
    text, n = p4dpdk.split_regadd_immediates(text)
    assert n >= 3 and not p4dpdk._REGADD_RII.search(text)    # arp_replies, state_expired (both ways)


def test_regadd_with_two_immediates_is_split():
    """split_regadd_immediates moves the increment of `regadd ARRAY IMM IMM` into a metadata field
    (placed last), keeps labels, and leaves every other regadd alone."""
    from embnic.control.targets.p4dpdk import swx as p4dpdk

    spec = ("struct m_t {\n\tbit<32> local_metadata_slot\n}\nmetadata instanceof m_t\n\n"
            "apply {\n\tregadd _a_0 0x0 1\n\tLABEL_X :\tregadd _b_0 3 0x2\n\tregadd _c_0 m.local_metadata_slot 1\n"
            "\tregadd _d_0 0x0 m.local_metadata_slot\n}\n")
    out, n = p4dpdk.split_regadd_immediates(spec)
    assert n == 2
    assert "struct m_t {\n\tbit<32> local_metadata_slot\n\tbit<64> embnic_regadd_src\n}" in out
    assert "\tmov m.embnic_regadd_src 1\n\tregadd _a_0 0x0 m.embnic_regadd_src\n" in out
    assert "\tLABEL_X :\tmov m.embnic_regadd_src 0x2\n\tregadd _b_0 3 m.embnic_regadd_src\n" in out
    assert "\tregadd _c_0 m.local_metadata_slot 1\n\tregadd _d_0 0x0 m.local_metadata_slot\n" in out
