"""The card on a NIC given by PCI address (docs/deploy.md): EAL arguments, the sysfs checks
(device present, bound to a driver DPDK can use, hugepages free) on a fake sysfs tree, and
`pipeline load --pci` end to end with the stand-in embnic-dp. No hardware.

Run alone: python3 -m pytest -q tests/control/test_pci.py
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from embnic.client_lib.config import ConfigError, load_config, normalize_bdf
from embnic.control.targets.dpdk import pci as P
from embnic.control.targets.dpdk.process import eal_argv
from embnic.control.errors import OperationalError, UsageError
from embnic.control.runstate import pid_matches, read_state
from embnic.control.targets.dpdk.target import DpdkTarget


A, B = "0000:3b:00.0", "0000:3b:00.1"


def fake_sysfs(root: Path, devices: dict, free_hugepages: int = 512) -> Path:
    """``root`` laid out like /sys: ``bus/pci/devices/BDF`` (its ``driver`` link to
    ``bus/pci/drivers/NAME`` when ``devices[BDF]`` names one) and ``kernel/mm/hugepages``."""
    for bdf, drv in devices.items():
        d = root / "bus" / "pci" / "devices" / bdf
        d.mkdir(parents=True)
        if drv:
            (root / "bus" / "pci" / "drivers" / drv).mkdir(parents=True, exist_ok=True)
            os.symlink(f"../../../bus/pci/drivers/{drv}", d / "driver")
    h = root / "kernel" / "mm" / "hugepages" / "hugepages-2048kB"
    h.mkdir(parents=True)
    (h / "nr_hugepages").write_text(f"{free_hugepages}\n")
    (h / "free_hugepages").write_text(f"{free_hugepages}\n")
    return root


def test_eal_arguments_for_pci_devices():
    assert eal_argv("0", "p", ["net_ring0"]) == ["-l", "0", "--no-huge", "--no-pci", "-m", "256", "--file-prefix",
                                                 "p", "--vdev", "net_ring0"]  # unchanged without PCI
    assert eal_argv("0,1", "p", pci=[A, B], hugepages=True) == ["-l", "0,1", "--file-prefix", "p", "-a", A, "-a", B]
    assert eal_argv("0", "p", ["net_null0"], pci=[A]) == ["-l", "0", "--no-huge", "-m", "256", "--file-prefix", "p",
                                                          "-a", A, "--vdev", "net_null0"]


def test_target_takes_pci_from_the_config_or_the_option(tmp_path, card_config):
    CARD_TOML = card_config.read_text()
    p = tmp_path / "c.toml"
    p.write_text(CARD_TOML.replace('lcores = "0"', f'lcores = "0"\npci = ["3b:00.0", "{B}"]'))
    cfg = load_config(p)
    assert cfg.card.pci == (A, B)
    t = DpdkTarget(cfg, name="x", run_dir=tmp_path, vdevs=["net_null0"])
    eal = t.eal_argv()
    assert "--no-pci" not in eal and "--no-huge" not in eal and "-m" not in eal
    assert eal[eal.index("-a"):] == ["-a", A, "-a", B, "--vdev", "net_null0"]
    # the option wins; --no-hugepages keeps the no-huge memory
    t = DpdkTarget(cfg, name="x", run_dir=tmp_path, pci=["0000:5e:00.0"], hugepages=False)
    assert t.eal_argv()[:6] == ["-l", "0", "--no-huge", "-m", "256", "--file-prefix"]
    assert t.eal_argv()[-2:] == ["-a", "0000:5e:00.0"]
    # --eal-args replace the defaults; the devices are still allow-listed
    t = DpdkTarget(cfg, name="x", run_dir=tmp_path, eal_args="-l 0 --in-memory")
    assert t.eal_argv() == ["-l", "0", "--in-memory", "-a", A, "-a", B]
    with pytest.raises(UsageError, match="not a PCI address"):
        DpdkTarget(cfg, pci=["3b:00"])
    for bad, msg in (('pci = ["zz:00.0"]', r"card.pci\[0\]: 'zz:00.0' is not a PCI address"),
                     (f'pci = ["{A}", "3b:00.0"]', r"card.pci\[1\]: 0000:3b:00.0 is listed twice"),
                     ("pci = [3]", r"card.pci\[0\]: must be a PCI address string")):
        p.write_text(CARD_TOML.replace('lcores = "0"', f'lcores = "0"\n{bad}'))
        with pytest.raises(ConfigError, match=msg):
            load_config(p)
    assert normalize_bdf("0000:AF:1F.7") == "0000:af:1f.7"


@pytest.mark.parametrize("driver,problem", [
    ("vfio-pci", None), ("uio_pci_generic", None), ("igb_uio", None), ("mlx5_core", None),
    ("ice", f"bound to the kernel driver 'ice', which DPDK cannot use: `ip link set <its netdev> down && "
            f"dpdk-devbind.py -b vfio-pci {A}`"),
    ("", f"bound to no driver: bind it to vfio-pci with `modprobe vfio-pci && dpdk-devbind.py -b vfio-pci {A}`"),
])
def test_driver_check(tmp_path, driver, problem):
    root = fake_sysfs(tmp_path, {A: driver})
    got = P.pci_problem("3b:00.0", root)
    assert got == (None if problem is None else f"PCI device {A} is {problem}")
    assert P.pci_problem(B, root).startswith(f"no PCI device {B} (") and "dpdk-devbind.py --status-dev net" in \
        P.pci_problem(B, root)
    assert P.hugepages_problem(root) is None
    (tmp_path / "kernel/mm/hugepages/hugepages-2048kB/free_hugepages").write_text("0\n")
    assert "no free hugepages" in P.hugepages_problem(root) and "--no-hugepages" in P.hugepages_problem(root)


def test_load_refuses_before_starting_anything(tmp_path, monkeypatch, card_config):
    """Missing device, a kernel-bound device, no hugepages: OperationalError with the fix, and no
    process started (no state file)."""
    cfg = load_config(card_config)
    run = tmp_path / "run"
    for devices, hp, msg in (({}, 512, f"no PCI device {A}"),
                             ({A: "i40e", B: "vfio-pci"}, 512, f"dpdk-devbind.py -b vfio-pci {A}"),
                             ({A: "vfio-pci", B: "mlx5_core"}, 0, "no free hugepages")):
        root = fake_sysfs(tmp_path / f"sys{len(devices)}{hp}", devices, hp)
        t = DpdkTarget(cfg, name="x", run_dir=run, pci=[A, B], vdevs=["net_null0"], sysfs_root=root,
                       binary="/nonexistent/embnic-dp")
        with pytest.raises(OperationalError, match=msg.replace(".", r"\.")):
            t.load()
        assert read_state(run, "x") is None



def test_cli_load_with_pci(invoke, env, fake_dp_factory, tmp_path, monkeypatch, card_config):
    """`pipeline load --pci` with the stand-in embnic-dp: refused in one line naming the fix while
    the device is on its kernel driver; once bound to vfio-pci it loads with -a BDF, hugepages,
    the PCI device as DPDK port 0."""
    if os.geteuid() != 0:
        monkeypatch.setattr(DpdkTarget, "NEEDS_ROOT", False)
    dp = fake_dp_factory()
    cfgp = card_config
    root = fake_sysfs(tmp_path / "sys", {A: "ice"})
    monkeypatch.setenv("EMBNIC_SYSFS_ROOT", str(root))
    args = ["pipeline", "load", "-c", cfgp, "--binary", dp, "--pci", "3b:00.0", "--vdev", "net_ring1",
            "--vdev", "net_ring2"]
    r = invoke(*args)
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1, r.output
    assert f"dpdk-devbind.py -b vfio-pci {A}" in r.output
    os.unlink(root / "bus/pci/devices" / A / "driver")
    (root / "bus/pci/drivers/vfio-pci").mkdir(parents=True)
    os.symlink("../../../bus/pci/drivers/vfio-pci", root / "bus/pci/devices" / A / "driver")
    r = invoke(*args)
    try:
        assert r.exit_code == 0, r.output
        st = read_state(env, "embnic")
        eal = st["argv"][1:st["argv"].index("--")]
        assert eal[:2] == ["-l", "0"] and eal[2] == "--file-prefix"
        assert eal[4:] == ["-a", A, "--vdev", "net_ring1", "--vdev", "net_ring2"]
        assert "fake embnic-dp: 3 ports" in open(st["log"]).read()
        assert "0: " + A in r.output  # the PCI device is DPDK port 0
    finally:
        st = read_state(env, "embnic")
        if st and pid_matches(st):
            assert invoke("pipeline", "unload").exit_code == 0
