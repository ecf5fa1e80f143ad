"""Counters of one client (:class:`ClientStats`), what its report and ``embnic train`` print."""
from __future__ import annotations

import collections
import dataclasses


@dataclasses.dataclass
class ClientStats:
    """Counters of one client. Latencies in µs, one entry per completed lookup message.

    ``rounds`` counts every round trip the client waited for (lookups, updates and, in the
    fixed-length mode, size rounds); ``size_rounds`` the size rounds among them;
    ``retransmits`` messages re-sent or repaired (by a timer or fast); ``timeouts`` retransmission
    timers that fired; ``fast_retransmits`` messages re-sent or repaired because a message sent
    later to the same shard was answered first; ``repairs`` lookups whose missing rows were asked
    for in a new message (their reply came in part); ``probes`` tail probes sent (one-key lookups
    after a shard's last message of a round, not counted in ``messages_sent``/``_received``);
    ``max_inflight_frames`` the most frames one shard's send window held (request + reply
    frames; above ``window_frames`` only when one message alone is larger).
    ``update_polls`` counts lost updates of several fragments recovered by a poll (one fragment
    sent again), ``nacks`` the UPDATE_NACKs that answered them, ``tries_by_nack`` the re-sends of
    only the fragments a NACK named missing and ``frames_resent`` those fragments.
    ``data_rounds`` counts the lookup and update rounds (size rounds aside), ``round_messages``
    their request messages (without tail probes, repairs and re-sends) and ``round_shards`` the
    shards they touched: protocol v2 sends one message per shard a round touches, so
    ``round_messages == round_shards`` unless a round had to be split past ``msg_frames``
    (:meth:`messages_per_round`).
    """

    messages_sent: int = 0
    frames_sent: int = 0
    bytes_sent: int = 0
    messages_received: int = 0
    frames_received: int = 0
    bytes_received: int = 0
    retransmits: int = 0
    timeouts: int = 0
    fast_retransmits: int = 0
    repairs: int = 0
    probes: int = 0
    rounds: int = 0
    size_rounds: int = 0
    max_inflight_frames: int = 0
    update_polls: int = 0
    nacks: int = 0
    tries_by_nack: int = 0
    frames_resent: int = 0
    data_rounds: int = 0
    round_messages: int = 0
    round_shards: int = 0
    stale_replies: int = 0
    lookup_latency_us: list = dataclasses.field(default_factory=list)
    drops: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def messages_per_round(self) -> tuple[float, float]:
        """(request messages, shards touched) per lookup/update round, means over the data rounds
        ((0, 0) before any)."""
        if not self.data_rounds:
            return 0.0, 0.0
        return self.round_messages / self.data_rounds, self.round_shards / self.data_rounds

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["drops"] = dict(self.drops)
        d.pop("lookup_latency_us")
        return d
