"""Benchmark of the card (``embnic bench dataplane``): the card and testpmd on the same frames.

The method: docs/bench.md, "embnic bench dataplane: the card against dpdk-testpmd".
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import time
import types
from pathlib import Path
from statistics import median
from typing import Any, Sequence

import numpy as np

from embnic.client_lib import codec
from embnic.client_lib.consts import DType, MsgType
from embnic.control.targets.dpdk.process import DATAPLANE, CardProcess, build_card, unique_prefix
from embnic.control.netns import Netns
from embnic.control.runstate import require_root
from embnic.testbed.bench.loadgen import machine_idle, proc_cpu
from embnic.testbed.bench.results import merge_json
from embnic.control.pcap import write_pcap
from embnic.testbed.bench.testpmd import TestpmdProcess

# ====================================================================== the benchmark pcap
BENCH_CARD_IP = "10.99.0.1"
BENCH_CLIENTS = ({"client": 1, "ip": "10.99.0.2", "mac": "02:00:00:99:00:02", "udp_port": 40001},
                 {"client": 2, "ip": "10.99.0.3", "mac": "02:00:00:99:00:03", "udp_port": 40002})
BENCH_SHARDS = tuple({"shard": i, "ip": f"10.99.1.{10 + i}", "mac": f"02:00:00:99:01:{10 + i:02x}",
                      "udp_port": 7878} for i in range(4))


def _to_card(peer: dict, payload: bytes) -> bytes:
    """An Ethernet/IPv4/UDP frame of ``payload`` from ``peer`` (a client or a shard) to the card's port 0."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    return bytes(Ether(src=peer["mac"], dst="02:00:00:99:00:01") / IP(src=peer["ip"], dst=BENCH_CARD_IP, flags="DF")
                 / UDP(sport=peer["udp_port"], dport=7878) / Raw(payload))


def _written(path: Path, frames: list[bytes], messages: int) -> dict:
    """Write ``frames`` to the pcap ``path``; ``{frames, messages, bytes, avg_frame_bytes}``."""
    write_pcap(path, frames)
    total = sum(len(f) for f in frames)
    return {"frames": len(frames), "messages": messages, "bytes": total, "avg_frame_bytes": total / len(frames)}


def make_bench_pcap(path: Path, n_frames: int = 2048, seed: int = 0) -> dict:
    """Write a pcap of embnic request frames with a realistic size mix; returns its stats.

    Mix (by message, protocol v2): 75% LOOKUP_REQ of 1..4 tables (uniform) and ``1 +
    Geometric(1/32)`` keys capped at 170, spread over the tables (each at least one; fp32, dim
    16; one frame, 68..1468 B of UDP payload), 25% UPDATE_REQ of 2 tables of 15 fp32 rows of dim
    16 each (2192 B body: directory, keys, gradients; 2 fragments, 1428 + 764 B). Clients 1-2 →
    shards 0-3, unique msg ids. Frames are built by
    :func:`embnic.client_lib.codec.encode_lookup`/``encode_update``; Ethernet/IPv4/UDP with
    correct checksums.

    Returns:
        ``{frames, messages, bytes, avg_frame_bytes}`` (bytes = Ethernet bytes of all frames).
    """
    rng = np.random.default_rng(seed)
    frames: list[bytes] = []
    msgs = 0
    while len(frames) < n_frames:
        c = BENCH_CLIENTS[msgs % len(BENCH_CLIENTS)]
        shard = int(rng.integers(0, len(BENCH_SHARDS)))
        if rng.random() < 0.75:
            t = int(rng.integers(1, 5))
            n = int(max(t, min(170, 1 + rng.geometric(1 / 32))))
            counts = np.bincount(rng.integers(0, t, n - t), minlength=t) + 1  # each table >= 1 key
            d = codec.make_directory(np.arange(t) + 4 * shard, [16] * t, [DType.FP32] * t, counts)
            keys = rng.integers(0, 1 << 40, n, dtype=np.uint64)
            payloads = codec.encode_lookup(msg_id=msgs + 1, client_id=c["client"], shard_id=shard, directory=d,
                                           keys=keys)
        else:
            d = codec.make_directory([4 * shard, 4 * shard + 1], [16, 16], [DType.FP32] * 2, [15, 15])
            keys = rng.integers(0, 1 << 40, 30, dtype=np.uint64)
            grads = [rng.standard_normal((15, 16)).astype(np.float32) for _ in range(2)]
            payloads = codec.encode_update(msg_id=msgs + 1, client_id=c["client"], shard_id=shard, directory=d,
                                           keys=keys, values=codec.values_to_body(grads, [DType.FP32] * 2))
        frames += [_to_card(c, pl) for pl in payloads]
        msgs += 1
    return _written(path, frames, msgs)


