"""Fast codec for embnic frames (protocol v2): numpy/struct, no Scapy on the hot path.

Builds and parses the same bytes as the Scapy layer :class:`embnic.client_lib.protocol.Embnic`
(tests/client_lib/test_codec.py proves it with hypothesis). Spec: ``docs/protocol.md``.

Everything here works on **UDP payloads** (embnic header + body fragment); the kernel's UDP
socket or Scapy adds Ethernet/IPv4/UDP.
"""
from __future__ import annotations

import collections
import math
import struct
from typing import NamedTuple

import numpy as np

from . import consts
from .consts import DType, MsgType

#: the 44-byte header as a numpy structured dtype, big-endian (network byte order), and as a
#: struct: both from :data:`consts.HEADER_FIELDS`
HEADER_DTYPE = np.dtype([(n, f">u{size}") for n, _, size in consts.HEADER_FIELDS])
assert [HEADER_DTYPE.fields[n][1] for n in HEADER_DTYPE.names] == [o for _, o, _ in consts.HEADER_FIELDS]
assert HEADER_DTYPE.itemsize == consts.HDR_LEN
_HDR = struct.Struct("!" + "".join({1: "B", 2: "H", 4: "I"}[size] for _, _, size in consts.HEADER_FIELDS))

KEY_DTYPE = np.dtype("<u8")  #: keys in bodies: uint64 little-endian
#: a request's directory entry (docs/protocol.md, "Body"), little-endian like every body
DIR_DTYPE = np.dtype(list(consts.DIR_ENTRY_FIELDS))
assert DIR_DTYPE.itemsize == consts.DIR_ENTRY


class Header(collections.namedtuple("Header", [n for n, _, _ in consts.HEADER_FIELDS])):
    """A decoded embnic header: one int per field of :data:`embnic.client_lib.consts.HEADER_FIELDS`,
    in its order (``magic``, ``version``, ``msg_type``, ...)."""

    __slots__ = ()

    def pack(self) -> bytes:
        """The 44 header bytes."""
        return _HDR.pack(*self)


_EXPECT = {"request": consts.REQUEST_TYPES, "reply": consts.REPLY_TYPES}  #: parse_header's ``expect``


