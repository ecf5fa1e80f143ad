"""The P4 card's header rules against the DPDK card's, on the same broken v2 headers.

tests/dataplane/test_header_rules.py judges hypothesis-drawn v2 frames (1..4 tables, every
type, small MTUs, 0..3 header fields broken: version, type, counts, lengths, fragments) with the
DPDK card's ``parse.c`` (built alone, through ctypes) and with the client library. Here the same
strategy draws a batch (derandomized: the same frames every run), every frame gets its own
``msg_id`` (each in a state-map slot of its own, so the map never joins two), and the batch goes
through the P4 card on BMv2 at once: each frame parse.c drops must be dropped for the same
reason, and each it passes must pass validation — a request is forwarded to its shard (the
exact set of msg_ids on the shard's port), a reply (no request before it) is
``unsolicited_reply``.
Run alone: sudo python3 -m pytest -q tests/p4/test_bmv2_header_rules.py
"""
from __future__ import annotations

import collections
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from embnic.client_lib import consts
from embnic.control import bmv2_pcap, bmv2_runtime
from embnic.control.dpdk_proc import DpdkProcError, build_card
from test_header_rules import broken, cparse  # noqa: F401  (cparse: the fixture, parse.c via ctypes)

pytestmark = [pytest.mark.root, pytest.mark.slow]

CARD = bmv2_runtime.CardPortAddr(0, "02:cc:00:00:00:00", "10.9.0.1")
CARD1 = bmv2_runtime.CardPortAddr(1, "02:cc:00:00:00:01", "10.9.1.1")
#: the ids test_header_rules' messages carry: client 1, shard 2
CLIENT = bmv2_runtime.PeerEntry(1, 0, "02:00:00:00:00:01", "10.9.0.2", 40000)
SHARD = bmv2_runtime.PeerEntry(2, 1, "02:00:00:00:00:02", "10.9.1.2", consts.UDP_PORT)
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


def unique_slot_ids(n: int) -> list[int]:
    """``n`` msg_ids of client 1 whose state-map slots all differ."""
    ids, slots, m = [], set(), 1
    while len(ids) < n:
        s = bmv2_runtime.state_slot(CLIENT.id, m)
        if s not in slots:
            slots.add(s)
            ids.append(m)
        m += 1
    return ids


@pytest.fixture(scope="module")
def run(bmv2_ready, cparse, tmp_path_factory):  # noqa: F811
    payloads = drawn_payloads(N)
    assert len(payloads) > N // 2
    frames, cases = [], []
    for msg_id, p in zip(unique_slot_ids(len(payloads)), payloads):
        p = p[:8] + struct.pack("!I", msg_id) + p[12:]
        msg_type = p[3]
        src, card = (SHARD, CARD1) if msg_type in consts.REPLY_TYPES else (CLIENT, CARD)
        frames.append((src.port, bytes(Ether(src=src.mac, dst=card.mac) / IP(src=src.ip, dst=card.ip, flags="DF")
                                       / UDP(sport=src.udp_port, dport=consts.UDP_PORT) / Raw(p))))
        cases.append((msg_id, msg_type, cparse(p)))
    cmds = bmv2_runtime.table_commands([CARD, CARD1], [SHARD], [CLIENT])
    r = bmv2_pcap.run_pcap_files(bmv2_ready, frames, cmds, tmp_path_factory.mktemp("bmv2rules"), nb_ports=2)
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