def make_distinct_pcap(path: Path, n_msgs: int = 8192, seed: int = 1,
                       requests_only_path: Path | None = None) -> dict:
    """Write a pcap of ``n_msgs`` messages with distinct (client, msg id), each a request frame
    followed by its reply frame; returns its stats.

    Every message is a LOOKUP_REQ of 1..8 keys (uniform) of one table from client 1 or 2 to shard
    0..3 and its LOOKUP_REPLY (``n`` fp32 rows of dim 16, one frame) from that shard, both addressed to
    the card (so the card's map inserts an entry per request and frees it per reply: replayed in
    a loop, every pass inserts and frees every entry again). With ``requests_only_path``, the
    same request frames alone are written there too: the repeated-id workload, where after the
    first pass every request finds its entry (no insert, no free).

    Returns:
        ``{frames, messages, bytes, avg_frame_bytes}``.
    """
    rng = np.random.default_rng(seed)
    frames: list[bytes] = []
    for i in range(n_msgs):
        c = BENCH_CLIENTS[i % len(BENCH_CLIENTS)]
        sh = BENCH_SHARDS[int(rng.integers(0, len(BENCH_SHARDS)))]
        n = int(rng.integers(1, 9))
        keys = rng.integers(0, 1 << 40, n, dtype=np.uint64)
        d = codec.make_directory([0], [16], [DType.FP32], [n])
        req = codec.encode_lookup(msg_id=100 + i, client_id=c["client"], shard_id=sh["shard"], directory=d,
                                  keys=keys)[0]
        rows = np.zeros((n, 16), dtype=np.float32)
        rep_ = codec.encode_reply(codec.parse_header(req), MsgType.LOOKUP_REPLY, shard_id=sh["shard"],
                                  body=codec.rows_to_body(rows))[0]
        frames += [_to_card(c, req), _to_card(sh, rep_)]
    if requests_only_path is not None:
        write_pcap(requests_only_path, frames[0::2])
    return _written(path, frames, n_msgs)


# ====================================================================== measurements
def program_card(card: CardProcess, out_port: int, in_port: int = 0) -> None:
    """Clients behind ``in_port``, where the frames come in, shards behind ``out_port``: requests
    leave on it. The card takes a request only from its client's card port and a reply only from
    its shard's (``wrong_port``), so a workload with replies, which come in on ``in_port`` too,
    has its shards there as well: ``out_port == in_port``, every frame leaves where it came in."""
    for sh in BENCH_SHARDS:
        card.call("route_add", port=out_port, **sh)
    for cl in BENCH_CLIENTS:
        card.call("client_add", port=in_port, **cl)


#: Both DUTs get the same pool and burst: mbufs, per-lcore mbuf cache (the card's is fixed at
#: 256, MBUF_CACHE_SIZE in dataplane/main.c; testpmd's default would be 250), RX/TX burst.
BENCH_MBUFS, BENCH_MBCACHE, BENCH_BURST = 16384, 256, 32
XCORE_RTT = DATAPLANE / "build" / "xcore-rtt"


def xcore_rtt_ns(cpus: tuple[int, int] = (0, 1)) -> float | None:
    """Cache-line round trip between two CPUs (ns), by ``dataplane/build/xcore-rtt``; None if absent
    (why the benchmark records it beside every run: docs/bench.md)."""
    if not XCORE_RTT.is_file():
        return None
    r = subprocess.run([str(XCORE_RTT), str(cpus[0]), str(cpus[1]), "100000"], capture_output=True, text=True)
    try:
        return float(r.stdout.split()[1]) if r.returncode == 0 else None
    except (IndexError, ValueError):
        return None


