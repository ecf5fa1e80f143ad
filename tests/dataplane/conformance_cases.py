"""The standard conformance cases (:meth:`conformance.Suite.default`), by kind.

Each ``add_*`` appends input frames and their fates to a :class:`conformance.Suite`: valid
requests and replies, of one table and of several (:func:`add_valid`), frames that do not
parse or do not add up (a version-1 frame among them) (:func:`add_malformed`), senders and
targets the tables do not know and registered addresses from another card port or MAC
(:func:`add_unauthorised`, :func:`add_wrong_port`), the state map's reply rules
(:func:`add_reply_path`, with a reply before the whole request: :func:`add_answered_early`) and
fragments cut at another size than their message's (:func:`add_frag_geometry`). The wiring and the meaning of a fate
are in ``conformance.py``'s docstring.

Run through the suite: ``python3 -m pytest -q tests/dataplane/test_conformance.py``.
"""
from __future__ import annotations

import dataclasses

from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from embnic.client_lib import consts
from embnic.client_lib.consts import DType, Flags, MsgType, Status
from embnic.client_lib.protocol import Embnic
from conformance import CARD_MAC_IN, P, PORT, Peer, Suite, v1_frame_payload


def add_valid(s: Suite) -> None:
    """Requests from 3 clients to 3 shards (fragmented, fp16, several tables, retransmitted, UDP
    checksum 0, Ethernet trailer), their replies on the request's port, ARP for each card
    address."""
    c1, c2 = s.clients[1], s.clients[2]
    s0, s1, s2 = s.shards[0], s.shards[1], s.shards[2]
    L, LR, U, UA, E = (MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY, MsgType.UPDATE_REQ,
                       MsgType.UPDATE_ACK, MsgType.ERROR)
    # requests from 2 clients to 3 shards
    m1 = s.msg_id()
    s.add_message("c1 lookup s0", c1, L, ("fwd", s0), msg_id=m1, client_id=1, shard_id=0, num_keys=3)
    m2 = s.msg_id()
    s.add_message("c2 lookup s1", c2, L, ("fwd", s1), msg_id=m2, client_id=2, shard_id=1, num_keys=5)
    m3 = s.msg_id()  # 16 + 400 keys = 3216 bytes: 3 fragments
    s.add_message("c1 lookup s2 (3 frags)", c1, L, ("fwd", s2), msg_id=m3, client_id=1, shard_id=2,
                  num_keys=400)
    m4 = s.msg_id()  # 16 + 30 keys x (8 + 16*4) = 2176 bytes: 2 fragments
    s.add_message("c2 update s2 (2 frags)", c2, U, ("fwd", s2), msg_id=m4, client_id=2, shard_id=2,
                  num_keys=30, dim=16)
    m5 = s.msg_id()
    s.add_message("c1 update fp16 s0", c1, U, ("fwd", s0), msg_id=m5, client_id=1, shard_id=0,
                  num_keys=7, dim=8, dtype=DType.FP16)
    s.add_message("c1 lookup s0 retransmit", c1, L, ("fwd", s0), msg_id=m1, client_id=1, shard_id=0,
                  num_keys=3, flags=Flags.RETRANSMIT)
    # replies from registered servers, each on the ingress port of its request
    c3 = s.clients[3]
    m6 = s.msg_id()
    s.add_message("c2 lookup s0", c2, L, ("fwd", s0), msg_id=m6, client_id=2, shard_id=0, num_keys=3)
    s.add_message("s0 reply c2", s0, LR, ("fwd", c2), msg_id=m6, client_id=2, shard_id=0, num_keys=3)
    m7 = s.msg_id()
    s.add_message("c3 lookup s2 (3 frags)", c3, L, ("fwd", s2), msg_id=m7, client_id=3, shard_id=2,
                  num_keys=400)
    s.add_message("s2 reply c3 (5 frags)", s2, LR, ("fwd", c3), msg_id=m7, client_id=3, shard_id=2,
                  num_keys=400)
    m8 = s.msg_id()
    s.add_message("c2 update s0 (2 frags)", c2, U, ("fwd", s0), msg_id=m8, client_id=2, shard_id=0,
                  num_keys=30, dim=16)
    s.add_message("s0 ack c2", s0, UA, ("fwd", c2), msg_id=m8, client_id=2, shard_id=0, num_keys=30,
                  dim=16)
    # one message for every table a client asks of a shard (docs/protocol.md, "Version 2"): a
    # lookup of 3 tables (one fp16) in 3 fragments and its 5-fragment reply of all their rows;
    # an update of 2 tables and its ack; an ERROR naming one table of a 3-table lookup
    multi = [(3, 4, DType.FP32, 150), (7, 16, DType.FP16, 40), (9, 8, DType.FP32, 180)]
    m = s.msg_id()
    s.add_message("c3 lookup s2, 3 tables (3 frags)", c3, L, ("fwd", s2), msg_id=m, client_id=3, shard_id=2,
                  tables=multi)
    s.add_message("s2 reply c3, rows of 3 tables (7 frags)", s2, LR, ("fwd", c3), msg_id=m, client_id=3,
                  shard_id=2, tables=multi)
    two = [(1, 8, DType.FP32, 12), (4, 2, DType.FP16, 9)]
    m = s.msg_id()
    s.add_message("c2 update s0, 2 tables", c2, U, ("fwd", s0), msg_id=m, client_id=2, shard_id=0, tables=two)
    s.add_message("s0 ack c2, 2 tables", s0, UA, ("fwd", c2), msg_id=m, client_id=2, shard_id=0, tables=two)
    m = s.msg_id()
    s.add_message("c3 lookup s1, 3 tables", c3, L, ("fwd", s1), msg_id=m, client_id=3, shard_id=1,
                  tables=[(3, 4, DType.FP32, 2), (7, 16, DType.FP16, 1), (9, 8, DType.FP32, 3)])
    s.add_message("s1 ERROR c3 naming table 7", s1, E, ("fwd", c3), msg_id=m, client_id=3, shard_id=1,
                  tables=[(3, 4, DType.FP32, 2), (7, 16, DType.FP16, 1), (9, 8, DType.FP32, 3)],
                  status=Status.DIM_MISMATCH, error_table=7)
    m9 = s.msg_id()
    s.add_message("c3 lookup s1", c3, L, ("fwd", s1), msg_id=m9, client_id=3, shard_id=1, num_keys=5)
    s.add_message("s1 error c3", s1, E, ("fwd", c3), msg_id=m9, client_id=3, shard_id=1, num_keys=5,
                  status=Status.WRONG_SHARD)
    m10 = s.msg_id()
    s.add_message("c3 update fp16 s1", c3, U, ("fwd", s1), msg_id=m10, client_id=3, shard_id=1,
                  num_keys=7, dim=8, dtype=DType.FP16)
    s.add_message("s1 ack c3 (fp16)", s1, UA, ("fwd", c3), msg_id=m10, client_id=3, shard_id=1,
                  num_keys=7, dim=8, dtype=DType.FP16)
    # a request with UDP checksum 0 (none): forwarded, still 0
    f = Ether(s.message(c2, L, msg_id=s.msg_id(), client_id=2, shard_id=0, num_keys=2)[0])
    f[UDP].chksum = 0
    s.add("c2 lookup s0, UDP checksum 0", c2.port, bytes(f), ("fwd", s0), L)
    # Ethernet padding after the datagram is not sent on
    f = s.message(c1, L, msg_id=s.msg_id(), client_id=1, shard_id=1, num_keys=1)[0]
    s.add("c1 lookup s1 + 6 bytes Ethernet trailer", c1.port, f + b"\0" * 6, ("fwd", s1), L)
    # ARP for the card's address on each port; other ARP is ignored
    for p in s.ports.values():
        peer = c1 if p.port == 0 else c2 if p.port == 1 else s1
        arp = Ether(src=peer.mac, dst="ff:ff:ff:ff:ff:ff") / ARP(
            op=1, hwsrc=peer.mac, psrc=peer.ip, hwdst="00:00:00:00:00:00", pdst=p.ip)
        s.add(f"ARP who-has {p.ip} on port {p.port}", p.port, bytes(arp), ("arp",))
    arp = Ether(src=c1.mac, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=c1.mac, psrc=c1.ip, pdst="10.1.0.99")
    s.add("ARP who-has another address", 0, bytes(arp), ("drop", "arp_ignored"))
    arp = Ether(src=c1.mac, dst=CARD_MAC_IN) / ARP(op=2, hwsrc=c1.mac, psrc=c1.ip, pdst="10.1.0.1")
    s.add("ARP reply to the card", 0, bytes(arp), ("drop", "arp_ignored"))


