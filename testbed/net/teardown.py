"""Tearing a testbed down by name, from its state file alone (also after a crash): :func:`down`,
which needs no :class:`~embnic.testbed.net.topology.Testbed` (``embnic testbed down --name N``)."""
from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from embnic.control.targets.dpdk.process import remove_runtime_dir
from embnic.control.runstate import proc_starttime, run_dir

from embnic.control import netns
from embnic.control.netns import netns_exists, netns_list, netns_pids

from .procs import require_net_admin, stop_process
from .statefile import card_pipeline_name, card_target, loaded_card, node_dir, state_path, testbed_state
from .wiring import card_file_prefix

__all__ = ["down"]


def _pattern(name: str) -> re.Pattern:
    return re.compile(rf"^{re.escape(name)}-(card|c\d+|s\d+)$")


def down(name: str, rdir: Path | None = None) -> dict:
    """Remove everything testbed ``name`` made, in reverse order of :meth:`Testbed.up`.

    Works from the state file alone (also after a crash): impairment helpers, the card (also
    one ``pipeline load`` started from the testbed's config: :func:`loaded_card`),
    the servers, any other process left in the testbed's namespaces (``ip netns pids``,
    never by name), the namespaces (which takes their veths along), then the state file.
    Namespaces matching ``NAME-{card,c<id>,s<id>}`` are removed even if unrecorded. Logs stay
    in ``RUN_DIR/testbed-NAME/``.

    Returns:
        ``{"processes": [...stopped...], "netns": [...removed...], "found": bool}``.

    Raises:
        NeedsRoot: not root.
    """
    require_net_admin(f"testbed down ({name})")
    rdir = Path(rdir) if rdir else run_dir()
    state = testbed_state(name, rdir) or {}
    stopped, removed = [], []
    procs = state.get("procs", []) if isinstance(state.get("procs"), list) else []
    order = {"impair": 0, "client": 1, "card": 2, "server": 3}
    # the card through its target (clean DPDK shutdown, removes its socket and state file)
    card = state.get("card")
    if isinstance(card, dict):
        try:
            t = card_target(card.get("target"), card.get("name", "card"),
                            card.get("run_dir", str(node_dir(name, rdir))))
            if t.state() is not None:
                t.unload()
                stopped.append("card")
        except Exception:  # noqa: BLE001 - fall back to the pid below
            pass
    # a card started later from the testbed's config (`pipeline load -c .../cluster.toml` after
    # `up --no-card`): it runs in our card namespace, so it is ours to stop, with its state file
    ext = loaded_card(name, rdir)
    if ext is not None:
        from embnic.control.runstate import remove_state

        pname = card_pipeline_name(name)
        try:
            if card_target(ext.get("target"), pname, rdir).unload().get("was_running"):
                stopped.append(f"card:{pname}:{ext.get('pid')}")
        except Exception:  # noqa: BLE001 - by its recorded pid, then drop its state file
            if not ext.get("corrupt") and stop_process(ext):
                stopped.append(f"card:{pname}:{ext.get('pid')}")
            remove_state(rdir, pname)
    for rec in sorted(reversed(procs), key=lambda r: order.get(r.get("role"), 9)):
        if stop_process(rec):
            stopped.append(f"{rec.get('node')}:{rec.get('role')}:{rec.get('pid')}")
    pat = _pattern(name)
    nss = [ns for ns in state.get("netns", []) if isinstance(ns, str)]
    nss += [ns for ns in netns_list() if pat.match(ns) and ns not in nss]
    me = os.getpid()
    for ns in reversed(nss):
        if not netns_exists(ns):
            continue
        for pid in netns_pids(ns):
            if pid == me:
                continue
            rec = {"pid": pid, "starttime": proc_starttime(pid), "pgid": False}
            if stop_process(rec, timeout=2.0):
                stopped.append(f"{ns}:{pid}")
    for ns in reversed(nss):
        with contextlib.suppress(netns.NetnsError):  # best effort: the rest still goes
            if netns.delete(ns):
                removed.append(ns)
    # veths live only inside the namespaces; a crashed `ip link add` cannot leave one in the
    # root namespace, but check anyway
    for lk in state.get("links", []):
        for ifname in (lk.get("card_if"), lk.get("peer_if")):
            if ifname and Path(f"/sys/class/net/{ifname}").exists():
                netns.ip("link", "del", ifname, check=False)
    try:
        state_path(name, rdir).unlink()
    except FileNotFoundError:
        pass
    for f in ("card.sock", "card.json"):
        with contextlib.suppress(FileNotFoundError):
            (node_dir(name, rdir) / f).unlink()
    # the card's DPDK runtime directory (its --file-prefix is ours), left behind if it was killed
    remove_runtime_dir(card_file_prefix(name))
    return {"found": bool(state) or bool(removed), "processes": stopped, "netns": removed}
