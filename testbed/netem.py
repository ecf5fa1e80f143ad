"""Fault injection on the testbed's veth links: loss, reordering and duplicates.

``embnic testbed netem --loss P --reorder Q --duplicate R`` impairs every link of a running
testbed (or the ones named with ``--link``), in both directions. Two backends:

``tc`` — Linux ``tc netem``, the standard tool: ``tc qdisc replace dev IF root netem loss P%
duplicate R% delay D reorder Q% 50%`` on *both* ends of each veth pair (the card's end too:
the DPDK ``net_af_packet`` PMD sends through the qdisc, its ``qdisc_bypass`` is off by
default). netem reorders only delayed traffic, so ``--reorder`` implies a delay (default 1 ms):
Q% of the frames go out at once, the rest after the delay.

``user`` — the same impairments in user space, for kernels built without ``sch_netem``
(``tc`` says *Specified qdisc kind is unknown*; the 2-core test machine is one). In the
client's or shard's namespace a ``clsact`` qdisc on its veth redirects (``u32`` match-all +
``mirred``) every frame leaving it to tap ``<if>o`` and every frame arriving from the card to
tap ``<if>i``. One helper process per link (:func:`impair_loop`, its own log
``<node>-netem.log``) reads both taps and decides per frame, like netem does:

* drop with probability P (``--loss``);
* send twice with probability R (``--duplicate``);
* with probability Q hold the frame back and send it right after the *next* frame of the same
  direction (or after ``--delay`` ms if none comes): a reordering (``--reorder``).

Outgoing frames then leave on the veth through an AF_PACKET socket with
``PACKET_QDISC_BYPASS`` (which skips the ``clsact`` hook, so they are not redirected again);
incoming frames are written back into tap ``<if>i``, whose MAC is the veth's, so the kernel
receives them as if they had arrived on the veth. The helper's counters (frames in, out,
dropped, duplicated, reordered per direction) are in ``<node>-netem.json`` and in
``embnic testbed status``.

``auto`` (the default) uses ``tc`` when the kernel has netem and ``user`` otherwise.
Exactly-once updates under these faults are the protocol's job (docs/protocol.md,
"Reliability"); ``tests/testbed/test_faults.py`` proves the final tables equal a loss-free run's.
"""
from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from . import topology as topo_mod
from .topology import TestbedError, _run, node_dir, proc_starttime, read_state, require_net_admin, write_state

BACKENDS = ("auto", "tc", "user")
_TUNSETIFF = 0x400454CA
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
_SOL_PACKET = 263
_PACKET_QDISC_BYPASS = 20


@dataclasses.dataclass(frozen=True)
class Impairment:
    """What to do to every frame on a link, per direction. Percentages in [0, 100].

    Attributes:
        loss: % of frames dropped.
        reorder: % of frames held back and sent after the next frame (user) / sent
            without the delay while the rest wait ``delay_ms`` (tc).
        duplicate: % of frames sent twice.
        delay_ms: tc: delay of every frame (≥ 1 ms when ``reorder`` > 0); user: longest hold of
            a reordered frame when no next frame comes.
        seed: seed of the user-space helper's random decisions (per link and direction).
    """

    loss: float = 0.0
    reorder: float = 0.0
    duplicate: float = 0.0
    delay_ms: float = 0.0
    seed: int = 1

    def __post_init__(self):
        for f in ("loss", "reorder", "duplicate"):
            v = getattr(self, f)
            if not 0.0 <= v <= 100.0:
                raise ValueError(f"--{f} must be a percentage in 0..100, got {v}")
        if not 0.0 <= self.delay_ms <= 10_000:
            raise ValueError(f"--delay must be 0..10000 ms, got {self.delay_ms}")

    @property
    def clear(self) -> bool:
        """True if nothing is impaired."""
        return self.loss == 0 and self.reorder == 0 and self.duplicate == 0 and self.delay_ms == 0

    def netem_args(self) -> list[str]:
        """Arguments after ``tc qdisc ... netem``."""
        delay = self.delay_ms if self.delay_ms > 0 else (1.0 if self.reorder > 0 else 0.0)
        args = []
        if delay > 0:
            args += ["delay", f"{delay:g}ms"]
        if self.loss > 0:
            args += ["loss", f"{self.loss:g}%"]
        if self.duplicate > 0:
            args += ["duplicate", f"{self.duplicate:g}%"]
        if self.reorder > 0:
            args += ["reorder", f"{self.reorder:g}%", "50%"]
        return args

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _tap_names(peer_if: str) -> tuple[str, str]:
    return peer_if + "o", peer_if + "i"


