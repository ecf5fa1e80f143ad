"""Protocol constants of the embnic wire protocol v1, defined once.

Source of truth: ``docs/protocol.md``. The Scapy layer, the fast codec and the C header
(``dataplane/include/embnic_proto.h``, through the binary's build info) are checked against
:data:`HEADER_FIELDS` by tests.
"""
from __future__ import annotations

import dataclasses
import enum

MAGIC = 0x454D  #: "EM"
VERSION = 1
UDP_PORT = 7878
HDR_LEN = 40  #: bytes
IPV4_HDR_LEN = 20
UDP_HDR_LEN = 8
ETH_HDR_LEN = 14
KEY_SIZE = 8  #: bytes per key (uint64, little-endian in bodies)
SIZE_ENTRY = 16  #: bytes per entry of a SIZE_REQ body (docs/protocol.md, "Size messages")
DEFAULT_MTU = 1500  #: bytes of IPv4 datagram
MAX_FRAGS = 256  #: fragments of one message at most; receivers drop more as ``too_many_frags``

#: (name, offset, size) of every header field, network byte order.
HEADER_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("magic", 0, 2),
    ("version", 2, 1),
    ("msg_type", 3, 1),
    ("flags", 4, 1),
    ("dtype", 5, 1),
    ("status", 6, 2),
    ("msg_id", 8, 4),
    ("client_id", 12, 2),
    ("table_id", 14, 2),
    ("shard_id", 16, 2),
    ("dim", 18, 2),
    ("num_keys", 20, 4),
    ("msg_len", 24, 4),
    ("frag_offset", 28, 4),
    ("frag_index", 32, 2),
    ("frag_count", 34, 2),
    ("frag_len", 36, 2),
    ("reserved", 38, 2),
)


class MsgType(enum.IntEnum):
    LOOKUP_REQ = 1
    LOOKUP_REPLY = 2
    UPDATE_REQ = 3
    UPDATE_ACK = 4
    ERROR = 5
    SIZE_REQ = 6  #: fixed-length mode: the sizes of the data messages that follow
    SIZE_ACK = 7  #: the shard sized its buffers; the data may come


REQUEST_TYPES = frozenset({MsgType.LOOKUP_REQ, MsgType.UPDATE_REQ, MsgType.SIZE_REQ})
REPLY_TYPES = frozenset({MsgType.LOOKUP_REPLY, MsgType.UPDATE_ACK, MsgType.ERROR, MsgType.SIZE_ACK})
#: request type -> the reply types that answer it (ERROR answers any request)
ANSWERS = {MsgType.LOOKUP_REQ: frozenset({MsgType.LOOKUP_REPLY, MsgType.ERROR}),
           MsgType.UPDATE_REQ: frozenset({MsgType.UPDATE_ACK, MsgType.ERROR}),
           MsgType.SIZE_REQ: frozenset({MsgType.SIZE_ACK, MsgType.ERROR})}
#: request types that carry ids (data); a SIZE_REQ announces these
DATA_REQUEST_TYPES = frozenset({MsgType.LOOKUP_REQ, MsgType.UPDATE_REQ})
#: one SIZE_REQ entry as a numpy structured dtype (little-endian, like every body)
SIZE_ENTRY_FIELDS = (("msg_id", "<u4"), ("msg_type", "u1"), ("dtype", "u1"), ("table_id", "<u2"),
                     ("num_keys", "<u4"), ("msg_len", "<u4"))


class Flags(enum.IntFlag):
    NONE = 0
    RETRANSMIT = 0x01


class DType(enum.IntEnum):
    NONE = 0
    FP32 = 1
    FP16 = 2


#: bytes per element of each dtype
DTYPE_SIZE = {DType.NONE: 0, DType.FP32: 4, DType.FP16: 2}
#: numpy dtype string (little-endian, as in bodies) of each dtype
DTYPE_NUMPY = {DType.FP32: "<f4", DType.FP16: "<f2"}
DTYPE_BY_NAME = {"fp32": DType.FP32, "fp16": DType.FP16}


class Status(enum.IntEnum):
    OK = 0
    MALFORMED = 1
    UNKNOWN_TABLE = 2
    WRONG_SHARD = 3
    DIM_MISMATCH = 4
    KEY_OUT_OF_RANGE = 5
    NOT_OWNER = 6
    INTERNAL = 7


#: drop reasons every receiver counts (docs/protocol.md, "Validity")
DROP_REASONS = (
    "too_short",
    "bad_magic",
    "bad_version",
    "bad_type",
    "bad_dtype",
    "bad_length",
    "frag_mismatch",
    "too_many_frags",
    "too_large",
)