def _lookup(s: Suite, src: Peer, **over) -> Ether:
    """A valid single-fragment lookup from ``src`` to shard 0 as a Scapy packet to break."""
    f = s.message(src, MsgType.LOOKUP_REQ, msg_id=s.msg_id(), client_id=src.id, shard_id=0,
                  num_keys=2)[0]
    pkt = Ether(f)
    for k, v in over.items():
        setattr(pkt[Embnic], k, v)
    return pkt


def add_malformed(s: Suite) -> None:
    """Frames that do not parse or do not add up, one per drop reason of the parser and
    validation (short, not IPv4/UDP, bad magic/version — a v1 frame too —, bad type, lengths and
    counts that do not fit the type, fragment geometry)."""
    c1 = s.clients[1]

    def drop(label: str, data: bytes, reason: str) -> None:
        s.add(label, c1.port, data, ("drop", reason))

    def raw_udp(payload: bytes) -> bytes:
        return bytes(s.l2l3(c1) / Raw(payload))

    good = bytes(_lookup(s, c1))
    drop("10-byte frame", good[:10], "too_short")
    drop("Ethernet + 10 bytes of IPv4", good[:24], "too_short")
    drop("UDP payload shorter than the header", raw_udp(good[42:42 + 20]), "too_short")
    drop("IPv6", bytes(Ether(src=c1.mac, dst=CARD_MAC_IN) / IPv6() / UDP(dport=PORT) / Raw(b"x" * 40)),
         "bad_ether")
    drop("ethertype 0x88b5", bytes(Ether(src=c1.mac, dst=CARD_MAC_IN, type=0x88B5) / Raw(b"y" * 60)),
         "bad_ether")
    p = Ether(good)
    p[IP].chksum = p[IP].chksum ^ 0x0101
    drop("IPv4 header checksum wrong", bytes(p), "bad_ip")
    b = bytearray(good)
    b[14] = 0x65  # version 6 in an IPv4 ethertype
    drop("IP version 6 in IPv4 ethertype", bytes(b), "bad_ip")
    p = Ether(good)
    p[IP].len = len(good) - 14 + 20
    del p[IP].chksum
    drop("IPv4 total length beyond the frame (truncated)", bytes(p), "truncated")
    cut = s.message(c1, MsgType.LOOKUP_REQ, msg_id=s.msg_id(), client_id=1, shard_id=0, num_keys=40)[0]
    drop("a 40-key lookup cut short: its last 100 bytes missing", cut[:-100], "truncated")
    p = Ether(good)
    p[IP].flags = "MF"
    del p[IP].chksum
    drop("IPv4 fragment (MF)", bytes(p), "bad_ip")
    p = Ether(good)
    p[IP].options = [b"\x01\x01\x01\x00"]  # NOPs + EOL: IHL 6
    del p[IP].chksum, p[IP].ihl, p[IP].len
    drop("IPv4 options", bytes(Ether(bytes(p))), "ip_options")
    drop("TCP to the card", bytes(Ether(src=c1.mac, dst=CARD_MAC_IN) / IP(src=c1.ip, dst="10.1.0.1")
                                  / TCP(sport=1, dport=PORT)), "not_udp")
    drop("ICMP echo to the card", bytes(Ether(src=c1.mac, dst=CARD_MAC_IN) / IP(src=c1.ip, dst="10.1.0.1")
                                        / ICMP()), "not_udp")
    p = Ether(good)
    p[UDP].len = p[UDP].len - 4
    drop("UDP length disagrees with IPv4", bytes(p), "bad_udp")
    p = Ether(good)
    p[UDP].dport = PORT + 1
    drop("UDP port 7879", bytes(p), "bad_port")
    p = Ether(good)
    p[IP].dst = "10.1.0.77"
    del p[IP].chksum, p[UDP].chksum
    drop("IPv4 destination not the card", bytes(p), "wrong_dst")
    drop("bad magic", bytes(_lookup(s, c1, magic=0x4D45)), "bad_magic")
    drop("version 3", bytes(_lookup(s, c1, version=3)), "bad_version")
    drop("version 1 in a v2 header", bytes(_lookup(s, c1, version=1)), "bad_version")
    drop("a v1 lookup (40-byte v1 header)", raw_udp(v1_frame_payload(msg_id=s.msg_id(), client_id=1)),
         "bad_version")
    drop("msg_type 0", bytes(_lookup(s, c1, msg_type=0)), "bad_type")
    drop("msg_type 9", bytes(_lookup(s, c1, msg_type=9)), "bad_type")
    drop("msg_type 255", bytes(_lookup(s, c1, msg_type=255)), "bad_type")
    drop("SIZE_REQ of 0 entries", s.message(c1, MsgType.SIZE_REQ, msg_id=s.msg_id(), client_id=1,
                                            shard_id=0, num_keys=0)[0], "bad_length")
    drop("frag_len != payload", bytes(_lookup(s, c1, frag_len=8)), "bad_length")
    drop("msg_len not 16*num_tables + 8*num_keys", bytes(_lookup(s, c1, num_keys=3)), "bad_length")
    drop("num_tables 2 for a directory of one", bytes(_lookup(s, c1, num_tables=2)), "bad_length")
    drop("frag_count 0", bytes(_lookup(s, c1, frag_count=0)), "bad_length")
    drop("frag_index >= frag_count", bytes(_lookup(s, c1, frag_index=1)), "bad_length")
    drop("frag_offset + frag_len > msg_len", bytes(_lookup(s, c1, frag_offset=8)), "bad_length")
    # msg_len by the type's formula but counts that do not fit the type (docs/protocol.md, "Validity")
    hdr = dict(msg_id=s.msg_id(), client_id=1, shard_id=0)
    drop("lookup with 0 keys and 0 tables", s.frame(c1, 0, msg_type=MsgType.LOOKUP_REQ, **hdr), "bad_length")
    drop("lookup of 2 keys and 0 tables", s.frame(c1, 16, msg_type=MsgType.LOOKUP_REQ, num_keys=2,
                                                  value_len=32, **hdr), "bad_length")
    drop("lookup of 2 tables and 1 key", s.frame(c1, 40, msg_type=MsgType.LOOKUP_REQ, num_tables=2,
                                                 num_keys=1, value_len=16, **hdr), "bad_length")
    drop("lookup announcing 3 reply bytes for 2 keys", s.frame(c1, 32, msg_type=MsgType.LOOKUP_REQ,
                                                               num_tables=1, num_keys=2, value_len=3, **hdr),
         "bad_length")
    drop("update without its gradients (msg_len 16T + 8n)",
         s.frame(c1, 32, msg_type=MsgType.UPDATE_REQ, num_tables=1, num_keys=2, value_len=16, **hdr),
         "bad_length")
    drop("SIZE_REQ naming a table (num_tables 1)", s.frame(c1, 32, msg_type=MsgType.SIZE_REQ, num_tables=1,
                                                           num_keys=2, **hdr), "bad_length")
    s0 = s.shards[0]
    s.add("lookup reply whose msg_len is not value_len", s0.port,
          s.frame(s0, 32, msg_type=MsgType.LOOKUP_REPLY, num_tables=1, num_keys=2, value_len=16, client_id=1,
                  msg_id=s.msg_id(), shard_id=0), ("drop", "bad_length"))
    s.add("UPDATE_ACK with a body", s0.port,
          s.frame(s0, 8, msg_type=MsgType.UPDATE_ACK, num_tables=1, num_keys=2, value_len=16, client_id=1,
                  msg_id=s.msg_id(), shard_id=0), ("drop", "bad_length"))
    # fragment geometry that contradicts frag_index (stateless)
    fr = s.message(c1, MsgType.LOOKUP_REQ, msg_id=s.msg_id(), client_id=1, shard_id=1, num_keys=400)
    p = Ether(fr[1])
    p[Embnic].frag_offset = P + 8
    drop("fragment 1 at the wrong offset", bytes(p), "frag_mismatch")
    p = Ether(fr[2])
    p[Embnic].frag_index = 1
    drop("last fragment with the wrong index", bytes(p), "frag_mismatch")
    # a fragment contradicting the message's first fragment (stateful, the state map): fragment 1
    # of a header that adds up alone (same msg_len 16 + 8*250 = 2016, same fragment count) but
    # announces another reply length, or another split into tables and keys
    mid = s.msg_id()
    fr = s.message(c1, MsgType.LOOKUP_REQ, msg_id=mid, client_id=1, shard_id=1, num_keys=250)
    s.add("250-key lookup fragment 0", c1.port, fr[0], ("fwd", s.shards[1]), MsgType.LOOKUP_REQ)
    p = Ether(fr[1])
    p[Embnic].value_len = 250 * 4 * 2
    drop("250-key lookup fragment 1 announcing fp16 rows (value_len)", bytes(p), "frag_mismatch")
    p = Ether(fr[1])
    p[Embnic].num_tables, p[Embnic].num_keys = 2, 248
    drop("250-key lookup fragment 1 as 2 tables and 248 keys", bytes(p), "frag_mismatch")


