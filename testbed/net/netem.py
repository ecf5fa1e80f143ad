"""Fault injection on the testbed's veth links: loss, reordering and duplicates.

How: docs/testbed.md, "Fault backends".
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from embnic.control.errors import USAGE
from embnic.control.netns import Netns, exec_argv, netns_exists
from embnic.control.netns import run as run_cmd  # tc; one name the tests replace
from embnic.control.runstate import proc_starttime, run_dir

from . import bpf_loss
from .procs import (TestbedError, log_tail, node_dir, require_net_admin, save_testbed_state, spawn_logged,
                    stop_process, testbed_state)

BACKENDS = ("auto", "tc", "bpf", "user")


@dataclasses.dataclass(frozen=True)
class Impairment:
    """What to do to every frame on a link, per direction. Percentages in [0, 100].

    Attributes:
        loss: % of frames dropped.
        reorder: % of frames held back and sent after the next frame (user) / sent
            without the delay while the rest wait ``delay_ms`` (tc).
        duplicate: % of frames sent twice.
        delay_ms: tc: delay of every frame (≥ 1 ms when ``reorder`` > 0); user: longest hold of
            a reordered frame when no next frame comes (so ``embnic testbed netem`` refuses a
            delay without ``reorder`` there: :func:`user_backend_problem`).
        seed: seed of the user-space helper's random decisions (per link and direction); the
            other backends do not use it.
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
        args = ["delay", f"{delay:g}ms"] if delay > 0 else []
        for word, pct in (("loss", self.loss), ("duplicate", self.duplicate), ("reorder", self.reorder)):
            if pct > 0:
                args += [word, f"{pct:g}%"]
        return args + (["50%"] if self.reorder > 0 else [])

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class UnknownLink(TestbedError):
    """``--link`` named a node that has no link in the testbed (a usage error: the CLI exits 2)."""

    category = USAGE


class UnsupportedImpairment(TestbedError):
    """The chosen backend cannot do this impairment (``bpf`` with reordering, duplicates or a
    delay; ``user`` with a delay but no reordering): a usage error, the CLI exits 2 naming
    ``option``."""

    category = USAGE

    def __init__(self, message: str, option: str = "--backend"):
        super().__init__(message)
        self.option = option


def user_backend_problem(imp: Impairment) -> str | None:
    """Why the ``user`` backend cannot do ``imp`` (a delay without reordering: its helpers delay
    nothing else), or None."""
    if imp.delay_ms > 0 and imp.reorder == 0:
        return (f"--delay {imp.delay_ms:g} needs --reorder on the user backend (there --delay is only the longest "
                "hold of a reordered frame; it delays nothing by itself): add --reorder Q, or delay every frame "
                "with --backend tc on a kernel with sch_netem")
    return None


def pmd_backend_problem(name: str, backend: str) -> str:
    """Why ``backend`` (``tc`` or ``bpf``) cannot impair testbed ``name`` whose card runs on
    ``net_af_xdp`` (``testbed up --pmd af_xdp``), in the words the user reads."""
    if backend == "bpf":
        why = ("its loss program goes on the XDP hook of the card's end of each link, which the PMD's own XDP "
               "program holds (an interface has one)")
    else:
        why = ("AF_XDP sends around the card's end's qdisc (__dev_direct_xmit), so netem there would impair only "
               "the peer -> card direction")
    return (f"--backend {backend}: testbed {name}'s card runs on net_af_xdp (--pmd af_xdp) and {why}; "
            "use --backend user (or auto, which picks it for this testbed), or run the testbed with "
            "--pmd af_packet")


def loss_only(imp: Impairment) -> bool:
    """True if ``imp`` only drops frames (what the ``bpf`` backend can do)."""
    return imp.reorder == 0 and imp.duplicate == 0 and imp.delay_ms == 0


