"""``embnic bench dataplane --target bmv2``: the same frames through the P4 card on BMv2 and
through the DPDK card, over the same veth path, in one run.

The method: docs/bench.md, "embnic bench dataplane --target bmv2: the P4 card on BMv2".
"""
from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from statistics import median
from typing import Any, Callable

from embnic.control import netns

from embnic.control.targets.bmv2 import switch as bmv2

from embnic.control.targets.bmv2 import runtime as bmv2_runtime
from embnic.control.targets.bmv2.target import tune_port_interfaces
from embnic.control.targets.base import Peer
from embnic.control.targets.dpdk.process import CardProcess, build_card, unique_prefix
from embnic.control.errors import MissingDependencyError, OperationalError
from embnic.control.netns import Netns
from embnic.control.runstate import require_root
from embnic.testbed.bench.dataplane import (BENCH_BURST, BENCH_CARD_IP, BENCH_CLIENTS, BENCH_MBUFS,
                                            BENCH_SHARDS, CARD_1LCORE, make_bench_pcap, program_card,
                                            rate_window)
from embnic.testbed.bench.results import merge_json
from embnic.testbed.bench.testpmd import TestpmdProcess

#: the card's port addresses (port 1 faces the sink; every shard and client is routed there)
CARD_PORTS = (bmv2_runtime.CardPortAddr(0, "02:00:00:99:00:01", BENCH_CARD_IP),
              bmv2_runtime.CardPortAddr(1, "02:00:00:99:00:03", "10.99.1.1"))
#: CPU of the DUT (the card's lcore 0; BMv2's threads); the generator forwards on CPU 1
DUT_CPU = 0


class VethPath:
    """The benchmark's two namespaces: generator → (veth) → DUT in, DUT out → (veth) → sink."""

    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.name = f"enV{tag}"          #: the DUT's namespace (card or BMv2)
        self.gen_ns = f"enV{tag}g"       #: the generator's and the sink's
        self.gen, self.dut_in, self.dut_out, self.sink = (f"eVg{tag}", f"eVi{tag}", f"eVo{tag}", f"eVs{tag}")

    def __enter__(self) -> "VethPath":
        with contextlib.ExitStack() as undo:
            for ns in (self.name, self.gen_ns):  # IPv6 off: BMv2's Thrift stays on loopback
                undo.callback(Netns.create(ns).delete)
            dut, gen = Netns(self.name), Netns(self.gen_ns)
            gen.veth(self.gen, self.dut_in, peer_ns=self.name)
            gen.veth(self.sink, self.dut_out, peer_ns=self.name)
            for ns, dev in ((gen, self.gen), (dut, self.dut_in), (dut, self.dut_out), (gen, self.sink)):
                ns.link_up(dev)
                ns.offloads_off(dev, each=True)
            tune_port_interfaces(dut, [self.dut_in, self.dut_out])
            undo.pop_all()
        return self

    def __exit__(self, *exc) -> None:
        for ns in (self.name, self.gen_ns):
            netns.delete(ns)

    def sink_frames(self) -> int:
        """Frames that have arrived at the sink interface (its kernel ``rx_packets``)."""
        return Netns(self.gen_ns).rx_packets(self.sink)


def _window(sample: Callable[[], int], seconds: float, warmup: float, pids: list[int]) -> dict:
    """:func:`embnic.testbed.bench.dataplane.rate_window` in this bench's units: ``{mpps, frames,
    seconds, others_cpu}`` (frames/s of ``sample`` over ``seconds`` after ``warmup``; others_cpu in
    CPUs' worth, ``pids`` and this process excluded)."""
    w = rate_window(sample, seconds, warmup, pids)
    return {"mpps": w["rate"] / 1e6, "frames": w["frames"], "seconds": round(w["dt"], 3),
            "others_cpu": round(w["others_cpu"], 2)}