# ---- what a reader needs of each field: meanings, value names, body layout -----------------
# Data beside HEADER_FIELDS (not a second copy of the layout): the generated Wireshark dissector
# (embnic.control.dissector, `embnic dissector`) takes every header field's offset and size from
# HEADER_FIELDS and its name, meaning and value names from FIELD_DOCS; the body from BODY_LAYOUT.

@dataclasses.dataclass(frozen=True)
class FieldDoc:
    """What a reader needs of one header field besides its offset and size.

    Attributes:
        title: short display name ("Message type").
        meaning: one sentence, as in docs/protocol.md's header table.
        values: the enum naming its values (an ``IntEnum``), or its bits (an ``IntFlag``).
        hex: show the value in hexadecimal.
        expect: the one valid value (``magic``, ``version``), else ``None``.
        drop_reason: the :data:`DROP_REASONS` entry a receiver counts when the value is not
            ``expect`` or, for a field with ``values``, not one of them (``None``: not checked).
        summary: its label in a one-line summary of a message (``"id"``: ``id=7``); a field
            with ``values`` shows there by name, and only when not 0.
    """

    title: str
    meaning: str
    values: type[enum.IntEnum] | type[enum.IntFlag] | None = None
    hex: bool = False
    expect: int | None = None
    drop_reason: str | None = None
    summary: str | None = None


#: header field name -> :class:`FieldDoc`, one per :data:`HEADER_FIELDS` entry, in its order;
#: the checks with a ``drop_reason`` run in this order (codec.parse_header's)
FIELD_DOCS: dict[str, FieldDoc] = {
    "magic": FieldDoc("Magic", "0x454D (\"EM\"): an embnic frame", hex=True, expect=MAGIC,
                      drop_reason="bad_magic"),
    "version": FieldDoc("Version", f"protocol version ({VERSION})", expect=VERSION,
                        drop_reason="bad_version"),
    "msg_type": FieldDoc("Message type", "what the message is: a request (lookup, update, size) "
                         "or a reply (lookup reply, update ack, error, size ack)", values=MsgType,
                         drop_reason="bad_type"),
    "flags": FieldDoc("Flags", "bit 0 RETRANSMIT: a re-send of a message already sent once", values=Flags,
                      hex=True, summary="flags"),
    "dtype": FieldDoc("Data type", "element type of rows and gradients", values=DType,
                      drop_reason="bad_dtype"),
    "status": FieldDoc("Status", "error code of an ERROR reply; 0 in requests", values=Status,
                       summary="status"),
    "msg_id": FieldDoc("Message id", "chosen by the client, unique per client among messages in flight; "
                       "a reply carries its request's", summary="id"),
    "client_id": FieldDoc("Client id", "the client that sent the request (the card routes replies by it)",
                          summary="client"),
    "table_id": FieldDoc("Table id", "embedding table", summary="table"),
    "shard_id": FieldDoc("Shard id", "target address: the shard a request is for, the shard that answers "
                         "a reply", summary="shard"),
    "dim": FieldDoc("Dimension", "embedding dimension (values per row)"),
    "num_keys": FieldDoc("Number of keys", "keys in the message (SIZE_REQ: entries)", summary="keys"),
    "msg_len": FieldDoc("Message length", "body bytes of the whole message (sum over all fragments)"),
    "frag_offset": FieldDoc("Fragment offset", "byte offset of this frame's body within the message body"),
    "frag_index": FieldDoc("Fragment index", "index of this fragment, 0 <= frag_index < frag_count"),
    "frag_count": FieldDoc("Fragment count", f"fragments of the message, 1..{MAX_FRAGS}"),
    "frag_len": FieldDoc("Fragment length", "body bytes carried by this frame"),
    "reserved": FieldDoc("Reserved", "0 on send, ignored on receive", hex=True),
}

#: the key of a message's entry in a card's state map and of request/response matching
#: (docs/protocol.md, "The card's state map"): a reply answers the request with these equal
TRANSACTION_KEY = ("client_id", "msg_id")


@dataclasses.dataclass(frozen=True)
class BodyElement:
    """One kind of body element (little-endian, like every body).

    Attributes:
        numpy: numpy dtype string of a fixed-size element (``"<u8"`` for a key), else ``None``.
        fields: ``(name, numpy dtype)`` of a structured element (a SIZE_REQ entry), else ``()``;
            a name that is a header field's takes its :data:`FIELD_DOCS` title and value names.
        values_of: for a row, the header fields ``(count, dtype)`` that make it ``count``
            values of ``dtype`` (:data:`DTYPE_SIZE` bytes each), else ``None``.
    """

    numpy: str | None = None
    fields: tuple[tuple[str, str], ...] = ()
    values_of: tuple[str, str] | None = None