def kernel_has_netem(ns: str, ifname: str) -> bool:
    """Try a netem qdisc on ``ifname`` in ``ns`` (and remove it): True if the kernel has ``sch_netem``.

    Replaces the root qdisc of ``ifname`` for a moment: never call it on an impaired link
    (:func:`apply` probes on the card namespace's ``lo``).
    """
    p = run_cmd(["tc", "-n", ns, "qdisc", "replace", "dev", ifname, "root", "netem", "delay", "0ms"], check=False)
    if p.returncode == 0:
        run_cmd(["tc", "-n", ns, "qdisc", "del", "dev", ifname, "root"], check=False)
        return True
    return False


# --------------------------------------------------------------------------- state
# state["netem"] = {"per_link": {peer: {"backend": "tc"|"bpf"|"user", "impairment": {...}, "applied": t,
#                                       "helper": {...} | None}}}  (None when nothing is impaired)
def _per_link(state: dict) -> dict[str, dict]:
    """The per-link impairment records of a testbed state."""
    return dict((state.get("netem") or {}).get("per_link", {}))


def _record_link(state: dict, rdir: Path, peer: str, rec: dict | None) -> None:
    """Set link ``peer``'s impairment record in the testbed state (None: remove it) and save the
    state at once (so ``down`` finds what was set even if a later step fails)."""
    per = _per_link(state)
    if rec is None:
        per.pop(peer, None)
    else:
        per[peer] = rec
    state["netem"] = {"per_link": per} if per else None
    save_testbed_state(state, rdir)


def _resolve_links(name: str, state: dict, links: list[str] | None) -> list[dict]:
    """The link records named by ``links`` (node names), in card port order; every link if None.

    A node names its host's link: on a shared card port (``examples/testbed-shared.toml``)
    clients 1 and 2 of one host share link ``c1``, so ``c2`` names it too (:func:`sharing`).

    Raises:
        UnknownLink: a name that is no node with a link in the testbed.
    """
    all_links = sorted(state.get("links", []), key=lambda lk: lk.get("port", 0))
    if not links:
        return all_links

    def owner(node: str) -> dict | None:
        for lk in all_links:
            if lk["peer"] == node or node in (lk.get("members") or ()):
                return lk
        return None

    unknown = [x for x in links if owner(x) is None]
    if unknown:
        nodes = [m for lk in all_links for m in (lk.get("members") or [lk["peer"]])]
        raise UnknownLink(f"no link {unknown[0]!r} in testbed {name!r} (nodes: {', '.join(nodes)})")
    peers = {owner(x)["peer"] for x in links}
    return [lk for lk in all_links if lk["peer"] in peers]


def sharing(name: str, links: list[str] | None, *, rdir: Path | None = None) -> list[str]:
    """One note per link of ``links`` that several nodes share (a host of several clients or
    shards), e.g. ``"c2 names link c1 (c1 and c2 share it: one host)"``; empty when none do."""
    state = testbed_state(name, Path(rdir) if rdir else run_dir()) or {}
    notes = []
    for lk in _resolve_links(name, state, links) if links else []:
        members = lk.get("members") or [lk["peer"]]
        if len(members) > 1:
            named = [x for x in links if x in members]
            notes.append(f"{', '.join(named)} {'names' if len(named) == 1 else 'name'} link {lk['peer']} "
                         f"({', '.join(members[:-1])} and {members[-1]} share it: one host)")
    return notes


def _netem_available(name: str) -> bool:
    """Whether the kernel has ``sch_netem``, probed on ``lo`` of the card namespace (which no
    impairment ever touches, so an existing impairment stays as it is)."""
    ns = f"{name}-card"
    if not netns_exists(ns):
        raise TestbedError(f"namespace {ns} of testbed {name!r} is missing: the testbed is broken; run "
                           f"`embnic testbed down --name {name}` and `up` again")
    return kernel_has_netem(ns, "lo")


