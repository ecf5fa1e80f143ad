"""Benchmark of one parameter-server shard on loopback, without the card (``embnic bench server``).

For lookups and updates of 1, 64 and 4096 keys per message (MTU 1500, dim 8 fp32, row-wise
Adagrad: a 4096-key lookup is 23 request frames and a 92-frame reply) it measures, in one run:

* **the shard** — ``embnic server`` started as its own process (``--workers 1``, then
  ``--workers 2``; the readable ``--engine reference`` too, as the before), driven by a load
  generator in this process that keeps ``window`` messages in flight with batched socket I/O
  (:mod:`embnic.testbed.server.udpio`; its socket sets ``UDP_GRO``, so a reply the shard sent as
  one GSO super-datagram is not cut into datagrams again on loopback, where the sender pays for
  the receiver's side), so the generator costs little per frame. Rows/s and
  messages/s come from the windowed run; p50/p99 latency (request sent → whole reply in) from
  a run with one message in flight.
* **the in-process reference** — :class:`~embnic.client_lib.local.LocalBackend` doing the same
  work on the same keys and gradients (``lookup``/``update`` per message), between the shard
  runs so load from other processes hits both alike.

``ratio_<op>_<keys>`` = shard rows/s ÷ LocalBackend rows/s (``--workers 1``, wall clock; targets
≥ 0.3 for 1-key and ≥ 0.7 for 4096-key lookups);
``ratio_cpu_<op>_<keys>`` = rows per CPU second of the shard's processes ÷ rows per CPU second
of LocalBackend (what the shard would do on a core of its own: on a loaded machine the wall
clock measures the scheduler as much as the shard);
``ratio_workers2_<op>_<keys>`` = ``--workers 2`` ÷ ``--workers 1``;
``ratio_wal_update_<keys>`` = update rows/s of ``--workers 1`` with the write-ahead log
(``--checkpoint-dir`` in the run directory: records appended, one ``fdatasync`` per wake-up
before the acks) ÷ without it (``workers_1_wal`` vs ``workers_1``; target ≥ 0.7 at 4096 keys),
``ratio_wal_cpu_update_<keys>`` the same per CPU second of the shard. Both tables of the bench
config get half the messages, so both workers of ``--workers 2`` are the home of some of them
(messages are steered by ``(client_id + msg_id) % 2``; consecutive message ids alternate; the rows of both tables are split by
id range, so each home asks the other worker for about half the rows of every message). The keys come from a pool of 65536 ids per table whose rows
are materialised (updated once) in the shard and in the reference before timing.

``rounds`` (:mod:`.shard_rounds`): the shard's CPU for one round — a lookup and an update of the
same ids as one message — over 2 and over 26 tables; ``ratio_26_vs_2_<op>`` within 1.2 (the
work of a round does not grow with the number of tables).

Load is part of the figure on a shared machine: the result records the load average, the
share of the machine's CPU time that was idle during each shard run, and the CPU seconds of
the load generator (this process) and of the shard's processes.
"""
from __future__ import annotations

import os
import platform
import re
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.sockets import set_socket_buffers
from embnic.client_lib.config import parse_config
from embnic.client_lib.consts import MsgType
from embnic.client_lib.local import LocalBackend
from embnic.control.errors import OperationalError
from embnic.testbed.server import udpio

from . import shard_rounds
from .results import merge_json

KEYS = (1, 64, 4096)
OPS = ("lookup", "update")
DIM = 8
POOL = 65536
TARGET_LOOKUP_4096 = 0.7  #: 4096-key lookup rows/s of the shard ÷ LocalBackend's (issue "the round at the speed of the path")
TARGET_LOOKUP_1 = 0.3  #: 1-key lookups, likewise
TARGET_WORKERS2 = 1.5
TARGET_WAL = 0.7  #: update throughput with the write-ahead log ÷ without, at 4096 keys per message
UDP_GRO = 104  #: linux/udp.h

TABLES = [{"id": t, "dim": DIM, "dtype": "fp32", "optimizer": "adagrad", "lr": 0.01} for t in (0, 1)]


def bench_config(port: int = 0, mtu: int = 1500):
    """The bench cluster: tables 0 and 1 (dim 8 fp32, Adagrad, any uint64 id), one shard on
    127.0.0.1:``port``."""
    return parse_config({
        "cluster": {"name": "bench-server", "mtu": mtu, "seed": 11, "timeout_ms": 500, "retries": 10},
        "tables": TABLES,
        "shards": [{"id": 0, "ip": "127.0.0.1", "port": port or 17870}],
        "clients": [{"id": 1, "ip": "127.0.0.1"}],
    })


