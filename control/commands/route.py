"""``embnic route add|del|list``: the card's route table (shard → card port, MAC, IPv4, UDP port)."""
from __future__ import annotations

from embnic.control.commands.entries import make_group

route = make_group("route")
