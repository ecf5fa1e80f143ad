"""Protocol constants of the embnic wire protocol v2, defined once.

Source of truth: ``docs/protocol.md``. The Scapy layer, the fast codec and the C header
(``dataplane/include/embnic_proto.h``, through the binary's build info) are checked against
:data:`HEADER_FIELDS` by tests.
"""
from __future__ import annotations

import dataclasses
import enum

MAGIC = 0x454D  #: "EM"
VERSION = 2
UDP_PORT = 7878
HDR_LEN = 44  #: bytes
IPV4_HDR_LEN = 20
UDP_HDR_LEN = 8
ETH_HDR_LEN = 14
KEY_SIZE = 8  #: bytes per key (uint64, little-endian in bodies)
SIZE_ENTRY = 16  #: bytes per entry of a SIZE_REQ body (docs/protocol.md, "Size messages")
DIR_ENTRY = 16  #: bytes per table entry of a request's directory (docs/protocol.md, "Body")
NO_TABLE = 0xFFFF  #: ``table_id`` of a header that names no table (every header but a per-table ERROR)
DEFAULT_MTU = 1500  #: bytes of IPv4 datagram
MAX_FRAGS = 256  #: fragments of one message at most; receivers drop more as ``too_many_frags``
NACK_LEN = MAX_FRAGS // 8  #: body bytes of an UPDATE_NACK: a bitmap of the fragments held

#: (name, offset, size) of every header field, network byte order.
HEADER_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("magic", 0, 2),
    ("version", 2, 1),
    ("msg_type", 3, 1),
    ("flags", 4, 1),
    ("reserved0", 5, 1),
    ("status", 6, 2),
    ("msg_id", 8, 4),
    ("client_id", 12, 2),
    ("shard_id", 14, 2),
    ("num_tables", 16, 2),
    ("table_id", 18, 2),
    ("num_keys", 20, 4),
    ("value_len", 24, 4),
    ("msg_len", 28, 4),
    ("frag_offset", 32, 4),
    ("frag_index", 36, 2),
    ("frag_count", 38, 2),
    ("frag_len", 40, 2),
    ("reserved", 42, 2),
)
#: header field name -> its position in :data:`HEADER_FIELDS`: the field's column in an ``(n,
#: len(HEADER_FIELDS))`` array of n decoded headers (the shard's batch intake, its C intake)
HEADER_COLUMN: dict[str, int] = {f[0]: i for i, f in enumerate(HEADER_FIELDS)}
#: header fields equal in every fragment of one message (``flags`` may differ: a retransmission's
#: fragments mix with the original's)
MESSAGE_FIELDS = ("msg_type", "status", "msg_id", "client_id", "shard_id", "num_tables", "table_id",
                  "num_keys", "value_len", "msg_len", "frag_count")


class MsgType(enum.IntEnum):
    LOOKUP_REQ = 1
    LOOKUP_REPLY = 2
    UPDATE_REQ = 3
    UPDATE_ACK = 4
    ERROR = 5
    SIZE_REQ = 6  #: fixed-length mode: the sizes of the data messages that follow
    SIZE_ACK = 7  #: the shard sized its buffers; the data may come
    UPDATE_NACK = 8  #: the fragments of an update a shard holds, asked for by a re-sent fragment


REQUEST_TYPES = frozenset({MsgType.LOOKUP_REQ, MsgType.UPDATE_REQ, MsgType.SIZE_REQ})
REPLY_TYPES = frozenset({MsgType.LOOKUP_REPLY, MsgType.UPDATE_ACK, MsgType.ERROR, MsgType.SIZE_ACK,
                         MsgType.UPDATE_NACK})
#: request type -> the reply types that answer it (ERROR answers any request)
ANSWERS = {MsgType.LOOKUP_REQ: frozenset({MsgType.LOOKUP_REPLY, MsgType.ERROR}),
           MsgType.UPDATE_REQ: frozenset({MsgType.UPDATE_ACK, MsgType.ERROR, MsgType.UPDATE_NACK}),
           MsgType.SIZE_REQ: frozenset({MsgType.SIZE_ACK, MsgType.ERROR})}
