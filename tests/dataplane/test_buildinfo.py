"""The card's .embnic_buildinfo ELF section and C header layout vs the Python protocol definition.

Reads the section with pyelftools (layout: docs/control-socket.md), compares the header field
names/offsets/sizes with embnic.client_lib.consts.HEADER_FIELDS, checks the C struct layout
through DWARF (the binary is built with -g) and the X-macro table that embnic_proto.h's
static_asserts use, and that EMBNIC_PROTO_VERSION=N builds a binary that says and speaks N.
Run alone: python3 -m pytest -q tests/dataplane/test_buildinfo.py  (the last test needs root)
"""
from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile

from embnic.client_lib import consts
from embnic.control.targets.dpdk.process import build_card

REPO = Path(__file__).resolve().parents[2]
#: struct embnic_buildinfo (docs/control-socket.md), packed little-endian
HEAD = struct.Struct("<8s9I")
FIELD = struct.Struct("<16sHH")
MAX_FIELDS, GIT_LEN, DPDK_LEN = 24, 41, 32
SIZE = HEAD.size + MAX_FIELDS * FIELD.size + GIT_LEN + DPDK_LEN


def read_buildinfo(path: Path) -> dict:
    """Decode .embnic_buildinfo of an ELF file."""
    with open(path, "rb") as f:
        sec = ELFFile(f).get_section_by_name(".embnic_buildinfo")
        assert sec is not None, f"{path} has no .embnic_buildinfo section"
        data = sec.data()
    assert len(data) == SIZE, f"section is {len(data)} bytes, the spec says {SIZE}"
    names = ("magic", "info_version", "proto_version", "hdr_len", "udp_port", "ring_size",
             "route_table_size", "client_table_size", "state_table_size", "n_fields")
    bi = dict(zip(names, HEAD.unpack_from(data)))
    fields = []
    for i in range(bi["n_fields"]):
        n, off, sz = FIELD.unpack_from(data, HEAD.size + i * FIELD.size)
        fields.append((n.rstrip(b"\0").decode(), off, sz))
    bi["fields"] = tuple(fields)
    tail = HEAD.size + MAX_FIELDS * FIELD.size
    bi["git_rev"] = data[tail:tail + GIT_LEN].split(b"\0")[0].decode()
    bi["dpdk_version"] = data[tail + GIT_LEN:].split(b"\0")[0].decode()
    return bi


@pytest.fixture(scope="module")
def bi(built_card):
    return read_buildinfo(built_card)


def test_section_header(bi):
    assert bi["magic"] == b"EMBNICBI"
    assert bi["info_version"] == 1
    assert bi["proto_version"] == consts.VERSION
    assert bi["hdr_len"] == consts.HDR_LEN
    assert bi["udp_port"] == consts.UDP_PORT
    assert bi["ring_size"] == 4096 and bi["state_table_size"] == 65536
    assert bi["route_table_size"] >= 1024 and bi["client_table_size"] >= 1024


def test_section_fields_match_python(bi):
    assert bi["fields"] == consts.HEADER_FIELDS


def test_git_rev_and_dpdk_version(bi):
    rev = bi["git_rev"]
    assert rev == "unknown" or re.fullmatch(r"[0-9a-f]{40}", rev)
    if rev != "unknown":  # the commit it was built from is in this checkout's history
        r = subprocess.run(["git", "-C", str(REPO), "merge-base", "--is-ancestor", rev, "HEAD"])
        assert r.returncode == 0, f"built from {rev}, not an ancestor of HEAD"
    want = subprocess.run(["pkg-config", "--modversion", "libdpdk"], capture_output=True,
                          text=True).stdout.strip()
    assert bi["dpdk_version"] == f"DPDK {want}"


def _strip(die):
    """Follow typedef/const/volatile to the underlying type DIE."""
    while die.tag in ("DW_TAG_typedef", "DW_TAG_const_type", "DW_TAG_volatile_type"):
        die = die.get_DIE_from_attribute("DW_AT_type")
    return die