def add_reply_path(s: Suite) -> None:
    """The state map owns the reply path and tracks fragments (docs/protocol.md)."""
    c2, c3 = s.clients[2], s.clients[3]
    s0, s1, s2 = s.shards[0], s.shards[1], s.shards[2]
    L, LR, U, UA, E = (MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY, MsgType.UPDATE_REQ,
                       MsgType.UPDATE_ACK, MsgType.ERROR)
    s.add_message("s0 reply c2, never requested", s0, LR, ("drop", "unsolicited_reply"),
                  msg_id=s.msg_id(), client_id=2, shard_id=0, num_keys=2)
    m = s.msg_id()
    s.add_message("c2 lookup s0 (dup reply)", c2, L, ("fwd", s0), msg_id=m, client_id=2, shard_id=0,
                  num_keys=2)
    s.add_message("s0 reply c2 (dup reply)", s0, LR, ("fwd", c2), msg_id=m, client_id=2, shard_id=0,
                  num_keys=2)
    s.add_message("s0 reply c2 again, after the whole reply passed", s0, LR,
                  ("drop", "unsolicited_reply"), msg_id=m, client_id=2, shard_id=0, num_keys=2)
    # a retransmitted request after the entry was freed opens a new entry, answered again
    s.add_message("c2 lookup s0 retransmitted after its reply", c2, L, ("fwd", s0), msg_id=m,
                  client_id=2, shard_id=0, num_keys=2, flags=Flags.RETRANSMIT)
    s.add_message("s0 reply c2 to the retransmission", s0, LR, ("fwd", c2), msg_id=m, client_id=2,
                  shard_id=0, num_keys=2)
    m = s.msg_id()
    s.add_message("c2 lookup s1 (wrong shard replies)", c2, L, ("fwd", s1), msg_id=m, client_id=2,
                  shard_id=1, num_keys=3)
    s.add_message("s0 reply c2 to a request for s1", s0, LR, ("drop", "wrong_shard_reply"), msg_id=m,
                  client_id=2, shard_id=0, num_keys=3)
    m = s.msg_id()
    s.add_message("c2 lookup s0 (wrong reply type)", c2, L, ("fwd", s0), msg_id=m, client_id=2,
                  shard_id=0, num_keys=4)
    s.add_message("s0 UPDATE_ACK to a lookup", s0, UA, ("drop", "wrong_reply_type"), msg_id=m,
                  client_id=2, shard_id=0, num_keys=4)
    s.add_message("s0 LOOKUP_REPLY to that lookup", s0, LR, ("fwd", c2), msg_id=m, client_id=2,
                  shard_id=0, num_keys=4)
    m = s.msg_id()
    s.add_message("c3 update s2 (wrong reply type)", c3, U, ("fwd", s2), msg_id=m, client_id=3,
                  shard_id=2, num_keys=2, dim=2)
    s.add_message("s2 LOOKUP_REPLY to an update", s2, LR, ("drop", "wrong_reply_type"), msg_id=m,
                  client_id=3, shard_id=2, num_keys=2, dim=2)
    s.add_message("s2 ERROR to that update", s2, E, ("fwd", c3), msg_id=m, client_id=3, shard_id=2,
                  num_keys=2, dim=2, status=Status.INTERNAL)
    # size messages (fixed-length mode, docs/protocol.md "Size messages"): routed and answered
    # like any request and reply; a SIZE_REQ of 100 entries is 1600 bytes: 2 fragments
    SQ, SA = MsgType.SIZE_REQ, MsgType.SIZE_ACK
    m = s.msg_id()
    s.add_message("c2 SIZE_REQ s0 (2 frags)", c2, SQ, ("fwd", s0), msg_id=m, client_id=2, shard_id=0,
                  num_keys=100)
    s.add_message("s0 LOOKUP_REPLY to a SIZE_REQ", s0, LR, ("drop", "wrong_reply_type"), msg_id=m,
                  client_id=2, shard_id=0, num_keys=100)
    s.add_message("s0 SIZE_ACK c2", s0, SA, ("fwd", c2), msg_id=m, client_id=2, shard_id=0, num_keys=100)
    m = s.msg_id()
    s.add_message("c3 lookup s1 (SIZE_ACK to it)", c3, L, ("fwd", s1), msg_id=m, client_id=3,
                  shard_id=1, num_keys=2)
    s.add_message("s1 SIZE_ACK to a lookup", s1, SA, ("drop", "wrong_reply_type"), msg_id=m,
                  client_id=3, shard_id=1, num_keys=2)
    m = s.msg_id()
    s.add_message("c3 SIZE_REQ s2 (ERROR to it)", c3, SQ, ("fwd", s2), msg_id=m, client_id=3, shard_id=2,
                  num_keys=3)
    s.add_message("s2 ERROR to that SIZE_REQ", s2, E, ("fwd", c3), msg_id=m, client_id=3, shard_id=2,
                  num_keys=3, tables=[], status=Status.MALFORMED)
    s.add_message("s2 SIZE_ACK c3, never asked", s2, SA, ("drop", "unsolicited_reply"),
                  msg_id=s.msg_id(), client_id=3, shard_id=2, num_keys=1)
    # a lookup's reply is as long as its request announced (value_len, docs/protocol.md "The
    # card's state map"): rows of another length are dropped and the entry waits for the right
    # ones; only a LOOKUP_REPLY's length is checked (an ack or error carries no rows)
    m = s.msg_id()
    s.add_message("c2 lookup s0, 5 keys of dim 4 (reply of another length)", c2, L, ("fwd", s0), msg_id=m,
                  client_id=2, shard_id=0, num_keys=5)
    s.add_message("s0 reply c2 with rows of dim 8", s0, LR, ("drop", "bad_reply_len"), msg_id=m, client_id=2,
                  shard_id=0, num_keys=5, dim=8)
    s.add_message("s0 reply c2 with fp16 rows", s0, LR, ("drop", "bad_reply_len"), msg_id=m, client_id=2,
                  shard_id=0, num_keys=5, dtype=DType.FP16)
    s.add_message("s0 reply c2 with the announced rows", s0, LR, ("fwd", c2), msg_id=m, client_id=2,
                  shard_id=0, num_keys=5)
    multi = [(3, 4, DType.FP32, 150), (7, 16, DType.FP16, 40), (9, 8, DType.FP32, 180)]
    m = s.msg_id()
    s.add_message("c3 lookup s2, 3 tables (reply without a table)", c3, L, ("fwd", s2), msg_id=m,
                  client_id=3, shard_id=2, tables=multi)
    s.add_message("s2 reply c3 with the rows of 2 of its 3 tables (first fragment)", s2, LR,
                  ("drop", "bad_reply_len"), msg_id=m, client_id=3, shard_id=2, tables=multi[:2], only=[0])
    s.add_message("s2 ERROR c3 naming table 9 of the 3", s2, E, ("fwd", c3), msg_id=m, client_id=3, shard_id=2,
                  tables=multi, status=Status.KEY_OUT_OF_RANGE, error_table=9)
    m = s.msg_id()
    s.add_message("c3 update s1 (ack copying another value_len)", c3, U, ("fwd", s1), msg_id=m, client_id=3,
                  shard_id=1, num_keys=3, dim=2)
    s.add_message("s1 ack c3 copying another value_len", s1, UA, ("fwd", c3), msg_id=m, client_id=3,
                  shard_id=1, num_keys=3, dim=5)
    # a lost update is polled and completed fragment by fragment (docs/protocol.md, "Reliability"):
    # the poll (its last fragment again) passes, the UPDATE_NACK answers the update and frees its
    # entry, the fragment it asks for opens a new one, whose ack passes; a NACK answers no lookup
    NK = MsgType.UPDATE_NACK
    m = s.msg_id()
    upd = dict(msg_id=m, client_id=2, shard_id=0, num_keys=100, dim=8)  # 3 fragments
    s.add_message("c2 update s0, fragment 1 lost", c2, U, ("fwd", s0), only=[0, 2], **upd)
    s.add_message("c2 polls: its last fragment again", c2, U, ("fwd", s0), only=[2], flags=Flags.RETRANSMIT, **upd)
    s.add_message("s0 UPDATE_NACK c2 (fragments 0 and 2 held)", s0, NK, ("fwd", c2), **upd)
    s.add_message("s0 UPDATE_NACK c2 again, after it passed", s0, NK, ("drop", "unsolicited_reply"), **upd)
    s.add_message("c2 re-sends fragment 1 only", c2, U, ("fwd", s0), only=[1], flags=Flags.RETRANSMIT, **upd)
    s.add_message("s0 UPDATE_ACK c2", s0, UA, ("fwd", c2), **upd)
    m = s.msg_id()
    s.add_message("c3 lookup s1 (UPDATE_NACK to it)", c3, L, ("fwd", s1), msg_id=m, client_id=3, shard_id=1,
                  num_keys=2)
    s.add_message("s1 UPDATE_NACK to a lookup", s1, NK, ("drop", "wrong_reply_type"), msg_id=m, client_id=3,
                  shard_id=1, num_keys=2)
    # fragments are tracked, not counted: 0 twice and 2 never -> receiving, duplicates passed on
    m = s.msg_id()
    s.add_message("c2 lookup s0, fragment 0 twice, 2 missing", c2, L, ("fwd", s0), msg_id=m,
                  client_id=2, shard_id=0, num_keys=400, only=[0, 0, 1])
    # every fragment, one twice, out of order -> forwarded (unanswered)
    m = s.msg_id()
    s.add_message("c3 lookup s1, fragments 2 1 1 0", c3, L, ("fwd", s1), msg_id=m, client_id=3,
                  shard_id=1, num_keys=400, only=[2, 1, 1, 0])
    # a 3-fragment reply with a fragment duplicated: passes only when all 3 passed
    m = s.msg_id()
    s.add_message("c3 lookup s2 (partial reply)", c3, L, ("fwd", s2), msg_id=m, client_id=3,
                  shard_id=2, num_keys=200, dim=4)
    s.add_message("s2 reply c3, fragments 0 0 1 (of 3)", s2, LR, ("fwd", c3), msg_id=m, client_id=3,
                  shard_id=2, num_keys=200, dim=4, only=[0, 0, 1])
    # more than 256 fragments (docs/protocol.md, "Fragmentation"): stateless, any type
    n = (256 * P - consts.DIR_ENTRY) // 8 + 1  # 45695 keys: 16 + 365560 bytes, 257 fragments of 1428
    s.add_message("lookup of 257 fragments (first fragment)", s.clients[1], L,
                  ("drop", "too_many_frags"), msg_id=s.msg_id(), client_id=1, shard_id=0,
                  num_keys=n, only=[0])
    n = (256 * P) // 8 + 1  # 45697 rows of 8 bytes: 365576 bytes, 257 fragments of 1428
    s.add_message("reply of 257 fragments (last fragment)", s0, LR, ("drop", "too_many_frags"),
                  msg_id=s.msg_id(), client_id=2, shard_id=0, num_keys=n, dim=2, only=[256])
    add_answered_early(s)


