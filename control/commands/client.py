"""``embnic client add|del|list``: the card's client table (client → card port, MAC, IPv4, UDP port)."""
from __future__ import annotations

from embnic.control.commands.entries import make_group

client = make_group("client")