def _cpu_seconds(pids: Sequence[int]) -> tuple[float, float]:
    """(busy CPU seconds of the whole box including steal, CPU seconds of ``pids``) so far."""
    idle, total = machine_idle()  # jiffies: idle and iowait, all
    return (total - idle) / os.sysconf("SC_CLK_TCK"), sum(proc_cpu(pid) for pid in pids)


def rate_window(sample, seconds: float, warmup: float, pids: Sequence[int]) -> dict:
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


def measure_card(binary: Path, vdevs: list[str], lcores: str, seconds: float, warmup: float,
                 netns: str | None = None, out_port: int = 1, log_dir: Path | None = None,
                 other_pids: Sequence[int] = (), mbufs: int | None = None, state_lcores: int = 1) -> dict:
    """Card rates from its own counters: ``{mpps, gbps, drops, frames, completed_per_s,
    others_cpu, mempool_ops, mode}`` (``completed_per_s``: messages whose whole reply passed, per
    s); ``state_lcores``: the card's ``--state-lcores``."""
    card = CardProcess(binary, vdevs, lcores=lcores, port_ips={0: BENCH_CARD_IP}, netns=netns,
                       args=["--paused", "--mbufs", str(mbufs or BENCH_MBUFS), "--burst", str(BENCH_BURST),
                             *(["--state-lcores", str(state_lcores)] if state_lcores > 1 else [])],
                       log=(log_dir / f"card-{unique_prefix('l')}.log") if log_dir else None)
    card.start()
    try:
        program_card(card, out_port)
        ops = card.call("info").get("mempool_ops")
        card.call("resume")
        snaps: list[dict] = []  # its counters at the window's start and end

        def sample() -> int:
            snaps.append(card.counters())
            return snaps[-1]["ports"][out_port]["tx_frames"]

        w = rate_window(sample, seconds, warmup, [card.proc.pid, *other_pids])
    finally:
        card.stop()
        card.cleanup()
    (b0, m0), (b1, m1) = ((c["ports"][out_port]["tx_bytes"], sum(c["completed"].values())) for c in snaps)
    return {"mpps": w["rate"] / 1e6, "gbps": (b1 - b0) * 8 / w["dt"] / 1e9, "frames": w["frames"],
            "completed_per_s": (m1 - m0) / w["dt"], "drops": {k: v for k, v in snaps[1]["drops"].items() if v},
            "state_entries": snaps[1]["state"]["entries"], "others_cpu": w["others_cpu"], "mempool_ops": ops}


def measure_testpmd(vdevs: list[str], lcores: str, mode: str, seconds: float, warmup: float,
                    netns: str | None = None, out_port: int = 1, main_lcore: int | None = None,
                    other_pids: Sequence[int] = (), mbufs: int | None = None, queues: int = 1) -> dict:
    """testpmd rate from its port stats: ``{mpps, frames, others_cpu}`` (``queues``: RX/TX queues
    per port, one per forwarding lcore)."""
    tp = TestpmdProcess(vdevs, lcores=lcores, mode=mode, netns=netns, main_lcore=main_lcore,
                        mbufs=mbufs or BENCH_MBUFS, mbcache=BENCH_MBCACHE, burst=BENCH_BURST, queues=queues)
    tp.start()
    try:
        w = rate_window(lambda: tp.tx_packets(out_port), seconds, warmup, [tp.proc.pid, *other_pids])
    finally:
        tp.cleanup()
    return {"mpps": w["rate"] / 1e6, "frames": w["frames"], "others_cpu": w["others_cpu"]}


#: Like with like: the card on one lcore (run to completion: RX, TX and the control socket)
#: against testpmd forwarding on one lcore (its main lcore, on the other CPU, only reads its
#: command line); both then use DPDK's default mempool driver (ring_mp_mc).
CARD_1LCORE, TESTPMD_1FWD, TESTPMD_MAIN = "0", "0,1", 1
#: Two lcores each: the card with 2 state lcores on CPUs 0 and 1 (``-- --state-lcores 2``);
#: testpmd forwarding on lcores 0 and 1 (CPUs 0 and 1), its main lcore 2 (which only reads the
#: command line) on CPU 1.
CARD_2STATE, TESTPMD_2FWD, TESTPMD_2FWD_MAIN = "0,1", "0@0,1@1,2@1", 2


