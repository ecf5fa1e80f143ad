"""The card's message state map planned from a cluster config: how many messages it holds in
flight and how much loss it tolerates at a message rate (docs/control-socket.md, "Capacity";
``embnic config check`` and ``embnic pipeline load`` print it).
"""
from __future__ import annotations

import dataclasses

from .config import ClusterConfig

#: message rate (messages/s through the card) at which `config check` and `pipeline load` state
#: the state map's loss tolerance unless told another (`--rate`)
DEFAULT_PLAN_RATE = 100_000


@dataclasses.dataclass(frozen=True)
class StateMapPlan:
    """What a card's message state map allows (docs/control-socket.md, "Capacity").

    The map holds one entry per message in flight; an answered message frees its entry when its
    reply has passed, an unanswered one holds it until it expires (``timeout_s``). At ``rate``
    messages/s with a fraction ``L`` unanswered, ``rate·L·timeout_s`` entries are held by lost
    messages, so the map tolerates ``L ≤ (capacity − round_messages) / (rate·timeout_s)``.

    Attributes:
        capacity: entries (= messages in flight at once).
        timeout_s: expiry of an unanswered message, seconds.
        round_messages: messages one round of every client puts in flight (protocol v2: one
            message per client and shard the round touches — every shard with hash sharding,
            those holding a table with table sharding — and the tail probe that follows each
            shard's last message; a round split past the client's ``msg_frames`` adds messages).
        rate: messages/s the tolerance is stated for.
        loss_tolerated: fraction of messages that may go unanswered at ``rate`` before a full
            map drops new requests (``state_full``); may exceed 1 (any loss is fine).
    """

    capacity: int
    timeout_s: float
    round_messages: int
    rate: float
    loss_tolerated: float

    def describe(self) -> str:
        """One line for people: ``state map: 65,536 messages in flight, ...``."""
        lost_entries = max(0, self.capacity - self.round_messages)
        tol = ("any loss" if self.loss_tolerated >= 1 else f"{100 * self.loss_tolerated:.2f}% of messages "
               f"unanswered")
        return (f"state map: {self.capacity:,} messages in flight at once (one round of every client puts "
                f"{self.round_messages:,} in flight); an unanswered message holds its entry "
                f"{self.timeout_s:g} s until it expires, so at {self.rate:,.0f} messages/s it tolerates "
                f"{tol} ({lost_entries:,} entries / ({self.rate:,.0f}/s × {self.timeout_s:g} s)) "
                f"before it drops new requests as state_full")


def state_map_plan(cfg: ClusterConfig, rate: float = DEFAULT_PLAN_RATE, capacity: int | None = None,
                   timeout_ms: int | None = None) -> StateMapPlan:
    """The :class:`StateMapPlan` of ``cfg``'s card at ``rate`` messages/s.

    Args:
        cfg: the cluster (its ``[card]`` gives capacity and timeout unless given).
        rate: messages per second through the card (> 0).
        capacity, timeout_ms: the running card's ``state_size`` / ``state_timeout_ms``
            (``pipeline load`` passes what the card reports).

    Raises:
        ValueError: ``rate`` not > 0, or no capacity (no ``[card]`` and none given).
    """
    if not rate > 0:
        raise ValueError(f"rate must be > 0 messages/s, got {rate}")
    card = cfg.card
    if capacity is None or timeout_ms is None:
        if card is None:
            raise ValueError("the config has no [card]: no state map to plan")
        capacity = card.state_size if capacity is None else capacity
        timeout_ms = card.state_timeout_ms if timeout_ms is None else timeout_ms
    if cfg.sharding == "table":
        ids = [sh.id for sh in cfg.shards]
        touched = len({t.shard if t.shard is not None else ids[t.id % len(ids)] for t in cfg.tables})
    else:
        touched = len(cfg.shards)
    round_messages = len(cfg.clients) * touched * 2  # a message and its tail probe per shard
    timeout_s = timeout_ms / 1000.0
    tol = max(0, capacity - round_messages) / (rate * timeout_s)
    return StateMapPlan(capacity, timeout_s, round_messages, float(rate), tol)
