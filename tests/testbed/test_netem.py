"""Fault injection on the testbed links (testbed/net/netem.py): loss, reordering, duplicates, and clear.

A kernel UDP echo in the card namespace stands in for the card here (the card itself is in
test_demo.py / test_faults.py), so this test needs no DPDK.

Run alone: python3 -m pytest -q tests/testbed/test_netem.py   (needs root)
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from embnic.client_lib.config import load_config
from embnic.control.targets.dpdk.xdp import attached_xdp
from embnic.testbed.net import netem as N
from embnic.testbed.net import netem_helper as NH
from embnic.testbed.net import topology as T

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
    d = NH._Direction("out", N.Impairment(**kw), seed=7, send=sent.append)
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


@contextlib.contextmanager
def _echo_testbed(name: str):
    """A testbed ``name`` without servers or card, with a kernel UDP echo on the card namespace's
    port 0; yields a socket of c1 that reaches it. Stops the echo and takes the testbed down."""
    T.Testbed(T.Topology.from_config(load_config(TESTBED_TOML), name)).up(servers=False, card=False, probe=False)
    echo = None
    try:
        echo, sock = _start_echo(name)
        with sock:
            yield sock
    finally:
        if echo is not None:
            echo.kill()
            echo.wait()
        T.down(name)
    assert_gone(name)


def _start_echo(name: str):
    """A kernel UDP echo on the card namespace's port 0 and a socket of c1 that reaches it."""
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
    return echo, sock


def _inversions(xs):
    return sum(1 for a, b in zip(xs, xs[1:]) if b < a)


@needs_root
@pytest.mark.parametrize("backend", ["user", "tc"])
def test_netem_drops_duplicates_reorders_and_clears(run_dir, backend, cleanup):  # noqa: F811
    name = tb_name("m")
    cleanup.append(name)
    with _echo_testbed(name) as sock:
        if backend == "tc" and not N.kernel_has_netem(f"{name}-c1", f"{name}c1"):
            pytest.skip("this kernel has no sch_netem (tc: Specified qdisc kind is unknown); the user backend "
                        "covers it")
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
            st = T.testbed_state(name)
            assert [p["role"] for p in st["procs"]].count("impair") == 1

        res = N.clear(name)
        assert res["backend"] == backend
        again = _echo_round(sock)
        assert again == list(range(FRAMES))
        links = json.loads(subprocess.run(["ip", "-n", f"{name}-c1", "-j", "link"], capture_output=True,
                                          text=True, check=True).stdout)
        assert sorted(lk["ifname"] for lk in links) == sorted(["lo", f"{name}c1"])  # the taps are gone
        assert "impair" not in [p["role"] for p in T.testbed_state(name)["procs"]]


