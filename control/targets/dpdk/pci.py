"""PCI devices for the card on a real NIC (docs/deploy.md): before ``pipeline load --pci BDF`` (or
``[card] pci``) starts the card, each device must be present and bound to a driver DPDK can use,
and hugepages free; :func:`pci_problem` and :func:`hugepages_problem` say otherwise in one line
naming the fix. The sysfs root is ``/sys`` unless ``EMBNIC_SYSFS_ROOT`` names another (tests).
"""
from __future__ import annotations

import os
from pathlib import Path

from embnic.client_lib.config import normalize_bdf  # noqa: F401 (re-exported: the address rule)

#: drivers that hand the whole device to DPDK
DPDK_DRIVERS = ("vfio-pci", "uio_pci_generic", "igb_uio")
#: kernel drivers DPDK drives through (bifurcated: the kernel keeps the device)
BIFURCATED_DRIVERS = ("mlx5_core",)

def sysfs_root(root: str | os.PathLike | None = None) -> Path:
    """``root``, else ``$EMBNIC_SYSFS_ROOT``, else ``/sys``."""
    return Path(root or os.environ.get("EMBNIC_SYSFS_ROOT") or "/sys")


def pci_problem(bdf: str, root: str | os.PathLike | None = None) -> str | None:
    """Why DPDK could not use the device at ``bdf``, as one line naming the fix; None if it can.

    Raises:
        ValueError: a malformed address (:func:`~embnic.client_lib.config.normalize_bdf`).
    """
    b = normalize_bdf(bdf)
    dev = sysfs_root(root) / "bus" / "pci" / "devices" / b
    if not dev.exists():
        return (f"no PCI device {b} ({dev} absent): check the address with `dpdk-devbind.py --status-dev net` "
                "or `lspci -D`")
    # the driver bound to it: the name its ``driver`` link points at
    drv = Path(os.readlink(dev / "driver")).name if os.path.lexists(dev / "driver") else None
    if drv in DPDK_DRIVERS or drv in BIFURCATED_DRIVERS:
        return None
    if drv is None:
        return (f"PCI device {b} is bound to no driver: bind it to vfio-pci with `modprobe vfio-pci && "
                f"dpdk-devbind.py -b vfio-pci {b}`")
    return (f"PCI device {b} is bound to the kernel driver {drv!r}, which DPDK cannot use: `ip link set <its "
            f"netdev> down && dpdk-devbind.py -b vfio-pci {b}`")


def hugepages_problem(root: str | os.PathLike | None = None) -> str | None:
    """None when some hugepages are free (any size under ``ROOT/kernel/mm/hugepages``), else one
    line naming the fix."""
    d = sysfs_root(root) / "kernel" / "mm" / "hugepages"
    free = 0
    try:
        for sub in d.iterdir():
            try:
                free += int((sub / "free_hugepages").read_text().strip() or 0)
            except (OSError, ValueError):
                continue
    except OSError:
        pass
    if free > 0:
        return None
    return ("no free hugepages for the card on a PCI device: reserve some (`echo 1024 > "
            "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages`, or `dpdk-hugepages.py -p 2M --setup 2G`), "
            "or run without them (--no-hugepages)")
