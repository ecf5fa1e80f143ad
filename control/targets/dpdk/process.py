"""DPDK processes: EAL arguments, start, readiness, stop and the EAL runtime directory, in one place.

Every DPDK primary process embnic runs — the card loaded by a target
(:class:`~embnic.control.targets.dpdk.target.DpdkCard`), the card the benchmark and the dataplane
tests run on bare vdevs (:class:`CardProcess`), the benchmark's ``dpdk-testpmd`` — is a
:class:`DpdkProcess`: its command line is the first line (``# ...``) of its log; a process that
exits while starting is reported with the most informative line of that log
(:func:`start_failure_reason`); it is stopped by SIGTERM, then SIGKILL, only as our own child or
as a recorded pid whose start time still matches (:func:`stop_recorded`), never by name; the
EAL runtime directory ``/var/run/dpdk/PREFIX`` of our own prefixes (:data:`OWN_PREFIXES`) is
removed after every stop; a failed start leaves nothing behind.

    from embnic.control.targets.dpdk.process import CardProcess, build_card
    with CardProcess(build_card(), ["net_null0,no-rx=1"], lcores="0") as card:
        print(card.call("counters")["drops"])
"""
from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from embnic.control.ctlsock import CtlArgumentError, CtlClient, CtlCommandError
from embnic.control.errors import NeedsRootError, OperationalError
from embnic.control.netns import exec_argv
from embnic.control.runstate import pid_matches, proc_starttime, terminate

REPO_ROOT = Path(__file__).resolve().parents[3]
DATAPLANE = REPO_ROOT / "dataplane"
#: where `make -C dataplane` puts the card binary
REPO_BINARY = DATAPLANE / "build" / "embnic-dp"
#: where the EAL keeps a primary process's runtime files (``PREFIX/config``, ``mp_socket``, ...) as root
DPDK_RUNTIME_DIR = Path("/var/run/dpdk")
#: EAL arguments of every DPDK process here besides ``-l``, ``--file-prefix`` and ``--vdev``
EAL_DEFAULTS = ("--no-huge", "--no-pci", "-m", "256")
#: ``--file-prefix`` beginnings that are ours: the runtime directories of only these are removed
#: (``embnic-``: loaded pipelines and testbeds; ``enT``: benchmark and test processes)
OWN_PREFIXES = ("embnic-", "enT")

_seq = itertools.count()


class DpdkProcError(OperationalError):
    """A DPDK process failed to build, start, answer or stop (the message names its log)."""


# --------------------------------------------------------------------------- EAL arguments
def eal_argv(lcores: str, file_prefix: str, vdevs: Sequence[str] = (), extra: Sequence[str] = (), *,
             pci: Sequence[str] = (), hugepages: bool = False) -> list[str]:
    """EAL arguments: ``-l LCORES`` + :data:`EAL_DEFAULTS` + ``--file-prefix P`` + ``extra`` + ``--vdev V`` each.

    Example: ``eal_argv("0,1", "embnic-tb-emb", ["net_ring0"])`` →
    ``["-l", "0,1", "--no-huge", "--no-pci", "-m", "256", "--file-prefix", "embnic-tb-emb", "--vdev", "net_ring0"]``.
    A list that maps lcores to CPUs (``"0@0,1@1,2@1"``: three lcores on two CPUs) is passed as
    ``--lcores LCORES`` instead.

    With ``pci`` (PCI addresses of NIC ports, docs/deploy.md) the EAL probes those devices —
    ``-a BDF`` each (its allow-list: no other device is touched) in place of ``--no-pci`` — and
    with ``hugepages`` it takes its memory from hugepages (no ``--no-huge -m 256``):
    ``eal_argv("0,1", "p", pci=["0000:3b:00.0"], hugepages=True)`` →
    ``["-l", "0,1", "--file-prefix", "p", "-a", "0000:3b:00.0"]``.
    """
    defaults = [a for a in EAL_DEFAULTS if not (pci and a == "--no-pci")]
    if hugepages:
        defaults = [a for a in defaults if a not in ("--no-huge", "-m", "256")]
    return ["--lcores" if "@" in lcores else "-l", lcores, *defaults, "--file-prefix", file_prefix,
            *flag_each("-a", pci), *extra, *flag_each("--vdev", vdevs)]


