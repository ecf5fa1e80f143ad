"""Fast codec for embnic v1 frames: numpy/struct, no Scapy on the hot path.

Builds and parses the same bytes as the Scapy layer :class:`embnic.client_lib.protocol.Embnic`
(tests/client_lib/test_codec.py proves it with hypothesis). Spec: ``docs/protocol.md``.

Everything here works on **UDP payloads** (embnic header + body fragment); the kernel's UDP
socket or Scapy adds Ethernet/IPv4/UDP.
"""
from __future__ import annotations

import math
import struct
from typing import NamedTuple

import numpy as np

from . import consts
from .consts import DType, MsgType

#: the 40-byte header as a numpy structured dtype, big-endian (network byte order)
HEADER_DTYPE = np.dtype([
    ("magic", ">u2"), ("version", "u1"), ("msg_type", "u1"),
    ("flags", "u1"), ("dtype", "u1"), ("status", ">u2"),
    ("msg_id", ">u4"),
    ("client_id", ">u2"), ("table_id", ">u2"),
    ("shard_id", ">u2"), ("dim", ">u2"),
    ("num_keys", ">u4"),
    ("msg_len", ">u4"),
    ("frag_offset", ">u4"),
    ("frag_index", ">u2"), ("frag_count", ">u2"),
    ("frag_len", ">u2"), ("reserved", ">u2"),
])
assert HEADER_DTYPE.itemsize == consts.HDR_LEN
assert [(n, HEADER_DTYPE.fields[n][1], HEADER_DTYPE.fields[n][0].itemsize) for n in HEADER_DTYPE.names] \
    == list(consts.HEADER_FIELDS)

_HDR = struct.Struct("!HBBBBHIHHHHIIIHHHH")
assert _HDR.size == consts.HDR_LEN

KEY_DTYPE = np.dtype("<u8")  #: keys in bodies: uint64 little-endian


class Header(NamedTuple):
    """A decoded embnic header; fields as in :data:`embnic.client_lib.consts.HEADER_FIELDS`."""

    magic: int
    version: int
    msg_type: int
    flags: int
    dtype: int
    status: int
    msg_id: int
    client_id: int
    table_id: int
    shard_id: int
    dim: int
    num_keys: int
    msg_len: int
    frag_offset: int
    frag_index: int
    frag_count: int
    frag_len: int
    reserved: int

    def pack(self) -> bytes:
        """The 40 header bytes."""
        return _HDR.pack(*self)


