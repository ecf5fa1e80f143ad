"""The card's ``--vdev`` specs checked before DPDK starts (a malformed spec, the same device twice,
more DPDK ports than the config's card has), each fault as one line naming the fix rather than
deep in the card's log. A spec is DPDK's devargs, ``NAME[,KEY=VALUE...]`` (a value may hold a
bracketed list); whether the driver exists is the EAL's to say.
"""
from __future__ import annotations

import re
from typing import Sequence

#: a vdev's device name: an ethdev driver's (net_*, eth_* in older DPDK) with its instance suffix
_NAME_RE = re.compile(r"^(net|eth)_[A-Za-z0-9_]*[A-Za-z0-9]$")
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
EXAMPLE = "--vdev net_ring0, --vdev net_af_packet0,iface=veth0"


def _split_args(text: str) -> list[str] | None:
    """``text`` cut at the commas outside brackets; None when the brackets do not pair."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                return None
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        return None
    out.append(cur)
    return out


def vdev_problem(spec: str) -> str | None:
    """What is wrong with one ``--vdev`` spec (one line naming the fix), or None when it is well formed."""
    if not isinstance(spec, str) or not spec.strip():
        return f"--vdev {spec!r}: empty; give a DPDK vdev, e.g. {EXAMPLE}"
    if any(c.isspace() for c in spec):
        return (f"--vdev {spec!r}: a vdev spec holds no spaces (NAME[,KEY=VALUE...], e.g. {EXAMPLE}); "
                "give one --vdev per device")
    parts = _split_args(spec)
    if parts is None:
        return f"--vdev {spec!r}: unbalanced brackets in its arguments"
    name, args = parts[0], parts[1:]
    if not _NAME_RE.match(name):
        return (f"--vdev {spec!r}: {name!r} is not an ethdev vdev name (net_<driver><n>, e.g. {EXAMPLE}); "
                "the card's ports are network devices")
    for a in args:
        key = a.split("=", 1)[0]
        if not a:
            return f"--vdev {spec!r}: an empty argument (two commas, or one at the end); write NAME,KEY=VALUE,..."
        if not _KEY_RE.match(key):
            return f"--vdev {spec!r}: {a!r} is not KEY=VALUE; write e.g. net_af_packet0,iface=veth0"
        if "=" not in a:  # DPDK hands such an argument to the PMD with no value: af_packet dereferences it
            return f"--vdev {spec!r}: {a!r} has no value (every vdev argument is KEY=VALUE); write e.g. {a}=VALUE"
        if not a.split("=", 1)[1]:
            return f"--vdev {spec!r}: {key}= has no value; write e.g. {key}=VALUE"
    return None


def vdevs_problem(vdevs: Sequence[str], port_ids: Sequence[int] | None = None, n_pci: int = 0) -> str | None:
    """The first fault of a card's vdev list, or None.

    Args:
        vdevs: the ``--vdev`` specs, DPDK ports ``n_pci..`` in this order.
        port_ids: the config's ``card.ports`` ids (the card uses DPDK ports ``0..max(id)``); None:
            the count is not checked (``--eal-args`` may name more devices).
        n_pci: NIC ports given with ``--pci`` (DPDK ports 0.. before any vdev).
    Returns:
        one line naming the fix: a malformed spec (:func:`vdev_problem`), a device given twice,
        or more ports than the card has (naming the ``--vdev`` to drop).
    """
    seen: dict[str, int] = {}
    for i, v in enumerate(vdevs):
        bad = vdev_problem(v)
        if bad:
            return bad
        name = _split_args(v)[0]
        if name in seen:
            return (f"--vdev {v!r}: device {name} is given twice (vdevs {seen[name]} and {i}); "
                    f"every port needs a name of its own, e.g. {name.rstrip('0123456789')}{len(vdevs)}")
        seen[name] = i
    if port_ids is not None and port_ids:
        need = max(port_ids) + 1
        have = n_pci + len(vdevs)
        if have > need and vdevs:
            extra = list(vdevs)[max(0, need - n_pci):]
            what = f"{n_pci} PCI device(s) and {len(vdevs)} vdev(s)" if n_pci else f"{len(vdevs)} vdevs"
            return (f"{what} given but the card has {need} DPDK port(s) (card.ports ids "
                    f"{', '.join(map(str, sorted(port_ids)))}): drop " + " ".join(f"--vdev {v}" for v in extra)
                    + ", or add the port to [card] ports")
    return None
