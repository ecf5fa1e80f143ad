"""The P4 card's header rules against the DPDK card's, on the same broken v2 headers.

tests/dataplane/test_header_rules.py judges hypothesis-drawn v2 frames (1..4 tables, every
type, small MTUs, 0..3 header fields broken: version, type, counts, lengths, fragments) with the
DPDK card's ``parse.c`` (built alone, through ctypes) and with the client library. Here the same
strategy draws a batch (derandomized: the same frames every run), every frame gets its own
``msg_id`` (each in a state-map slot of its own, so the map never joins two), and the batch goes
through the P4 card on BMv2 at once, with one frame per header rule that breaks only that
rule (:func:`known_faults`): each frame parse.c drops must be dropped for the same
reason, and each it passes must pass validation — a request is forwarded to its shard (the
exact set of msg_ids on the shard's port), a reply (no request before it) is
``unsolicited_reply``.
Run alone: sudo python3 -m pytest -q tests/p4/test_bmv2_header_rules.py
"""
from __future__ import annotations

import collections
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from embnic.client_lib import codec, consts
from embnic.client_lib.consts import DType, MsgType
import bmv2_pcap
from embnic.control.targets.bmv2 import runtime as bmv2_runtime
from embnic.control.targets.base import Peer
from embnic.control.targets.dpdk.process import DpdkProcError, build_card
import p4ref
from test_header_rules import broken, cparse  # noqa: F401  (cparse: the fixture, parse.c via ctypes)
import clientref

pytestmark = [pytest.mark.root, pytest.mark.slow]

CARD = bmv2_runtime.CardPortAddr(0, "02:cc:00:00:00:00", "10.9.0.1")
CARD1 = bmv2_runtime.CardPortAddr(1, "02:cc:00:00:00:01", "10.9.1.1")
#: the ids test_header_rules' messages carry: client 1, shard 2
CLIENT = Peer("client", 1, 0, "02:00:00:00:00:01", "10.9.0.2", 40000)
SHARD = Peer("shard", 2, 1, "02:00:00:00:00:02", "10.9.1.2", consts.UDP_PORT)
N = 600


@pytest.fixture(scope="module")
def built_card():
    """dataplane/build (its embnic_config.h is what parse.c is compiled with)."""
    try:
        return build_card()
    except DpdkProcError as e:
        pytest.fail(str(e))


def drawn_payloads(n: int) -> list[bytes]:
    """``n`` (at most) UDP payloads of test_header_rules' ``broken()`` strategy, the same every run."""
    out: list[bytes] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(broken())
    def collect(p):
        out.append(p)

    collect()
    return out


def known_faults() -> list[bytes]:
    """One payload per header rule, each breaking exactly that rule of a valid message (the
    drawn batch may miss a rule whose breaking needs two fields to agree)."""
    d = codec.make_directory([3, 7], [4, 16], [DType.FP32, DType.FP16], [5, 2])
    (good,) = codec.encode_lookup(msg_id=1, client_id=CLIENT.id, shard_id=SHARD.id, directory=d,
                                  keys=np.arange(7, dtype=np.uint64))
    h = codec.unpack_header(good)

    def put(hdr, body: bytes, **kw) -> bytes:
        return hdr._replace(**kw).pack() + body

    body = good[consts.HDR_LEN:]
    n_wrap = (2**32 + h.msg_len - 16 * h.num_tables) // 8  # 16·T + 8·n = 2^32 + msg_len
    (reply,) = codec.encode_reply(h, MsgType.LOOKUP_REPLY, shard_id=SHARD.id, body=bytes(h.value_len))
    r = codec.unpack_header(reply)
    (nack,) = codec.encode_reply(h, MsgType.UPDATE_NACK, shard_id=SHARD.id, body=bytes(consts.NACK_LEN))
    k = codec.unpack_header(nack)
    size = clientref.encode_size(entries=np.zeros(2, codec.SIZE_ENTRY_DTYPE), msg_id=1, client_id=CLIENT.id,
                             shard_id=SHARD.id)[0]
    z = codec.unpack_header(size)
    return [good, reply, nack, size,
            put(h, body, version=1), put(h, body, version=3), put(h, body, msg_type=9), put(h, body, msg_type=0),
            put(h, body[:56], num_tables=0, msg_len=56, frag_len=56),       # no table
            put(h, body, num_tables=8, msg_len=16 * 8 + 56),                # n < T (and a longer msg_len)
            put(h, body, value_len=13),                                     # under 2 bytes a row
            put(h, body, num_keys=n_wrap, value_len=2 * n_wrap),            # 16T + 8n wraps 32 bits
            put(r, reply[44:], value_len=h.value_len + 2),                  # a reply not value_len long
            put(k, b"", msg_len=0, frag_len=0),                             # a NACK without its bitmap
            put(z, size[44:], num_tables=1),                                # a SIZE_REQ names a table
            put(z, b"", num_keys=0, msg_len=0, frag_len=0)]                 # a SIZE_REQ of no entry