def measure_card_veth(binary: Path, path: VethPath, seconds: float, warmup: float, gen_pid: int,
                      log_dir: Path) -> dict:
    """The DPDK card on one lcore between the path's veths: ``{mpps, frames, seconds,
    others_cpu, drops}`` (rate at the sink)."""
    vdevs = [f"net_af_packet0,iface={path.dut_in}", f"net_af_packet1,iface={path.dut_out}"]
    card = CardProcess(binary, vdevs, lcores=CARD_1LCORE, port_ips={0: BENCH_CARD_IP, 1: CARD_PORTS[1].ip},
                       netns=path.name, args=["--paused", "--mbufs", str(BENCH_MBUFS), "--burst", str(BENCH_BURST)],
                       log=log_dir / f"card-{unique_prefix('l')}.log")
    card.start()
    try:
        program_card(card, 1)
        card.call("resume")
        w = _window(path.sink_frames, seconds, warmup, [card.proc.pid, gen_pid])
        drops = {k: v for k, v in card.counters()["drops"].items() if v}
    finally:
        card.stop()
        card.cleanup()
    return {**w, "drops": drops}


def _pin(pid: int, cpu: int) -> None:
    """Pin every thread of ``pid`` (and threads it starts later) to ``cpu``."""
    r = subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(pid)], capture_output=True, text=True)
    if r.returncode != 0:
        raise bmv2.Bmv2Error(f"taskset -a -p -c {cpu} {pid}: {r.stderr.strip()}")


def measure_bmv2_veth(json_path: Path, path: VethPath, seconds: float, warmup: float, gen_pid: int,
                      log_dir: Path, channel: str = "thrift") -> dict:
    """The BMv2 switch of ``channel`` between the path's veths, its threads on CPU ``DUT_CPU``:
    ``{mpps, frames, seconds, others_cpu, drops, rx_frames, channel}`` (rate at the sink; drops
    and frames taken in from its counters). The generator offers more than BMv2 takes: the
    rest is lost before the switch by design of a saturation benchmark, so it is not reported.

    Raises:
        Bmv2Error: a switch failed to start or refused a table entry (names its log).
    """
    ns = Netns(path.name)
    tag = unique_prefix("b")
    routes = [Peer("shard", s["shard"], 1, s["mac"], s["ip"], s["udp_port"]) for s in BENCH_SHARDS]
    # clients behind port 0, where their frames come in (the card takes a request only from its client's port)
    clients = [Peer("client", c["client"], 0, c["mac"], c["ip"], c["udp_port"]) for c in BENCH_CLIENTS]
    program = bmv2_runtime.card_program(CARD_PORTS, routes + clients)
    ports = {0: path.dut_in, 1: path.dut_out}
    with contextlib.ExitStack() as undo:  # the switch stopped, its socket or state file removed
        if channel == "p4runtime":
            sock = log_dir / f"{tag}.p4rt"
            sock.unlink(missing_ok=True)
            undo.callback(sock.unlink, missing_ok=True)
            sw = bmv2.SimpleSwitch(None, ns, {}, log=log_dir / f"bmv2-{tag}.log", grpc_addr=f"unix:{sock}")
            sw.start()
            undo.callback(sw.stop)
            sw.wait_ready()
            bmv2_runtime.program_p4runtime(sw, json_path, program)
            _pin(sw.proc.pid, DUT_CPU)
            sw.port_add(ports)
        else:
            state = log_dir / f"bmv2-{tag}.state"
            undo.callback(state.unlink, missing_ok=True)
            prog = bmv2.SimpleSwitch(json_path, ns, {}, log=log_dir / f"bmv2-{tag}-program.log")
            prog.start()
            try:
                prog.wait_ready()
                prog.cli(program.cli_commands())
                prog.save_state(state)
            finally:
                prog.stop()
            sw = bmv2.SimpleSwitch(json_path, ns, ports, log=log_dir / f"bmv2-{tag}.log", restore_state=state)
            sw.start()
            undo.callback(sw.stop)
            sw.wait_ready()
            _pin(sw.proc.pid, DUT_CPU)
            sw.cli([f"set_queue_depth {bmv2.EGRESS_QUEUE_DEPTH}"])
            state.unlink(missing_ok=True)
        w = _window(path.sink_frames, seconds, warmup, [sw.proc.pid, gen_pid])
        c = bmv2_runtime.read_counters(sw, 2)
    return {**w, "drops": {k: v for k, v in c["drops"].items() if v},
            "rx_frames": sum(p["rx_frames"] for p in c["ports"]), "channel": channel}


