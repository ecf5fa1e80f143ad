"""Run DPDK processes (the card ``embnic-dp``, ``dpdk-testpmd``) for tests and benchmarks.

:class:`CardProcess` starts ``embnic-dp`` on the vdevs you give, waits until its control socket
answers, talks JSON lines to it (docs/control-socket.md) and stops it with SIGTERM, tracking
only its own pid. Every EAL process gets a unique ``--file-prefix`` (``enT<pid>x<n>``) and its
runtime directory ``/var/run/dpdk/<prefix>`` is removed after it exits.

Example::

    from embnic.testbed.dpdk_proc import CardProcess, build_card
    with CardProcess(build_card(), ["net_null0,no-rx=1"], lcores="0") as card:
        print(card.call("counters")["drops"])
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]
DATAPLANE = REPO / "dataplane"
CARD_BINARY = DATAPLANE / "build" / "embnic-dp"
EAL_BASE = ("--no-huge", "--no-pci", "-m", "256")

_seq = itertools.count()


class DpdkProcError(RuntimeError):
    """A DPDK process failed to build, start, answer or stop (the message names its log)."""


def file_prefix(tag: str = "x") -> str:
    """A unique EAL ``--file-prefix`` for this process: ``enT<pid><tag><n>``."""
    return f"enT{os.getpid()}{tag}{next(_seq)}"


def remove_runtime_dir(prefix: str) -> None:
    """Remove EAL's runtime directory of a stopped process (only our ``enT`` prefixes)."""
    if prefix.startswith("enT") and "/" not in prefix:
        shutil.rmtree(Path("/var/run/dpdk") / prefix, ignore_errors=True)


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
    out = Path(build_dir) / "embnic-dp" if build_dir is not None else CARD_BINARY
    if not out.is_file():
        raise DpdkProcError(f"`{' '.join(args)}` did not produce {out}")
    return out


class CardProcess:
    """One ``embnic-dp`` process.

    Args:
        binary: the embnic-dp executable.
        vdevs: one ``--vdev`` per card port, in port order.
        lcores: EAL lcore list (``"0"`` run to completion, ``"0,1"`` RX/TX split).
        port_ips: the card's IPv4 per port (``--port-ip P=IP``).
        args: more card arguments (after ``--``), e.g. ``["--paused"]``.
        netns: run inside this network namespace (``ip netns exec``).
        log: file for stdout/stderr (default: a temporary file).
        ready_timeout: seconds to wait for the control socket.
    """

    def __init__(self, binary: str | os.PathLike, vdevs: Sequence[str], *, lcores: str = "0",
                 port_ips: dict[int, str] | None = None, args: Sequence[str] = (),
                 netns: str | None = None, log: str | os.PathLike | None = None,
                 ready_timeout: float = 30.0):
        self.binary = Path(binary)
        self.vdevs = list(vdevs)
        self.lcores = lcores
        self.port_ips = dict(port_ips or {})
        self.args = list(args)
        self.netns = netns
        self.ready_timeout = ready_timeout
        self.prefix = file_prefix("c")
        self._sockdir = Path(tempfile.mkdtemp(prefix="enT"))
        self.ctl_path = self._sockdir / "card.sock"
        self.log_path = Path(log) if log else self._sockdir / "card.log"
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None

    def argv(self) -> list[str]:
        """The command line."""
        pre = ["ip", "netns", "exec", self.netns] if self.netns else []
        eal = [*EAL_BASE, "-l", self.lcores, "--file-prefix", self.prefix]
        for v in self.vdevs:
            eal += ["--vdev", v]
        card = ["--ctl", str(self.ctl_path)]
        for p, ip in sorted(self.port_ips.items()):
            card += ["--port-ip", f"{p}={ip}"]
        return pre + [str(self.binary), *eal, "--", *card, *self.args]

    def start(self) -> "CardProcess":
        """Start and wait until ``ping`` answers.

        Raises:
            DpdkProcError: it exited or did not answer within ``ready_timeout`` (names the log).
        """
        with open(self.log_path, "wb") as logf:
            logf.write(("# " + " ".join(self.argv()) + "\n").encode())
            logf.flush()
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.ready_timeout
        while True:
            if self.proc.poll() is not None:
                self.returncode = self.proc.returncode
                raise DpdkProcError(f"embnic-dp exited with {self.proc.returncode} while starting; "
                                    f"log {self.log_path}:\n{self.log()[-2000:]}")
            if self.ctl_path.exists():
                try:
                    self.call("ping", timeout=1.0)
                    return self
                except OSError:
                    pass
            if time.monotonic() > deadline:
                self.stop()
                raise DpdkProcError(f"embnic-dp did not answer on {self.ctl_path} within "
                                    f"{self.ready_timeout:g}s; log {self.log_path}")
            time.sleep(0.05)

    def call(self, cmd: str, timeout: float = 10.0, check: bool = True, **fields: Any) -> dict:
        """Send one request, return the response object.

        Raises:
            DpdkProcError: ``check`` and the card answered ``ok: false``.
            OSError: the socket could not be reached or timed out.
        """
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(self.ctl_path))
            s.sendall((json.dumps({"cmd": cmd, **fields}) + "\n").encode())
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(1 << 20)
                if not chunk:
                    raise ConnectionError(f"card closed the control socket during {cmd!r}")
                buf += chunk
        resp = json.loads(buf)
        if check and not resp.get("ok"):
            raise DpdkProcError(f"card refused {cmd} {fields}: {resp.get('error')}")
        return resp

    def counters(self) -> dict:
        """The ``counters`` response."""
        return self.call("counters")

    def log(self) -> str:
        """Everything the process printed so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait ``timeout`` s, SIGKILL if still running; returns the exit code."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc is not None:
            self.returncode = self.proc.returncode
        remove_runtime_dir(self.prefix)
        try:
            self.ctl_path.unlink()
        except OSError:
            pass
        return self.returncode

    def cleanup(self) -> None:
        """Stop and remove the socket directory (and the log if it lives there)."""
        self.stop()
        shutil.rmtree(self._sockdir, ignore_errors=True)

    def __enter__(self) -> "CardProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_drained(card: CardProcess, n_frames: int, timeout: float = 30.0) -> dict:
    """Wait until the card has received ``n_frames`` and accounted every one of them.

    Every received frame is either sent (``tx_frames``) or dropped (``drops``; ``no_mbuf`` counts
    frames never received and is left out), and the header ring is empty.

    Returns:
        the last ``counters`` response.
    Raises:
        DpdkProcError: not drained within ``timeout`` s (the message holds the counters).
    """
    deadline = time.monotonic() + timeout
    while True:
        c = card.counters()
        rx = sum(p["rx_frames"] for p in c["ports"])
        done = sum(p["tx_frames"] for p in c["ports"]) + sum(
            v for k, v in c["drops"].items() if k != "no_mbuf")
        if rx >= n_frames and done >= rx and c["ring"]["count"] == 0:
            return c
        if time.monotonic() > deadline:
            raise DpdkProcError(f"card did not drain {n_frames} frames within {timeout:g}s: rx={rx} "
                                f"accounted={done} counters={json.dumps(c)}")
        time.sleep(0.05)