def add_answered_early(s: Suite) -> None:
    """A shard refusing a request of several fragments at its fragment 0 answers before the rest
    came (docs/protocol.md, "The card's state map"): the ERROR passes and completes the message,
    and the entry stays, answered, until the request's other fragments have passed — they open no
    entry nobody would answer — then it is freed. For anything else an answered entry is as if
    freed: another reply is ``unsolicited_reply``, a fragment already seen opens it anew."""
    c3, s2 = s.clients[3], s.shards[2]
    L, E = MsgType.LOOKUP_REQ, MsgType.ERROR
    req = dict(msg_id=s.msg_id(), client_id=3, shard_id=2, num_keys=400)  # 3 fragments
    s.add_message("c3 lookup s2 (refused at fragment 0), fragment 0", c3, L, ("fwd", s2), only=[0], **req)
    s.add_message("s2 ERROR c3 after fragment 0", s2, E, ("fwd", c3), status=Status.MALFORMED, **req)
    s.add_message("s2 ERROR c3 again, the entry answered", s2, E, ("drop", "unsolicited_reply"),
                  status=Status.MALFORMED, **req)
    s.add_message("c3 lookup s2 (refused at fragment 0), fragments 1 2", c3, L, ("fwd", s2), only=[1, 2], **req)
    s.add_message("s2 ERROR c3 after the whole request passed", s2, E, ("drop", "unsolicited_reply"),
                  status=Status.MALFORMED, **req)
    # answered, then fragment 0 again (the client re-sends): a new message with the same ids
    req = dict(msg_id=s.msg_id(), client_id=3, shard_id=2, num_keys=400)
    s.add_message("c3 lookup s2 (refused, re-sent), fragment 0", c3, L, ("fwd", s2), only=[0], **req)
    s.add_message("s2 ERROR c3 after fragment 0 (re-sent case)", s2, E, ("fwd", c3), status=Status.MALFORMED, **req)
    s.add_message("c3 re-sends the whole lookup", c3, L, ("fwd", s2), flags=Flags.RETRANSMIT, **req)
    s.add_message("s2 ERROR c3 to the re-sent lookup", s2, E, ("fwd", c3), status=Status.MALFORMED, **req)


