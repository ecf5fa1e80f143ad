"""Conformance cases for an embnic card, target-independent (DPDK pcap vdevs today, P4/BMv2 next).

One :class:`Suite` holds a 3-port card, its route and client tables, the input frames per
ingress port (built with the Scapy layer :class:`embnic.client_lib.protocol.Embnic`) and, for
each input, what must happen to it: forwarded (rewritten, on which port), answered (ARP), or
dropped (with which drop reason of docs/control-socket.md). :meth:`Suite.expected_outputs`
computes the exact bytes every output port must carry, given the card's port MACs (which a
target may choose itself), so any target can be checked with the same cases::

    from conformance import Suite
    s = Suite.default()
    inputs = s.write_input_pcaps(Path("in"))          # {port: path}, one pcap per ingress port
    # ... run the card with routes s.route_cmds() and clients s.client_cmds() ...
    want = s.expected_outputs({0: mac0, 1: mac1, 2: mac2})   # {port: [frame bytes, ...]}
    s.expected_drops()                                 # {"bad_magic": 1, ...}

Wiring (card port: the card's address; who hangs off it)::

    port 0  10.1.0.1  client 1  10.1.0.2:40001
    port 1  10.1.1.1  client 2  10.1.1.2:40002,  shard 0  10.1.1.10:7878
    port 2  10.1.2.1  shard 1   10.1.2.11:7878,  shard 2  10.1.2.12:7979,  client 3  10.1.2.3:40003

Frames on one ingress port keep their order through the card; frames from different ports may
interleave (net_pcap gives no order across ports), so compare each output port as a multiset and
check order per ingress port (:func:`check_outputs`). Where order matters — a reply must follow
its request through the state map (docs/protocol.md, "The card's state map") — the request and
the reply enter on one card port: client 2 with shard 0 on port 1, client 3 with shards 1 and 2
on port 2. Client 1's requests are never answered. :class:`StateModel` is the reference state
map that the expected final state (:meth:`Suite.expected_state`) and completions
(:meth:`Suite.expected_completed`) come from.

Run as a script to write the pcaps and an ``expected.json`` for another target:
``python3 tests/dataplane/conformance.py OUT_DIR``.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import struct
import sys
from pathlib import Path

from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from embnic.client_lib import consts
from embnic.client_lib.consts import DType, Flags, MsgType, Status
from embnic.client_lib.protocol import Embnic
from embnic.control.pcap import write_pcap  # noqa: F401 - the one pcap writer (tests import it from here)

PORT = consts.UDP_PORT
CARD_TTL = 64  #: TTL of every frame the card sends
#: a MAC that stands for "the card port's MAC" in input frames (the card does not check it)
CARD_MAC_IN = "02:cc:00:00:00:00"
P = consts.max_body_per_frame(consts.DEFAULT_MTU)  #: 1432 body bytes per fragment


@dataclasses.dataclass(frozen=True)
class CardPort:
    port: int
    ip: str


@dataclasses.dataclass(frozen=True)
class Peer:
    """A client or shard: id, card port it hangs off, MAC, IPv4, UDP port."""

    kind: str  # "client" | "shard"
    id: int
    port: int
    mac: str
    ip: str
    udp_port: int

    def cmd(self) -> dict:
        """The control-socket request that registers it (route_add / client_add)."""
        key = "shard" if self.kind == "shard" else "client"
        return {"cmd": f"{'route' if key == 'shard' else 'client'}_add", key: self.id, "port": self.port,
                "mac": self.mac, "ip": self.ip, "udp_port": self.udp_port}


@dataclasses.dataclass
class InFrame:
    """One input frame and its fate.

    ``fate`` is ``("fwd", peer)`` (rewritten towards ``peer``), ``("arp",)`` (answered on the
    ingress port) or ``("drop", reason)``.
    """

    label: str
    port: int
    data: bytes
    fate: tuple
    msg_type: int | None = None


def _body(n: int, seed: int) -> bytes:
    """``n`` deterministic body bytes (so a rewrite that touches the body shows)."""
    return bytes((seed * 131 + i * 7 + (i >> 8)) & 0xFF for i in range(n))


class Suite:
    """The cases; build with :meth:`default`."""

    def __init__(self, ports: list[CardPort], clients: list[Peer], shards: list[Peer]):
        self.ports = {p.port: p for p in ports}
        self.clients = {c.id: c for c in clients}
        self.shards = {s.id: s for s in shards}
        self.frames: list[InFrame] = []
        self._next_id = 1000

    # ------------------------------------------------------------------ building
    @classmethod
    def default(cls) -> "Suite":
        """The standard suite: 2 clients, 3 shards, every forwarding and drop case."""
        s = cls(
            [CardPort(0, "10.1.0.1"), CardPort(1, "10.1.1.1"), CardPort(2, "10.1.2.1")],
            [Peer("client", 1, 0, "02:00:00:00:01:01", "10.1.0.2", 40001),
             Peer("client", 2, 1, "02:00:00:00:01:02", "10.1.1.2", 40002),
             Peer("client", 3, 2, "02:00:00:00:01:03", "10.1.2.3", 40003)],
            [Peer("shard", 0, 1, "02:00:00:00:02:00", "10.1.1.10", PORT),
             Peer("shard", 1, 2, "02:00:00:00:02:01", "10.1.2.11", PORT),
             Peer("shard", 2, 2, "02:00:00:00:02:02", "10.1.2.12", 7979)],
        )
        s._add_valid()
        s._add_malformed()
        s._add_unauthorised()
        s._add_reply_path()
        return s

    def msg_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _l2l3(self, src: Peer, *, dst_ip: str | None = None, sport: int | None = None):
        card = self.ports[src.port]
        return (Ether(src=src.mac, dst=CARD_MAC_IN)
                / IP(src=src.ip, dst=dst_ip or card.ip, flags="DF", id=0x1234, ttl=17)
                / UDP(sport=src.udp_port if sport is None else sport, dport=PORT))

    def message(self, src: Peer, msg_type: int, *, msg_id: int, client_id: int, shard_id: int,
                num_keys: int, dim: int = 4, dtype: int = DType.FP32, table_id: int = 3,
                flags: int = 0, status: int = 0, seed: int = 0, only: list[int] | None = None) -> list[bytes]:
        """Frames of one message from ``src``, fragmented at MTU 1500 (docs/protocol.md).

        ``only``: the fragment indexes to return, in that order (repeats allowed), instead of all.
        """
        msg_len = consts.expected_msg_len(msg_type, num_keys, dim, dtype)
        body = _body(msg_len, seed or msg_id)
        count = max(1, -(-msg_len // P))
        out = []
        for i in range(count):
            chunk = body[i * P:(i + 1) * P]
            hdr = Embnic(msg_type=msg_type, flags=flags, dtype=dtype, status=status, msg_id=msg_id,
                         client_id=client_id, table_id=table_id, shard_id=shard_id, dim=dim,
                         num_keys=num_keys, msg_len=msg_len, frag_offset=i * P, frag_index=i,
                         frag_count=count, frag_len=len(chunk))
            out.append(bytes(self._l2l3(src) / hdr / Raw(chunk)))
        return out if only is None else [out[i] for i in only]

    def add(self, label: str, port: int, data: bytes, fate: tuple, msg_type: int | None = None) -> None:
        self.frames.append(InFrame(label, port, bytes(data), fate, msg_type))

    def add_message(self, label: str, src: Peer, msg_type: int, fate: tuple, **kw) -> None:
        for i, f in enumerate(self.message(src, msg_type, **kw)):
            self.add(f"{label}[{i}]", src.port, f, fate, msg_type)

    def _add_valid(self) -> None:
        c1, c2 = self.clients[1], self.clients[2]
        s0, s1, s2 = self.shards[0], self.shards[1], self.shards[2]
        L, LR, U, UA, E = (MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY, MsgType.UPDATE_REQ,
                           MsgType.UPDATE_ACK, MsgType.ERROR)
        # requests from 2 clients to 3 shards
        m1 = self.msg_id()
        self.add_message("c1 lookup s0", c1, L, ("fwd", s0), msg_id=m1, client_id=1, shard_id=0, num_keys=3)
        m2 = self.msg_id()
        self.add_message("c2 lookup s1", c2, L, ("fwd", s1), msg_id=m2, client_id=2, shard_id=1, num_keys=5)
        m3 = self.msg_id()  # 400 keys = 3200 bytes: 3 fragments
        self.add_message("c1 lookup s2 (3 frags)", c1, L, ("fwd", s2), msg_id=m3, client_id=1, shard_id=2,
                         num_keys=400)
        m4 = self.msg_id()  # 30 keys x (8 + 16*4) = 2160 bytes: 2 fragments
        self.add_message("c2 update s2 (2 frags)", c2, U, ("fwd", s2), msg_id=m4, client_id=2, shard_id=2,
                         num_keys=30, dim=16)
        m5 = self.msg_id()
        self.add_message("c1 update fp16 s0", c1, U, ("fwd", s0), msg_id=m5, client_id=1, shard_id=0,
                         num_keys=7, dim=8, dtype=DType.FP16)
        self.add_message("c1 lookup s0 retransmit", c1, L, ("fwd", s0), msg_id=m1, client_id=1, shard_id=0,
                         num_keys=3, flags=Flags.RETRANSMIT)
        # replies from registered servers, each on the ingress port of its request
        c3 = self.clients[3]
        m6 = self.msg_id()
        self.add_message("c2 lookup s0", c2, L, ("fwd", s0), msg_id=m6, client_id=2, shard_id=0, num_keys=3)
        self.add_message("s0 reply c2", s0, LR, ("fwd", c2), msg_id=m6, client_id=2, shard_id=0, num_keys=3)
        m7 = self.msg_id()
        self.add_message("c3 lookup s2 (3 frags)", c3, L, ("fwd", s2), msg_id=m7, client_id=3, shard_id=2,
                         num_keys=400)
        self.add_message("s2 reply c3 (5 frags)", s2, LR, ("fwd", c3), msg_id=m7, client_id=3, shard_id=2,
                         num_keys=400)
        m8 = self.msg_id()
        self.add_message("c2 update s0 (2 frags)", c2, U, ("fwd", s0), msg_id=m8, client_id=2, shard_id=0,
                         num_keys=30, dim=16)
        self.add_message("s0 ack c2", s0, UA, ("fwd", c2), msg_id=m8, client_id=2, shard_id=0, num_keys=30,
                         dim=16)
        m9 = self.msg_id()
        self.add_message("c3 lookup s1", c3, L, ("fwd", s1), msg_id=m9, client_id=3, shard_id=1, num_keys=5)
        self.add_message("s1 error c3", s1, E, ("fwd", c3), msg_id=m9, client_id=3, shard_id=1, num_keys=5,
                         status=Status.WRONG_SHARD)
        m10 = self.msg_id()
        self.add_message("c3 update fp16 s1", c3, U, ("fwd", s1), msg_id=m10, client_id=3, shard_id=1,
                         num_keys=7, dim=8, dtype=DType.FP16)
        self.add_message("s1 ack c3 (fp16)", s1, UA, ("fwd", c3), msg_id=m10, client_id=3, shard_id=1,
                         num_keys=7, dim=8, dtype=DType.FP16)
        # a request with UDP checksum 0 (none): forwarded, still 0
        f = Ether(self.message(c2, L, msg_id=self.msg_id(), client_id=2, shard_id=0, num_keys=2)[0])
        f[UDP].chksum = 0
        self.add("c2 lookup s0, UDP checksum 0", c2.port, bytes(f), ("fwd", s0), L)
        # Ethernet padding after the datagram is not sent on
        f = self.message(c1, L, msg_id=self.msg_id(), client_id=1, shard_id=1, num_keys=1)[0]
        self.add("c1 lookup s1 + 6 bytes Ethernet trailer", c1.port, f + b"\0" * 6, ("fwd", s1), L)
        # ARP for the card's address on each port; other ARP is ignored
        for p in self.ports.values():
            peer = c1 if p.port == 0 else c2 if p.port == 1 else s1
            arp = Ether(src=peer.mac, dst="ff:ff:ff:ff:ff:ff") / ARP(
                op=1, hwsrc=peer.mac, psrc=peer.ip, hwdst="00:00:00:00:00:00", pdst=p.ip)
            self.add(f"ARP who-has {p.ip} on port {p.port}", p.port, bytes(arp), ("arp",))
        arp = Ether(src=c1.mac, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=c1.mac, psrc=c1.ip, pdst="10.1.0.99")
        self.add("ARP who-has another address", 0, bytes(arp), ("drop", "arp_ignored"))
        arp = Ether(src=c1.mac, dst=CARD_MAC_IN) / ARP(op=2, hwsrc=c1.mac, psrc=c1.ip, pdst="10.1.0.1")
        self.add("ARP reply to the card", 0, bytes(arp), ("drop", "arp_ignored"))

    def _lookup(self, src: Peer, **over) -> Ether:
        """A valid single-fragment lookup from ``src`` to shard 0 as a Scapy packet to break."""
        f = self.message(src, MsgType.LOOKUP_REQ, msg_id=self.msg_id(), client_id=src.id, shard_id=0,
                         num_keys=2)[0]
        pkt = Ether(f)
        for k, v in over.items():
            setattr(pkt[Embnic], k, v)
        return pkt

    def _add_malformed(self) -> None:
        c1 = self.clients[1]

        def drop(label: str, data: bytes, reason: str) -> None:
            self.add(label, c1.port, data, ("drop", reason))

        def raw_udp(payload: bytes) -> bytes:
            return bytes(self._l2l3(c1) / Raw(payload))

        good = bytes(self._lookup(c1))
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
        cut = self.message(c1, MsgType.LOOKUP_REQ, msg_id=self.msg_id(), client_id=1, shard_id=0, num_keys=40)[0]
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
        drop("bad magic", bytes(self._lookup(c1, magic=0x4D45)), "bad_magic")
        drop("version 2", bytes(self._lookup(c1, version=2)), "bad_version")
        drop("msg_type 0", bytes(self._lookup(c1, msg_type=0)), "bad_type")
        drop("msg_type 9", bytes(self._lookup(c1, msg_type=9)), "bad_type")
        drop("msg_type 8 (after SIZE_ACK)", bytes(self._lookup(c1, msg_type=8)), "bad_type")
        drop("SIZE_REQ of 0 entries", self.message(c1, MsgType.SIZE_REQ, msg_id=self.msg_id(), client_id=1,
                                                   shard_id=0, num_keys=0, dim=0, dtype=DType.NONE,
                                                   table_id=0)[0], "bad_length")
        drop("dtype 3", bytes(self._lookup(c1, dtype=3)), "bad_dtype")
        u = Ether(self.message(c1, MsgType.UPDATE_REQ, msg_id=self.msg_id(), client_id=1, shard_id=0,
                               num_keys=1, dim=2)[0])
        u[Embnic].dtype = 0
        drop("update with dtype none", bytes(u), "bad_dtype")
        drop("frag_len != payload", bytes(self._lookup(c1, frag_len=8)), "bad_length")
        drop("msg_len not 8*num_keys", bytes(self._lookup(c1, num_keys=3)), "bad_length")
        drop("frag_count 0", bytes(self._lookup(c1, frag_count=0)), "bad_length")
        drop("frag_index >= frag_count", bytes(self._lookup(c1, frag_index=1)), "bad_length")
        drop("frag_offset + frag_len > msg_len", bytes(self._lookup(c1, frag_offset=8)), "bad_length")
        drop("lookup with 0 keys", self._zero_key_lookup(c1), "bad_length")
        # fragment geometry that contradicts frag_index (stateless)
        fr = self.message(c1, MsgType.LOOKUP_REQ, msg_id=self.msg_id(), client_id=1, shard_id=1, num_keys=400)
        p = Ether(fr[1])
        p[Embnic].frag_offset = P + 8
        drop("fragment 1 at the wrong offset", bytes(p), "frag_mismatch")
        p = Ether(fr[2])
        p[Embnic].frag_index = 1
        drop("last fragment with the wrong index", bytes(p), "frag_mismatch")
        # a fragment contradicting the message's first fragment (stateful, the state map)
        mid = self.msg_id()
        fr = self.message(c1, MsgType.LOOKUP_REQ, msg_id=mid, client_id=1, shard_id=1, num_keys=250)
        self.add("250-key lookup fragment 0", c1.port, fr[0], ("fwd", self.shards[1]), MsgType.LOOKUP_REQ)
        p = Ether(fr[1])
        p[Embnic].table_id = 4
        drop("250-key lookup fragment 1 with another table", bytes(p), "frag_mismatch")

    def _add_reply_path(self) -> None:
        """The state map owns the reply path and tracks fragments (docs/protocol.md)."""
        c2, c3 = self.clients[2], self.clients[3]
        s0, s1, s2 = self.shards[0], self.shards[1], self.shards[2]
        L, LR, U, UA, E = (MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY, MsgType.UPDATE_REQ,
                           MsgType.UPDATE_ACK, MsgType.ERROR)
        self.add_message("s0 reply c2, never requested", s0, LR, ("drop", "unsolicited_reply"),
                         msg_id=self.msg_id(), client_id=2, shard_id=0, num_keys=2)
        m = self.msg_id()
        self.add_message("c2 lookup s0 (dup reply)", c2, L, ("fwd", s0), msg_id=m, client_id=2, shard_id=0,
                         num_keys=2)
        self.add_message("s0 reply c2 (dup reply)", s0, LR, ("fwd", c2), msg_id=m, client_id=2, shard_id=0,
                         num_keys=2)
        self.add_message("s0 reply c2 again, after the whole reply passed", s0, LR,
                         ("drop", "unsolicited_reply"), msg_id=m, client_id=2, shard_id=0, num_keys=2)
        # a retransmitted request after the entry was freed opens a new entry, answered again
        self.add_message("c2 lookup s0 retransmitted after its reply", c2, L, ("fwd", s0), msg_id=m,
                         client_id=2, shard_id=0, num_keys=2, flags=Flags.RETRANSMIT)
        self.add_message("s0 reply c2 to the retransmission", s0, LR, ("fwd", c2), msg_id=m, client_id=2,
                         shard_id=0, num_keys=2)
        m = self.msg_id()
        self.add_message("c2 lookup s1 (wrong shard replies)", c2, L, ("fwd", s1), msg_id=m, client_id=2,
                         shard_id=1, num_keys=3)
        self.add_message("s0 reply c2 to a request for s1", s0, LR, ("drop", "wrong_shard_reply"), msg_id=m,
                         client_id=2, shard_id=0, num_keys=3)
        m = self.msg_id()
        self.add_message("c2 lookup s0 (wrong reply type)", c2, L, ("fwd", s0), msg_id=m, client_id=2,
                         shard_id=0, num_keys=4)
        self.add_message("s0 UPDATE_ACK to a lookup", s0, UA, ("drop", "wrong_reply_type"), msg_id=m,
                         client_id=2, shard_id=0, num_keys=4)
        self.add_message("s0 LOOKUP_REPLY to that lookup", s0, LR, ("fwd", c2), msg_id=m, client_id=2,
                         shard_id=0, num_keys=4)
        m = self.msg_id()
        self.add_message("c3 update s2 (wrong reply type)", c3, U, ("fwd", s2), msg_id=m, client_id=3,
                         shard_id=2, num_keys=2, dim=2)
        self.add_message("s2 LOOKUP_REPLY to an update", s2, LR, ("drop", "wrong_reply_type"), msg_id=m,
                         client_id=3, shard_id=2, num_keys=2, dim=2)
        self.add_message("s2 ERROR to that update", s2, E, ("fwd", c3), msg_id=m, client_id=3, shard_id=2,
                         num_keys=2, dim=2, status=Status.INTERNAL)
        # size messages (fixed-length mode, docs/protocol.md "Size messages"): routed and answered
        # like any request and reply; a SIZE_REQ of 100 entries is 1600 bytes: 2 fragments
        SQ, SA = MsgType.SIZE_REQ, MsgType.SIZE_ACK
        m = self.msg_id()
        self.add_message("c2 SIZE_REQ s0 (2 frags)", c2, SQ, ("fwd", s0), msg_id=m, client_id=2, shard_id=0,
                         num_keys=100, dim=0, dtype=DType.NONE, table_id=0)
        self.add_message("s0 LOOKUP_REPLY to a SIZE_REQ", s0, LR, ("drop", "wrong_reply_type"), msg_id=m,
                         client_id=2, shard_id=0, num_keys=100, dim=0, dtype=DType.FP32, table_id=0)
        self.add_message("s0 SIZE_ACK c2", s0, SA, ("fwd", c2), msg_id=m, client_id=2, shard_id=0,
                         num_keys=100, dim=0, dtype=DType.NONE, table_id=0)
        m = self.msg_id()
        self.add_message("c3 lookup s1 (SIZE_ACK to it)", c3, L, ("fwd", s1), msg_id=m, client_id=3,
                         shard_id=1, num_keys=2)
        self.add_message("s1 SIZE_ACK to a lookup", s1, SA, ("drop", "wrong_reply_type"), msg_id=m,
                         client_id=3, shard_id=1, num_keys=2)
        m = self.msg_id()
        self.add_message("c3 SIZE_REQ s2 (ERROR to it)", c3, SQ, ("fwd", s2), msg_id=m, client_id=3, shard_id=2,
                         num_keys=3, dim=0, dtype=DType.NONE, table_id=0)
        self.add_message("s2 ERROR to that SIZE_REQ", s2, E, ("fwd", c3), msg_id=m, client_id=3, shard_id=2,
                         num_keys=3, dim=0, dtype=DType.NONE, table_id=0, status=Status.MALFORMED)
        self.add_message("s2 SIZE_ACK c3, never asked", s2, SA, ("drop", "unsolicited_reply"),
                         msg_id=self.msg_id(), client_id=3, shard_id=2, num_keys=1, dim=0, dtype=DType.NONE)
        # fragments are tracked, not counted: 0 twice and 2 never -> receiving, duplicates passed on
        m = self.msg_id()
        self.add_message("c2 lookup s0, fragment 0 twice, 2 missing", c2, L, ("fwd", s0), msg_id=m,
                         client_id=2, shard_id=0, num_keys=400, only=[0, 0, 1])
        # every fragment, one twice, out of order -> forwarded (unanswered)
        m = self.msg_id()
        self.add_message("c3 lookup s1, fragments 2 1 1 0", c3, L, ("fwd", s1), msg_id=m, client_id=3,
                         shard_id=1, num_keys=400, only=[2, 1, 1, 0])
        # a 3-fragment reply with a fragment duplicated: passes only when all 3 passed
        m = self.msg_id()
        self.add_message("c3 lookup s2 (partial reply)", c3, L, ("fwd", s2), msg_id=m, client_id=3,
                         shard_id=2, num_keys=200, dim=4)
        self.add_message("s2 reply c3, fragments 0 0 1 (of 3)", s2, LR, ("fwd", c3), msg_id=m, client_id=3,
                         shard_id=2, num_keys=200, dim=4, only=[0, 0, 1])
        # more than 256 fragments (docs/protocol.md, "Fragmentation"): stateless, any type
        n = (256 * P) // 8 + 1  # 45825 keys: 366600 bytes, 257 fragments of 1432
        self.add_message("lookup of 257 fragments (first fragment)", self.clients[1], L,
                         ("drop", "too_many_frags"), msg_id=self.msg_id(), client_id=1, shard_id=0,
                         num_keys=n, only=[0])
        self.add_message("reply of 257 fragments (last fragment)", s0, LR, ("drop", "too_many_frags"),
                         msg_id=self.msg_id(), client_id=2, shard_id=0, num_keys=n, dim=2, only=[256])

    def _zero_key_lookup(self, src: Peer) -> bytes:
        hdr = Embnic(msg_type=MsgType.LOOKUP_REQ, msg_id=self.msg_id(), client_id=src.id, shard_id=0,
                     num_keys=0, msg_len=0, frag_count=1, frag_len=0, dim=4, dtype=1)
        return bytes(self._l2l3(src) / hdr)

    def _add_unauthorised(self) -> None:
        c1, c2 = self.clients[1], self.clients[2]
        s0 = self.shards[0]
        L, LR = MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY
        self.add_message("request from unregistered client 7", c1, L, ("drop", "unknown_client"),
                         msg_id=self.msg_id(), client_id=7, shard_id=0, num_keys=1)
        spoof = dataclasses.replace(c2, port=0, ip="10.1.0.66")
        self.add_message("client 2's id from another address", spoof, L, ("drop", "unknown_client"),
                         msg_id=self.msg_id(), client_id=2, shard_id=0, num_keys=1)
        wrong_port = dataclasses.replace(c1, udp_port=40999)
        self.add_message("client 1 from another UDP port", wrong_port, L, ("drop", "unknown_client"),
                         msg_id=self.msg_id(), client_id=1, shard_id=0, num_keys=1)
        self.add_message("request for shard 9 (no route)", c1, L, ("drop", "unknown_shard"),
                         msg_id=self.msg_id(), client_id=1, shard_id=9, num_keys=1)
        self.add_message("reply from a client's address", c2, LR, ("drop", "unknown_server"),
                         msg_id=self.msg_id(), client_id=1, shard_id=0, num_keys=1)
        self.add_message("reply claiming shard 9", s0, LR, ("drop", "unknown_server"),
                         msg_id=self.msg_id(), client_id=1, shard_id=9, num_keys=1)
        self.add_message("reply from shard 0 claiming shard 1", s0, LR, ("drop", "unknown_server"),
                         msg_id=self.msg_id(), client_id=1, shard_id=1, num_keys=1)
        self.add_message("reply to unregistered client 7", s0, LR, ("drop", "unknown_client"),
                         msg_id=self.msg_id(), client_id=7, shard_id=0, num_keys=1)

    # ------------------------------------------------------------------ tables and inputs
    def route_cmds(self) -> list[dict]:
        """``route_add`` requests for every shard."""
        return [s.cmd() for s in self.shards.values()]

    def client_cmds(self) -> list[dict]:
        """``client_add`` requests for every client."""
        return [c.cmd() for c in self.clients.values()]

    def inputs_by_port(self) -> dict[int, list[InFrame]]:
        """Input frames per ingress port, in order."""
        out: dict[int, list[InFrame]] = {p: [] for p in self.ports}
        for f in self.frames:
            out[f.port].append(f)
        return out

    def write_input_pcaps(self, directory: Path) -> dict[int, Path]:
        """One pcap per ingress port (``in<port>.pcap``); returns their paths."""
        directory.mkdir(parents=True, exist_ok=True)
        paths = {}
        for port, frames in self.inputs_by_port().items():
            paths[port] = directory / f"in{port}.pcap"
            write_pcap(paths[port], [f.data for f in frames])
        return paths

    # ------------------------------------------------------------------ expectations
    def expected_drops(self) -> dict[str, int]:
        """Drops per reason the card must count (reasons absent here must stay 0)."""
        return dict(collections.Counter(f.fate[1] for f in self.frames if f.fate[0] == "drop"))

    def expected_types(self) -> dict[str, int]:
        """Frames forwarded per message type name."""
        c = collections.Counter(MsgType(f.msg_type).name for f in self.frames if f.fate[0] == "fwd")
        return {t.name: c.get(t.name, 0) for t in MsgType}

    def state_model(self) -> "StateModel":
        """The reference state map after every input (ports in order; no message spans ports)."""
        model = StateModel()
        for f in self.frames:
            if f.fate[0] == "fwd":
                model.frame(Ether(f.data)[Embnic])
        return model

    def expected_state(self) -> dict:
        """``{"entries": n, "by_state": {"receiving": .., "forwarded": .., "replying": ..}}`` at the end."""
        return self.state_model().summary()

    def expected_completed(self) -> dict[str, dict[str, int]]:
        """Messages whose whole reply passed, by reply type: overall (``"all"``) and per shard id."""
        return self.state_model().completed

    def expected_arp_replies(self) -> int:
        return sum(1 for f in self.frames if f.fate[0] == "arp")

    def expected_frame(self, f: InFrame, card_macs: dict[int, str]) -> tuple[int, bytes]:
        """(output port, exact bytes) of a forwarded or answered input frame."""
        if f.fate[0] == "arp":
            pkt = Ether(f.data)
            a = pkt[ARP]
            mac = card_macs[f.port]
            rep = Ether(src=mac, dst=pkt.src) / ARP(op=2, hwsrc=mac, psrc=a.pdst, hwdst=a.hwsrc, pdst=a.psrc)
            return f.port, bytes(rep) + f.data[len(bytes(rep)):]
        peer: Peer = f.fate[1]
        card = self.ports[peer.port]
        pkt = Ether(f.data)
        ip_len = pkt[IP].len
        had_csum = pkt[UDP].chksum != 0
        pkt.src, pkt.dst = card_macs[peer.port], peer.mac
        pkt[IP].src, pkt[IP].dst, pkt[IP].ttl = card.ip, peer.ip, CARD_TTL
        pkt[UDP].sport, pkt[UDP].dport = PORT, peer.udp_port
        del pkt[IP].chksum
        if had_csum:
            del pkt[UDP].chksum
        data = bytes(pkt)[:14 + ip_len]
        return peer.port, data

    def expected_outputs(self, card_macs: dict[int, str]) -> dict[int, list[tuple[InFrame, bytes]]]:
        """Per output port, (input frame, exact output bytes) in input order."""
        out: dict[int, list[tuple[InFrame, bytes]]] = {p: [] for p in self.ports}
        for f in self.frames:
            if f.fate[0] in ("fwd", "arp"):
                port, data = self.expected_frame(f, card_macs)
                out[port].append((f, data))
        return out


class StateModel:
    """The card's state map as docs/protocol.md states it, for frames the card forwards.

    Keyed by (client_id, msg_id). A request frame opens the entry (or joins it) and marks its
    fragment; every fragment seen once -> ``forwarded``. A reply frame (already known to match:
    fates say which are forwarded) marks its fragment (``replying``); once every reply fragment
    was seen the entry is freed and counted as completed by reply type, per shard.
    """

    def __init__(self):
        self.entries: dict[tuple[int, int], dict] = {}
        self.completed: dict[str, dict[str, int]] = {"all": collections.Counter()}

    def frame(self, h: Embnic) -> None:
        key = (h.client_id, h.msg_id)
        if h.msg_type in consts.REQUEST_TYPES:
            e = self.entries.setdefault(key, {"in": set(), "out": set(), "n_in": h.frag_count,
                                              "n_out": 0, "shard": h.shard_id})
            e["in"].add(h.frag_index)
            return
        e = self.entries[key]
        e["n_out"] = h.frag_count
        e["out"].add(h.frag_index)
        if len(e["out"]) == e["n_out"]:
            del self.entries[key]
            name = MsgType(h.msg_type).name
            self.completed["all"][name] += 1
            self.completed.setdefault(str(e["shard"]), collections.Counter())[name] += 1

    def summary(self) -> dict:
        by = collections.Counter("replying" if e["out"] else "forwarded" if len(e["in"]) == e["n_in"]
                                 else "receiving" for e in self.entries.values())
        return {"entries": len(self.entries),
                "by_state": {k: by.get(k, 0) for k in ("receiving", "forwarded", "replying")}}


# ---------------------------------------------------------------------- pcap files
def read_pcap(path: Path) -> list[bytes]:
    """Frames of a classic pcap file (micro- or nanosecond, either byte order)."""
    data = Path(path).read_bytes()
    if len(data) < 24:
        return []
    magic = struct.unpack_from("<I", data)[0]
    end = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    out, off = [], 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack_from(end + "IIII", data, off)
        out.append(data[off + 16:off + 16 + incl])
        off += 16 + incl
    return out


# ---------------------------------------------------------------------- checks
def udp_checksum_ok(frame: bytes) -> bool:
    """True if the IPv4 header checksum is right and the UDP checksum is right or 0."""
    pkt = Ether(frame)
    if IP not in pkt:
        return True
    ip = IP(bytes(pkt[IP]))
    want_ip = IP(bytes(ip)).chksum
    clean = ip.copy()
    del clean.chksum
    if IP(bytes(clean)).chksum != want_ip:
        return False
    if UDP not in ip or ip[UDP].chksum == 0:
        return True
    u = ip.copy()
    del u[UDP].chksum
    return IP(bytes(u))[UDP].chksum == ip[UDP].chksum


def check_outputs(suite: Suite, got: dict[int, list[bytes]], card_macs: dict[int, str]) -> list[str]:
    """Compare output frames per port with the expectation; returns a list of problems.

    Each port must carry exactly the expected frames (as a multiset), frames that entered on the
    same ingress port must leave in their input order, checksums must be right (UDP: or 0), and
    the embnic header and body must be byte-identical to the input's.
    """
    problems = []
    want = suite.expected_outputs(card_macs)
    for port in suite.ports:
        w = want[port]
        g = got.get(port, [])
        wc, gc = collections.Counter(d for _, d in w), collections.Counter(g)
        for d, n in (wc - gc).items():
            labels = [f.label for f, dd in w if dd == d]
            problems.append(f"port {port}: missing {n}x {labels[0]!r}")
        for d, n in (gc - wc).items():
            problems.append(f"port {port}: unexpected {n}x frame {Ether(d).summary()} ({d[:64].hex()}...)")
        for d in g:
            if not udp_checksum_ok(d):
                problems.append(f"port {port}: bad checksum in {Ether(d).summary()}")
        # order per ingress port
        pos = {}
        for i, d in enumerate(g):
            pos.setdefault(d, []).append(i)
        for ing in suite.ports:
            seq = [d for f, d in w if f.port == ing]
            idx = [pos[d].pop(0) for d in seq if pos.get(d)]
            if idx != sorted(idx):
                problems.append(f"port {port}: frames from ingress port {ing} reordered")
        # body and embnic header untouched
        for f, d in w:
            if f.fate[0] == "fwd":
                ip_len = Ether(f.data)[IP].len
                if f.data[42:14 + ip_len] != d[42:]:
                    problems.append(f"port {port}: embnic header/body of {f.label!r} changed")
    return problems


def main(argv: list[str]) -> int:
    """Write in<port>.pcap and expected.json (frames as hex, card MACs as placeholders) to OUT."""
    if len(argv) != 2:
        print("usage: conformance.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[1])
    s = Suite.default()
    s.write_input_pcaps(out)
    macs = {p: f"02:cc:00:00:00:{p:02x}" for p in s.ports}
    exp = {
        "card_ports": [{"port": p.port, "ip": p.ip, "mac_assumed": macs[p.port]} for p in s.ports.values()],
        "routes": s.route_cmds(), "clients": s.client_cmds(),
        "drops": s.expected_drops(), "types": s.expected_types(), "arp_replies": s.expected_arp_replies(),
        "state": s.expected_state(), "completed": s.expected_completed(),
        "outputs": {str(p): [{"label": f.label, "in_port": f.port, "hex": d.hex()} for f, d in fr]
                    for p, fr in s.expected_outputs(macs).items()},
        "inputs": [{"label": f.label, "port": f.port, "fate": [f.fate[0], f.fate[1].id if f.fate[0] == "fwd"
                                                               else f.fate[-1]]} for f in s.frames],
    }
    (out / "expected.json").write_text(json.dumps(exp, indent=1) + "\n")
    print(f"wrote {len(s.frames)} input frames on {len(s.ports)} ports to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
