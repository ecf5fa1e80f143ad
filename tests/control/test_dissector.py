"""The generated Wireshark dissector (embnic.control.dissector, contrib/wireshark/embnic.lua).

The shipped plug-in is what the generator makes of today's field table; consts' reader data
(FIELD_DOCS, BODY_LAYOUT) agree with the codec; and the real tshark (Debian's ``tshark``), with
the plug-in loaded by ``-X lua_script:`` and two passes (``-2``), shows for every frame of the
committed trace (tests/testbed/cases/replay-not-owner, recorded by ``embnic trace record``) and of
the conformance suite (tests/dataplane/conformance_cases.py) exactly the header fields the Scapy
layer decodes, the keys, rows, gradients and SIZE_REQ entries the codec decodes, each reply
linked to its request, and every malformed frame flagged with the codec's drop reason as an
expert-info error.

Run alone: python3 -m pytest -q tests/control/test_dissector.py
"""
from __future__ import annotations

import collections
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from embnic.client_lib import codec, consts
from embnic.client_lib.consts import DType, MsgType
from embnic.client_lib.protocol import Embnic
from embnic.control import dissector
from embnic.control.pcap import write_pcap

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "tests" / "testbed" / "cases" / "replay-not-owner" / "t.pcap"
SHIPPED = REPO / dissector.SHIPPED_PATH
HEADER_NAMES = [n for n, _, _ in consts.HEADER_FIELDS]
BODY_FIELDS = ["embnic.key", "embnic.row.value", "embnic.gradient.value", "embnic.partial"] + [
    f"embnic.entry.{n}" for n, _ in consts.SIZE_ENTRY_FIELDS]
LINK_FIELDS = ["embnic.request_in", "embnic.response_in", "embnic.time", "embnic.drop_reason"]
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
    """One valid single-fragment LOOKUP_REQ of 1 key, fields overridden by ``kw``."""
    f = dict(magic=consts.MAGIC, version=consts.VERSION, msg_type=1, flags=0, dtype=1, status=0,
             msg_id=1, client_id=1, table_id=0, shard_id=0, dim=4, num_keys=1, msg_len=8,
             frag_offset=0, frag_index=0, frag_count=1, frag_len=8, reserved=0)
    f.update(kw)
    return codec.Header(**f).pack() + b"\0" * 8


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


def _layout_len(t, n, dim, dtype) -> int:
    total = 0
    for s in consts.BODY_LAYOUT[t]:
        e = consts.BODY_ELEMENTS[s.element]
        h = {"num_keys": n, "dim": dim, "dtype": dtype}
        if e.numpy:
            size = np.dtype(e.numpy).itemsize
        elif e.fields:
            size = np.dtype(list(e.fields)).itemsize
        else:
            size = h[e.values_of[0]] * consts.DTYPE_SIZE[DType(h[e.values_of[1]])]
        total += h[s.count] * size
    return total


def test_body_layout_is_expected_msg_len():
    assert set(consts.BODY_LAYOUT) == set(MsgType)
    for t, n, dim, dtype in itertools.product(MsgType, (0, 1, 7, 400), (0, 1, 16, 128), DType):
        assert _layout_len(t, n, dim, dtype) == consts.expected_msg_len(t, n, dim, dtype), (t, n, dim, dtype)


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
              + BODY_FIELDS + LINK_FIELDS + EXPERT_FIELDS)
    cmd = [_tshark(), "-n", "-r", str(pcap), "-X", f"lua_script:{SHIPPED}", "-2", "-T", "json", *extra]
    for f in fields:
        cmd += ["-e", f]
    # a HOME of its own: no personal plug-ins folder (a second copy of the plug-in) or prefs
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Lua" not in r.stderr and "lua" not in r.stderr, r.stderr[-2000:]
    return [x["_source"]["layers"] for x in json.loads(r.stdout)]


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


