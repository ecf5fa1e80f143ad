"""control/netns.py, the one owner of network namespaces and veth pairs: on real namespaces
(unique names, always deleted), its errors, and a scan that no other module of the package runs
``ip netns`` or ``ip link add`` itself.

Run alone: sudo python3 -m pytest -q tests/control/test_netns.py   (the namespace tests need root)
"""
from __future__ import annotations

import ast
import os
import socket
import subprocess
from pathlib import Path

import pytest

from embnic.control import netns
from embnic.control.errors import MissingDependencyError, NeedsRootError
from embnic.control.netns import Netns, NetnsError
from embnic.control.runstate import is_root

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = ("client_lib", "control", "testbed")
needs_root = pytest.mark.skipif(not is_root(), reason="network namespaces need root")
TAG = f"{os.getpid() % 100000}"

#: ``netns`` subcommands of iproute2 (``ip netns add|del|exec|...``)
_NETNS_VERBS = {"add", "del", "delete", "exec", "pids", "list", "attach", "set", "identify", "monitor"}


def _str_runs(node: ast.AST) -> list[list[str]]:
    """Runs of consecutive string constants in every list, tuple and call's arguments of ``node``."""
    runs = []
    for n in ast.walk(node):
        items = n.elts if isinstance(n, (ast.List, ast.Tuple)) else n.args if isinstance(n, ast.Call) else None
        if items is None:
            continue
        run: list[str] = []
        for it in items:
            if isinstance(it, ast.Constant) and isinstance(it.value, str):
                run.append(it.value)
            else:
                runs.append(run)
                run = []
        runs.append(run)
    return [r for r in runs if r]


def netns_commands(source: str) -> list[str]:
    """Where ``source`` builds an ``ip netns ...`` or ``ip [-n NS] link add ...`` command line
    (an argv of string constants, or a shell string starting so), as ``"line N: words"``."""
    tree = ast.parse(source)
    hits = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            w = n.value.split()
            if w[:2] == ["ip", "netns"] or (w[:1] == ["ip"] and "link" in w[:4] and "add" in w[:5]):
                hits.append(f"line {n.lineno}: {n.value[:40]}")
    for n in ast.walk(tree):
        for run in _str_runs(n) if isinstance(n, (ast.List, ast.Tuple, ast.Call)) else []:
            for a, b in zip(run, run[1:]):
                if (a, b) == ("ip", "netns") or (a, b) == ("link", "add") or (a == "netns" and b in _NETNS_VERBS):
                    hits.append(f"line {n.lineno}: {' '.join(run)[:60]}")
    return sorted(set(hits))


def test_the_scan_finds_every_form_of_the_command():
    """The checker is not vacuous: each way the builders used to spell it is found."""
    src = '''
import subprocess
subprocess.run(["ip", "netns", "add", name])
cmd = ["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx", "off"]
run_cmd(["ip", "-n", ns, "link", "add", a, "type", "veth", "peer", "name", b])
self._ip("netns", "del", self.name, check=False)
self._ip(*g, "link", "add", self.gen, "type", "veth")
os.system("ip link add x type dummy")
'''
    assert len(netns_commands(src)) == 6
    assert netns_commands('print(f"create it (ip netns add {name})"); x = ["ip", "-n", ns, "addr", "show"]') == []


def test_only_control_netns_runs_ip_netns_or_ip_link_add():
    """Issue 28: one module owns namespaces and veths; nobody else builds the command line."""
    offenders = {}
    for d in PACKAGE_DIRS:
        for path in sorted((ROOT / d).rglob("*.py")):
            if path == ROOT / "control" / "netns.py":
                continue
            hits = netns_commands(path.read_text())
            if hits:
                offenders[str(path.relative_to(ROOT))] = hits
    assert offenders == {}, ("these modules run `ip netns`/`ip link add` themselves; use "
                             f"embnic.control.netns instead: {offenders}")
    assert netns_commands((ROOT / "control" / "netns.py").read_text())  # ... and the one module does


def test_exec_argv_is_the_one_prefix():
    assert netns.exec_argv("x1", ["ping", "-c1", "10.0.0.1"]) == ["ip", "netns", "exec", "x1", "ping", "-c1",
                                                                   "10.0.0.1"]
    assert netns.exec_argv(None, ("a", "b")) == ["a", "b"] and netns.exec_argv("", ["a"]) == ["a"]
    assert Netns("y").exec_argv(["true"]) == ["ip", "netns", "exec", "y", "true"]


