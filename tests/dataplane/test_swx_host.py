"""embnic-swx, the DPDK host of the P4 card for PNA, with a small hand-written SWX pipeline (no p4c-dpdk):
the spec → DPDK's codegen → ``gcc -shared`` → ``rte_swx_pipeline_build_from_lib`` path, the rx
pseudo-header (arrival time, frame length) before every frame, the tx pseudo-header cut off and
the frame cut to the length it gives, drops to the SWX drop port, tables and registers through
the control socket. Needs root (EAL), embnic-swx built and DPDK's pipeline headers
(scripts/dpdk-pipeline-headers.sh); skips in one line otherwise.
Run alone: sudo python3 -m pytest -q tests/dataplane/test_swx_host.py
"""
from __future__ import annotations

import os
import subprocess

import pytest

from embnic.control.targets.p4dpdk import swx as p4dpdk
from embnic.control.ctlsock import CtlCommandError
from embnic.control.targets.dpdk.process import DpdkProcess, eal_argv, remove_runtime_dir, unique_prefix
from embnic.control.ctlsock import CtlClient
from embnic.control.pcap import read_pcap, write_pcap

pytestmark = [pytest.mark.dataplane, pytest.mark.root]

#: port 0 forwards to the port its table entry names, with the frame's last 2 bytes cut; any other
#: port drops; per port the last frame length and the last arrival time land in registers
SPEC = """
struct rx_meta_h {
	bit<64> time_us
	bit<32> frame_len
	bit<32> reserved
}
struct tx_meta_h {
	bit<16> send_len
	bit<16> reserved
}
struct eth_h {
	bit<48> dst
	bit<48> src
	bit<16> type
}
struct fwd_arg_t {
	bit<32> port
}
struct meta_t {
	bit<32> port_in
	bit<32> port_out
	bit<32> len
}
metadata instanceof meta_t
header rx_meta instanceof rx_meta_h
header tx_meta instanceof tx_meta_h
header eth instanceof eth_h
regarray frame_len size 0x4 initval 0x0
regarray time_us size 0x1 initval 0x0
action fwd args instanceof fwd_arg_t {
	mov m.port_out t.port
	return
}
action drop_it args none {
	drop
	return
}
table by_port {
	key {
		m.port_in exact
	}
	actions {
		fwd
		drop_it
	}
	default_action drop_it args none
	size 0x10
}
apply {
	rx m.port_in
	extract h.rx_meta
	extract h.eth
	mov m.len h.rx_meta.frame_len
	regwr frame_len m.port_in m.len
	regwr time_us 0x0 h.rx_meta.time_us
	table by_port
	validate h.tx_meta
	mov h.tx_meta.send_len m.len
	sub h.tx_meta.send_len 0x2
	mov h.tx_meta.reserved 0x0
	emit h.tx_meta
	emit h.eth
	tx m.port_out
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("embnic-swx (DPDK's EAL) needs root")
    inc = p4dpdk.headers_dir()
    if not all((inc / h).is_file() for h in p4dpdk.INTERNAL_HEADERS):
        pytest.skip(f"DPDK's pipeline headers not in {inc}: run scripts/dpdk-pipeline-headers.sh")
    if not p4dpdk.SWX_BINARY.is_file():
        pytest.skip(f"{p4dpdk.SWX_BINARY} not built: make -C dataplane")
    d = tmp_path_factory.mktemp("swxhost")
    (d / "t.spec").write_text(SPEC)
    prefix = unique_prefix("g")
    try:
        r = subprocess.run([str(p4dpdk.SWX_BINARY), "-l", "0", "--no-huge", "--no-pci", "-m", "64", "--file-prefix",
                            prefix, "--log-level", "lib.eal:error", "--", "--codegen", str(d / "t.spec"),
                            str(d / "t.c")], capture_output=True, text=True, timeout=120)
    finally:
        remove_runtime_dir(prefix)
    assert r.returncode == 0, r.stdout + r.stderr
    cflags = subprocess.run(["pkg-config", "--cflags", "libdpdk"], capture_output=True, text=True).stdout.split()
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-w", f"-I{inc}", *cflags, "-DALLOW_EXPERIMENTAL_API",
                    str(d / "t.c"), "-o", str(d / "t.so")], check=True, timeout=300)
    return d / "t.so"


def frames(n: int, base: int) -> list[bytes]:
    return [bytes([i + 1]) * 6 + bytes(6) + b"\x08\x00" + bytes(range(base + i)) for i in range(n)]


@pytest.fixture(scope="module")
def run(lib, tmp_path_factory):
    d = tmp_path_factory.mktemp("swxrun")
    f0, f1 = frames(5, 50), frames(2, 60)
    write_pcap(d / "in0.pcap", f0)
    write_pcap(d / "in1.pcap", f1)
    vdevs = [f"net_pcap{p},rx_pcap={d}/in{p}.pcap,tx_pcap={d}/out{p}.pcap" for p in (0, 1)]
    proc = DpdkProcess(p4dpdk.SWX_BINARY, eal_argv("0", unique_prefix("h"), vdevs),
                       ["--pipeline", str(lib), "--ctl", str(d / "s.sock"), "--paused"], log=d / "swx.log")
    proc.start()
    ctl = CtlClient(d / "s.sock", timeout=10)
    try:
        proc.wait_ready(lambda: (d / "s.sock").exists() and ctl.alive(), 30)
        out = {"info": ctl.call("info")}
        ctl.call("table_add", table="by_port", entry="match 0x0 action fwd port 0x1")
        ctl.call("table_add", table="by_port", entry="match 0x2 action fwd port 0x0")
        ctl.call("table_delete", table="by_port", entry="match 0x2")
        out["dump"] = ctl.call("table_dump", table="by_port")["entries"]
        with pytest.raises(CtlCommandError, match="cannot read entry"):
            ctl.call("table_add", table="by_port", entry="match 0x0 action nope")
        with pytest.raises(CtlCommandError, match="no entry"):
            ctl.call("table_delete", table="by_port", entry="match 0x3")
        ctl.call("resume")
        import time

        deadline = time.monotonic() + 30
        while True:
            c = ctl.call("counters")
            if sum(p["tx_frames"] for p in c["ports"]) + c["pipeline_dropped"] >= len(f0) + len(f1):
                break
            assert time.monotonic() < deadline, c
            time.sleep(0.05)
        out["counters"] = c
        out["frame_len"] = ctl.call("reg_read", name="frame_len")["values"]
        out["time_us"] = ctl.call("reg_read", name="time_us", index=0, count=1)["values"]
        ctl.call("reg_clear", name="frame_len")
        out["cleared"] = ctl.call("reg_read", name="frame_len")["values"]
        ctl.call("quit")
        proc.proc.wait(10)
    finally:
        stopped = proc.stop()
    out.update(f0=f0, f1=f1, out0=[f for _, f in read_pcap(d / "out0.pcap")],
               out1=[f for _, f in read_pcap(d / "out1.pcap")], exit=stopped["exit"], log=proc.log())
    return out


def test_frames_forwarded_and_cut_to_the_pipelines_length(run):
    """Port 0's frames leave on port 1 without their last 2 bytes (the tx pseudo-header's send
    length), nothing else changed; port 1's are dropped by the pipeline; nothing leaves on port 0."""
    assert run["out1"] == [f[:-2] for f in run["f0"]]
    assert run["out0"] == []


