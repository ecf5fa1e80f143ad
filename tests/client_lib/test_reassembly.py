"""Fragmentation and reassembly: shuffled, duplicated, missing and contradicting fragments.

Run alone: python3 -m pytest -q tests/client_lib/test_reassembly.py
"""
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from embnic.client_lib import codec, consts
from embnic.client_lib.codec import Header
from embnic.client_lib.consts import MsgType
from embnic.client_lib.reassembly import Reassembler

import clientref


def _frames(n_keys=1000, mtu=1500, msg_id=1, client_id=1):
    keys = np.arange(n_keys, dtype=np.uint64) * 3
    return keys, codec.encode_lookup(msg_id=msg_id, client_id=client_id, shard_id=1, keys=keys, mtu=mtu,
                                     directory=codec.make_directory([2], [4], [1], [n_keys]))


def _keys(m):
    """The keys of a reassembled one-table lookup (after its 16-byte directory)."""
    return clientref.body_to_keys(m.body, m.header.num_keys, offset=consts.DIR_ENTRY)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3000), st.sampled_from([576, 1500, 9000]), st.integers(0, 2**31), st.integers(0, 3))
def test_any_order_with_duplicates(n_keys, mtu, seed, dup):
    keys, frames = _frames(n_keys, mtu)
    rnd = random.Random(seed)
    stream = frames + [rnd.choice(frames) for _ in range(dup if len(frames) > 1 else 0)]
    rnd.shuffle(stream)
    r = Reassembler()
    done = [m for m in (r.feed(f) for f in stream) if m is not None]
    # a duplicate fragment arriving after completion may start a new message; the first is whole
    m = done[0]
    np.testing.assert_array_equal(_keys(m), keys)
    assert m.frames == len(frames)
    assert not r.drops


def test_missing_fragment_never_completes_and_expires():
    _, frames = _frames(1000)
    assert len(frames) > 2
    r = Reassembler(timeout_s=1.0)
    assert all(r.feed(f, now=0.0) is None for f in frames[:-1])
    assert len(r) == 1
    assert r.expire(now=0.5) == 0
    assert r.expire(now=2.0) == 1
    assert len(r) == 0 and r.stats["expired"] == 1


def test_contradicting_fragment_rejected():
    _, frames = _frames(1000)
    r = Reassembler()
    assert r.feed(frames[0]) is None
    h = Header._make(codec._HDR.unpack_from(frames[1]))
    bad = h._replace(value_len=h.value_len + 4).pack() + frames[1][44:]  # another reply length, same ids
    assert r.feed(bad) is None
    assert r.drops["frag_mismatch"] == 1
    # the good fragments still complete the message
    done = [r.feed(f) for f in frames[1:]]
    assert done[-1] is not None


def test_fragment_geometry_checked():
    _, frames = _frames(1000)
    h = Header._make(codec._HDR.unpack_from(frames[1]))
    # offset that does not match index * P
    bad = h._replace(frag_offset=h.frag_offset + 8).pack() + frames[1][44:]
    r = Reassembler()
    assert r.feed(bad) is None
    assert r.drops["frag_mismatch"] == 1


def test_malformed_frames_counted_not_raised():
    r = Reassembler()
    for junk in (b"", b"\x00" * 10, b"\xff" * 44, b"EM" + b"\x00" * 60):
        assert r.feed(junk) is None
    assert sum(r.drops.values()) == 4


def test_messages_of_different_clients_do_not_mix():
    k1, f1 = _frames(800, msg_id=5, client_id=1)
    k2, f2 = _frames(600, msg_id=5, client_id=2)
    stream = f1 + f2
    random.Random(3).shuffle(stream)
    r = Reassembler()
    done = {m.header.client_id: m for m in (r.feed(f) for f in stream) if m}
    np.testing.assert_array_equal(_keys(done[1]), k1)
    np.testing.assert_array_equal(_keys(done[2]), k2)


def test_pending_bounded():
    r = Reassembler(max_pending=4)
    for i in range(10):
        _, frames = _frames(1000, msg_id=i)
        r.feed(frames[0])
    assert len(r) == 4 and r.stats["evicted"] == 6


def test_expect_reply_drops_requests():
    _, frames = _frames(10)
    r = Reassembler(expect="reply")
    assert r.feed(frames[0]) is None and r.drops["bad_type"] == 1
    ack = codec.encode_message(MsgType.UPDATE_ACK, msg_id=1, client_id=1, num_tables=1, num_keys=3, value_len=48)[0]
    assert r.feed(ack) is not None


def test_memory_follows_bytes_received_not_claims():
    """A 52-byte last fragment claiming 256 fragments / 16 MiB must not cost 16 MiB."""
    import tracemalloc

    p = 65528
    count = 256
    msg_len = (count - 1) * p + 8
    body = b"\x00" * 8
    r = Reassembler(max_msg_len=1 << 30)
    tracemalloc.start()
    for i in range(8):
        n = (msg_len - 16) // 8
        h = Header(0x454D, 2, MsgType.LOOKUP_REQ, 0, 0, 0, i, 1, 0, 1, consts.NO_TABLE, n, 4 * n, msg_len,
                   (count - 1) * p, count - 1, count, len(body), 0)
        assert r.feed(h.pack() + body) is None
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(r) == 8 and r.pending_bytes == 64
    assert peak < 1 << 20


def test_more_than_256_fragments_dropped():
    """A fragment claiming 257 or 65535 fragments is dropped as too_many_frags, never held."""
    r = Reassembler(max_msg_len=1 << 30)
    for count in (257, 65535):
        p = 1024
        msg_len = (count - 1) * p + 8
        n = (msg_len - 16) // 8
        h = Header(0x454D, 2, MsgType.LOOKUP_REQ, 0, 0, 0, count, 1, 0, 1, consts.NO_TABLE, n, 4 * n, msg_len,
                   (count - 1) * p, count - 1, count, 8, 0)
        assert r.feed(h.pack() + b"\x00" * 8) is None
    assert r.drops["too_many_frags"] == 2 and len(r) == 0 and r.pending_bytes == 0


def test_pending_bytes_budget_evicts_oldest():
    r = Reassembler(max_pending_bytes=5000)
    for i in range(5):
        _, frames = _frames(1000, msg_id=i)  # 6 fragments, 8016 bytes each message
        r.feed(frames[0])  # 1428 bytes held per message
    assert r.pending_bytes <= 5000 and r.stats["evicted"] == 2
    _, frames = _frames(1000, msg_id=4)
    done = [r.feed(f) for f in frames[1:]]
    assert done[-1] is not None  # the newest message still completes
    assert r.pending_bytes == sum(e.nbytes for e in r._pending.values())