def test_a_missing_tool_names_its_package(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(MissingDependencyError, match=r"^ip is not installed: apt-get install iproute2$") as e:
        netns.ip("link", "show")
    assert e.value.dependency == "ip" and e.value.exit_code == 2


def _as_nobody(name: str) -> list[str]:
    """In a forked child that dropped root (uid/gid 65534; as is when not root), try to create namespace ``name`` and
    a veth pair; the lines ``"EXIT_CODE MESSAGE"`` of the NeedsRootErrors it got. (A fork, not a
    new interpreter: the modules are already imported, whatever the interpreter's and the
    editable install's permissions are for another user.)"""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no pytest machinery from here on, only os._exit
        code = 0
        try:
            os.close(r)
            if os.getuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            out = []
            for step in (lambda: Netns.create(name), lambda: netns.veth(name + "x", name + "y")):
                try:
                    step()
                except NeedsRootError as e:
                    out.append(f"{e.exit_code} {e}")
            os.write(w, "\n".join(out).encode())
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            os.write(w, f"child failed: {e!r}".encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    os.waitpid(pid, 0)
    return text.splitlines()


def test_not_root_says_so():
    """Without root, creating a namespace or a veth pair is a needs-root error (exit 2) naming the fix."""
    name = f"enTn{TAG}"
    lines = _as_nobody(name)
    assert len(lines) == 2 and all(ln.startswith("2 `ip ") and "needs root (CAP_NET_ADMIN" in ln
                                   for ln in lines), lines
    assert "netns add" in lines[0] and "link add" in lines[1]
    assert not netns.netns_exists(name)


def test_a_missing_namespace_is_one_line():
    name = f"enT{TAG}-none"
    assert not netns.netns_exists(name) and name not in netns.netns_list()
    assert netns.delete(name) is False  # idempotent: nothing to do
    with pytest.raises(NetnsError, match=f"network namespace '{name}' does not exist"):
        with netns.in_netns(name):
            pass


@needs_root
def test_two_namespaces_wired_addressed_and_torn_down():
    a_name, b_name = f"enTa{TAG}", f"enTb{TAG}"
    a_if, b_if = f"eTa{TAG}", f"eTb{TAG}"
    with Netns.create(a_name) as a, Netns.create(b_name) as b:
        assert {a_name, b_name} <= set(netns.netns_list()) and netns.netns_exists(a.name)
        netns.veth(a_if, b_if, ns=a_name, peer_ns=b_name, mac="02:00:00:aa:00:01", peer_mac="02:00:00:aa:00:02",
                   mtu=2000)
        assert not Path("/sys/class/net", a_if).exists()  # never in the caller's namespace
        a.add_address(a_if, "10.231.0.1/30")
        b.add_address(b_if, "10.231.0.2/30")
        for ns, ifname in ((a, a_if), (b, b_if)):
            ns.offloads_off(ifname)
            ns.link_up(ifname)
        la = a.links(a_if)[0]
        assert la["address"] == "02:00:00:aa:00:01" and la["mtu"] == 2000 and "UP" in la["flags"]
        k = a.run(["ethtool", "-k", a_if]).stdout
        assert "tx-checksumming: off" in k and "rx-checksumming: off" in k
        assert a.addresses() == ["lo 127.0.0.1/8", f"{a_if} 10.231.0.1/30"]  # IPv6 off: no ::1, no fe80::
        # a socket made inside lives there after the block; the thread comes back
        home = os.readlink("/proc/thread-self/ns/net")
        with netns.in_netns(b_name):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            assert os.readlink("/proc/thread-self/ns/net") != home
        with netns.in_netns(a_name):
            r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        assert os.readlink("/proc/thread-self/ns/net") == home
        with s, r:  # the addresses exist only in the namespaces; a datagram crosses the veth
            s.bind(("10.231.0.2", 0))
            r.bind(("10.231.0.1", 0))
            r.settimeout(5)
            s.sendto(b"veth", r.getsockname())
            assert r.recvfrom(16) == (b"veth", s.getsockname())
        assert a.rx_packets(a_if) >= 1
        with pytest.raises(MissingDependencyError, match="no-such-tool-x is not installed"):
            a.run(["no-such-tool-x"])
        p = subprocess.Popen(b.exec_argv(["sleep", "30"]))
        try:
            for _ in range(100):
                if p.pid in netns.netns_pids(b.name):
                    break
                subprocess.run(["sleep", "0.02"])
            assert p.pid in netns.netns_pids(b.name)
        finally:
            p.kill()
            p.wait()
    assert not netns.netns_exists(a_name) and not netns.netns_exists(b_name)
    assert netns.delete(a_name) is False


@needs_root
def test_a_failed_step_names_the_command_and_the_body_error_still_tears_down():
    name = f"enTc{TAG}"
    with pytest.raises(RuntimeError, match="body"):
        with Netns.create(name, ipv6=True) as ns:
            assert any(x.startswith("lo ") and ":" in x for x in ns.addresses())  # ::1 kept
            with pytest.raises(NetnsError, match=r"^`ip -n enTc\d+ link set nope0 up` failed: .*nope0"):
                ns.link_up("nope0")
            with pytest.raises(NetnsError, match="File exists"):
                Netns.create(name)  # it exists: refused, and the existing one is left alone
            assert netns.netns_exists(ns.name)
            raise RuntimeError("body")
    assert not netns.netns_exists(name)


@needs_root
def test_take_interface_bridge_and_routes():
    name, x, y, br = f"enTd{TAG}", f"eTx{TAG}", f"eTy{TAG}", f"eTbr{TAG}"
    with Netns.create(name) as ns:
        netns.veth(x, y)  # both ends in the caller's namespace, then one moved
        try:
            ns.take_interface(x)
            assert ns.links(x)[0]["ifname"] == x and "UP" in ns.links(x)[0]["flags"]
            assert not Path("/sys/class/net", x).exists() and Path("/sys/class/net", y).exists()
            assert not [a for a in ns.addresses() if a.startswith(x)]  # IPv6 off: no link-local address
        finally:
            netns.ip("link", "del", y, check=False)  # takes x along
        assert not Path("/sys/class/net", y).exists()
        ns.veth(f"{x}a", f"{x}b", mtu=1600)
        ns.bridge(br, mtu=1600)
        ns.set_master(f"{x}b", br)
        for i in (br, f"{x}a", f"{x}b"):
            ns.link_up(i)
        assert ns.links(f"{x}b", details=True)[0].get("master") == br
        ns.add_address(f"{x}a", "10.231.1.2/30")
        ns.neigh_permanent(f"{x}a", "10.231.1.1", "02:00:00:bb:00:01")
        ns.default_route(f"{x}a", "10.231.1.1")
        assert "default via 10.231.1.1" in ns.ip("route").stdout
        assert "PERMANENT" in ns.ip("neigh", "show", "dev", f"{x}a").stdout
        assert ns.delete_link(f"{x}a") and not ns.delete_link(f"{x}a")
    assert not netns.netns_exists(name)
