"""The P4 card at the edges of its fields and arrays, and protocol v2's header rules, on BMv2
(simple_switch, pcap files).

Largest ids (client 65535, msg_id 2^32-1, shard 65535) index the state map and tables without
touching a wrong cell or stopping the switch; a 256-fragment message is tracked by its bitmap
(forwarded only once every fragment was seen, duplicates ignored) and freed by its reply; 257
fragments are too_many_frags; the reply rules drop unsolicited, wrong-shard and wrong-type
replies and a LOOKUP_REPLY whose value_len is not its request's (bad_reply_len); a reply after
the entry was freed is unsolicited. Protocol v2 (docs/protocol.md): a version-1 frame is
bad_version; msg_len is checked against the type's formula of the header's counts and counts
that do not fit the type are bad_length; a multi-table lookup passes and its reply of the
announced length frees it; an ERROR need not carry the request's value_len.
Run alone: sudo python3 -m pytest -q tests/p4/test_bmv2_limits.py
"""
from __future__ import annotations

import struct

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from embnic.client_lib import codec, consts
from embnic.client_lib.consts import DType, MsgType, UDP_PORT
from embnic.client_lib.protocol import Embnic
import bmv2_pcap
from embnic.control.targets.bmv2 import runtime as bmv2_runtime
from embnic.control.targets.base import Peer
import p4ref

pytestmark = [pytest.mark.root, pytest.mark.slow]

CARD = bmv2_runtime.CardPortAddr(0, "02:cc:00:00:00:00", "10.9.0.1")
CARD1 = bmv2_runtime.CardPortAddr(1, "02:cc:00:00:00:01", "10.9.1.1")
CLIENT = Peer("client", 65535, 0, "02:00:00:00:00:01", "10.9.0.2", 40000)
SHARD = Peer("shard", 65535, 1, "02:00:00:00:00:02", "10.9.1.2", UDP_PORT)
SHARD7 = Peer("shard", 7, 1, "02:00:00:00:00:07", "10.9.1.7", UDP_PORT)
MAX_ID = 0xFFFFFFFF
ROW = 16  #: bytes per row of the one table of most messages here (dim 4, fp32)


def wrap(src: Peer, card: bmv2_runtime.CardPortAddr, payload: bytes) -> tuple[int, bytes]:
    """(port, frame): ``payload`` (embnic header + body) in Ethernet/IPv4/UDP from ``src`` to ``card``."""
    f = (Ether(src=src.mac, dst=card.mac) / IP(src=src.ip, dst=card.ip, flags="DF")
         / UDP(sport=src.udp_port, dport=UDP_PORT) / Raw(payload))
    return src.port, bytes(f)