def test_counters_account_for_every_frame(run):
    c = run["counters"]
    p0, p1 = c["ports"]
    assert (p0["rx_frames"], p1["rx_frames"]) == (5, 2)
    assert p0["rx_bytes"] == sum(len(f) for f in run["f0"])
    assert (p0["pipeline_in_frames"], p1["pipeline_in_frames"]) == (5, 2)
    assert p1["pipeline_out_frames"] == 5 and p1["tx_frames"] == 5 and c["pipeline_dropped"] == 2
    assert p1["tx_bytes"] == sum(len(f) - 2 for f in run["f0"])
    assert all(p[k] == 0 for p in (p0, p1) for k in ("rx_ring_full", "rx_no_headroom", "tx_full", "tx_bad_meta"))


def test_rx_pseudo_header_gives_length_and_time(run):
    """The pipeline saw each frame's length and a non-zero arrival time (µs since the start)."""
    assert run["frame_len"][:2] == [len(run["f0"][-1]), len(run["f1"][-1])]
    assert 0 < run["time_us"][0] < run["info"]["uptime_us"] + 60_000_000
    assert run["cleared"] == [0, 0, 0, 0]


def test_tables_by_entry_text(run):
    assert run["dump"] == ["match 0x0 action fwd port 0x1"]
    assert run["info"]["pipeline"]["tables"] == 1 and run["info"]["ports"][1]["name"] == "net_pcap1"


def test_quit_exits_cleanly(run):
    assert run["exit"] == 0, run["log"][-2000:]
    assert "embnic-swx: bye" in run["log"]