#: request types that carry ids (data); a SIZE_REQ announces these
DATA_REQUEST_TYPES = frozenset({MsgType.LOOKUP_REQ, MsgType.UPDATE_REQ})
#: one SIZE_REQ entry as a numpy structured dtype (little-endian, like every body)
SIZE_ENTRY_FIELDS = (("msg_id", "<u4"), ("msg_type", "u1"), ("reserved", "u1"), ("num_tables", "<u2"),
                     ("num_keys", "<u4"), ("msg_len", "<u4"))
#: one directory entry of a LOOKUP_REQ / UPDATE_REQ body as a numpy structured dtype
#: (little-endian, like every body): the table, its row shape and how many of the keys are its
DIR_ENTRY_FIELDS = (("table_id", "<u2"), ("dim", "<u2"), ("dtype", "u1"), ("reserved0", "u1"),
                    ("reserved1", "<u2"), ("num_keys", "<u4"), ("reserved2", "<u4"))


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
    #: the shard cannot store the update now (its disk tier's file system is full); nothing of it
    #: was applied or remembered: the same message may be sent again later (docs/protocol.md)
    STORE_FULL = 8


#: drop reasons every receiver counts (docs/protocol.md, "Validity")
DROP_REASONS = (
    "too_short",
    "bad_magic",
    "bad_version",
    "bad_type",
    "bad_length",
    "frag_mismatch",
    "too_many_frags",
    "too_large",
)


