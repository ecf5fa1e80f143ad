"""The exactly-once window of a shard: every update it acknowledged, remembered by
``(client_id, msg_id)`` *and* fingerprint (docs/protocol.md, "Reliability").

The one implementation, held by :class:`~.shard_state.ShardState` (which admits updates and answers
polls through it) and restored by :mod:`.durability`. An entry's key is ``(client_id, msg_id,
num_tables, num_keys, value_len, body_crc)``, so a byte-identical re-send of any update still in
the window is a duplicate whatever other update reused its id since; beside it, for a poll (the
re-sent last fragment of an update of several), the offset and CRC-32 of the update's last
fragment. A poll is acked from the window only when it is that last fragment byte for byte
(:meth:`UpdateWindow.poll_ack`); anything else draws an ``UPDATE_NACK``. Bounds: ``size`` entries
(least recently used dropped first) and ``max_age_s`` (:data:`DEFAULT_MAX_AGE_S`). Why these rules
are enough: docs/server.md, "Exactly once".
"""
from __future__ import annotations

import collections
import time
import zlib
from typing import Callable, Iterator

#: seconds a window remembers an acknowledged update at most (docs/protocol.md, "Reliability")
DEFAULT_MAX_AGE_S = 1800.0

#: an entry's key: (client_id, msg_id, num_tables, num_keys, value_len, body_crc)
Key = tuple[int, int, int, int, int, int]


def fingerprint(num_tables: int, num_keys: int, value_len: int, body) -> tuple[int, int, int, int]:
    """An update's fingerprint: ``(num_tables, num_keys, value_len, CRC-32 of the whole body)``
    (``body``: bytes-like, the message body as on the wire)."""
    return (int(num_tables), int(num_keys), int(value_len), zlib.crc32(body))


def tail_of(body, last_offset: int | None) -> tuple[int, int] | None:
    """``(last_offset, CRC-32 of body[last_offset:])``: what a poll of the update must match; None
    when ``last_offset`` is None (the fragment size is unknown) or the body has one fragment
    (``last_offset`` 0: such an update is never polled)."""
    if not last_offset:
        return None
    return int(last_offset), zlib.crc32(memoryview(body)[int(last_offset):])


class UpdateWindow:
    """The exactly-once window (module docstring).

    Args:
        size: entries remembered at most (≥ 1; ``--dedup-window``).
        max_age_s: seconds an entry is remembered at most (> 0).
        clock: seconds, monotonic (tests pass a fake).

    Raises:
        ValueError: ``size < 1`` or ``max_age_s <= 0``.
    """

    def __init__(self, size: int, max_age_s: float = DEFAULT_MAX_AGE_S,
                 clock: Callable[[], float] = time.monotonic):
        if int(size) < 1:
            raise ValueError(f"window size must be >= 1, got {size}")
        if not float(max_age_s) > 0:
            raise ValueError(f"window max age must be > 0 s, got {max_age_s}")
        self.size = int(size)
        self.max_age_s = float(max_age_s)
        self._clock = clock
        #: key -> (tail: (last_offset, tail_crc) or None, time last used)
        self._e: collections.OrderedDict[Key, tuple] = collections.OrderedDict()
        #: (client_id, msg_id, nt, nk, vl, last_offset, tail_crc) -> keys of the entries with that tail
        self._polls: dict[tuple, list[Key]] = {}
        self.expired = 0  #: entries dropped for their age

    def __len__(self) -> int:
        return len(self._e)

    def __contains__(self, key: Key) -> bool:
        return key in self._e

    def _expire(self, now: float) -> None:
        e = self._e
        limit = now - self.max_age_s
        while e and e[next(iter(e))][1] < limit:  # the oldest entry (last used) past its age
            self._drop(next(iter(e)))
            self.expired += 1

    def _drop(self, key: Key) -> None:
        tail, _ = self._e.pop(key)
        if tail is not None:
            pk = key[:5] + tail
            ks = self._polls.get(pk)
            if ks is not None:
                ks.remove(key)
                if not ks:
                    del self._polls[pk]

    def duplicate(self, client_id: int, msg_id: int, fp: tuple) -> bool:
        """Whether the update ``(client_id, msg_id)`` of fingerprint ``fp`` (:func:`fingerprint`)
        was acknowledged and is still remembered; if so its entry is touched (kept longer)."""
        now = self._clock()
        self._expire(now)
        key = (int(client_id), int(msg_id)) + tuple(fp)
        ent = self._e.get(key)
        if ent is None:
            return False
        self._e[key] = (ent[0], now)
        self._e.move_to_end(key)
        return True

    def add(self, client_id: int, msg_id: int, fp: tuple, tail: tuple[int, int] | None = None) -> None:
        """Remember an acknowledged update (its fingerprint ``fp``; ``tail``: :func:`tail_of`, or
        None when no poll may be acked from it), dropping the oldest entries past ``size`` and
        entries past ``max_age_s``. An entry already there is touched (its tail kept if this one
        has none)."""
        now = self._clock()
        self._expire(now)
        key = (int(client_id), int(msg_id)) + tuple(int(x) for x in fp)
        old = self._e.get(key)
        if old is not None:
            if tail is None or old[0] is not None:
                self._e[key] = (old[0], now)
                self._e.move_to_end(key)
                return
            self._drop(key)
        self._e[key] = (tail, now)
        if tail is not None:
            self._polls.setdefault(key[:5] + tuple(tail), []).append(key)
        while len(self._e) > self.size:
            self._drop(next(iter(self._e)))

    def poll_ack(self, client_id: int, msg_id: int, num_tables: int, num_keys: int, value_len: int,
                 frag_offset: int, frag_body) -> bool:
        """Whether a poll (the re-sent last fragment, ``frag_body`` its body bytes at
        ``frag_offset``) is the last fragment of an update this window acknowledged (module
        docstring); if so that entry is touched."""
        now = self._clock()
        self._expire(now)
        pk = (int(client_id), int(msg_id), int(num_tables), int(num_keys), int(value_len), int(frag_offset),
              zlib.crc32(frag_body))
        ks = self._polls.get(pk)
        if not ks:
            return False
        key = ks[-1]
        self._e[key] = (self._e[key][0], now)
        self._e.move_to_end(key)
        return True

    def rows(self) -> Iterator[tuple[int, int, int, int, int, int]]:
        """The entries oldest first, as ``(client_id, msg_id, num_tables, num_keys, value_len,
        body_crc)`` (a checkpoint's ``applied`` rows)."""
        return iter(list(self._e))

    def clear(self) -> None:
        """Forget every entry."""
        self._e.clear()
        self._polls.clear()
