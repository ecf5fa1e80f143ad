"""Network namespaces and the processes in them: the testbed's lowest layer.

Errors of the testbed (:class:`TestbedError`, :class:`NeedsRoot`), the root check of every
testbed operation (:func:`require_net_admin`), running iproute2/ethtool/tc (:func:`run_cmd`),
listing namespaces and the processes inside (:func:`netns_list`, :func:`netns_pids`), entering
one from a thread (:func:`in_netns`) and stopping a recorded process by pid + start time
(:func:`stop_process`, never by name).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

from embnic.control import runstate
from embnic.control.errors import NEEDS_ROOT, NeedsRootError, OperationalError
from embnic.control.runstate import pid_matches

_CLONE_NEWNET = 0x40000000


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


def run_cmd(argv: list[str], *, check: bool = True, log=None, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run a command (iproute2, ethtool, tc), logging it; raise :class:`TestbedError` on failure."""
    if log is not None:
        log.write("+ " + " ".join(argv) + "\n")
        log.flush()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise TestbedError(f"{argv[0]} is not installed: apt-get install "
                           f"{'iproute2' if argv[0] in ('ip', 'tc') else argv[0]}") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"`{' '.join(argv)}` did not finish within {timeout:g} s") from None
    if log is not None and (p.stdout or p.stderr):
        log.write(p.stdout + p.stderr)
    if check and p.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` failed: {(p.stderr or p.stdout).strip()}")
    return p


def netns_exists(ns: str) -> bool:
    """True if the named network namespace exists (``/run/netns/NS``)."""
    return Path("/run/netns", ns).exists()


def netns_list() -> list[str]:
    """Names of all named network namespaces."""
    try:
        return sorted(os.listdir("/run/netns"))
    except FileNotFoundError:
        return []


def netns_pids(ns: str) -> list[int]:
    """Pids of the processes whose network namespace is ``ns`` (``ip netns pids``)."""
    p = run_cmd(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


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
            _reap(pid)
            if not pid_matches(rec):
                return True
            time.sleep(0.02)
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


_libc = None


def _setns(fd: int) -> None:
    global _libc
    if hasattr(os, "setns"):
        os.setns(fd, _CLONE_NEWNET)
        return
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


@contextlib.contextmanager
def in_netns(ns: str) -> Iterator[None]:
    """Run the body with the *calling thread* in network namespace ``ns``.

    Sockets created inside stay in ``ns`` after the block (that is how the training job's
    :class:`~embnic.client_lib.client.EmbeddingClient` lives in a client namespace while the
    rest of the process does not). Threads started inside inherit ``ns``.

    Raises:
        TestbedError: no such namespace; NeedsRoot: not allowed.
    """
    try:
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    except FileNotFoundError:
        raise TestbedError(f"network namespace {ns!r} does not exist: is the testbed up? "
                           "(`embnic testbed status`)") from None
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        try:
            _setns(fd)
        except PermissionError:
            raise NeedsRoot(f"entering network namespace {ns!r} needs root (CAP_SYS_ADMIN)") from None
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(fd)
        os.close(home)


def log_tail(path: str | Path, n: int = 2) -> str:
    """The last ``n`` lines of a node log (its ``# command`` header left out), joined by `` | ``."""
    try:
        lines = [ln for ln in Path(path).read_text(errors="replace").splitlines() if ln and not ln.startswith("# ")]
    except OSError:
        return ""
    return " | ".join(lines[-n:])