def test_c_struct_layout_from_dwarf(built_card):
    """struct embnic_hdr as compiled: member offsets and sizes equal HEADER_FIELDS."""
    with open(built_card, "rb") as f:
        elf = ELFFile(f)
        assert elf.has_dwarf_info(), "embnic-dp built without -g"
        for cu in elf.get_dwarf_info().iter_CUs():
            for die in cu.iter_DIEs():
                if (die.tag == "DW_TAG_structure_type" and "DW_AT_name" in die.attributes
                        and die.attributes["DW_AT_name"].value == b"embnic_hdr"
                        and "DW_AT_byte_size" in die.attributes):
                    members = []
                    for m in die.iter_children():
                        if m.tag != "DW_TAG_member":
                            continue
                        t = _strip(m.get_DIE_from_attribute("DW_AT_type"))
                        members.append((m.attributes["DW_AT_name"].value.decode(),
                                        m.attributes["DW_AT_data_member_location"].value,
                                        t.attributes["DW_AT_byte_size"].value))
                    assert die.attributes["DW_AT_byte_size"].value == consts.HDR_LEN
                    assert tuple(members) == consts.HEADER_FIELDS
                    return
    pytest.fail("struct embnic_hdr not found in the DWARF info")


def test_c_static_assert_table_matches_python():
    """The numbers embnic_proto.h static_asserts the struct against are the Python ones."""
    text = (REPO / "include" / "embnic_proto.h").read_text()
    block = text[text.index("#define EMBNIC_HDR_FIELDS(X)"):]
    block = block[:block.index("\n\n")]
    rows = tuple((n, int(o), int(s)) for n, o, s in re.findall(r"X\((\w+), (\d+), (\d+)\)", block))
    assert rows == consts.HEADER_FIELDS
    # the directory entry: the same table as consts.DIR_ENTRY_FIELDS (offsets from numpy's layout)
    block = text[text.index("#define EMBNIC_DIR_FIELDS(X)"):]
    block = block[:block.index("\n\n")]
    rows = tuple((n, int(o), int(s)) for n, o, s in re.findall(r"X\((\w+), (\d+), (\d+)\)", block))
    dt = np.dtype(list(consts.DIR_ENTRY_FIELDS))
    assert rows == tuple((n, dt.fields[n][1], dt.fields[n][0].itemsize) for n in dt.names)
    assert dt.itemsize == consts.DIR_ENTRY
    assert f"#define EMBNIC_HDR_LEN\t\t{consts.HDR_LEN}" in text
    assert f"#define EMBNIC_UDP_PORT\t\t{consts.UDP_PORT}" in text
    assert f"#define EMBNIC_MAX_FRAGS\t{consts.MAX_FRAGS}\t" in text
    assert f"#define EMBNIC_MAGIC\t\t0x{consts.MAGIC:04X}" in text


@pytest.fixture(scope="module")
def v3_card(built_card, tmp_path_factory):
    """embnic-dp built with EMBNIC_PROTO_VERSION=3 (a version after this one) into a temporary
    BUILD directory."""
    return build_card(tmp_path_factory.mktemp("v3"), EMBNIC_PROTO_VERSION="3")


def test_proto_version_knob(v3_card, bi):
    v3 = read_buildinfo(v3_card)
    assert v3["proto_version"] == 3
    assert v3["fields"] == bi["fields"]


@pytest.mark.dataplane
@pytest.mark.root
def test_proto_version_knob_changes_the_parser(v3_card, card_bin, tmp_path):
    """The v3 binary drops a valid v2 frame as bad_version (so the knob is not just a label)."""
    from conformance import Suite, write_pcap
    from embnic.control.targets.dpdk.process import CardProcess
    from drain import wait_drained

    s = Suite.default()
    frames = [f.data for f in s.frames if f.label.startswith("c1 lookup s0[")]
    write_pcap(tmp_path / "in.pcap", frames)
    card = CardProcess(v3_card, [f"net_pcap0,rx_pcap={tmp_path / 'in.pcap'},tx_pcap={tmp_path / 'out.pcap'}"],
                       lcores="0", port_ips={0: "10.1.0.1"})
    card.start()
    try:
        c = wait_drained(card, len(frames))
    finally:
        card.stop()
        card.cleanup()
    assert c["drops"]["bad_version"] == len(frames) == 1