@needs_root
def test_bpf_backend_drops_in_the_kernel_counts_and_clears(run_dir, cleanup):  # noqa: F811
    name = tb_name("b")
    cleanup.append(name)
    why = N.bpf_loss.problem()
    if why:
        pytest.skip(why)
    with _echo_testbed(name) as sock:
        # more than loss is refused (exit 2) before anything changes
        r = _cli("testbed", "netem", "--name", name, "--loss", "1", "--reorder", "5", "--backend", "bpf")
        assert r.exit_code == 2 and "only drops frames" in r.output, r.output
        assert N.show(name) is None
        rec = N.apply(name, N.Impairment(loss=30), backend="auto" if not N._netem_available(name) else "bpf",
                      links=["c1"])
        assert rec["backend"] == "bpf" and rec["links"] == ["c1"] and rec["helpers"] == []
        lossy = _echo_round(sock)
        # both directions: 1 - 0.7² = 51% of the round trips lost; nothing duplicated or reordered
        assert 0.35 * FRAMES < len(lossy) < 0.65 * FRAMES, len(lossy)
        assert len(set(lossy)) == len(lossy) and lossy == sorted(lossy)
        c = N.show(name)["counters"]["c1"]
        assert c["out"]["in"] >= FRAMES and 0.2 < c["out"]["dropped"] / c["out"]["in"] < 0.4, c
        assert c["out"]["out"] == c["out"]["in"] - c["out"]["dropped"]
        assert c["in"]["in"] >= c["out"]["out"] - 5 and c["in"]["dropped"] > 0, c  # echoed (ARP aside)
        # a UDP GSO send (as the shards reply) is cut into frames before the program: loss and
        # counters per frame, not per send
        with T.in_netns(f"{name}-c1"):
            gso = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        gso.bind(("10.77.0.2", 0))
        gso.setsockopt(socket.SOL_UDP, 103, 100)  # UDP_SEGMENT: 100-byte frames
        for _ in range(200):
            gso.sendto(bytes(500), ("10.77.0.1", 9001))  # 5 frames each; nobody listens on 9001
            time.sleep(0.0005)
        gso.close()
        g = N.show(name)["counters"]["c1"]["out"]
        frames, dropped = g["in"] - c["out"]["in"], g["dropped"] - c["out"]["dropped"]
        assert 1000 <= frames < 1020 and 0.2 < dropped / frames < 0.4, (frames, dropped)
        assert "impair" not in [p["role"] for p in T.testbed_state(name)["procs"]]  # no helper process
        # the programs are named (what `ip -d link` shows), and an end whose XDP hook is taken is
        # refused by name, before anything is attached (a card on net_af_xdp holds it the same way)
        ends = ((f"{name}-c1", f"{name}c1"), (f"{name}-card", f"{name}p0"))
        assert [attached_xdp(i, ns)["name"] for ns, i in ends] == ["embnic_loss"] * 2
        with pytest.raises(N.bpf_loss.XdpHookTaken, match=f"{name}p0 in namespace {name}-card already runs XDP "
                                                           "program embnic_loss .*use --backend user"):
            N.bpf_loss.attach(*ends, 5.0)
        r = _cli("testbed", "status", "--name", name)
        assert r.exit_code == 0 and "netem c1   bpf: loss 30%" in r.output and "dropped" in r.output, r.output
        res = N.clear(name)
        assert res["backend"] == "bpf" and res["helpers"]["c1"]["out"]["dropped"] >= c["out"]["dropped"]
        for ns, ifname in ((f"{name}-c1", f"{name}c1"), (f"{name}-card", f"{name}p0")):
            lk = json.loads(subprocess.run(["ip", "-n", ns, "-j", "link", "show", "dev", ifname],
                                           capture_output=True, text=True, check=True).stdout)[0]
            assert "xdp" not in lk, lk  # both programs detached
        assert _echo_round(sock) == list(range(FRAMES))


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


# --------------------------------------------------------------------------- per-link semantics
def _helpers(name) -> dict:
    """{link: (pid, loss)} of the running user-space helpers, from the state file and /proc."""
    per = N._per_link(T.testbed_state(name))
    out = {}
    for link, r in per.items():
        pid = r["helper"]["pid"]
        assert T.proc_starttime(pid) is not None, f"helper of {link} (pid {pid}) is not running"
        out[link] = (pid, r["impairment"]["loss"])
    return out


def _cli(*args):
    from click.testing import CliRunner

    from embnic.cli.main import cli

    return CliRunner().invoke(cli, list(args))


