"""Fault injection on the testbed links (testbed/netem.py): loss, reordering, duplicates, and clear.

A kernel UDP echo in the card namespace stands in for the card here (the card itself is in
test_demo.py / test_faults.py), so this test needs no DPDK.

Run alone: python3 -m pytest -q tests/testbed/test_netem.py   (needs root)
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from embnic.client_lib.config import load_config
from embnic.testbed import netem as N
from embnic.testbed import topology as T

from tbutil import TESTBED_TOML, assert_gone, cleanup, needs_root, run_dir, tb_name  # noqa: F401

ECHO = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.77.0.1", 9000))
while True:
    d, a = s.recvfrom(2048)
    s.sendto(d, a)
"""
FRAMES = 1000


def test_impairment_validation_and_netem_args():
    with pytest.raises(ValueError, match="loss"):
        N.Impairment(loss=101)
    assert N.Impairment().clear
    assert N.Impairment(loss=1, reorder=5, duplicate=2).netem_args() == \
        ["delay", "1ms", "loss", "1%", "duplicate", "2%", "reorder", "5%", "50%"]
    assert N.Impairment(loss=0.5).netem_args() == ["loss", "0.5%"]


def _direction(**kw):
    sent = []
    d = N._Direction("out", N.Impairment(**kw), seed=7, send=sent.append)
    return d, sent


def test_user_backend_decisions_per_frame():
    d, sent = _direction(loss=100)
    for i in range(50):
        d.frame(bytes([i]), 0.0)
    assert sent == [] and d.c["dropped"] == 50
    d, sent = _direction(duplicate=100)
    for i in range(5):
        d.frame(bytes([i]), 0.0)
    assert sent == [bytes([i]) for i in range(5) for _ in range(2)] and d.c["duplicated"] == 5
    # reorder 100%: every frame that is not released by a later one is held, so pairs swap
    d, sent = _direction(reorder=100)
    for i in range(6):
        d.frame(bytes([i]), 0.0)
    assert sent == [bytes([i]) for i in (1, 0, 3, 2, 5, 4)] and d.c["reordered"] == 3
    # a held frame with no successor goes out when its hold time is up
    d, sent = _direction(reorder=100, delay_ms=5)
    d.frame(b"x", 1.0)
    assert d.tick(1.001) is not None and sent == []
    assert d.tick(1.006) is None and sent == [b"x"]
    # the same seed makes the same decisions; counters add up
    runs = []
    for _ in range(2):
        d, sent = _direction(loss=10, reorder=20, duplicate=10)
        for i in range(2000):
            d.frame(i.to_bytes(2, "big"), i * 1e-4)
        d.tick(10.0)
        runs.append(sent)
        assert d.c["out"] == d.c["in"] - d.c["dropped"] + d.c["duplicated"]
        assert 150 < d.c["dropped"] < 250 and 150 < d.c["duplicated"] < 260
    assert runs[0] == runs[1]


def _echo_round(sock) -> list[int]:
    """Send FRAMES numbered datagrams to the echo (paced, in chunks) and return what comes back."""
    got = []
    sock.settimeout(0.2)
    for chunk in range(0, FRAMES, 20):
        for i in range(chunk, chunk + 20):
            sock.sendto(i.to_bytes(4, "big"), ("10.77.0.1", 9000))
        end = time.monotonic() + 0.05
        sock.settimeout(0.05)
        while time.monotonic() < end:
            try:
                got.append(int.from_bytes(sock.recv(64), "big"))
            except socket.timeout:
                break
    sock.settimeout(0.3)
    try:
        while True:
            got.append(int.from_bytes(sock.recv(64), "big"))
    except socket.timeout:
        pass
    return got


def _inversions(xs):
    return sum(1 for a, b in zip(xs, xs[1:]) if b < a)


@needs_root
@pytest.mark.parametrize("backend", ["user", "tc"])
def test_netem_drops_duplicates_reorders_and_clears(run_dir, backend, cleanup):  # noqa: F811
    name = tb_name("m")
    cleanup.append(name)
    topo = T.Topology.from_config(load_config(TESTBED_TOML), name)
    T.Testbed(topo).up(servers=False, card=False, probe=False)
    echo = None
    try:
        if backend == "tc" and not N.kernel_has_netem(f"{name}-c1", f"{name}c1"):
            pytest.skip("this kernel has no sch_netem (tc: Specified qdisc kind is unknown); the user backend "
                        "covers it")
        subprocess.run(["ip", "-n", f"{name}-card", "addr", "add", "10.77.0.1/30", "dev", f"{name}p0"], check=True)
        echo = subprocess.Popen(["ip", "netns", "exec", f"{name}-card", sys.executable, "-c", ECHO])
        with T.in_netns(f"{name}-c1"):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("10.77.0.2", 0))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # wait for the echo to listen
            sock.sendto(b"\xff\xff\xff\xff", ("10.77.0.1", 9000))
            sock.settimeout(0.1)
            try:
                sock.recv(64)
                break
            except socket.timeout:
                continue

        clean = _echo_round(sock)
        assert clean == list(range(FRAMES))

        rec = N.apply(name, N.Impairment(loss=10, reorder=20, duplicate=10), backend=backend, links=["c1"])
        assert rec["backend"] == backend and rec["links"] == ["c1"]
        lossy = _echo_round(sock)
        uniq = set(lossy)
        # both directions impaired: ~19% of the round trips lost, ~20% duplicated, many reordered
        assert 0.6 * FRAMES < len(uniq) < 0.95 * FRAMES, len(uniq)
        assert len(lossy) > len(uniq)  # duplicates arrived
        assert _inversions(lossy) > 20  # reordering arrived
        if backend == "user":
            time.sleep(0.6)  # the helper writes its counters every 0.5 s
            c = N.show(name)["counters"]["c1"]
            assert c["out"]["in"] >= FRAMES and c["out"]["dropped"] > 0 and c["out"]["duplicated"] > 0
            assert c["out"]["reordered"] > 0 and c["in"]["in"] > 0 and c["in"]["dropped"] > 0
            assert c["out"]["out"] == c["out"]["in"] - c["out"]["dropped"] + c["out"]["duplicated"]
            st = T.read_state(name)
            assert [p["role"] for p in st["procs"]].count("impair") == 1

        res = N.clear(name)
        assert res["backend"] == backend
        again = _echo_round(sock)
        assert again == list(range(FRAMES))
        links = json.loads(subprocess.run(["ip", "-n", f"{name}-c1", "-j", "link"], capture_output=True,
                                          text=True, check=True).stdout)
        assert sorted(lk["ifname"] for lk in links) == sorted(["lo", f"{name}c1"])  # the taps are gone
        assert "impair" not in [p["role"] for p in T.read_state(name)["procs"]]
        sock.close()
    finally:
        if echo is not None:
            echo.kill()
            echo.wait()
        T.down(name)
    assert_gone(name)


@needs_root
def test_down_stops_the_netem_helpers(run_dir, cleanup):  # noqa: F811
    name = tb_name("h")
    cleanup.append(name)
    topo = T.Topology.from_config(load_config(TESTBED_TOML), name)
    T.Testbed(topo).up(servers=False, card=False, probe=False)
    try:
        rec = N.apply(name, N.Impairment(loss=1, reorder=5, duplicate=1), backend="user")
        pids = [h["pid"] for h in rec["helpers"]]
        assert len(pids) == 4 and all(T.proc_starttime(p) is not None for p in pids)
    finally:
        T.down(name)
    assert_gone(name, pids)