def _toml(cfg_port: int, mtu: int) -> str:
    lines = ["[cluster]", 'name = "bench-server"', f"mtu = {mtu}", "seed = 11"]
    for t in TABLES:
        lines += ["[[tables]]"] + [f"{k} = {v!r}".replace("'", '"') for k, v in t.items()]
    lines += ["[[shards]]", "id = 0", 'ip = "127.0.0.1"', f"port = {cfg_port}", "[[clients]]", "id = 1",
              'ip = "127.0.0.1"']
    return "\n".join(lines) + "\n"


# ---- CPU and load -------------------------------------------------------------------------------

def _proc_cpu(pid: int) -> float:
    """CPU seconds of every thread of ``pid`` (``/proc/PID/task/*/schedstat``: ns, not ticks);
    0 if it is gone."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for t in tids:
        try:
            total += int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


def _machine_idle() -> tuple[float, float]:
    """(idle jiffies, total jiffies) of the whole machine since boot."""
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return float(v[3] + v[4]), float(sum(v[:8]))


# ---- the shard process ----------------------------------------------------------------------

class ShardProcess:
    """A shard (``python -m embnic.testbed.server``) for the bench config on a free loopback port, as its own process."""

    def __init__(self, workdir: Path, engine: str = "batch", workers: int = 1, mtu: int = 1500, wal: bool = False):
        tag = f"{engine}-{workers}" + ("-wal" if wal else "")
        self.cfg_path = Path(workdir) / f"bench-{tag}.toml"
        self.cfg_path.write_text(_toml(17870, mtu))
        self.log_path = Path(workdir) / f"server-{tag}.log"
        self.argv = [sys.executable, "-m", "embnic.testbed.server", "--shard", "0", "--config", str(self.cfg_path),
                     "--port", "0", "--engine", engine, "--workers", str(workers), "--log-level", "info"]
        if wal:  # write-ahead log on (fdatasync per wake-up), no periodic checkpoint
            import shutil

            d = Path(workdir) / f"wal-{tag}"
            shutil.rmtree(d, ignore_errors=True)
            self.argv += ["--checkpoint-dir", str(d)]
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self, timeout: float = 60.0) -> "ShardProcess":
        """Start it and wait for its ``listening on`` line.

        Raises:
            OperationalError: it exited or did not listen within ``timeout`` s (names its log).
        """
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, stderr=log, stdout=subprocess.DEVNULL)
        log.close()
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", self.log_path.read_text())
            if m:
                self.port = int(m.group(1))
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise OperationalError(f"bench shard did not start: see {self.log_path}")

    def pids(self) -> list[int]:
        return [self.proc.pid] + _children(self.proc.pid) if self.proc else []

    def cpu(self) -> float:
        return sum(_proc_cpu(p) for p in self.pids())

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


# ---- the load generator ---------------------------------------------------------------------

class Workload:
    """Pre-encoded requests: message ``i`` is rows ``starts[i] .. starts[i]+counts[i]-1`` of
    ``frames`` (uint8 (rows, 44 + P)), of table ``tables[i]`` with ``keys[i]`` (and ``grads[i]``).
    Replies: LOOKUP_REPLY (lookups) / UPDATE_ACK (updates) of ``reply_frames[i]`` frames."""

    def __init__(self, op: str, nkeys: int, count: int, pools: dict, mtu: int, rng: np.random.Generator,
                 first_id: int):
        P = consts.max_body_per_frame(mtu)
        self.op, self.nkeys, self.count, self.first_id = op, nkeys, count, first_id
        self.tables = [t % 2 for t in range(count)]
        self.keys = [np.sort(rng.choice(pools[t], nkeys, replace=False)) for t in self.tables]
        self.grads = ([rng.standard_normal((nkeys, DIM)).astype(np.float32) * np.float32(0.1) for _ in self.keys]
                      if op == "update" else None)
        frames = []
        for i, (t, k) in enumerate(zip(self.tables, self.keys)):
            d = codec.make_directory([t], [DIM], [1], [k.size])  # one table per message, as before v2
            if op == "lookup":
                fr = codec.encode_lookup(msg_id=first_id + i, client_id=1, shard_id=0, directory=d, keys=k, mtu=mtu)
            else:
                fr = codec.encode_update(msg_id=first_id + i, client_id=1, shard_id=0, directory=d, keys=k,
                                         values=self.grads[i].astype("<f4").tobytes(), mtu=mtu)
            frames.append(fr)
        self.counts = np.array([len(f) for f in frames], np.int64)
        self.starts = np.r_[0, np.cumsum(self.counts)[:-1]].astype(np.int64)
        self.frames = np.zeros((int(self.counts.sum()), consts.HDR_LEN + P), np.uint8)
        self.lens = np.zeros(len(self.frames), np.int64)
        r = 0
        for fr in frames:
            for f in fr:
                self.frames[r, :len(f)] = np.frombuffer(f, np.uint8)
                self.lens[r] = len(f)
                r += 1
        self.reply_type = MsgType.LOOKUP_REPLY if op == "lookup" else MsgType.UPDATE_ACK
        self.reply_frames = (-(-(nkeys * DIM * 4) // P)) if op == "lookup" else 1


class LoadGen:
    """A client socket that keeps ``window`` messages of a :class:`Workload` in flight."""

    def __init__(self, port: int, gro: bool = True):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        set_socket_buffers(self.sock)
        self.sock.bind(("127.0.0.1", 0))
        # UDP_GRO: a reply the shard sent as one GSO super-datagram arrives whole (the kernel
        # does not cut it into datagrams for this socket); each frame keeps its own header
        self.gro = False
        if gro:
            try:
                self.sock.setsockopt(udpio.SOL_UDP, UDP_GRO, 1)
                self.gro = True
            except OSError:
                pass
        self.bs = udpio.BatchSocket(self.sock, batch=64, slot=65536)
        self.name = np.frombuffer(udpio.tuple_to_sockaddr(("127.0.0.1", port)), np.uint8).reshape(1, 16)

    def close(self) -> None:
        self.sock.close()

    def run(self, w: Workload, window: int, timeout_s: float = 120.0) -> tuple[float, np.ndarray]:
        """Send every message of ``w`` with at most ``window`` in flight; returns (seconds from
        the first send to the last reply, per-message latency in µs).

        Raises:
            OperationalError: a reply of the wrong type (an ERROR), or no progress for ``timeout_s``.
        """
        n = w.count
        got = np.zeros(n, np.int64)
        t_sent = np.zeros(n)
        t_done = np.zeros(n)
        names = np.repeat(self.name, max(window, 1), axis=0)
        nxt, done = 0, 0
        t0 = time.perf_counter()
        last = t0

        def send(a: int, b: int) -> None:
            now = time.perf_counter()
            t_sent[a:b] = now
            self.bs.send(w.frames, w.starts[a:b], w.counts[a:b], w.lens, names[:b - a])

        k = min(window, n)
        send(0, k)
        nxt = k
        poller_fd = [self.sock]
        import select

        while done < n:
            m = self.bs.recv()
            if m == 0:
                if time.perf_counter() - last > timeout_s:
                    raise OperationalError(f"bench: no reply for {timeout_s} s ({done}/{n} messages answered)")
                select.select(poller_fd, [], [], 0.05)
                continue
            last = time.perf_counter()
            if m <= 8:  # a few datagrams: read their headers one by one (cheaper than a dozen vector calls)
                fin = _few_replies(self.bs.rx, self.bs.lens, m, w, got, t_done)
            else:
                h = np.ascontiguousarray(self.bs.rx[:m, :consts.HDR_LEN]).view(codec.HEADER_DTYPE).reshape(m)
                if (h["msg_type"] != w.reply_type).any():
                    bad = h[h["msg_type"] != w.reply_type][0]
                    raise OperationalError(f"bench: the shard answered {MsgType(int(bad['msg_type'])).name} status "
                                           f"{int(bad['status'])} to message {int(bad['msg_id'])}")
                ids = h["msg_id"].astype(np.int64) - w.first_id
                # frames in a slot: a GRO'd slot holds equal frames of one reply (the last shorter)
                seg = consts.HDR_LEN + h["frag_len"].astype(np.int64)
                nfr = -(-self.bs.lens[:m] // np.maximum(seg, 1))
                np.add.at(got, ids, nfr)
                fin = np.unique(ids[got[ids] >= w.reply_frames])
                fin = fin[t_done[fin] == 0]
            if fin.size:
                t_done[fin] = last
                done += int(fin.size)
                room = min(n - nxt, window - (nxt - done))
                if room > 0:
                    send(nxt, nxt + room)
                    nxt += room
        return float(t_done.max() - t0), (t_done - t_sent) * 1e6


_HEAD = struct.Struct(">xxxBxxHI")  #: msg_type, status, msg_id (header bytes 0..11)
_FRAG_LEN = struct.Struct(">H")  #: frag_len (header bytes 40..41)


def _few_replies(rx: np.ndarray, lens: np.ndarray, m: int, w, got: np.ndarray, t_done: np.ndarray) -> np.ndarray:
    """As :meth:`LoadGen.run`'s vector code, datagram by datagram: the messages ``m`` received
    datagrams completed (indices into ``w``, each once, not done before)."""
    fin = []
    for i in range(m):
        row = rx[i]
        mt, status, mid = _HEAD.unpack_from(row, 0)
        if mt != w.reply_type:
            raise OperationalError(f"bench: the shard answered {MsgType(mt).name} status {status} to message {mid}")
        j = mid - w.first_id
        seg = consts.HDR_LEN + _FRAG_LEN.unpack_from(row, 40)[0]
        got[j] += -(-int(lens[i]) // max(seg, 1))
        if got[j] >= w.reply_frames and t_done[j] == 0 and j not in fin:
            fin.append(j)
    return np.array(fin, np.int64)


def _local(lb: LocalBackend, w: Workload) -> tuple[float, float]:
    """(wall seconds, CPU seconds) LocalBackend takes for the same messages (a round of one
    table per message, as the messages are)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    if w.op == "lookup":
        for t, k in zip(w.tables, w.keys):
            lb.lookup({t: k})
    else:
        for t, k, g in zip(w.tables, w.keys, w.grads):
            lb.update({t: (k, g)})
    return time.perf_counter() - t0, time.thread_time() - c0