def unique_slot_ids(n: int) -> list[int]:
    """``n`` msg_ids of client 1 whose state-map slots all differ."""
    ids, slots, m = [], set(), 1
    while len(ids) < n:
        s = p4ref.state_slots(CLIENT.id, m)
        if s not in slots:
            slots.add(s)
            ids.append(m)
        m += 1
    return ids


@pytest.fixture(scope="module")
def run(bmv2_ready, bmv2_channel, cparse, tmp_path_factory):  # noqa: F811
    payloads = drawn_payloads(N)
    assert len(payloads) > N // 2
    payloads += known_faults()
    frames, cases = [], []
    for msg_id, p in zip(unique_slot_ids(len(payloads)), payloads):
        p = p[:8] + struct.pack("!I", msg_id) + p[12:]
        msg_type = p[3]
        src, card = (SHARD, CARD1) if msg_type in consts.REPLY_TYPES else (CLIENT, CARD)
        frames.append((src.port, bytes(Ether(src=src.mac, dst=card.mac) / IP(src=src.ip, dst=card.ip, flags="DF")
                                       / UDP(sport=src.udp_port, dport=consts.UDP_PORT) / Raw(p))))
        cases.append((msg_id, msg_type, cparse(p)))
    program = bmv2_runtime.card_program([CARD, CARD1], [SHARD, CLIENT])
    r = bmv2_pcap.run_pcap_files(bmv2_ready, frames, program, tmp_path_factory.mktemp("bmv2rules"), nb_ports=2,
                                 channel=bmv2_channel)
    return {"cases": cases, "run": r}


def test_the_batch_covers_the_rules(run):
    """The drawn frames exercise every header rule (else the comparison below says little)."""
    verdicts = collections.Counter(v for _, _, v in run["cases"])
    assert {"ok", "bad_version", "bad_type", "bad_length", "too_many_frags", "frag_mismatch"} <= set(verdicts), verdicts
    assert sum(1 for _, t, v in run["cases"] if v == "ok" and t in consts.REPLY_TYPES) > 0


def test_same_drops_as_the_dpdk_card(run):
    want = collections.Counter(v for _, _, v in run["cases"] if v != "ok")
    want["unsolicited_reply"] += sum(1 for _, t, v in run["cases"] if v == "ok" and t in consts.REPLY_TYPES)
    got = {k: v for k, v in run["run"].counters["drops"].items() if v}
    assert got == dict(want)


def test_what_parse_c_passes_is_forwarded(run):
    want = sorted(m for m, t, v in run["cases"] if v == "ok" and t in consts.REQUEST_TYPES)
    out = run["run"].outputs
    assert out[0] == []
    assert sorted(struct.unpack_from("!I", f, 14 + 20 + 8 + 8)[0] for f in out[1]) == want
    types = collections.Counter(consts.MsgType(t).name for m, t, v in run["cases"]
                                if v == "ok" and t in consts.REQUEST_TYPES)
    assert {k: v for k, v in run["run"].counters["types"].items() if v} == dict(types)
