"""Conformance cases for an embnic card, target-independent (DPDK on pcap vdevs, P4 on BMv2).

One :class:`Suite` holds a 3-port card, its route and client tables, the input frames per
ingress port (protocol v2, built with the Scapy layer :class:`embnic.client_lib.protocol.Embnic`:
a request's body is its directory and keys, as hosts send it; a card reads only the header) and, for
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
(:meth:`Suite.expected_completed`) come from. The standard cases themselves are in
``conformance_cases.py`` (valid, malformed, unauthorised, reply path).

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

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.consts import DType, Flags, MsgType, Status
from embnic.client_lib.protocol import Embnic
from embnic.control import pcap as pcap_file
from embnic.control.pcap import write_pcap  # noqa: F401 - the one pcap writer (tests import it from here)

PORT = consts.UDP_PORT
CARD_TTL = 64  #: TTL of every frame the card sends
#: a MAC that stands for "the card port's MAC" in input frames (the card does not check it)
CARD_MAC_IN = "02:cc:00:00:00:00"
P = consts.max_body_per_frame(consts.DEFAULT_MTU)  #: 1428 body bytes per fragment
#: one table of a message: (table_id, dim, dtype, num_keys), as in a request's directory
Table = tuple[int, int, int, int]


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


def message_body(msg_type: int, tables: list[Table], num_entries: int, seed: int) -> tuple[int, int, int, bytes]:
    """(num_tables, num_keys, value_len, body) of a v2 message of ``msg_type`` (docs/protocol.md,
    "Body"): a LOOKUP_REQ is the directory of ``tables`` and their keys, an UPDATE_REQ that and
    the gradients, a LOOKUP_REPLY the rows (``value_len`` bytes); UPDATE_ACK, ERROR carry the
    request's counts and no body; a SIZE_REQ has ``num_entries`` entries of 16 bytes (T = 0,
    value_len = 0) and its SIZE_ACK (or an ERROR given no ``tables``) the count alone. Keys and values are deterministic in ``seed``.
    """
    if msg_type in (MsgType.SIZE_REQ, MsgType.SIZE_ACK) or not tables:
        if msg_type != MsgType.SIZE_REQ:  # a SIZE_ACK, or an ERROR to a SIZE_REQ: the copies
            return 0, num_entries, 0, b""
        e = np.zeros(num_entries, codec.SIZE_ENTRY_DTYPE)
        e["msg_id"] = np.arange(num_entries) + seed
        e["msg_type"] = MsgType.LOOKUP_REQ
        e["num_tables"] = 1
        e["num_keys"] = 3
        e["msg_len"] = consts.DIR_ENTRY + 3 * consts.KEY_SIZE
        return 0, num_entries, 0, e.tobytes()
    d = codec.make_directory(*zip(*tables))
    T, n, vl = len(d), int(d["num_keys"].sum()), codec.value_len_of(d)
    if msg_type == MsgType.LOOKUP_REPLY:
        return T, n, vl, _body(vl, seed)
    if msg_type == MsgType.UPDATE_NACK:  # the fragments held: a bitmap of MAX_FRAGS bits
        return T, n, vl, codec.nack_body(range(0, consts.MAX_FRAGS, 2))
    if msg_type not in consts.DATA_REQUEST_TYPES:
        return T, n, vl, b""
    keys = (np.arange(n, dtype=np.uint64) * np.uint64(7919) + np.uint64(seed)).astype("<u8")
    body = d.tobytes() + keys.tobytes()
    return T, n, vl, body + (_body(vl, seed) if msg_type == MsgType.UPDATE_REQ else b"")


def v1_frame_payload(*, msg_type: int = 1, msg_id: int, client_id: int, table_id: int = 3, shard_id: int = 0,
                     dim: int = 4, num_keys: int = 2) -> bytes:
    """The UDP payload of a version-1 message of one fragment (the 40-byte v1 header: magic,
    version 1, type, flags, dtype fp32, status, msg_id, client_id, table_id, shard_id, dim, num_keys,
    msg_len, frag_offset, frag_index, frag_count, frag_len, reserved; then 8-byte keys), which
    every v2 receiver drops as ``bad_version`` (docs/protocol.md)."""
    body = _body(8 * num_keys, msg_id)
    hdr = struct.pack("!HBBBBHIHHHHIIIHHHH", consts.MAGIC, 1, msg_type, 0, DType.FP32, 0, msg_id, client_id,
                      table_id, shard_id, dim, num_keys, len(body), 0, 0, 1, len(body), 0)
    assert len(hdr) == 40
    return hdr + body


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
        import conformance_cases as cases  # the cases build on this module's Suite

        cases.add_valid(s)
        cases.add_malformed(s)
        cases.add_unauthorised(s)
        cases.add_reply_path(s)
        cases.add_frag_geometry(s)
        return s

    def msg_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def l2l3(self, src: Peer, *, dst_ip: str | None = None, sport: int | None = None):
        """Ethernet / IPv4 / UDP from ``src`` to its card port's address (``dst_ip`` overrides),
        source UDP port ``sport`` (default: ``src``'s), destination the protocol's port."""
        card = self.ports[src.port]
        return (Ether(src=src.mac, dst=CARD_MAC_IN)
                / IP(src=src.ip, dst=dst_ip or card.ip, flags="DF", id=0x1234, ttl=17)
                / UDP(sport=src.udp_port if sport is None else sport, dport=PORT))

    def message(self, src: Peer, msg_type: int, *, msg_id: int, client_id: int, shard_id: int,
                num_keys: int = 0, dim: int = 4, dtype: int = DType.FP32, table: int = 3,
                tables: list[Table] | None = None, error_table: int = consts.NO_TABLE,
                flags: int = 0, status: int = 0, seed: int = 0, only: list[int] | None = None,
                frag_size: int = P) -> list[bytes]:
        """Frames of one v2 message from ``src``, fragmented at MTU 1500 (docs/protocol.md).

        ``tables``: the request's directory, ``[(table_id, dim, dtype, num_keys), ...]``; by
        default one table, ``[(table, dim, dtype, num_keys)]``. A reply is given its request's
        tables: it copies the counts (``num_tables``, ``num_keys``, ``value_len``) and a
        LOOKUP_REPLY carries the rows. A SIZE_REQ / SIZE_ACK has ``num_keys`` entries and no table.
        ``error_table``: the header's ``table_id`` (an ERROR's table; ``NO_TABLE`` otherwise).
        ``only``: the fragment indexes to return, in that order (repeats allowed), instead of all.
        ``frag_size``: cut the body every ``frag_size`` bytes instead of ``P`` (1428, MTU 1500);
        each fragment is valid alone, but a receiver that saw a fragment of the message cut at
        another size drops it as ``frag_mismatch``.
        """
        if tables is None:
            tables = [(table, dim, dtype, num_keys)]
        T, n, value_len, body = message_body(msg_type, tables, num_keys, seed or msg_id)
        msg_len = consts.expected_msg_len(msg_type, T, n, value_len)
        assert len(body) == msg_len
        count = max(1, -(-msg_len // frag_size))
        out = []
        for i in range(count):
            chunk = body[i * frag_size:(i + 1) * frag_size]
            hdr = Embnic(msg_type=msg_type, flags=flags, status=status, msg_id=msg_id, client_id=client_id,
                         shard_id=shard_id, num_tables=T, table_id=error_table, num_keys=n, value_len=value_len,
                         msg_len=msg_len, frag_offset=i * frag_size, frag_index=i, frag_count=count,
                         frag_len=len(chunk))
            out.append(bytes(self.l2l3(src) / hdr / Raw(chunk)))
        return out if only is None else [out[i] for i in only]

    def frame(self, src: Peer, body_len: int, **fields) -> bytes:
        """One frame from ``src`` with the header ``fields`` given as they are (no length filled
        in but ``frag_len`` = ``body_len``, ``frag_count`` 1 and ``msg_len`` = ``body_len`` unless
        given) and ``body_len`` body bytes: for headers that do not add up."""
        fields = {"msg_len": body_len, "frag_count": 1, "frag_len": body_len, "num_keys": 0, **fields}
        return bytes(self.l2l3(src) / Embnic(**fields) / Raw(_body(body_len, fields.get("msg_id", 0))))

    def add(self, label: str, port: int, data: bytes, fate: tuple, msg_type: int | None = None) -> None:
        self.frames.append(InFrame(label, port, bytes(data), fate, msg_type))

    def add_message(self, label: str, src: Peer, msg_type: int, fate: tuple, **kw) -> None:
        for i, f in enumerate(self.message(src, msg_type, **kw)):
            self.add(f"{label}[{i}]", src.port, f, fate, msg_type)

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

    def expected_drops_by_port(self) -> dict[int, dict[str, int]]:
        """Drops per ingress port and reason (every port listed; the suite drops nothing as
        ``tx_full``, the one reason counted on the egress port)."""
        out: dict[int, collections.Counter] = {p: collections.Counter() for p in self.ports}
        for f in self.frames:
            if f.fate[0] == "drop":
                out[f.port][f.fate[1]] += 1
        return {p: dict(c) for p, c in out.items()}

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
    fragment; the entry records what the card records from the request's header (type, shard,
    ``num_tables``, ``num_keys``, ``value_len``, ``msg_len``); every fragment seen once ->
    ``forwarded``. A reply frame (already known to match:
    fates say which are forwarded) marks its fragment (``replying``); once every reply fragment
    was seen the entry is counted as completed by reply type, per shard, and freed — unless
    it is an ERROR and request fragments are still to come: it is then answered (``replying``), freed when the last
    of them passes, and a request fragment it has already seen opens it anew. Body bytes
    are counted once per distinct fragment each way (``bytes_in``, ``bytes_out``).
    """

    def __init__(self):
        self.entries: dict[tuple[int, int], dict] = {}
        self.completed: dict[str, dict[str, int]] = {"all": collections.Counter()}

    def frame(self, h: Embnic) -> None:
        key = (h.client_id, h.msg_id)
        if h.msg_type in consts.REQUEST_TYPES:
            old = self.entries.get(key)
            if old is not None and old.get("answered") and h.frag_index in old["in"]:
                del self.entries[key]  # as if freed: a new message with the same ids
            e = self.entries.setdefault(key, {"in": set(), "out": set(), "n_in": h.frag_count,
                                              "n_out": 0, "shard": h.shard_id, "type": h.msg_type,
                                              "num_tables": h.num_tables, "num_keys": h.num_keys,
                                              "value_len": h.value_len, "msg_len": h.msg_len,
                                              "bytes_in": 0, "bytes_out": 0})
            if h.frag_index not in e["in"]:
                e["bytes_in"] += h.frag_len
            e["in"].add(h.frag_index)
            if e.get("answered") and len(e["in"]) == e["n_in"]:
                del self.entries[key]
            return
        e = self.entries[key]
        e["n_out"] = h.frag_count
        if h.frag_index not in e["out"]:
            e["bytes_out"] += h.frag_len
        e["out"].add(h.frag_index)
        if len(e["out"]) == e["n_out"]:
            if len(e["in"]) == e["n_in"] or h.msg_type != MsgType.ERROR:
                del self.entries[key]
            else:
                e["answered"] = True  # refused with request fragments still to come
            name = MsgType(h.msg_type).name
            self.completed["all"][name] += 1
            self.completed.setdefault(str(e["shard"]), collections.Counter())[name] += 1

    @staticmethod
    def state_of(e: dict) -> str:
        """``receiving``, ``forwarded`` or ``replying``, as the card names an entry's state."""
        return "replying" if e["out"] else "forwarded" if len(e["in"]) == e["n_in"] else "receiving"

    def summary(self) -> dict:
        by = collections.Counter(self.state_of(e) for e in self.entries.values())
        return {"entries": len(self.entries),
                "by_state": {k: by.get(k, 0) for k in ("receiving", "forwarded", "replying")}}