# ---- what a reader needs of each field: meanings, value names, body layout -----------------
# Data beside HEADER_FIELDS (not a second copy of the layout): the generated Wireshark dissector
# (embnic.control.wireshark, `embnic dissector`) takes every header field's offset and size from
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
                         "or a reply (lookup reply, update ack, error, size ack, update nack)", values=MsgType,
                         drop_reason="bad_type"),
    "flags": FieldDoc("Flags", "bit 0 RETRANSMIT: a re-send of a message already sent once", values=Flags,
                      hex=True, summary="flags"),
    "reserved0": FieldDoc("Reserved", "0 on send, ignored on receive", hex=True),
    "status": FieldDoc("Status", "error code of an ERROR reply; 0 in requests", values=Status,
                       summary="status"),
    "msg_id": FieldDoc("Message id", "chosen by the client from its id clock (client_lib/msgid.py): never "
                       "used twice by one client within ~71 min, runs of a client included; a reply carries "
                       "its request's", summary="id"),
    "client_id": FieldDoc("Client id", "the client that sent the request (the card routes replies by it)",
                          summary="client"),
    "shard_id": FieldDoc("Shard id", "target address: the shard a request is for, the shard that answers "
                         "a reply", summary="shard"),
    "num_tables": FieldDoc("Number of tables", "tables in the request's directory (0 in a SIZE_REQ); "
                           "copied into replies", summary="tables"),
    "table_id": FieldDoc("Table id", "the table an ERROR is about; 0xFFFF (no table) in every other header",
                         hex=True),
    "num_keys": FieldDoc("Number of keys", "keys in the message, all tables together (SIZE_REQ: entries)",
                         summary="keys"),
    "value_len": FieldDoc("Value length", "bytes of row values: of the rows a lookup asks for (its reply's "
                          "length), of a lookup reply, of an update's gradients"),
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

    Exactly one of ``numpy``, ``fields``, ``values_of``, ``bits`` says what it is.

    Attributes:
        numpy: numpy dtype string of a fixed-size scalar (``"<u8"`` for a key), else ``None``.
        fields: ``(name, numpy dtype)`` of a structured element (a directory entry, a SIZE_REQ
            entry), else ``()``; a field's title and value names are ``docs[name]``, else the
            :data:`FIELD_DOCS` entry of the header field of that name.
        docs: :class:`FieldDoc` of the fields of a structured element that are not header fields
            (or mean something else here).
        table_of: the field of a structured element that names a table: its elements are the
            request's **directory**, one per table, in body order; ``None`` otherwise.
        values_of: for a row (or gradient), the fields ``(count, dtype)`` of its table's
            directory entry that make it ``count`` values of ``dtype`` (:data:`DTYPE_SIZE` bytes
            each), else ``None``.
        bits: for a bit set, its number of bits (bit ``i`` is bit ``i % 8`` of byte ``i // 8``;
            a reader shows the indices of the set bits), else 0.
    """

    numpy: str | None = None
    fields: tuple[tuple[str, str], ...] = ()
    docs: dict[str, FieldDoc] = dataclasses.field(default_factory=dict)
    table_of: str | None = None
    values_of: tuple[str, str] | None = None
    bits: int = 0


#: element kind -> :class:`BodyElement`
BODY_ELEMENTS: dict[str, BodyElement] = {
    "key": BodyElement(numpy="<u8"),
    "dir_entry": BodyElement(fields=DIR_ENTRY_FIELDS, table_of="table_id", docs={
        "table_id": FieldDoc("Table id", "the table"),
        "dim": FieldDoc("Dimension", "values per row of this table"),
        "dtype": FieldDoc("Dtype", "type of this table's values: 1 fp32, 2 fp16", values=DType),
        "reserved0": FieldDoc("Reserved", "0", hex=True),
        "reserved1": FieldDoc("Reserved", "0", hex=True),
        "num_keys": FieldDoc("Number of keys", "this table's keys in the message (n_t >= 1)"),
        "reserved2": FieldDoc("Reserved", "0", hex=True),
    }),
    "size_entry": BodyElement(fields=SIZE_ENTRY_FIELDS),
    "nack_bitmap": BodyElement(bits=MAX_FRAGS),
    "value": BodyElement(values_of=("dim", "dtype")),
}


@dataclasses.dataclass(frozen=True)
class BodySection:
    """A run of elements of one kind; a body is its type's sections, back to back.

    Attributes:
        name: the section ("keys", "gradients"); ``item`` names one element ("key", "gradient").
        element: a :data:`BODY_ELEMENTS` kind.
        count: the header field that gives the number of elements, or a fixed number; ``None``
            for a section of rows, whose length in bytes ``nbytes`` gives.
        nbytes: the header field that gives the section's length in bytes (rows, whose size is
            their table's), else ``None``.
        per_table: the directory-entry field that says how many of the section's elements are
            each table's (``"num_keys"``): the section is grouped by table, in directory order
            (a reply's by its request's directory); ``None``: not grouped.
    """

    name: str
    item: str
    element: str
    count: str | int | None = None
    nbytes: str | None = None
    per_table: str | None = None


#: message type -> the sections of its body, in order (docs/protocol.md, "Body", "Size messages"
#: and UPDATE_NACK); a type with none has an empty body. ``expected_msg_len`` is their total
#: length (a test keeps them equal).
BODY_LAYOUT: dict[MsgType, tuple[BodySection, ...]] = {
    MsgType.LOOKUP_REQ: (BodySection("directory", "table", "dir_entry", count="num_tables"),
                         BodySection("keys", "key", "key", count="num_keys", per_table="num_keys")),
    MsgType.LOOKUP_REPLY: (BodySection("rows", "row", "value", nbytes="value_len", per_table="num_keys"),),
    MsgType.UPDATE_REQ: (BodySection("directory", "table", "dir_entry", count="num_tables"),
                         BodySection("keys", "key", "key", count="num_keys", per_table="num_keys"),
                         BodySection("gradients", "gradient", "value", nbytes="value_len", per_table="num_keys")),
    MsgType.UPDATE_ACK: (),
    MsgType.ERROR: (),
    MsgType.SIZE_REQ: (BodySection("entries", "entry", "size_entry", count="num_keys"),),
    MsgType.SIZE_ACK: (),
    MsgType.UPDATE_NACK: (BodySection("fragments held", "held", "nack_bitmap", count=1),),
}

#: what :func:`header_counts_ok` checks, as data for every reader (the dissector too): message
#: type -> rules ``(field, op, k, other)``, each true when
#: ``h[field] op k * h[other]`` (``other`` ``None``: ``h[field] op k``), ``op`` ``">="`` or
#: ``"=="``; a type not listed has no rule.
HEADER_COUNT_RULES: dict[MsgType, tuple[tuple[str, str, int, str | None], ...]] = {
    **{t: (("num_tables", ">=", 1, None), ("num_keys", ">=", 1, "num_tables"),
           ("value_len", ">=", min(DTYPE_SIZE[DType.FP32], DTYPE_SIZE[DType.FP16]), "num_keys"))
       for t in (MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY, MsgType.UPDATE_REQ)},
    MsgType.SIZE_REQ: (("num_tables", "==", 0, None), ("num_keys", ">=", 1, None)),
}


def max_body_per_frame(mtu: int) -> int:
    """Largest body fragment (bytes) that fits one IPv4 datagram of ``mtu`` bytes.

    ``P = mtu - 20 (IPv4) - 8 (UDP) - 44 (embnic)``; MTU 1500 gives 1428.

    Raises:
        ValueError: if the MTU leaves no room for a body byte.
    """
    p = int(mtu) - IPV4_HDR_LEN - UDP_HDR_LEN - HDR_LEN
    if p <= 0 or p > 0xFFFF:
        raise ValueError(f"MTU {mtu} leaves {p} body bytes per frame; use an MTU in "
                         f"{IPV4_HDR_LEN + UDP_HDR_LEN + HDR_LEN + 1}..65535")
    return p


def esize(dtype: int) -> int:
    """Bytes per value of embnic ``dtype`` (fp32 4, fp16 2, anything else 0)."""
    return DTYPE_SIZE.get(dtype, 0) if dtype in (0, 1, 2) else 0


def expected_msg_len(msg_type: int, num_tables: int, num_keys: int, value_len: int) -> int:
    """Body length (bytes) a message of this type must have, from its header alone
    (docs/protocol.md, "Body") — the one rule every card and host checks:

    - ``LOOKUP_REQ``: ``16·T + 8·n`` (directory, keys); ``value_len`` announces the reply's rows;
    - ``LOOKUP_REPLY``: ``value_len`` (the rows);
    - ``UPDATE_REQ``: ``16·T + 8·n + value_len`` (directory, keys, gradients);
    - ``SIZE_REQ``: ``16·n`` (``n`` entries);
    - ``UPDATE_NACK``: 32 (a bitmap of :data:`MAX_FRAGS` bits);
    - ``UPDATE_ACK``, ``ERROR``, ``SIZE_ACK``: 0.

    ``T`` = ``num_tables``, ``n`` = ``num_keys``. Python ints: no overflow (a card computes it in
    64 bits).
    """
    per_table, per_key, values, fixed = _BODY_LEN.get(msg_type, (0, 0, 0, 0))
    return per_table * num_tables + per_key * num_keys + values * value_len + fixed


#: :func:`expected_msg_len` of each type: bytes per table, per key, per ``value_len`` byte, fixed
_BODY_LEN = {MsgType.LOOKUP_REQ: (DIR_ENTRY, KEY_SIZE, 0, 0), MsgType.LOOKUP_REPLY: (0, 0, 1, 0),
             MsgType.UPDATE_REQ: (DIR_ENTRY, KEY_SIZE, 1, 0), MsgType.SIZE_REQ: (0, SIZE_ENTRY, 0, 0),
             MsgType.UPDATE_NACK: (0, 0, 0, NACK_LEN)}


def header_counts_ok(msg_type: int, num_tables: int, num_keys: int, value_len: int) -> bool:
    """The header's counts fit its type (docs/protocol.md, "Validity", ``bad_length``): every rule
    of :data:`HEADER_COUNT_RULES` holds — a data request or lookup reply has ``T ≥ 1`` tables,
    ``n ≥ T`` keys and ``value_len ≥ 2n``; a SIZE_REQ has ``T = 0`` and ``n ≥ 1`` entries; other
    types carry no body (their counts are copies, unchecked)."""
    h = {"num_tables": num_tables, "num_keys": num_keys, "value_len": value_len}
    return all(h[f] >= k * (h[o] if o else 1) if op == ">=" else h[f] == k * (h[o] if o else 1)
               for f, op, k, o in HEADER_COUNT_RULES.get(msg_type, ()))
