"""The P4 program's source against the protocol's one definition; runs without p4c.

The embnic header of p4/headers.p4 (field names, offsets, widths) against
embnic.client_lib.consts.HEADER_FIELDS, like the C header is checked in
tests/dataplane/test_buildinfo.py; the byte diagram against docs/protocol.md; the constants of
p4/types.p4 against consts; the drop reasons (counter indices) against the DPDK card's list;
every table with a size, a default action and a direct counter (STYLE.md).
Run alone: python3 -m pytest -q tests/p4/test_p4_source.py
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from embnic.client_lib import consts
from embnic.control.targets import p4program as p4prog
import p4ref

REPO = Path(__file__).resolve().parents[2]


def test_embnic_header_matches_python():
    assert p4ref.header_fields("embnic_t") == consts.HEADER_FIELDS
    fields = p4ref.header_fields("embnic_t")
    assert fields[-1][1] + fields[-1][2] == consts.HDR_LEN


def test_l2_l3_l4_header_sizes():
    """Ethernet 14, ARP (IPv4 over Ethernet) 28, IPv4 without options 20, UDP 8 bytes."""
    def size(h):
        f = p4ref.header_fields(h) if h != "ipv4_t" else None
        return f[-1][1] + f[-1][2] if f else None
    assert size("ethernet_t") == consts.ETH_HDR_LEN
    assert size("arp_t") == 28
    assert size("udp_t") == consts.UDP_HDR_LEN
    # ipv4_t has sub-byte fields: sum the widths
    text = p4prog.strip_comments((p4prog.P4_DIR / "headers.p4").read_text())
    body = re.search(r"header\s+ipv4_t\s*\{(.*?)\}", text, re.S).group(1)
    widths = p4ref.typedef_widths()
    bits = sum(int(w) if w else widths[t] for t, w in re.findall(r"(bit<(\d+)>|\w+)\s+\w+\s*;", body))
    assert bits == consts.IPV4_HDR_LEN * 8


def test_field_width_mismatch_is_caught(tmp_path, monkeypatch):
    """The check can fail: a header with a 3-byte field where the protocol has 4 is reported."""
    src = (p4prog.P4_DIR / "headers.p4").read_text().replace("bit<32>     num_keys;", "bit<24>     num_keys;")
    assert "bit<24>     num_keys;" in src
    (tmp_path / "headers.p4").write_text(src)
    (tmp_path / "types.p4").write_text((p4prog.P4_DIR / "types.p4").read_text())
    monkeypatch.setattr(p4prog, "P4_DIR", tmp_path)
    p4ref.typedef_widths.cache_clear()
    try:
        fields = p4ref.header_fields("embnic_t")
    finally:
        p4ref.typedef_widths.cache_clear()
    assert fields != consts.HEADER_FIELDS
    assert ("num_keys", 20, 3) in fields


def test_byte_diagram_matches_protocol_doc():
    doc = (REPO / "docs" / "protocol.md").read_text()
    want = re.search(r"```\n( 0 {19}1.*?)```", doc, re.S).group(1).strip("\n").splitlines()
    hdr = (p4prog.P4_DIR / "headers.p4").read_text()
    got = [ln[3:] for ln in hdr.splitlines() if ln.startswith(" * ") and re.match(r" \* [ +|0-9]", ln)]
    got = [ln for ln in got if ln.strip().startswith(("0", "+", "|"))]
    assert [ln.rstrip() for ln in got] == [ln.rstrip() for ln in want]


def test_protocol_constants():
    c = p4prog.constants()
    assert c["EMBNIC_UDP_PORT"] == consts.UDP_PORT
    assert c["EMBNIC_MAGIC"] == consts.MAGIC
    assert c["EMBNIC_VERSION"] == consts.VERSION
    assert c["EMBNIC_HDR_LEN"] == consts.HDR_LEN
    assert c["ETH_HDR_LEN"] == consts.ETH_HDR_LEN
    assert c["IPV4_HDR_LEN"] == consts.IPV4_HDR_LEN
    assert c["UDP_HDR_LEN"] == consts.UDP_HDR_LEN
    for t in consts.MsgType:
        assert c[f"MSG_{t.name}"] == t.value
    assert c["FLAG_RETRANSMIT"] == consts.Flags.RETRANSMIT
    assert c["EMBNIC_MAX_FRAGS"] == consts.MAX_FRAGS
    # protocol v2: msg_len for the type from the header's counts (validation.p4)
    assert c["EMBNIC_DIR_ENTRY"] == consts.DIR_ENTRY
    assert c["EMBNIC_KEY_SIZE"] == consts.KEY_SIZE
    assert c["EMBNIC_SIZE_ENTRY"] == consts.SIZE_ENTRY
    assert c["EMBNIC_MIN_ROW"] == min(v for v in consts.DTYPE_SIZE.values() if v)
    assert c["EMBNIC_NO_TABLE"] == consts.NO_TABLE
    assert c["EMBNIC_NACK_LEN"] == consts.NACK_LEN == consts.expected_msg_len(consts.MsgType.UPDATE_NACK, 0, 0, 0)
    assert c["NB_MSG_TYPES"] > max(consts.MsgType) and c["NB_MSG_TYPES"] & (c["NB_MSG_TYPES"] - 1) == 0
    # the card sees no dtype (it lives in the body's directory)
    assert not [k for k in c if k.startswith("DTYPE_")]


def _c_drop_reasons() -> list[str]:
    text = (REPO / "include" / "embnic_parse.h").read_text()
    block = re.search(r"#define EMBNIC_DROP_REASONS\(X\)(.*?)\n\n", text, re.S).group(1)
    return re.findall(r"X\(\w+, (\w+)\)", block)


def test_drop_reasons_index_for_index_with_the_dpdk_card():
    """Counter index i+1 of drop_reasons names the DPDK card's reason i; P4 may only add at the end."""
    p4, c = p4prog.drop_reasons(), _c_drop_reasons()
    assert len(c) >= 20
    assert p4[:len(c)] == c
    assert {"too_many_frags", "unsolicited_reply", "wrong_shard_reply", "wrong_reply_type"} <= set(c)


