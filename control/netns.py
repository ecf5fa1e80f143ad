"""Network namespaces and veth pairs: the one module that makes, wires, enters and removes them.

Every namespace and veth the project makes goes through here (the bmv2 target's switch
namespace, the testbed's nodes and links, the benchmarks' veth paths), and every command run
inside a namespace takes its argv prefix from :func:`exec_argv`; ``tests/control/test_netns.py``
fails if another module runs ``ip netns`` or ``ip link add`` itself. It drives ``ip``,
``ethtool`` and ``sysctl`` as subprocesses — the commands a user types to repeat a step, their
messages go into errors unchanged —; entering a namespace from a thread (:func:`in_netns`) is
``setns(2)``.

    from embnic.control import netns
    with netns.Netns.create("ex-a") as a, netns.Netns.create("ex-b") as b:  # deleted on exit
        netns.veth("ex0", "ex1", ns=a.name, peer_ns=b.name, mtu=1500)
        a.add_address("ex0", "10.9.0.1/30"); a.link_up("ex0")
        b.add_address("ex1", "10.9.0.2/30"); b.link_up("ex1")
        b.run(["ping", "-c1", "10.9.0.1"])

Errors: :class:`NetnsError` (a step failed; the message is the command and its stderr),
:class:`~embnic.control.errors.NeedsRootError`, :class:`~embnic.control.errors.MissingDependencyError`
(a command missing: the package named).
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
from typing import IO, Iterator, Sequence

from embnic.control.errors import MissingDependencyError, NeedsRootError, OperationalError
from embnic.control.runstate import NETNS_DIR, is_root

__all__ = ["NetnsError", "Netns", "exec_argv", "run", "ip", "veth", "netns_exists", "netns_list",
           "netns_pids", "delete", "in_netns", "OFFLOADS_CSUM"]

#: the Debian package of each tool run here (named when it is missing)
TOOL_PACKAGES = {"ip": "iproute2", "tc": "iproute2", "ethtool": "ethtool", "sysctl": "procps",
                 "tcpreplay": "tcpreplay"}
#: checksum offloads (``ethtool -K IF tx off rx off``): a veth otherwise hands af_packet partial
#: checksums, which the card drops as ``bad_ip``/``bad_udp``
OFFLOADS_CSUM = ("tx", "rx")
_CLONE_NEWNET = 0x40000000


class NetnsError(OperationalError):
    """A namespace/link step failed (the message is the command and what it printed): exit 1."""


def exec_argv(ns: str | None, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside namespace ``ns``: ``["ip", "netns", "exec", ns, *argv]``; ``argv`` as is
    when ``ns`` is None or empty (the caller's namespace). Use it for processes started with
    :class:`subprocess.Popen` (their pid is that of ``ip``, which execs ``argv[0]``)."""
    return ["ip", "netns", "exec", ns, *argv] if ns else list(argv)


def run(argv: Sequence[str], *, ns: str | None = None, check: bool = True, log: IO[str] | None = None,
        timeout: float = 30.0, **kw) -> subprocess.CompletedProcess:
    """Run ``argv`` to completion (inside ``ns`` when given), output captured as text.

    Args:
        argv: the command (``["ethtool", "-K", "eth0", "tx", "off"]``).
        ns: run it in this namespace (:func:`exec_argv`).
        check: raise on a non-zero exit status.
        log: a text file each command (``+ argv``) and its output are written to.
        timeout: seconds before it counts as failed.
        kw: passed to :func:`subprocess.run` (``input``, ``env``, ...).
    Raises:
        MissingDependencyError: the program (or ``ip``, with ``ns``) is not installed (names the package).
        NeedsRootError: it failed with "Operation not permitted"/"Permission denied" and we are not root.
        NetnsError: non-zero exit (``check``) or no exit within ``timeout``: the command and its stderr.
    """
    full = exec_argv(ns, argv)
    if log is not None:
        log.write("+ " + " ".join(full) + "\n")
        log.flush()
    try:
        p = subprocess.run(full, capture_output=True, text=True, timeout=timeout, **kw)
    except FileNotFoundError:
        p = None  # the program (full[0]) is missing
    except subprocess.TimeoutExpired:
        raise NetnsError(f"`{' '.join(full)}` did not finish within {timeout:g} s") from None
    if p is not None and log is not None and (p.stdout or p.stderr):
        log.write(p.stdout + p.stderr)
    if p is None or p.returncode != 0 and ns and p.stderr.startswith(f'exec of "{argv[0]}" failed: No such file'):
        tool = full[0] if p is None else argv[0]  # (inside ns: what `ip netns exec` could not run)
        raise MissingDependencyError(f"{tool} is not installed: apt-get install {TOOL_PACKAGES.get(tool, tool)}",
                                     dependency=tool)
    if check and p.returncode != 0:
        err = (p.stderr or p.stdout).strip()
        if ("Operation not permitted" in err or "Permission denied" in err) and not is_root():
            raise NeedsRootError(f"`{' '.join(full)}` needs root (CAP_NET_ADMIN, for network namespaces and "
                                 "veth pairs): run as root (sudo ...)")
        raise NetnsError(f"`{' '.join(full)}` failed: {err}")
    return p


