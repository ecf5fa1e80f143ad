"""Fixtures of the dataplane tests: the embnic-dp binary, built once per session.

Run alone: sudo python3 -m pytest -q tests/dataplane
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from embnic.control.targets.dpdk.process import DpdkProcError, build_card

REPO = Path(__file__).resolve().parents[2]


def _need_dpdk() -> None:
    # the project's set-up installs these (scripts/apt-packages.txt): missing is a failure, not a skip
    if shutil.which("make") is None or shutil.which("pkg-config") is None:
        pytest.fail("make/pkg-config missing: run `make deps`")
    if subprocess.run(["pkg-config", "--exists", "libdpdk"]).returncode != 0:
        pytest.fail("DPDK absent (pkg-config libdpdk): run `make deps` (installs libdpdk-dev)")
    if subprocess.run(["pkg-config", "--exists", "jansson"]).returncode != 0:
        pytest.fail("jansson absent (pkg-config jansson): run `make deps` (installs libjansson-dev)")


@pytest.fixture(scope="session")
def built_card() -> Path:
    """dataplane/build/embnic-dp, built now (no root needed to build)."""
    _need_dpdk()
    try:
        return build_card()
    except DpdkProcError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def card_bin(built_card) -> Path:
    """The binary, for tests that run it (DPDK's EAL needs root here)."""
    if os.geteuid() != 0:
        pytest.skip("running embnic-dp (DPDK EAL, /var/run/dpdk) needs root: run the tests as root")
    return built_card
