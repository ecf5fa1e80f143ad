"""What the shard benchmarks share (``embnic bench server`` and its disk-tier run): a shard as its
own process, pre-encoded requests, the load generator that keeps a window of them in flight
(batched socket I/O with ``UDP_GRO``: docs/bench.md), and the CPU and memory of processes read
from ``/proc``."""
from __future__ import annotations

import contextlib
import os
import re
import select
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.consts import MsgType
from embnic.client_lib.sockets import set_socket_buffers
from embnic.control.errors import OperationalError
from embnic.testbed.server import udpio

UDP_GRO = 104  #: linux/udp.h


# ---- CPU and memory of processes ------------------------------------------------------------

def proc_cpu(pid: int) -> float:
    """CPU seconds of every thread of ``pid`` (``/proc/PID/task/*/schedstat``: ns, not ticks);
    0 if it is gone."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for t in tids:
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread gone meanwhile
            total += int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
    return total / 1e9


def machine_idle() -> tuple[float, float]:
    """(idle jiffies, total jiffies) of the whole machine since boot."""
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return float(v[3] + v[4]), float(sum(v[:8]))


def proc_mem(pid: int) -> dict:
    """``{"rss_anon", "rss_file"}`` of process ``pid`` in bytes (``/proc/PID/status``)."""
    out = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("RssAnon", "RssFile"):
            out["rss_anon" if k == "RssAnon" else "rss_file"] = int(v.split()[0]) * 1024
    return out


# ---- a shard process --------------------------------------------------------------------------

class ShardProcess:
    """A shard (``python -m embnic.testbed.server``) of the config ``toml`` on a free loopback
    port, as its own process: config ``workdir/bench-<name>.toml``, log ``workdir/server-<name>.log``.

    Args:
        shard: its shard id in the config.
        args: more command-line arguments of the shard (``--checkpoint-dir``, ...).
        metrics: also serve its metrics on a free loopback port (:meth:`metrics`).
        stop_wait: seconds :meth:`stop` waits for it to exit after SIGTERM before it kills it.
    """

    def __init__(self, workdir: Path, name: str, toml: str, args: list[str] = (), *, shard: int = 0,
                 metrics: bool = False, stop_wait: float = 30.0):
        self.name = name
        self.cfg_path = Path(workdir) / f"bench-{name}.toml"
        self.cfg_path.write_text(toml)
        self.log_path = Path(workdir) / f"server-{name}.log"
        self.argv = [sys.executable, "-m", "embnic.testbed.server", "--shard", str(shard), "--config", str(self.cfg_path),
                     "--port", "0", *args, "--log-level", "info"]
        if metrics:
            self.argv[-2:-2] = ["--metrics-port", "0", "--metrics-bind", "127.0.0.1"]
        self.stop_wait = stop_wait
        self.proc: subprocess.Popen | None = None
        self.port = self.metrics_port = 0

    def start(self, timeout: float = 60.0) -> "ShardProcess":
        """Start it and wait for its ``listening on`` line (and ``metrics on``, when it serves them).

        Raises:
            OperationalError: it exited or did not listen within ``timeout`` s (names its log).
        """
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, stderr=log, stdout=subprocess.DEVNULL)
        log.close()
        want_metrics = "--metrics-port" in self.argv
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            text = self.log_path.read_text()
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", text)
            mm = re.search(r"metrics on http://[\d.]+:(\d+)", text) if want_metrics else None
            if m and (mm or not want_metrics):
                self.port = int(m.group(1))
                self.metrics_port = int(mm.group(1)) if mm else 0
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise OperationalError(f"bench shard ({self.name}) did not start: see {self.log_path}")

    def metrics(self, prefixes: tuple[str, ...]) -> dict[str, float]:
        """The samples of its metrics whose names start with one of ``prefixes``: ``{name: value}``
        (labels dropped: the last sample of a name wins)."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30).read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith(prefixes):
                name, _, v = line.rpartition(" ")
                out[name.split("{")[0]] = float(v)
        return out

    def cpu(self) -> float:
        """CPU seconds of its process so far (0 when stopped)."""
        return proc_cpu(self.proc.pid) if self.proc else 0.0

    def mem(self) -> dict:
        """:func:`proc_mem` of its process."""
        return proc_mem(self.proc.pid)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after :attr:`stop_wait` s. Idempotent."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(self.stop_wait)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


