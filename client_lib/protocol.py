"""The embnic v2 header as a Scapy layer, bound to UDP port 7878.

Defaults follow the protocol: ``UDP()/Embnic(msg_type="LOOKUP_REQ")`` goes from
:data:`EPHEMERAL_PORT` (or the ``sport`` given) to 7878, a reply comes from 7878; every
datagram to or from 7878 dissects as :class:`Embnic` (even from port 53); the length fields
(``num_keys``, ``msg_len``, ``frag_count``, ``frag_len``) are filled from the payload; a
request's body starts with its directory, one :class:`EmbnicDirEntry` per table.

Spec: ``docs/protocol.md``; constants: :mod:`embnic.client_lib.consts`. After importing this
module, ``rdpcap`` of a capture dissects embnic frames::

    >>> from scapy.all import Ether, IP, UDP, Raw
    >>> from embnic.client_lib.protocol import Embnic
    >>> pkt = IP()/UDP(sport=40000, dport=7878)/Embnic(msg_type="LOOKUP_REQ", msg_id=7,
    ...        client_id=1, shard_id=0, num_tables=1, value_len=32)/EmbnicDirEntry(
    ...        table_id=3, dim=8, num_keys=1)/Raw(b"\\x01" + b"\\0" * 7)
    >>> Embnic(bytes(pkt[Embnic])).num_keys   # length fields filled in post_build
    1

The fast path (:mod:`embnic.client_lib.codec`) builds byte-identical frames without Scapy.
"""
from __future__ import annotations

import struct

from scapy.fields import (
    ByteEnumField,
    ByteField,
    FlagsField,
    IntField,
    LEIntField,
    LEShortField,
    ShortEnumField,
    ShortField,
    XShortField,
)
from scapy.layers.inet import UDP
from scapy.packet import Packet, Raw, bind_bottom_up, bind_top_down

from . import consts

#: UDP port of the client side when none is given: the first port of the IANA dynamic
#: (ephemeral) range, RFC 6335. Requests go from it to 7878, replies from 7878 to it.
EPHEMERAL_PORT = 49152
_TYPES = {int(t): t.name for t in consts.MsgType}
_DTYPES = {0: "none", 1: "fp32", 2: "fp16"}
_STATUS = {int(s): s.name for s in consts.Status}
_FLAGS = ["RETRANSMIT", "F1", "F2", "F3", "F4", "F5", "F6", "F7"]
_UINT = {1: ByteField, 2: ShortField, 4: IntField}
#: header fields shown by name (or in hex) and their defaults
_NAMED = {"magic": XShortField("magic", consts.MAGIC),
          "msg_type": ByteEnumField("msg_type", consts.MsgType.LOOKUP_REQ, _TYPES),
          "flags": FlagsField("flags", 0, 8, _FLAGS), "status": ShortEnumField("status", 0, _STATUS)}
#: the other fields' defaults other than 0: None is filled in :meth:`Embnic.post_build`
_DEFAULTS = {"version": consts.VERSION, "table_id": consts.NO_TABLE, "num_keys": None, "msg_len": None,
             "frag_count": None, "frag_len": None}
#: reply type -> the request types it answers (the inverse of consts.ANSWERS)
_REPLY_OF = {r: tuple(q for q, rs in consts.ANSWERS.items() if r in rs) for r in consts.REPLY_TYPES}