def _measure_all(runs: dict[str, Any], repeats: int, rtt: bool = True) -> dict:
    """Run every configuration of ``runs`` (``{name: (fn, args, kwargs)}``) ``repeats`` times,
    interleaved (load from other processes hits all of them alike); per configuration the median
    of each figure and every run's rate, ``others_cpu`` (CPU the rest of the box used meanwhile)
    and, if ``rtt``, the cache-line round trip between CPUs 0 and 1 just before it
    (``xcore_rtt_ns``; meaningless while a generator keeps one of the CPUs busy)."""
    got: dict[str, list[dict]] = {k: [] for k in runs}
    for _ in range(repeats):
        for key, (fn, a, k) in runs.items():
            before = xcore_rtt_ns() if rtt else None
            got[key].append({**fn(*a, **k), "xcore_rtt_ns": before})
    med = {}
    for key, v in got.items():
        m = {"mpps": median([r["mpps"] for r in v]), "all_mpps": [round(r["mpps"], 3) for r in v],
             "others_cpu": [round(r["others_cpu"], 3) for r in v], "xcore_rtt_ns": [r["xcore_rtt_ns"] for r in v]}
        if "gbps" in v[0]:
            m.update(gbps=median([r["gbps"] for r in v]), drops=v[-1]["drops"], mempool_ops=v[-1]["mempool_ops"],
                     completed_per_s=median([r["completed_per_s"] for r in v]),
                     all_completed_per_s=[round(r["completed_per_s"]) for r in v])
        med[key] = m
    return med


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def _figures(m: dict, pcap: dict) -> dict:
    """bench.json figures of the main workload: ``card`` on one lcore against testpmd ``io`` and
    ``macswap`` forwarding on one lcore (the headline ratios), and ``card_pipeline`` (RX and TX
    on two lcores) when measured."""
    per_msg = pcap["messages"] / pcap["frames"]
    card, io, mac = m["card"], m["io"], m["macswap"]
    out = {
        "card_mpps": card["mpps"],
        "card_msgs_per_s": card["mpps"] * 1e6 * per_msg,
        "card_gbps": card["gbps"],
        "testpmd_io_mpps": io["mpps"],
        "testpmd_macswap_mpps": mac["mpps"],
        "ratio_io": _ratio(card["mpps"], io["mpps"]),
        "ratio_macswap": _ratio(card["mpps"], mac["mpps"]),
        "card_mempool_ops": card["mempool_ops"],
        "card_drops_last_run": card["drops"],
        "runs_mpps": {k: v["all_mpps"] for k, v in m.items()},
        "runs_others_cpu": {k: v["others_cpu"] for k, v in m.items()},
        "runs_xcore_rtt_ns": {k: v["xcore_rtt_ns"] for k, v in m.items()},
    }
    if "card_pipeline" in m:
        pl = m["card_pipeline"]
        out.update({"card_pipeline_2lcores_mpps": pl["mpps"],
                    "card_pipeline_mempool_ops": pl["mempool_ops"],
                    "ratio_io_card_pipeline_2lcores_vs_testpmd_1lcore": _ratio(pl["mpps"], io["mpps"])})
    return out