@needs_root
def test_a_failing_netem_call_leaves_the_impairment_as_it_was(run_dir, cleanup):  # noqa: F811
    name = tb_name("e")
    cleanup.append(name)
    T.Testbed(T.Topology.from_config(load_config(TESTBED_TOML), name)).up(servers=False, card=False, probe=False)
    try:
        r = _cli("testbed", "netem", "--name", name, "--loss", "1", "--backend", "user")
        assert r.exit_code == 0, r.output
        before = _helpers(name)
        assert sorted(before) == ["c1", "c2", "s0", "s1"]
        # an unknown link is a usage error and changes nothing (it used to remove every helper)
        for args in (["--link", "s7", "--loss", "1"], ["--link", "s1", "--link", "s7", "--loss", "3"],
                     ["--clear", "--link", "s7"]):
            r = _cli("testbed", "netem", "--name", name, *args)
            assert r.exit_code == 2, r.output
            assert "no link 's7'" in r.output and "c1, c2, s0, s1" in r.output
            assert _helpers(name) == before
        r = _cli("testbed", "netem", "--name", name, "--clear", "--loss", "1")
        assert r.exit_code == 2 and _helpers(name) == before
        if not N._netem_available(name):  # --backend tc on a kernel without netem: exit 1, nothing changed
            r = _cli("testbed", "netem", "--name", name, "--loss", "2", "--backend", "tc")
            assert r.exit_code == 1 and "no netem qdisc" in r.output, r.output
            assert _helpers(name) == before
        # a helper that fails to start: the link gets its earlier impairment back
        real = N._redirect_to_helper

        calls = []

        def broken(lk, h, proc, timeout):  # the new helper fails; restoring the old one works
            calls.append(lk["peer"])
            if len(calls) == 1:
                raise T.TestbedError(f"the netem helper of link {lk['peer']} did not start (test)")
            real(lk, h, proc, timeout)

        N._redirect_to_helper = broken
        try:
            with pytest.raises(T.TestbedError, match="earlier impairment of s1 is back"):
                N.apply(name, N.Impairment(loss=7), backend="user", links=["s1"])
        finally:
            N._redirect_to_helper = real
        after = _helpers(name)
        assert {k: v for k, v in after.items() if k != "s1"} == {k: v for k, v in before.items() if k != "s1"}
        assert after["s1"][1] == 1.0 and after["s1"][0] != before["s1"][0]
        roles = [p["role"] for p in T.testbed_state(name)["procs"]]
        assert roles.count("impair") == 4
    finally:
        T.down(name)
    assert_gone(name, [p for p, _ in before.values()])


@needs_root
def test_link_sets_and_clears_only_that_links_impairment(run_dir, cleanup):  # noqa: F811
    name = tb_name("g")
    cleanup.append(name)
    T.Testbed(T.Topology.from_config(load_config(TESTBED_TOML), name)).up(servers=False, card=False, probe=False)
    pids = []
    try:
        assert _cli("testbed", "netem", "--name", name, "--loss", "1", "--backend", "user").exit_code == 0
        before = _helpers(name)
        pids += [p for p, _ in before.values()]
        r = _cli("testbed", "netem", "--name", name, "--link", "s1", "--loss", "5", "--backend", "user")
        assert r.exit_code == 0, r.output
        assert "on s1" in r.output and "c1   user: loss 1%" in r.output and "s1   user: loss 5%" in r.output
        now = _helpers(name)
        pids.append(now["s1"][0])
        assert {k: now[k] for k in ("c1", "c2", "s0")} == {k: before[k] for k in ("c1", "c2", "s0")}
        assert now["s1"][1] == 5.0 and now["s1"][0] != before["s1"][0]
        assert T.proc_starttime(before["s1"][0]) is None  # the replaced helper was stopped
        sh = N.show(name)
        assert sh["links"] == ["c1", "c2", "s0", "s1"] and sh["impairment"] is None and sh["backend"] == "user"
        # the status shows each link's own impairment
        r = _cli("testbed", "status", "--name", name)
        assert "netem s0   user: loss 1%" in r.output and "netem s1   user: loss 5%" in r.output, r.output
        # a dead helper: status names it and says how to get rid of it
        os.kill(now["s1"][0], signal.SIGKILL)
        for _ in range(200):
            if T.proc_starttime(now["s1"][0]) is None:
                break
            time.sleep(0.01)
        r = _cli("testbed", "status", "--name", name)
        assert r.exit_code == 1, r.output
        assert f"the netem helper of link s1, pid {now['s1'][0]}, is not running" in r.output
        assert f"embnic testbed netem --clear --name {name}" in r.output
        # --clear --link s1: s1 only (its taps go), the others keep 1%
        r = _cli("testbed", "netem", "--name", name, "--clear", "--link", "s1")
        assert r.exit_code == 0 and "cleared on s1" in r.output and "s1   none" in r.output, r.output
        assert _helpers(name) == {k: before[k] for k in ("c1", "c2", "s0")}
        ifs = json.loads(subprocess.run(["ip", "-n", f"{name}-s1", "-j", "link"], capture_output=True, text=True,
                                        check=True).stdout)
        assert sorted(i["ifname"] for i in ifs) == sorted(["lo", f"{name}s1"])
        # all zeros on one link = clear that link
        assert _cli("testbed", "netem", "--name", name, "--link", "c2").exit_code == 0
        assert sorted(_helpers(name)) == ["c1", "s0"]
        r = _cli("testbed", "netem", "--name", name, "--clear")
        assert r.exit_code == 0 and "cleared on c1, s0" in r.output
        st = T.testbed_state(name)
        assert st["netem"] is None and "impair" not in [p["role"] for p in st["procs"]]
        assert N.show(name) is None
    finally:
        T.down(name)
    assert_gone(name, pids)


