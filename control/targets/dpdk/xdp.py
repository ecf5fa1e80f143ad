"""The card's ``net_af_xdp`` ports: their devargs, the XDP hook of their interfaces, their limits.

An interface has one XDP hook, which the PMD needs: :func:`af_xdp_problem` finds it taken before the
card starts and says so in one line. The MTU limits and copy versus zero-copy mode are measured and
explained in docs/deploy.md.
"""
from __future__ import annotations

import json
import subprocess
from typing import Sequence

#: the PMDs the testbed, the demo and ``bench dataplane`` run the card on over veth pairs
PMDS = ("af_packet", "af_xdp")
#: the largest MTU of a veth whose peer takes a native XDP program (4 KiB pages; measured: 3507 is refused)
VETH_XDP_MAX_MTU = 3506
#: net_af_xdp's ``max_rx_pktlen`` in DPDK 22.11 with 4 KiB pages (40 bytes more than the kernel delivers:
#: it assumes a 24-byte object header)
PMD_MAX_RX_PKTLEN = 3560
#: the largest frame (no CRC) a card's net_af_xdp port receives with 4 KiB pages: a page less the object
#: header, the mbuf, its headroom and the kernel's XDP headroom
AF_XDP_MAX_FRAME = 4096 - 64 - 128 - 128 - 256
#: the largest MTU of a card with a net_af_xdp port (4 KiB pages; measured: the card refuses 3507)
AF_XDP_MAX_MTU = AF_XDP_MAX_FRAME - 14


def is_af_xdp(vdev: str) -> bool:
    """True if the ``--vdev`` spec ``vdev`` is a ``net_af_xdp`` port (``net_af_xdp0,iface=eth1``)."""
    return vdev.split(",", 1)[0].startswith("net_af_xdp")


def devargs(vdev: str) -> dict[str, str]:
    """The ``key=value`` devargs of a ``--vdev`` spec: ``"net_af_xdp0,iface=Np0,start_queue=2"`` →
    ``{"iface": "Np0", "start_queue": "2"}`` (a key without ``=`` maps to ``""``)."""
    out: dict[str, str] = {}
    for part in vdev.split(",")[1:]:
        k, _, v = part.partition("=")
        if k.strip():
            out[k.strip()] = v.strip()
    return out


def attached_xdp(ifname: str, netns: str | None = None) -> dict | None:
    """The XDP program attached to kernel interface ``ifname`` (in namespace ``netns``), as
    ``ip -d -j link show`` reports it: ``{"id", "name", "mode"}`` (mode 1 native, 2 generic,
    3 offloaded), or None if it has none.

    Raises:
        LookupError: no such interface (the message is ``ip``'s).
        OSError: ``ip`` (iproute2) is missing.
    """
    argv = ["ip", *(["-n", netns] if netns else []), "-d", "-j", "link", "show", "dev", ifname]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise LookupError((r.stderr or r.stdout).strip() or f"`{' '.join(argv)}` failed")
    try:
        link = json.loads(r.stdout)[0]
    except (ValueError, IndexError) as e:
        raise LookupError(f"`{' '.join(argv)}` printed no interface: {e}") from None
    xdp = link.get("xdp") or {}
    prog = xdp.get("prog") or next((a.get("prog") for a in xdp.get("attached", []) if a.get("prog")), None)
    if not prog:
        return None
    return {"id": prog.get("id"), "name": prog.get("name") or "(unnamed)", "mode": xdp.get("mode")}


def af_xdp_problem(vdevs: Sequence[str], netns: str | None = None) -> str | None:
    """Why the ``net_af_xdp`` ports among ``vdevs`` cannot start, or None: a port without
    ``iface=``, an interface that does not exist (in ``netns``), or one whose XDP hook another
    program already holds. One line naming the interface and the fix.

    A card that exits without detaching (SIGKILL) leaves its ``xsk_def_prog`` attached; that is
    named too (the fix is the same: detach it).
    """
    where = f" in network namespace {netns}" if netns else ""
    for v in vdevs:
        if not is_af_xdp(v):
            continue
        iface = devargs(v).get("iface")
        if not iface:
            return f"--vdev {v}: net_af_xdp needs iface=NAME (the kernel interface whose queue it opens)"
        try:
            prog = attached_xdp(iface, netns)
        except LookupError as e:
            return f"--vdev {v}: no interface {iface}{where} ({e})"
        except OSError as e:
            return f"--vdev {v}: cannot ask iproute2 about {iface} ({e}); install iproute2"
        if prog is not None:
            mode = {1: "native", 2: "generic", 3: "offloaded"}.get(prog["mode"], "")
            whose = (" (the testbed's bpf netem: clear it with `embnic testbed netem --clear`, or use "
                     "--backend user)" if prog["name"] == "embnic_loss" else
                     " (libxdp's: a net_af_xdp port's, left behind if its process was killed)"
                     if prog["name"] == "xsk_def_prog" else "")
            return (f"--vdev {v}: interface {iface}{where} already runs XDP program {prog['name']} (id {prog['id']}"
                    f"{', ' + mode if mode else ''}){whose}; net_af_xdp attaches its own there and an interface has "
                    f"one XDP hook: detach it (`ip {'-n ' + netns + ' ' if netns else ''}link set dev {iface} xdp off`)"
                    " or run that port on net_af_packet")
    return None
