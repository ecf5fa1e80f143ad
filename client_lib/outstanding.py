"""A request message in flight in the client transport (:class:`Outstanding`)."""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from .reassembly import Message


@dataclasses.dataclass
class Outstanding:
    """One request message of a round, from its first transmission to its answer: what the
    client's send window, retransmission timer and loss detection keep per message
    (:class:`~embnic.client_lib.client.EmbeddingClient`; times in s from ``time.monotonic``)."""


    msg_id: int
    msg_type: int
    shard_id: int
    table_id: int
    num_keys: int
    dest: tuple[str, int]
    frames: list
    on_reply: Callable[[Message], None]
    reply_frames: int = 1
    datagram: int = 0  # largest IPv4 datagram of the request or its reply, bytes
    t_first: float = 0.0
    t_sent: float = 0.0
    deadline: float = 0.0
    rto: float = 0.0
    tries: int = 0
    seq0: int = 0  # order of this message's first transmission among the round's transmissions
    seq: int = 0  # order of its latest transmission (first or re-sent)
    lost_at: float = 0.0  # when a later-sent answered message makes it lost (0: no such evidence)
    keys: np.ndarray | None = None  # a lookup's keys uint64 (num_keys,), for a repair
    root: "Outstanding | None" = None  # a repair: the message of the round it completes in the end
    probe: bool = False  # a tail probe: a one-key lookup whose answer only shows what came before

    @property
    def cost(self) -> int:
        """Frames this message holds in its shard's send window (request + reply)."""
        return len(self.frames) + self.reply_frames