# --------------------------------------------------------------------------- apply / clear
def apply(name: str, imp: Impairment, *, backend: str = "auto", links: list[str] | None = None,
          rdir: Path | None = None, ready_timeout: float = 10.0, strict_delay: bool = False) -> dict:
    """Impair links of running testbed ``name``.

    Per link (docs/testbed.md): ``links`` (default every link) get ``imp`` in place of their own
    earlier impairment, the other links keep theirs; an all-zero ``imp`` is :func:`clear`. Every
    argument is checked before anything changes; a link whose setup fails later gets its earlier
    impairment back before the error is raised.

    Args:
        imp: the impairment.
        backend: ``auto``, ``tc``, ``bpf`` or ``user`` (docs/testbed.md, "Fault backends").
        links: node names whose link to impair (``c1``, ``s0``, ...; any node of a host that
            shares its link names that link); default every link.
        strict_delay: refuse a delay the backend would not apply — ``user`` (also as ``auto``'s
            choice) without ``reorder`` (:func:`user_backend_problem`). ``embnic testbed netem``
            sets it; a library caller may run the user helpers as a plain relay (only
            ``delay_ms`` > 0), as ``bench e2e`` does.

    Returns:
        what this call set: ``{"backend", "impairment", "links": [...], "helpers": [...]}``
        (:func:`show` gives the whole testbed's).

    Raises:
        NeedsRoot: not root.
        ValueError: unknown backend.
        UnknownLink: a link name the testbed does not have.
        UnsupportedImpairment: ``bpf`` asked for more than loss; ``tc`` or ``bpf`` on a testbed whose
            card runs on ``net_af_xdp`` (:func:`pmd_backend_problem`); with ``strict_delay``, ``user``
            (also as ``auto``'s choice) asked for a delay without reordering.
        TestbedError: no such testbed, ``tc`` backend without kernel netem, ``bpf`` refused by
            the kernel, a helper that does not start (names its log).
    """
    require_net_admin(f"testbed netem ({name})")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    rdir = Path(rdir) if rdir else run_dir()
    state = _need_state(name, rdir)
    chosen = _resolve_links(name, state, links)
    if imp.clear:
        clear(name, links=links, rdir=rdir)
        return {"backend": None, "impairment": imp.as_dict(), "links": [lk["peer"] for lk in chosen], "helpers": []}
    if not chosen:
        raise TestbedError(f"testbed {name!r} has no links to impair")
    by_auto = backend == "auto"
    xdp_card = state.get("pmd") == "af_xdp"
    if xdp_card and backend in ("tc", "bpf"):
        raise UnsupportedImpairment(pmd_backend_problem(name, backend))
    if backend in ("auto", "tc"):
        has = _netem_available(name)
        if backend == "tc" and not has:
            raise TestbedError("this kernel has no netem qdisc (`tc ... netem`: Specified qdisc kind is unknown); "
                               + ("use --backend bpf (loss alone, in the kernel) or user (or auto)" if loss_only(imp)
                                  else "use --backend user (or auto)"))
        if xdp_card:  # tc and bpf would impair one direction or break the card (pmd_backend_problem)
            backend = "user"
        else:
            backend = "tc" if has else "bpf" if loss_only(imp) and bpf_loss.problem() is None else "user"
    elif backend == "bpf":
        if not loss_only(imp):
            raise UnsupportedImpairment("the bpf backend only drops frames (--loss); reordering, duplicates and "
                                        "delays need --backend user (or tc where the kernel has netem)")
        why = bpf_loss.problem()
        if why:
            raise TestbedError(why + "; use --backend user")
    if backend == "user":
        why = user_backend_problem(imp) if strict_delay else None
        if why:
            chose = ("the card runs on net_af_xdp" if xdp_card else "this kernel has none")
            raise UnsupportedImpairment(why + (f" ({chose}, so --backend auto chose user)" if by_auto
                                               else ""), option="--delay")
        if not os.path.exists("/dev/net/tun"):
            raise TestbedError("/dev/net/tun is missing (the user-space netem needs taps): modprobe tun")
    # -- validated; now change the chosen links, remembering what they had
    old = _per_link(state)
    previous = {lk["peer"]: old.get(lk["peer"]) for lk in chosen}
    try:
        new = _setup_links(name, state, rdir, chosen, backend, imp, ready_timeout, replacing=previous)
    except BaseException as e:
        restored = _restore(name, state, rdir, chosen, previous, ready_timeout)
        if isinstance(e, TestbedError):
            raise TestbedError(f"{e} ({restored})") from None
        raise
    return {"backend": backend, "impairment": imp.as_dict(), "links": [lk["peer"] for lk in chosen],
            "helpers": [new[lk["peer"]]["helper"] for lk in chosen if new[lk["peer"]].get("helper")]}


