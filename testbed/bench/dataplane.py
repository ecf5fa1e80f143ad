"""Benchmark of the card (``embnic bench dataplane``), and the DPDK process runners it uses.

**Benchmark** (:func:`run`): a pcap of embnic request frames with a realistic size mix, built
with the client library's codec (lookups of 1..179 keys, 2-fragment fp32 updates), is fed
through the card by the ``net_pcap`` vdev's in-memory replay (``infinite_rx=1``) into a
``net_null`` port, and, in the same run, on the same vdevs and the same EAL lcore list,
through ``dpdk-testpmd`` in ``io`` and ``macswap`` forwarding modes. Then the same on
``net_af_packet`` over a veth pair in a network namespace (the testbed's path), the frames
coming from a second testpmd that replays the pcap into the other end of the veth pair::

    netns enB<pid>:  [testpmd io: net_pcap(infinite) -> net_af_packet(iface=eBa<pid>)]
                          ==veth==  [DUT: net_af_packet(iface=eBb<pid>) -> net_null]

Rates are taken from the DUT's own TX counters (card: control socket ``counters``; testpmd:
``show port stats all``) at two instants ``seconds`` apart, after a warm-up. ``mpps`` = frames
sent per µs; ``gbps`` = Ethernet bytes (no preamble/FCS) × 8 / s; ``msgs_per_s`` = mpps ×
messages/frames of the pcap. Ratios = card / testpmd; the targets are ``ratio_io >= 0.5`` and
``ratio_macswap >= 0.8``. Results are merged into ``DIR/bench.json`` under ``dataplane``.
Needs root (EAL, netns).

Like with like: the card and testpmd get the same vdevs, pcap, EAL lcore list, mbuf count
(``BENCH_MBUFS``), per-lcore mbuf cache (``BENCH_MBCACHE``, the card's fixed size; testpmd's
``--mbcache``), burst (``--burst``), warm-up and duration, both busy-polling. Every run also
records ``others_cpu`` (CPU used meanwhile by the rest of the box; a shared VM is noisy) and
``xcore_rtt_ns``, the cache-line round trip between CPUs 0 and 1 just before it
(``dataplane/build/xcore-rtt``): the card's RX/TX pipeline (``-l 0,1``) passes each frame's
cache lines between the two lcores and its rate follows that figure, which on a VM changes with
where the host places the vCPUs (testpmd's single forwarding lcore does not care).

**Runners**: :class:`CardProcess` starts ``embnic-dp`` on the vdevs you give, waits until its control socket
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

from embnic.control.errors import OperationalError, require_program
from embnic.control.runstate import require_root
from embnic.testbed.bench.prep import merge_json

REPO = Path(__file__).resolve().parents[2]
DATAPLANE = REPO / "dataplane"
CARD_BINARY = DATAPLANE / "build" / "embnic-dp"
EAL_BASE = ("--no-huge", "--no-pci", "-m", "256")

_seq = itertools.count()


class DpdkProcError(OperationalError):
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
        eal_args: more EAL arguments (before ``--``), e.g. ``["--mbuf-pool-ops-name", "ring_mp_mc"]``.
    """

    def __init__(self, binary: str | os.PathLike, vdevs: Sequence[str], *, lcores: str = "0",
                 port_ips: dict[int, str] | None = None, args: Sequence[str] = (),
                 netns: str | None = None, log: str | os.PathLike | None = None,
                 ready_timeout: float = 30.0, eal_args: Sequence[str] = ()):
        self.binary = Path(binary)
        self.eal_args = list(eal_args)
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
        eal = [*EAL_BASE, "-l", self.lcores, "--file-prefix", self.prefix, *self.eal_args]
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