class FrameError(ValueError):
    """A frame failed validation; ``reason`` is one of :data:`consts.DROP_REASONS`."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)


def unpack_header(payload: bytes | bytearray | memoryview) -> Header:
    """Decode the 40 header bytes without any validation.

    Raises:
        FrameError: ``too_short`` if fewer than 40 bytes.
    """
    if len(payload) < consts.HDR_LEN:
        raise FrameError("too_short", f"{len(payload)} bytes < {consts.HDR_LEN}")
    return Header._make(_HDR.unpack_from(payload))


def parse_header(payload: bytes | bytearray | memoryview, *, expect: str | None = None) -> Header:
    """Decode and validate the header of one UDP payload (docs/protocol.md, "Validity").

    Args:
        payload: embnic header + body fragment (bytes).
        expect: ``"request"`` (types 1, 3, 6), ``"reply"`` (types 2, 4, 5, 7) or ``None`` (any).

    Returns:
        the :class:`Header`.

    Raises:
        FrameError: reason ``too_short``, ``bad_magic``, ``bad_version``, ``bad_type``,
            ``bad_dtype``, ``bad_length`` or ``too_many_frags`` (``frag_count`` >
            :data:`consts.MAX_FRAGS`).
    """
    n = len(payload)
    if n < consts.HDR_LEN:
        raise FrameError("too_short", f"{n} bytes < {consts.HDR_LEN}")
    h = Header._make(_HDR.unpack_from(payload))
    if h.magic != consts.MAGIC:
        raise FrameError("bad_magic", f"0x{h.magic:04x}")
    if h.version != consts.VERSION:
        raise FrameError("bad_version", str(h.version))
    t = h.msg_type
    if not 1 <= t <= len(MsgType):
        raise FrameError("bad_type", str(t))
    if expect == "request" and t not in consts.REQUEST_TYPES:
        raise FrameError("bad_type", f"{MsgType(t).name} where a request is expected")
    if expect == "reply" and t not in consts.REPLY_TYPES:
        raise FrameError("bad_type", f"{MsgType(t).name} where a reply is expected")
    if h.dtype > 2 or (h.dtype == 0 and t in (MsgType.LOOKUP_REPLY, MsgType.UPDATE_REQ)):
        raise FrameError("bad_dtype", str(h.dtype))
    if h.frag_len != n - consts.HDR_LEN:
        raise FrameError("bad_length", f"frag_len {h.frag_len} != {n - consts.HDR_LEN} body bytes")
    if h.frag_count == 0 or h.frag_index >= h.frag_count:
        raise FrameError("bad_length", f"frag {h.frag_index}/{h.frag_count}")
    if h.frag_offset + h.frag_len > h.msg_len:
        raise FrameError("bad_length", f"frag_offset+frag_len {h.frag_offset + h.frag_len} > msg_len {h.msg_len}")
    if h.msg_len != consts.expected_msg_len(t, h.num_keys, h.dim, h.dtype):
        raise FrameError("bad_length", f"msg_len {h.msg_len} does not fit {h.num_keys} keys of dim {h.dim}")
    if h.num_keys == 0 and t in (MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY, MsgType.UPDATE_REQ, MsgType.SIZE_REQ):
        raise FrameError("bad_length", "num_keys 0")
    if h.frag_count > consts.MAX_FRAGS:
        raise FrameError("too_many_frags", f"frag_count {h.frag_count} > {consts.MAX_FRAGS}")
    return h


def frag_geometry(msg_len: int, mtu: int) -> tuple[int, int]:
    """(body bytes per fragment P, fragment count) for a body of ``msg_len`` bytes at ``mtu``."""
    p = consts.max_body_per_frame(mtu)
    return p, max(1, math.ceil(msg_len / p))


def encode_message(
    msg_type: int,
    *,
    msg_id: int,
    client_id: int,
    table_id: int = 0,
    shard_id: int = 0,
    dim: int = 0,
    dtype: int = DType.FP32,
    num_keys: int = 0,
    body: bytes | bytearray | memoryview = b"",
    mtu: int = consts.DEFAULT_MTU,
    flags: int = 0,
    status: int = 0,
) -> list[bytes]:
    """Build the UDP payloads (one per fragment) of one message.

    The body is cut at ``P = mtu - 68`` bytes (docs/protocol.md, "Fragmentation"); every
    fragment carries the full header. No validation (see :func:`parse_header`).

    Returns:
        list of ``frag_count`` byte strings, each ``40 + frag_len`` bytes.

    Raises:
        ValueError: MTU too small, or the message needs more than :data:`consts.MAX_FRAGS`
            fragments (split it into several messages: :func:`consts.max_keys_per_message`).
    """
    body = memoryview(body).cast("B")
    msg_len = len(body)
    p, count = frag_geometry(msg_len, mtu)
    if count > consts.MAX_FRAGS:
        raise ValueError(f"message of {msg_len} bytes needs {count} fragments at MTU {mtu} "
                         f"(max {consts.MAX_FRAGS}): split it into several messages")
    if count == 1:
        return [_HDR.pack(consts.MAGIC, consts.VERSION, msg_type, flags, dtype, status, msg_id, client_id,
                          table_id, shard_id, dim, num_keys, msg_len, 0, 0, 1, msg_len, 0) + body]
    hdrs = np.zeros(count, HEADER_DTYPE)
    hdrs["magic"] = consts.MAGIC
    hdrs["version"] = consts.VERSION
    hdrs["msg_type"] = msg_type
    hdrs["flags"] = flags
    hdrs["dtype"] = dtype
    hdrs["status"] = status
    hdrs["msg_id"] = msg_id
    hdrs["client_id"] = client_id
    hdrs["table_id"] = table_id
    hdrs["shard_id"] = shard_id
    hdrs["dim"] = dim
    hdrs["num_keys"] = num_keys
    hdrs["msg_len"] = msg_len
    idx = np.arange(count, dtype=np.int64)
    offs = idx * p
    hdrs["frag_offset"] = offs
    hdrs["frag_index"] = idx
    hdrs["frag_count"] = count
    lens = np.full(count, p, dtype=np.int64)
    lens[-1] = msg_len - offs[-1]
    hdrs["frag_len"] = lens
    hb = hdrs.tobytes()
    H = consts.HDR_LEN
    return [hb[i * H:(i + 1) * H] + body[i * p:i * p + p] for i in range(count)]


# ---- bodies (little-endian, docs/protocol.md "Body") ---------------------------------------

def value_dtype(dtype: int) -> np.dtype:
    """numpy dtype of row values on the wire for embnic ``dtype`` (1 → ``<f4``, 2 → ``<f2``)."""
    return np.dtype(consts.DTYPE_NUMPY[DType(dtype)])


def keys_to_body(keys: np.ndarray) -> bytes:
    """Body of a LOOKUP_REQ: ``keys`` uint64 (N,) → 8N bytes little-endian."""
    return np.ascontiguousarray(keys, dtype=KEY_DTYPE).tobytes()


def rows_to_body(rows: np.ndarray, dtype: int = DType.FP32) -> bytes:
    """Body of a LOOKUP_REPLY: rows (N, dim) → N·dim·esize bytes little-endian, row-major."""
    return np.ascontiguousarray(rows, dtype=value_dtype(dtype)).tobytes()


def update_to_body(keys: np.ndarray, grads: np.ndarray, dtype: int = DType.FP32) -> bytes:
    """Body of an UPDATE_REQ: keys uint64 (N,) then grads (N, dim) of ``dtype``."""
    return keys_to_body(keys) + rows_to_body(grads, dtype)


def body_to_keys(body: bytes | memoryview, num_keys: int) -> np.ndarray:
    """Keys of a LOOKUP_REQ body → uint64 (num_keys,) (a read-only view, no copy)."""
    return np.frombuffer(body, dtype=KEY_DTYPE, count=num_keys)


def body_to_rows(body: bytes | memoryview, num_keys: int, dim: int, dtype: int = DType.FP32,
                 offset: int = 0) -> np.ndarray:
    """Rows of a LOOKUP_REPLY body → (num_keys, dim) of the wire dtype (a view, no copy)."""
    return np.frombuffer(body, dtype=value_dtype(dtype), count=num_keys * dim, offset=offset).reshape(num_keys, dim)


def split_update_body(body: bytes | memoryview, num_keys: int, dim: int,
                      dtype: int = DType.FP32) -> tuple[np.ndarray, np.ndarray]:
    """UPDATE_REQ body → (keys uint64 (N,), grads (N, dim) of the wire dtype), views."""
    keys = body_to_keys(body, num_keys)
    grads = body_to_rows(body, num_keys, dim, dtype, offset=num_keys * consts.KEY_SIZE)
    return keys, grads


def encode_lookup(*, msg_id: int, client_id: int, table_id: int, shard_id: int, dim: int, dtype: int,
                  keys: np.ndarray, mtu: int = consts.DEFAULT_MTU, flags: int = 0) -> list[bytes]:
    """UDP payloads of a LOOKUP_REQ for ``keys`` uint64 (N,)."""
    return encode_message(MsgType.LOOKUP_REQ, msg_id=msg_id, client_id=client_id, table_id=table_id,
                          shard_id=shard_id, dim=dim, dtype=dtype, num_keys=len(keys),
                          body=keys_to_body(keys), mtu=mtu, flags=flags)


def encode_update(*, msg_id: int, client_id: int, table_id: int, shard_id: int, dtype: int,
                  keys: np.ndarray, grads: np.ndarray, mtu: int = consts.DEFAULT_MTU,
                  flags: int = 0) -> list[bytes]:
    """UDP payloads of an UPDATE_REQ: keys uint64 (N,), grads (N, dim)."""
    return encode_message(MsgType.UPDATE_REQ, msg_id=msg_id, client_id=client_id, table_id=table_id,
                          shard_id=shard_id, dim=grads.shape[1], dtype=dtype, num_keys=len(keys),
                          body=update_to_body(keys, grads, dtype), mtu=mtu, flags=flags)


#: a SIZE_REQ entry (docs/protocol.md, "Size messages"), little-endian like every body
SIZE_ENTRY_DTYPE = np.dtype(list(consts.SIZE_ENTRY_FIELDS))
assert SIZE_ENTRY_DTYPE.itemsize == consts.SIZE_ENTRY


def encode_size(*, msg_id: int, client_id: int, shard_id: int, entries: np.ndarray,
                mtu: int = consts.DEFAULT_MTU, flags: int = 0) -> list[bytes]:
    """UDP payloads of a SIZE_REQ announcing ``entries`` (:data:`SIZE_ENTRY_DTYPE` (E,), E ≥ 1:
    ``msg_id``, ``msg_type``, ``dtype``, ``table_id``, ``num_keys``, ``msg_len`` of every data
    message that follows to ``shard_id``). ``table_id`` 0, ``dim`` 0, ``dtype`` none in the header.

    Raises:
        ValueError: ``entries`` is empty or not of :data:`SIZE_ENTRY_DTYPE`.
    """
    entries = np.asarray(entries)
    if entries.dtype != SIZE_ENTRY_DTYPE or entries.ndim != 1 or len(entries) == 0:
        raise ValueError(f"SIZE_REQ entries must be a non-empty 1-D array of {SIZE_ENTRY_DTYPE}")
    return encode_message(MsgType.SIZE_REQ, msg_id=msg_id, client_id=client_id, table_id=0,
                          shard_id=shard_id, dim=0, dtype=DType.NONE, num_keys=len(entries),
                          body=entries.tobytes(), mtu=mtu, flags=flags)


def body_to_size_entries(body: bytes | memoryview, num_entries: int) -> np.ndarray:
    """SIZE_REQ body → :data:`SIZE_ENTRY_DTYPE` (E,) view."""
    return np.frombuffer(body, dtype=SIZE_ENTRY_DTYPE, count=num_entries)


def encode_reply(request: Header, msg_type: int, *, shard_id: int, body: bytes = b"",
                 status: int = 0, mtu: int = consts.DEFAULT_MTU) -> list[bytes]:
    """UDP payloads of a reply to ``request``: msg_id, client_id, table_id, num_keys, dim and
    dtype are copied from the request (docs/protocol.md, "Message types")."""
    return encode_message(msg_type, msg_id=request.msg_id, client_id=request.client_id,
                          table_id=request.table_id, shard_id=shard_id, dim=request.dim,
                          dtype=request.dtype, num_keys=request.num_keys, body=body, mtu=mtu,
                          status=status)