# ---------------------------------------------------------------------- pcap files
def read_pcap(path: Path) -> list[bytes]:
    """Frames of a classic pcap file (micro- or nanosecond, either byte order;
    :func:`embnic.control.pcap.read_pcap`, the one reader); [] for a file shorter than a pcap
    header (a switch that has not written its header yet)."""
    if Path(path).stat().st_size < pcap_file.HEADER_LEN:
        return []
    return [frame for _, frame in pcap_file.read_pcap(path)]


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


def _message_of(data: bytes) -> tuple | None:
    """(client id, message id) of an embnic frame, None for anything else (ARP)."""
    e = Ether(data)
    if Embnic not in e:
        return None
    return (e[Embnic].client_id, e[Embnic].msg_id)


def check_outputs(suite: Suite, got: dict[int, list[bytes]], card_macs: dict[int, str],
                  order: str = "port") -> list[str]:
    """Compare output frames per port with the expectation; returns a list of problems.

    Each port must carry exactly the expected frames (as a multiset), frames that entered on the
    same ingress port must leave in their input order, checksums must be right (UDP: or 0), and
    the embnic header and body must be byte-identical to the input's.

    ``order="message"``: a card whose state map is partitioned over several lcores keeps the
    order of the frames of one message (and of its reply) from one ingress port, not across
    messages: input order is then checked per (ingress port, client id, message id), and for
    the ARP replies of each ingress port.
    """
    if order not in ("port", "message"):
        raise ValueError(f"order must be 'port' or 'message', got {order!r}")
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
        groups: dict[tuple, list[bytes]] = collections.defaultdict(list)
        for f, d in w:
            groups[(f.port,) if order == "port" else (f.port, _message_of(d))].append(d)
        for key, seq in groups.items():
            idx = [pos[d].pop(0) for d in seq if pos.get(d)]
            if idx != sorted(idx):
                what = "" if order == "port" else f" of message {key[1]}"
                problems.append(f"port {port}: frames{what} from ingress port {key[0]} reordered")
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
