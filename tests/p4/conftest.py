"""Fixtures of the P4 tests: the compiled program, the BMv2 tools and the control channels.

The program is the committed p4/build/ (embnic.control.targets.p4compiled), so every test of
the compiled program and of the PNA pipeline runs on every machine. Tests that run BMv2 skip,
with one reason, where simple_switch / simple_switch_grpc are not on PATH; the fresh-compile
checks (test_p4_compiled.py) skip where p4c / p4c-dpdk 1.2.4.8 are not (none of them is in the
package archives these machines reach: p4/README.md, "P4 tools"). Tests taking
``bmv2_channel`` run once per control channel of the bmv2 target: ``thrift`` (simple_switch)
and ``p4runtime`` (simple_switch_grpc + finsy/grpcio); a channel whose switch or Python packages
are not installed skips with the reason.
Run alone: sudo python3 -m pytest -q tests/p4
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from embnic.control.targets.bmv2 import switch as bmv2

from embnic.control.targets.p4dpdk import swx as p4dpdk

REPO = Path(__file__).resolve().parents[2]
# the conformance cases are shared with the DPDK card's tests
sys.path.insert(0, str(REPO / "tests" / "dataplane"))


def _skip_without(*tools: str) -> None:
    missing = bmv2.missing_tools(tools)
    if missing:
        pytest.skip(f"{', '.join(missing)} not on PATH: {bmv2.TOOL_HINTS.get(missing[0], '')}")


@pytest.fixture(scope="session")
def p4_json() -> Path:
    """p4/v1model/embnic.p4 compiled for BMv2 (v1model): what the bmv2 target runs (the committed
    p4/build/v1model/embnic.json while p4/ is unchanged)."""
    json_path, _ = bmv2.program_json()
    return json_path


@pytest.fixture(scope="session", params=["thrift", "p4runtime"])
def bmv2_channel(request) -> str:
    """Each control channel of the bmv2 target that is installed (skips the others)."""
    channel = request.param
    _skip_without(bmv2.CHANNEL_SWITCH[channel], "simple_switch_CLI")
    if channel == "p4runtime":
        from embnic.control.targets.bmv2 import p4runtime

        if not p4runtime.available():
            pytest.skip(f"P4Runtime's Python packages are missing: {p4runtime.INSTALL_HINT}")
    return channel


@pytest.fixture
def channel_env(bmv2_channel, monkeypatch) -> str:
    """``bmv2_channel`` set as ``EMBNIC_BMV2_CHANNEL`` (for CLI and testbed paths)."""
    monkeypatch.setenv("EMBNIC_BMV2_CHANNEL", bmv2_channel)
    return bmv2_channel


@pytest.fixture(scope="session")
def bmv2_ready(p4_json) -> Path:
    """The compiled program, where simple_switch can run it (tools present, root for netns)."""
    _skip_without("simple_switch", "simple_switch_CLI")
    if os.geteuid() != 0:
        pytest.skip("running simple_switch in its own network namespace needs root")
    return p4_json


@pytest.fixture(scope="session")
def p4dpdk_pipeline():
    """p4/pna/embnic.p4 built into a pipeline library for embnic-swx (the committed p4/build/pna spec,
    rewritten, generated and compiled; cached); skips in one line where DPDK's pipeline headers or
    embnic-swx are missing, or without root (the EAL)."""
    why = p4dpdk.missing()
    if why:
        pytest.skip(f"the p4dpdk target needs {why}")
    if os.geteuid() != 0:
        pytest.skip("running embnic-swx (DPDK's EAL) needs root")
    return p4dpdk.build_pipeline()
