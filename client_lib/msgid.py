"""Message ids that are never reused while a shard may remember them: the **id clock**
(docs/protocol.md, "Reliability", "Message ids", which says why these bounds suffice).

A client's ids follow a clock that ticks once per microsecond (``CLOCK_HZ``): the *incarnation*
of a run is where the wall clock stood when it started, and from there the run counts (on the
monotonic clock). The unwrapped counter ``U`` is kept never behind the clock (an allocation
first moves ``U`` up to it) and never more than :data:`MAX_AHEAD` ahead of it (an allocation
that would go further waits); the wire id is ``U`` in the cycle ``1 .. 2^32 - 1`` (:func:`wire`).
Within one process a new client of a ``client_id`` continues after the previous one's last id
(:data:`_HIGH`). One ``time.monotonic_ns`` per allocation call, never a Python loop over ids.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

#: ticks of the id clock per second (one id per microsecond at most, on average)
CLOCK_HZ = 1_000_000
#: length of the wire ids' cycle: ids run 1 .. 2^32 - 1 (0 is never sent) and wrap to 1
ID_CYCLE = 0xFFFFFFFF
#: how far (ids, = µs of the clock) a client's counter may run ahead of its clock (~1.05 s)
MAX_AHEAD = 1 << 20

_lock = threading.Lock()
#: per client_id, the highest counter value (unwrapped) a client of this process used + 1
_HIGH: dict[int, int] = {}


def wire(u: int) -> int:
    """The wire ``msg_id`` of counter value ``u`` (an int ≥ 0): ``u mod (2^32 - 1) + 1``, in
    ``1 .. 2^32 - 1``; consecutive counter values give consecutive ids, ``2^32 - 1`` followed
    by 1 (as ``client_lib/csrc/`` (table.c and plan.c) counts)."""
    return u % ID_CYCLE + 1


class MsgIds:
    """The message ids of one client (one run): see the module docstring.

    Args:
        client_id: the client (a new :class:`MsgIds` of a ``client_id`` this process already
            used starts after that one's last id).
        clock: None for the id clock (wall clock at start, monotonic after); or a function
            giving the clock in µs (tests). ``frozen=True``: no clock at all.
        first: with ``frozen=True``, the first wire id (1 .. 2^32 - 1); ids then simply count
            from it — no pacing, no guarantee against reuse: for tests that compare frames byte
            for byte between two runs.
        sleep: how to wait for the clock (``time.sleep``; tests pass a fake).

    Raises:
        ValueError: ``first`` outside 1 .. 2^32 - 1.
    """

    def __init__(self, client_id: int = 0, *, clock: Callable[[], int] | None = None, frozen: bool = False,
                 first: int = 1, sleep: Callable[[float], None] = time.sleep):
        self.client_id = int(client_id)
        self._sleep = sleep
        self.frozen = bool(frozen)
        self.waits = 0  #: allocations that waited for the clock
        if frozen:
            if not 1 <= int(first) <= ID_CYCLE:
                raise ValueError(f"first id must be in 1..{ID_CYCLE}, got {first}")
            self._clock = None
            self._u = int(first) - 1
            return
        if clock is None:
            base, m0 = time.time_ns() // 1000, time.monotonic_ns()
            clock = lambda: base + (time.monotonic_ns() - m0) // 1000  # noqa: E731
        self._clock = clock
        with _lock:
            self._u = max(int(clock()), _HIGH.get(self.client_id, 0))
            _HIGH[self.client_id] = max(_HIGH.get(self.client_id, 0), self._u)

    @property
    def counter(self) -> int:
        """The unwrapped counter: the next id's value before it is taken into the cycle (int)."""
        return self._u

    def _pace(self, n: int) -> None:
        """Move the counter up to the clock, and wait while taking ``n`` more ids would put it
        more than :data:`MAX_AHEAD` ahead of it."""
        if self._clock is None:
            return
        now = int(self._clock())
        if self._u < now:
            self._u = now
        over = self._u + n - now - MAX_AHEAD
        while over > 0:
            self.waits += 1
            self._sleep(over / CLOCK_HZ)
            now = int(self._clock())
            over = self._u + n - now - MAX_AHEAD

    def _took(self) -> None:
        if self._clock is not None:
            with _lock:
                if _HIGH.get(self.client_id, 0) < self._u:
                    _HIGH[self.client_id] = self._u

    def take(self, n: int = 1) -> int:
        """Take ``n`` consecutive ids (n ≥ 0); returns the first one's wire id (the others follow
        it in the cycle, :func:`wire`). May wait (see the module docstring)."""
        n = int(n)
        self._pace(n)
        first = wire(self._u)
        self._u += n
        self._took()
        return first

    def next(self) -> int:
        """The wire id the next allocation starts at, for code that allocates ids itself (the C
        plan and round, from this id on); follow with :meth:`advance` to the id it stopped at.
        Paces like :meth:`take`."""
        self._pace(0)
        return wire(self._u)

    def advance(self, first: int, nxt: int) -> None:
        """Record that ids ``first`` (what :meth:`next` gave) up to before ``nxt`` were taken
        (``nxt``: the next free wire id, as the C code returns it).

        Raises:
            ValueError: ``first`` is not the current next id (another allocation came between).
        """
        if wire(self._u) != int(first):
            raise ValueError(f"msg ids: allocation from {first} but the next id is {wire(self._u)}")
        self._u += (int(nxt) - int(first)) % ID_CYCLE
        self._took()
