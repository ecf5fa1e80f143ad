"""Helpers of the namespace-testbed tests (tests/testbed/test_topology.py, test_netem.py, ...).

Not a test file. Every testbed a test makes is named ``en<tag><pid>`` (unique per test
process), lives under a temporary RUN_DIR and is torn down by the test.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from embnic.control.runstate import is_root
from embnic.testbed.net import topology as T

from drops import FOREIGN_DROPS, FOREIGN_DROPS_MAX, embnic_drops  # noqa: F401 (the testbed tests import them from here)

REPO = Path(__file__).resolve().parents[2]
TESTBED_TOML = REPO / "examples" / "testbed.toml"
DP_BINARY = REPO / "dataplane" / "build" / "embnic-dp"

needs_root = pytest.mark.skipif(not is_root(),
                                reason="needs root (CAP_NET_ADMIN) to create network namespaces and veths")


def tb_name(tag: str) -> str:
    """A testbed name unique to this test process: ``en`` + one-letter tag + pid (≤ 8 chars)."""
    assert len(tag) == 1
    return f"en{tag}{os.getpid() % 100000}"


def leftovers(name: str) -> dict:
    """What of testbed ``name`` still exists: namespaces, interfaces in the root namespace, state
    file, the card's DPDK runtime directory."""
    ns = [n for n in T.netns_list() if n.startswith(f"{name}-")]
    links = [n for n in os.listdir("/sys/class/net") if n.startswith(name)]
    return {"netns": ns, "links": links, "state": T.state_path(name).exists(),
            "dpdk_runtime": Path(f"/var/run/dpdk/embnic-tb-{name}").exists()}


def assert_gone(name: str, pids=()) -> None:
    """Fail unless nothing of testbed ``name`` is left (namespaces, veths, state, the given pids)."""
    left = leftovers(name)
    assert left == {"netns": [], "links": [], "state": False, "dpdk_runtime": False}, left
    alive = [p for p in pids if T.proc_starttime(p) is not None]
    assert not alive, f"processes still running: {alive}"


def build_dataplane() -> Path:
    """Build dataplane/build/embnic-dp (``make -C dataplane``); fails if DPDK is absent (the
    project's set-up, ``make deps``, installs it)."""
    if subprocess.run(["pkg-config", "--exists", "libdpdk"]).returncode != 0:
        pytest.fail("DPDK (libdpdk-dev, pkg-config libdpdk) is not installed: run `make deps`")
    p = subprocess.run(["make", "-C", str(REPO / "dataplane")], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.fail(f"make -C dataplane failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    assert DP_BINARY.exists()
    return DP_BINARY


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """A private RUN_DIR (state files, logs) for one test."""
    d = tmp_path / "run"
    d.mkdir()
    monkeypatch.setenv("EMBNIC_RUN_DIR", str(d))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def cleanup(run_dir):  # noqa: F811
    """A list of testbed names to tear down after the test whatever happened (``cleanup.append(name)``)."""
    names: list[str] = []
    yield names
    for n in names:
        if is_root():
            T.down(n, run_dir)