def frames_of(src: Peer, card: bmv2_runtime.CardPortAddr, msg_type: int, *, msg_id: int, shard: int,
              num_keys: int, frag: int | None = None, only: list[int] | None = None, num_tables: int = 1,
              value_len: int | None = None, msg_len: int | None = None) -> list[tuple[int, bytes]]:
    """(port, frame) of one v2 message from ``src`` cut into ``frag``-byte fragments (default: one).

    ``value_len`` defaults to ``ROW * num_keys``; ``msg_len`` to the type's formula
    (``consts.expected_msg_len``); the body is filler (the card reads none of it).
    """
    value_len = ROW * num_keys if value_len is None else value_len
    if msg_len is None:
        msg_len = consts.expected_msg_len(msg_type, num_tables, num_keys, value_len)
    body = bytes(i & 0xFF for i in range(msg_len))
    p = frag or max(msg_len, 1)
    count = max(1, -(-msg_len // p))
    out = []
    for i in (only if only is not None else range(count)):
        chunk = body[i * p:(i + 1) * p]
        out.append(wrap(src, card, bytes(
            Embnic(msg_type=msg_type, msg_id=msg_id, client_id=CLIENT.id, shard_id=shard, num_tables=num_tables,
                   num_keys=num_keys, value_len=value_len, msg_len=msg_len, frag_offset=i * p, frag_index=i,
                   frag_count=count, frag_len=len(chunk)) / Raw(chunk))))
    return out


def v1_lookup(msg_id: int, num_keys: int) -> list[tuple[int, bytes]]:
    """A protocol-version-1 LOOKUP_REQ (its 40-byte header: table 0, dim 4, fp32) and its keys."""
    body = bytes(8 * num_keys)
    hdr = struct.pack("!HBBBBHIHHHHIIIHHHH", consts.MAGIC, 1, MsgType.LOOKUP_REQ, 0, DType.FP32, 0, msg_id,
                      CLIENT.id, 0, SHARD.id, 4, num_keys, len(body), 0, 0, 1, len(body), 0)
    assert len(hdr) == 40
    return [wrap(CLIENT, CARD, hdr + body)]


def multi_table_lookup(msg_id: int) -> tuple[list[tuple[int, bytes]], list[tuple[int, bytes]]]:
    """A lookup of 2 keys of table 3 (dim 8, fp32) and 3 of table 5 (dim 4, fp16) — docs/protocol.md's
    example: T 2, n 5, msg_len 72, value_len 88 — built by the codec, and its reply."""
    d = codec.make_directory([3, 5], [8, 4], [DType.FP32, DType.FP16], [2, 3])
    req = codec.encode_lookup(msg_id=msg_id, client_id=CLIENT.id, shard_id=SHARD.id, directory=d,
                              keys=[10, 11, 20, 21, 22])
    h = codec.parse_header(req[0])
    assert (h.num_tables, h.num_keys, h.msg_len, h.value_len) == (2, 5, 72, 88)
    rep = codec.encode_reply(h, MsgType.LOOKUP_REPLY, shard_id=SHARD.id, body=bytes(88))
    return [wrap(CLIENT, CARD, f) for f in req], [wrap(SHARD, CARD1, f) for f in rep]


@pytest.fixture(scope="module")
def run(bmv2_ready, bmv2_channel, tmp_path_factory):
    L, LR, U, UA, E, S = (MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY, MsgType.UPDATE_REQ, MsgType.UPDATE_ACK,
                          MsgType.ERROR, MsgType.SIZE_REQ)
    seq: list[tuple[str, list]] = []
    # 256 fragments of 8 bytes (16 + 8·254 = 2048 body bytes), fragment 0 twice: forwarded once all 256 were seen
    big = frames_of(CLIENT, CARD, L, msg_id=MAX_ID, shard=SHARD.id, num_keys=254, frag=8)
    assert len(big) == 256
    seq.append(("256 frags", big[:1] + big))
    seq.append(("257 frags", frames_of(CLIENT, CARD, L, msg_id=5, shard=SHARD.id, num_keys=255, frag=8)))
    seq.append(("reply from another shard", frames_of(SHARD7, CARD1, E, msg_id=MAX_ID, shard=SHARD7.id,
                                                      num_keys=254)))
    seq.append(("update ack to a lookup", frames_of(SHARD, CARD1, UA, msg_id=MAX_ID, shard=SHARD.id,
                                                    num_keys=254)))
    seq.append(("unsolicited", frames_of(SHARD, CARD1, LR, msg_id=77, shard=SHARD.id, num_keys=1)))
    # rows of another length than the request announced (253 rows): every fragment bad_reply_len,
    # and the entry keeps waiting for its own reply
    seq.append(("reply of another length", frames_of(SHARD, CARD1, LR, msg_id=MAX_ID, shard=SHARD.id,
                                                     num_keys=253, frag=512, only=[0, 7])))
    seq.append(("the reply", frames_of(SHARD, CARD1, LR, msg_id=MAX_ID, shard=SHARD.id, num_keys=254,
                                       frag=512)))
    seq.append(("the reply again", frames_of(SHARD, CARD1, LR, msg_id=MAX_ID, shard=SHARD.id, num_keys=254,
                                             frag=512, only=[0])))
    # an update left open (no ack): holds its slot
    seq.append(("open update", frames_of(CLIENT, CARD, U, msg_id=9, shard=SHARD.id, num_keys=2)))
    # protocol v2's header rules
    seq.append(("v1 frame", v1_lookup(10, 2)))
    seq.append(("bad counts", [
        *frames_of(CLIENT, CARD, L, msg_id=20, shard=SHARD.id, num_keys=2, num_tables=0),      # no table
        *frames_of(CLIENT, CARD, L, msg_id=21, shard=SHARD.id, num_keys=2, num_tables=3),      # n < T
        *frames_of(CLIENT, CARD, U, msg_id=22, shard=SHARD.id, num_keys=2, value_len=3),       # < 2 bytes a row
        *frames_of(CLIENT, CARD, S, msg_id=23, shard=SHARD.id, num_keys=1, num_tables=1),      # SIZE_REQ, T != 0
        *frames_of(CLIENT, CARD, L, msg_id=24, shard=SHARD.id, num_keys=2, num_tables=2,       # msg_len for T=1
                   msg_len=consts.expected_msg_len(L, 1, 2, 2 * ROW))]))
    req, rep = multi_table_lookup(30)
    seq.append(("multi-table lookup", req))
    seq.append(("its reply", rep))
    # an ERROR answers with any value_len (only a LOOKUP_REPLY's length is checked)
    seq.append(("lookup for an error", frames_of(CLIENT, CARD, L, msg_id=31, shard=SHARD.id, num_keys=2)))
    seq.append(("the error", frames_of(SHARD, CARD1, E, msg_id=31, shard=SHARD.id, num_keys=0, num_tables=0,
                                       value_len=0)))
    # an update polled by its re-sent last fragment: the shard's UPDATE_NACK (a 32-byte bitmap of
    # the fragments it holds) answers it and frees the entry; a NACK to a lookup is wrong_reply_type
    seq.append(("polled update", frames_of(CLIENT, CARD, U, msg_id=40, shard=SHARD.id, num_keys=100, frag=1024,
                                           only=[2])))
    seq.append(("its NACK", frames_of(SHARD, CARD1, MsgType.UPDATE_NACK, msg_id=40, shard=SHARD.id, num_keys=100)))
    seq.append(("a lookup", frames_of(CLIENT, CARD, L, msg_id=41, shard=SHARD.id, num_keys=1)))
    seq.append(("a NACK to it", frames_of(SHARD, CARD1, MsgType.UPDATE_NACK, msg_id=41, shard=SHARD.id,
                                          num_keys=1)))
    frames = [f for _, fr in seq for f in fr]
    program = bmv2_runtime.card_program([CARD, CARD1], [SHARD, SHARD7, CLIENT])
    r = bmv2_pcap.run_pcap_files(bmv2_ready, frames, program, tmp_path_factory.mktemp("bmv2lim"), nb_ports=2,
                                 channel=bmv2_channel)
    assert r.channel == bmv2_channel
    return {"seq": dict(seq), "run": r}


def test_drops_by_reason(run):
    d = {k: v for k, v in run["run"].counters["drops"].items() if v}
    assert d == {"too_many_frags": 257, "wrong_shard_reply": 1, "wrong_reply_type": 2,
                 "unsolicited_reply": 2, "bad_reply_len": 2, "bad_version": 1, "bad_length": 5}


def test_forwarded(run):
    c = run["run"].counters
    assert c["types"]["LOOKUP_REQ"] == 257 + 3      # 256 + the duplicate fragment 0; the multi-table one, msgs 31, 41
    assert c["types"]["LOOKUP_REPLY"] == 8 + 1       # 254 rows x 16 bytes in 512-byte fragments; the multi-table one
    assert c["types"]["UPDATE_REQ"] == 2
    assert c["types"]["ERROR"] == 1 and c["types"]["UPDATE_NACK"] == 1
    out0, out1 = run["run"].outputs[0], run["run"].outputs[1]
    assert len(out1) == 257 + 1 + 2 + 2 and len(out0) == 8 + 2 + 1
    assert all(bmv2_udp_ok(f) for f in out0 + out1)


def bmv2_udp_ok(frame: bytes) -> bool:
    from conformance import udp_checksum_ok
    return udp_checksum_ok(frame)


def test_the_answered_message_was_freed_and_the_open_one_holds_its_slot(run):
    st = run["run"].state
    # the NACK freed msg 40; msg 41 (a lookup, its NACK dropped) still waits
    assert sorted((e["client_id"], e["msg_id"], e["state"]) for e in st) == [(65535, 9, "forwarded"),
                                                                          (65535, 41, "forwarded")]
    st = [e for e in st if e["msg_id"] == 9]
    assert st[0]["slot"] == p4ref.state_slots(65535, 9)
    assert st[0]["num_tables"] == 1 and st[0]["num_keys"] == 2 and st[0]["value_len"] == 2 * ROW
    assert st[0]["msg_len"] == consts.expected_msg_len(MsgType.UPDATE_REQ, 1, 2, 2 * ROW)
    assert run["run"].counters["completed"] == {"LOOKUP_REPLY": 2, "UPDATE_ACK": 0, "ERROR": 1,
                                                "SIZE_ACK": 0, "UPDATE_NACK": 1}