def flag_each(flag: str, values: Iterable[str]) -> list[str]:
    """``flag`` before each of ``values``: ``flag_each("--vdev", ["a", "b"])`` →
    ``["--vdev", "a", "--vdev", "b"]``."""
    return [w for v in values for w in (flag, v)]


def unique_prefix(tag: str = "x") -> str:
    """A ``--file-prefix`` unique to this process and call: ``enT<pid><tag><n>``."""
    return f"enT{os.getpid()}{tag}{next(_seq)}"


def file_prefix_of(argv: Sequence[str]) -> str | None:
    """The ``--file-prefix`` of a DPDK command line, or None."""
    argv = list(argv)
    if "--file-prefix" in argv[:-1]:
        return argv[argv.index("--file-prefix") + 1]
    return None


def runtime_dir(prefix: str | None) -> Path | None:
    """EAL's runtime directory ``/var/run/dpdk/PREFIX`` when ``prefix`` is one of ours, else None."""
    if prefix and prefix.startswith(OWN_PREFIXES) and "/" not in prefix and prefix not in (".", ".."):
        return DPDK_RUNTIME_DIR / prefix
    return None


def remove_runtime_dir(prefix: str | None) -> None:
    """Remove EAL's runtime directory of a stopped process (our own prefixes only; no error if absent)."""
    d = runtime_dir(prefix)
    if d is not None:
        shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------- logs
# A line of the card's log that says why it did not start: specific reasons first.
_SPECIFIC = re.compile(r"failed to|unrecognized option|invalid option|unknown option|bad value|invalid core|"
                       r"lcore \d+ unavailable|cannot|can't|unable|no such|not found|permission denied|"
                       r"not permitted|already|need \d|must|invalid|failed|error", re.I)
# Lines that say only that something failed (EAL's epilogue): used when nothing better is there.
_GENERIC = re.compile(r"Error - exiting with code|Unregistering with invalid input parameter|"
                      r"Invalid 'command line' arguments|^Cause: (invalid arguments|EAL init failed|"
                      r"Cannot init EAL)", re.I)
# Informational EAL lines that happen to contain an error word.
_BENIGN = re.compile(r"Physical addresses are unavailable|No legacy callbacks|^EAL: Detected|"
                     r"^EAL: Selected IOVA|Multi-process socket", re.I)


def _usage_text(line: str) -> bool:
    """True for a line of EAL's or embnic-dp's usage text (``Usage:``, ``... options:``, indented help)."""
    return (line.startswith(("Usage:", "usage:")) or line.rstrip().endswith("options:")
            or (line[:1].isspace() and not line.strip().startswith("Cause:")))


def start_failure_reason(log: Path | str) -> str:
    """The most informative line of a DPDK process log that ends in a failed start ("" if none).

    Skips the command-line header (``# ...``) and EAL/embnic-dp usage text, then prefers the
    first specific error (``failed to parse device "net_bogus0"``, ``invalid core list syntax``,
    ``unrecognized option '--bogus-flag'``, ``bad value for --burst: '0'``, ``Cause: need 1..8
    ports ...``) over EAL's generic epilogue (``Cause: invalid arguments``, ``Error - exiting
    with code: 1``); else the last line. At most 300 characters.
    """
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return ""
    lines = [ln.rstrip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln.strip() and not ln.startswith("# ") and not _usage_text(ln)]
    lines = [ln.strip() for ln in lines]
    cands = [ln for ln in lines if not _BENIGN.search(ln)]
    specific = [ln for ln in cands if _SPECIFIC.search(ln) and not _GENERIC.search(ln)]
    generic = [ln for ln in cands if _GENERIC.search(ln)]
    causes = [ln for ln in generic if ln.startswith("Cause:")]
    for group in (specific, causes, generic):
        if group:
            return group[0][:300]
    return lines[-1][:300] if lines else ""


