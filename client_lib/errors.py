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


class ShardError(EmbnicError):
    """A shard answered with an ERROR message; ``status`` is the :class:`consts.Status`."""

    def __init__(self, shard_id: int, table_id: int, status: int):
        self.shard_id, self.table_id = shard_id, table_id
        try:
            self.status = consts.Status(status)
            name = self.status.name
        except ValueError:
            self.status, name = status, str(status)
        super().__init__(f"shard {shard_id} refused a request for table {table_id}: {name}")