def _distinct_figures(m: dict, dpcap: dict) -> dict:
    """bench.json figures of the distinct-message workload (request + reply per message); with
    ``card_distinct_2state`` and ``io_distinct_2fwd`` measured, the 2-lcore figures too."""
    d, r, io = m["card_distinct"], m["card_repeated"], m["io_distinct"]
    per_msg = dpcap["frames"] / dpcap["messages"]  # 2: a request frame and its reply frame
    repeated = r["mpps"] * 1e6 / per_msg
    two = {}
    if "card_distinct_2state" in m and "io_distinct_2fwd" in m:
        d2, io2 = m["card_distinct_2state"], m["io_distinct_2fwd"]
        two = {
            "distinct_2state_msgs_per_s": d2["completed_per_s"],
            "distinct_2state_frames_mpps": d2["mpps"],
            "testpmd_io_distinct_2fwd_mpps": io2["mpps"],
            "ratio_io_distinct_2state": _ratio(d2["mpps"], io2["mpps"]),
            "scaling_distinct_2state_vs_1": _ratio(d2["completed_per_s"], d["completed_per_s"]),
            "scaling_testpmd_2fwd_vs_1": _ratio(io2["mpps"], io["mpps"]),
            "distinct_2state_drops_last_run": d2["drops"],
            "distinct_2state_runs": {"card_msgs_per_s": d2["all_completed_per_s"], "card_mpps": d2["all_mpps"],
                                     "testpmd_io_2fwd_mpps": io2["all_mpps"], "others_cpu": d2["others_cpu"],
                                     "testpmd_others_cpu": io2["others_cpu"],
                                     "xcore_rtt_ns": d2["xcore_rtt_ns"]},
            "distinct_2state_setup": (f"card -l {CARD_2STATE} -- --state-lcores 2 (lcore 0: RX, state lcore 0, TX, "
                                      "control socket; lcore 1: state lcore 1 with its own TX queue on the "
                                      f"net_null port); testpmd io --lcores {TESTPMD_2FWD} --main-lcore "
                                      f"{TESTPMD_2FWD_MAIN} --rxq 2 --txq 2 (the pcap on both RX queues); "
                                      "not gated: 2 vCPUs shared with the rest of the box, see xcore_rtt_ns "
                                      "and others_cpu"),
        }
    return {**two,
        "distinct_msgs_per_s": d["completed_per_s"],
        "distinct_frames_mpps": d["mpps"],
        "repeated_ids_msgs_per_s": repeated,
        "ratio_distinct_to_repeated": _ratio(d["completed_per_s"], repeated),
        "testpmd_io_distinct_mpps": io["mpps"],
        "ratio_io_distinct": _ratio(d["mpps"], io["mpps"]),
        "distinct_drops_last_run": d["drops"],
        "distinct_runs": {"card_msgs_per_s": d["all_completed_per_s"], "card_mpps": d["all_mpps"],
                          "repeated_mpps": r["all_mpps"], "testpmd_io_mpps": io["all_mpps"],
                          "others_cpu": d["others_cpu"]},
        "distinct_pcap": dpcap,
    }


@contextlib.contextmanager
def _veth_pair():
    """A network namespace ``enB<pid>`` with one veth pair ``eBa<pid>``/``eBb<pid>``, both ends in
    it, up, IPv6 and checksum offloads off; yields its ``name``, ``a`` and ``b``; the namespace
    (with the pair) is deleted on exit."""
    tag = f"{os.getpid() % 100000}"
    pair = types.SimpleNamespace(name=f"enB{tag}", a=f"eBa{tag}", b=f"eBb{tag}")
    with Netns.create(pair.name) as ns:
        ns.veth(pair.a, pair.b)
        for dev in (pair.a, pair.b):
            ns.link_up(dev)
            ns.offloads_off(dev, each=True)
        yield pair


#: the PMDs the card and testpmd are measured on over the veth pair (the testbed's path), each
#: with its defaults (``net_<pmd>0,iface=IF``; on a veth AF_XDP binds in copy mode)
VETH_PMDS = ("af_packet", "af_xdp")


