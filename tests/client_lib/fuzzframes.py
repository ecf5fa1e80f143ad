"""Hypothesis strategies for arbitrary and near-valid embnic datagrams (UDP payloads), shared by the
fuzz tests of the client's reassembler (tests/client_lib/test_reassembly_fuzz.py) and of the shard
server's datagram handler (tests/testbed/test_server_fuzz.py).

:func:`datagrams` draws a sequence of ``(payload, addr)``: fragments of real messages (encoded by
the codec at a small MTU so that a few keys already span several fragments) from several
clients and senders, in any order and duplicated, and around them random bytes, truncated
fragments, fragments with one header field replaced (lying lengths, counts, offsets, ids), bit
flips, and floods of fragments of many messages that never complete.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from embnic.client_lib import codec, consts
from embnic.client_lib.consts import DType, MsgType

#: senders: (ip, port); a client id is drawn independently, so ids and addresses mix
ADDRS = [("10.0.0.1", 40001), ("10.0.0.2", 40002), ("10.0.0.3", 40003)]
MTU = 200  #: P = 128 body bytes a fragment
FIELDS = {name: (off, size) for name, off, size in consts.HEADER_FIELDS}


def _patch(frame: bytes, name: str, value: int) -> bytes:
    off, size = FIELDS[name]
    return frame[:off] + (value % (1 << (8 * size))).to_bytes(size, "big") + frame[off + size:]


@st.composite
def message(draw, tables=((0, 8, DType.FP32), (1, 16, DType.FP32), (3, 12, DType.FP16)),
            shard_id: int = 0, key_space: int = 1000) -> list[bytes]:
    """The fragments of one request (lookup or update of one to three tables, protocol v2) or
    reply, as the codec encodes them."""
    chosen = draw(st.lists(st.sampled_from(tables), min_size=1, max_size=3, unique_by=lambda t: t[0]))
    counts = [draw(st.integers(1, 40 // len(chosen))) for _ in chosen]
    keys = np.concatenate([np.array(sorted(draw(st.sets(st.integers(0, key_space - 1), min_size=n, max_size=n))),
                                    np.uint64) for n in counts])
    d = codec.make_directory([t[0] for t in chosen], [t[1] for t in chosen], [t[2] for t in chosen], counts)
    kind = draw(st.sampled_from(["lookup", "update", "reply"]))
    ids = dict(msg_id=draw(st.integers(0, 5)), client_id=draw(st.integers(0, 3)), shard_id=shard_id, mtu=MTU)
    if kind == "lookup":
        return codec.encode_lookup(directory=d, keys=keys, **ids)
    v = draw(st.floats(-1, 1, allow_nan=False, width=16))
    vals = codec.values_to_body([np.full((n, t[1]), v, np.float32) for n, t in zip(counts, chosen)],
                                [t[2] for t in chosen])
    if kind == "update":
        return codec.encode_update(directory=d, keys=keys, values=vals, **ids)
    return codec.encode_message(MsgType.LOOKUP_REPLY, num_tables=len(chosen), num_keys=int(keys.size),
                                value_len=len(vals), body=vals, **ids)


def flood(msg_id0: int, n: int, client_id: int) -> list[bytes]:
    """One fragment each of ``n`` 256-fragment lookups (msg ids from ``msg_id0``): messages that
    never complete, each pinning a reassembly entry until evicted or expired."""
    p = consts.max_body_per_frame(196)  # 124 body bytes a fragment
    keys = np.arange((consts.MAX_FRAGS * p - consts.DIR_ENTRY) // consts.KEY_SIZE, dtype=np.uint64)  # 256 fragments
    d = codec.make_directory([0], [8], [DType.FP32], [keys.size])
    frames = codec.encode_lookup(msg_id=0, client_id=client_id, shard_id=0, directory=d, keys=keys, mtu=196)
    assert len(frames) == consts.MAX_FRAGS
    return [_patch(frames[(7 * i) % len(frames)], "msg_id", msg_id0 + i) for i in range(n)]


@st.composite
def datagrams(draw, max_len: int = 40, shard_id: int = 0, key_space: int = 1000) -> list[tuple[bytes, tuple]]:
    """A sequence of ``(payload, addr)``: see the module docstring."""
    msgs = draw(st.lists(message(shard_id=shard_id, key_space=key_space), min_size=1, max_size=4))
    pool = [f for m in msgs for f in m]
    out: list[tuple[bytes, tuple]] = []
    for _ in range(draw(st.integers(1, max_len))):
        addr = draw(st.sampled_from(ADDRS))
        kind = draw(st.sampled_from(["valid", "valid", "valid", "truncate", "field", "flip", "random",
                                     "flood", "client"]))
        base = pool[draw(st.integers(0, len(pool) - 1))]
        if kind == "valid":
            out.append((base, addr))
        elif kind == "truncate":
            out.append((base[:draw(st.integers(0, len(base) - 1))], addr))
        elif kind == "field":
            name = draw(st.sampled_from(sorted(FIELDS)))
            size = FIELDS[name][1]
            v = draw(st.one_of(st.integers(0, (1 << (8 * size)) - 1), st.integers(0, 300)))
            out.append((_patch(base, name, v), addr))
        elif kind == "flip":
            b = bytearray(base)
            for _ in range(draw(st.integers(1, 4))):
                b[draw(st.integers(0, len(b) - 1))] ^= 1 << draw(st.integers(0, 7))
            out.append((bytes(b), addr))
        elif kind == "random":
            out.append((draw(st.binary(max_size=300)), addr))
        elif kind == "flood":
            out += [(f, addr) for f in flood(draw(st.integers(100, 1 << 20)), draw(st.integers(1, 40)),
                                             draw(st.integers(0, 3)))]
        else:  # the same fragment from another client id
            out.append((_patch(base, "client_id", draw(st.integers(0, 3))), addr))
    return out
