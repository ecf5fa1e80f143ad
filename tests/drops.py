"""The card's drop counters in tests that run it among real hosts (tests/dataplane/test_live.py and
the testbed tests): which drops are the hosts' own chatter, and which are embnic traffic the card
refused. Not a test file; tests/conftest.py puts this folder on ``sys.path``.
"""
from __future__ import annotations

# Drop reasons a frame gets before the card knows it is embnic traffic (parse.c checks the ether
# type, IPv4 options, the protocol, then the UDP port; ARP not for the card's address). The hosts'
# kernels send such frames on their own: an IGMP membership report carries the Router Alert option
# (RFC 2113) and is counted as ip_options; CI once saw one on the bridged testbed. A few are
# expected; every other reason is embnic traffic the card refused.
FOREIGN_DROPS = ("bad_ether", "ip_options", "not_udp", "bad_port", "arp_ignored")
FOREIGN_DROPS_MAX = 16


def embnic_drops(drops: dict) -> dict:
    """The card's drop counters for embnic traffic: ``drops`` (reason -> frames) without the
    reasons of :data:`FOREIGN_DROPS`, after asserting those stay a handful (≤ FOREIGN_DROPS_MAX)."""
    foreign = {k: v for k, v in drops.items() if k in FOREIGN_DROPS and v}
    assert sum(foreign.values()) <= FOREIGN_DROPS_MAX, ("more non-embnic frames than a host's own chatter", drops)
    assert set(FOREIGN_DROPS) <= set(drops), ("a drop reason was renamed", sorted(drops))
    return {k: v for k, v in drops.items() if k not in FOREIGN_DROPS}
