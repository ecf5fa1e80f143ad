"""Protocol constants of the embnic wire protocol v2, defined once.

Source of truth: ``docs/protocol.md``. The Scapy layer, the fast codec and the C header
(``dataplane/include/embnic_proto.h``, through the binary's build info) are checked against
:data:`HEADER_FIELDS` by tests.
"""
from __future__ import annotations

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
    if msg_type == MsgType.LOOKUP_REQ:
        return DIR_ENTRY * num_tables + KEY_SIZE * num_keys
    if msg_type == MsgType.LOOKUP_REPLY:
        return value_len
    if msg_type == MsgType.UPDATE_REQ:
        return DIR_ENTRY * num_tables + KEY_SIZE * num_keys + value_len
    if msg_type == MsgType.SIZE_REQ:
        return SIZE_ENTRY * num_keys
    if msg_type == MsgType.UPDATE_NACK:
        return NACK_LEN
    return 0


def header_counts_ok(msg_type: int, num_tables: int, num_keys: int, value_len: int) -> bool:
    """The header's counts fit its type (docs/protocol.md, "Validity", ``bad_length``): a data
    request or lookup reply has ``T ≥ 1`` tables, ``n ≥ T`` keys (each table at least one) and
    ``value_len ≥ 2n`` (every row at least one fp16 value); a SIZE_REQ has ``T = 0`` and ``n ≥ 1``
    entries; UPDATE_ACK, ERROR and SIZE_ACK carry no body (their counts are copies, unchecked)."""
    if msg_type in (MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY, MsgType.UPDATE_REQ):
        return num_tables >= 1 and num_keys >= num_tables and value_len >= 2 * num_keys
    if msg_type == MsgType.SIZE_REQ:
        return num_tables == 0 and num_keys >= 1
    return True
