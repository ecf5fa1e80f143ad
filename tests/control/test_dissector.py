"""The generated Wireshark dissector (embnic.control.dissector, contrib/wireshark/embnic.lua).

The shipped plug-in is what the generator makes of today's field table; consts' reader data
(FIELD_DOCS, BODY_LAYOUT, HEADER_COUNT_RULES) agree with the codec; and the real tshark (Debian's
``tshark``), with the plug-in loaded by ``-X lua_script:`` and two passes (``-2``), shows for
every frame of the committed v2 trace (tests/testbed/cases/replay-not-owner, recorded by ``embnic
trace record``) and of the conformance suite (tests/dataplane/conformance_cases.py) exactly the
header fields the Scapy layer decodes (Embnic, EmbnicDirEntry), the directory entries and keys
``codec.parse_request_body`` reads (keys grouped per table), the rows and gradients per table of
the directory known at that frame (a reply's from its request), SIZE_REQ entries, an
UPDATE_NACK's fragments held, each reply linked to its request, and every malformed frame
flagged with the receivers' drop reason as an expert-info error: the codec's header checks and
the fragment geometry (the client's ``reassembly.fragment_size``). Frame by frame against the
card itself: the conformance suite's frames, the fuzzers' seeds (dataplane/fuzz/seeds) and
hand-made faults go through ``dataplane/parse.c`` (``embnic_parse`` → ``embnic_check_lengths``,
built into a shared library here) and a shard's directory check (``codec.parse_request_body``),
and tshark flags exactly the frames they refuse, with the card's reason name. A UDP GSO send (a
shard's reply captured before its kernel cut it into frames) reads as the frames it becomes.

Run alone: python3 -m pytest -q tests/control/test_dissector.py
"""
from __future__ import annotations

import collections
import itertools
import json
import math
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from embnic.client_lib import codec, consts, reassembly
from embnic.client_lib.consts import DType, MsgType
from embnic.client_lib.protocol import Embnic, EmbnicDirEntry
from embnic.control import dissector
from embnic.control.pcap import write_pcap

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "tests" / "testbed" / "cases" / "replay-not-owner" / "t.pcap"
SHIPPED = REPO / dissector.SHIPPED_PATH
HEADER_NAMES = [n for n, _, _ in consts.HEADER_FIELDS]
DIR_FIELDS = [f"embnic.table.{n}" for n, _ in consts.DIR_ENTRY_FIELDS]
ENTRY_FIELDS = [f"embnic.entry.{n}" for n, _ in consts.SIZE_ENTRY_FIELDS]
BODY_FIELDS = (["embnic.key", "embnic.key.table", "embnic.row.table", "embnic.row.value", "embnic.gradient.table",
                "embnic.gradient.value", "embnic.partial", "embnic.undecoded", "embnic.held.fragment",
                "embnic.held.missing", "embnic.directory_in"] + DIR_FIELDS + ENTRY_FIELDS)
LINK_FIELDS = ["embnic.request_in", "embnic.response_in", "embnic.time", "embnic.drop_reason"]
GSO_FIELDS = ["embnic.gso_frame", "embnic.gso_size"]
EXPERT_FIELDS = ["_ws.expert.message", "_ws.expert.severity", "_ws.expert.group"]
PI_ERROR, PI_MALFORMED = 0x00800000, 0x07000000  # epan/proto.h severity and group


# ---------------------------------------------------------------- the generator and consts

def test_shipped_plugin_is_generated_from_consts():
    assert SHIPPED.read_text() == dissector.generate_lua(), (
        f"{dissector.SHIPPED_PATH} is stale: run `embnic dissector --out {dissector.SHIPPED_PATH}`")