# ---- requests and the load generator -----------------------------------------------------------

class Requests:
    """Pre-encoded requests, one table per message (as before protocol v2): message ``i`` asks
    table ``tables[i]`` for ``keys[i]`` (uint64, sorted) — with gradients ``grads[i]`` (float32
    (n, dim)) for updates — and is rows ``starts[i] .. starts[i] + counts[i] - 1`` of ``frames``
    (uint8 (frames, 44 + P), ``lens`` bytes of each used), sent to shard ``shards[i]``. Its reply
    is ``reply_type`` in ``reply_frames`` frames (the largest message's).

    Args:
        op: ``"lookup"`` or ``"update"``.
        dim: the tables' dim (fp32).
        mtu: the cluster MTU (bytes).
        first_id: message id of message 0 (then consecutive).
        shards: int64 (messages,), each message's shard id (an index into :class:`LoadGen`'s
            ports); None: every message to shard 0.
    """

    def __init__(self, op: str, tables: list[int], keys: list[np.ndarray], grads: list[np.ndarray] | None,
                 dim: int, mtu: int, first_id: int, shards: np.ndarray | None = None):
        P = consts.max_body_per_frame(mtu)
        self.op, self.count, self.first_id = op, len(keys), first_id
        self.tables, self.keys, self.grads = tables, keys, grads
        self.shards = np.zeros(len(keys), np.int64) if shards is None else np.asarray(shards, np.int64)
        self.rows = int(sum(k.size for k in keys))
        flat = []  # each message's frames
        for i, (t, k) in enumerate(zip(tables, keys)):
            kw = dict(msg_id=first_id + i, client_id=1, shard_id=int(self.shards[i]), keys=k, mtu=mtu,
                      directory=codec.make_directory([t], [dim], [1], [k.size]))
            flat.append(codec.encode_lookup(**kw) if op == "lookup"
                        else codec.encode_update(**kw, values=grads[i].astype("<f4").tobytes()))
        self.counts = np.array([len(f) for f in flat], np.int64)
        self.starts = np.r_[0, np.cumsum(self.counts)[:-1]].astype(np.int64)
        frames = [f for fr in flat for f in fr]
        self.lens = np.array([len(f) for f in frames], np.int64)
        self.frames = np.zeros((len(frames), consts.HDR_LEN + P), np.uint8)
        self.frames[np.arange(self.frames.shape[1]) < self.lens[:, None]] = np.frombuffer(b"".join(frames), np.uint8)
        self.reply_type = MsgType.LOOKUP_REPLY if op == "lookup" else MsgType.UPDATE_ACK
        most = max((k.size for k in keys), default=0)
        self.reply_frames = (-(-(most * dim * 4) // P)) if op == "lookup" else 1


class LoadGen:
    """A client socket on loopback that keeps ``window`` messages of :class:`Requests` in flight
    to the shards at ``ports`` (shard id ``s`` at ``ports[s]``; one int: shard 0's)."""

    def __init__(self, ports: int | list[int]):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        set_socket_buffers(self.sock)
        self.sock.bind(("127.0.0.1", 0))
        # UDP_GRO: a reply the shard sent as one GSO super-datagram arrives whole (the kernel
        # does not cut it into datagrams for this socket); each frame keeps its own header
        with contextlib.suppress(OSError):  # a kernel without it: the datagrams one by one
            self.sock.setsockopt(udpio.SOL_UDP, UDP_GRO, 1)
        self.bs = udpio.BatchSocket(self.sock, batch=64, slot=65536)
        ports = [ports] if isinstance(ports, int) else list(ports)
        self.names = np.stack([np.frombuffer(udpio.tuple_to_sockaddr(("127.0.0.1", p)), np.uint8) for p in ports])

    def close(self) -> None:
        self.sock.close()

    def run(self, w: Requests, window: int, timeout_s: float = 120.0) -> tuple[float, np.ndarray]:
        """Send every message of ``w`` with at most ``window`` in flight; returns (seconds from
        the first send to the last reply, per-message latency in µs).

        Raises:
            OperationalError: a reply of the wrong type (an ERROR), or no progress for ``timeout_s``.
        """
        n = w.count
        got = np.zeros(n, np.int64)
        t_sent = np.zeros(n)
        t_done = np.zeros(n)
        names = self.names[w.shards]  # (n, 16): each message's shard
        done = 0
        t0 = time.perf_counter()
        last = t0

        def send(a: int, b: int) -> None:
            t_sent[a:b] = time.perf_counter()
            self.bs.send(w.frames, w.starts[a:b], w.counts[a:b], w.lens, names[a:b])

        nxt = min(window, n)
        send(0, nxt)
        while done < n:
            m = self.bs.recv()
            if m == 0:
                if time.perf_counter() - last > timeout_s:
                    raise OperationalError(f"bench: no reply for {timeout_s} s ({done}/{n} messages answered)")
                select.select([self.sock], [], [], 0.05)
                continue
            last = time.perf_counter()
            # a few datagrams: their headers one by one (cheaper than a dozen vector calls)
            fin = (_few_replies if m <= 8 else _many_replies)(self.bs.rx, self.bs.lens, m, w, got, t_done)
            if fin.size:
                t_done[fin] = last
                done += int(fin.size)
                room = min(n - nxt, window - (nxt - done))
                if room > 0:
                    send(nxt, nxt + room)
                    nxt += room
        return float(t_done.max() - t0), (t_done - t_sent) * 1e6


def _wrong_reply(msg_type: int, status: int, msg_id: int) -> OperationalError:
    return OperationalError(f"bench: the shard answered {MsgType(msg_type).name} status {status} to message {msg_id}")


def _many_replies(rx: np.ndarray, lens: np.ndarray, m: int, w: Requests, got: np.ndarray,
                  t_done: np.ndarray) -> np.ndarray:
    """The messages of ``w`` that the ``m`` datagrams received (rows of ``rx``, ``lens`` bytes)
    completed (indices into ``w``, each once, not done before); ``got`` counts each message's
    reply frames. A GRO'd datagram holds equal frames of one reply (the last shorter).

    Raises:
        OperationalError: a reply of another type than ``w.reply_type``.
    """
    h = np.ascontiguousarray(rx[:m, :consts.HDR_LEN]).view(codec.HEADER_DTYPE).reshape(m)
    if (h["msg_type"] != w.reply_type).any():
        bad = h[h["msg_type"] != w.reply_type][0]
        raise _wrong_reply(int(bad["msg_type"]), int(bad["status"]), int(bad["msg_id"]))
    ids = h["msg_id"].astype(np.int64) - w.first_id
    seg = consts.HDR_LEN + h["frag_len"].astype(np.int64)
    np.add.at(got, ids, -(-lens[:m] // np.maximum(seg, 1)))
    fin = np.unique(ids[got[ids] >= w.reply_frames])
    return fin[t_done[fin] == 0]


def _few_replies(rx: np.ndarray, lens: np.ndarray, m: int, w: Requests, got: np.ndarray,
                 t_done: np.ndarray) -> np.ndarray:
    """As :func:`_many_replies`, datagram by datagram."""
    fin = []
    for i in range(m):
        h = codec.unpack_header(rx[i])
        if h.msg_type != w.reply_type:
            raise _wrong_reply(h.msg_type, h.status, h.msg_id)
        j = h.msg_id - w.first_id
        got[j] += -(-int(lens[i]) // max(consts.HDR_LEN + h.frag_len, 1))
        if got[j] >= w.reply_frames and t_done[j] == 0 and j not in fin:
            fin.append(j)
    return np.array(fin, np.int64)