def test_v2_drop_reasons():
    """Protocol v2: bad_dtype is gone (no dtype in the header), bad_reply_len is new."""
    p4 = p4prog.drop_reasons()
    assert "bad_dtype" not in p4 and "bad_reply_len" in p4


def test_protocol_drop_reasons_all_counted():
    """Every receiver drop reason of the protocol the card can see is a P4 drop reason."""
    p4 = set(p4prog.drop_reasons())
    assert set(consts.DROP_REASONS) - {"too_large"} <= p4


def test_every_table_sized_with_default_action_and_counter():
    tables = p4ref.tables()
    assert {"card_port_by_ingress", "sender_allowlist", "route_by_shard", "client_by_id",
            "source_by_egress_port"} <= set(tables)
    for name, body in tables.items():
        assert re.search(r"\bsize\s*=", body), f"table {name} has no size"
        assert re.search(r"\bdefault_action\s*=", body), f"table {name} has no default_action"
        assert re.search(r"\bEMBNIC_TABLE_COUNTERS\(\s*\w+_counter\s*\)", body), f"table {name} has no direct counter"


def test_sizes_are_powers_of_two():
    c = p4prog.constants()
    for k in ("STATE_SLOTS", "RING_SLOTS"):
        assert c[k] > 0 and c[k] & (c[k] - 1) == 0, k


def test_missing_header_is_a_clear_error():
    with pytest.raises(p4prog.P4SourceError, match="no header nope_t"):
        p4ref.header_fields("nope_t")


def test_both_architectures_include_the_same_common_files():
    """One copy of the headers, parser, constants and controls: each architecture's top level
    includes every common file of p4/, and only its own arch folder besides."""
    common = {p.name for p in p4prog.P4_DIR.glob("*.p4")}
    for arch, main in p4prog.MAINS.items():
        files = p4ref.source_files(main)
        assert {f.name for f in files if f.parent == p4prog.P4_DIR.resolve()} == common, arch
        assert {f.parent.name for f in files if f.parent != p4prog.P4_DIR.resolve()} == {arch}, arch


def test_no_register_or_value_wider_than_64_bits():
    """Registers and arithmetic of at most 64 bits on both architectures (the SWX pipeline's limit):
    no bit<N> with N > 64 anywhere in p4/."""
    for path in p4prog.P4_DIR.rglob("*.p4"):
        widths = [int(w) for w in re.findall(r"bit<(\d+)>", p4prog.strip_comments(path.read_text()))]
        assert all(w <= 64 for w in widths), (path, max(widths))


def test_arch_parts_only_in_arch_files():
    """v1model's and PNA's own names appear only in their arch folders (the common files use the
    EMBNIC_* macros and local_metadata_t)."""
    arch_words = re.compile(r"standard_metadata|mark_to_drop|\btruncate\b|\bregister<|\bcounter\(|"
                            r"direct_counter|HashAlgorithm|v1model\.p4|pna\.p4|\bRegister<|\bCounter<|"
                            r"DirectCounter|drop_packet|send_to_port|PNA_|istd\b")
    for path in p4prog.P4_DIR.glob("*.p4"):
        hits = arch_words.findall(p4prog.strip_comments(path.read_text()))
        assert not hits, (path.name, hits)


def test_missing_include_is_a_clear_error(tmp_path):
    (tmp_path / "top.p4").write_text('#include "nope.p4"\n')
    with pytest.raises(p4prog.P4SourceError, match="nope.p4"):
        p4ref.source_files(tmp_path / "top.p4")


def test_state_slot_per_architecture():
    """v1model: zlib's CRC-32 of the big-endian ids; PNA: DPDK's rte_hash_crc (CRC-32C, seed 0, no
    final XOR) of the ids as p4c-dpdk lays them out (little-endian metadata)."""
    import struct
    import zlib

    assert p4ref.state_slot(1, 1001) == zlib.crc32(bytes([0, 1, 0, 0, 3, 0xE9])) % 4096
    # the CRC-32C check value (RFC 3720) from the raw function: init ~0, final XOR ~0
    assert p4ref.crc32c_raw(b"123456789", 0xFFFFFFFF) ^ 0xFFFFFFFF == 0xE3069283
    assert p4ref.state_slot(1, 1001, arch="pna") == p4ref.crc32c_raw(struct.pack("<HI", 1, 1001)) >> 20
    # the top bits: consecutive msg_ids of a client spread over the slots (the low 12 bits of this
    # CRC reach exactly half of them: 2048)
    c = p4prog.constants()
    assert c["STATE_SLOTS"] == 1 << c["STATE_SLOT_BITS"]
    assert len({p4ref.state_slot(1, m, arch="pna") for m in range(1000, 5096)}) > 4000
    assert len({p4ref.crc32c_raw(struct.pack("<HI", 1, m)) & 4095 for m in range(1000, 5096)}) == 2048
    assert p4ref.state_slot(1, 1001, arch="pna") != p4ref.state_slot(1, 1001)
    with pytest.raises(ValueError, match="unknown architecture"):
        p4ref.state_slot(1, 1, arch="tna")