def _ends(lk: dict, card_ns: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """The two ends of link ``lk`` as (namespace, interface): the peer's, then the card's."""
    return (lk["peer_ns"], lk["peer_if"]), (card_ns, lk["card_if"])


def _setup_links(name: str, state: dict, rdir: Path, chosen: list[dict], backend: str, imp: Impairment,
                 ready_timeout: float, replacing: dict) -> dict[str, dict]:
    """Replace the impairment of each ``chosen`` link by ``imp`` with ``backend``; saves the state
    after every step (so ``down`` finds every helper). Returns the new per-link records."""
    card_ns = f"{name}-card"
    new: dict[str, dict] = {}
    for lk in chosen:
        prev = replacing.get(lk["peer"])
        if prev and not (prev.get("backend") == "tc" and backend == "tc"):  # tc → tc: `replace` is atomic
            _teardown_link(state, rdir, lk, prev)
    started = []
    for lk in chosen:
        rec = new[lk["peer"]] = {"backend": backend, "impairment": imp.as_dict(), "applied": time.time(),
                                 "helper": None}
        if backend == "bpf":
            rec["bpf"] = bpf_loss.attach(*_ends(lk, card_ns), imp.loss)
        elif backend == "tc":
            for ns, ifname in _ends(lk, card_ns):
                run_cmd(["tc", "-n", ns, "qdisc", "replace", "dev", ifname, "root", "netem"] + imp.netem_args())
        else:
            rec["helper"], proc = _start_helper(name, state, rdir, lk, imp)
            started.append((lk, rec["helper"], proc))
        _record_link(state, rdir, lk["peer"], rec)
    for lk, h, proc in started:
        _redirect_to_helper(lk, h, proc, ready_timeout)
    return new


def _start_helper(name: str, state: dict, rdir: Path, lk: dict, imp: Impairment):
    """Create the link's taps and start its user-space helper (recorded as an ``impair`` process)."""
    d = node_dir(name, rdir)
    ns, ifname = lk["peer_ns"], lk["peer_if"]
    tap_o, tap_i = ifname + "o", ifname + "i"  # 15 characters at most: a peer's interface has 14 (wiring)
    h = {"link": lk["peer"], "ns": ns, "iface": ifname, "taps": [tap_o, tap_i], "pid": None,
         "stats": str(d / f"{lk['peer']}-netem.json"), "log": str(d / f"{lk['peer']}-netem.log")}
    # the taps are recorded before they exist
    _record_link(state, rdir, lk["peer"], {"backend": "user", "impairment": imp.as_dict(), "applied": time.time(),
                                           "helper": h})
    nsx = Netns(ns)
    dev = nsx.links(ifname)[0]
    mac, mtu = dev["address"], int(dev["mtu"])
    for tap in (tap_o, tap_i):
        nsx.ip("tuntap", "add", "dev", tap, "mode", "tap")
        nsx.ip("link", "set", tap, "mtu", str(mtu), "txqueuelen", "10000", "arp", "off", "up")
    nsx.ip("link", "set", tap_i, "address", mac)
    nsx.sysctl(f"net.ipv4.conf.{tap_i}.rp_filter", "0", check=False)
    stats = Path(h["stats"])
    stats.unlink(missing_ok=True)
    argv = exec_argv(ns, [sys.executable, "-m", "embnic.testbed.net.netem_helper", "--iface", ifname,
                          "--tap-out", tap_o, "--tap-in", tap_i, "--mac", mac, "--loss", str(imp.loss),
                          "--reorder", str(imp.reorder), "--duplicate", str(imp.duplicate),
                          "--delay", str(imp.delay_ms or 5.0), "--seed", str(imp.seed * 1000 + int(lk.get("port", 0))),
                          "--stats", str(stats)])
    proc = spawn_logged(argv, h["log"])
    h.update(pid=proc.pid, starttime=proc_starttime(proc.pid))
    state["procs"].append({"node": lk["peer"], "role": "impair", "pid": proc.pid, "starttime": h["starttime"],
                           "argv": argv, "log": h["log"]})
    return h, proc


def _redirect_to_helper(lk: dict, h: dict, proc, ready_timeout: float) -> None:
    """Wait until the helper is ready (its stats file exists), then redirect the link's frames to its taps."""
    stats = Path(h["stats"])
    deadline = time.monotonic() + ready_timeout
    while not stats.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise TestbedError(f"the netem helper of link {lk['peer']} did not start: "
                               f"{log_tail(h['log'])} (log: {h['log']})")
        time.sleep(0.02)
    ns, ifname = lk["peer_ns"], lk["peer_if"]
    tap_o, tap_i = h["taps"]
    run_cmd(["tc", "-n", ns, "qdisc", "add", "dev", ifname, "clsact"])
    for hook, tap in (("egress", tap_o), ("ingress", tap_i)):
        run_cmd(["tc", "-n", ns, "filter", "add", "dev", ifname, hook, "protocol", "all", "prio", "1", "u32",
                 "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", tap])


def _teardown_link(state: dict, rdir: Path, lk: dict, rec: dict) -> dict | None:
    """Remove one link's impairment (tc qdiscs; the XDP programs; or clsact + helper + taps);
    saves the state. Returns the final counters (bpf and user backends)."""
    card_ns = f"{state['name']}-card"
    counters = None
    if rec.get("backend") == "tc":
        for ns, ifname in _ends(lk, card_ns):
            run_cmd(["tc", "-n", ns, "qdisc", "del", "dev", ifname, "root"], check=False)
    elif rec.get("backend") == "bpf":
        counters = bpf_loss.read_counters((rec.get("bpf") or {}).get("map_id"))
        for ns, ifname in _ends(lk, card_ns):
            bpf_loss.detach(ns, ifname)
    else:
        h = rec.get("helper") or {}
        ns, ifname = h.get("ns", lk["peer_ns"]), h.get("iface", lk["peer_if"])
        run_cmd(["tc", "-n", ns, "qdisc", "del", "dev", ifname, "clsact"], check=False)
        mine = [p for p in state.get("procs", []) if p.get("role") == "impair" and p.get("node") == lk["peer"]]
        for p in mine:
            stop_process(p)
        for tap in h.get("taps", []):
            Netns(ns).delete_link(tap)
        counters = read_stats(h.get("stats"))
        state["procs"] = [p for p in state.get("procs", []) if p not in mine]
    _record_link(state, rdir, lk["peer"], None)
    return counters


def _restore(name: str, state: dict, rdir: Path, chosen: list[dict], previous: dict, ready_timeout: float) -> str:
    """After a failed :func:`apply`: remove what it set on ``chosen`` and put back each link's
    ``previous`` impairment. Returns a clause for the error message."""
    try:
        cur = _per_link(state)
        for lk in chosen:
            if lk["peer"] in cur:
                _teardown_link(state, rdir, lk, cur[lk["peer"]])
        back = []
        for lk in chosen:
            prev = previous.get(lk["peer"])
            if prev:
                _setup_links(name, state, rdir, [lk], prev["backend"], Impairment(**prev["impairment"]),
                             ready_timeout, replacing={})
                back.append(lk["peer"])
    except Exception as e:  # noqa: BLE001 - report it with the original error
        return f"and the earlier impairment could not be restored: {e}"
    return ("the earlier impairment of " + ", ".join(back) + " is back") if back else \
        "the links are unimpaired, as before"


def _need_state(name: str, rdir: Path) -> dict:
    state = testbed_state(name, rdir)
    if state is None or state.get("corrupt"):
        raise TestbedError(f"no testbed {name!r} is up: start it with `embnic testbed up --config F --name {name}`")
    return state


def _summary(per: dict[str, dict], links: list[str]) -> dict:
    """``{"links", "backend": their common backend or "mixed", "impairment": their common one or None}``."""
    common = [[per[p].get(k) for p in links] for k in ("backend", "impairment")]
    backend, imp = (vs[0] if vs and all(v == vs[0] for v in vs) else None for vs in common)
    return {"links": links, "backend": backend or "mixed", "impairment": imp}


def clear(name: str, *, links: list[str] | None = None, rdir: Path | None = None) -> dict | None:
    """Remove the impairment of the named links (default: every link) of testbed ``name``.

    Returns:
        None if none of them was impaired, else ``{"links": [...cleared], "backend": the
        backend ("mixed" if they differed), "impairment": the common one (None if they
        differed), "helpers": {link: final counters} (bpf and user backends)}``.

    Raises:
        NeedsRoot: not root. UnknownLink: a link name the testbed does not have (nothing is
        cleared). TestbedError: no such testbed.
    """
    require_net_admin(f"testbed netem ({name})")
    rdir = Path(rdir) if rdir else run_dir()
    state = _need_state(name, rdir)
    chosen = _resolve_links(name, state, links)
    per = _per_link(state)
    todo = [lk for lk in chosen if lk["peer"] in per]
    if not todo:
        if state.get("netem") and not per:
            state["netem"] = None
            save_testbed_state(state, rdir)
        return None
    out = {**_summary(per, [lk["peer"] for lk in todo]), "helpers": {}}
    for lk in todo:
        c = _teardown_link(state, rdir, lk, per[lk["peer"]])
        if per[lk["peer"]].get("backend") in ("user", "bpf"):
            out["helpers"][lk["peer"]] = c
    return out


def _counters(rec: dict) -> dict | None:
    """Live counters of one link's impairment (bpf: its map; user: its helper's stats file)."""
    if rec.get("backend") == "bpf":
        return bpf_loss.read_counters((rec.get("bpf") or {}).get("map_id"))
    return read_stats((rec.get("helper") or {}).get("stats"))


def read_stats(path: str | None) -> dict | None:
    """Counters of a user-space netem helper (None if unreadable)."""
    if not path:
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def show(name: str, *, rdir: Path | None = None) -> dict | None:
    """The impairment of testbed ``name`` (None if no link is impaired).

    Returns:
        ``{"links": [impaired links, port order], "backend": common backend or "mixed",
        "impairment": common impairment or None when the links differ, "per_link": {link:
        {"backend", "impairment", "pid"}}, "counters": {link: counters} (bpf and user backends,
        live)}``.
    """
    rdir = Path(rdir) if rdir else run_dir()
    state = _need_state(name, rdir)
    per = _per_link(state)
    if not per:
        return None
    order = {lk["peer"]: lk.get("port", 0) for lk in state.get("links", [])}
    links = sorted(per, key=lambda p: order.get(p, 1 << 30))
    return {
        **_summary(per, links),
        "per_link": {p: {"backend": per[p].get("backend"), "impairment": per[p].get("impairment"),
                         "pid": (per[p].get("helper") or {}).get("pid")} for p in links},
        "counters": {p: _counters(per[p]) for p in links if per[p].get("backend") in ("user", "bpf")},
    }
