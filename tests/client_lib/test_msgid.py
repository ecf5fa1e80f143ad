"""The id clock (client_lib/msgid.py, docs/protocol.md "Message ids"): a client's message ids are
never reused while a shard's exactly-once window may remember them — within a run (wrap-around)
and from one run to the next.

Run alone: python3 -m pytest -q tests/client_lib/test_msgid.py
"""
from __future__ import annotations

import numpy as np
import pytest

from embnic.client_lib import msgid
from embnic.client_lib.msgid import ID_CYCLE, MAX_AHEAD, MsgIds, wire
from embnic.testbed.server.window import DEFAULT_MAX_AGE_S


class FakeClock:
    """µs; ``sleep`` moves it on."""

    def __init__(self, t: int):
        self.t = t

    def __call__(self) -> int:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += max(1, int(s * msgid.CLOCK_HZ + 0.999))


def test_wire_ids_cycle_like_the_c_round():
    """1 .. 2^32-1 then 1 again (0 never sent): what client_lib/csrc/ (table.c and plan.c) counts."""
    assert wire(0) == 1 and wire(ID_CYCLE - 1) == 0xFFFFFFFF and wire(ID_CYCLE) == 1
    f = MsgIds(frozen=True, first=0xFFFFFFFE)
    assert [f.take(1) for _ in range(3)] == [0xFFFFFFFE, 0xFFFFFFFF, 1]
    with pytest.raises(ValueError):
        MsgIds(frozen=True, first=0)


def test_ids_follow_the_clock_and_never_run_far_ahead():
    ck = FakeClock(10**12)
    ids = MsgIds(901, clock=ck, sleep=ck.sleep)
    assert ids.take(5) == wire(10**12) and ids.counter == 10**12 + 5
    ck.t += 1000  # quiet for 1 ms: the ids of that time are skipped
    assert ids.take(1) == wire(10**12 + 1000)
    # a burst far beyond the clock waits for it: never more than MAX_AHEAD ahead
    ids.take(MAX_AHEAD - 1)  # (one id already taken at this clock value)
    assert ids.counter - ck.t <= MAX_AHEAD and ids.waits == 0
    ids.take(1000)
    assert ids.waits == 1 and ids.counter - ck.t <= MAX_AHEAD
    # C code allocating from next(): advance() takes what it used, and refuses a stale start
    first = ids.next()
    ids.advance(first, (first + 7 - 1) % ID_CYCLE + 1)
    assert ids.next() == (first + 7 - 1) % ID_CYCLE + 1
    with pytest.raises(ValueError):
        ids.advance(first, first)


def test_one_id_is_used_again_only_after_most_of_the_clock_cycle():
    """Within a run, however fast the client: two uses of one wire id are ≥ ID_CYCLE - MAX_AHEAD
    µs of the clock apart — far longer than a window remembers an update."""
    ck = FakeClock(5 * 10**12)
    ids = MsgIds(902, clock=ck, sleep=ck.sleep)
    seen: dict[int, tuple[int, int]] = {}  # first id of a take -> (its n, clock when taken)
    gap = None
    rng = np.random.default_rng(1)
    while ck.t < 5 * 10**12 + 2 * ID_CYCLE:  # two laps of the clock, in steps of up to 64 M ids
        n = int(rng.integers(1, 1 << 26))
        first = ids.take(n)
        # ids first .. first+n-1: its smallest distance to an earlier use of the same ids
        for w, (m, t) in seen.items():
            if (w - first) % ID_CYCLE < n or (first - w) % ID_CYCLE < m:  # the two ranges overlap
                d = ck.t - t
                gap = d if gap is None else min(gap, d)
        seen[first] = (n, ck.t)
        ck.t += int(rng.integers(0, 1 << 26))
    assert gap is not None and gap >= ID_CYCLE - MAX_AHEAD - (1 << 26)
    assert (ID_CYCLE - MAX_AHEAD) / msgid.CLOCK_HZ > 2 * DEFAULT_MAX_AGE_S


def test_runs_of_a_client_are_kept_apart():
    """A new client of an id in this process continues after the last one's ids, at once; a
    restarted process starts at its clock, past every id of a run that ended over MAX_AHEAD
    before (its ids were never more than MAX_AHEAD ahead of its clock)."""
    a = MsgIds(903)
    x = a.take(10_000)  # a burst: ahead of the clock
    b = MsgIds(903)
    y = b.take(1)
    assert (y - x) % ID_CYCLE >= 10_000
    ck = FakeClock(7 * 10**12)
    run1 = MsgIds(904, clock=ck, sleep=ck.sleep)
    top = 0
    for _ in range(50):
        run1.take(1 << 18)
        top = run1.counter
    ck.t += MAX_AHEAD + 1  # the restart: later than MAX_AHEAD after run 1's last id
    msgid._HIGH.pop(904)  # another process: no memory of run 1
    run2 = MsgIds(904, clock=ck, sleep=ck.sleep)
    assert run2.counter >= top