def kernel_has_netem(ns: str, ifname: str) -> bool:
    """Try a netem qdisc on ``ifname`` in ``ns`` (and remove it): True if the kernel has ``sch_netem``."""
    p = _run(["tc", "-n", ns, "qdisc", "replace", "dev", ifname, "root", "netem", "delay", "0ms"], check=False)
    if p.returncode == 0:
        _run(["tc", "-n", ns, "qdisc", "del", "dev", ifname, "root"], check=False)
        return True
    return False


def apply(name: str, imp: Impairment, *, backend: str = "auto", links: list[str] | None = None,
          rdir: Path | None = None, ready_timeout: float = 10.0) -> dict:
    """Impair the links of running testbed ``name`` (replacing any earlier impairment).

    Args:
        imp: the impairment; all zeros = :func:`clear`.
        backend: ``auto``, ``tc`` or ``user`` (see the module docstring).
        links: node names whose link to impair (``c1``, ``s0``, ...); default every link.

    Returns:
        the ``netem`` record written to the testbed's state (backend, impairment, links).

    Raises:
        NeedsRoot: not root.
        TestbedError: no such testbed, unknown link, ``tc`` backend without kernel netem, a helper
            that does not start (names its log).
    """
    require_net_admin(f"testbed netem ({name})")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    clear(name, rdir=rdir)
    if imp.clear:
        return {"backend": None, "impairment": imp.as_dict(), "links": []}
    rdir = Path(rdir) if rdir else topo_mod.run_dir()
    state = _need_state(name, rdir)
    all_links = state.get("links", [])
    if links:
        unknown = sorted(set(links) - {lk["peer"] for lk in all_links})
        if unknown:
            raise TestbedError(f"no link {unknown[0]!r} in testbed {name!r} (links: "
                               f"{', '.join(lk['peer'] for lk in all_links)})")
        chosen = [lk for lk in all_links if lk["peer"] in links]
    else:
        chosen = list(all_links)
    card_ns = f"{name}-card"
    first = chosen[0]
    has = kernel_has_netem(first["peer_ns"], first["peer_if"])
    if backend == "auto":
        backend = "tc" if has else "user"
    if backend == "tc" and not has:
        raise TestbedError("this kernel has no netem qdisc (`tc ... netem`: Specified qdisc kind is unknown); "
                           "use --backend user (or auto)")
    rec = {"backend": backend, "impairment": imp.as_dict(), "links": [lk["peer"] for lk in chosen],
           "applied": time.time(), "helpers": []}
    state["netem"] = rec
    write_state(state, rdir)
    if backend == "tc":
        for lk in chosen:
            for ns, ifname in ((lk["peer_ns"], lk["peer_if"]), (card_ns, lk["card_if"])):
                _run(["tc", "-n", ns, "qdisc", "replace", "dev", ifname, "root", "netem"] + imp.netem_args())
        return rec
    d = node_dir(name, rdir)
    started = []
    for i, lk in enumerate(chosen):
        ns, ifname = lk["peer_ns"], lk["peer_if"]
        tap_o, tap_i = _tap_names(ifname)
        if len(tap_o) > 15:
            raise TestbedError(f"interface {ifname} is too long for the user-space netem taps; use a shorter "
                               "testbed name")
        mac = _ns_mac(ns, ifname)
        mtu = _ns_mtu(ns, ifname)
        for tap in (tap_o, tap_i):
            _run(["ip", "-n", ns, "tuntap", "add", "dev", tap, "mode", "tap"])
            _run(["ip", "-n", ns, "link", "set", tap, "mtu", str(mtu), "txqueuelen", "10000", "arp", "off", "up"])
        _run(["ip", "-n", ns, "link", "set", tap_i, "address", mac])
        _run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv4.conf.{tap_i}.rp_filter=0"], check=False)
        stats = d / f"{lk['peer']}-netem.json"
        stats.unlink(missing_ok=True)
        log = d / f"{lk['peer']}-netem.log"
        argv = ["ip", "netns", "exec", ns, sys.executable, "-m", "embnic.testbed.netem", "--iface", ifname,
                "--tap-out", tap_o, "--tap-in", tap_i, "--mac", mac, "--loss", str(imp.loss),
                "--reorder", str(imp.reorder), "--duplicate", str(imp.duplicate),
                "--delay", str(imp.delay_ms or 5.0), "--seed", str(imp.seed * 1000 + i), "--stats", str(stats)]
        with open(log, "ab") as lf:
            lf.write(("# " + " ".join(argv) + "\n").encode())
            lf.flush()
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=lf, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        prec = {"node": lk["peer"], "role": "impair", "pid": proc.pid, "starttime": proc_starttime(proc.pid),
                "argv": argv, "log": str(log)}
        state["procs"].append(prec)
        rec["helpers"].append({"link": lk["peer"], "ns": ns, "iface": ifname, "taps": [tap_o, tap_i],
                               "pid": proc.pid, "stats": str(stats), "log": str(log)})
        write_state(state, rdir)
        started.append((lk, proc, stats, log))
    for lk, proc, stats, log in started:
        deadline = time.monotonic() + ready_timeout
        while not stats.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise TestbedError(f"the netem helper of link {lk['peer']} did not start; see its log {log}")
            time.sleep(0.02)
        ns, ifname = lk["peer_ns"], lk["peer_if"]
        tap_o, tap_i = _tap_names(ifname)
        _run(["tc", "-n", ns, "qdisc", "add", "dev", ifname, "clsact"])
        _run(["tc", "-n", ns, "filter", "add", "dev", ifname, "egress", "protocol", "all", "prio", "1", "u32",
              "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", tap_o])
        _run(["tc", "-n", ns, "filter", "add", "dev", ifname, "ingress", "protocol", "all", "prio", "1", "u32",
              "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", tap_i])
    return rec