# --------------------------------------------------------------------------- one process
class DpdkProcess:
    """One DPDK primary process: ``[ip netns exec NS] [wrapper] BINARY EAL... -- APP...``.

    Args:
        binary: the executable (``embnic-dp``, ``dpdk-testpmd``).
        eal: EAL arguments (:func:`eal_argv`).
        app: application arguments after ``--``.
        netns: run inside this network namespace.
        log: file for stdout/stderr; the command line is its first line.
        wrapper: argv in front of the binary (e.g. ``["stdbuf", "-oL"]``).
        stdin: ``subprocess.DEVNULL`` (default) or ``subprocess.PIPE`` (testpmd's prompt).
        name: how errors call it (default: the binary's file name).
    """

    def __init__(self, binary: str | os.PathLike, eal: Sequence[str], app: Sequence[str] = (), *,
                 netns: str | None = None, log: str | os.PathLike, wrapper: Sequence[str] = (),
                 stdin: int = subprocess.DEVNULL, name: str | None = None):
        self.binary = os.fspath(binary)
        self.eal, self.app = list(eal), list(app)
        self.netns = netns
        self.log_path = Path(log)
        self.wrapper = list(wrapper)
        self.stdin = stdin
        self.name = name or Path(self.binary).name
        self.prefix = file_prefix_of(self.eal)
        self.proc: subprocess.Popen | None = None
        self._runtime_was_there = False

    @property
    def argv(self) -> list[str]:
        """The whole command line."""
        return exec_argv(self.netns, [*self.wrapper, self.binary, *self.eal, "--", *self.app])

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> "DpdkProcess":
        """Start it (output to the log, its own session); returns self.

        Raises:
            DpdkProcError: the binary cannot be executed.
        """
        rd = runtime_dir(self.prefix)
        self._runtime_was_there = rd is not None and rd.exists()
        argv = self.argv
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as logf:
            logf.write(("# " + " ".join(argv) + "\n").encode())
            logf.flush()
            try:
                self.proc = subprocess.Popen(argv, stdin=self.stdin, stdout=logf, stderr=subprocess.STDOUT,
                                             start_new_session=True, close_fds=True)
            except OSError as e:
                raise DpdkProcError(f"cannot start {argv[0]}: {e.strerror}") from None
        return self

    def record(self) -> dict:
        """``{pid, starttime, argv, log}`` for a state file (:func:`stop_recorded` stops it from that)."""
        return {"pid": self.pid, "starttime": proc_starttime(self.pid) if self.pid else None,
                "argv": self.argv, "log": str(self.log_path)}

    def log(self) -> str:
        """Everything the process printed so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, probe: Callable[[], bool], timeout: float, what: str = "answer") -> None:
        """Poll ``probe()`` every 50 ms until it returns True.

        Raises:
            DpdkProcError: the process exited first (``NAME exited with code C while starting:
                REASON (full log: LOG)``), or ``timeout`` s passed (then it is stopped).
            BaseException: whatever interrupted the wait (``KeyboardInterrupt``, the probe's
                error), after stopping the process.
        """
        deadline = time.monotonic() + timeout
        try:
            while True:
                rc = self.proc.poll()
                if rc is not None:
                    how = f"signal {-rc}" if rc < 0 else f"code {rc}"
                    why = start_failure_reason(self.log_path)
                    raise DpdkProcError(f"{self.name} exited with {how} while starting"
                                        f"{': ' + why if why else ''} (full log: {self.log_path})")
                if probe():
                    return
                if time.monotonic() >= deadline:
                    self.stop()
                    raise DpdkProcError(f"{self.name} (pid {self.proc.pid}) did not {what} within {timeout:g}s, "
                                        f"stopped it again; see its log {self.log_path}")
                time.sleep(0.05)
        except DpdkProcError:
            raise
        except BaseException:  # Ctrl-C (or a failing probe) while it starts: it runs in its own session, so
            self.stop()        # nothing else would stop it (`bench dataplane` left a card busy-polling 2 lcores)
            raise

    def wait_answer(self, ctl: str | os.PathLike, timeout: float, what: str = "answer") -> None:
        """:meth:`wait_ready` until the control socket ``ctl`` exists and answers ``ping`` (errors
        say the process did not ``what`` on ``ctl``)."""
        probe = CtlClient(ctl, timeout=1.0)
        self.wait_ready(lambda: os.path.exists(ctl) and probe.alive(), timeout, f"{what} on {ctl}")

    def stop(self, timeout: float = 10.0) -> dict:
        """SIGTERM, wait ``timeout`` s, SIGKILL if still running; remove its EAL runtime directory.

        Returns:
            ``{pid, was_running, killed, exit}``.
        """
        res = {"pid": self.pid, "was_running": False, "killed": False, "exit": None}
        if self.proc is None:
            return res
        res["was_running"], res["killed"] = terminate(self.proc, timeout)
        res["exit"] = self.proc.returncode
        if not self._runtime_was_there:
            remove_runtime_dir(self.prefix)
        return res


def stop_recorded(rec: dict, timeout: float = 10.0, child: subprocess.Popen | None = None) -> dict:
    """Stop the DPDK process a state record names (``pid``, ``starttime``, ``argv``) and remove its
    EAL runtime directory: SIGTERM, wait ``timeout`` s, SIGKILL. Only if pid *and* start time still
    match (a recycled pid is left alone).

    Args:
        rec: the record (:meth:`DpdkProcess.record`).
        child: the ``Popen`` of that pid when this process started it (its exit code is then known).
    Returns:
        ``{pid, was_running, killed, exit}``.
    Raises:
        NeedsRootError: the process belongs to another user.
    """
    pid = rec.get("pid")
    res = {"pid": pid, "was_running": False, "killed": False, "exit": None}
    own = child if child is not None and child.pid == pid else None
    if pid_matches(rec):
        res["was_running"] = True
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        except PermissionError:
            raise NeedsRootError(f"not allowed to stop pid {pid} (started by another user): run as root "
                                 "(sudo embnic ...)") from None
        else:
            if not _wait_gone(rec, own, timeout):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                res["killed"] = True
                _wait_gone(rec, own, 5.0)
    if own is not None:
        res["exit"] = own.poll() if res["was_running"] else own.wait()
    remove_runtime_dir(file_prefix_of(rec.get("argv") or []))
    return res


def _wait_gone(rec: dict, child: subprocess.Popen | None, timeout: float) -> bool:
    if child is not None:
        try:
            child.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = time.monotonic() + timeout
    while pid_matches(rec):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


# --------------------------------------------------------------------------- the card on bare vdevs
def build_card(build_dir: str | os.PathLike | None = None, **make_vars: str) -> Path:
    """Build ``embnic-dp`` with ``make -C dataplane`` (a no-op when up to date).

    Args:
        build_dir: ``BUILD=`` directory (default dataplane/build).
        make_vars: extra make variables, e.g. ``EMBNIC_PROTO_VERSION="2"``.
    Returns:
        path of the binary.
    Raises:
        DpdkProcError: make failed (its output tail is in the message).
    """
    args = ["make", "-s", "-C", str(DATAPLANE)]
    if build_dir is not None:
        args.append(f"BUILD={os.fspath(build_dir)}")
    args += [f"{k}={v}" for k, v in make_vars.items()]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise DpdkProcError(f"`{' '.join(args)}` failed:\n{(r.stdout + r.stderr)[-3000:]}")
    out = Path(build_dir) / "embnic-dp" if build_dir is not None else REPO_BINARY
    if not out.is_file():
        raise DpdkProcError(f"`{' '.join(args)}` did not produce {out}")
    return out


class CardProcess:
    """``embnic-dp`` on the vdevs given, without a cluster config or state file: the card of the
    benchmark and of the dataplane tests (a target's :class:`~embnic.control.targets.dpdk.target.DpdkCard`
    runs the same :class:`DpdkProcess` from a config, with a state file).

    Args:
        binary: the embnic-dp executable.
        vdevs: one ``--vdev`` per card port, in port order.
        lcores: EAL lcore list (``"0"`` run to completion, ``"0,1"`` RX/TX split).
        port_ips: the card's IPv4 per port (``--port-ip P=IP``).
        args: more card arguments (after ``--``), e.g. ``["--paused"]``.
        netns: run inside this network namespace (``ip netns exec``).
        log: file for stdout/stderr (default: a temporary file).
        ready_timeout: seconds to wait for the control socket.
        eal_args: more EAL arguments, e.g. ``["--mbuf-pool-ops-name", "ring_mp_mc"]``.
    """

    def __init__(self, binary: str | os.PathLike, vdevs: Sequence[str], *, lcores: str = "0",
                 port_ips: dict[int, str] | None = None, args: Sequence[str] = (),
                 netns: str | None = None, log: str | os.PathLike | None = None,
                 ready_timeout: float = 30.0, eal_args: Sequence[str] = ()):
        self.binary = Path(binary)
        self.ready_timeout = ready_timeout
        self.prefix = unique_prefix("c")
        self._sockdir = Path(tempfile.mkdtemp(prefix="enT"))
        self.ctl_path = self._sockdir / "card.sock"
        self.log_path = Path(log) if log else self._sockdir / "card.log"
        card = ["--ctl", str(self.ctl_path),
                *flag_each("--port-ip", (f"{p}={ip}" for p, ip in sorted((port_ips or {}).items())))]
        self.process = DpdkProcess(self.binary, eal_argv(lcores, self.prefix, vdevs, extra=eal_args),
                                   card + list(args), netns=netns, log=self.log_path, name="embnic-dp")
        self.ctl = CtlClient(self.ctl_path, timeout=10.0)
        self.returncode: int | None = None

    @property
    def proc(self) -> subprocess.Popen | None:
        return self.process.proc

    def start(self) -> "CardProcess":
        """Start and wait until ``ping`` answers on the control socket.

        A start that fails leaves nothing behind: the process is stopped, and its EAL runtime
        directory, control socket and temporary directory (with the log, unless ``log`` was
        given) are removed — the error then quotes the log's last lines.

        Raises:
            DpdkProcError: it exited or did not answer within ``ready_timeout`` (names the log,
                or quotes it when it was a temporary file).
            BaseException: whatever interrupted the wait (``KeyboardInterrupt``), after the same
                clean-up.
        """
        self.process.start()
        try:
            self.process.wait_answer(self.ctl_path, self.ready_timeout)
        except DpdkProcError as e:
            self.returncode = self.proc.poll()
            raise self._discard(str(e)) from None
        except BaseException:
            self._discard("")
            raise
        return self

    def _discard(self, message: str) -> DpdkProcError:
        """Clean up after a failed start (see :meth:`start`); returns the error to raise."""
        self.process.stop()  # an exited process is only reaped; also removes the EAL runtime directory
        own_log = self.log_path.parent == self._sockdir
        tail = ""
        if own_log:
            lines = [ln.rstrip() for ln in self.log().splitlines() if ln.strip() and not ln.startswith("# ")]
            tail = "\n".join("  " + ln[:300] for ln in lines[-12:])
            message = message.replace(f"full log: {self.log_path}", "its log, removed with the start's temporary "
                                                                    "files, is quoted below")
            message = message.replace(f"see its log {self.log_path}", "its log is quoted below")
        with contextlib.suppress(OSError):
            self.ctl_path.unlink()
        shutil.rmtree(self._sockdir, ignore_errors=True)
        return DpdkProcError(message + (f"\n{tail}" if tail else ""))

    def call(self, cmd: str, timeout: float | None = None, check: bool = True, **fields: Any) -> dict:
        """Send one control command (docs/control-socket.md), return the response object.

        Args:
            check: False returns a refusal (``{"ok": false, "error": ..., "kind": ...}``) instead of raising.
        Raises:
            CtlCommandError: ``check`` and the card answered ``ok: false``.
            CtlError: the socket could not be reached, closed, or timed out.
        """
        ctl = self.ctl if timeout is None else CtlClient(self.ctl_path, timeout=timeout)
        try:
            return ctl.call(cmd, **fields)
        except CtlCommandError as e:
            if check:
                raise
            return {"ok": False, "error": e.card_error,
                    "kind": "argument" if isinstance(e, CtlArgumentError) else "failure"}

    def counters(self) -> dict:
        """The ``counters`` response."""
        return self.call("counters")

    def log(self) -> str:
        """Everything the process printed so far."""
        return self.process.log()

    def alive(self) -> bool:
        return self.process.alive()

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait ``timeout`` s, SIGKILL if still running; returns the exit code."""
        self.returncode = self.process.stop(timeout)["exit"]
        with contextlib.suppress(OSError):
            self.ctl_path.unlink()
        return self.returncode

    def cleanup(self) -> None:
        """Stop and remove the socket directory (and the log if it lives there)."""
        self.stop()
        shutil.rmtree(self._sockdir, ignore_errors=True)

    def __enter__(self) -> "CardProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
