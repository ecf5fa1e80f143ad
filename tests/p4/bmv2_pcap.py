"""Running frames through the P4 card on BMv2 from pcap files (``simple_switch --use-files``).

Used by the conformance and limits tests. No frame races the table entries: on the P4Runtime
channel (``simple_switch_grpc``) the switch starts with no program, the pipeline and the entries
come over P4Runtime while its file reader still waits; on the Thrift channel the entries are
programmed and saved by a first switch and a second one restores them and only then reads the
input files. :func:`run_pcap_files` waits until every frame passed and returns outputs, counters
and the state map.

    r = run_pcap_files(json_path, [(0, frame)], card_program(...), Path("/tmp/run"), nb_ports=2)
    r.outputs[1]   # frames the card sent on port 1
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Sequence

from embnic.control.targets.bmv2.switch import EGRESS_QUEUE_DEPTH, Bmv2Error, Netns, SimpleSwitch, choose_channel
from embnic.control.targets.bmv2.runtime import CardProgram, program_p4runtime, read_counters, read_state_map
from embnic.control.pcap import HEADER_LEN, read_pcap, write_pcap


def write_pcap_ordered(path: Path, frames: Sequence[tuple[int, bytes]]) -> None:
    """Classic pcap of ``frames`` = ``[(global position, frame bytes)]``; the timestamp of each
    frame is its position in microseconds (after 1 s), so BMv2's reader (which takes the earliest
    frame of all its input files first) feeds every port's frames in one global order."""
    write_pcap(path, [d for _, d in frames], times=[1 + pos / 1e6 for pos, _ in frames])


def read_pcap_frames(path: Path) -> list[bytes]:
    """Frames of a classic pcap file (what BMv2 writes; :func:`embnic.control.pcap.read_pcap`, the
    one reader); [] for a missing file or one shorter than its header (not written yet). A record
    being written is left out.

    Raises:
        ValueError: the file is not a classic pcap file.
    """
    try:
        if Path(path).stat().st_size < HEADER_LEN:
            return []
        return [frame for _, frame in read_pcap(path)]
    except FileNotFoundError:
        return []


@dataclasses.dataclass
class PcapRun:
    """What :func:`run_pcap_files` saw: output frames per port, counters, state map entries."""

    outputs: dict[int, list[bytes]]
    counters: dict
    state: list[dict]
    program_s: float  #: seconds to program the tables (Thrift: the first switch)
    run_s: float  #: seconds from the switch's start to the last output (Thrift: the second switch's)
    channel: str = "thrift"  #: how the tables were written: "p4runtime" or "thrift"


def _wait_all_passed(sw: SimpleSwitch, workdir: Path, nb_ports: int, shards: Sequence[int], n_frames: int,
                     expect_out: int | None, timeout: float) -> dict:
    """Wait until ``sw`` received all ``n_frames``, every frame its ingress accepted (forwarded or
    an ARP reply: one output each) was counted at egress (at least ``expect_out``) and all of those
    are in the output files; returns the counters then.

    Raises:
        Bmv2Error: not so within ``timeout`` s (the counters so far in the message).
    """
    deadline = time.monotonic() + timeout
    while True:
        c = read_counters(sw, nb_ports, shards)
        rx = sum(p["rx_frames"] for p in c["ports"])
        tx = sum(p["tx_frames"] for p in c["ports"])
        written = sum(len(read_pcap_frames(workdir / f"p{p}_out.pcap")) for p in range(nb_ports))
        accepted = sum(c["types"].values()) + c["arp"]["replies"]
        if rx == n_frames and written == tx == accepted and (expect_out is None or tx >= expect_out):
            return c
        if time.monotonic() > deadline:
            raise Bmv2Error(f"after {timeout:.0f} s {sw.binary} received {rx} of {n_frames} "
                            f"frames, accepted {accepted}, counted {tx} at egress and wrote {written} "
                            f"(want {expect_out}); log: {sw.log_file}")
        time.sleep(0.2)