def run(out_dir: Path, seconds: float = 5.0, **kw: Any) -> dict:
    """Measure both cards on the same frames over the same veth path (docs/bench.md) and
    merge the figures into ``out_dir/bench.json`` under ``dataplane``.

    Args:
        out_dir: bench.json, the pcap and the logs go here.
        seconds: measurement window per run (s), after ``warmup`` (default 1 s).
        repeats: runs of each DUT, alternating (default 3); medians are reported.
        frames: frames in the pcap (default 2048).
        binary: the embnic-dp binary (default: build dataplane/).
        channel: the BMv2 switch and how it is programmed: ``p4runtime`` (simple_switch_grpc),
            ``thrift`` (simple_switch) or ``auto`` (default: :func:`~embnic.control.targets.bmv2.switch.choose_channel`).
    Returns:
        the ``bmv2_*`` keys it adds to bench.json's ``dataplane`` object (docs/bench.md).

    Raises:
        NeedsRootError: not root. MissingDependencyError: dpdk-testpmd, the channel's switch
            or simple_switch_CLI missing. OperationalError, DpdkProcError: a process failed (names
            its log).
    """
    require_root("the bmv2 dataplane benchmark", why="it runs DPDK (EAL) and network namespaces",
                 example="sudo embnic bench dataplane --target bmv2")
    channel = bmv2.choose_channel(kw.pop("channel", None))
    missing = bmv2.missing_tools([bmv2.CHANNEL_SWITCH[channel], "simple_switch_CLI"])
    if missing:
        raise MissingDependencyError(f"the bmv2 benchmark needs {', '.join(missing)}, not found on PATH: "
                                     + "; ".join(f"{t}: {bmv2.TOOL_HINTS[t]}" for t in missing),
                                     dependency=missing[0])
    try:
        return _run(Path(out_dir), seconds, channel, **kw)
    except bmv2.Bmv2Error as e:
        raise OperationalError(str(e)) from None


def _run(out_dir: Path, seconds: float, channel: str, **kw: Any) -> dict:
    """:func:`run` after its checks (Bmv2Error is raised as is)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    warmup = float(kw.get("warmup", 1.0))
    repeats = int(kw.get("repeats", 3))
    logs = out_dir / "bench_bmv2_logs"
    logs.mkdir(exist_ok=True)
    json_path, _ = bmv2.program_json()
    binary = Path(kw["binary"]) if kw.get("binary") else build_card()
    pcap_path = out_dir / "bench_dataplane.pcap"
    pcap = make_bench_pcap(pcap_path, int(kw.get("frames", 2048)))
    card_runs, bmv2_runs = [], []
    with VethPath() as path:
        gen = TestpmdProcess([f"net_pcap0,rx_pcap={pcap_path},infinite_rx=1", f"net_af_packet0,iface={path.gen}"],
                             lcores="0,1", main_lcore=DUT_CPU, mode="io", netns=path.gen_ns)
        gen.start()
        try:
            for _ in range(repeats):
                card_runs.append(measure_card_veth(binary, path, seconds, warmup, gen.proc.pid, logs))
                bmv2_runs.append(measure_bmv2_veth(json_path, path, seconds, warmup, gen.proc.pid, logs,
                                                   channel=channel))
        finally:
            gen.cleanup()
    card_mpps = median([r["mpps"] for r in card_runs])
    bmv2_mpps = median([r["mpps"] for r in bmv2_runs])
    res = {"bmv2_mpps": bmv2_mpps, "bmv2_card_mpps": card_mpps,
           "ratio_card_bmv2": card_mpps / bmv2_mpps if bmv2_mpps else None,
           "bmv2_runs": bmv2_runs, "bmv2_card_runs": card_runs, "bmv2_versions": bmv2.tool_versions(),
           "bmv2_channel": channel, "bmv2_build": bmv2.build_info(bmv2.CHANNEL_SWITCH[channel]),
           "bmv2_pcap": pcap, "bmv2_seconds": seconds, "bmv2_repeats": repeats, "bmv2_warmup": warmup,
           "bmv2_setup": "same pcap, same path, one run: generator dpdk-testpmd io (net_pcap infinite_rx -> "
                         "net_af_packet, forwarding on CPU 1) -> veth -> DUT port 0, DUT port 1 -> veth -> "
                         "sink; DUT = embnic-dp -l 0 (net_af_packet, run to completion) or "
                         f"{bmv2.CHANNEL_SWITCH[channel]} programmed over {channel} "
                         "(every thread pinned to CPU 0), alternating; DUT veths' offloads off; rate = frames arriving at the sink "
                         f"over {seconds:g} s after {warmup:g} s, medians of {repeats}"}
    merge_json(out_dir / "bench.json", "dataplane", res, update=True)
    return res
