#!/usr/bin/env python3
"""Write the libFuzzer seed corpora (dataplane/fuzz/seeds/<target>/) from the Scapy layer, the
conformance cases beside this file and the recorded trace in tests/.

Run from the repo root: ``python3 tests/dataplane/make_fuzz_seeds.py``. Writes:

- ``seeds/parse/``: the 2-byte harness prefix of fuzz_parse.c (mode, extra) and one frame each:
  valid v2 requests (with their directories, one table and two), replies and fragments of every
  type, an ARP request, a few near misses (a v1 frame, counts that do not fit the type).
- ``seeds/card/``: inputs of fuzz_card.c (its header comment gives the format): the conformance
  suite's card (3 ports, clients 1-3, shards 0-2 at the suite's addresses) with the frames of
  each case, grouped by message (a request with the reply that answers it, retransmissions,
  duplicated fragments), then windows of the replay-not-owner trace
  (tests/testbed/cases/replay-not-owner/t.pcap) sent by registered clients.
- ``seeds/ctl/``: inputs of fuzz_ctl.c (JSON lines): every command of docs/control-socket.md
  with valid fields (the conformance suite's route_add/client_add requests), and refusals.
"""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

import numpy as np

from embnic.client_lib import codec
from embnic.client_lib.consts import DType
from embnic.client_lib.protocol import Embnic

from conformance import Peer, Suite, read_pcap

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "dataplane" / "fuzz" / "seeds"
CARD = "10.0.0.1"

TRACE = REPO / "tests" / "testbed" / "cases" / "replay-not-owner" / "t.pcap"
TRACE_WINDOWS = 24  #: card seeds cut from the trace
TRACE_WINDOW = 8  #: frames each


def frame(hdr: Embnic, body: bytes, sport: int = 40000) -> bytes:
    return bytes(Ether(src="02:00:00:00:00:02", dst="02:00:00:00:00:01")
                 / IP(src="10.0.0.2", dst=CARD, flags="DF") / UDP(sport=sport, dport=7878) / hdr / Raw(body))


def parse_seeds() -> dict[str, bytes]:
    """One frame of every type in protocol v2 (a request's body: its directory, then keys and
    gradients), the fragments of a 3-fragment lookup, and near misses: a v1 frame, counts that do
    not fit the type, a msg_len that is not the type's formula."""
    one = codec.make_directory([0], [8], [DType.FP32], [3])  # 3 keys of table 0, 8 fp32 each
    two = codec.make_directory([5, 9], [2, 2], [DType.FP16, DType.FP32], [1, 1])  # 4 + 8 value bytes
    keys3, keys2 = np.arange(3, dtype="<u8").tobytes(), np.arange(2, dtype="<u8").tobytes()
    s = {}
    s["lookup_req"] = frame(Embnic(msg_type=1, msg_id=1, client_id=1, shard_id=2, num_tables=1, value_len=96),
                            one.tobytes() + keys3)
    s["lookup_reply"] = frame(Embnic(msg_type=2, msg_id=1, client_id=1, shard_id=2, num_tables=1, num_keys=3,
                                     value_len=96), bytes(96), sport=7878)
    s["update_req"] = frame(Embnic(msg_type=3, msg_id=2, client_id=1, shard_id=0, num_tables=2, value_len=12),
                            two.tobytes() + keys2 + bytes(12))
    s["update_ack"] = frame(Embnic(msg_type=4, msg_id=2, client_id=1, shard_id=0, num_tables=2, num_keys=2,
                                   value_len=12), b"", sport=7878)
    s["error"] = frame(Embnic(msg_type=5, msg_id=3, status=2, client_id=1, num_tables=2, table_id=9, num_keys=2,
                              value_len=12), b"", sport=7878)
    s["size_req"] = frame(Embnic(msg_type=6, msg_id=4, client_id=1, shard_id=0), bytes(2 * 16))
    s["size_ack"] = frame(Embnic(msg_type=7, msg_id=4, client_id=1, shard_id=0, num_keys=2), b"", sport=7878)
    # fragments of a 3-fragment lookup request (directory + 3 keys = 40 bytes), P = 16
    for i, (off, ln) in enumerate([(0, 16), (16, 16), (32, 8)]):
        s[f"frag{i}"] = frame(Embnic(msg_type=1, msg_id=9, client_id=2, shard_id=1, num_tables=1, num_keys=3,
                                     value_len=48, msg_len=40, frag_offset=off, frag_index=i, frag_count=3,
                                     frag_len=ln), (one.tobytes() + keys3)[off:off + ln])
    v1 = struct.pack("!HBBBBHIHHHHIIIHHHH", 0x454D, 1, 1, 0, 1, 0, 1, 1, 0, 2, 8, 1, 8, 0, 0, 1, 8, 0)
    s["bad_version_v1"] = bytes(Ether(src="02:00:00:00:00:02", dst="02:00:00:00:00:01")
                                / IP(src="10.0.0.2", dst=CARD, flags="DF") / UDP(sport=40000, dport=7878)
                                / Raw(v1 + bytes(8)))
    s["bad_counts"] = frame(Embnic(msg_type=1, num_tables=2, num_keys=1, value_len=16), bytes(40))
    s["bad_length"] = frame(Embnic(msg_type=1, num_tables=1, num_keys=2, value_len=16, msg_len=24, frag_len=16),
                            bytes(16))
    s["arp_request"] = bytes(Ether(src="02:00:00:00:00:02", dst="ff:ff:ff:ff:ff:ff")
                             / ARP(op=1, hwsrc="02:00:00:00:00:02", psrc="10.0.0.2", pdst=CARD))
    return {k: bytes([0x04, 0x00]) + f for k, f in s.items()}  # mode: port ip 10.0.0.1


