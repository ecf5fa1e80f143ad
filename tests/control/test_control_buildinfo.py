"""Build info from the ELF section `.embnic_buildinfo` (pyelftools) and `embnic inspect`.

Uses small ELF programs compiled here with gcc (tests/control/ctl_elf.py); the real
embnic-dp is covered in test_control_dataplane_real.py.
Run alone: python3 -m pytest -q tests/control/test_control_buildinfo.py
"""
from __future__ import annotations

import json
import shutil
import struct

import pytest

from embnic.client_lib import consts
from embnic.control import buildinfo


def test_reader_layout_is_the_c_struct(tmp_path):
    """The Python reader's size and offsets are those gcc gives the card's own header."""
    import ctl_elf

    if not ctl_elf.have_cc():
        pytest.fail("gcc not installed: scripts/install-deps.sh installs build-essential")
    size, nf, fields, git, dpdk, fsize = ctl_elf.c_layout("", [
        "sizeof(struct embnic_buildinfo)", "offsetof(struct embnic_buildinfo, n_fields)",
        "offsetof(struct embnic_buildinfo, fields)", "offsetof(struct embnic_buildinfo, git_rev)",
        "offsetof(struct embnic_buildinfo, dpdk_version)", "sizeof(struct embnic_buildinfo_field)"], tmp_path)
    assert buildinfo.SIZE == size
    assert (buildinfo._HEAD.size, buildinfo._FIELD.size) == (fields, fsize) and nf == fields - 4
    assert fields + buildinfo.MAX_FIELDS * fsize == git and git + buildinfo._TAIL.size - 32 == dpdk


def test_parse_roundtrip_and_size():
    fields = b"".join(struct.pack("<16sHH", n.encode(), o, s) for n, o, s in consts.HEADER_FIELDS)
    fields += b"\0" * (20 * (24 - len(consts.HEADER_FIELDS)))
    data = struct.pack("<8s9I", b"EMBNICBI", 1, consts.VERSION, consts.HDR_LEN, 7878, 4096, 256, 512, 65536,
                       len(consts.HEADER_FIELDS))
    data += fields + struct.pack("<41s32s", b"abc", b"DPDK 22.11.1")
    bi = buildinfo.parse(data)
    assert bi.fields == consts.HEADER_FIELDS
    assert (bi.route_table_size, bi.client_table_size, bi.git_rev, bi.dpdk_version) == (256, 512, "abc", "DPDK 22.11.1")
    assert buildinfo.check(bi) == []
    with pytest.raises(buildinfo.BuildInfoError, match="magic"):
        buildinfo.parse(b"XXXXXXXX" + data[8:])
    assert len(data) == buildinfo.SIZE
    with pytest.raises(buildinfo.BuildInfoError, match=f"{len(data) - 1} bytes, expected {len(data)}"):
        buildinfo.parse(data[:-1])


def test_read_matching_binary(fake_dp_factory):
    bi = buildinfo.read(fake_dp_factory())
    assert (bi.proto_version, bi.hdr_len, bi.udp_port) == (consts.VERSION, consts.HDR_LEN, consts.UDP_PORT)
    assert bi.fields == consts.HEADER_FIELDS
    assert buildinfo.check(bi) == []
    assert buildinfo.check(bi, udp_port=9999) == ["udp_port 7878 != cluster.udp_port 9999"]


def test_check_lists_every_mismatch(fake_dp_factory):
    fields = list(consts.HEADER_FIELDS)
    fields[6] = ("msg_id", 9, 4)
    v, h = consts.VERSION, consts.HDR_LEN
    bi = buildinfo.read(fake_dp_factory(proto_version=v + 1, hdr_len=h + 4, fields=tuple(fields[:-1])))
    diffs = buildinfo.check(bi)
    assert f"proto_version {v + 1} != client library's {v}" in diffs
    assert f"hdr_len {h + 4} != client library's {h}" in diffs
    assert "header field msg_id at offset 9 size 4 != client library's offset 8 size 4" in diffs
    assert "header field reserved missing from the binary" in diffs
    with pytest.raises(buildinfo.BuildInfoError, match=f"refusing .*proto_version {v + 1}.*make -C dataplane"):
        buildinfo.require_compatible(bi.path)