class FrameError(ValueError):
    """A frame failed validation; ``reason`` is one of :data:`consts.DROP_REASONS`."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)


def unpack_header(payload: bytes | bytearray | memoryview) -> Header:
    """Decode the 44 header bytes without any validation.

    Raises:
        FrameError: ``too_short`` if fewer than 44 bytes.
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
        FrameError: reason ``too_short``, ``bad_magic``, ``bad_version`` (a version-1 frame
            too), ``bad_type``, ``bad_length`` (the fragment does not fit its frame or its
            message, or ``msg_len`` is not :func:`consts.expected_msg_len` of the header's
            counts, or the counts do not fit the type: :func:`consts.header_counts_ok`) or
            ``too_many_frags`` (``frag_count`` > :data:`consts.MAX_FRAGS`).
    """
    n, h = len(payload), unpack_header(payload)
    if h.magic != consts.MAGIC:
        raise FrameError("bad_magic", f"0x{h.magic:04x}")
    if h.version != consts.VERSION:
        raise FrameError("bad_version", str(h.version))
    t = h.msg_type
    if not 1 <= t <= len(MsgType):
        raise FrameError("bad_type", str(t))
    if expect in _EXPECT and t not in _EXPECT[expect]:
        raise FrameError("bad_type", f"{MsgType(t).name} where a {expect} is expected")
    if h.frag_len != n - consts.HDR_LEN:
        raise FrameError("bad_length", f"frag_len {h.frag_len} != {n - consts.HDR_LEN} body bytes")
    if h.frag_count == 0 or h.frag_index >= h.frag_count:
        raise FrameError("bad_length", f"frag {h.frag_index}/{h.frag_count}")
    if h.frag_offset + h.frag_len > h.msg_len:
        raise FrameError("bad_length", f"frag_offset+frag_len {h.frag_offset + h.frag_len} > msg_len {h.msg_len}")
    if h.msg_len != consts.expected_msg_len(t, h.num_tables, h.num_keys, h.value_len):
        raise FrameError("bad_length", f"msg_len {h.msg_len} does not fit {h.num_tables} tables, {h.num_keys} "
                                       f"keys, value_len {h.value_len} of a {MsgType(t).name}")
    if not consts.header_counts_ok(t, h.num_tables, h.num_keys, h.value_len):
        raise FrameError("bad_length", f"{h.num_tables} tables, {h.num_keys} keys, value_len {h.value_len} "
                                       f"do not fit a {MsgType(t).name}")
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
    shard_id: int = 0,
    num_tables: int = 0,
    table_id: int = consts.NO_TABLE,
    num_keys: int = 0,
    value_len: int = 0,
    body: bytes | bytearray | memoryview = b"",
    mtu: int = consts.DEFAULT_MTU,
    flags: int = 0,
    status: int = 0,
) -> list[bytes]:
    """Build the UDP payloads (one per fragment) of one message.

    The body is cut at ``P = mtu - 72`` bytes (docs/protocol.md, "Fragmentation"); every
    fragment carries the full header. No validation (see :func:`parse_header`).

    Returns:
        list of ``frag_count`` byte strings, each ``44 + frag_len`` bytes.

    Raises:
        ValueError: MTU too small, or the message needs more than :data:`consts.MAX_FRAGS`
            fragments (split it into several messages).
    """
    body = memoryview(body).cast("B")
    msg_len = len(body)
    p, count = frag_geometry(msg_len, mtu)
    if count > consts.MAX_FRAGS:
        raise ValueError(f"message of {msg_len} bytes needs {count} fragments at MTU {mtu} "
                         f"(max {consts.MAX_FRAGS}): split it into several messages")
    hdr = _HDR.pack(consts.MAGIC, consts.VERSION, msg_type, flags, 0, status, msg_id, client_id, shard_id,
                    num_tables, table_id, num_keys, value_len, msg_len, 0, 0, count, min(msg_len, p), 0)
    if count == 1:
        return [hdr + body]
    hdrs = np.frombuffer(bytearray(hdr * count), HEADER_DTYPE)  # fragment 0's header, then each one's fields
    idx = np.arange(count, dtype=np.int64)
    hdrs["frag_offset"] = idx * p
    hdrs["frag_index"] = idx
    hdrs["frag_len"][-1] = msg_len - (count - 1) * p
    hb = hdrs.tobytes()
    H = consts.HDR_LEN
    return [hb[i * H:(i + 1) * H] + body[i * p:i * p + p] for i in range(count)]


# ---- bodies (little-endian, docs/protocol.md "Body") ---------------------------------------

def value_dtype(dtype: int) -> np.dtype:
    """numpy dtype of row values on the wire for embnic ``dtype`` (1 → ``<f4``, 2 → ``<f2``)."""
    return np.dtype(consts.DTYPE_NUMPY[DType(dtype)])


def keys_to_body(keys: np.ndarray) -> bytes:
    """Keys as body bytes: uint64 (N,) → 8N bytes little-endian."""
    return np.ascontiguousarray(keys, dtype=KEY_DTYPE).tobytes()


def rows_to_body(rows: np.ndarray, dtype: int = DType.FP32) -> bytes:
    """Rows (N, dim) of one table as body bytes: N·dim·esize bytes little-endian, row-major."""
    return np.ascontiguousarray(rows, dtype=value_dtype(dtype)).tobytes()


class DirectoryError(ValueError):
    """A request's directory does not add up (docs/protocol.md, "Body"): ``status`` is the
    :class:`consts.Status` to answer and ``table_id`` the table it names
    (:data:`consts.NO_TABLE` when the fault is the message's, not one table's)."""

    def __init__(self, status: int, table_id: int, detail: str):
        self.status = int(status)
        self.table_id = int(table_id)
        super().__init__(detail)


def make_directory(table_ids, dims, dtypes, counts) -> np.ndarray:
    """A request's directory: :data:`DIR_DTYPE` (T,) from per-table ``table_ids``, ``dims``,
    ``dtypes`` (embnic dtype codes) and key ``counts`` (each array-like (T,), in body order)."""
    d = np.zeros(len(table_ids), DIR_DTYPE)
    d["table_id"] = table_ids
    d["dim"] = dims
    d["dtype"] = dtypes
    d["num_keys"] = counts
    return d


def row_bytes(directory: np.ndarray) -> np.ndarray:
    """Bytes of one row of each table of ``directory`` (:data:`DIR_DTYPE` (T,)) → int64 (T,):
    ``dim · esize(dtype)`` (0 for an unknown dtype)."""
    es = np.array([0, 4, 2], np.int64)
    dt = directory["dtype"].astype(np.int64)
    return directory["dim"].astype(np.int64) * np.where(dt <= 2, es[np.minimum(dt, 2)], 0)


def value_len_of(directory: np.ndarray) -> int:
    """``value_len`` of a message with ``directory``: Σ ``num_keys_t · dim_t · esize_t`` bytes
    (the reply's rows of a lookup, the gradients of an update)."""
    return int((directory["num_keys"].astype(np.int64) * row_bytes(directory)).sum())


def encode_lookup(*, msg_id: int, client_id: int, shard_id: int, directory: np.ndarray,
                  keys: np.ndarray, mtu: int = consts.DEFAULT_MTU, flags: int = 0) -> list[bytes]:
    """UDP payloads of a LOOKUP_REQ: ``directory`` :data:`DIR_DTYPE` (T,), then ``keys`` uint64
    (n,) with n = Σ ``directory["num_keys"]``, table by table in directory order.
    ``value_len`` (the reply's row bytes) is computed from the directory."""
    body = directory.tobytes() + keys_to_body(keys)
    return encode_message(MsgType.LOOKUP_REQ, msg_id=msg_id, client_id=client_id, shard_id=shard_id,
                          num_tables=len(directory), num_keys=len(keys), value_len=value_len_of(directory),
                          body=body, mtu=mtu, flags=flags)


def encode_table_lookup(*, msg_id: int, client_id: int, shard_id: int, table_id: int, dim: int, dtype: int,
                        keys: np.ndarray, mtu: int = consts.DEFAULT_MTU, flags: int = 0) -> list[bytes]:
    """UDP payloads of a LOOKUP_REQ of one table's ``keys`` uint64 (n,): :func:`encode_lookup`
    with a one-entry directory (probes, benchmarks)."""
    return encode_lookup(msg_id=msg_id, client_id=client_id, shard_id=shard_id, keys=keys, mtu=mtu, flags=flags,
                         directory=make_directory([table_id], [dim], [dtype], [len(keys)]))


def encode_update(*, msg_id: int, client_id: int, shard_id: int, directory: np.ndarray,
                  keys: np.ndarray, values: bytes | bytearray | memoryview, mtu: int = consts.DEFAULT_MTU,
                  flags: int = 0) -> list[bytes]:
    """UDP payloads of an UPDATE_REQ: ``directory`` (T,), ``keys`` uint64 (n,), then ``values``:
    each table's gradients (``num_keys_t × dim_t`` of its dtype, little-endian, row-major) one
    table after the other (:func:`values_to_body` builds them).

    Raises:
        ValueError: ``values`` is not :func:`value_len_of` ``directory`` bytes long.
    """
    vl = value_len_of(directory)
    values = memoryview(values).cast("B")
    if len(values) != vl:
        raise ValueError(f"update values are {len(values)} bytes, the directory says {vl}")
    body = b"".join((directory.tobytes(), np.ascontiguousarray(keys, dtype=KEY_DTYPE).tobytes(), values))
    return encode_message(MsgType.UPDATE_REQ, msg_id=msg_id, client_id=client_id, shard_id=shard_id,
                          num_tables=len(directory), num_keys=len(keys), value_len=vl, body=body, mtu=mtu,
                          flags=flags)


def values_to_body(arrays, dtypes) -> bytes:
    """Rows or gradients of several tables as one body section: each array (n_t, dim_t) cast to
    its embnic dtype (little-endian), concatenated in order."""
    return b"".join(rows_to_body(a, d) for a, d in zip(arrays, dtypes))


class RequestBody(NamedTuple):
    """A parsed LOOKUP_REQ / UPDATE_REQ body (views into the body, no copy)."""

    directory: np.ndarray  #: :data:`DIR_DTYPE` (T,)
    keys: np.ndarray  #: uint64 (n,), table by table
    values: memoryview  #: an update's gradients (``value_len`` bytes); empty for a lookup
    key_offsets: np.ndarray  #: int64 (T+1,): table t's keys are ``keys[key_offsets[t]:key_offsets[t+1]]``
    value_offsets: np.ndarray  #: int64 (T+1,): table t's row bytes in ``values`` (or in the reply)


def parse_request_body(h: Header, body: bytes | bytearray | memoryview) -> RequestBody:
    """Split a whole LOOKUP_REQ / UPDATE_REQ body by its directory and check that the directory
    adds up to the header (docs/protocol.md, "Body"): every table at most once, each with ≥ 1 key,
    ``dim`` ≥ 1 and ``dtype`` fp32 or fp16, Σ keys = ``num_keys``, Σ row bytes = ``value_len``.

    Raises:
        DirectoryError: status ``MALFORMED``, naming the table where the fault is one table's.
    """
    T, n = h.num_tables, h.num_keys
    mv = memoryview(body).cast("B")
    d = np.frombuffer(mv, DIR_DTYPE, count=T)
    if T > 1 and np.unique(d["table_id"]).size != T:
        u, c = np.unique(d["table_id"], return_counts=True)
        raise DirectoryError(consts.Status.MALFORMED, int(u[c > 1][0]), "a table appears twice in the directory")
    bad = (d["num_keys"] == 0) | (d["dim"] == 0) | ((d["dtype"] != DType.FP32) & (d["dtype"] != DType.FP16))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DirectoryError(consts.Status.MALFORMED, int(d["table_id"][i]),
                             f"directory entry of table {int(d['table_id'][i])}: {int(d['num_keys'][i])} keys, "
                             f"dim {int(d['dim'][i])}, dtype {int(d['dtype'][i])}")
    counts = d["num_keys"].astype(np.int64)
    if int(counts.sum()) != n:
        raise DirectoryError(consts.Status.MALFORMED, consts.NO_TABLE,
                             f"directory counts {int(counts.sum())} keys, the header {n}")
    rb = counts * row_bytes(d)
    if int(rb.sum()) != h.value_len:
        raise DirectoryError(consts.Status.MALFORMED, consts.NO_TABLE,
                             f"directory gives {int(rb.sum())} value bytes, the header {h.value_len}")
    ko, vo = (np.concatenate(([0], np.cumsum(x))) for x in (counts, rb))
    start = consts.DIR_ENTRY * T
    keys = np.frombuffer(mv, KEY_DTYPE, count=n, offset=start)
    values = mv[start + consts.KEY_SIZE * n:] if h.msg_type == MsgType.UPDATE_REQ else mv[0:0]
    return RequestBody(d, keys, values, ko, vo)


def table_values(section: bytes | bytearray | memoryview, rb: RequestBody, t: int) -> np.ndarray:
    """Table ``t``'s rows (a reply) or gradients (an update's ``rb.values``) in ``section``:
    a view (num_keys_t, dim_t) of its wire dtype."""
    e = rb.directory[t]
    n, dim = int(e["num_keys"]), int(e["dim"])
    return np.frombuffer(section, value_dtype(int(e["dtype"])), count=n * dim,
                         offset=int(rb.value_offsets[t])).reshape(n, dim)


#: a SIZE_REQ entry (docs/protocol.md, "Size messages"), little-endian like every body
SIZE_ENTRY_DTYPE = np.dtype(list(consts.SIZE_ENTRY_FIELDS))
assert SIZE_ENTRY_DTYPE.itemsize == consts.SIZE_ENTRY


def nack_body(held) -> bytes:
    """Body of an UPDATE_NACK: the fragment indices ``held`` (ints < :data:`consts.MAX_FRAGS`) as
    a bitmap of :data:`consts.NACK_LEN` bytes, fragment ``i`` in bit ``i % 8`` of byte ``i // 8``."""
    bits = np.zeros(consts.MAX_FRAGS, bool)
    bits[np.asarray(list(held), np.int64)] = True
    return np.packbits(bits, bitorder="little").tobytes()


def body_to_size_entries(body: bytes | memoryview, num_entries: int) -> np.ndarray:
    """SIZE_REQ body → :data:`SIZE_ENTRY_DTYPE` (E,) view."""
    return np.frombuffer(body, dtype=SIZE_ENTRY_DTYPE, count=num_entries)


def encode_reply(request: Header, msg_type: int, *, shard_id: int, body: bytes | bytearray | memoryview = b"",
                 status: int = 0, table_id: int = consts.NO_TABLE, mtu: int = consts.DEFAULT_MTU) -> list[bytes]:
    """UDP payloads of a reply to ``request``: ``msg_id``, ``client_id``, ``num_tables``,
    ``num_keys`` and ``value_len`` are copied from the request (docs/protocol.md, "Message
    types"); ``table_id`` names the table an ERROR is about (:data:`consts.NO_TABLE` otherwise)."""
    return encode_message(msg_type, msg_id=request.msg_id, client_id=request.client_id, shard_id=shard_id,
                          num_tables=request.num_tables, table_id=table_id, num_keys=request.num_keys,
                          value_len=request.value_len, body=body, mtu=mtu, status=status)