# ---- fuzz_card.c inputs ----------------------------------------------------------------------

def _udp_code(port: int) -> int:
    """fuzz_card.c's UDP port byte: 0 = 7878, 1..127 = 7878 + u, 128..255 = 40000 + u - 128."""
    if 7878 <= port < 7878 + 128:
        return port - 7878
    if 40000 <= port < 40000 + 128:
        return port - 40000 + 128
    raise ValueError(f"UDP port {port} has no code in fuzz_card.c")


def _peer(peer) -> bytes:
    """4 bytes: id, port, last byte of 10.1.<port>.<x>, UDP port code."""
    a = [int(x) for x in peer.ip.split(".")]
    assert a[:3] == [10, 1, peer.port], peer
    return bytes([peer.id, peer.port, a[3], _udp_code(peer.udp_port)])


def card_config(ports: int, shards: list, clients: list, burst: int = 32, no_ip: bool = False,
                partitions: int = 1, small_frames: bool = False) -> bytes:
    """The input's first 27 bytes: ports, burst, up to 3 routes and 3 clients, 1 or 2 state map
    partitions (--state-lcores); ``small_frames``: ports 1 and 2 send at most 1514-byte frames."""
    assert 1 <= ports <= 3 and len(shards) <= 3 and len(clients) <= 3 and 1 <= burst <= 32
    c0 = (ports - 1) | (4 if no_ip else 0) | (burst - 1) << 3
    peers = b"".join(_peer(p) for p in shards).ljust(12, b"\0")
    peers += b"".join(_peer(p) for p in clients).ljust(12, b"\0")
    assert partitions in (1, 2)
    return bytes([c0, len(shards) | (4 if partitions == 2 else 0),
                  len(clients) | (4 if small_frames else 0)]) + peers


def card_frame(data: bytes, port: int, flags: int = 0, step: int = 0, split: int = 0, hint: int = 0) -> bytes:
    """One frame record: length, flags (port in bits 0-1), step (+ checksum hint), split."""
    return struct.pack("<HBBB", len(data), (flags & ~3) | port, (step & 0x3F) | hint << 6, split) + data


