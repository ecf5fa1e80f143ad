"""The control plane against the real embnic-dp on net_ring/net_null vdevs (no hugepages, no PCI).

Builds the card with `make -C dataplane` (fails when DPDK is absent: `make deps` installs it) and, for the refusal test,
a second copy built with `make EMBNIC_PROTO_VERSION=3` (a version after this one) (dataplane/README.md). Needs root (EAL).
Run alone: sudo python3 -m pytest -q tests/control/test_control_dataplane_real.py
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from embnic.client_lib import consts
from embnic.client_lib.config import load_config
from embnic.control import buildinfo
from embnic.control.runstate import read_state
from embnic.control.targets.dpdk.process import DPDK_RUNTIME_DIR, REPO_BINARY
from embnic.control.targets.dpdk.target import DpdkTarget

pytestmark = [pytest.mark.dataplane, pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
DP = REPO / "dataplane"
# port 0: a ring (loops back what the card sends), port 1: null (receives zero-filled frames), port 2: a ring
VDEVS = ["net_ring0", "net_null0", "net_ring1"]


def _make(args: list[str], what: str) -> None:
    r = subprocess.run(["make", "-s", *args], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"{what} failed ({' '.join(['make', *args])}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")


@pytest.fixture(scope="session")
def real_dp() -> Path:
    """dataplane/build/embnic-dp, built now (make is a no-op when it is up to date)."""
    if os.geteuid() != 0:
        pytest.skip("embnic-dp (DPDK EAL) needs root: run the tests as root")
    if subprocess.run(["pkg-config", "--exists", "libdpdk"]).returncode != 0:
        pytest.fail("DPDK absent (pkg-config libdpdk): run `make deps` (installs libdpdk-dev)")
    _make(["-C", str(DP)], "building the dataplane")
    assert REPO_BINARY.is_file(), f"make -C dataplane did not produce {REPO_BINARY}"
    return REPO_BINARY


@pytest.fixture(scope="session")
def wrong_dp(real_dp, tmp_path_factory) -> Path:
    """embnic-dp built with EMBNIC_PROTO_VERSION=3 (not the client library's) into a directory of its own (dataplane/Makefile)."""
    d = tmp_path_factory.mktemp("dp-v3")
    _make(["-C", str(DP), f"BUILD={d}", "EMBNIC_PROTO_VERSION=3"],
          "building the dataplane with EMBNIC_PROTO_VERSION=3")
    out = d / "embnic-dp"
    assert out.is_file(), f"make BUILD={d} did not produce {out}"
    return out


@pytest.fixture
def real_config(card_config):
    return card_config


@pytest.fixture
def loaded(invoke, env, real_dp, real_config):
    r = invoke("pipeline", "load", "-c", real_config, "--binary", real_dp, "--lcores", "0,1",
               *sum((["--vdev", v] for v in VDEVS), []))
    try:  # a failed check must not leave the card running
        assert r.exit_code == 0, r.output + "\n" + _log(env)
        # the running card's map size and timeout, and what they allow (docs/control-socket.md, "Capacity")
        assert "state map: 4,096 messages in flight at once" in r.output, r.output  # the config's state_size
        assert "at 100,000 messages/s it tolerates" in r.output
        yield read_state(env, "embnic")
    finally:
        if read_state(env, "embnic") is not None:
            invoke("pipeline", "unload")


def _log(env: Path) -> str:
    p = env / "embnic.log"
    return p.read_text(errors="replace")[-3000:] if p.exists() else "(no log)"


def test_inspect_real_binary(invoke, real_dp):
    bi = buildinfo.read(real_dp)
    assert buildinfo.check(bi) == []
    assert bi.fields == consts.HEADER_FIELDS
    assert bi.dpdk_version.startswith("DPDK")
    r = invoke("inspect", "--check", real_dp)
    assert r.exit_code == 0, r.output
    assert "compatible:    yes" in r.output
    d = json.loads(invoke("inspect", "--json", real_dp).output)
    assert d["compatible"] and d["proto_version"] == consts.VERSION and d["hdr_len"] == consts.HDR_LEN


def test_inspect_and_refuse_wrong_version(invoke, env, wrong_dp, real_config):
    r = invoke("inspect", wrong_dp)
    assert r.exit_code == 0
    assert "compatible:    NO: proto_version 3 != client library's 2" in r.output
    assert invoke("inspect", "--check", wrong_dp).exit_code == 1
    r = invoke("pipeline", "load", "-c", real_config, "--binary", wrong_dp, *sum((["--vdev", v] for v in VDEVS), []))
    assert r.exit_code == 1
    assert f"refusing {wrong_dp}: built for another protocol (proto_version 3" in r.output
    assert read_state(env, "embnic") is None


def test_load_programs_the_card(invoke, loaded):
    info = json.loads(invoke("pipeline", "status", "--json").output)["info"]
    assert [p["port"] for p in info["ports"]] == [0, 1, 2]
    assert info["build"]["proto_version"] == consts.VERSION
    assert info["paused"] is False  # started --paused, resumed once programmed
    routes = json.loads(invoke("route", "list", "--json").output)
    assert [(r["shard"], r["port"], r["mac"], r["ip"], r["udp_port"]) for r in routes] == \
        [(0, 1, "02:00:00:00:01:02", "10.0.1.2", 7878), (1, 2, "02:00:00:00:01:03", "10.0.1.3", 7879)]
    clients = json.loads(invoke("client", "list", "--json").output)
    assert [(c["client"], c["port"], c["mac"], c["ip"], c["udp_port"]) for c in clients] == \
        [(1, 0, "02:00:00:00:00:02", "10.0.0.2", 40000)]


def test_route_add_list_del(invoke, loaded):
    r = invoke("route", "add", "7", "--port", "0", "--mac", "02:ab:cd:00:07:07", "--ip", "10.0.0.7", "--udp-port", "7001")
    assert r.exit_code == 0, r.output
    routes = {x["shard"]: x for x in json.loads(invoke("route", "list", "--json").output)}
    assert routes[7] == {"shard": 7, "port": 0, "mac": "02:ab:cd:00:07:07", "ip": "10.0.0.7", "udp_port": 7001}
    r = invoke("route", "list")
    assert any(ln.split() == ["7", "0", "02:ab:cd:00:07:07", "10.0.0.7", "7001"] for ln in r.output.splitlines())
    assert invoke("route", "del", "7").exit_code == 0
    assert 7 not in {x["shard"] for x in json.loads(invoke("route", "list", "--json").output)}
    r = invoke("route", "del", "7")
    assert r.exit_code == 2 and "the card has no route for shard 7: `embnic route list`" in r.output
    r = invoke("client", "add", "9", "--port", "0", "--mac", "02:00:00:00:09:09", "--ip", "10.0.0.9", "--udp-port", "40009")
    assert r.exit_code == 0, r.output
    assert 9 in {x["client"] for x in json.loads(invoke("client", "list", "--json").output)}
    assert invoke("client", "del", "9").exit_code == 0
    assert invoke("client", "del", "9").exit_code == 2


def test_a_port_the_card_lacks_is_a_usage_error(invoke, loaded):
    """The card refuses the argument ("kind": "argument"): exit 2 naming the option, as the bmv2
    target does — was 'card refused route_add: field 'port' must be an integer 0..N' with exit 1."""
    nports = len(VDEVS)
    for kind, id_, udp in (("route", "7", "7001"), ("client", "9", "40009")):
        r = invoke(kind, "add", id_, "--port", "7", "--mac", "02:ab:cd:00:07:07", "--ip", "10.0.0.7",
                   "--udp-port", udp)
        assert r.exit_code == 2, r.output
        assert r.output.startswith(f"Error: --port 7: card refused {kind}_add: field 'port' must be an integer "
                                   f"0..{nports - 1}"), r.output
        assert len(r.output.strip().splitlines()) == 1


def test_status_and_state_dump(invoke, loaded):
    r = invoke("status", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    c = d["counters"]
    for reason in ("too_short", "bad_magic", "bad_version", "unknown_client", "unknown_shard", "ring_full"):
        assert reason in c["drops"], reason
    assert c["ring"]["size"] == 1024  # [card] ring_size of the config
    assert 0 <= c["ring"]["count"] <= c["ring"]["high_water"] <= c["ring"]["size"]
    assert d["state"]["capacity"] >= 4096
    # net_null0 (port 1) delivers zero-filled frames: they are received and dropped by reason
    deadline = time.monotonic() + 20
    while True:
        c = json.loads(invoke("status", "--json").output)["counters"]
        rx1 = next(p for p in c["ports"] if p["port"] == 1)["rx_frames"]
        if rx1 > 0 and sum(c["drops"].values()) > 0:
            break
        assert time.monotonic() < deadline, f"no frames counted on the net_null port: {c}"
        time.sleep(0.1)
    r = invoke("status")
    assert r.exit_code == 0 and "drops     total" in r.output and "high water" in r.output
    r = invoke("state", "dump", "--json")
    assert r.exit_code == 0, r.output
    assert isinstance(json.loads(r.output), list)
    assert invoke("state", "summary").exit_code == 0


def test_second_load_and_unload(invoke, env, loaded, real_dp, real_config):
    r = invoke("pipeline", "load", "-c", real_config, "--binary", real_dp, *sum((["--vdev", v] for v in VDEVS), []))
    assert r.exit_code == 1 and "is already running" in r.output
    r = invoke("pipeline", "unload")
    assert r.exit_code == 0, r.output
    assert f"pid {loaded['pid']} stopped" in r.output and "SIGKILL" not in r.output
    assert not os.path.exists(loaded["ctl"])
    assert read_state(env, "embnic") is None
    r = invoke("status")
    assert r.exit_code == 1 and "pipeline not loaded" in r.output


def test_python_api_exit_code(env, real_dp, real_config):
    """DpdkTarget as the testbed uses it; SIGTERM makes embnic-dp exit 0 (clean EAL shutdown)."""
    t = DpdkTarget(load_config(real_config), binary=real_dp, vdevs=VDEVS, lcores="0,1", name="api",
                   ctl_path=str(env / "api.sock"))
    st = t.load()
    try:
        assert st["routes"] == 2 and st["clients"] == 1
        assert t.is_loaded()
        assert t.info()["mode"] in ("pipeline", "run_to_completion")
        assert set(t.counters()) >= {"ports", "types", "drops", "ring", "mempool", "state"}
    finally:
        res = t.unload()
    assert res["was_running"] and not res["killed"]
    assert res["exit"] == 0, (env / "api.log").read_text(errors="replace")[-3000:]


@pytest.mark.parametrize("lcores,eal_extra,vdev_extra,card_args,line", [
    ("0", "", ["--vdev", "net_bogus0"], "", 'failed to parse device "net_bogus0"'),
    ("banana", "", [], "", "invalid core list syntax"),
    ("0", "--bogus-flag", [], "", "unrecognized option '--bogus-flag'"),
    ("0", "", [], "--burst 0", "bad value for --burst: '0'"),
], ids=["vdev", "lcores", "eal-flag", "card-arg"])
def test_failed_start_shows_the_cause_and_leaves_no_runtime_dir(invoke, env, real_dp, real_config, lcores, eal_extra,
                                                                vdev_extra, card_args, line):
    """The message shows the log line that says why, not EAL's usage text or generic epilogue."""
    prefix = f"embnic-t{os.getpid()}-{env.name[-6:]}"
    eal = f"-l {lcores} --no-huge --no-pci -m 256 --file-prefix {prefix} {eal_extra}"
    args = ["--eal-args", eal, *sum((["--vdev", v] for v in VDEVS), []), *vdev_extra]
    if card_args:
        args += ["--card-args", card_args]
    try:
        r = invoke("pipeline", "load", "-c", real_config, "--binary", real_dp, *args)
        assert r.exit_code == 1, r.output
        assert "embnic-dp exited with code" in r.output and line in r.output, r.output + _log(env)
        assert "Usage" not in r.output and "Unregistering" not in r.output and "Cause: invalid" not in r.output
        assert read_state(env, "embnic") is None
        assert not (DPDK_RUNTIME_DIR / prefix).exists(), "the failed start left its EAL runtime dir behind"
    finally:
        subprocess.run(["rm", "-rf", str(DPDK_RUNTIME_DIR / prefix)])


def test_status_at_the_connection_limit(invoke, env, loaded):
    """16 idle control connections (the card's limit) no longer lock `embnic status` out: the one
    idle longest makes room. With all 16 busy (a request line under way), status says so in one
    line, exit 1; the card serves again once they finish."""
    idle = []
    try:
        for _ in range(16):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(loaded["ctl"])
            idle.append(c)
        r = invoke("status")
        assert r.exit_code == 0, r.output
        for c in idle[1:]:
            c.sendall(b'{"cmd":"pi')  # 15 busy ...
        extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        extra.connect(loaded["ctl"])
        extra.sendall(b'{"cmd":"pi')  # ... and the 16th, in the slot the status call left
        idle.append(extra)
        time.sleep(1.0)  # the card reads the partial lines as it polls its socket
        r = invoke("status")
        assert r.exit_code == 1
        assert "every one is busy with a request: retry" in r.output, r.output
        assert "exit" not in r.output and len(r.output.strip().splitlines()) == 1
    finally:
        for c in idle:
            c.close()
    deadline = time.monotonic() + 10
    while invoke("status").exit_code != 0:
        assert time.monotonic() < deadline, "the card did not serve again after the connections closed"
        time.sleep(0.05)