def _sections(h: codec.Header, body: bytes):
    """The v1 body of ``h`` (docs/protocol.md, "Body") read by the codec from the whole message
    body ``body`` (zeros where another fragment holds the bytes): ``(item, byte offset, element
    bytes, elements)`` per section."""
    n, t = h.num_keys, h.msg_type
    row = h.dim * consts.DTYPE_SIZE.get(h.dtype, 0)
    if t == MsgType.LOOKUP_REQ:
        return [("key", 0, 8, codec.body_to_keys(body, n))]
    if t == MsgType.LOOKUP_REPLY:
        return [("row", 0, row, codec.body_to_rows(body, n, h.dim, h.dtype))]
    if t == MsgType.UPDATE_REQ:
        keys, grads = codec.split_update_body(body, n, h.dim, h.dtype)
        return [("key", 0, 8, keys), ("gradient", 8 * n, row, grads)]
    if t == MsgType.SIZE_REQ:
        return [("entry", 0, 16, codec.body_to_size_entries(body, n))]
    return []


def check_frame(layers: dict, payload: bytes) -> None:
    """tshark's embnic fields of one valid frame equal the Scapy layer's header and the codec's
    body elements of this fragment; an element cut by the fragment boundary is ``partial``."""
    pkt = Embnic(payload)
    for name in HEADER_NAMES:
        assert _ints(layers, f"embnic.{name}") == [int(getattr(pkt, name))], name
    h = codec.parse_header(payload)
    frag = payload[consts.HDR_LEN:]
    body = bytearray(h.msg_len)
    body[h.frag_offset:h.frag_offset + len(frag)] = frag
    lo, hi = h.frag_offset, h.frag_offset + len(frag)
    want = collections.defaultdict(list)
    partial = []
    for item, start, size, arr in _sections(h, bytes(body)):
        for i in range(len(arr)):
            a, b = start + i * size, start + (i + 1) * size
            if lo <= a and b <= hi:
                want[item].append(arr[i])
            elif a < hi and b > lo:
                partial.append(bytes(body[max(a, lo):min(b, hi)]).hex())
    assert _ints(layers, "embnic.key") == [int(k) for k in want["key"]]
    for item in ("row", "gradient"):
        got = layers.get(f"embnic.{item}.value", [])
        assert _same_values(got, np.array(want[item]).ravel() if want[item] else np.zeros(0)), item
    for name, _ in consts.SIZE_ENTRY_FIELDS:
        assert _ints(layers, f"embnic.entry.{name}") == [int(e[name]) for e in want["entry"]], name
    assert [s.replace(":", "") for s in layers.get("embnic.partial", [])] == partial
    assert "embnic.drop_reason" not in layers


@pytest.fixture(scope="module")
def trace_frames(tmp_path_factory):
    home = tmp_path_factory.mktemp("tshark-home")
    return run_tshark(TRACE, home)


def test_trace_every_field_equals_scapy(trace_frames):
    """The recorded trace: 2459 request frames (lookups and fragmented updates)."""
    from scapy.utils import rdpcap

    pkts = rdpcap(str(TRACE))
    assert len(trace_frames) == len(pkts) > 2000
    seen = collections.Counter()
    for layers, p in zip(trace_frames, pkts):
        assert "embnic" in layers["frame.protocols"][0].split(":")
        check_frame(layers, _udp_payload(p))
        seen[(p[Embnic].msg_type, p[Embnic].frag_count > 1)] += 1
        seen["partial"] += "embnic.partial" in layers
        # requests only (no reply was recorded): no link, no expert info
        assert not any(f in layers for f in LINK_FIELDS + EXPERT_FIELDS), layers.get("_ws.expert.message")
    assert seen[(MsgType.LOOKUP_REQ, False)] and seen[(MsgType.UPDATE_REQ, True)] and seen["partial"], seen