def _ns_mac(ns: str, ifname: str) -> str:
    p = _run(["ip", "-n", ns, "-j", "link", "show", "dev", ifname])
    return json.loads(p.stdout)[0]["address"]


def _ns_mtu(ns: str, ifname: str) -> int:
    p = _run(["ip", "-n", ns, "-j", "link", "show", "dev", ifname])
    return int(json.loads(p.stdout)[0]["mtu"])


def _need_state(name: str, rdir: Path) -> dict:
    state = read_state(name, rdir)
    if state is None or state.get("corrupt"):
        raise TestbedError(f"no testbed {name!r} is up: start it with `embnic testbed up --config F --name {name}`")
    return state


def clear(name: str, *, rdir: Path | None = None) -> dict | None:
    """Remove every impairment from testbed ``name``; returns the final helper counters (user backend).

    Raises:
        NeedsRoot: not root. TestbedError: no such testbed.
    """
    require_net_admin(f"testbed netem ({name})")
    rdir = Path(rdir) if rdir else topo_mod.run_dir()
    state = _need_state(name, rdir)
    rec = state.get("netem")
    if not rec:
        return None
    card_ns = f"{name}-card"
    by_peer = {lk["peer"]: lk for lk in state.get("links", [])}
    out = {"backend": rec.get("backend"), "impairment": rec.get("impairment"), "helpers": {}}
    if rec.get("backend") == "tc":
        for peer in rec.get("links", []):
            lk = by_peer[peer]
            for ns, ifname in ((lk["peer_ns"], lk["peer_if"]), (card_ns, lk["card_if"])):
                _run(["tc", "-n", ns, "qdisc", "del", "dev", ifname, "root"], check=False)
    else:
        for h in rec.get("helpers", []):
            _run(["tc", "-n", h["ns"], "qdisc", "del", "dev", h["iface"], "clsact"], check=False)
        helpers = [p for p in state.get("procs", []) if p.get("role") == "impair"]
        for p in helpers:
            topo_mod.stop_process(p)
        for h in rec.get("helpers", []):
            for tap in h.get("taps", []):
                _run(["ip", "-n", h["ns"], "link", "del", tap], check=False)
            out["helpers"][h["link"]] = read_stats(h.get("stats"))
        state["procs"] = [p for p in state.get("procs", []) if p.get("role") != "impair"]
    state["netem"] = None
    write_state(state, rdir)
    return out


def read_stats(path: str | None) -> dict | None:
    """Counters of a user-space netem helper (None if unreadable)."""
    if not path:
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def show(name: str, *, rdir: Path | None = None) -> dict | None:
    """The impairment of testbed ``name`` with the helpers' live counters (None if none)."""
    rdir = Path(rdir) if rdir else topo_mod.run_dir()
    state = _need_state(name, rdir)
    rec = state.get("netem")
    if not rec:
        return None
    rec = dict(rec)
    rec["counters"] = {h["link"]: read_stats(h.get("stats")) for h in rec.get("helpers", [])}
    return rec


# --------------------------------------------------------------------------- the helper
def _open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TAP | _IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


