"""The card's header rules against the client library's: one verdict for every v2 header.

``dataplane/parse.c`` (``embnic_parse``, with ``embnic_check_lengths`` and
``embnic_expected_msg_len`` / ``embnic_counts_ok`` of ``include/``) is built alone into a shared
library (it needs DPDK's headers, not its libraries: the fuzz target links it so too) and called
through ctypes on whole frames; :func:`embnic.client_lib.codec.parse_header` judges the same
UDP payloads. Hypothesis draws valid v2 messages of 1..4 tables and every type, then breaks
header fields (counts, lengths, fragments, version, type). Both must name the same drop reason
(``bad_version`` for a version-1 frame, ``bad_length`` for counts that do not fit the type or a
``msg_len`` that is not the type's formula, computed without overflow), except that the card
also checks the fragment geometry (``frag_mismatch``), which hosts check when reassembling.
Run alone: python3 -m pytest -q tests/dataplane/test_header_rules.py  (no root needed)
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embnic.client_lib import codec, consts
from embnic.client_lib.consts import DType, MsgType

import clientref

DP = Path(__file__).resolve().parents[2] / "dataplane"
_HDR = struct.Struct("!HBBBBHIHHHHIIIIHHHH")
FIELDS = [n for n, _, _ in consts.HEADER_FIELDS]


@pytest.fixture(scope="module")
def cparse(built_card, tmp_path_factory):
    """parse.c as a shared library: ``verdict(payload) -> "ok" | drop reason``."""
    from cparse import parse_verdict

    parse = parse_verdict(tmp_path_factory.mktemp("cparse"))

    def verdict(payload: bytes) -> str:
        return parse(_frame(payload), 1) or "ok"  # checksum good, any destination

    return verdict


def _frame(payload: bytes) -> bytes:
    """Ethernet / IPv4 (no options, DF) / UDP to 7878 around an embnic payload."""
    udp = struct.pack("!HHHH", 40000, consts.UDP_PORT, 8 + len(payload), 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28 + len(payload), 1, 0x4000, 64, 17, 0, bytes([10, 0, 0, 2]),
                     bytes([10, 0, 0, 1]))
    return bytes(12) + b"\x08\x00" + ip + udp + payload


def _py_verdict(payload: bytes) -> str:
    try:
        codec.parse_header(payload)
    except codec.FrameError as e:
        return e.reason
    return "ok"


@st.composite
def messages(draw):
    """One fragment (UDP payload) of a valid v2 message of any type, at a small MTU so that
    fragments are common."""
    t = draw(st.integers(1, 4))
    counts = draw(st.lists(st.integers(1, 40), min_size=t, max_size=t))
    dims = draw(st.lists(st.integers(1, 16), min_size=t, max_size=t))
    dtypes = draw(st.lists(st.sampled_from([DType.FP32, DType.FP16]), min_size=t, max_size=t))
    d = codec.make_directory(list(range(t)), dims, dtypes, counts)
    keys = np.arange(sum(counts), dtype=np.uint64)
    mtu = draw(st.sampled_from([200, 600, 1500]))
    kind = draw(st.sampled_from(list(MsgType)))
    ids = dict(msg_id=draw(st.integers(0, 2**32 - 1)), client_id=1, shard_id=2)
    lookup = codec.encode_lookup(directory=d, keys=keys, mtu=mtu, **ids)
    req = codec.unpack_header(lookup[0])
    if kind == MsgType.LOOKUP_REQ:
        frags = lookup
    elif kind == MsgType.UPDATE_REQ:
        frags = codec.encode_update(directory=d, keys=keys, values=bytes(codec.value_len_of(d)), mtu=mtu, **ids)
    elif kind == MsgType.LOOKUP_REPLY:
        frags = codec.encode_reply(req, kind, shard_id=2, body=bytes(req.value_len), mtu=mtu)
    elif kind == MsgType.UPDATE_NACK:  # the bitmap of the fragments held, fragmented at a small MTU too
        frags = codec.encode_reply(req, kind, shard_id=2, body=bytes(32), mtu=draw(st.sampled_from([90, 1500])))
    elif kind == MsgType.SIZE_REQ:
        e = np.zeros(draw(st.integers(1, 30)), codec.SIZE_ENTRY_DTYPE)
        frags = clientref.encode_size(entries=e, mtu=mtu, **ids)
    else:
        frags = codec.encode_reply(req, kind, shard_id=2, status=1 if kind == MsgType.ERROR else 0,
                                   table_id=1 if kind == MsgType.ERROR else consts.NO_TABLE)
    return frags[draw(st.integers(0, len(frags) - 1))]


#: values a broken field takes: nearby, extremes, the other protocol version
_SPECIAL = st.sampled_from([0, 1, 2, 3, 7, 8, 16, 255, 256, 257, 0xFFFF, 2**31, 2**32 - 1])


@st.composite
def broken(draw):
    """A message fragment with 0..3 header fields replaced (by a nearby value or an extreme)."""
    p = bytearray(draw(messages()))
    h = list(_HDR.unpack_from(p))
    for name in draw(st.lists(st.sampled_from(["version", "msg_type", "num_tables", "num_keys", "value_len",
                                               "msg_len", "frag_offset", "frag_index", "frag_count",
                                               "frag_len"]), max_size=3)):
        i = FIELDS.index(name)
        size = consts.HEADER_FIELDS[i][2]
        v = draw(st.one_of(_SPECIAL, st.integers(-8, 8).map(lambda d, x=h[i]: x + d)))
        h[i] = v % (1 << (8 * size))
    p[:consts.HDR_LEN] = _HDR.pack(*h)
    return bytes(p)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(broken())
def test_card_and_library_agree(cparse, payload):
    c, py = cparse(payload), _py_verdict(payload)
    if c == "frag_mismatch":  # geometry against frag_index: hosts find it on reassembly
        assert py == "ok", (payload[:44].hex(), c, py)
    else:
        assert c == py, (payload[:44].hex(), c, py)


def test_valid_messages_pass_and_known_faults(cparse):
    d = codec.make_directory([3, 7], [4, 16], [DType.FP32, DType.FP16], [5, 2])
    (good,) = codec.encode_lookup(msg_id=1, client_id=1, shard_id=0, directory=d, keys=np.arange(7, dtype=np.uint64))
    assert cparse(good) == "ok"
    h = codec.unpack_header(good)

    def put(**kw) -> bytes:
        return h._replace(**kw).pack() + good[consts.HDR_LEN:]

    assert cparse(put(version=1)) == cparse(put(version=3)) == "bad_version"
    assert cparse(put(num_tables=0, msg_len=8 * 7, frag_len=8 * 7)[:consts.HDR_LEN + 56]) == "bad_length"
    assert cparse(put(value_len=13)) == "bad_length"  # fewer than 2 bytes a row
    # 16·T + 8·n is 2^32 + msg_len here: computed in 32 bits it would wrap to msg_len and pass
    n = (2**32 + h.msg_len - 16 * h.num_tables) // 8
    assert 16 * h.num_tables + 8 * n == 2**32 + h.msg_len
    assert cparse(put(num_keys=n, value_len=2 * n)) == "bad_length"
    (reply,) = codec.encode_reply(h, MsgType.LOOKUP_REPLY, shard_id=0, body=bytes(h.value_len))
    assert cparse(reply) == "ok"
    assert cparse(codec.unpack_header(reply)._replace(value_len=h.value_len + 2).pack() + reply[44:]) == "bad_length"
