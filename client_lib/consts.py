"""Protocol constants of the embnic wire protocol v1, defined once.

Source of truth: ``docs/protocol.md``. The Scapy layer, the fast codec and the C header
(``dataplane/include/embnic_proto.h``, through the binary's build info) are checked against
:data:`HEADER_FIELDS` by tests.
"""
from __future__ import annotations

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