def test_cli_writes_the_plugin(tmp_path, invoke):
    out = tmp_path / "embnic.lua"
    r = invoke("dissector", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert out.read_text() == dissector.generate_lua()
    r = invoke("dissector")
    assert r.exit_code == 0 and r.output == dissector.generate_lua()


@pytest.mark.parametrize("where,msg", [("nodir/x.lua", "does not exist"), (".", "is a folder")])
def test_cli_bad_out_is_one_line_usage_error(tmp_path, invoke, where, msg):
    r = invoke("dissector", "--out", str(tmp_path / where))
    assert r.exit_code == 2
    assert msg in r.output and len(r.output.strip().splitlines()) == 1


def test_field_docs_name_every_header_field_in_order():
    assert list(consts.FIELD_DOCS) == HEADER_NAMES
    for name, d in consts.FIELD_DOCS.items():
        assert d.title and d.meaning, name


def _header(**kw) -> bytes:
    """One valid single-fragment LOOKUP_REQ of 1 key of one table (dim 4, fp32), fields
    overridden by ``kw``."""
    f = dict(magic=consts.MAGIC, version=consts.VERSION, msg_type=1, flags=0, reserved0=0, status=0,
             msg_id=1, client_id=1, shard_id=0, num_tables=1, table_id=consts.NO_TABLE, num_keys=1,
             value_len=16, msg_len=24, frag_offset=0, frag_index=0, frag_count=1, frag_len=24, reserved=0)
    f.update(kw)
    return codec.Header(**f).pack() + b"\0" * 24


def test_field_doc_checks_are_the_codecs():
    """A value outside ``expect`` / the value names is dropped by the codec with that reason."""
    assert codec.parse_header(_header())
    for name, d in consts.FIELD_DOCS.items():
        if d.drop_reason is None:
            continue
        bad = (d.expect + 1) if d.expect is not None else max(int(v) for v in d.values) + 1
        with pytest.raises(codec.FrameError) as e:
            codec.parse_header(_header(**{name: bad}))
        assert e.value.reason == d.drop_reason, name
    with pytest.raises(codec.FrameError) as e:  # a v1 frame
        codec.parse_header(_header(version=1))
    assert e.value.reason == "bad_version"


def _layout_len(t, T, n, vl) -> int:
    """Body bytes of a message of type ``t`` by BODY_LAYOUT."""
    h = {"num_tables": T, "num_keys": n, "value_len": vl}
    total = 0
    for s in consts.BODY_LAYOUT[t]:
        e = consts.BODY_ELEMENTS[s.element]
        if s.nbytes is not None:
            total += h[s.nbytes]
            continue
        count = s.count if isinstance(s.count, int) else h[s.count]
        if e.numpy:
            size = np.dtype(e.numpy).itemsize
        elif e.fields:
            size = np.dtype(list(e.fields)).itemsize
        else:
            size = e.bits // 8
        total += count * size
    return total


def test_body_layout_is_expected_msg_len():
    assert set(consts.BODY_LAYOUT) == set(MsgType)
    for t, T, n, vl in itertools.product(MsgType, (0, 1, 3, 26), (0, 1, 7, 400), (0, 2, 96, 12800)):
        assert _layout_len(t, T, n, vl) == consts.expected_msg_len(t, T, n, vl), (t, T, n, vl)


def test_count_rules_are_header_counts_ok():
    ops = {">=": lambda a, b: a >= b, "==": lambda a, b: a == b}
    for t, T, n, vl in itertools.product(range(0, 10), range(0, 4), range(0, 5), range(0, 11)):
        h = {"num_tables": T, "num_keys": n, "value_len": vl}
        rules = consts.HEADER_COUNT_RULES.get(t, ())
        ok = all(ops[op](h[f], k * (h[o] if o else 1)) for f, op, k, o in rules)
        assert ok == consts.header_counts_ok(t, T, n, vl), (t, T, n, vl)


def test_generator_refuses_data_it_cannot_read(monkeypatch):
    """The generator checks the data it interprets: a section whose count is no header field."""
    bad = dict(consts.BODY_LAYOUT)
    bad[MsgType.SIZE_REQ] = (consts.BodySection("entries", "entry", "size_entry", count="num_entries"),)
    monkeypatch.setattr(consts, "BODY_LAYOUT", bad)
    with pytest.raises(ValueError, match="num_entries"):
        dissector.generate_lua()


# ---------------------------------------------------------------- tshark

def _tshark() -> str:
    exe = shutil.which("tshark")
    if exe is None:
        pytest.skip("tshark not installed: apt-get install tshark (scripts/apt-packages.txt; "
                    "scripts/install-deps.sh answers its debconf question)")
    return exe


def run_tshark(pcap: Path, home: Path, *extra: str) -> list[dict]:
    """Every frame of ``pcap`` dissected by tshark with the shipped plug-in, two passes: one
    dict per frame of the embnic fields, links, expert infos and ``frame.*`` fields asked."""
    fields = (["frame.number", "frame.time_epoch", "frame.protocols"] + [f"embnic.{n}" for n in HEADER_NAMES]
              + BODY_FIELDS + LINK_FIELDS + GSO_FIELDS + EXPERT_FIELDS)
    cmd = [_tshark(), "-n", "-r", str(pcap), "-X", f"lua_script:{SHIPPED}", "-2", "-T", "json", *extra]
    for f in fields:
        cmd += ["-e", f]
    # a HOME of its own: no personal plug-ins folder (a second copy of the plug-in) or prefs
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Lua" not in r.stderr and "lua" not in r.stderr, r.stderr[-2000:]
    return [x["_source"]["layers"] for x in json.loads(r.stdout)]


def receiver_verdict(payload: bytes) -> str | None:
    """The drop reason every receiver gives a UDP payload from its header alone (the codec's
    header checks, then the fragment's geometry: the client's ``fragment_size``), or None."""
    try:
        reassembly.fragment_size(codec.parse_header(payload))
    except codec.FrameError as e:
        return e.reason
    return None


def _ints(layers: dict, field: str) -> list[int]:
    return [int(v, 0) for v in layers.get(field, [])]


def _f32(text: str) -> np.float32:
    return np.float32(float(text))


def _same_values(got: list[str], want: np.ndarray) -> bool:
    """tshark's value strings are the float32s of ``want`` (NaN: any NaN)."""
    want = np.asarray(want, dtype=np.float32).ravel()
    if len(got) != len(want):
        return False
    g = np.array([_f32(s) for s in got], dtype=np.float32)
    return bool(np.all((g == want) | (np.isnan(g) & np.isnan(want))))


def _udp_payload(p) -> bytes | None:
    """The UDP payload of a Scapy packet, cut at the UDP length (no Ethernet padding)."""
    if UDP not in p:
        return None
    raw = bytes(p[UDP])
    return raw[8:max(8, min(len(raw), p[UDP].len or 0))]


def _overlap(g0: int, n: int, esz: int, lo: int, hi: int) -> range:
    """Indices ``i`` of the elements ``[g0 + i*esz, g0 + (i+1)*esz)``, ``0 <= i < n``, that
    overlap body bytes ``[lo, hi)``."""
    if esz <= 0 or n <= 0:
        return range(0)
    first = max(0, (lo - g0) // esz)
    return range(first, max(first, min(n, -(-(hi - g0) // esz))))


class FirstPass:
    """What the plug-in knows at each valid frame of a capture, taken in capture order (the
    oracle of its first pass, from docs/protocol.md and the codec): the exchange a frame belongs
    to (by (client id, message id); a reply answers the open request Scapy's ``answers`` says;
    a request after its reply began opens a new one) and the directory of its message — every
    byte of it seen at or before this frame in frames of the same message (equal
    ``consts.MESSAGE_FIELDS``) — or, for a reply, of its request's message."""

    def __init__(self):
        self.open_tx: dict = {}
        self.msgs: dict = {}

    def frame(self, n: int, h: codec.Header, pkt, payload: bytes) -> dict:
        key = (h.client_id, h.msg_id)
        tx = self.open_tx.get(key)
        st = {"kind": "orphan", "tx": None, "msg": None}
        if h.msg_type in consts.REQUEST_TYPES:
            if tx is None or tx["reply"] is not None or tx["type"] != h.msg_type:
                tx = self.open_tx[key] = {"first": n, "type": h.msg_type, "reply": None, "pkt": pkt, "msg": None}
            st.update(kind="request", tx=tx)
            if h.msg_type in consts.DATA_REQUEST_TYPES:
                tx["msg"] = st["msg"] = self._collect(n, h, payload)
        elif tx is not None and pkt.answers(tx["pkt"]):
            tx["reply"] = tx["reply"] or n
            st.update(kind="reply", tx=tx, msg=tx["msg"])
        st["dir"] = st["msg"]["dir"] if st["msg"] else None
        return st

    def _collect(self, n: int, h: codec.Header, payload: bytes) -> dict:
        size = consts.DIR_ENTRY * h.num_tables
        m = self.msgs.setdefault(tuple(getattr(h, f) for f in consts.MESSAGE_FIELDS), {
            "h": h, "bytes": bytearray(size), "seen": [False] * size, "dir": None})
        if m["dir"] is None:
            frag = payload[consts.HDR_LEN:]
            for i in range(h.frag_offset, min(size, h.frag_offset + len(frag))):
                if not m["seen"][i]:
                    m["bytes"][i], m["seen"][i] = frag[i - h.frag_offset], True
            if all(m["seen"]):
                raw = bytes(m["bytes"])
                try:  # the request's directory against its header, as a host reads it
                    rb = codec.parse_request_body(h, raw + bytes(consts.KEY_SIZE * h.num_keys))
                    fault = None
                except codec.DirectoryError as e:
                    rb, fault = None, str(e)
                m["dir"] = {"frame": n, "raw": raw, "rb": rb, "fault": fault}
        return m


#: message types whose bodies are read with a directory (sections grouped per table)
TABLE_TYPES = {t for t, ss in consts.BODY_LAYOUT.items() if any(s.per_table for s in ss)}


def _directory_for(h: codec.Header, st: dict):
    """(the RequestBody of the directory the frame is read with or None, fault or None)."""
    d = st["dir"]
    if d is None or h.msg_type not in TABLE_TYPES:
        return None, None
    if d["fault"]:
        return None, d["fault"]
    e = d["rb"].directory
    if (len(e), int(e["num_keys"].sum()), codec.value_len_of(e)) != (h.num_tables, h.num_keys, h.value_len):
        return None, "does not fit this reply"
    return d["rb"], None


def expected_body(h: codec.Header, payload: bytes, st: dict) -> dict:
    """The plug-in's body fields of one valid frame by the codec: this fragment's whole
    elements, its cut ones (``partial``, hex), the tables of the groups it shows, undecoded
    row bytes, the fragments an UPDATE_NACK holds (and misses)."""
    frag = payload[consts.HDR_LEN:]
    lo, hi = h.frag_offset, h.frag_offset + len(frag)
    body = bytearray(h.msg_len)
    body[lo:hi] = frag
    body = bytes(body)
    rb, fault = _directory_for(h, st)
    want = collections.defaultdict(list)
    partial = []

    def run(item, g0, n, esz, value, table=None):
        if table is not None and _overlap(g0, n, esz, lo, hi):
            want[f"{item}.table"].append(table)
        for i in _overlap(g0, n, esz, lo, hi):
            a, b = g0 + i * esz, g0 + (i + 1) * esz
            if lo <= a and b <= hi:
                want[item].append(value(i))
            else:
                partial.append((max(a, lo), body[max(a, lo):min(b, hi)].hex()))

    def rows(item, g0, section_len):
        if rb is None:
            a, b = max(g0, lo), min(g0 + section_len, hi)
            if a < b:
                want["undecoded"].append(body[a:b].hex())
            return
        d = rb.directory
        for t in range(len(d)):
            vals = codec.table_values(body[g0:g0 + section_len], rb, t)
            run(item, g0 + int(rb.value_offsets[t]), int(d["num_keys"][t]), vals.itemsize * vals.shape[1],
                lambda i, v=vals: v[i], int(d["table_id"][t]))

    t, T, n = h.msg_type, h.num_tables, h.num_keys
    if t in consts.DATA_REQUEST_TYPES:
        entries = np.frombuffer(body, codec.DIR_DTYPE, count=T)
        run("table", 0, T, consts.DIR_ENTRY, lambda i: entries[i])
        base = consts.DIR_ENTRY * T
        keys = codec.body_to_keys(body, n, base)
        if rb is None:
            run("key", base, n, consts.KEY_SIZE, lambda i: keys[i])
        else:
            ko, d = rb.key_offsets, rb.directory
            for j in range(T):
                run("key", base + consts.KEY_SIZE * int(ko[j]), int(d["num_keys"][j]), consts.KEY_SIZE,
                    lambda i, k0=int(ko[j]): keys[k0 + i], int(d["table_id"][j]))
        if t == MsgType.UPDATE_REQ:
            rows("gradient", base + consts.KEY_SIZE * n, h.value_len)
    elif t == MsgType.LOOKUP_REPLY:
        rows("row", 0, h.value_len)
    elif t == MsgType.SIZE_REQ:
        entries = codec.body_to_size_entries(body, n)
        run("entry", 0, n, consts.SIZE_ENTRY, lambda i: entries[i])
    elif t == MsgType.UPDATE_NACK and lo == 0 and hi >= consts.NACK_LEN:
        held = codec.nack_held(body, consts.MAX_FRAGS)
        want["held.fragment"] = [int(i) for i in np.flatnonzero(held)]
        if st["msg"] is not None:
            fc = st["msg"]["h"].frag_count
            want["held.missing"] = [i for i in range(fc) if not held[i]]
    want["partial"] = [x for _, x in sorted(partial)]
    want["fault"] = fault
    want["directory_in"] = [st["dir"]["frame"]] if rb is not None else []
    return want


def check_frame(layers: dict, payload: bytes, st: dict) -> dict:
    """tshark's embnic fields of one valid frame equal the Scapy layer's header and directory
    entries and :func:`expected_body`; returns the expectation."""
    pkt = Embnic(payload)
    for name in HEADER_NAMES:
        assert _ints(layers, f"embnic.{name}") == [int(getattr(pkt, name))], name
    scapy_dir = []
    layer = pkt.payload
    while isinstance(layer, EmbnicDirEntry):
        scapy_dir.append(layer)
        layer = layer.payload
    for name, _ in consts.DIR_ENTRY_FIELDS:
        got = _ints(layers, f"embnic.table.{name}")
        assert got[:len(scapy_dir)] == [int(getattr(e, name)) for e in scapy_dir], name
    h = codec.parse_header(payload)
    want = expected_body(h, payload, st)
    for name, _ in consts.DIR_ENTRY_FIELDS:
        assert _ints(layers, f"embnic.table.{name}") == [int(e[name]) for e in want["table"]], name
    assert _ints(layers, "embnic.key") == [int(k) for k in want["key"]]
    for item in ("key", "row", "gradient"):
        assert _ints(layers, f"embnic.{item}.table") == want[f"{item}.table"], item
    for item in ("row", "gradient"):
        got = layers.get(f"embnic.{item}.value", [])
        assert _same_values(got, np.concatenate([np.ravel(r) for r in want[item]]) if want[item] else np.zeros(0)), item
    for name, _ in consts.SIZE_ENTRY_FIELDS:
        assert _ints(layers, f"embnic.entry.{name}") == [int(e[name]) for e in want["entry"]], name
    assert _ints(layers, "embnic.held.fragment") == want["held.fragment"]
    assert _ints(layers, "embnic.held.missing") == want["held.missing"]
    assert [s.replace(":", "") for s in layers.get("embnic.partial", [])] == want["partial"]
    assert [s.replace(":", "") for s in layers.get("embnic.undecoded", [])] == want["undecoded"]
    assert _ints(layers, "embnic.directory_in") == want["directory_in"]
    warned = [m for m in layers.get("_ws.expert.message", []) if "directory" in m.lower()]
    assert len(warned) == (1 if want["fault"] else 0), (warned, want["fault"])
    assert "embnic.drop_reason" not in layers
    return want


def first_pass(pcap_frames: list[tuple[int, bytes]]) -> dict:
    """:class:`FirstPass` over ``(frame number, UDP payload)`` of the valid frames, in order:
    frame number -> its state."""
    fp, out = FirstPass(), {}
    for n, payload in pcap_frames:
        assert receiver_verdict(payload) is None, n
        h = codec.parse_header(payload)
        out[n] = fp.frame(n, h, Embnic(payload), payload)
    return out


@pytest.fixture(scope="module")
def trace_frames(tmp_path_factory):
    home = tmp_path_factory.mktemp("tshark-home")
    return run_tshark(TRACE, home)


def test_trace_every_field_equals_scapy(trace_frames):
    """The recorded v2 trace: 1522 request frames (lookups and fragmented updates of many
    tables), every one read with its message's directory."""
    from scapy.utils import rdpcap

    pkts = rdpcap(str(TRACE))
    assert len(trace_frames) == len(pkts) > 1000
    states = first_pass([(i, _udp_payload(p)) for i, p in enumerate(pkts, 1)])
    seen = collections.Counter()
    for i, (layers, p) in enumerate(zip(trace_frames, pkts), 1):
        assert "embnic" in layers["frame.protocols"][0].split(":")
        want = check_frame(layers, _udp_payload(p), states[i])
        seen[(p[Embnic].msg_type, p[Embnic].frag_count > 1)] += 1
        seen["partial"] += bool(want["partial"])
        seen["grouped"] += bool(want["key.table"] or want["gradient.table"])
        seen["several tables"] += len(set(want["key.table"])) > 1
        seen["gradients"] += bool(want["gradient"])
        seen["undecoded"] += bool(want["undecoded"])
        # requests only (no reply was recorded): no link, no expert info
        assert not any(f in layers for f in LINK_FIELDS + EXPERT_FIELDS), layers.get("_ws.expert.message")
    assert (seen[(MsgType.LOOKUP_REQ, False)] and seen[(MsgType.UPDATE_REQ, True)] and seen["partial"]
            and seen["several tables"] and seen["gradients"]), seen
    assert seen["undecoded"] == 0 and seen["grouped"] == len(pkts), seen


@pytest.fixture(scope="module")
def conformance(tmp_path_factory):
    """The conformance suite's input frames in one pcap, 1 ms apart, tshark's view of them and
    the first-pass state of each valid embnic frame."""
    sys.path.insert(0, str(REPO / "tests" / "dataplane"))
    from conformance import Suite

    d = tmp_path_factory.mktemp("conformance-pcap")
    suite = Suite.default()
    frames = [f.data for f in suite.frames]
    times = [1_700_000_000 + i / 1000 for i in range(len(frames))]
    write_pcap(d / "all.pcap", frames, times)
    valid = []
    for n, f in enumerate(suite.frames, 1):
        p = _scapy(f.data)
        if _plain_ipv4_to_7878(p) and receiver_verdict(_udp_payload(p)) is None:
            valid.append((n, _udp_payload(p)))
    return suite, times, run_tshark(d / "all.pcap", d), first_pass(valid)


def _scapy(data: bytes):
    try:
        return Ether(data)
    except Exception:  # noqa: BLE001 - a frame too short for Scapy's Ethernet layer
        return None


def _plain_ipv4_to_7878(p) -> bool:
    """An Ethernet/IPv4 datagram, not an IP fragment, UDP to or from 7878: what Wireshark hands
    to the plug-in (it reads IPv6, an IPv4 fragment or another port otherwise)."""
    return (p is not None and IP in p and p[IP].version == 4 and not p[IP].flags.MF and p[IP].frag == 0
            and UDP in p and consts.UDP_PORT in (p[UDP].sport, p[UDP].dport))


def test_conformance_frames_fields_and_drop_reasons(conformance):
    suite, _, frames, states = conformance
    assert len(frames) == len(suite.frames)
    reasons, seen = collections.Counter(), collections.Counter()
    for n, (f, layers) in enumerate(zip(suite.frames, frames), 1):
        p = _scapy(f.data)
        mine = "embnic" in layers["frame.protocols"][0].split(":")
        assert mine == _plain_ipv4_to_7878(p), f.label
        if not mine:
            continue
        payload = _udp_payload(p)
        reason = receiver_verdict(payload)
        assert layers.get("embnic.drop_reason") == ([reason] if reason else None), f.label
        errors = [m for m, s, g in zip(layers.get("_ws.expert.message", []), _ints(layers, "_ws.expert.severity"),
                                       _ints(layers, "_ws.expert.group"))
                  if m.startswith("Malformed embnic frame")]
        if reason:
            reasons[reason] += 1
            sev = dict(zip(layers["_ws.expert.message"], zip(_ints(layers, "_ws.expert.severity"),
                                                            _ints(layers, "_ws.expert.group"))))
            assert len(errors) == 1 and errors[0].startswith(f"Malformed embnic frame ({reason}):"), f.label
            assert sev[errors[0]] == (PI_ERROR, PI_MALFORMED), f.label
            assert not any(k in layers for k in BODY_FIELDS), f.label  # a dropped frame's body is not read
        else:
            assert not errors, f.label
            try:
                want = check_frame(layers, payload, states[n])
            except AssertionError as e:
                raise AssertionError(f"frame {n} {f.label}: {e}") from None
            seen["rows by table"] += bool(want["row.table"])
            seen["rows undecoded"] += bool(want["undecoded"]) and p[Embnic].msg_type == MsgType.LOOKUP_REPLY
            seen["keys ungrouped"] += bool(want["key"]) and not want["key.table"]
            seen["fp16"] += any(getattr(r, "dtype", None) == np.float16 for r in want["row"] + want["gradient"])
            seen["reply misfit"] += bool(want["fault"])
            seen["missing"] += bool(want["held.missing"])
            seen["entries"] += bool(want["entry"])
    # every host-side drop reason but too_large (a receiver's size limit) occurs in the suite;
    # frag_mismatch: fragments cut at another size than their index says (the card's cases)
    assert set(reasons) == set(consts.DROP_REASONS) - {"too_large"}, reasons
    assert reasons["bad_version"] >= 2, reasons  # version 1 in a v2 header, a 40-byte v1 frame
    assert all(seen[k] for k in ("rows by table", "rows undecoded", "keys ungrouped", "fp16", "reply misfit",
                                 "missing", "entries")), seen


def test_conformance_update_nack_lists_the_fragments(conformance):
    """The NACK of the lost-fragment case: fragments 0, 2, 4, ... held; of its update's 3, 1 missing."""
    suite, _, frames, _ = conformance
    n = next(i for i, f in enumerate(suite.frames) if f.label.startswith("s0 UPDATE_NACK c2 (fragments 0 and 2"))
    assert _ints(frames[n], "embnic.held.fragment") == list(range(0, consts.MAX_FRAGS, 2))
    assert _ints(frames[n], "embnic.held.missing") == [1]


def test_conformance_replies_link_to_their_requests(conformance):
    """Request/response tracking by (client id, message id): each reply frame names the first
    frame of the request it answers (Scapy's ``answers``) and the time since it; that request's
    frames name the reply's first frame. A request after its reply began is a new exchange (a
    retransmission, or an update's fragments re-sent after an UPDATE_NACK); a reply that answers
    nothing open gets a note, not a link."""
    suite, times, frames, states = conformance
    links = 0
    for n, st in states.items():
        layers, tx = frames[n - 1], st["tx"]
        notes = [m for m in layers.get("_ws.expert.message", []) if m == "Reply to no request in this capture"]
        if st["kind"] == "request":
            assert _ints(layers, "embnic.response_in") == ([tx["reply"]] if tx["reply"] else []), n
            assert "embnic.request_in" not in layers and not notes, n
        elif st["kind"] == "reply":
            assert _ints(layers, "embnic.request_in") == [tx["first"]], n
            assert math.isclose(float(layers["embnic.time"][0]), times[n - 1] - times[tx["first"] - 1],
                                abs_tol=2e-6), n
            assert "embnic.response_in" not in layers and not notes, n
            links += 1
        else:
            assert not any(f in layers for f in ("embnic.request_in", "embnic.response_in")) and notes, n
    assert links >= 15 and sum(st["kind"] == "orphan" for st in states.values()) >= 5


def _frames(payloads: list[bytes], sport: int = 40000, dport: int = consts.UDP_PORT) -> list[bytes]:
    return [bytes(Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=sport, dport=dport) / Raw(p))
            for p in payloads]


def test_directories_across_fragments_and_faults(tmp_path):
    """A directory of 100 tables (1600 bytes: fragments 0 and 1, entry 89 cut between them) is
    complete at fragment 1 and read from there on, also by the reply; fragments sent before it are
    read without it; a directory that does not add up is a warning and not used."""
    rng = np.random.default_rng(5)
    T = 100
    d = codec.make_directory(np.arange(T) + 10, rng.integers(1, 9, T), rng.choice([1, 2], T), rng.integers(1, 4, T))
    n = int(d["num_keys"].sum())
    keys = rng.integers(0, 2**64, n, dtype=np.uint64)
    grads = [rng.standard_normal((int(c), int(dim))) for c, dim in zip(d["num_keys"], d["dim"])]
    values = codec.values_to_body(grads, d["dtype"])
    upd = codec.encode_update(msg_id=7, client_id=3, shard_id=1, directory=d, keys=keys, values=values)
    assert len(upd) >= 3
    h = codec.parse_header(upd[0])
    rows = [rng.standard_normal((int(c), int(dim))) for c, dim in zip(d["num_keys"], d["dim"])]
    look = codec.encode_lookup(msg_id=8, client_id=3, shard_id=1, directory=d, keys=keys)
    reply = codec.encode_reply(codec.parse_header(look[0]), MsgType.LOOKUP_REPLY, shard_id=1,
                               body=codec.values_to_body(rows, d["dtype"]))
    bad = d.copy()
    bad["table_id"][1] = bad["table_id"][0]  # a table twice
    dup = codec.encode_lookup(msg_id=9, client_id=3, shard_id=1, directory=bad, keys=keys)
    short = codec.make_directory([1], [4], [1], [2])
    miscount = codec.encode_message(MsgType.LOOKUP_REQ, msg_id=10, client_id=3, shard_id=1, num_tables=1,
                                    num_keys=3, value_len=48, body=short.tobytes() + keys[:3].tobytes())
    payloads = [upd[2], upd[0], upd[1], upd[2], *upd[3:]] + look + reply + dup + miscount
    write_pcap(tmp_path / "d.pcap", _frames(payloads))
    frames = run_tshark(tmp_path / "d.pcap", tmp_path)
    states = first_pass(list(enumerate(payloads, 1)))
    wants = [check_frame(layers, p, states[i]) for i, (layers, p) in enumerate(zip(frames, payloads), 1)]
    assert wants[0]["undecoded"] and not wants[0]["gradient"]  # fragment 2 before the directory
    assert wants[1]["table"] and not wants[1]["key.table"] and wants[1]["partial"]  # entries 0..88, 89 cut
    assert _ints(frames[2], "embnic.directory_in") == [3] and wants[2]["key.table"]  # completed by fragment 1
    assert wants[3]["gradient"] and _ints(frames[3], "embnic.directory_in") == [3]  # fragment 2 again
    r0 = len(upd) + 1 + len(look)  # the reply's first frame (0-based); the lookup's fragment 1 before it
    for i in range(r0, r0 + len(reply)):
        assert wants[i]["row.table"] and _ints(frames[i], "embnic.directory_in") == [len(upd) + 3], i
    assert not wants[r0 + len(reply)]["fault"]  # the bad directory's fragment 0: not complete yet
    for i in range(r0 + len(reply) + 1, len(payloads)):
        assert wants[i]["fault"] and not wants[i]["key.table"], i
    assert h.num_tables == T


def test_decode_as_any_port(tmp_path):
    """Not on 7878 the frame is UDP data; with Decode As (``-d udp.port==9999,embnic``) it is embnic."""
    keys = np.array([1, 2**64 - 1, 12345], dtype=np.uint64)
    payload = codec.encode_table_lookup(msg_id=9, client_id=4, shard_id=2, table_id=5, dim=8, dtype=DType.FP32,
                                        keys=keys)[0]
    write_pcap(tmp_path / "p.pcap", _frames([payload], dport=9999))
    plain = run_tshark(tmp_path / "p.pcap", tmp_path)
    assert "embnic" not in plain[0]["frame.protocols"][0].split(":")
    decoded = run_tshark(tmp_path / "p.pcap", tmp_path, "-d", "udp.port==9999,embnic")
    check_frame(decoded[0], payload, first_pass([(1, payload)])[1])
    assert _ints(decoded[0], "embnic.key") == [1, 2**64 - 1, 12345]
    assert _ints(decoded[0], "embnic.key.table") == [5] and _ints(decoded[0], "embnic.table.dim") == [8]


# ---------------------------------------------------------------- what the card and a shard refuse

DP = REPO / "dataplane"


@pytest.fixture(scope="module")
def card_verdict(tmp_path_factory):
    """The card's own checks of one frame: ``dataplane/parse.c`` built alone into a shared library
    (it needs DPDK's headers, not its libraries, as the fuzz target and
    tests/dataplane/test_header_rules.py build it) and called through ctypes: ``verdict(frame) ->
    the card's drop reason name (embnic_drop_name) or None``. ``embnic_parse`` checks Ethernet,
    IPv4 and UDP, then the embnic header: magic, version, type, then ``embnic_check_lengths``
    (include/embnic_parse.h)."""
    from cparse import parse_verdict

    return parse_verdict(tmp_path_factory.mktemp("cparse"))  # checksum checked, any destination


def _embnic_payload(frame: bytes) -> bytes | None:
    """The UDP payload of an Ethernet/IPv4 (no options)/UDP frame, cut at its UDP length when that
    fits the frame; None for anything else (ARP, IPv6, options, too short)."""
    if len(frame) < 42 or frame[12:14] != b"\x08\x00" or frame[14] != 0x45 or frame[23] != 17:
        return None
    (udp_len,) = struct.unpack_from("!H", frame, 38)
    end = 34 + udp_len if 8 <= udp_len and 34 + udp_len <= len(frame) else len(frame)
    return frame[42:end]


def seed_payloads() -> list[tuple[str, bytes]]:
    """The embnic payloads of the fuzzers' seed corpora (dataplane/fuzz/make_seeds.py): seeds/parse
    (2 bytes of harness mode, then one frame) and seeds/card (27 bytes of card config, then
    records: length (u16 LE), flags, step, split, the frame), in file order."""
    out = []
    for f in sorted((DP / "fuzz" / "seeds" / "parse").iterdir()):
        out.append((f"parse/{f.name}", f.read_bytes()[2:]))
    for f in sorted((DP / "fuzz" / "seeds" / "card").iterdir()):
        b, i, k = f.read_bytes(), 27, 0
        while i + 5 <= len(b):
            (n,) = struct.unpack_from("<H", b, i)
            out.append((f"card/{f.name}[{k}]", b[i + 5:i + 5 + n]))
            i, k = i + 5 + n, k + 1
    return [(label, p) for label, fr in out if (p := _embnic_payload(fr)) is not None]


def _hdr(payload: bytes, **kw) -> bytes:
    """``payload`` with header fields replaced by ``kw``."""
    return codec.unpack_header(payload)._replace(**kw).pack() + payload[consts.HDR_LEN:]


def handmade_faults() -> list[tuple[str, bytes]]:
    """What the conformance suite and the seeds have few of: fragments cut at another size than
    their index says (middle, last, the only one), and directories that do not add up to their
    header — a LOOKUP_REQ's rows against its value_len included."""
    rng = np.random.default_rng(11)
    keys = rng.integers(0, 2**64, 600, dtype=np.uint64)
    d = codec.make_directory([4, 9], [8, 3], [DType.FP32, DType.FP16], [400, 200])
    look = codec.encode_lookup(msg_id=70, client_id=2, shard_id=0, directory=d, keys=keys)  # 4800 bytes: 4 fragments
    assert len(look) == 4
    P = codec.parse_header(look[0]).frag_len
    out = [(f"lookup [{i}]", f) for i, f in enumerate(look)]
    out += [
        ("frag_mismatch: fragment 1 at offset P + 8", _hdr(look[1], msg_id=71, frag_offset=P + 8)),
        ("frag_mismatch: fragment 2 at offset 1", _hdr(look[2], msg_id=72, frag_offset=1)),
        ("frag_mismatch: fragment 1 at fragment 2's offset", _hdr(look[1], msg_id=73, frag_offset=2 * P)),
        ("frag_mismatch: last fragment at an offset its index does not divide",  # 3 * P - 2 bytes: 2 more
         _hdr(look[3] + bytes(2), msg_id=74, frag_offset=3 * P - 2, frag_len=len(look[3]) - 44 + 2)),
        ("frag_mismatch: 2 fragments of 1000 bytes make 2000, not 4 fragments", _hdr(
            look[0][:44 + 1000], msg_id=75, frag_len=1000)),
    ]
    one = codec.encode_lookup(msg_id=76, client_id=2, shard_id=0, directory=codec.make_directory([4], [8], [1], [2]),
                              keys=keys[:2])[0]  # 16 + 16 bytes
    out.append(("frag_mismatch: the only fragment at offset 8", _hdr(one[:44 + 24], msg_id=77, frag_offset=8,
                                                                     frag_len=24)))
    # directories a shard answers MALFORMED: one fragment, header valid
    d1 = codec.make_directory([4], [8], [DType.FP32], [2])  # rows: 2 * 32 = 64 bytes
    body = d1.tobytes() + keys[:2].tobytes()
    for label, vl in (("LOOKUP_REQ: directory rows 64 bytes, value_len 80", 80),
                      ("LOOKUP_REQ: directory rows 64 bytes, value_len 4", 4)):
        out.append((label, codec.encode_message(MsgType.LOOKUP_REQ, msg_id=78 + vl, client_id=2, shard_id=0,
                                                num_tables=1, num_keys=2, value_len=vl, body=body)[0]))
    out.append(("UPDATE_REQ: directory rows 64 bytes, value_len 80", codec.encode_message(
        MsgType.UPDATE_REQ, msg_id=90, client_id=2, shard_id=0, num_tables=1, num_keys=2, value_len=80,
        body=body + bytes(80))[0]))
    out.append(("LOOKUP_REQ: directory 2 keys, the header 3", codec.encode_message(
        MsgType.LOOKUP_REQ, msg_id=91, client_id=2, shard_id=0, num_tables=1, num_keys=3, value_len=64,
        body=d1.tobytes() + keys[:3].tobytes())[0]))
    twice = codec.make_directory([4, 4], [8, 8], [1, 1], [1, 1])
    out.append(("LOOKUP_REQ: a table twice", codec.encode_message(
        MsgType.LOOKUP_REQ, msg_id=92, client_id=2, shard_id=0, num_tables=2, num_keys=2, value_len=64,
        body=twice.tobytes() + keys[:2].tobytes())[0]))
    nodim = codec.make_directory([4], [0], [1], [2])
    out.append(("LOOKUP_REQ: dim 0", codec.encode_message(
        MsgType.LOOKUP_REQ, msg_id=93, client_id=2, shard_id=0, num_tables=1, num_keys=2, value_len=64,
        body=nodim.tobytes() + keys[:2].tobytes())[0]))
    return out


def _shard_directory_verdict(payload: bytes) -> str | None:
    """A shard's directory check of a one-fragment request (what ``embnic server`` runs on the whole
    body before anything else of it: ``codec.parse_request_body``): its MALFORMED reason or None."""
    h = codec.parse_header(payload)
    try:
        codec.parse_request_body(h, payload[consts.HDR_LEN:])
    except codec.DirectoryError as e:
        assert e.status == consts.Status.MALFORMED
        return str(e)
    return None


def test_flags_what_the_card_and_a_shard_refuse(card_verdict, tmp_path):
    """Frame by frame, the conformance suite's frames, the fuzzers' seeds and the faults above: the
    plug-in flags exactly the frames the card's ``embnic_parse`` drops, with the card's reason name
    (and the client's rules give the same verdict); of the frames the card passes, it warns about a
    request's directory exactly when a shard's check of it (``codec.parse_request_body``, answered
    MALFORMED) fails, for a LOOKUP_REQ as for an UPDATE_REQ."""
    sys.path.insert(0, str(REPO / "tests" / "dataplane"))
    from conformance import Suite

    corpus = [(f.label, _embnic_payload(f.data)) for f in Suite.default().frames]
    corpus = [(label, p) for label, p in corpus if p is not None] + seed_payloads() + handmade_faults()
    seen_payloads, unique = set(), []
    for label, p in corpus:
        if p not in seen_payloads:
            seen_payloads.add(p)
            unique.append((label, p))
    frames = _frames([p for _, p in unique])
    write_pcap(tmp_path / "refuse.pcap", frames, [1_700_000_000 + i / 1000 for i in range(len(frames))])
    layers = run_tshark(tmp_path / "refuse.pcap", tmp_path)
    assert len(layers) == len(unique)
    states = first_pass([(n, p) for n, (_, p) in enumerate(unique, 1) if receiver_verdict(p) is None])
    counts = collections.Counter()
    for n, ((label, p), frame, got) in enumerate(zip(unique, frames, layers), 1):
        card = card_verdict(frame)
        assert receiver_verdict(p) == card, (n, label)  # the client's rules are the card's
        assert got.get("embnic.drop_reason") == ([card] if card else None), (n, label, card)
        assert "embnic.gso_frame" not in got, (n, label)
        errors = [m for m in got.get("_ws.expert.message", []) if m.startswith("Malformed embnic frame")]
        if card:
            counts[card] += 1
            assert errors == [errors[0]] and errors[0].startswith(f"Malformed embnic frame ({card}):"), (n, label)
            continue
        assert not errors, (n, label)
        h = codec.parse_header(p)
        fault = _directory_for(h, states[n])[1]
        if h.msg_type in consts.DATA_REQUEST_TYPES and h.frag_count == 1:
            assert (fault is None) == (_shard_directory_verdict(p) is None), (n, label)
        warned = [m for m in got.get("_ws.expert.message", []) if "directory" in m.lower()]
        assert len(warned) == (1 if fault else 0), (n, label, warned, fault)
        if fault and h.msg_type in consts.REQUEST_TYPES:
            assert "MALFORMED" in warned[0], warned
            counts[f"directory {MsgType(h.msg_type).name}"] += 1
        counts["passed"] += 1
    assert counts["frag_mismatch"] >= 8 and counts["bad_length"] >= 10 and counts["passed"] >= 200, counts
    assert counts["directory LOOKUP_REQ"] >= 5 and counts["directory UPDATE_REQ"] >= 1, counts
    assert set(counts) >= set(consts.DROP_REASONS) - {"too_large"}, counts


# ---------------------------------------------------------------- a UDP GSO send

def _gso_case():
    """A LOOKUP_REQ and its 3-fragment reply (MTU 1500: frames of 1472 bytes, the last 1348)."""
    d = codec.make_directory([3, 8], [64, 4], [DType.FP32, DType.FP16], [15, 40])
    keys = np.arange(55, dtype=np.uint64)
    look = codec.encode_lookup(msg_id=8, client_id=3, shard_id=1, directory=d, keys=keys)
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal((int(c), int(dim))) for c, dim in zip(d["num_keys"], d["dim"])]
    reply = codec.encode_reply(codec.parse_header(look[0]), MsgType.LOOKUP_REPLY, shard_id=1,
                               body=codec.values_to_body(rows, d["dtype"]))
    return look, reply


def _tshark_fields(layers: dict) -> dict:
    """The embnic fields of one frame, without the GSO ones."""
    return {k: v for k, v in layers.items() if k.startswith("embnic.") and k not in GSO_FIELDS}


def test_gso_send_reads_as_the_frames_it_becomes(tmp_path):
    """A shard's reply sent as one UDP GSO datagram (3 frames back to back, 4,292 bytes: larger
    than the MTU, as a capture on the shard's host or on loopback shows it before the kernel cuts
    it) reads as the 3 frames it becomes — every field as when they are captured one by one, linked
    to the request, no bad_length; a frame of it that does not add up is flagged alone, by the
    card's reason; bytes after a frame that are no frame of its message stay bad_length."""
    look, reply = _gso_case()
    assert len(look) == 1 and [len(r) for r in reply] == [1472, 1472, 1348]
    t = [1_700_000_000.0, 1_700_000_000.5]
    c2s = dict(sport=consts.UDP_PORT, dport=40003)
    write_pcap(tmp_path / "one.pcap", _frames(look) + _frames(reply, **c2s), [t[0]] + [t[1]] * len(reply))
    write_pcap(tmp_path / "gso.pcap", _frames(look) + _frames([b"".join(reply)], **c2s), t)
    one = run_tshark(tmp_path / "one.pcap", tmp_path)
    gso = run_tshark(tmp_path / "gso.pcap", tmp_path)
    assert len(gso) == 2
    want = collections.defaultdict(list)
    for layers in one[1:]:
        for k, v in _tshark_fields(layers).items():
            want[k] += v
    assert _tshark_fields(gso[1]) == dict(want)
    assert _tshark_fields(gso[0]) == _tshark_fields(one[0])
    assert _ints(gso[1], "embnic.gso_frame") == [0, 1, 2] and _ints(gso[1], "embnic.gso_size") == [1472] * 3
    assert _ints(gso[1], "embnic.request_in") == [1] * 3 and _ints(gso[0], "embnic.response_in") == [2]
    assert "embnic.drop_reason" not in gso[1] and gso[1]["embnic.row.value"] and gso[1]["embnic.partial"]

    # frame 1 of the send cut at another size: that frame alone is the card's frag_mismatch
    bad = list(reply)
    bad[1] = _hdr(bad[1], frag_offset=1428 + 4)
    # a reply's only frame with bytes after it, and a lookup's first fragment followed by another
    # message's: one frame each, bad_length (no GSO send: nothing after it is a frame of its message)
    d1 = codec.make_directory([1], [4], [1], [300])
    big = codec.encode_lookup(msg_id=12, client_id=3, shard_id=1, directory=d1, keys=np.arange(300, dtype=np.uint64))
    other = codec.encode_lookup(msg_id=13, client_id=3, shard_id=1, directory=d1, keys=np.arange(300, dtype=np.uint64))
    ack = codec.encode_reply(codec.parse_header(look[0]), MsgType.ERROR, shard_id=1, body=b"")
    datagrams = [b"".join(bad), ack[0] + ack[0], big[0] + other[1], big[0] + bytes(100)]
    write_pcap(tmp_path / "bad.pcap", _frames(datagrams, **c2s), [t[1] + i for i in range(len(datagrams))])
    got = run_tshark(tmp_path / "bad.pcap", tmp_path)
    assert got[0].get("embnic.drop_reason") == ["frag_mismatch"]
    assert _ints(got[0], "embnic.gso_frame") == [0, 1, 2] and _ints(got[0], "embnic.frag_index") == [0, 1, 2]
    assert len(got[0]["embnic.undecoded"]) == 2  # frames 0 and 2 read (no request here: rows unknown)
    errors = [m for m in got[0].get("_ws.expert.message", []) if m.startswith("Malformed embnic frame")]
    assert len(errors) == 1 and errors[0].startswith("Malformed embnic frame (frag_mismatch)")
    for layers in got[1:]:
        assert layers.get("embnic.drop_reason") == ["bad_length"] and "embnic.gso_frame" not in layers, layers