def add_frag_geometry(s: Suite) -> None:
    """Fragments each valid alone but cut at another fragment size than the message's first-seen
    fragment (docs/protocol.md, "Fragmentation": ``frag_offset = i*P``, P fixed per message):
    dropped as ``frag_mismatch``, requests and replies alike, so an entry never counts more body
    bytes than ``msg_len`` and is ``forwarded`` only with exactly ``msg_len``; the fragments cut
    at the message's size still pass."""
    c1, c3 = s.clients[1], s.clients[3]
    s1, s2 = s.shards[1], s.shards[2]
    L, LR = MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY

    def frags(label, src, msg_type, fate, only, **kw):
        for i, f in zip(only, s.message(src, msg_type, only=only, **kw)):
            s.add(f"{label}[{i}]", src.port, f, fate, msg_type)

    # 400 keys = 16 + 3200 bytes: 3 fragments at P = 1428; cut at 1200 (also 3) they overlap those
    m = s.msg_id()
    kw = dict(msg_id=m, client_id=1, shard_id=1, num_keys=400)
    frags("c1 lookup s1 (overlap), P 1428", c1, L, ("fwd", s1), [0], **kw)
    frags("c1 lookup s1 (overlap), cut at 1200", c1, L, ("drop", "frag_mismatch"), [1, 2],
          frag_size=1200, **kw)
    frags("c1 lookup s1 (overlap), P 1428", c1, L, ("fwd", s1), [1, 2], **kw)
    # the first fragment seen cut at 1100 fixes P = 1100: at 1428 fragments 1, 2 leave a gap
    m = s.msg_id()
    kw = dict(msg_id=m, client_id=1, shard_id=1, num_keys=400)
    frags("c1 lookup s1 (gap), P 1100", c1, L, ("fwd", s1), [0], frag_size=1100, **kw)
    frags("c1 lookup s1 (gap), cut at 1428", c1, L, ("drop", "frag_mismatch"), [1, 2], **kw)
    frags("c1 lookup s1 (gap), P 1100", c1, L, ("fwd", s1), [2, 1], frag_size=1100, **kw)
    # the last fragment first fixes P too: 360 bytes at offset 2856 mean P = 1428
    m = s.msg_id()
    kw = dict(msg_id=m, client_id=1, shard_id=1, num_keys=400)
    frags("c1 lookup s1 (last first), P 1428", c1, L, ("fwd", s1), [2], **kw)
    frags("c1 lookup s1 (last first), cut at 1500", c1, L, ("drop", "frag_mismatch"), [0, 1],
          frag_size=1500, **kw)
    frags("c1 lookup s1 (last first), P 1428", c1, L, ("fwd", s1), [0], **kw)
    # a reply cut the same way: its first fragment fixes the reply's P; the others at 1200 are
    # dropped and do not complete it, so the real ones that follow pass and free the entry
    m = s.msg_id()
    kw = dict(msg_id=m, client_id=3, shard_id=2, num_keys=200, dim=4)  # reply: 3200 bytes
    s.add_message("c3 lookup s2 (reply cut at 1200)", c3, L, ("fwd", s2), **kw)
    frags("s2 reply c3, P 1428", s2, LR, ("fwd", c3), [0], **kw)
    frags("s2 reply c3, cut at 1200", s2, LR, ("drop", "frag_mismatch"), [1, 2], frag_size=1200,
          **kw)
    frags("s2 reply c3, P 1428", s2, LR, ("fwd", c3), [1, 2], **kw)