def test_tc_backend_changes_only_the_named_links(run_dir, monkeypatch):  # noqa: F811
    """The tc commands of per-link impairments (this machine may lack sch_netem, so `tc` is faked)."""
    name = "enT1"
    cmds = _fake_testbed(name, run_dir, monkeypatch, netem=True)

    def devs(verb):
        return sorted(c[c.index("dev") + 1] for c in cmds if c[:2] == ["tc", "-n"] and c[4] == verb)

    N.apply(name, N.Impairment(loss=1), backend="tc", rdir=run_dir)
    assert devs("replace") == sorted([f"{name}p{i}" for i in range(4)] + [f"{name}{p}" for p in
                                                                          ("c1", "c2", "s0", "s1")])
    cmds.clear()
    N.apply(name, N.Impairment(loss=5), backend="tc", links=["s1"], rdir=run_dir)
    assert devs("replace") == [f"{name}p3", f"{name}s1"] and devs("del") == []
    assert [c for c in cmds if "replace" in c][0][-2:] == ["loss", "5%"]
    sh = N.show(name, rdir=run_dir)
    assert {k: v["impairment"]["loss"] for k, v in sh["per_link"].items()} == {"c1": 1, "c2": 1, "s0": 1, "s1": 5}
    cmds.clear()
    with pytest.raises(N.UnknownLink):
        N.clear(name, links=["s1", "x9"], rdir=run_dir)
    assert cmds == []
    res = N.clear(name, links=["s1"], rdir=run_dir)
    assert res["links"] == ["s1"] and devs("del") == [f"{name}p3", f"{name}s1"]
    assert sorted(N.show(name, rdir=run_dir)["links"]) == ["c1", "c2", "s0"]


def _fake_testbed(name, run_dir, monkeypatch, netem: bool):
    links = [{"port": i, "card_if": f"{name}p{i}", "peer_if": f"{name}{p}", "peer_ns": f"{name}-{p}", "peer": p}
             for i, p in enumerate(["c1", "c2", "s0", "s1"])]
    T.save_testbed_state({"name": name, "links": links, "procs": [], "netem": None}, run_dir)
    cmds = []
    monkeypatch.setattr(N, "run_cmd", lambda argv, **kw: cmds.append(argv) or subprocess.CompletedProcess(argv, 0))
    monkeypatch.setattr(N, "require_net_admin", lambda what: None)
    monkeypatch.setattr(N, "_netem_available", lambda name: netem)
    return cmds