def card_seeds() -> dict[str, bytes]:
    suite = Suite.default()
    cfg = card_config(3, list(suite.shards.values()), list(suite.clients.values()))
    groups: dict[object, list] = {}
    for f in suite.frames:
        d = f.data  # embnic frames by (client id, msg id); the rest alone
        key = (d[54:56], d[50:54]) if len(d) >= 86 and d[12:14] == b"\x08\x00" and d[42:44] == b"EM" \
            else f.label
        groups.setdefault(key, []).append(f)
    s = {}
    for n, frames in enumerate(groups.values()):
        recs = b"".join(card_frame(f.data, f.port, step=0 if i == 0 else 1) for i, f in enumerate(frames))
        s[f"conformance{n:02d}"] = cfg + recs
    # the same card with the request's fragments split over two segments, and an expiry in between
    first = suite.frames[0]
    s["conformance_split"] = cfg + card_frame(first.data, first.port, flags=0x40, split=60)
    # an Ethernet trailer after the datagram longer than the frame's second segment (what
    # regress-trailer-2-segs found with a v1 frame): the card cuts it across segments
    trailer = first.data + bytes(range(60))
    s["trailer_2_segs"] = cfg + card_frame(trailer, first.port, flags=0x40, split=len(first.data) + 20)
    # an update answered by the first of 2 fragments of an UPDATE_NACK (its 32-byte bitmap cut at
    # P = 16): the entry stays replying with 16 of the reply's 32 bytes (the reply's length comes
    # from its type, an UPDATE_NACK's is not 0)
    c2, s0 = suite.clients[2], suite.shards[0]
    m = 7777
    upd = suite.message(c2, 3, msg_id=m, client_id=2, shard_id=0, num_keys=3, dim=2)
    req = Embnic(upd[0][42:])
    nack = [bytes(suite.l2l3(s0) / Embnic(msg_type=8, msg_id=m, client_id=2, shard_id=0, num_tables=req.num_tables,
                                          num_keys=req.num_keys, value_len=req.value_len, msg_len=32,
                                          frag_offset=16 * i, frag_index=i, frag_count=2, frag_len=16)
                  / Raw(bytes([0x01 if i == 0 else 0]) + bytes(15))) for i in range(2)]
    s["nack_2_frags_half"] = cfg + b"".join(card_frame(f, c2.port) for f in upd) + card_frame(nack[0], s0.port)
    s["nack_2_frags"] = cfg + b"".join(card_frame(f, c2.port) for f in upd + nack)
    s["conformance_expire"] = (cfg + card_frame(first.data, first.port)
                               + card_frame(first.data, first.port, step=40))
    # floods (step bits 6-7 = 3: 24 messages, msg ids counting up): one client fills the 16-entry
    # state map (state_full); three ports at once overflow the 64-entry header ring (ring_full)
    # and the 15 frames a TX queue takes (tx_full)
    firsts = {}
    for f in suite.frames:
        if f.label.endswith("[0]") and "lookup" in f.label and f.fate[0] == "fwd":
            firsts.setdefault(f.port, f)
    s["flood_state_full"] = cfg + card_frame(firsts[0].data, 0, hint=3)
    s["flood_3_ports"] = cfg + b"".join(card_frame(f.data, p, hint=3) for p, f in sorted(firsts.items()))
    # the state map partitioned over 2 state lcores: the whole suite in a few inputs of many
    # messages each (requests and replies steered to their partitions; each under the target's
    # max_len, 16384), and the 3-port flood
    cfg2 = card_config(3, list(suite.shards.values()), list(suite.clients.values()), partitions=2)
    chunk, k = b"", 0
    for frames in groups.values():
        recs = b"".join(card_frame(f.data, f.port, step=0 if i == 0 else 1) for i, f in enumerate(frames))
        if chunk and len(cfg2) + len(chunk) + len(recs) > 16000:
            s[f"partitioned_suite{k}"], chunk, k = cfg2 + chunk, b"", k + 1
        chunk += recs
    if chunk:
        s[f"partitioned_suite{k}"] = cfg2 + chunk
    s["partitioned_flood_3_ports"] = cfg2 + b"".join(card_frame(f.data, p, hint=3)
                                                     for p, f in sorted(firsts.items()))
    # ports 1 and 2 send at most 1514-byte frames: a 3200-byte lookup in one 3282-byte frame from
    # client 1 (port 0) to shard 1 (port 2) is too_long_for_port, the same cut at 1432 passes
    cfg3 = card_config(3, list(suite.shards.values()), list(suite.clients.values()), small_frames=True)
    c1 = suite.clients[1]
    big = suite.message(c1, 1, msg_id=77, client_id=1, shard_id=1, num_keys=400, frag_size=3200)
    fit = suite.message(c1, 1, msg_id=78, client_id=1, shard_id=1, num_keys=400)
    s["too_long_for_port"] = cfg3 + b"".join(card_frame(f, 0, step=1) for f in big + fit)
    # the recorded trace: requests of clients 1 and 2 to shards 0 and 1, sent from the registered
    # client (flag 0x20) with both checksums fixed (0x08, 0x10), all on port 0
    if TRACE.exists():
        frames = read_pcap(TRACE)
        shards = [Peer("shard", i, 0, "02:00:00:00:00:1%d" % i, f"10.1.0.{10 + i}", 7878) for i in range(2)]
        clients = [Peer("client", i, 0, "02:00:00:00:00:0%d" % i, f"10.1.0.{i + 1}", 40000 + i)
                   for i in (1, 2)]
        tcfg = card_config(1, shards, clients)
        step = max(1, (len(frames) - TRACE_WINDOW) // TRACE_WINDOWS)
        for w in range(TRACE_WINDOWS):
            win = frames[w * step:w * step + TRACE_WINDOW]
            s[f"trace{w:02d}"] = tcfg + b"".join(card_frame(f, 0, flags=0x38) for f in win)
    return s


# ---- fuzz_ctl.c inputs -----------------------------------------------------------------------

def ctl_seeds() -> dict[str, bytes]:
    suite = Suite.default()
    adds = suite.route_cmds() + suite.client_cmds()
    for i, c in enumerate(adds):
        c["id"] = i + 1
    lines = [json.dumps(c) for c in adds]
    simple = ["ping", "info", "route_list", "client_list", "counters", "state_summary", "ring_stats",
              "ring_last", "reset_counters", "pause", "resume"]
    s = {
        "tables": "\n".join(lines) + "\n",
        "simple": "\n".join(json.dumps({"cmd": c, "id": c}) for c in simple) + "\n",
        "dump": json.dumps({"cmd": "state_dump", "limit": 5}) + "\n" + json.dumps({"cmd": "state_dump"}) + "\n",
        "del": "\n".join(lines) + "\n" + "\n".join(
            json.dumps({"cmd": "route_del" if "shard" in c else "client_del",
                        ("shard" if "shard" in c else "client"): c.get("shard", c.get("client"))})
            for c in adds) + "\n",
        "refused": "\n".join([
            '{"cmd":"route_add","shard":70000,"port":0,"mac":"02:00:00:00:00:01","ip":"10.1.0.9"}',
            '{"cmd":"route_add","shard":3,"port":7,"mac":"02:00:00:00:00:01","ip":"10.1.0.9"}',
            '{"cmd":"route_add","shard":3,"port":0,"mac":"nope","ip":"10.1.0.9"}',
            '{"cmd":"client_add","client":3,"port":0,"mac":"02:00:00:00:00:01","ip":"10.1.0.999"}',
            '{"cmd":"client_add","client":3,"port":0,"mac":"02:00:00:00:00:01","ip":"10.1.0.9","udp_port":0}',
            '{"cmd":"route_del","shard":5}',
            '{"cmd":"state_dump","limit":-1}',
            '{"cmd":"ring_last","last":0}', '{"cmd":"ring_last","last":256}',
            '{"cmd":"pause","stage":"tx"}', '{"cmd":"pause","stage":"both"}', '{"cmd":"pause","stage":1}', '{"cmd":"resume","stage":"rx"}',
            '{"cmd":"nope","id":[1,{"a":null}]}',
            '{"cmd":1}', '[1,2]', '{"cmd":"ping","cmd":"ping"}', '{"cmd":"ping"',
        ]) + "\n",
        "full": "\n".join(json.dumps({"cmd": "route_add", "shard": i, "port": i % 3,
                                      "mac": f"02:00:00:00:00:{i:02x}", "ip": f"10.1.0.{i + 10}"})
                          for i in range(10)) + "\n",
    }
    return {k: v.encode() for k, v in s.items()}


def write(name: str, seeds: dict[str, bytes]) -> None:
    d = OUT / name
    d.mkdir(parents=True, exist_ok=True)
    for old in d.iterdir():
        if not old.name.startswith("regress-"):  # crash inputs are kept (tests/dataplane/test_fuzz.py)
            old.unlink()
    for k, v in seeds.items():
        (d / k).write_bytes(v)
    print(f"wrote {len(seeds)} seeds to {d}")


def main() -> int:
    write("parse", parse_seeds())
    write("card", card_seeds())
    write("ctl", ctl_seeds())
    return 0


if __name__ == "__main__":
    sys.exit(main())
