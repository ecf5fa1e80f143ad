"""The P4 card at the edges of its fields and arrays, on BMv2 (simple_switch, pcap files).

Largest ids (client 65535, msg_id 2^32-1, shard 65535) index the state map and tables without
touching a wrong cell or stopping the switch; a 256-fragment message is tracked by its bitmap
(forwarded only once every fragment was seen, duplicates ignored) and freed by its reply; 257
fragments are too_many_frags; the reply rules drop unsolicited, wrong-shard and wrong-type
replies; a reply after the entry was freed is unsolicited.
Run alone: sudo python3 -m pytest -q tests/p4/test_bmv2_limits.py
"""
from __future__ import annotations

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from embnic.client_lib.consts import DType, MsgType, UDP_PORT
from embnic.client_lib.protocol import Embnic
from embnic.control import bmv2_pcap, bmv2_runtime

pytestmark = [pytest.mark.root, pytest.mark.slow]

CARD = bmv2_runtime.CardPortAddr(0, "02:cc:00:00:00:00", "10.9.0.1")
CARD1 = bmv2_runtime.CardPortAddr(1, "02:cc:00:00:00:01", "10.9.1.1")
CLIENT = bmv2_runtime.PeerEntry(65535, 0, "02:00:00:00:00:01", "10.9.0.2", 40000)
SHARD = bmv2_runtime.PeerEntry(65535, 1, "02:00:00:00:00:02", "10.9.1.2", UDP_PORT)
SHARD7 = bmv2_runtime.PeerEntry(7, 1, "02:00:00:00:00:07", "10.9.1.7", UDP_PORT)
MAX_ID = 0xFFFFFFFF


def frames_of(src: bmv2_runtime.PeerEntry, card: bmv2_runtime.CardPortAddr, msg_type: int, *, msg_id: int, shard: int,
              num_keys: int, frag: int | None = None, only: list[int] | None = None, dim: int = 4,
              dtype: int = DType.FP32) -> list[tuple[int, bytes]]:
    """(port, frame) of one message from ``src`` cut into ``frag``-byte fragments (default: one)."""
    from embnic.client_lib import consts

    msg_len = consts.expected_msg_len(msg_type, num_keys, dim, dtype)
    body = bytes(i & 0xFF for i in range(msg_len))
    p = frag or max(msg_len, 1)
    count = max(1, -(-msg_len // p))
    out = []
    for i in (only if only is not None else range(count)):
        chunk = body[i * p:(i + 1) * p]
        f = (Ether(src=src.mac, dst=card.mac) / IP(src=src.ip, dst=card.ip, flags="DF")
             / UDP(sport=src.udp_port, dport=UDP_PORT)
             / Embnic(msg_type=msg_type, dtype=dtype, msg_id=msg_id, client_id=CLIENT.id, shard_id=shard,
                      dim=dim, num_keys=num_keys, msg_len=msg_len, frag_offset=i * p, frag_index=i,
                      frag_count=count, frag_len=len(chunk)) / Raw(chunk))
        out.append((src.port, bytes(f)))
    return out


@pytest.fixture(scope="module")
def run(bmv2_ready, tmp_path_factory):
    L, LR, U, UA, E = (MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY, MsgType.UPDATE_REQ, MsgType.UPDATE_ACK,
                       MsgType.ERROR)
    seq: list[tuple[str, list]] = []
    # 256 fragments of 8 bytes, fragment 0 twice: forwarded once all 256 were seen
    big = frames_of(CLIENT, CARD, L, msg_id=MAX_ID, shard=SHARD.id, num_keys=256, frag=8)
    seq.append(("256 frags", big[:1] + big))
    seq.append(("257 frags", frames_of(CLIENT, CARD, L, msg_id=5, shard=SHARD.id, num_keys=257, frag=8)))
    seq.append(("reply from another shard", frames_of(SHARD7, CARD1, E, msg_id=MAX_ID, shard=SHARD7.id,
                                                      num_keys=256)))
    seq.append(("update ack to a lookup", frames_of(SHARD, CARD1, UA, msg_id=MAX_ID, shard=SHARD.id,
                                                    num_keys=256)))
    seq.append(("unsolicited", frames_of(SHARD, CARD1, LR, msg_id=77, shard=SHARD.id, num_keys=1)))
    seq.append(("the reply", frames_of(SHARD, CARD1, LR, msg_id=MAX_ID, shard=SHARD.id, num_keys=256,
                                       frag=512)))
    seq.append(("the reply again", frames_of(SHARD, CARD1, LR, msg_id=MAX_ID, shard=SHARD.id, num_keys=256,
                                             frag=512, only=[0])))
    # an update left open (no ack): holds its slot
    seq.append(("open update", frames_of(CLIENT, CARD, U, msg_id=9, shard=SHARD.id, num_keys=2)))
    frames = [f for _, fr in seq for f in fr]
    cmds = bmv2_runtime.table_commands([CARD, CARD1], [SHARD, SHARD7], [CLIENT])
    r = bmv2_pcap.run_pcap_files(bmv2_ready, frames, cmds, tmp_path_factory.mktemp("bmv2lim"), nb_ports=2)
    return {"seq": dict(seq), "run": r}


def test_drops_by_reason(run):
    d = {k: v for k, v in run["run"].counters["drops"].items() if v}
    assert d == {"too_many_frags": 257, "wrong_shard_reply": 1, "wrong_reply_type": 1,
                 "unsolicited_reply": 2}


def test_forwarded(run):
    c = run["run"].counters
    assert c["types"]["LOOKUP_REQ"] == 257          # 256 + the duplicate fragment 0
    assert c["types"]["LOOKUP_REPLY"] == 8           # 256 rows x 16 bytes in 512-byte fragments
    assert c["types"]["UPDATE_REQ"] == 1
    out0, out1 = run["run"].outputs[0], run["run"].outputs[1]
    assert len(out1) == 257 + 1 and len(out0) == 8
    assert all(bmv2_udp_ok(f) for f in out0 + out1)


def bmv2_udp_ok(frame: bytes) -> bool:
    from conformance import udp_checksum_ok
    return udp_checksum_ok(frame)


def test_the_answered_message_was_freed_and_the_open_one_holds_its_slot(run):
    st = run["run"].state
    assert [(e["client_id"], e["msg_id"], e["state"]) for e in st] == [(65535, 9, "forwarded")]
    assert st[0]["slot"] == bmv2_runtime.state_slot(65535, 9)
    assert run["run"].counters["completed"] == {"LOOKUP_REPLY": 1, "UPDATE_ACK": 0, "ERROR": 0,
                                                "SIZE_ACK": 0}
