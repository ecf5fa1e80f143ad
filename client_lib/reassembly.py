"""Reassembly of fragmented embnic messages (docs/protocol.md, "Fragmentation").

Fragments are keyed by ``(client_id, msg_id, msg_type)``; any order and duplicates are
tolerated, fragments contradicting the message's first-seen header are rejected
(``frag_mismatch``), and incomplete messages expire after ``timeout_s``.
"""
from __future__ import annotations

import collections
import dataclasses
import time

from . import consts
from .codec import FrameError, Header, parse_header

#: header fields every fragment of one message must agree on besides its key (client_id, msg_id,
#: msg_type): :data:`consts.MESSAGE_FIELDS` (``flags`` may differ: a retransmission's fragments mix
#: with the original's). A fragment that differs from the message's first one is ``frag_mismatch``.
AGREE_FIELDS = tuple(f for f in consts.MESSAGE_FIELDS if f not in ("msg_type", "msg_id", "client_id"))


@dataclasses.dataclass
class Message:
    """A complete message: ``header`` of its first fragment seen (fragment fields describe
    that fragment), the whole ``body`` (bytes, ``header.msg_len`` long) and the sender."""

    header: Header
    body: bytes
    addr: tuple | None = None
    frames: int = 1


@dataclasses.dataclass
class _Pending:
    header: Header
    parts: dict  # fragment index -> body bytes; memory is what arrived, not what msg_len claims
    nbytes: int
    p: int  # body bytes per non-last fragment, 0 until known
    t_last: float
    addr: tuple | None