class Embnic(Packet):
    """embnic v2 header (44 bytes, network byte order); the body follows as payload.

    ``num_keys``, ``msg_len``, ``frag_count`` and ``frag_len`` default to ``None`` and are
    filled in :meth:`post_build` for a single-fragment message: ``frag_len`` = payload
    length, ``msg_len`` = ``frag_len``, ``frag_count`` = 1, ``num_keys`` derived from
    ``msg_len`` by the message type's body formula where the header allows it (a lookup or
    update request from ``num_tables`` and ``value_len``, a SIZE_REQ from its entries).
    """

    name = "embnic"
    #: one field per consts.HEADER_FIELDS entry: an unsigned int of its size (default 0, or
    #: :data:`_DEFAULTS`) unless :data:`_NAMED` gives it value names
    fields_desc = [_NAMED.get(n) or _UINT[size](n, _DEFAULTS.get(n, 0)) for n, _, size in consts.HEADER_FIELDS]

    def add_underlayer(self, underlayer) -> None:
        """Under a UDP layer, fill the ports a user did not give: a request (LOOKUP_REQ,
        UPDATE_REQ) goes from :data:`EPHEMERAL_PORT` to 7878, a reply (LOOKUP_REPLY,
        UPDATE_ACK, ERROR) from 7878 to :data:`EPHEMERAL_PORT`. Ports given to ``UDP()`` win."""
        super().add_underlayer(underlayer)
        if self.msg_type in consts.REQUEST_TYPES:
            ports = {"sport": EPHEMERAL_PORT, "dport": consts.UDP_PORT}
        else:
            ports = {"sport": consts.UDP_PORT, "dport": EPHEMERAL_PORT}
        self.overload_fields = {**self.overload_fields, UDP: ports}

    def post_build(self, p: bytes, pay: bytes) -> bytes:
        frag_len = self.frag_len if self.frag_len is not None else len(pay)
        msg_len = self.msg_len if self.msg_len is not None else frag_len
        frag_count = self.frag_count if self.frag_count is not None else 1
        num_keys = self.num_keys
        if num_keys is None:
            rest = msg_len - consts.DIR_ENTRY * self.num_tables
            num_keys = {
                consts.MsgType.LOOKUP_REQ: rest // consts.KEY_SIZE,
                consts.MsgType.UPDATE_REQ: (rest - self.value_len) // consts.KEY_SIZE,
                consts.MsgType.SIZE_REQ: msg_len // consts.SIZE_ENTRY,
            }.get(self.msg_type, 0)
            num_keys = max(0, num_keys)
        p = (p[:20] + struct.pack("!I", num_keys) + p[24:28] + struct.pack("!I", msg_len) + p[32:38]
             + struct.pack("!HH", frag_count, frag_len) + p[42:])
        return p + pay

    def mysummary(self) -> str:
        return self.sprintf(
            "embnic %msg_type% id=%msg_id% client=%client_id% shard=%shard_id% "
            "tables=%num_tables% keys=%num_keys% frag=%frag_index%/%frag_count%"
        )

    def hashret(self) -> bytes:
        return struct.pack("!HI", self.client_id, self.msg_id)

    def answers(self, other: Packet) -> int:
        """True when ``self`` is a reply (2, 4, 5, 7) to request ``other`` (same client and msg id)."""
        if not isinstance(other, Embnic):
            return 0
        try:
            wanted = _REPLY_OF[consts.MsgType(self.msg_type)]
        except (KeyError, ValueError):
            return 0
        return int(other.msg_type in wanted and other.client_id == self.client_id
                   and other.msg_id == self.msg_id)

    def guess_payload_class(self, payload: bytes):
        if (self.msg_type in (consts.MsgType.LOOKUP_REQ, consts.MsgType.UPDATE_REQ) and self.num_tables
                and self.frag_index == 0 and len(payload) >= consts.DIR_ENTRY):
            return EmbnicDirEntry
        return Raw


class EmbnicDirEntry(Packet):
    """One table of a request's directory (16 bytes, little-endian like every body;
    docs/protocol.md, "Body"): the table, its row shape and how many of the message's keys are
    its. Entries follow one another at the start of fragment 0's body; after the last
    (``num_tables`` of the header) come the keys, as :class:`~scapy.packet.Raw`."""

    name = "embnic directory entry"
    fields_desc = [
        LEShortField("table_id", 0),
        LEShortField("dim", 1),
        ByteEnumField("dtype", consts.DType.FP32, _DTYPES),
        ByteField("reserved0", 0),
        LEShortField("reserved1", 0),
        LEIntField("num_keys", 1),
        LEIntField("reserved2", 0),
    ]

    def guess_payload_class(self, payload: bytes):
        hdr = self.underlayer
        depth = 1
        while isinstance(hdr, EmbnicDirEntry):
            hdr = hdr.underlayer
            depth += 1
        if isinstance(hdr, Embnic) and depth < hdr.num_tables and len(payload) >= consts.DIR_ENTRY:
            return EmbnicDirEntry
        return Raw


# Dissection: a datagram to or from 7878 is embnic, whatever the other port (also 53 or 5353,
# which Scapy binds to DNS): Packet.guess_payload_class takes the first binding that matches,
# so the embnic bindings go first.
bind_bottom_up(UDP, Embnic, dport=consts.UDP_PORT)
bind_bottom_up(UDP, Embnic, sport=consts.UDP_PORT)
UDP.payload_guess = ([g for g in UDP.payload_guess if g[1] is Embnic]
                     + [g for g in UDP.payload_guess if g[1] is not Embnic])
# Building: the class default is a request's ports; Embnic.add_underlayer picks per message type.
bind_top_down(UDP, Embnic, sport=EPHEMERAL_PORT, dport=consts.UDP_PORT)