class _Direction:
    """Per-direction impairment state (netem-like decisions, one RNG per direction)."""

    def __init__(self, name: str, imp: Impairment, seed: int, send):
        self.name = name
        self.loss = imp.loss / 100.0
        self.dup = imp.duplicate / 100.0
        self.reorder = imp.reorder / 100.0
        self.hold_s = max(imp.delay_ms, 0.1) / 1000.0
        self.rng = random.Random(seed)
        self.send = send
        self.held: tuple[bytes, int] | None = None
        self.held_until = 0.0
        self.c = {"in": 0, "out": 0, "dropped": 0, "duplicated": 0, "reordered": 0, "send_errors": 0}

    def _emit(self, frame: bytes, copies: int) -> None:
        for _ in range(copies):
            try:
                self.send(frame)
                self.c["out"] += 1
            except OSError:
                self.c["send_errors"] += 1

    def frame(self, frame: bytes, now: float) -> None:
        self.c["in"] += 1
        r = self.rng.random
        if r() < self.loss:
            self.c["dropped"] += 1
            return
        copies = 1
        if r() < self.dup:
            copies = 2
            self.c["duplicated"] += 1
        if self.held is None and r() < self.reorder:
            self.held = (frame, copies)
            self.held_until = now + self.hold_s
            self.c["reordered"] += 1
            return
        self._emit(frame, copies)
        if self.held is not None:
            self._emit(*self.held)
            self.held = None

    def tick(self, now: float) -> float | None:
        """Release a held frame whose time is up; returns seconds until the next deadline."""
        if self.held is None:
            return None
        if now >= self.held_until:
            self._emit(*self.held)
            self.held = None
            return None
        return self.held_until - now


def impair_loop(iface: str, tap_out: str, tap_in: str, mac: str, imp: Impairment, stats_path: str) -> None:
    """The user-space netem helper (runs in the client's/shard's namespace until SIGTERM).

    Reads frames the ``clsact`` redirects put on ``tap_out`` (leaving the node) and ``tap_in``
    (arriving from the card), impairs each direction (:class:`Impairment`) and forwards:
    outgoing ones on ``iface`` via AF_PACKET with ``PACKET_QDISC_BYPASS``, incoming ones into
    ``tap_in`` (received by the kernel as if on ``iface``). Writes counters to ``stats_path``
    (JSON) when ready, every 0.5 s and on exit.
    """
    fo, fi = _open_tap(tap_out), _open_tap(tap_in)
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    tx.bind((iface, 0))
    tx.setsockopt(_SOL_PACKET, _PACKET_QDISC_BYPASS, 1)
    own = bytes.fromhex(mac.replace(":", ""))
    d_out = _Direction("out", imp, imp.seed * 2, tx.send)
    d_in = _Direction("in", imp, imp.seed * 2 + 1, lambda f: os.write(fi, f))
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    signal.signal(signal.SIGINT, lambda *a: stop.append(1))

    def dump() -> None:
        tmp = stats_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"out": d_out.c, "in": d_in.c, "ignored": ignored, "pid": os.getpid(),
                       "impairment": imp.as_dict()}, f)
        os.replace(tmp, stats_path)

    ignored = 0
    dump()
    print(f"netem helper on {iface}: {imp.as_dict()}", flush=True)
    next_dump = time.monotonic() + 0.5
    while not stop:
        now = time.monotonic()
        waits = [w for w in (d_out.tick(now), d_in.tick(now)) if w is not None]
        timeout = min(waits + [max(0.0, next_dump - now)])
        try:
            ready, _, _ = select.select([fo, fi], [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd in ready:
            while True:
                try:
                    f = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if len(f) < 14:
                    continue
                src = f[6:12]
                if fd == fo:
                    if src != own:  # not from this node's stack (e.g. the tap itself)
                        ignored += 1
                        continue
                    d_out.frame(f, now)
                else:
                    if src == own:  # the kernel talking on the tap, not a frame from the card
                        ignored += 1
                        continue
                    d_in.frame(f, now)
        if now >= next_dump:
            dump()
            next_dump = now + 0.5
    for d in (d_out, d_in):
        if d.held is not None:
            d._emit(*d.held)
            d.held = None
    dump()


def main(argv: list[str] | None = None) -> None:
    """``python -m embnic.testbed.netem --iface IF --tap-out T --tap-in T --mac M ...`` (the helper)."""
    ap = argparse.ArgumentParser(prog="embnic.testbed.netem", description="user-space netem helper (one link)")
    ap.add_argument("--iface", required=True)
    ap.add_argument("--tap-out", required=True)
    ap.add_argument("--tap-in", required=True)
    ap.add_argument("--mac", required=True)
    ap.add_argument("--loss", type=float, default=0.0)
    ap.add_argument("--reorder", type=float, default=0.0)
    ap.add_argument("--duplicate", type=float, default=0.0)
    ap.add_argument("--delay", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stats", required=True)
    a = ap.parse_args(argv)
    imp = Impairment(a.loss, a.reorder, a.duplicate, a.delay, a.seed)
    impair_loop(a.iface, a.tap_out, a.tap_in, a.mac, imp, a.stats)


if __name__ == "__main__":
    main()