@pytest.fixture(scope="module")
def conformance(tmp_path_factory):
    """The conformance suite's input frames in one pcap, 1 ms apart, and tshark's view of them."""
    sys.path.insert(0, str(REPO / "tests" / "dataplane"))
    from conformance import Suite

    d = tmp_path_factory.mktemp("conformance-pcap")
    suite = Suite.default()
    frames = [f.data for f in suite.frames]
    times = [1_700_000_000 + i / 1000 for i in range(len(frames))]
    write_pcap(d / "all.pcap", frames, times)
    return suite, times, run_tshark(d / "all.pcap", d)


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
    suite, _, frames = conformance
    assert len(frames) == len(suite.frames)
    reasons = collections.Counter()
    for f, layers in zip(suite.frames, frames):
        p = _scapy(f.data)
        mine = "embnic" in layers["frame.protocols"][0].split(":")
        assert mine == _plain_ipv4_to_7878(p), f.label
        if not mine:
            continue
        payload = _udp_payload(p)
        try:
            codec.parse_header(payload)
            reason = None
        except codec.FrameError as e:
            reason = e.reason
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
        else:
            assert not errors, f.label
            check_frame(layers, payload)
    # every host-side drop reason but too_large (a receiver's size limit) and frag_mismatch (a
    # contradiction between frames, which parse_header does not see) occurs in the suite
    assert set(reasons) == set(consts.DROP_REASONS) - {"too_large", "frag_mismatch"}, reasons


def test_conformance_replies_link_to_their_requests(conformance):
    """Request/response tracking by (client id, message id): each reply frame names the first
    frame of the request it answers (Scapy's ``answers``) and the time since it; that request's
    frames name the reply's first frame. A request after its reply began is a new exchange (a
    retransmission); a reply that answers nothing open gets a note, not a link."""
    suite, times, frames = conformance
    open_tx, want = {}, {}
    for n, f in enumerate(suite.frames, 1):
        p = _scapy(f.data)
        if not _plain_ipv4_to_7878(p):
            continue
        try:
            h = codec.parse_header(_udp_payload(p))
        except codec.FrameError:
            continue
        key = (h.client_id, h.msg_id)
        tx = open_tx.get(key)
        if h.msg_type in consts.REQUEST_TYPES:
            if tx is None or tx["reply"] is not None or tx["type"] != h.msg_type:
                tx = open_tx[key] = {"first": n, "type": h.msg_type, "reply": None}
            want[n] = ("request", tx)
        elif tx is not None and p[Embnic].answers(_scapy(suite.frames[tx["first"] - 1].data)[Embnic]):
            tx["reply"] = tx["reply"] or n
            want[n] = ("reply", tx)
        else:
            want[n] = ("orphan", None)
    links = 0
    for n, (kind, tx) in want.items():
        layers = frames[n - 1]
        notes = [m for m in layers.get("_ws.expert.message", []) if m == "Reply to no request in this capture"]
        if kind == "request":
            assert _ints(layers, "embnic.response_in") == ([tx["reply"]] if tx["reply"] else []), n
            assert "embnic.request_in" not in layers and not notes, n
        elif kind == "reply":
            assert _ints(layers, "embnic.request_in") == [tx["first"]], n
            assert math.isclose(float(layers["embnic.time"][0]), times[n - 1] - times[tx["first"] - 1],
                                abs_tol=2e-6), n
            assert "embnic.response_in" not in layers and not notes, n
            links += 1
        else:
            assert not any(f in layers for f in ("embnic.request_in", "embnic.response_in")) and notes, n
    assert links >= 15 and sum(k == "orphan" for k, _ in want.values()) >= 5


def test_decode_as_any_port(tmp_path):
    """Not on 7878 the frame is UDP data; with Decode As (``-d udp.port==9999,embnic``) it is embnic."""
    body = codec.keys_to_body(np.array([1, 2**64 - 1, 12345], dtype=np.uint64))
    payload = codec.encode_message(MsgType.LOOKUP_REQ, msg_id=9, client_id=4, shard_id=2, dim=8,
                                   num_keys=3, body=body)[0]
    frame = bytes(Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=40000, dport=9999) / Raw(payload))
    write_pcap(tmp_path / "p.pcap", [frame])
    plain = run_tshark(tmp_path / "p.pcap", tmp_path)
    assert "embnic" not in plain[0]["frame.protocols"][0].split(":")
    decoded = run_tshark(tmp_path / "p.pcap", tmp_path, "-d", "udp.port==9999,embnic")
    check_frame(decoded[0], payload)
    assert _ints(decoded[0], "embnic.key") == [1, 2**64 - 1, 12345]