#: element kind -> :class:`BodyElement`
BODY_ELEMENTS: dict[str, BodyElement] = {
    "key": BodyElement(numpy="<u8"),
    "row": BodyElement(values_of=("dim", "dtype")),
    "size_entry": BodyElement(fields=SIZE_ENTRY_FIELDS),
}


@dataclasses.dataclass(frozen=True)
class BodySection:
    """A run of ``count`` elements of one kind; a body is its type's sections, back to back.

    Attributes:
        name: the section ("keys", "gradients"); ``item`` names one element ("key", "gradient").
        element: a :data:`BODY_ELEMENTS` kind.
        count: the header field that gives the number of elements.
    """

    name: str
    item: str
    element: str
    count: str


#: message type -> the sections of its body, in order (docs/protocol.md, "Body" and "Size
#: messages"); a type with none has an empty body. ``expected_msg_len`` is their total length
#: (a test keeps them equal).
BODY_LAYOUT: dict[MsgType, tuple[BodySection, ...]] = {
    MsgType.LOOKUP_REQ: (BodySection("keys", "key", "key", "num_keys"),),
    MsgType.LOOKUP_REPLY: (BodySection("rows", "row", "row", "num_keys"),),
    MsgType.UPDATE_REQ: (BodySection("keys", "key", "key", "num_keys"),
                         BodySection("gradients", "gradient", "row", "num_keys")),
    MsgType.UPDATE_ACK: (),
    MsgType.ERROR: (),
    MsgType.SIZE_REQ: (BodySection("entries", "entry", "size_entry", "num_keys"),),
    MsgType.SIZE_ACK: (),
}


def max_body_per_frame(mtu: int) -> int:
    """Largest body fragment (bytes) that fits one IPv4 datagram of ``mtu`` bytes.

    ``P = mtu - 20 (IPv4) - 8 (UDP) - 40 (embnic)``; MTU 1500 gives 1432.

    Raises:
        ValueError: if the MTU leaves no room for a body byte.
    """
    p = int(mtu) - IPV4_HDR_LEN - UDP_HDR_LEN - HDR_LEN
    if p <= 0 or p > 0xFFFF:
        raise ValueError(f"MTU {mtu} leaves {p} body bytes per frame; use an MTU in 69..65535")
    return p


def max_keys_per_message(msg_type: int, dim: int, dtype: int, mtu: int) -> int:
    """Most keys one request of ``msg_type`` may carry so that it and its reply each fit in
    :data:`MAX_FRAGS` fragments at ``mtu`` (docs/protocol.md, "Fragmentation").

    A lookup of ``n`` keys is ``8n`` bytes and its reply ``n·dim·esize``; an update is
    ``n·(8 + dim·esize)`` and its ack empty. Clients split larger requests into several messages.

    Example: MTU 1500 (P = 1432), dim 64, fp32: lookups 1432 keys, updates 1374 keys.

    Raises:
        ValueError: ``msg_type`` is not a request type, or the MTU leaves no body room.
    """
    if msg_type not in DATA_REQUEST_TYPES:
        raise ValueError(f"max_keys_per_message: {msg_type!r} is not a lookup or update request")
    budget = MAX_FRAGS * max_body_per_frame(mtu)
    row = dim * DTYPE_SIZE.get(DType(dtype), 0) if dtype in (0, 1, 2) else 0
    per_key = max(KEY_SIZE, row) if msg_type == MsgType.LOOKUP_REQ else KEY_SIZE + row
    return max(1, budget // per_key)


def expected_msg_len(msg_type: int, num_keys: int, dim: int, dtype: int) -> int:
    """Body length (bytes) a message of this type must have (docs/protocol.md, "Body"):
    ``8n`` for a lookup, ``n·dim·esize`` for its reply, ``n·(8 + dim·esize)`` for an update,
    ``16n`` for a SIZE_REQ of ``n`` entries, 0 for UPDATE_ACK, ERROR and SIZE_ACK."""
    esize = DTYPE_SIZE.get(DType(dtype), 0) if dtype in (0, 1, 2) else 0
    if msg_type == MsgType.LOOKUP_REQ:
        return KEY_SIZE * num_keys
    if msg_type == MsgType.LOOKUP_REPLY:
        return num_keys * dim * esize
    if msg_type == MsgType.UPDATE_REQ:
        return num_keys * (KEY_SIZE + dim * esize)
    if msg_type == MsgType.SIZE_REQ:
        return SIZE_ENTRY * num_keys
    return 0