def add_unauthorised(s: Suite) -> None:
    """Senders the allowlist does not know, shards without a route, replies to unknown clients."""
    c1, c2 = s.clients[1], s.clients[2]
    s0 = s.shards[0]
    L, LR = MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY
    s.add_message("request from unregistered client 7", c1, L, ("drop", "unknown_client"),
                  msg_id=s.msg_id(), client_id=7, shard_id=0, num_keys=1)
    spoof = dataclasses.replace(c2, port=0, ip="10.1.0.66")
    s.add_message("client 2's id from another address", spoof, L, ("drop", "unknown_client"),
                  msg_id=s.msg_id(), client_id=2, shard_id=0, num_keys=1)
    wrong_port = dataclasses.replace(c1, udp_port=40999)
    s.add_message("client 1 from another UDP port", wrong_port, L, ("drop", "unknown_client"),
                  msg_id=s.msg_id(), client_id=1, shard_id=0, num_keys=1)
    s.add_message("request for shard 9 (no route)", c1, L, ("drop", "unknown_shard"),
                  msg_id=s.msg_id(), client_id=1, shard_id=9, num_keys=1)
    s.add_message("reply from a client's address", c2, LR, ("drop", "unknown_server"),
                  msg_id=s.msg_id(), client_id=1, shard_id=0, num_keys=1)
    s.add_message("reply claiming shard 9", s0, LR, ("drop", "unknown_server"),
                  msg_id=s.msg_id(), client_id=1, shard_id=9, num_keys=1)
    s.add_message("reply from shard 0 claiming shard 1", s0, LR, ("drop", "unknown_server"),
                  msg_id=s.msg_id(), client_id=1, shard_id=1, num_keys=1)
    s.add_message("reply to unregistered client 7", s0, LR, ("drop", "unknown_client"),
                  msg_id=s.msg_id(), client_id=7, shard_id=0, num_keys=1)
    add_wrong_port(s)