# ====================================================================== testpmd
class TestpmdProcess:
    """``dpdk-testpmd -i`` driven through its stdin; stats parsed from its output.

    Args:
        vdevs: ``--vdev`` specs in port order.
        lcores: EAL lcore list (testpmd forwards on all but the main lcore).
        mode: forwarding mode (``io``, ``macswap``, ...).
        netns: run inside this network namespace.
        log: output file.
    """

    __test__ = False

    def __init__(self, vdevs: Sequence[str], *, lcores: str = "0,1", mode: str = "io",
                 netns: str | None = None, log: str | os.PathLike | None = None,
                 binary: str = "dpdk-testpmd", mbufs: int = 16384, main_lcore: int | None = None,
                 mbcache: int = 256, burst: int = 32):
        self.vdevs, self.lcores, self.mode, self.netns = list(vdevs), lcores, mode, netns
        self.main_lcore = main_lcore
        self.prefix = file_prefix("t")
        self._dir = Path(tempfile.mkdtemp(prefix="enT"))
        self.log_path = Path(log) if log else self._dir / "testpmd.log"
        self.binary, self.mbufs, self.mbcache, self.burst = binary, mbufs, mbcache, burst
        self.proc: subprocess.Popen | None = None
        self._logf = None

    def argv(self) -> list[str]:
        pre = ["ip", "netns", "exec", self.netns] if self.netns else []
        eal = [*EAL_BASE, "-l", self.lcores, "--file-prefix", self.prefix]
        if self.main_lcore is not None:
            eal += ["--main-lcore", str(self.main_lcore)]
        for v in self.vdevs:
            eal += ["--vdev", v]
        nb_cores = max(1, len(_lcore_list(self.lcores)) - 1)
        # stdout is a file: stdbuf makes testpmd's printf line-buffered so stats show up at once
        return pre + ["stdbuf", "-oL", self.binary, *eal, "--", "-i", f"--forward-mode={self.mode}",
                      f"--total-num-mbufs={self.mbufs}", f"--mbcache={self.mbcache}", f"--burst={self.burst}",
                      f"--nb-cores={nb_cores}"]

    def start(self, timeout: float = 30.0) -> "TestpmdProcess":
        """Start, wait for the prompt, ``start`` forwarding.

        Raises:
            DpdkProcError: it exited or never showed its prompt (names its log).
        """
        require_program(self.binary, "apt-get install dpdk (or `make deps`)")
        self._logf = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.PIPE, stdout=self._logf,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_for(lambda t: "testpmd>" in t, timeout, "its prompt")
        self.send("start")
        self._wait_for(lambda t: "io packet forwarding" in t or "packet forwarding - ports=" in t, timeout,
                       "forwarding to start")
        return self

    def _text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _wait_for(self, pred, timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        while True:
            t = self._text()
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
        before = self._text().count(marker)
        self.send(f"show port stats {port}")
        t = self._wait_for(lambda t: t.count(marker) > before and
                           "Tx-pps" in t[t.rindex(marker):], timeout, "port stats")
        block = t[t.rindex(marker):]
        return int(block.split("TX-packets:")[1].split()[0])

    def stop(self, timeout: float = 15.0) -> int | None:
        """``quit``, then SIGTERM/SIGKILL if it lingers; returns the exit code."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.send("stop")
                self.send("quit")
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
        if self._logf is not None:
            self._logf.close()
        remove_runtime_dir(self.prefix)
        return self.proc.returncode if self.proc is not None else None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


def _lcore_list(spec: str) -> list[int]:
    """Lcore ids of an EAL ``-l`` list (``0,1`` or ``0-2``)."""
    out = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-")
            out += range(int(a), int(b) + 1)
        else:
            out.append(int(part))
    return out


# ====================================================================== the benchmark pcap
BENCH_CARD_IP = "10.99.0.1"
BENCH_CLIENTS = ({"client": 1, "ip": "10.99.0.2", "mac": "02:00:00:99:00:02", "udp_port": 40001},
                 {"client": 2, "ip": "10.99.0.3", "mac": "02:00:00:99:00:03", "udp_port": 40002})
BENCH_SHARDS = tuple({"shard": i, "ip": f"10.99.1.{10 + i}", "mac": f"02:00:00:99:01:{10 + i:02x}",
                      "udp_port": 7878} for i in range(4))


def make_bench_pcap(path: Path, n_frames: int = 2048, seed: int = 0) -> dict:
    """Write a pcap of embnic request frames with a realistic size mix; returns its stats.

    Mix (by message): 75% LOOKUP_REQ with ``1 + Geometric(1/32)`` keys capped at 179 (one
    frame, 48..1472 B of UDP payload), 25% UPDATE_REQ of 30 fp32 rows of dim 16 (2160 B body:
    2 fragments, 1432 + 728 B). Clients 1-2 → shards 0-3, unique msg ids. Frames are built by
    :func:`embnic.client_lib.codec.encode_lookup`/``encode_update``; Ethernet/IPv4/UDP with
    correct checksums.

    Returns:
        ``{frames, messages, bytes, avg_frame_bytes}`` (bytes = Ethernet bytes of all frames).
    """
    import numpy as np
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    from embnic.client_lib import codec
    from embnic.client_lib.consts import DType

    rng = np.random.default_rng(seed)
    frames: list[bytes] = []
    msgs = 0
    msg_id = 1
    while len(frames) < n_frames:
        c = BENCH_CLIENTS[msgs % len(BENCH_CLIENTS)]
        shard = int(rng.integers(0, len(BENCH_SHARDS)))
        if rng.random() < 0.75:
            n = int(min(179, 1 + rng.geometric(1 / 32)))
            keys = rng.integers(0, 1 << 40, n, dtype=np.uint64)
            payloads = codec.encode_lookup(msg_id=msg_id, client_id=c["client"], table_id=shard, shard_id=shard,
                                           dim=16, dtype=DType.FP32, keys=keys)
        else:
            keys = rng.integers(0, 1 << 40, 30, dtype=np.uint64)
            grads = rng.standard_normal((30, 16)).astype(np.float32)
            payloads = codec.encode_update(msg_id=msg_id, client_id=c["client"], table_id=shard, shard_id=shard,
                                           dtype=DType.FP32, keys=keys, grads=grads)
        for pl in payloads:
            frames.append(bytes(Ether(src=c["mac"], dst="02:00:00:99:00:01")
                                / IP(src=c["ip"], dst=BENCH_CARD_IP, flags="DF")
                                / UDP(sport=c["udp_port"], dport=7878) / Raw(pl)))
        msgs += 1
        msg_id += 1
    _write_pcap(path, frames)
    total = sum(len(f) for f in frames)
    return {"frames": len(frames), "messages": msgs, "bytes": total, "avg_frame_bytes": total / len(frames)}


def _write_pcap(path: Path, frames: list[bytes]) -> None:
    import struct

    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for i, d in enumerate(frames):
            f.write(struct.pack("<IIII", 1, i, len(d), len(d)) + d)


# ====================================================================== measurements
def _program_card(card: CardProcess, out_port: int, in_port: int = 0) -> None:
    for sh in BENCH_SHARDS:
        card.call("route_add", port=out_port, **sh)
    for cl in BENCH_CLIENTS:
        card.call("client_add", port=in_port, **cl)


#: Both DUTs get the same pool and burst: mbufs, per-lcore mbuf cache (the card's is fixed at
#: 256, MBUF_CACHE_SIZE in dataplane/main.c; testpmd's default would be 250), RX/TX burst.
BENCH_MBUFS, BENCH_MBCACHE, BENCH_BURST = 16384, 256, 32
XCORE_RTT = DATAPLANE / "build" / "xcore-rtt"


def xcore_rtt_ns(cpus: tuple[int, int] = (0, 1)) -> float | None:
    """Cache-line round trip between two CPUs (ns), by ``dataplane/build/xcore-rtt``; None if absent.

    The RX/TX pipeline passes every frame's cache lines between two lcores, so its rate depends
    on this; on a VM it changes with where the host runs the vCPUs (50..550 ns seen on the
    development VM), so the benchmark records it next to every run.
    """
    if not XCORE_RTT.is_file():
        return None
    r = subprocess.run([str(XCORE_RTT), str(cpus[0]), str(cpus[1]), "100000"], capture_output=True, text=True)
    try:
        return float(r.stdout.split()[1]) if r.returncode == 0 else None
    except (IndexError, ValueError):
        return None


def _cpu_seconds(pids: Sequence[int]) -> tuple[float, float]:
    """(busy CPU seconds of the whole box including steal, CPU seconds of ``pids``) so far."""
    hz = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = (sum(v[:8]) - v[3] - v[4]) / hz      # all but idle and iowait
    ours = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ours += (int(fields[11]) + int(fields[12])) / hz
        except (OSError, IndexError, ValueError):
            pass
    return busy, ours


def _window(sample, seconds: float, warmup: float, pids: Sequence[int]) -> dict:
    """Rate of a monotone TX counter over ``seconds`` after ``warmup``, and the CPU the rest of the
    box used meanwhile (``others_cpu``: CPUs' worth, e.g. 0.3 = 30 % of one CPU; the measured
    process, its generator and this process excluded)."""
    pids = [os.getpid(), *pids]
    time.sleep(warmup)
    c0 = _cpu_seconds(pids)
    t0, n0 = time.monotonic(), sample()
    time.sleep(seconds)
    t1, n1 = time.monotonic(), sample()
    c1 = _cpu_seconds(pids)
    dt = t1 - t0
    return {"rate": (n1 - n0) / dt, "frames": n1 - n0, "dt": dt,
            "others_cpu": max(0.0, ((c1[0] - c0[0]) - (c1[1] - c0[1])) / dt)}


def _rate(sample, seconds: float, warmup: float) -> tuple[float, int]:
    """(frames per second, frames) of a monotone TX counter between two samples."""
    w = _window(sample, seconds, warmup, ())
    return w["rate"], w["frames"]


def measure_card(binary: Path, vdevs: list[str], lcores: str, seconds: float, warmup: float,
                 netns: str | None = None, out_port: int = 1, log_dir: Path | None = None,
                 other_pids: Sequence[int] = ()) -> dict:
    """Card rates from its own counters: ``{mpps, gbps, drops, frames, others_cpu, mempool_ops}``."""
    card = CardProcess(binary, vdevs, lcores=lcores, port_ips={0: BENCH_CARD_IP}, netns=netns,
                       args=["--paused", "--mbufs", str(BENCH_MBUFS), "--burst", str(BENCH_BURST)],
                       log=(log_dir / f"card-{file_prefix('l')}.log") if log_dir else None)
    card.start()
    try:
        _program_card(card, out_port)
        ops = card.call("info").get("mempool_ops")
        card.call("resume")
        last: dict = {}

        def sample() -> int:
            last["c"] = card.counters()
            last.setdefault("b0", last["c"]["ports"][out_port]["tx_bytes"])
            return last["c"]["ports"][out_port]["tx_frames"]

        w = _window(sample, seconds, warmup, [card.proc.pid, *other_pids])
        b1 = last["c"]["ports"][out_port]["tx_bytes"]
        drops = {k: v for k, v in last["c"]["drops"].items() if v}
        state = last["c"]["state"]
    finally:
        card.stop()
        card.cleanup()
    return {"mpps": w["rate"] / 1e6, "gbps": (b1 - last["b0"]) * 8 / w["dt"] / 1e9, "frames": w["frames"],
            "drops": drops, "state_entries": state["entries"], "others_cpu": w["others_cpu"],
            "mempool_ops": ops}


def measure_testpmd(vdevs: list[str], lcores: str, mode: str, seconds: float, warmup: float,
                    netns: str | None = None, out_port: int = 1, main_lcore: int | None = None,
                    other_pids: Sequence[int] = ()) -> dict:
    """testpmd rate from its port stats: ``{mpps, frames, others_cpu}``."""
    tp = TestpmdProcess(vdevs, lcores=lcores, mode=mode, netns=netns, main_lcore=main_lcore,
                        mbufs=BENCH_MBUFS, mbcache=BENCH_MBCACHE, burst=BENCH_BURST)
    tp.start()
    try:
        w = _window(lambda: tp.tx_packets(out_port), seconds, warmup, [tp.proc.pid, *other_pids])
    finally:
        tp.cleanup()
    return {"mpps": w["rate"] / 1e6, "frames": w["frames"], "others_cpu": w["others_cpu"]}


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _measure_all(binary: Path, vdevs: list[str], lcores: str, seconds: float, warmup: float,
                 repeats: int, netns: str | None, log_dir: Path, one_lcore: str | None = "0",
                 testpmd_lcores: str | None = None, testpmd_main: int | None = None,
                 other_pids: Sequence[int] = (), rtt: bool = True) -> dict:
    """The card (EAL ``-l lcores``, and ``-l one_lcore``), testpmd io and macswap (``-l
    testpmd_lcores`` or ``lcores``, main lcore ``testpmd_main``), interleaved ``repeats``
    times; medians (load from other processes hits all of them alike). Every run also records
    the CPU the rest of the box used (``others_cpu``) and, if ``rtt``, the cache-line round trip
    between CPUs 0 and 1 just before it (``xcore_rtt_ns``; None otherwise: meaningless while a
    generator keeps one of the CPUs busy)."""
    runs: dict[str, list[dict]] = {"card": [], "card_1lcore": [], "io": [], "macswap": []}

    def run(key: str, fn, *a, **k) -> None:
        before = xcore_rtt_ns() if rtt else None
        r = fn(*a, **k)
        r["xcore_rtt_ns"] = before
        runs[key].append(r)

    for _ in range(repeats):
        run("card", measure_card, binary, vdevs, lcores, seconds, warmup, netns=netns, log_dir=log_dir,
            other_pids=other_pids)
        if one_lcore is not None and one_lcore != lcores:
            run("card_1lcore", measure_card, binary, vdevs, one_lcore, seconds, warmup, netns=netns,
                log_dir=log_dir, other_pids=other_pids)
        for mode in ("io", "macswap"):
            run(mode, measure_testpmd, vdevs, testpmd_lcores or lcores, mode, seconds, warmup, netns=netns,
                main_lcore=testpmd_main, other_pids=other_pids)
    med = {k: {"mpps": _median([r["mpps"] for r in v]), "all_mpps": [round(r["mpps"], 3) for r in v],
               "others_cpu": [round(r["others_cpu"], 3) for r in v],
               "xcore_rtt_ns": [r["xcore_rtt_ns"] for r in v]}
           for k, v in runs.items() if v}
    med["card"]["gbps"] = _median([r["gbps"] for r in runs["card"]])
    med["card"]["drops"] = runs["card"][-1]["drops"]
    med["card"]["mempool_ops"] = runs["card"][-1]["mempool_ops"]
    if runs["card_1lcore"]:
        med["card_1lcore"]["mempool_ops"] = runs["card_1lcore"][-1]["mempool_ops"]
    return med


def _figures(m: dict, pcap: dict) -> dict:
    per_msg = pcap["messages"] / pcap["frames"]
    card, io, mac = m["card"], m["io"], m["macswap"]
    out = {
        "card_mpps": card["mpps"],
        "card_msgs_per_s": card["mpps"] * 1e6 * per_msg,
        "card_gbps": card["gbps"],
        "testpmd_io_mpps": io["mpps"],
        "testpmd_macswap_mpps": mac["mpps"],
        "ratio_io": card["mpps"] / io["mpps"] if io["mpps"] else 0.0,
        "ratio_macswap": card["mpps"] / mac["mpps"] if mac["mpps"] else 0.0,
        "runs_mpps": {k: v["all_mpps"] for k, v in m.items()},
        "runs_others_cpu": {k: v["others_cpu"] for k, v in m.items()},
        "runs_xcore_rtt_ns": {k: v["xcore_rtt_ns"] for k, v in m.items()},
        "card_drops_last_run": card["drops"],
        "card_mempool_ops": card["mempool_ops"],
    }
    if "card_1lcore" in m:
        one = m["card_1lcore"]["mpps"]
        out.update({"card_1lcore_mpps": one,
                    "ratio_io_1lcore": one / io["mpps"] if io["mpps"] else 0.0,
                    "ratio_macswap_1lcore": one / mac["mpps"] if mac["mpps"] else 0.0})
    return out


class _Netns:
    """A network namespace with one veth pair, both ends in it; deleted on exit."""

    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.name = f"enB{tag}"
        self.a, self.b = f"eBa{tag}", f"eBb{tag}"

    def _ip(self, *args: str, check: bool = True) -> None:
        r = subprocess.run(["ip", *args], capture_output=True, text=True)
        if check and r.returncode != 0:
            raise DpdkProcError(f"`ip {' '.join(args)}` failed: {r.stderr.strip()}")

    def __enter__(self) -> "_Netns":
        self._ip("netns", "add", self.name)
        try:
            ns = ["-n", self.name]
            self._ip(*ns, "link", "add", self.a, "type", "veth", "peer", "name", self.b)
            subprocess.run(["ip", "netns", "exec", self.name, "sysctl", "-qw",
                            "net.ipv6.conf.all.disable_ipv6=1"], capture_output=True)
            for dev in (self.a, self.b):
                self._ip(*ns, "link", "set", dev, "up")
                subprocess.run(["ip", "netns", "exec", self.name, "ethtool", "-K", dev, "tx", "off", "rx",
                                "off"], capture_output=True)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._ip("netns", "del", self.name, check=False)


def run(out_dir: Path, seconds: float = 5.0, **kw: Any) -> dict:
    """Run the dataplane benchmark and merge it into ``out_dir/bench.json`` under ``dataplane``.

    Args:
        out_dir: where bench.json is read, updated and written (also the pcap and logs).
        seconds: measurement time per configuration (s), after ``warmup`` (default 1 s).
        lcores: EAL lcore list used for the card and testpmd alike (default ``"0,1"``); the card
            is also measured on one lcore (``card_1lcore_mpps``, run to completion).
        repeats: interleaved repetitions of every configuration; medians are reported (3).
        frames: frames in the replayed pcap (default 2048).
        af_packet: also measure on net_af_packet over a veth pair (default True).
        binary: the embnic-dp binary (default: build dataplane/).
    Returns:
        the ``dataplane`` dict: ``card_mpps, card_msgs_per_s, card_gbps, testpmd_io_mpps,
        testpmd_macswap_mpps, ratio_io, ratio_macswap`` (net_pcap → net_null; medians),
        ``card_1lcore_mpps, ratio_io_1lcore, ratio_macswap_1lcore``, ``runs_mpps``,
        ``runs_others_cpu``, ``runs_xcore_rtt_ns`` (every run, by configuration),
        ``card_mempool_ops``, ``af_packet`` with the same figures, and the setup (``lcores``,
        ``pcap``, ``seconds``, ``repeats``, ``warmup``, ``mbufs``, ``mbuf_cache``, ``burst``).
    Raises:
        NeedsRootError: not root. MissingDependencyError: dpdk-testpmd is not installed.
        DpdkProcError: a process failed (names its log).
    """
    require_root("the dataplane benchmark", why="it runs DPDK (EAL) and network namespaces",
                 example="sudo embnic bench dataplane")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lcores = kw.get("lcores", "0,1")
    warmup = float(kw.get("warmup", 1.0))
    repeats = int(kw.get("repeats", 3))
    logs = out_dir / "bench_dataplane_logs"
    logs.mkdir(exist_ok=True)
    binary = Path(kw["binary"]) if kw.get("binary") else build_card()
    pcap_path = out_dir / "bench_dataplane.pcap"
    pcap = make_bench_pcap(pcap_path, int(kw.get("frames", 2048)))
    src = f"net_pcap0,rx_pcap={pcap_path},infinite_rx=1"
    sink = "net_null0,no-rx=1"

    res: dict[str, Any] = {}
    res.update(_figures(_measure_all(binary, [src, sink], lcores, seconds, warmup, repeats, None, logs), pcap))

    if kw.get("af_packet", True):
        # 2 vCPUs here: the generator forwards on CPU 1, each DUT on CPU 0 (the card run to
        # completion on lcore 0; testpmd forwarding on lcore 0 with its idle main lcore on 1)
        with _Netns() as ns:
            gen = TestpmdProcess([src, f"net_af_packet0,iface={ns.a}"], lcores="0,1", main_lcore=0, mode="io",
                                 netns=ns.name)
            gen.start()
            try:
                dut = [f"net_af_packet0,iface={ns.b}", sink]
                res["af_packet"] = _figures(_measure_all(binary, dut, "0", seconds, warmup, repeats, ns.name, logs,
                                                         one_lcore=None, testpmd_lcores="0,1", testpmd_main=1,
                                                         other_pids=[gen.proc.pid], rtt=False),
                                            pcap)
                res["af_packet"]["setup"] = ("generator dpdk-testpmd io (net_pcap infinite_rx -> net_af_packet, "
                                             "forwarding on CPU 1) -> veth -> DUT on CPU 0 -> net_null; card "
                                             "-l 0 (run to completion), testpmd -l 0,1 --main-lcore 1")
            finally:
                gen.cleanup()

    res.update({"lcores": lcores, "seconds": seconds, "repeats": repeats, "warmup": warmup, "pcap": pcap,
                "mbufs": BENCH_MBUFS, "mbuf_cache": BENCH_MBCACHE, "burst": BENCH_BURST,
                "setup": "net_pcap infinite_rx -> net_null; af_packet: testpmd replay -> veth -> DUT -> net_null; "
                         f"card and testpmd alike: {BENCH_MBUFS} mbufs, per-lcore cache {BENCH_MBCACHE}, "
                         f"burst {BENCH_BURST}, busy polling (no --idle-us)"})
    merge_json(out_dir / "bench.json", "dataplane", res)
    return res




if __name__ == "__main__":
    import sys

    print(json.dumps(run(Path(sys.argv[1] if len(sys.argv) > 1 else "out/bench"),
                         float(sys.argv[2]) if len(sys.argv) > 2 else 5.0), indent=2))