def _count(nkeys: int, scale: float) -> int:
    """Messages per throughput run: about 600k rows, at least 60 and at most 3000 messages (× scale)."""
    return max(10, int(max(60, min(3000, 600_000 // nkeys)) * scale))


def _warm(port: int, pools: dict, mtu: int, lb: LocalBackend, rng) -> None:
    """Materialise every pool row in the shard and in the reference (one update each)."""
    gen = LoadGen(port)
    try:
        step = 2048
        for t, pool in pools.items():
            for a in range(0, pool.size, step):
                k = np.sort(pool[a:a + step])
                g = np.zeros((k.size, DIM), np.float32)
                w = Workload.__new__(Workload)
                fr = codec.encode_update(msg_id=0x7F000000 + t * 1000 + a // step, client_id=1, shard_id=0,
                                         directory=codec.make_directory([t], [DIM], [1], [k.size]), keys=k,
                                         values=g.astype("<f4").tobytes(), mtu=mtu)
                P = consts.max_body_per_frame(mtu)
                w.op, w.count, w.first_id = "update", 1, 0x7F000000 + t * 1000 + a // step
                w.frames = np.zeros((len(fr), consts.HDR_LEN + P), np.uint8)
                w.lens = np.array([len(f) for f in fr], np.int64)
                for r, f in enumerate(fr):
                    w.frames[r, :len(f)] = np.frombuffer(f, np.uint8)
                w.starts, w.counts = np.array([0]), np.array([len(fr)])
                w.reply_type, w.reply_frames = MsgType.UPDATE_ACK, 1
                gen.run(w, 1)
                if lb is not None:
                    lb.update({t: (k, g)})
    finally:
        gen.close()


def measure_shard(workdir: Path, engine: str, workers: int, loads: dict, pools: dict, mtu: int,
                  window: int, lb_times: dict | None, lb: LocalBackend | None, rng, wal: bool = False) -> dict:
    """Run every workload against one shard process; LocalBackend runs alternate with them
    when ``lb`` is given (their seconds go into ``lb_times``); ``wal``: the shard keeps its
    write-ahead log (``--checkpoint-dir``)."""
    sp = ShardProcess(workdir, engine, workers, mtu, wal=wal).start()
    out: dict = {}
    try:
        _warm(sp.port, pools, mtu, None, rng)
        gen = LoadGen(sp.port)
        try:
            for (op, nk), (w_thrs, w_lat) in loads.items():
                cpu0, gen0, idle0 = sp.cpu(), time.process_time(), _machine_idle()
                secs = []
                for w_thr in w_thrs:  # repeats, each with its own message ids, LocalBackend in between
                    secs.append(gen.run(w_thr, window)[0])
                    if lb is not None:
                        lb_times.setdefault((op, nk), []).append(_local(lb, w_thr))
                cpu1, gen1, idle1 = sp.cpu(), time.process_time(), _machine_idle()
                _, lat = gen.run(w_lat, 1)
                w_thr = w_thrs[0]
                sec = float(np.median(secs))
                msgs = w_thr.count * len(w_thrs)
                out[f"{op}_{nk}"] = {
                    "rows_per_s": w_thr.count * nk / sec,
                    "msgs_per_s": w_thr.count / sec,
                    "p50_us": float(np.percentile(lat, 50)),
                    "p99_us": float(np.percentile(lat, 99)),
                    "messages": msgs,
                    "repeats": len(w_thrs),
                    "rows_per_s_runs": [w_thr.count * nk / x for x in secs],
                    "request_frames_per_msg": float(w_thr.counts.mean()),
                    "reply_frames_per_msg": w_thr.reply_frames,
                    "seconds": sec,
                    "shard_cpu_s": cpu1 - cpu0,
                    "rows_per_shard_cpu_s": msgs * nk / max(cpu1 - cpu0, 1e-9),
                    "loadgen_cpu_s": gen1 - gen0,
                    "machine_idle_share": (idle1[0] - idle0[0]) / max(idle1[1] - idle0[1], 1.0),
                }
        finally:
            gen.close()
    finally:
        sp.stop()
    out["log"] = str(sp.log_path)
    return out


def run(out_dir: Path, *, mtu: int = 1500, window: int = 4, scale: float = 1.0, reference: bool = True,
        seed: int = 0, repeats: int = 3, log=print) -> dict:
    """Run the benchmark and merge ``server`` into ``out_dir/bench.json`` (see the module docstring).

    Args:
        out_dir: where bench.json (and the shards' logs, under ``server-logs/``) go.
        mtu: the cluster MTU (bytes).
        window: messages in flight in the throughput runs.
        scale: multiplies the number of messages per measurement.
        reference: also measure ``--engine reference`` (slow at 4096 keys).
        repeats: throughput runs per configuration, each followed by LocalBackend doing the
            same work; rows/s are the medians (``rows_per_s_runs``: every run's).

    Returns:
        the ``server`` result (``workers_1``, ``workers_2``, ``reference``, ``local``, the
        ``ratio_*`` keys, ``targets`` and ``load``).
    """
    out_dir = Path(out_dir)
    workdir = out_dir / "server-logs"
    workdir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pools = {t: np.unique(rng.integers(0, 2**64 - 1, POOL + 64, dtype=np.uint64, endpoint=True))[:POOL]
             for t in (0, 1)}
    cfg = bench_config(mtu=mtu)
    loads = {}
    first = 1
    for op in OPS:
        for nk in KEYS:
            c = _count(nk, scale)
            w_thrs = []
            for _ in range(repeats):
                w_thrs.append(Workload(op, nk, c, pools, mtu, rng, first))
                first += c
            w_lat = Workload(op, nk, max(20, min(c, 300)), pools, mtu, rng, first)
            first += w_lat.count
            loads[(op, nk)] = (w_thrs, w_lat)
    load0 = os.getloadavg()
    lb = LocalBackend(cfg)
    for t, pool in pools.items():  # materialise the pool in the reference (as _warm does in the shard)
        for a in range(0, pool.size, 2048):
            k = np.sort(pool[a:a + 2048])
            lb.update({t: (k, np.zeros((k.size, DIM), np.float32))})
    lb_times: dict = {}
    res: dict = {}
    log("bench server: --workers 1 (batch engine) and LocalBackend, alternating ...")
    res["workers_1"] = measure_shard(workdir, "batch", 1, loads, pools, mtu, window, lb_times, lb, rng)
    log("bench server: --workers 1 with the write-ahead log (--checkpoint-dir), updates ...")
    upd = {k: v for k, v in loads.items() if k[0] == "update"}
    res["workers_1_wal"] = measure_shard(workdir, "batch", 1, upd, pools, mtu, window, None, None, rng, wal=True)
    log("bench server: --workers 2 ...")
    res["workers_2"] = measure_shard(workdir, "batch", 2, loads, pools, mtu, window, lb_times, lb, rng)
    if reference:
        log("bench server: --engine reference ...")
        res["reference"] = measure_shard(workdir, "reference", 1, loads, pools, mtu, window, None, None, rng)
    log("bench server: a round of the same ids over 2 and over 26 tables, the shard's CPU ...")
    res["rounds"] = shard_rounds.run(rounds=max(10, int(200 * scale)))
    res["local"] = {}
    for (op, nk), ts in lb_times.items():
        wall = float(np.median([t[0] for t in ts]))
        cpu = float(np.median([t[1] for t in ts]))
        n = loads[(op, nk)][0][0].count
        res["local"][f"{op}_{nk}"] = {"rows_per_s": n * nk / wall, "msgs_per_s": n / wall,
                                      "rows_per_cpu_s": n * nk / max(cpu, 1e-9), "runs": len(ts)}
    for op in OPS:
        for nk in KEYS:
            k = f"{op}_{nk}"
            res[f"ratio_{k}"] = res["workers_1"][k]["rows_per_s"] / res["local"][k]["rows_per_s"]
            res[f"ratio_cpu_{k}"] = (res["workers_1"][k]["rows_per_shard_cpu_s"]
                                     / res["local"][k]["rows_per_cpu_s"])
            res[f"ratio_workers2_{k}"] = res["workers_2"][k]["rows_per_s"] / res["workers_1"][k]["rows_per_s"]
            if reference:
                res[f"ratio_batch_vs_reference_{k}"] = (res["workers_1"][k]["rows_per_s"]
                                                        / res["reference"][k]["rows_per_s"])
    for nk in KEYS:
        k = f"update_{nk}"
        res[f"ratio_wal_{k}"] = res["workers_1_wal"][k]["rows_per_s"] / res["workers_1"][k]["rows_per_s"]
        res[f"ratio_wal_cpu_{k}"] = (res["workers_1_wal"][k]["rows_per_shard_cpu_s"]
                                     / res["workers_1"][k]["rows_per_shard_cpu_s"])
    res["targets"] = {
        "wal_update_4096_vs_no_wal": {"target": TARGET_WAL, "measured": res["ratio_wal_update_4096"],
                                      "met": res["ratio_wal_update_4096"] >= TARGET_WAL,
                                      "note": "update rows/s with the write-ahead log (one fdatasync per wake-up) "
                                              "÷ without; the log may cost at most 30%"},
        "lookup_4096_vs_local": {"target": TARGET_LOOKUP_4096, "measured": res["ratio_lookup_4096"],
                                 "met": res["ratio_lookup_4096"] >= TARGET_LOOKUP_4096},
        "lookup_1_vs_local": {"target": TARGET_LOOKUP_1, "measured": res["ratio_lookup_1"],
                              "met": res["ratio_lookup_1"] >= TARGET_LOOKUP_1},
        "rounds_26_vs_2_tables": {"target": shard_rounds.TARGET_RATIO,
                                  "measured": max(res["rounds"]["ratio_26_vs_2_lookup"],
                                                  res["rounds"]["ratio_26_vs_2_update"]),
                                  "met": res["rounds"]["met"],
                                  "note": "the shard's CPU for one round (lookup, update) of the same ids over 26 "
                                          "tables ÷ over 2 tables (the larger of the two ratios)"},
        "workers2_vs_workers1_lookup_4096": {"target": TARGET_WORKERS2,
                                             "measured": res["ratio_workers2_lookup_4096"],
                                             "met": res["ratio_workers2_lookup_4096"] >= TARGET_WORKERS2,
                                             "note": "needs two free cores besides the load generator"},
    }
    res["load"] = {"loadavg_before": list(load0), "loadavg_after": list(os.getloadavg()),
                   "cpus": os.cpu_count()}
    res.update({"mtu": mtu, "dim": DIM, "dtype": "fp32", "optimizer": "adagrad", "window": window,
                "pool_rows_per_table": POOL, "gso": udpio.available(), "loadgen_udp_gro": True,
                "numpy": np.__version__,
                "machine": platform.machine()})
    merge_json(out_dir / "bench.json", "server", res)
    return res