def fragment_size(h: Header) -> int:
    """The fragment size P of ``h``'s message, after checking the fragment's offset and length
    against its index (docs/protocol.md, "Fragmentation": every fragment but the last carries
    exactly P body bytes at offset ``frag_index · P``, the last one the rest, at most P).

    A single fragment must carry the whole body (P is 0 then); a middle fragment gives P as its
    ``frag_len`` and ``ceil(msg_len / P)`` must be ``frag_count``; the last one gives P as
    ``frag_offset / frag_index`` (exact) and must end the body.

    Args:
        h: a parsed header (:func:`~embnic.client_lib.codec.parse_header`).

    Returns:
        P in bytes (0 for a message of one fragment).

    Raises:
        FrameError: reason ``frag_mismatch`` when offset or length disagree with the rule.
    """
    last = h.frag_index == h.frag_count - 1
    if h.frag_count == 1:
        if h.frag_offset != 0 or h.frag_len != h.msg_len:
            raise FrameError("frag_mismatch", "single fragment must carry the whole body")
        return 0
    if not last:
        p = h.frag_len
        if p == 0 or h.frag_offset != h.frag_index * p or -(-h.msg_len // p) != h.frag_count:
            raise FrameError("frag_mismatch", f"fragment {h.frag_index}/{h.frag_count} at offset "
                                              f"{h.frag_offset} len {h.frag_len}")
        return p
    if h.frag_offset % h.frag_index or h.frag_offset + h.frag_len != h.msg_len or h.frag_len == 0:
        raise FrameError("frag_mismatch", f"last fragment at offset {h.frag_offset} len {h.frag_len}")
    p = h.frag_offset // h.frag_index
    if h.frag_len > p:
        raise FrameError("frag_mismatch", "last fragment longer than the others")
    return p


class Reassembler:
    """Collects fragments into messages.

    Args:
        max_pending: incomplete messages kept at once; the oldest is evicted beyond it
            (counted as ``evicted``).
        max_msg_len: largest message body accepted (bytes); larger ones are dropped as
            ``too_large`` (a header may claim up to 4 GiB).
        max_pending_bytes: body bytes held by incomplete messages at most; beyond it the
            least recently touched messages are evicted (``evicted``). The message being
            received is never evicted for it, so one message alone may hold more (up to
            ``max_msg_len``). Fragments are kept as they arrive, so memory follows the bytes
            received, never a header's claims.
        timeout_s: an incomplete message untouched this long is dropped (``expired``).
        expect: ``"request"``, ``"reply"`` or None — passed to :func:`parse_header`.

    Attributes:
        drops: ``collections.Counter`` of dropped frames by reason (consts.DROP_REASONS).
        stats: Counter of ``frames``, ``duplicates``, ``messages``, ``evicted``, ``expired``.
    """

    def __init__(self, max_pending: int = 4096, timeout_s: float = 5.0, expect: str | None = None,
                 max_msg_len: int = 64 << 20, max_pending_bytes: int = 256 << 20):
        self.max_pending = max_pending
        self.max_msg_len = max_msg_len
        self.max_pending_bytes = max_pending_bytes
        self.pending_bytes = 0
        self.timeout_s = timeout_s
        self.expect = expect
        self.drops: collections.Counter = collections.Counter()
        self.stats: collections.Counter = collections.Counter()
        self._pending: collections.OrderedDict[tuple, _Pending] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._pending)

    def feed(self, payload: bytes, addr: tuple | None = None, now: float | None = None,
             header: Header | None = None) -> Message | None:
        """Add one UDP payload; return the :class:`Message` it completes, else None.

        Args:
            payload: embnic header + body fragment.
            addr: sender, kept in the message.
            now: monotonic time (s), for tests.
            header: the payload's header if the caller already validated it with
                :func:`parse_header` (saves parsing twice).

        Never raises on bad input: invalid frames are counted in :attr:`drops`.
        """
        self.stats["frames"] += 1
        try:
            h = header if header is not None else parse_header(payload, expect=self.expect)
            p = fragment_size(h)
        except FrameError as e:
            self.drops[e.reason] += 1
            return None
        if h.msg_len > self.max_msg_len:
            self.drops["too_large"] += 1
            return None
        if h.frag_count == 1:
            self.stats["messages"] += 1
            return Message(h, bytes(payload[consts.HDR_LEN:]), addr, 1)
        now = time.monotonic() if now is None else now
        key = (h.client_id, h.msg_id, h.msg_type)
        ent = self._pending.get(key)
        if ent is None:
            if len(self._pending) >= self.max_pending:
                self.expire(now)
                while len(self._pending) >= self.max_pending:
                    self._evict_oldest()
            ent = _Pending(h, {}, 0, p, now, addr)
            self._pending[key] = ent
        else:
            f = ent.header
            if any(getattr(f, n) != getattr(h, n) for n in AGREE_FIELDS) or (p and ent.p and p != ent.p):
                self.drops["frag_mismatch"] += 1
                return None
            if p and not ent.p:
                ent.p = p
            self._pending.move_to_end(key)
        if h.frag_index in ent.parts:
            self.stats["duplicates"] += 1
            return None
        body = bytes(payload[consts.HDR_LEN:])
        ent.parts[h.frag_index] = body
        ent.nbytes += len(body)
        ent.t_last = now
        self.pending_bytes += len(body)
        if len(ent.parts) < h.frag_count:
            while self.pending_bytes > self.max_pending_bytes and len(self._pending) > 1:
                self._evict_oldest()
            return None
        del self._pending[key]
        self.pending_bytes -= ent.nbytes
        self.stats["messages"] += 1
        parts = ent.parts
        return Message(ent.header, b"".join([parts[i] for i in range(h.frag_count)]), ent.addr, h.frag_count)

    def _evict_oldest(self) -> None:
        _, ent = self._pending.popitem(last=False)
        self.pending_bytes -= ent.nbytes
        self.stats["evicted"] += 1

    def expire(self, now: float | None = None) -> int:
        """Drop incomplete messages idle longer than ``timeout_s``; returns how many."""
        now = time.monotonic() if now is None else now
        n = 0
        while self._pending:
            key, ent = next(iter(self._pending.items()))
            if now - ent.t_last < self.timeout_s:
                break
            del self._pending[key]
            self.pending_bytes -= ent.nbytes
            n += 1
        self.stats["expired"] += n
        return n

    def discard(self, client_id: int, msg_id: int, msg_type: int) -> None:
        """Forget a pending message (e.g. one the caller no longer waits for)."""
        ent = self._pending.pop((client_id, msg_id, msg_type), None)
        if ent is not None:
            self.pending_bytes -= ent.nbytes
