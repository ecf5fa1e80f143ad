"""The Scapy layer's defaults follow the protocol: ports, dissection, length fields.

Run alone: python3 -m pytest -q tests/client_lib/test_protocol.py
"""
import struct

import numpy as np
import pytest
from scapy.all import IP, UDP, Ether, Raw

from embnic.client_lib import codec, consts
from embnic.client_lib.consts import MsgType
from embnic.client_lib.protocol import EPHEMERAL_PORT, Embnic

import clientref

DIM = 4
KEYS = np.array([0, 2**31, 2**63, 2**64 - 1], dtype=np.uint64)
ROWS = np.arange(len(KEYS) * DIM, dtype="<f4").reshape(len(KEYS), DIM)
#: one table (id 2, dim 4, fp32) holding the 4 keys
DIRECTORY = codec.make_directory([2], [DIM], [1], [len(KEYS)]).tobytes()

#: a body of every type, built by hand (docs/protocol.md, "Body"), the num_keys it implies and
#: the header's num_tables and value_len
BODIES = {
    MsgType.LOOKUP_REQ: (DIRECTORY + KEYS.astype("<u8").tobytes(), 4, 1, ROWS.nbytes),
    MsgType.LOOKUP_REPLY: (ROWS.tobytes(), 4, 1, ROWS.nbytes),
    MsgType.UPDATE_REQ: (DIRECTORY + KEYS.astype("<u8").tobytes() + ROWS.tobytes(), 4, 1, ROWS.nbytes),
    MsgType.UPDATE_ACK: (b"", 0, 0, 0),
    MsgType.ERROR: (b"", 0, 0, 0),
    MsgType.SIZE_REQ: (bytes(range(48)), 3, 0, 0),  # 3 entries of 16 bytes
    MsgType.SIZE_ACK: (b"", 0, 0, 0),
    MsgType.UPDATE_NACK: (bytes([0x0F]) + bytes(31), 0, 0, 0),  # fragments 0..3 held
}


def test_issue_example_request_goes_to_7878_and_dissects_as_embnic():
    p = Ether() / IP() / UDP(sport=40000) / Embnic(msg_type=1, num_keys=2) / Raw(b"\x01" * 16)
    wire = bytes(p)
    assert struct.unpack_from("!HH", wire, 34) == (40000, 7878)
    back = Ether(wire)
    assert Embnic in back and back[Embnic].num_keys == 2 and back[Embnic].msg_type == 1
    assert back[Raw].load == b"\x01" * 16
    # num_keys follows from num_tables: a 1-table directory entry and 2 keys
    one = Embnic(msg_type=1, num_tables=1, value_len=64) / Raw(DIRECTORY[:16] + b"\x01" * 16)
    assert Embnic(bytes(one)).num_keys == 2


@pytest.mark.parametrize("t", list(MsgType))
def test_defaults_ports_lengths_and_round_trip(t):
    body, nkeys, ntables, vlen = BODIES[t]
    p = IP(src="10.0.0.2", dst="10.0.0.1") / UDP() / Embnic(msg_type=t, num_tables=ntables, value_len=vlen,
                                                              msg_id=9, client_id=3) / Raw(body)
    wire = bytes(p)
    sport, dport, ulen = struct.unpack_from("!HHH", wire, 20)
    if t == MsgType.LOOKUP_REPLY:  # a reply's num_keys does not follow from its length: given
        p[Embnic].num_keys = nkeys
        wire = bytes(p)
    if t in consts.REQUEST_TYPES:
        assert (sport, dport) == (EPHEMERAL_PORT, consts.UDP_PORT)
    else:
        assert (sport, dport) == (consts.UDP_PORT, EPHEMERAL_PORT)
    assert ulen == 8 + consts.HDR_LEN + len(body)
    # every length field is right by default: the fast codec's validation accepts the header
    h = codec.parse_header(wire[28:])
    assert (h.msg_type, h.num_keys, h.msg_len, h.frag_len, h.frag_count, h.frag_index, h.frag_offset) == \
        (t, nkeys, len(body), len(body), 1, 0, 0)
    # and the codec builds the same bytes for the same message
    assert codec.encode_message(t, msg_id=9, client_id=3, num_tables=ntables, num_keys=nkeys, value_len=vlen,
                                body=body) == [wire[28:]]
    # round trip: dissected, rebuilt, identical
    back = IP(wire)
    assert Embnic in back and bytes(back) == wire
    assert back[Embnic].msg_type == t and back[Embnic].num_keys == nkeys


def test_given_ports_win():
    p = UDP(sport=40000, dport=9999) / Embnic(msg_type="LOOKUP_REQ")
    assert (p.sport, p.dport) == (40000, 9999)
    r = UDP(dport=40000) / Embnic(msg_type="LOOKUP_REPLY")
    assert (r.sport, r.dport) == (consts.UDP_PORT, 40000)


@pytest.mark.parametrize("other", [53, 5353, 4754, 40000])
def test_any_datagram_to_or_from_7878_dissects_as_embnic(other):
    """Also when the other port is one Scapy binds to another layer (DNS on 53 and 5353, GRE)."""
    hdr = Embnic(msg_type="UPDATE_ACK", msg_id=5, client_id=1)
    for sport, dport in ((other, consts.UDP_PORT), (consts.UDP_PORT, other)):
        wire = bytes(IP() / UDP(sport=sport, dport=dport) / hdr)
        back = IP(wire)
        assert Embnic in back, (sport, dport, back.summary())
        assert back[Embnic].msg_id == 5


def test_request_and_reply_with_defaults_answer_each_other():
    req = IP(src="10.0.0.2", dst="10.0.0.1") / UDP() / Embnic(msg_type="LOOKUP_REQ", msg_id=7, client_id=2) / \
        Raw(codec.make_directory([2], [DIM], [1], [1]).tobytes() + KEYS[:1].tobytes())
    rep = IP(src="10.0.0.1", dst="10.0.0.2") / UDP() / Embnic(msg_type="ERROR", msg_id=7, client_id=2, status=6)
    assert rep.answers(req) and not req.answers(rep)


EDGES = [0, 2**31, 2**32, 2**48, 2**53, 2**63, 2**64 - 1]


def _near_edge():
    from hypothesis import strategies as st

    return st.builds(lambda e, d: min(max(e + d, 0), 2**64 - 1), st.sampled_from(EDGES), st.integers(-2, 2))


def test_u64_keys_round_trip_codec_and_scapy():
    """Keys near 0, 2^31, 2^32, 2^48, 2^53, 2^63, 2^64-1 survive the codec (fragmented too) and
    read back the same through the Scapy layer, as Python ints."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from embnic.client_lib.reassembly import Reassembler

    @settings(max_examples=80, deadline=None)
    @given(st.lists(_near_edge(), min_size=1, max_size=400), st.sampled_from([576, 1500]))
    def check(ids, mtu):
        keys = np.array(ids, dtype=np.uint64)
        frames = codec.encode_lookup(msg_id=1, client_id=1, shard_id=0, keys=keys, mtu=mtu,
                                     directory=codec.make_directory([2], [4], [1], [len(keys)]))
        r = Reassembler(expect="request")
        msgs = [m for m in (r.feed(f) for f in frames) if m is not None]
        assert len(msgs) == 1
        assert [int(k) for k in clientref.body_to_keys(msgs[0].body, len(ids), offset=16)] == ids
        body = b"".join(bytes(Embnic(f).payload) for f in frames)[16:]  # after the 1-table directory
        assert [int.from_bytes(body[i:i + 8], "little") for i in range(0, len(body), 8)] == ids

    check()
