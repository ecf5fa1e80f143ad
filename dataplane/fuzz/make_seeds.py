#!/usr/bin/env python3
"""Write the libFuzzer seed corpus (dataplane/fuzz/seeds/) from the Scapy layer.

Run from the repo root: ``python3 dataplane/fuzz/make_seeds.py``. Each seed is the 2-byte
harness prefix (mode, extra; see fuzz_parse.c) followed by one frame: valid requests, replies
and fragments of every type, an ARP request for 10.0.0.1, and a few near misses.
"""
from __future__ import annotations

import sys
from pathlib import Path

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from embnic.client_lib.protocol import Embnic

OUT = Path(__file__).resolve().parent / "seeds"
CARD = "10.0.0.1"


def frame(hdr: Embnic, body: bytes, sport: int = 40000) -> bytes:
    return bytes(Ether(src="02:00:00:00:00:02", dst="02:00:00:00:00:01")
                 / IP(src="10.0.0.2", dst=CARD, flags="DF") / UDP(sport=sport, dport=7878) / hdr / Raw(body))


def seeds() -> dict[str, bytes]:
    s = {}
    s["lookup_req"] = frame(Embnic(msg_type=1, msg_id=1, client_id=1, table_id=0, shard_id=2, dim=8,
                                   dtype=1), bytes(range(24)))
    s["lookup_reply"] = frame(Embnic(msg_type=2, msg_id=1, client_id=1, shard_id=2, dim=2, dtype=1),
                              bytes(24), sport=7878)
    s["update_req"] = frame(Embnic(msg_type=3, msg_id=2, client_id=1, shard_id=0, dim=2, dtype=2),
                            bytes(2 * (8 + 4)))
    s["update_ack"] = frame(Embnic(msg_type=4, msg_id=2, client_id=1, shard_id=0, dim=2, dtype=2,
                                   num_keys=2), b"", sport=7878)
    s["error"] = frame(Embnic(msg_type=5, msg_id=3, status=3, client_id=1, num_keys=1), b"", sport=7878)
    # fragments of a 3-fragment lookup request, P = 16
    for i, (off, ln) in enumerate([(0, 16), (16, 16), (32, 8)]):
        s[f"frag{i}"] = frame(Embnic(msg_type=1, msg_id=9, client_id=2, shard_id=1, dim=4, dtype=1,
                                     num_keys=5, msg_len=40, frag_offset=off, frag_index=i,
                                     frag_count=3, frag_len=ln), bytes(ln))
    s["bad_version"] = frame(Embnic(msg_type=1, version=2, num_keys=1, dtype=1, dim=1), bytes(8))
    s["bad_length"] = frame(Embnic(msg_type=1, num_keys=2, msg_len=16, frag_len=8, dtype=1, dim=1),
                            bytes(8))
    s["arp_request"] = bytes(Ether(src="02:00:00:00:00:02", dst="ff:ff:ff:ff:ff:ff")
                             / ARP(op=1, hwsrc="02:00:00:00:00:02", psrc="10.0.0.2", pdst=CARD))
    return s


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for name, f in seeds().items():
        (OUT / name).write_bytes(bytes([0x04, 0x00]) + f)  # mode: port ip 10.0.0.1
    print(f"wrote {len(seeds())} seeds to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