@pytest.mark.parametrize("backend", ["user", "auto"])
def test_user_backend_refuses_a_delay_without_reorder(run_dir, monkeypatch, backend):  # noqa: F811
    """The user helpers delay nothing (--delay is a reordered frame's longest hold there): a delay
    alone was accepted, shown as 'delay 10 ms' and did nothing. Now a usage error, nothing changed."""
    from click.testing import CliRunner

    from embnic.cli.main import cli

    name = "q2d"
    cmds = _fake_testbed(name, run_dir, monkeypatch, netem=False)
    monkeypatch.setattr(N, "_setup_links", lambda *a, **k: pytest.fail("a link was changed"))
    for imp in (N.Impairment(delay_ms=10), N.Impairment(loss=1, delay_ms=10)):
        with pytest.raises(N.UnsupportedImpairment, match="add --reorder") as e:
            N.apply(name, imp, backend=backend, rdir=run_dir, strict_delay=True)
        assert e.value.option == "--delay" and e.value.category == "usage"
    assert cmds == [] and N.show(name, rdir=run_dir) is None
    # a library caller may still run the helpers as a plain relay (bench e2e's loss-free pass)
    relayed = []
    monkeypatch.setattr(N, "_setup_links", lambda name, state, rdir, chosen, backend, *a, **k:
                        relayed.append(backend) or {lk["peer"]: {"helper": None} for lk in chosen})
    monkeypatch.setattr(N.os.path, "exists", lambda p: True)
    N.apply(name, N.Impairment(delay_ms=5), backend=backend, rdir=run_dir)
    assert relayed == ["user"]
    r = CliRunner().invoke(cli, ["testbed", "netem", "--name", name, "--delay", "10", "--backend", backend])
    assert r.exit_code == 2, r.output
    assert "Invalid value for --delay:" in r.output and "add --reorder" in r.output and "--backend tc" in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert N.user_backend_problem(N.Impairment(reorder=5, delay_ms=10)) is None


def test_netem_help_says_what_delay_and_seed_do():
    from click.testing import CliRunner

    from embnic.cli.main import cli

    out = " ".join(CliRunner().invoke(cli, ["testbed", "netem", "--help"]).output.split())
    assert "only the user backend uses it" in out and "needs --reorder there" in out


def test_a_node_of_a_shared_host_names_its_hosts_link(run_dir, monkeypatch):  # noqa: F811
    """testbed-shared.toml: clients 1 and 2 are one host with one link, `c1`. `--link c2` was refused
    ("no link 'c2' ... links: c1, c3, s0...") while docs/testbed.md says it names that link."""
    from click.testing import CliRunner

    from embnic.cli.main import cli

    name = "q2s"
    cmds = _fake_testbed(name, run_dir, monkeypatch, netem=True)
    st = T.testbed_state(name, run_dir)
    st["links"] = [{"port": i, "card_if": f"{name}p{i}", "peer_if": f"{name}{p}", "peer_ns": f"{name}-{p}",
                    "peer": p, "members": m} for i, (p, m) in enumerate([("c1", ["c1", "c2"]), ("c3", ["c3", "c4"]),
                                                                         ("s0", ["s0"]), ("s1", ["s1"])])]
    T.save_testbed_state(st, run_dir)
    rec = N.apply(name, N.Impairment(loss=2), backend="tc", links=["c2"], rdir=run_dir)
    assert rec["links"] == ["c1"]
    assert sorted(c[c.index("dev") + 1] for c in cmds if "replace" in c) == [f"{name}c1", f"{name}p0"]
    assert N.sharing(name, ["c2"], rdir=run_dir) == ["c2 names link c1 (c1 and c2 share it: one host)"]
    assert N.sharing(name, ["s0"], rdir=run_dir) == []
    with pytest.raises(N.UnknownLink, match=r"no link 'c9' .*\(nodes: c1, c2, c3, c4, s0, s1\)"):
        N.apply(name, N.Impairment(loss=2), backend="tc", links=["c9"], rdir=run_dir)
    r = CliRunner().invoke(cli, ["testbed", "netem", "--name", name, "--loss", "3", "--link", "c4",
                                 "--backend", "tc"])
    assert r.exit_code == 0, r.output
    assert f"testbed {name}: tc netem loss 3% reorder 0% duplicate 0% on c3\n" in r.output
    assert f"testbed {name}: c4 names link c3 (c3 and c4 share it: one host)" in r.output
    r = CliRunner().invoke(cli, ["testbed", "netem", "--name", name, "--clear", "--link", "c2"])
    assert r.exit_code == 0 and f"netem cleared on c1" in r.output, r.output
    assert sorted(N.show(name, rdir=run_dir)["links"]) == ["c3"]
