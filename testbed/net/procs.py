"""The testbed's lowest layer: its errors, the processes of its nodes (started, stopped by pid and
start time, never by name, their logs) and its state file ``RUN_DIR/testbed-NAME.json`` with what
it says about the nodes (written before anything is created, so ``down`` works after a crash,
through :mod:`embnic.control.runstate`; one log per node in ``RUN_DIR/testbed-NAME/``)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from embnic.control import runstate
from embnic.control.errors import NEEDS_ROOT, NeedsRootError, OperationalError
from embnic.control.runstate import pid_matches, run_dir


class TestbedError(OperationalError):
    """The testbed could not be brought up, inspected or torn down (the message names the fix)."""

    __test__ = False  # not a pytest test class


class NeedsRoot(TestbedError, NeedsRootError):
    """The caller lacks CAP_NET_ADMIN/CAP_SYS_ADMIN (network namespaces need root): exit 2."""

    category = NEEDS_ROOT


def require_net_admin(what: str = "the testbed") -> None:
    """Raise :class:`NeedsRoot` unless :func:`~embnic.control.runstate.is_root` (the one root check;
    network namespaces and veth pairs need CAP_NET_ADMIN)."""
    try:
        runstate.require_root(what, why="CAP_NET_ADMIN, to create network namespaces and veth pairs",
                              example="sudo embnic testbed up --config examples/testbed.toml")
    except NeedsRootError as e:
        raise NeedsRoot(e.message) from None


# pid + start time identify a process across pid reuse; one definition for the control plane
# and the testbed (a state record has ``pid`` and ``starttime``)
def stop_process(rec: dict, timeout: float = 5.0, *, term: bool = True) -> bool:
    """SIGTERM the process group of a state record, SIGKILL after ``timeout`` s (at once if not
    ``term``); wait up to 2 s after the SIGKILL.

    Only if pid *and* start time still match (a recycled pid is left alone).

    Returns:
        True if it was running.
    """
    if not pid_matches(rec):
        return False
    pid = rec["pid"]
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 2.0))[0 if term else 1:]:
        try:
            os.killpg(pid, sig) if rec.get("pgid", True) else os.kill(pid, sig)
        except ProcessLookupError:
            return True
        except PermissionError:
            os.kill(pid, sig)
        end = time.monotonic() + wait
        while time.monotonic() < end:
            with contextlib.suppress(ChildProcessError):  # our exited child: reaped, no zombie
                os.waitpid(pid, os.WNOHANG)
            if not pid_matches(rec):
                return True
            time.sleep(0.02)
    return True


def spawn_logged(argv: list[str], log: str | Path) -> subprocess.Popen:
    """Start ``argv`` in a session of its own, unbuffered, its output appended to ``log`` after a
    ``# command`` line (what :func:`log_tail` leaves out).

    Raises:
        TestbedError: it cannot be started.
    """
    with open(log, "ab") as logf:
        logf.write(("# " + " ".join(argv) + "\n").encode())
        logf.flush()
        try:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True,
                                    env=dict(os.environ, PYTHONUNBUFFERED="1"))
        except OSError as e:
            raise TestbedError(f"cannot start {argv[0]}: {e.strerror}") from None


def log_tail(path: str | Path, n: int = 2) -> str:
    """The last ``n`` lines of a node log (its ``# command`` header left out), joined by `` | ``."""
    try:
        lines = [ln for ln in Path(path).read_text(errors="replace").splitlines() if ln and not ln.startswith("# ")]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


# --------------------------------------------------------------------------- the state file
def state_path(name: str, rdir: Path | None = None) -> Path:
    """``RUN_DIR/testbed-NAME.json``."""
    return runstate.state_path(rdir or run_dir(), f"testbed-{name}")


def node_dir(name: str, rdir: Path | None = None) -> Path:
    """``RUN_DIR/testbed-NAME/``: logs, effective config, card socket."""
    return (rdir or run_dir()) / f"testbed-{name}"


def testbed_state(name: str, rdir: Path | None = None) -> dict | None:
    """The state of testbed ``name`` (None if there is none; ``{"name", "corrupt": True, ...}`` if unreadable)."""
    st = runstate.read_state(rdir or run_dir(), f"testbed-{name}")
    return {"name": name, **st} if st is not None and st.get("corrupt") else st


def save_testbed_state(state: dict, rdir: Path | None = None) -> None:
    """Write the state file of testbed ``state["name"]`` atomically."""
    runstate.write_state(rdir or run_dir(), f"testbed-{state['name']}", state)


def list_testbeds(rdir: Path | None = None) -> list[str]:
    """Names of the testbeds that have a state file."""
    d = rdir or run_dir()
    try:
        return sorted(p.name[len("testbed-"):-len(".json")] for p in d.glob("testbed-*.json"))
    except OSError:
        return []


def card_pipeline_name(name: str) -> str:
    """The pipeline name (``[control] name``) of testbed ``name``'s effective config: ``NAME-card``,
    its card namespace's name. A card started from that config with ``embnic pipeline load -c
    RUN_DIR/testbed-NAME/cluster.toml`` (after ``testbed up --no-card``) has its state file
    ``RUN_DIR/NAME-card.json``, so the cards of two testbeds do not collide."""
    return f"{name}-card"


def loaded_card(name: str, rdir: Path | None = None) -> dict | None:
    """The state of the card that ``pipeline load`` started from testbed ``name``'s effective config
    (``RUN_DIR/NAME-card.json``, in the testbed's card namespace), or None if there is none.
    Not the card ``testbed up`` starts itself (that one is the testbed state's ``card``)."""
    st = runstate.read_state(rdir or run_dir(), card_pipeline_name(name))
    if st is None or st.get("corrupt"):
        return st
    return st if st.get("netns") in (None, card_pipeline_name(name)) else None


def card_target(target, name: str, rdir):
    """The card pipeline ``name`` in ``rdir`` as its :class:`~embnic.control.targets.base.Target`
    (``target``: the target name its record gives; dpdk when none), to ask or to stop it."""
    from embnic.control.targets.base import get_target_class

    return get_target_class(target if isinstance(target, str) else "dpdk")(None, name=name, run_dir=rdir)


_ROLE_ORDER = {"card": 0, "server": 1, "impair": 2}


def node_label(rec: dict) -> str:
    """How a process record is named to users: ``the card``, ``shard 1's server``, ``the netem
    helper of link c1``."""
    role, node = rec.get("role"), str(rec.get("node"))
    if role == "server" and node.startswith("s"):
        return f"shard {node[1:]}'s server"
    return {"card": "the card", "impair": f"the netem helper of link {node}"}.get(role, f"{node} ({role})")


def dead_nodes(state: dict) -> list[dict]:
    """The recorded card, server and netem-helper processes of a testbed state that no longer
    run (pid gone, or recycled: start time differs), card first.

    Returns:
        ``[{"node", "role", "pid", "log", "what"}]`` (``what``: :func:`node_label`).
    """
    out = []
    if not state.get("card") and state.get("name") and state.get("dir"):
        # no card of its own (up --no-card): the one `pipeline load` started from its config, if any
        st = loaded_card(state["name"], Path(state["dir"]).parent)
        if st is not None and not st.get("corrupt") and not pid_matches(st):
            out.append({"node": "card", "role": "card", "pid": st.get("pid"), "log": st.get("log"),
                        "what": f"the card (pipeline {card_pipeline_name(state['name'])}, from `pipeline load`)"})
    for rec in state.get("procs", []) or []:
        if rec.get("role") in _ROLE_ORDER and not pid_matches(rec):
            out.append({"node": rec.get("node"), "role": rec.get("role"), "pid": rec.get("pid"),
                        "log": rec.get("log"), "what": node_label(rec)})
    return sorted(out, key=lambda d: (_ROLE_ORDER[d["role"]], str(d["node"])))


def describe_dead(dead: list[dict]) -> str:
    """``the card, pid 123, is not running: see /run/embnic/testbed-emb/card.log`` (``; ``-joined
    for several), or ``""`` if none."""
    return "; ".join(f"{d['what']}, pid {d['pid']}, is not running: see {d['log']}" for d in dead)