def test_inspect_text_and_json(invoke, fake_dp_factory):
    p = fake_dp_factory()
    r = invoke("inspect", p)
    assert r.exit_code == 0, r.output
    assert f"protocol:      v{consts.VERSION}, header {consts.HDR_LEN} bytes, UDP port 7878" in r.output
    assert "compatible:    yes" in r.output
    assert "DPDK 22.11.fake" in r.output and "msg_id@8/4" in r.output
    d = json.loads(invoke("inspect", "--json", p).output)
    assert d["compatible"] is True and d["proto_version"] == consts.VERSION
    assert len(d["fields"]) == len(consts.HEADER_FIELDS)
    assert d["git_rev"] == "0123456789abcdef0123456789abcdef01234567"


def test_inspect_wrong_version(invoke, fake_dp_factory):
    p = fake_dp_factory(proto_version=1)  # a card of protocol version 1, whose frames v2 drops
    r = invoke("inspect", p)
    assert r.exit_code == 0
    assert f"compatible:    NO: proto_version 1 != client library's {consts.VERSION}" in r.output
    assert json.loads(invoke("inspect", "--json", p).output)["compatible"] is False
    r = invoke("inspect", "--check", p)
    assert r.exit_code == 1 and "does not match the client library" in r.output


def test_inspect_errors(invoke, tmp_path):
    r = invoke("inspect", tmp_path / "none")
    assert r.exit_code == 2 and "no such file" in r.output  # a missing input file is a usage error
    txt = tmp_path / "t.txt"
    txt.write_text("hello")
    r = invoke("inspect", txt)  # no ELF at all: the wrong file was given (usage); a damaged ELF is 1 (rebuild)
    assert r.exit_code == 2 and "not an ELF binary: give the path of embnic-dp" in r.output
    r = invoke("inspect", shutil.which("true") or "/bin/true")
    assert r.exit_code == 1 and "no .embnic_buildinfo section" in r.output
    r = invoke("inspect", tmp_path)
    assert r.exit_code == 2 and "is a directory" in r.output


def test_inspect_default_binary(invoke, fake_dp_factory, monkeypatch):
    monkeypatch.setenv("EMBNIC_DP", str(fake_dp_factory()))
    r = invoke("inspect")
    assert r.exit_code == 0 and "compatible:    yes" in r.output
    monkeypatch.setenv("EMBNIC_DP", "/nonexistent/embnic-dp")
    r = invoke("inspect")
    assert r.exit_code == 2 and "EMBNIC_DP=/nonexistent/embnic-dp does not exist" in r.output


@pytest.mark.parametrize("size", [30, 100, 5000])
def test_truncated_elf_names_the_file_and_the_fix(invoke, fake_dp_factory, tmp_path, size):
    """pyelftools' ELFParseError ("Reading section 0 at offset ... past EOF 100") became a bare
    "Error: ELFParseError: ..." without the file name."""
    cut = tmp_path / "embnic-dp"
    cut.write_bytes(fake_dp_factory().read_bytes()[:size])
    with pytest.raises(buildinfo.BuildInfoError) as e:
        buildinfo.read(cut)
    assert str(e.value.message).startswith(f"{cut} is not a valid ELF binary (")
    assert e.value.message.endswith("rebuild with `make -C dataplane`")
    r = invoke("inspect", cut)
    assert r.exit_code == 1
    assert f"{cut} is not a valid ELF binary" in r.output and "ELFParseError" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_inspect_usage_shows_binary_as_optional(invoke):
    r = invoke("inspect", "--help")
    assert "Usage: cli inspect [OPTIONS] [BINARY]" in r.output