def measure_veth(binary: Path, pcap_path: Path, pcap: dict, pmds: Sequence[str], seconds: float, warmup: float,
                 repeats: int, log_dir: Path | None = None) -> dict:
    """The main workload over a veth pair (docs/bench.md draws it), the DUT (card, testpmd io,
    testpmd macswap) on each PMD of ``pmds`` in turn, all in one interleaved run against one
    generator (testpmd io replaying the pcap into ``net_af_packet`` on the other end, on CPU 1).

    Returns:
        ``{pmd: figures}`` (:func:`_figures` plus ``setup``) per PMD, and with both measured
        ``af_xdp_vs_af_packet``: the card's, testpmd io's and macswap's Mpps on af_xdp over their
        Mpps on af_packet (the same run, so the box's load hits both alike).
    """
    src = f"net_pcap0,rx_pcap={pcap_path},infinite_rx=1"
    sink = "net_null0,no-rx=1"
    out: dict[str, Any] = {}
    # 2 vCPUs here: the generator forwards on CPU 1, each DUT on CPU 0 (the card run to
    # completion on lcore 0; testpmd forwarding on lcore 0 with its idle main lcore on 1)
    with _veth_pair() as ns:
        gen = TestpmdProcess([src, f"net_af_packet0,iface={ns.a}"], lcores="0,1", main_lcore=0, mode="io",
                             netns=ns.name)
        gen.start()
        try:
            other = dict(netns=ns.name, other_pids=[gen.proc.pid])
            runs = {f"{kind}/{pmd}": _dut(binary, kind, [f"net_{pmd}0,iface={ns.b}", sink], seconds, warmup,
                                          log_dir, **other) for pmd in pmds for kind in ("card", "io", "macswap")}
            m = _measure_all(runs, repeats, rtt=False)
        finally:
            gen.cleanup()
    for pmd in pmds:
        out[pmd] = _figures({k.split("/")[0]: v for k, v in m.items() if k.endswith("/" + pmd)}, pcap)
        out[pmd]["setup"] = (f"generator dpdk-testpmd io (net_pcap infinite_rx -> net_af_packet, forwarding on "
                             f"CPU 1) -> veth -> DUT on net_{pmd} on CPU 0 -> net_null; card -l 0 (run to "
                             "completion), testpmd -l 0,1 --main-lcore 1"
                             + ("; AF_XDP in copy mode (veth), native XDP, busy_budget 64" if pmd == "af_xdp" else ""))
    if "af_packet" in out and "af_xdp" in out:
        a, x = out["af_packet"], out["af_xdp"]
        out["af_xdp_vs_af_packet"] = {k: _ratio(x[f"{k}_mpps"], a[f"{k}_mpps"])
                                      for k in ("card", "testpmd_io", "testpmd_macswap")}
    return out


#: how the runs are set up (``setup`` of the result)
SETUP = ("net_pcap infinite_rx -> net_null; af_packet, af_xdp: testpmd replay -> veth -> DUT on that "
         "PMD -> net_null; "
         f"card -l {CARD_1LCORE} (run to completion) and testpmd -l {TESTPMD_1FWD} --main-lcore "
         f"{TESTPMD_MAIN} (one forwarding lcore), both on DPDK's default mempool driver; "
         f"{BENCH_MBUFS} mbufs (+ the pcap's frames for the distinct workload), per-lcore "
         f"cache {BENCH_MBCACHE}, burst {BENCH_BURST}, busy polling (no --idle-us)")
#: what the distinct workload is (``distinct_workload`` of the result)
DISTINCT_WORKLOAD = ("lookups of 1..8 keys with their single-frame replies, distinct (client, "
                     "msg id) per message, replayed in a loop: every request inserts a state "
                     "entry, every reply frees it; distinct_msgs_per_s is the card's own count "
                     "of completed messages per second; repeated_ids_msgs_per_s replays the "
                     "same request frames alone (every request finds its entry) counted the same "
                     "way, frames/s / 2; the card's runs of both (and the PNA pipeline's distinct "
                     "run) have clients and shards behind port 0, where the frames come in (a "
                     "reply passes only from its shard's card port), and send back on it "
                     "(net_pcap without tx_pcap drops)")


def _dut(binary: Path, kind: str, vdevs: list[str], seconds: float, warmup: float, log_dir: Path | None,
         **kw: Any) -> tuple:
    """One run of :func:`_measure_all`: the card (``kind`` ``"card"``, on :data:`CARD_1LCORE` unless
    ``lcores`` says otherwise) or testpmd forwarding in mode ``kind`` (on :data:`TESTPMD_1FWD`, main
    lcore :data:`TESTPMD_MAIN` unless ``lcores``/``main_lcore`` say otherwise) on ``vdevs``; ``kw``:
    the rest of :func:`measure_card`'s or :func:`measure_testpmd`'s keyword arguments."""
    if kind == "card":
        return (measure_card, (binary, vdevs, kw.pop("lcores", CARD_1LCORE), seconds, warmup),
                {**kw, "log_dir": log_dir})
    return (measure_testpmd, (vdevs, kw.pop("lcores", TESTPMD_1FWD), kind, seconds, warmup),
            {"main_lcore": TESTPMD_MAIN, **kw})


