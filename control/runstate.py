"""Run state: the run directory, state files, pid + start-time checks and the root check.

Every long-lived thing the control plane starts — a loaded pipeline (``RUN_DIR/NAME.json``),
a namespace testbed (``RUN_DIR/testbed-NAME.json``) — is described by a JSON state file in the
run directory, written atomically, naming its processes by pid *and* start time so a recycled
pid is never mistaken for ours. ``RUN_DIR`` is ``$EMBNIC_RUN_DIR`` or ``/run/embnic``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from embnic.control.errors import NeedsRootError, OperationalError, UsageError

DEFAULT_RUN_DIR = "/run/embnic"
CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21


def run_dir() -> Path:
    """Directory of state files, control sockets and logs (``$EMBNIC_RUN_DIR`` or ``/run/embnic``)."""
    return Path(os.environ.get("EMBNIC_RUN_DIR") or DEFAULT_RUN_DIR)


def ensure_run_dir(rdir: str | Path) -> Path:
    """Create the run directory (mode 0755) if needed; returns it as a Path.

    Raises:
        NeedsRootError: not root and not allowed to write it (names root and ``EMBNIC_RUN_DIR``; exit 2).
        OperationalError: cannot create or write it although root (read-only file system, ...).
    """
    p = Path(rdir)
    try:
        p.mkdir(parents=True, exist_ok=True)
        if not os.access(p, os.W_OK | os.X_OK):
            raise PermissionError
    except PermissionError:
        if os.geteuid() != 0:
            raise NeedsRootError(f"cannot write {p}: run as root (sudo embnic ...) or set EMBNIC_RUN_DIR "
                                 "to a directory you own") from None
        raise OperationalError(f"cannot write {p} (even as root): set EMBNIC_RUN_DIR to a writable "
                               "directory") from None
    except OSError as e:
        raise OperationalError(f"cannot create {p}: {e.strerror}; set EMBNIC_RUN_DIR to another directory") from None
    return p


# --------------------------------------------------------------------------- state files
def state_path(rdir: str | Path, name: str) -> Path:
    """``RUN_DIR/NAME.json``: the state file called ``name`` (``embnic``, ``testbed-emb``, ...)."""
    return Path(rdir) / f"{name}.json"


def read_state(rdir: str | Path, name: str) -> dict | None:
    """The state file ``name`` as a dict; None when there is none.

    An unreadable or damaged file reads as ``{"corrupt": True, "path": PATH}`` (callers then
    remove it rather than trust it).
    """
    p = state_path(rdir, name)
    try:
        st = json.loads(p.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {"corrupt": True, "path": str(p)}
    return st if isinstance(st, dict) else {"corrupt": True, "path": str(p)}


def write_state(rdir: str | Path, name: str, state: dict) -> Path:
    """Write the state file ``name`` atomically (temp file + rename; creates ``rdir``); returns its path."""
    p = state_path(rdir, name)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(f".json.tmp{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, p)
    return p


def remove_state(rdir: str | Path, name: str) -> None:
    """Delete the state file ``name`` (no error if absent)."""
    state_path(rdir, name).unlink(missing_ok=True)


# --------------------------------------------------------------------------- processes
def proc_starttime(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22), None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat.rsplit(")", 1)[1].split()
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[19])


def pid_matches(rec: dict) -> bool:
    """True if the process a state record names (``pid`` and, when recorded, ``starttime``) still runs."""
    pid = rec.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    st = proc_starttime(pid)
    if st is None:
        return False
    want = rec.get("starttime")
    return want is None or want == st


# --------------------------------------------------------------------------- root
def is_root() -> bool:
    """True if this process is root with CAP_NET_ADMIN and CAP_SYS_ADMIN effective — what network
    namespaces, veth pairs and the DPDK EAL (runtime dir, af_packet vdevs) need here.

    Root whose capabilities were dropped (``setpriv --bounding-set=-net_admin``) is not.
    """
    if os.geteuid() != 0:
        return False
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
                return bool(caps >> CAP_NET_ADMIN & 1) and bool(caps >> CAP_SYS_ADMIN & 1)
    except OSError:
        pass
    return True


def require_root(what: str, why: str | None = None, example: str = "sudo embnic ...") -> None:
    """Raise unless :func:`is_root`.

    Args:
        what: the operation, e.g. ``"testbed up (emb)"``.
        why: what it needs root for, e.g. ``"CAP_NET_ADMIN, to create network namespaces"``.
        example: the command line to suggest.
    Raises:
        NeedsRootError: ``"<what> needs root (<why>): run as root (<example>)"`` (exit code 2).
    """
    if not is_root():
        raise NeedsRootError(f"{what} needs root{f' ({why})' if why else ''}: run as root ({example})")


NETNS_DIR = Path("/run/netns")


def require_netns(name: str, option: str = "--netns") -> Path:
    """The path of the existing network namespace ``name`` (``/run/netns/NAME``, as ``ip netns add`` makes).

    A wrong name is a usage error (the request names a namespace that is not there), not an
    operational one: the fix is another ``--netns`` value, or creating the namespace.

    Args:
        name: the namespace's name (one file name: no ``/``, not ``.`` or ``..``).
        option: the option or setting it came from, named in the message.
    Raises:
        UsageError: not a namespace name, or no such namespace (exit 2; ``param`` ``"netns"``).
    """
    if not isinstance(name, str) or not name or "/" in name or "\0" in name or name in (".", "..") \
            or len(name) > 255:
        raise UsageError(f"{option} {name!r} is not a network namespace name (one file name under "
                         f"{NETNS_DIR}: `ip netns list` shows them)", param="netns")
    path = NETNS_DIR / name
    if not path.exists():
        raise UsageError(f"{option} {name!r}: no such network namespace: create it "
                         f"(ip netns add {name}) or drop {option}", param="netns")
    return path


def terminate(proc: subprocess.Popen, timeout: float) -> tuple[bool, bool]:
    """SIGTERM our child ``proc``, wait ``timeout`` s, SIGKILL it if it still runs.

    Returns:
        ``(was_running, killed)``.
    """
    if proc.poll() is not None:
        return False, False
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
        return True, False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        return True, True
