"""A request message in flight in the numpy round transport (:class:`Outstanding`), the test
oracle of the C round (``pyround.py``)."""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from embnic.client_lib import consts
from embnic.client_lib.reassembly import Message


@dataclasses.dataclass
class Outstanding:
    """One request message of a round, from its first transmission to its answer: what the
    client's send window, retransmission timer and loss detection keep per message
    (:class:`pyround.PyRoundClient`; times in s from ``time.monotonic``)."""


    msg_id: int
    msg_type: int
    shard_id: int
    directory: np.ndarray | None  # codec.DIR_DTYPE (T,) of a lookup or update; None for a SIZE_REQ
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
    value_len: int = 0  # the header's value_len: a lookup's reply rows, an update's gradients (bytes)

    @property
    def msg_len(self) -> int:
        """Body bytes of the request: the type's formula on its counts (consts.expected_msg_len)."""
        return consts.expected_msg_len(self.msg_type, self.num_tables, self.num_keys, self.value_len)

    @property
    def num_tables(self) -> int:
        """Tables in the message's directory (0 for a SIZE_REQ)."""
        return 0 if self.directory is None else len(self.directory)

    @property
    def tables(self) -> list[int]:
        """The table ids of the directory, in body order."""
        return [] if self.directory is None else self.directory["table_id"].tolist()

    @property
    def cost(self) -> int:
        """Frames this message holds in its shard's send window (request + reply)."""
        return len(self.frames) + self.reply_frames
