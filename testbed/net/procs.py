"""The testbed's errors and the processes of its nodes (started, stopped by pid and start time,
never by name, their logs): the testbed's lowest layer."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from embnic.control import runstate
from embnic.control.errors import NEEDS_ROOT, NeedsRootError, OperationalError
from embnic.control.runstate import pid_matches


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
def stop_process(rec: dict, timeout: float = 5.0) -> bool:
    """SIGTERM the process group of a state record, SIGKILL after ``timeout`` s.

    Only if pid *and* start time still match (a recycled pid is left alone).

    Returns:
        True if it was running.
    """
    if not pid_matches(rec):
        return False
    pid = rec["pid"]
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(pid, sig) if rec.get("pgid", True) else os.kill(pid, sig)
        except ProcessLookupError:
            return True
        except PermissionError:
            os.kill(pid, sig)
        end = time.monotonic() + wait
        while time.monotonic() < end:
            reap(pid)
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


def reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is a child of this process that has exited (no zombie);
    a no-op otherwise (not exited yet, or not our child)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def log_tail(path: str | Path, n: int = 2) -> str:
    """The last ``n`` lines of a node log (its ``# command`` header left out), joined by `` | ``."""
    try:
        lines = [ln for ln in Path(path).read_text(errors="replace").splitlines() if ln and not ln.startswith("# ")]
    except OSError:
        return ""
    return " | ".join(lines[-n:])
