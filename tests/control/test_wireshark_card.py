"""The generated Wireshark dissector against the card itself (tshark's view:
tests/control/tshark_view.py): the conformance suite's frames, the fuzzers' seeds
(dataplane/fuzz/seeds) and hand-made faults go through ``dataplane/parse.c`` (``embnic_parse`` →
``embnic_check_lengths``, built into a shared library here) and a shard's directory check
(``codec.parse_request_body``), and tshark flags exactly the frames they refuse, with the card's
reason name. A UDP GSO send (a shard's reply captured before its kernel cut it into frames) reads
as the frames it becomes.

Run alone: python3 -m pytest -q tests/control/test_wireshark_card.py
"""
from __future__ import annotations

import collections
import struct
import sys

import numpy as np
import pytest

from embnic.client_lib import codec, consts
from embnic.client_lib.consts import DType, MsgType
from embnic.control.pcap import write_pcap
from tshark_view import GSO_FIELDS, REPO, directory_for, first_pass, ints, receiver_verdict, run_tshark, udp_frames

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
    """The embnic payloads of the fuzzers' seed corpora (tests/dataplane/make_fuzz_seeds.py): seeds/parse
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
    frames = udp_frames([p for _, p in unique])
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
        fault = directory_for(h, states[n])[1]
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
    write_pcap(tmp_path / "one.pcap", udp_frames(look) + udp_frames(reply, **c2s), [t[0]] + [t[1]] * len(reply))
    write_pcap(tmp_path / "gso.pcap", udp_frames(look) + udp_frames([b"".join(reply)], **c2s), t)
    one = run_tshark(tmp_path / "one.pcap", tmp_path)
    gso = run_tshark(tmp_path / "gso.pcap", tmp_path)
    assert len(gso) == 2
    want = collections.defaultdict(list)
    for layers in one[1:]:
        for k, v in _tshark_fields(layers).items():
            want[k] += v
    assert _tshark_fields(gso[1]) == dict(want)
    assert _tshark_fields(gso[0]) == _tshark_fields(one[0])
    assert ints(gso[1], "embnic.gso_frame") == [0, 1, 2] and ints(gso[1], "embnic.gso_size") == [1472] * 3
    assert ints(gso[1], "embnic.request_in") == [1] * 3 and ints(gso[0], "embnic.response_in") == [2]
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
    write_pcap(tmp_path / "bad.pcap", udp_frames(datagrams, **c2s), [t[1] + i for i in range(len(datagrams))])
    got = run_tshark(tmp_path / "bad.pcap", tmp_path)
    assert got[0].get("embnic.drop_reason") == ["frag_mismatch"]
    assert ints(got[0], "embnic.gso_frame") == [0, 1, 2] and ints(got[0], "embnic.frag_index") == [0, 1, 2]
    assert len(got[0]["embnic.undecoded"]) == 2  # frames 0 and 2 read (no request here: rows unknown)
    errors = [m for m in got[0].get("_ws.expert.message", []) if m.startswith("Malformed embnic frame")]
    assert len(errors) == 1 and errors[0].startswith("Malformed embnic frame (frag_mismatch)")
    for layers in got[1:]:
        assert layers.get("embnic.drop_reason") == ["bad_length"] and "embnic.gso_frame" not in layers, layers