def add_wrong_port(s: Suite) -> None:
    """A registered sender's IPv4 address and UDP port from another card port than its entry
    names, or from its port with another MAC: a spoof from another link, dropped as ``wrong_port``
    (docs/control-socket.md, "Sender checks") before the state map sees it, so whether the message
    it names is open does not matter (frames of different ports may interleave)."""
    c1, c2, c3 = s.clients[1], s.clients[2], s.clients[3]
    s0, s1 = s.shards[0], s.shards[1]
    L, U, UA = MsgType.LOOKUP_REQ, MsgType.UPDATE_REQ, MsgType.UPDATE_ACK
    # requests: client 1 (port 0) from port 2; client 2 from its port 1 with another MAC
    s.add_message("client 1's address from port 2", dataclasses.replace(c1, port=2), L, ("drop", "wrong_port"),
                  msg_id=s.msg_id(), client_id=1, shard_id=1, num_keys=1)
    s.add_message("client 2's address from port 1, another MAC", dataclasses.replace(c2, mac="02:00:00:00:09:09"),
                  L, ("drop", "wrong_port"), msg_id=s.msg_id(), client_id=2, shard_id=0, num_keys=1)
    # replies: an update of client 3 to shard 1 (port 2) acknowledged by a spoof of shard 1's
    # address from port 1 (client 2's link) and from port 0; then by shard 1's address on port 2
    # with another MAC; then by shard 1 itself, which completes it
    m = s.msg_id()
    upd = dict(msg_id=m, client_id=3, shard_id=1, num_keys=4, dim=2)
    s.add_message("c3 update s1 (spoofed acks)", c3, U, ("fwd", s1), **upd)
    s.add_message("shard 1's address acks it from port 1", dataclasses.replace(s1, port=1), UA,
                  ("drop", "wrong_port"), **upd)
    s.add_message("shard 1's address acks it from port 0", dataclasses.replace(s1, port=0), UA,
                  ("drop", "wrong_port"), **upd)
    s.add_message("shard 1's address acks it from port 2, another MAC", dataclasses.replace(s1, mac="02:00:00:00:09:0a"),
                  UA, ("drop", "wrong_port"), **upd)
    s.add_message("s1 ack c3 (after the spoofs)", s1, UA, ("fwd", c3), **upd)
    # the port is checked after the address: shard 0's address from port 0 with shard 9's id has no route
    s.add_message("shard 0's address from port 0 claiming shard 9", dataclasses.replace(s0, port=0),
                  MsgType.LOOKUP_REPLY, ("drop", "unknown_server"), msg_id=s.msg_id(), client_id=1, shard_id=9,
                  num_keys=1)
