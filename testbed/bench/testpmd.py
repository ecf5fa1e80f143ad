"""``dpdk-testpmd`` as the benchmark's reference forwarder and traffic generator: a
:class:`~embnic.control.targets.dpdk.process.DpdkProcess` driven through its interactive prompt.
"""
from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Sequence

from embnic.client_lib.config import parse_lcores
from embnic.control.targets.dpdk.process import DpdkProcError, DpdkProcess, eal_argv, unique_prefix
from embnic.control.errors import require_program

BINARY = "dpdk-testpmd"


class TestpmdProcess:
    """``dpdk-testpmd -i`` driven through its stdin; stats parsed from its output.

    Args:
        vdevs: ``--vdev`` specs in port order.
        lcores: EAL lcore list (testpmd forwards on all but the main lcore), or a map of lcores to
            CPUs (``"0@0,1@1,2@1"``, EAL ``--lcores``).
        queues: RX and TX queues per port (``--rxq``/``--txq``): forwarding lcores share the
            streams of (port, queue), so N of them need N queues on the source port.
        mode: forwarding mode (``io``, ``macswap``, ...).
        netns: run inside this network namespace.
    """

    __test__ = False

    def __init__(self, vdevs: Sequence[str], *, lcores: str = "0,1", mode: str = "io", netns: str | None = None,
                 mbufs: int = 16384, main_lcore: int | None = None, mbcache: int = 256, burst: int = 32,
                 queues: int = 1):
        self._dir = Path(tempfile.mkdtemp(prefix="enT"))
        self.log_path = self._dir / "testpmd.log"
        extra = ["--main-lcore", str(main_lcore)] if main_lcore is not None else []
        nb_cores = max(1, len(parse_lcores(re.sub(r"@\d+", "", lcores))) - 1)  # a --lcores map's lcores
        # stdout is a file: stdbuf makes testpmd's printf line-buffered so stats show up at once
        self.process = DpdkProcess(BINARY, eal_argv(lcores, unique_prefix("t"), list(vdevs), extra=extra),
                                   ["-i", f"--forward-mode={mode}", f"--total-num-mbufs={mbufs}",
                                    f"--mbcache={mbcache}", f"--burst={burst}", f"--nb-cores={nb_cores}",
                                    *([f"--rxq={queues}", f"--txq={queues}"] if queues > 1 else [])],
                                   netns=netns, log=self.log_path, wrapper=["stdbuf", "-oL"], stdin=subprocess.PIPE)

    @property
    def proc(self) -> subprocess.Popen | None:
        return self.process.proc

    def start(self, timeout: float = 30.0) -> "TestpmdProcess":
        """Start, wait for the prompt, ``start`` forwarding.

        Raises:
            MissingDependencyError: dpdk-testpmd is not installed.
            DpdkProcError: it exited or never showed its prompt (names its log).
        """
        require_program(BINARY, "apt-get install dpdk (or `make deps`)")
        self.process.start()
        self._wait_for(lambda t: "testpmd>" in t, timeout, "its prompt")
        self.send("start")
        self._wait_for(lambda t: "io packet forwarding" in t or "packet forwarding - ports=" in t, timeout,
                       "forwarding to start")
        return self

    def _wait_for(self, pred, timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        while True:
            t = self.process.log()
            if pred(t):
                return t
            if self.proc.poll() is not None:
                raise DpdkProcError(f"dpdk-testpmd exited ({self.proc.returncode}) waiting for {what}; "
                                    f"log {self.log_path}:\n{t[-1500:]}")
            if time.monotonic() > deadline:
                raise DpdkProcError(f"dpdk-testpmd: no {what} within {timeout:g}s; log {self.log_path}")
            time.sleep(0.02)

    def send(self, line: str) -> None:
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def tx_packets(self, port: int, timeout: float = 10.0) -> int:
        """TX-packets of ``port`` now (``show port stats <port>``)."""
        marker = f"NIC statistics for port {port} "
        before = self.process.log().count(marker)
        self.send(f"show port stats {port}")
        t = self._wait_for(lambda t: t.count(marker) > before and
                           "Tx-pps" in t[t.rindex(marker):], timeout, "port stats")
        block = t[t.rindex(marker):]
        return int(block.split("TX-packets:")[1].split()[0])

    def stop(self, timeout: float = 15.0) -> int | None:
        """``quit``, then SIGTERM/SIGKILL if it lingers (:meth:`DpdkProcess.stop`); returns the exit code."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.send("stop")
                self.send("quit")
                self.proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        return self.process.stop(5.0)["exit"]

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

