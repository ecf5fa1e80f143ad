"""hypothesis drives the client's reassembler (client_lib/reassembly.py) with arbitrary and
near-valid datagrams (tests/client_lib/fuzzframes.py: truncated, lying lengths, fragment floods,
mixed clients, any order, duplicates) on a clock that moves: no exception escapes, the pending
messages and their bytes stay within the limits after every datagram, every datagram is
accounted for (dropped and counted by a known reason, a duplicate, or kept), and every message
returned is whole."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embnic.client_lib import consts
from embnic.client_lib.reassembly import Reassembler

from fuzzframes import ADDRS, datagrams

LIMITS = dict(max_pending=8, max_pending_bytes=2048, max_msg_len=16384, timeout_s=1.0)


def check_bounds(r: Reassembler) -> None:
    assert len(r) <= r.max_pending
    held = 0
    for ent in r._pending.values():
        assert 0 < len(ent.parts) < ent.header.frag_count
        assert ent.nbytes == sum(len(b) for b in ent.parts.values())
        held += ent.nbytes
    assert r.pending_bytes == held >= 0
    # the budget holds, except for one message alone (never evicted for itself: max_msg_len)
    assert held <= r.max_pending_bytes or (len(r) == 1 and held <= r.max_msg_len), (len(r), held)
    assert set(r.drops) <= set(consts.DROP_REASONS), r.drops


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(datagrams(), st.sampled_from([None, "request", "reply"]), st.data())
def test_reassembler_any_datagrams(seq, expect, data):
    r = Reassembler(expect=expect, **LIMITS)
    now = 0.0
    for payload, addr in seq:
        now += data.draw(st.sampled_from([0.0, 0.01, 0.3, 1.5]))
        drops, dups, evicted = r.drops.total(), r.stats["duplicates"], r.stats["evicted"]
        msg = r.feed(payload, addr, now=now)
        check_bounds(r)
        got = (r.drops.total() - drops, r.stats["duplicates"] - dups)
        if msg is not None:
            assert got == (0, 0)
            h = msg.header
            # the sender of the message's first fragment seen (fragments are keyed by client
            # id, message id and type, not by address: the card authenticates client ids)
            assert len(msg.body) == h.msg_len <= LIMITS["max_msg_len"] and msg.addr in ADDRS
            assert msg.frames == h.frag_count
        elif got == (0, 0):
            # kept: its fragment is pending now, or the byte budget evicted it at once
            h = r._pending.get((int.from_bytes(payload[12:14], "big"), int.from_bytes(payload[8:12], "big"),
                                payload[3]))
            assert (h is not None and int.from_bytes(payload[36:38], "big") in h.parts) or \
                r.stats["evicted"] > evicted, payload[:consts.HDR_LEN].hex()  # frag_index at 36 (v2)
        else:
            assert sorted(got) == [0, 1], got
        if data.draw(st.booleans()):
            r.expire(now)
            check_bounds(r)
    assert r.stats["frames"] == len(seq)