def run_pcap_files(json_path: Path, frames: Sequence[tuple[int, bytes]], program: CardProgram | Sequence[str],
                   workdir: Path, *, nb_ports: int, shards: Sequence[int] = (), expect_out: int | None = None,
                   netns_name: str | None = None, timeout: float = 300.0, channel: str | None = None) -> PcapRun:
    """Feed ``frames`` (``[(ingress port, bytes)]``, in order) through the switch.

    ``program`` programs the card before any frame is read (module docstring): a
    :class:`~embnic.control.targets.bmv2.runtime.CardProgram`, or (Thrift only) runtime-CLI lines.
    ``channel``: ``p4runtime``, ``thrift`` or ``auto`` (None: :func:`~embnic.control.targets.bmv2.switch.choose_channel`).
    The frames are read from ``workdir/p<N>_in.pcap`` (``--use-files``) in their global order.
    Waits until every frame was received (``rx_frames``), every frame ingress accepted
    (``frames_by_type`` + ``arp_replies``: one output each) was counted at egress
    (``tx_frames``, at least ``expect_out`` if given) and is in the output files, then reads
    counters and the state map and stops the switch. The switches run in a fresh netns (lo only).

    Raises:
        Bmv2Error: a switch failed, a command or entry was refused, or the frames did not all
            pass within ``timeout`` s (the counters so far in the message).
        ValueError: CLI lines given for the P4Runtime channel; an unknown channel.
    """
    channel = choose_channel(channel)
    if channel == "p4runtime" and not isinstance(program, CardProgram):
        raise ValueError("the P4Runtime channel writes table entries, not CLI lines: pass a CardProgram")
    commands = program.cli_commands() if isinstance(program, CardProgram) else list(program)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    by_port: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(nb_ports)}
    for pos, (port, data) in enumerate(frames):
        by_port[port].append((pos, data))
    for p, fr in by_port.items():
        write_pcap_ordered(workdir / f"p{p}_in.pcap", fr)
        (workdir / f"p{p}_out.pcap").unlink(missing_ok=True)
    files = {p: str(workdir / f"p{p}") for p in range(nb_ports)}
    ns = Netns.create(netns_name or f"embnic-bmv2-{os.getpid()}")
    sockdir = None
    try:
        t0 = time.monotonic()
        if channel == "thrift":
            prog = SimpleSwitch(json_path, ns, {}, log=workdir / "program.log")
            prog.start()
            try:
                prog.wait_ready()
                prog.cli(commands)
                prog.save_state(workdir / "state.bmv2")
            finally:
                prog.stop()
        else:  # a short socket path (sun_path is 108 bytes; pytest's tmp paths are long)
            sockdir = Path(tempfile.mkdtemp(prefix="embnic-p4rt-"))
        program_s = time.monotonic() - t0
        # BMv2 drops at a full egress queue (64 frames by default) and reads pcap files as fast as
        # it can: the queues are made deep (and, over P4Runtime, the tables written) while the
        # reader still waits (--use-files WAIT); if that took longer than the wait, the run is
        # repeated with a longer one
        for wait in (3, 10, 30):
            t1 = time.monotonic()
            for p in range(nb_ports):
                (workdir / f"p{p}_out.pcap").unlink(missing_ok=True)
            if channel == "thrift":
                sw = SimpleSwitch(json_path, ns, files, log=workdir / "run.log", use_files=True, files_wait_s=wait,
                                  restore_state=workdir / "state.bmv2")
            else:
                (sockdir / "p4rt").unlink(missing_ok=True)
                sw = SimpleSwitch(None, ns, files, log=workdir / "run.log", use_files=True, files_wait_s=wait,
                                  grpc_addr=f"unix:{sockdir / 'p4rt'}")
            sw.start()
            try:
                sw.wait_ready()
                if channel == "thrift":
                    sw.cli([f"set_queue_depth {EGRESS_QUEUE_DEPTH}"])
                else:
                    program_s = program_p4runtime(sw, json_path, program)["seconds"]
            except BaseException:
                sw.stop()
                raise
            if time.monotonic() - t1 < wait - 0.2:
                break
            sw.stop()
        else:
            raise Bmv2Error(f"{sw.binary} took more than {wait} s to start and be programmed; log: {sw.log_file}")
        try:
            c = _wait_all_passed(sw, workdir, nb_ports, shards, len(frames), expect_out, timeout)
            run_s = time.monotonic() - t1
            state = read_state_map(sw)
        finally:
            sw.stop()
    finally:
        ns.delete()
        if sockdir is not None:
            shutil.rmtree(sockdir, ignore_errors=True)
    outputs = {p: read_pcap_frames(workdir / f"p{p}_out.pcap") for p in range(nb_ports)}
    return PcapRun(outputs, c, state, program_s, run_s, channel)
