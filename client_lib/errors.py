"""Errors of the client library (:class:`~embnic.client_lib.client.EmbeddingClient`)."""
from __future__ import annotations

from . import consts


class EmbnicError(RuntimeError):
    """Base class of client errors."""


class ShardUnavailableError(EmbnicError):
    """A shard did not answer after every try.

    Attributes: ``shard_id``, ``address`` (ip, port) the requests went to, ``tries``.
    """

    def __init__(self, shard_id: int, address: tuple[str, int], tries: int, waited_s: float, what: str,
                 via_card: bool = False, path_mtu_hint: str | None = None, config_path: str | None = None):
        self.shard_id, self.address, self.tries, self.via_card = shard_id, address, tries, via_card
        self.path_mtu_hint = path_mtu_hint
        c = f" -c {config_path}" if config_path else ""
        lossy = ("and the path not dropping most frames (`embnic testbed status` shows a testbed's link "
                 "impairments)?")
        if via_card:
            hint = (f"sent through the card at {address[0]}:{address[1]}); is the card loaded and routing "
                    f"shard {shard_id} (`embnic status{c}`, `embnic route list{c}`), `embnic server --shard "
                    f"{shard_id}` running, {lossy}")
        else:
            hint = (f"sent to {address[0]}:{address[1]}); is `embnic server --shard {shard_id}` running "
                    f"and reachable, {lossy}")
        if path_mtu_hint:
            hint += f" {path_mtu_hint}"
        super().__init__(f"shard {shard_id} did not answer {what} after {tries} tries over {waited_s:.1f} s ({hint}")


#: statuses after which the same request may be taken later, unchanged: nothing of it was applied
#: or remembered (docs/protocol.md, "Status codes")
RETRYABLE_STATUSES = frozenset({consts.Status.STORE_FULL})


class ShardError(EmbnicError):
    """A shard answered with an ERROR message; ``status`` is the :class:`consts.Status` and
    ``table_id`` the table the ERROR names (None when it is about the whole message: the header's
    ``table_id`` was :data:`consts.NO_TABLE`; docs/protocol.md, "Errors"). ``retryable``: the
    status says the request may be taken later as it is (``STORE_FULL``: the shard's disk is full;
    nothing of the refused message was applied) — every other status is final for that request."""

    def __init__(self, shard_id: int, table_id: int | None, status: int):
        self.shard_id = shard_id
        self.table_id = None if table_id is None or table_id == consts.NO_TABLE else int(table_id)
        try:
            self.status = consts.Status(status)
            name = self.status.name
        except ValueError:
            self.status, name = status, str(status)
        self.retryable = self.status in RETRYABLE_STATUSES
        what = f"for table {self.table_id}" if self.table_id is not None else "(the whole message)"
        why = ""
        if self.status == consts.Status.STORE_FULL:
            why = (" (its disk is full: nothing of that update was applied; retry later — the shard takes "
                   "updates again by itself once there is room)")
        super().__init__(f"shard {shard_id} refused a request {what}: {name}{why}")