def ip(*args: str, ns: str | None = None, check: bool = True,
       log: IO[str] | None = None) -> subprocess.CompletedProcess:
    """``ip [-n NS] ARGS...`` (iproute2) through :func:`run`; the same errors."""
    return run(["ip", *(["-n", ns] if ns else []), *args], check=check, log=log)


def netns_exists(name: str) -> bool:
    """True if the named network namespace exists (``/run/netns/NAME``)."""
    return (NETNS_DIR / name).exists()


def netns_list() -> list[str]:
    """Names of all named network namespaces, sorted."""
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def netns_pids(name: str) -> list[int]:
    """Pids of the processes whose network namespace is ``name`` (``ip netns pids``); [] if it is gone."""
    p = run(["ip", "netns", "pids", name], check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def delete(name: str, *, log: IO[str] | None = None) -> bool:
    """Delete namespace ``name`` with every interface in it (a veth pair goes when either end's
    namespace goes). Idempotent: returns False if there was none, True if it was deleted.

    Raises:
        NetnsError: it exists and ``ip netns del`` failed.
    """
    if not netns_exists(name):
        return False
    p = run(["ip", "netns", "del", name], check=False, log=log)
    if p.returncode != 0 and netns_exists(name):
        raise NetnsError(f"`ip netns del {name}` failed: {(p.stderr or p.stdout).strip()}")
    return True


def veth(name: str, peer: str, *, ns: str | None = None, peer_ns: str | None = None, mac: str | None = None,
         peer_mac: str | None = None, mtu: int | None = None, log: IO[str] | None = None) -> None:
    """Create the veth pair ``name`` <-> ``peer``, each end made directly in its namespace
    (``ip [-n NS] link add NAME ... type veth peer name PEER [netns PEER_NS] ...``), so no end
    ever appears in the caller's namespace. Both ends stay down.

    Args:
        ns: namespace of ``name`` (None: the caller's).
        peer_ns: namespace of ``peer`` (None: the same as ``name``'s).
        mac, peer_mac: the ends' MAC addresses (None: the kernel picks).
        mtu: both ends' MTU in bytes (None: the kernel's 1500).
    Raises:
        NetnsError: a name is taken, too long (15 characters at most), or a namespace is missing.
    """
    def end(mac_: str | None) -> list[str]:
        return [*(["address", mac_] if mac_ else []), *(["mtu", str(mtu)] if mtu else [])]

    ip("link", "add", name, *end(mac), "type", "veth", "peer", "name", peer,
       *(["netns", peer_ns] if peer_ns and peer_ns != ns else []), *end(peer_mac), ns=ns, log=log)


@contextlib.contextmanager
def in_netns(name: str) -> Iterator[None]:
    """Run the body with the *calling thread* in network namespace ``name`` (``setns(2)``).

    Sockets created inside stay in ``name`` after the block (that is how the training job's
    :class:`~embnic.client_lib.client.EmbeddingClient` lives in a client namespace while the
    rest of the process does not). Threads started inside inherit ``name``.

    Raises:
        NetnsError: no such namespace; NeedsRootError: not allowed (CAP_SYS_ADMIN).
    """
    try:
        fd = os.open(NETNS_DIR / name, os.O_RDONLY)
    except FileNotFoundError:
        raise NetnsError(f"network namespace {name!r} does not exist (`ip netns list` shows those that do; "
                         "a testbed's: `embnic testbed status`)") from None
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        try:
            _setns(fd)
        except PermissionError:
            raise NeedsRootError(f"entering network namespace {name!r} needs root (CAP_SYS_ADMIN): "
                                 "run as root (sudo ...)") from None
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(fd)
        os.close(home)


def _setns(fd: int) -> None:
    if hasattr(os, "setns"):  # Python >= 3.12; before, libc's through ctypes
        os.setns(fd, _CLONE_NEWNET)
    elif ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


class Netns(contextlib.AbstractContextManager):
    """One named network namespace: wire, address, tune and run commands in it; a context manager
    that deletes it on exit (also when the body raises).

    ``Netns(name)`` only names an existing namespace (nothing is created or checked);
    :meth:`create` makes one. Every method raises :class:`NetnsError` (the command and its
    stderr) when its step fails, unless it says otherwise.

    Args:
        name: the namespace's name (``/run/netns/NAME``).
        log: a text file every command is written to (:func:`run`).
    """

    def __init__(self, name: str, *, log: IO[str] | None = None):
        self.name = name
        self.log = log

    def __repr__(self) -> str:
        return f"Netns({self.name!r})"

    @classmethod
    def create(cls, name: str, *, ipv6: bool = False, log: IO[str] | None = None) -> "Netns":
        """Create namespace ``name`` (it must not exist) with its loopback up.

        Args:
            ipv6: keep IPv6 on; False (default) turns it off for every interface, present and
                future (``net.ipv6.conf.{all,default}.disable_ipv6=1``), so no link-local address,
                ND or MLD frame appears on a link.
        Raises:
            NetnsError: it exists already (or a step failed; what was made is deleted again).
            NeedsRootError: not root.
        """
        run(["ip", "netns", "add", name], log=log)
        ns = cls(name, log=log)
        try:
            if not ipv6:
                for key in ("all", "default"):  # best effort: a kernel without IPv6 has nothing to turn off
                    ns.sysctl(f"net.ipv6.conf.{key}.disable_ipv6", "1", check=False)
            ns.link_up("lo")
        except BaseException:
            ns.delete()
            raise
        return ns

    def delete(self) -> bool:
        """Delete it with its interfaces (:func:`delete`; idempotent)."""
        return delete(self.name, log=self.log)

    def __exit__(self, *exc) -> None:
        self.delete()

    # ------------------------------------------------------------------ commands inside
    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed to run in this namespace (:func:`exec_argv`)."""
        return exec_argv(self.name, argv)

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 30.0,
            **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` inside the namespace to completion (:func:`run`)."""
        return run(argv, ns=self.name, check=check, log=self.log, timeout=timeout, **kw)

    def ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """``ip -n NAME ARGS...`` (:func:`ip`)."""
        return ip(*args, ns=self.name, check=check, log=self.log)

    def sysctl(self, key: str, value: str, *, check: bool = True) -> None:
        """Set ``key`` (``net.ipv4.conf.IF.rp_filter``) to ``value`` inside the namespace."""
        self.run(["sysctl", "-qw", f"{key}={value}"], check=check)

    # ------------------------------------------------------------------ wiring
    def take_interface(self, ifname: str) -> None:
        """Move ``ifname`` from the caller's namespace into this one and bring it up, IPv6 off on
        it (no link-local address). Raises NetnsError (no such interface, ...)."""
        ip("link", "set", ifname, "netns", self.name, log=self.log)
        self.disable_ipv6(ifname)
        self.link_up(ifname)

    def veth(self, name: str, peer: str, *, peer_ns: str | None = None, **kw) -> None:
        """A veth pair with ``name`` in this namespace (:func:`veth`; ``peer`` here too unless ``peer_ns``)."""
        veth(name, peer, ns=self.name, peer_ns=peer_ns, log=self.log, **kw)

    def bridge(self, name: str, *, mtu: int | None = None) -> None:
        """Create bridge ``name`` here: STP off, no forwarding delay (ports forward at once); down."""
        self.ip("link", "add", name, *(["mtu", str(mtu)] if mtu else []), "type", "bridge",
                "stp_state", "0", "forward_delay", "0")

    def set_master(self, ifname: str, bridge: str) -> None:
        """Make ``ifname`` a port of ``bridge`` (both in this namespace)."""
        self.ip("link", "set", ifname, "master", bridge)

    def link_up(self, ifname: str, *, mtu: int | None = None) -> None:
        """Bring ``ifname`` up, setting its MTU (bytes) first when given."""
        self.ip("link", "set", ifname, *(["mtu", str(mtu)] if mtu else []), "up")

    def delete_link(self, ifname: str) -> bool:
        """Delete interface ``ifname`` (a veth takes its peer along). False if there was none."""
        return self.ip("link", "del", ifname, check=False).returncode == 0

    def offloads_off(self, ifname: str, features: Sequence[str] = OFFLOADS_CSUM, *, each: bool = False) -> None:
        """``ethtool -K IFNAME FEATURE off ...`` inside the namespace.

        Args:
            features: ethtool feature names (default the checksum offloads, :data:`OFFLOADS_CSUM`).
            each: one ``ethtool`` call per feature, failures ignored (best effort: a veth has no
                ``lro`` to turn off); otherwise one call, and its failure raises.
        Raises:
            MissingDependencyError: no ethtool (apt-get install ethtool).
            NetnsError: ``ethtool`` failed (not with ``each``).
        """
        if not each:
            self.run(["ethtool", "-K", ifname, *(w for f in features for w in (f, "off"))])
            return
        for f in features:
            self.run(["ethtool", "-K", ifname, f, "off"], check=False)

    def disable_ipv6(self, ifname: str) -> None:
        """Turn IPv6 off on ``ifname`` (its link-local address goes with it)."""
        self.sysctl(f"net.ipv6.conf.{ifname}.disable_ipv6", "1")

    # ------------------------------------------------------------------ addresses and routes
    def add_address(self, ifname: str, cidr: str) -> None:
        """Add address ``cidr`` (``"10.77.0.2/30"``) to ``ifname``."""
        self.ip("addr", "add", cidr, "dev", ifname)

    def neigh_permanent(self, ifname: str, addr: str, mac: str) -> None:
        """A permanent neighbour entry ``addr`` → ``mac`` on ``ifname`` (nobody needs ARP for it)."""
        self.ip("neigh", "replace", addr, "lladdr", mac, "dev", ifname, "nud", "permanent")

    def default_route(self, ifname: str, via: str) -> None:
        """The default route via ``via`` out of ``ifname``."""
        self.ip("route", "add", "default", "via", via, "dev", ifname)

    # ------------------------------------------------------------------ inspection
    def addresses(self) -> list[str]:
        """Every IPv4/IPv6 address in the namespace (``ip -o addr``), as ``"ifname addr/len"``."""
        out = self.ip("-o", "addr", "show").stdout
        return [f"{f[1]} {f[3]}" for f in (ln.split() for ln in out.splitlines()) if len(f) > 3]

    def links(self, ifname: str | None = None, *, stats: bool = False, details: bool = False) -> list[dict]:
        """``ip -j [-s] [-d] link show [dev IFNAME]``: one dict per interface (iproute2's JSON;
        with ``stats`` each has ``stats64`` with ``rx``/``tx`` ``packets``, ``bytes``, ``dropped``).

        Raises:
            NetnsError: the namespace or ``ifname`` does not exist.
        """
        args = ["-j", *(["-s"] if stats else []), *(["-d"] if details else []), "link", "show",
                *(["dev", ifname] if ifname else [])]
        return json.loads(self.ip(*args).stdout or "[]")

    def rx_packets(self, ifname: str) -> int:
        """Frames ``ifname`` has received (its kernel ``rx_packets``)."""
        return int(self.links(ifname, stats=True)[0]["stats64"]["rx"]["packets"])