def _runs(binary: Path, main: tuple[str, str], distinct: tuple[str, str, Path], dmbufs: int, dpcap: dict,
          lcores: str, seconds: float, warmup: float, logs: Path, state_lcores: int) -> dict[str, Any]:
    """The card's and testpmd's runs: name -> (measure function, args, keyword args).

    Args:
        main: the main pcap's vdev and the sink's.
        distinct: the vdevs of the distinct and the repeated-id pcaps, the distinct pcap's path.
    """
    src, sink = main
    dsrc, rsrc, dpath = distinct

    def dut(kind: str, source: str, **kw: Any) -> tuple:
        return _dut(binary, kind, [source, sink], seconds, warmup, logs, **kw)

    # requests and replies from one port: the card takes a reply only from its shard's port, so
    # the shards are behind port 0 too and the card sends back on it (net_pcap without a tx_pcap
    # drops what it is given, as net_null does); the repeated-id run alike, to compare
    runs = {"card": dut("card", src), "io": dut("io", src), "macswap": dut("macswap", src),
            "card_distinct": dut("card", dsrc, mbufs=dmbufs, out_port=0),
            "card_repeated": dut("card", rsrc, mbufs=dmbufs, out_port=0),
            "io_distinct": dut("io", dsrc, mbufs=dmbufs)}
    if state_lcores >= 2:
        # testpmd's two forwarding lcores need two RX queues: the pcap opened twice (each holds
        # the whole pcap in mbufs)
        dsrc2 = f"net_pcap0,rx_pcap={dpath},rx_pcap={dpath},infinite_rx=1"
        runs["card_distinct_2state"] = dut("card", dsrc, lcores=CARD_2STATE, mbufs=dmbufs, state_lcores=2,
                                           out_port=0)
        runs["io_distinct_2fwd"] = dut("io", dsrc2, lcores=TESTPMD_2FWD, main_lcore=TESTPMD_2FWD_MAIN, queues=2,
                                       mbufs=BENCH_MBUFS + 2 * dpcap["frames"])
    if lcores != CARD_1LCORE:
        runs["card_pipeline"] = dut("card", src, lcores=lcores)
    return runs


def _pna_runs(runs: dict, asked: bool, vdevs: tuple[str, str, str], dmbufs: int, seconds: float, warmup: float,
              logs: Path) -> str | None:
    """Add the P4 card for PNA in DPDK's SWX pipeline (testbed/bench/p4dpdk.py) to ``runs``, on the
    same vdevs (main source, sink, distinct source) and lcore; returns why it is skipped (None: added)."""
    from embnic.control.targets.p4dpdk import swx as p4dpdk
    from embnic.testbed.bench import p4dpdk as bench_pna

    pna_skip = bench_pna.available() if asked else "not asked for (--no-p4dpdk)"
    if pna_skip is None:
        src, sink, dsrc = vdevs
        pipe = p4dpdk.build_pipeline()
        pna_kw = dict(clients=BENCH_CLIENTS, shards=BENCH_SHARDS, log_dir=logs, window=rate_window)
        runs["p4dpdk"] = (bench_pna.measure_swx, (pipe, [src, sink], seconds, warmup), pna_kw)
        runs["p4dpdk_distinct"] = (bench_pna.measure_swx, (pipe, [dsrc, sink], seconds, warmup),
                                   dict(pna_kw, mbufs=dmbufs, out_port=0))
    return pna_skip


