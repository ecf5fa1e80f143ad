"""The generated Wireshark dissector (embnic.control.wireshark, contrib/wireshark/embnic.lua).

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
card itself, and a UDP GSO send: tests/control/test_wireshark_card.py; tshark and the oracle:
tests/control/tshark_view.py.

Run alone: python3 -m pytest -q tests/control/test_wireshark.py
"""

from __future__ import annotations

import collections
import itertools
import math
import sys

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from embnic.client_lib import codec, consts
from embnic.client_lib.consts import DType, MsgType
from embnic.client_lib.protocol import Embnic
from embnic.control import wireshark
from embnic.control.pcap import write_pcap
from tshark_view import (BODY_FIELDS, EXPERT_FIELDS, HEADER_NAMES, LINK_FIELDS, REPO, SHIPPED, check_frame,
                         first_pass, ints, receiver_verdict, run_tshark, udp_frames, udp_payload)

TRACE = REPO / "tests" / "testbed" / "cases" / "replay-not-owner" / "t.pcap"


PI_ERROR, PI_MALFORMED = 0x00800000, 0x07000000  # epan/proto.h severity and group


# ---------------------------------------------------------------- the generator and consts

def test_shipped_plugin_is_generated_from_consts():
    assert SHIPPED.read_text() == wireshark.generate_lua(), (
        f"{wireshark.SHIPPED_PATH} is stale: run `embnic dissector --out {wireshark.SHIPPED_PATH}`")


def test_cli_writes_the_plugin(tmp_path, invoke):
    out = tmp_path / "embnic.lua"
    r = invoke("dissector", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert out.read_text() == wireshark.generate_lua()
    r = invoke("dissector")
    assert r.exit_code == 0 and r.output == wireshark.generate_lua()


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
        wireshark.generate_lua()


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
    states = first_pass([(i, udp_payload(p)) for i, p in enumerate(pkts, 1)])
    seen = collections.Counter()
    for i, (layers, p) in enumerate(zip(trace_frames, pkts), 1):
        assert "embnic" in layers["frame.protocols"][0].split(":")
        want = check_frame(layers, udp_payload(p), states[i])
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
        if _plain_ipv4_to_7878(p) and receiver_verdict(udp_payload(p)) is None:
            valid.append((n, udp_payload(p)))
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
        payload = udp_payload(p)
        reason = receiver_verdict(payload)
        assert layers.get("embnic.drop_reason") == ([reason] if reason else None), f.label
        errors = [m for m, s, g in zip(layers.get("_ws.expert.message", []), ints(layers, "_ws.expert.severity"),
                                       ints(layers, "_ws.expert.group"))
                  if m.startswith("Malformed embnic frame")]
        if reason:
            reasons[reason] += 1
            sev = dict(zip(layers["_ws.expert.message"], zip(ints(layers, "_ws.expert.severity"),
                                                            ints(layers, "_ws.expert.group"))))
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
    assert ints(frames[n], "embnic.held.fragment") == list(range(0, consts.MAX_FRAGS, 2))
    assert ints(frames[n], "embnic.held.missing") == [1]


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
            assert ints(layers, "embnic.response_in") == ([tx["reply"]] if tx["reply"] else []), n
            assert "embnic.request_in" not in layers and not notes, n
        elif st["kind"] == "reply":
            assert ints(layers, "embnic.request_in") == [tx["first"]], n
            assert math.isclose(float(layers["embnic.time"][0]), times[n - 1] - times[tx["first"] - 1],
                                abs_tol=2e-6), n
            assert "embnic.response_in" not in layers and not notes, n
            links += 1
        else:
            assert not any(f in layers for f in ("embnic.request_in", "embnic.response_in")) and notes, n
    assert links >= 15 and sum(st["kind"] == "orphan" for st in states.values()) >= 5


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
    write_pcap(tmp_path / "d.pcap", udp_frames(payloads))
    frames = run_tshark(tmp_path / "d.pcap", tmp_path)
    states = first_pass(list(enumerate(payloads, 1)))
    wants = [check_frame(layers, p, states[i]) for i, (layers, p) in enumerate(zip(frames, payloads), 1)]
    assert wants[0]["undecoded"] and not wants[0]["gradient"]  # fragment 2 before the directory
    assert wants[1]["table"] and not wants[1]["key.table"] and wants[1]["partial"]  # entries 0..88, 89 cut
    assert ints(frames[2], "embnic.directory_in") == [3] and wants[2]["key.table"]  # completed by fragment 1
    assert wants[3]["gradient"] and ints(frames[3], "embnic.directory_in") == [3]  # fragment 2 again
    r0 = len(upd) + 1 + len(look)  # the reply's first frame (0-based); the lookup's fragment 1 before it
    for i in range(r0, r0 + len(reply)):
        assert wants[i]["row.table"] and ints(frames[i], "embnic.directory_in") == [len(upd) + 3], i
    assert not wants[r0 + len(reply)]["fault"]  # the bad directory's fragment 0: not complete yet
    for i in range(r0 + len(reply) + 1, len(payloads)):
        assert wants[i]["fault"] and not wants[i]["key.table"], i
    assert h.num_tables == T


def test_decode_as_any_port(tmp_path):
    """Not on 7878 the frame is UDP data; with Decode As (``-d udp.port==9999,embnic``) it is embnic."""
    keys = np.array([1, 2**64 - 1, 12345], dtype=np.uint64)
    payload = codec.encode_table_lookup(msg_id=9, client_id=4, shard_id=2, table_id=5, dim=8, dtype=DType.FP32,
                                        keys=keys)[0]
    write_pcap(tmp_path / "p.pcap", udp_frames([payload], dport=9999))
    plain = run_tshark(tmp_path / "p.pcap", tmp_path)
    assert "embnic" not in plain[0]["frame.protocols"][0].split(":")
    decoded = run_tshark(tmp_path / "p.pcap", tmp_path, "-d", "udp.port==9999,embnic")
    check_frame(decoded[0], payload, first_pass([(1, payload)])[1])
    assert ints(decoded[0], "embnic.key") == [1, 2**64 - 1, 12345]
    assert ints(decoded[0], "embnic.key.table") == [5] and ints(decoded[0], "embnic.table.dim") == [8]