def _pna_figures(m: dict, pcap: dict) -> dict:
    """The ``p4dpdk`` figures of the measured runs ``m``, beside the card's and testpmd's."""
    pna, pnad = m["p4dpdk"], m["p4dpdk_distinct"]
    return {
        "mpps": pna["mpps"], "gbps": pna["gbps"], "msgs_per_s": pna["mpps"] * 1e6 * pcap["messages"] / pcap["frames"],
        "ratio_card": _ratio(pna["mpps"], m["card"]["mpps"]), "ratio_io": _ratio(pna["mpps"], m["io"]["mpps"]),
        "distinct_msgs_per_s": pnad["completed_per_s"], "distinct_frames_mpps": pnad["mpps"],
        "ratio_card_distinct": _ratio(pnad["completed_per_s"], m["card_distinct"]["completed_per_s"]),
        "ratio_io_distinct": _ratio(pnad["mpps"], m["io_distinct"]["mpps"]),
        "drops": pna["drops"], "distinct_drops": pnad["drops"],
        "runs": {"mpps": pna["all_mpps"], "distinct_msgs_per_s": pnad["all_completed_per_s"],
                 "others_cpu": pna["others_cpu"]},
        "setup": "embnic-swx -l 0 (one lcore: host RX/TX, the SWX pipeline, the control socket), the "
                 "pipeline built from p4/build/pna (p4c-dpdk's spec of p4/pna/); rate from the pipeline's output port "
                 "statistics",
    }


def run(out_dir: Path, seconds: float = 5.0, **kw: Any) -> dict:
    """Run the dataplane benchmark and merge it into ``out_dir/bench.json`` under ``dataplane``.

    Args:
        out_dir: where bench.json is read, updated and written (also the pcap and logs).
        seconds: measurement time per configuration (s), after ``warmup`` (default 1 s).
        lcores: EAL lcore list of the card's RX/TX pipeline, reported beside (default ``"0,1"``).
        repeats: interleaved repetitions of every configuration; medians are reported (3).
        frames: frames in the main pcap (default 2048).
        distinct_messages: messages (request + reply) in the distinct pcap (default 8192).
        state_lcores: 2 (default) also measures the distinct workload on the card with 2 state
            lcores and testpmd with 2 forwarding lcores; 1 skips that.
        af_packet, af_xdp: also measure on net_af_packet / net_af_xdp over a veth pair (default
            True each; :func:`measure_veth`).
        binary: the embnic-dp binary (default: build dataplane/).
    Returns:
        the ``dataplane`` object of bench.json (its keys: docs/bench.md).

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

    dpath, rpath = out_dir / "bench_distinct.pcap", out_dir / "bench_repeated_ids.pcap"
    dpcap = make_distinct_pcap(dpath, int(kw.get("distinct_messages", 8192)), requests_only_path=rpath)
    dsrc, rsrc = (f"net_pcap0,rx_pcap={dpath},infinite_rx=1", f"net_pcap0,rx_pcap={rpath},infinite_rx=1")
    # net_pcap's infinite_rx holds the whole pcap in mbufs of the DUT's pool
    dmbufs = BENCH_MBUFS + dpcap["frames"]
    runs = _runs(binary, (src, sink), (dsrc, rsrc, dpath), dmbufs, dpcap, lcores, seconds, warmup, logs,
                 int(kw.get("state_lcores", 2)))
    pna_skip = _pna_runs(runs, kw.get("p4dpdk", True), (src, sink, dsrc), dmbufs, seconds, warmup, logs)
    m = _measure_all(runs, repeats)
    res: dict[str, Any] = {**_figures(m, pcap), **_distinct_figures(m, dpcap)}
    res["p4dpdk"] = _pna_figures(m, pcap) if pna_skip is None else {"skipped": pna_skip}
    res["targets"] = {
        "ratio_io >= 0.5": res["ratio_io"] >= 0.5,
        "ratio_macswap >= 0.8": res["ratio_macswap"] >= 0.8,
        "distinct_msgs_per_s >= 1e6": res["distinct_msgs_per_s"] >= 1e6,
        "ratio_distinct_to_repeated >= 0.5": res["ratio_distinct_to_repeated"] >= 0.5,
    }

    pmds = [p for p in VETH_PMDS if kw.get(p, True)]
    if pmds:
        res.update(measure_veth(binary, pcap_path, pcap, pmds, seconds, warmup, repeats, logs))

    res.update({"lcores": lcores, "seconds": seconds, "repeats": repeats, "warmup": warmup, "pcap": pcap,
                "mbufs": BENCH_MBUFS, "mbuf_cache": BENCH_MBCACHE, "burst": BENCH_BURST,
                "setup": SETUP, "distinct_workload": DISTINCT_WORKLOAD})
    merge_json(out_dir / "bench.json", "dataplane", res)
    return res
