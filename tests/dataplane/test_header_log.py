"""The card's forwarded-header log: ``ring_last`` on the control socket and ``embnic state ring``
on the dpdk target, against the real embnic-dp with every frame entering on one net_pcap port.

Each logged entry must equal the embnic header of a frame the card forwarded, newest first;
dropped frames are never logged; the log keeps the last 255 and says how many it ever logged.
Run alone: sudo python3 -m pytest -q tests/dataplane/test_header_log.py
"""
from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner
from scapy.layers.l2 import ARP, Ether

from conformance import CardPort, Peer, Suite, write_pcap
from embnic.client_lib.consts import DType, MsgType, Status
from embnic.client_lib.protocol import Embnic
from embnic.cli.main import cli
from embnic.control.targets.dpdk.process import CardProcess
from drain import wait_drained

pytestmark = [pytest.mark.dataplane, pytest.mark.root]

C1 = Peer("client", 1, 0, "02:00:00:00:01:01", "10.2.0.2", 40001)
# the shards hang off port 0 too, where their replies come in (the card takes a reply only from
# its shard's card port), so every frame leaves on port 0 (out0.pcap)
S0 = Peer("shard", 0, 0, "02:00:00:00:02:00", "10.2.0.10", 7878)
S1 = Peer("shard", 1, 0, "02:00:00:00:02:01", "10.2.0.11", 7878)
FIELDS = ("msg_type", "flags", "msg_id", "client_id", "shard_id", "num_tables", "table_id", "num_keys",
          "value_len", "msg_len", "frag_index", "frag_count", "frag_len", "status")
LOG_SIZE = 255  # the card's 256 slots less the one a write may be overwriting


def _expected(frame: bytes) -> dict:
    h = Ether(frame)[Embnic]
    return {f: int(getattr(h, f)) for f in FIELDS}


def _run(card_bin, tmp_path, frames: list[bytes], port_ips: dict[int, str] | None = None, state_lcores: int = 1):
    write_pcap(tmp_path / "in0.pcap", frames)
    vdevs = [f"net_pcap0,rx_pcap={tmp_path / 'in0.pcap'},tx_pcap={tmp_path / 'out0.pcap'}",
             "net_null0,no-rx=1"]
    card = CardProcess(card_bin, vdevs, lcores="0" if state_lcores == 1 else "0,1",
                       port_ips=port_ips or {1: "10.2.1.1"},
                       args=["--paused", "--state-lcores", str(state_lcores)], log=tmp_path / "card.log")
    card.start()
    for p in [S0, S1, C1]:
        c = p.cmd()
        card.call(c.pop("cmd"), **c)
    return card


@pytest.fixture
def mixed(card_bin, tmp_path):
    """Forwarded requests and replies of several shapes, with dropped frames between them."""
    s = Suite([CardPort(0, "10.2.0.1"), CardPort(1, "10.2.1.1")], [C1], [S0, S1])
    L, LR, U, E = MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY, MsgType.UPDATE_REQ, MsgType.ERROR
    frames, fwd = [], []

    def add(fs, forwarded=True):
        frames.extend(fs)
        if forwarded:
            fwd.extend(fs)

    add(s.message(C1, L, msg_id=11, client_id=1, shard_id=0, num_keys=400, table=5))
    add(s.message(S0, LR, msg_id=11, client_id=1, shard_id=0, num_keys=400, table=5))
    two = [(5, 4, DType.FP32, 20), (6, 8, DType.FP16, 30)]  # one message, two tables
    add(s.message(C1, L, msg_id=15, client_id=1, shard_id=1, tables=two))
    add(s.message(S1, LR, msg_id=15, client_id=1, shard_id=1, tables=two))
    add(s.message(C1, L, msg_id=77, client_id=9, shard_id=0, num_keys=3), forwarded=False)  # unknown client
    add(s.message(C1, U, msg_id=12, client_id=1, shard_id=1, num_keys=30, dim=16, flags=1))
    add(s.message(C1, L, msg_id=13, client_id=1, shard_id=4, num_keys=2), forwarded=False)  # no route
    add(s.message(C1, L, msg_id=14, client_id=1, shard_id=0, num_keys=1))
    add(s.message(S0, E, msg_id=14, client_id=1, shard_id=0, num_keys=1, status=Status.NOT_OWNER,
                  error_table=3))
    add(s.message(S1, LR, msg_id=99, client_id=1, shard_id=1, num_keys=2), forwarded=False)  # never asked
    t0 = time.time_ns()
    card = _run(card_bin, tmp_path, frames)
    try:
        card.call("resume")
        wait_drained(card, len(frames))
        yield {"card": card, "fwd": fwd, "t0": t0, "t1": time.time_ns()}
    finally:
        card.stop()
        card.cleanup()


def test_entries_equal_forwarded_frames(mixed):
    """Every forwarded frame's header, newest first, with ports and a time inside the run."""
    card, fwd = mixed["card"], mixed["fwd"]
    r = card.call("ring_last", last=LOG_SIZE)
    assert r["log_size"] == LOG_SIZE and r["logged"] == len(fwd)
    assert r["ring_count"] == 0 and r["ring_size"] > 0
    got = r["entries"]
    assert [{f: e[f] for f in FIELDS} for e in got] == [_expected(f) for f in reversed(fwd)]
    for e in got:
        assert e["ingress_port"] == 0 and e["egress_port"] == 0
        assert mixed["t0"] // 1000 - 1_000_000 <= e["time_us"] <= mixed["t1"] // 1000 + 1_000_000
        assert e["time_us"] == e["time_ns"] // 1000
    times = [e["time_ns"] for e in got]
    assert times == sorted(times, reverse=True)


def test_last_n_and_bad_argument(mixed):
    card, fwd = mixed["card"], mixed["fwd"]
    got = card.call("ring_last", last=3)["entries"]
    assert [{f: e[f] for f in FIELDS} for e in got] == [_expected(f) for f in reversed(fwd[-3:])]
    for bad in (0, LOG_SIZE + 1, "x"):
        with pytest.raises(Exception, match="last"):
            card.call("ring_last", last=bad)


def test_state_ring_cli_dpdk(mixed):
    """`embnic state ring --target dpdk` prints the same entries (JSON) and the bmv2 table."""
    card, fwd = mixed["card"], mixed["fwd"]
    run = CliRunner().invoke(cli, ["state", "ring", "--target", "dpdk", "--ctl", str(card.ctl_path),
                                   "--last", "4", "--json"])
    assert run.exit_code == 0, run.output
    got = json.loads(run.output)
    assert [{f: e[f] for f in FIELDS} for e in got] == [_expected(f) for f in reversed(fwd[-4:])]
    run = CliRunner().invoke(cli, ["state", "ring", "--target", "dpdk", "--ctl", str(card.ctl_path),
                                   "--last", "2"])
    assert run.exit_code == 0, run.output
    lines = run.output.splitlines()
    assert lines[0].split()[:3] == ["TYPE", "CLIENT", "MSG_ID"] and lines[-1] == "2 headers"
    assert lines[1].split()[:3] == ["ERROR", "1", "14"]


def test_log_wraps_keeps_newest(card_bin, tmp_path):
    """Past 255 forwarded frames the log keeps the newest 255 and counts every one."""
    s = Suite([CardPort(0, "10.2.0.1"), CardPort(1, "10.2.1.1")], [C1], [S0, S1])
    frames = []
    for i in range(300):
        frames += s.message(C1, MsgType.LOOKUP_REQ, msg_id=1000 + i, client_id=1, shard_id=i % 2,
                            tables=[(t, 4, DType.FP32, 1 + i % 7) for t in range(1 + i % 3)])
    card = _run(card_bin, tmp_path, frames)
    try:
        card.call("resume")
        wait_drained(card, len(frames))
        r = card.call("ring_last", last=LOG_SIZE)
        assert r["logged"] == len(frames)
        assert [{f: e[f] for f in FIELDS} for e in r["entries"]] == \
            [_expected(f) for f in reversed(frames[-LOG_SIZE:])]
    finally:
        card.stop()
        card.cleanup()


@pytest.mark.parametrize("state_lcores", [1, 2])
def test_waiting_headers_listed_then_forwarded(card_bin, tmp_path, state_lcores):
    """With the TX stage paused (``pause`` stage tx) accepted frames wait in the header ring:
    ``ring_last`` lists their headers (``in_ring``, newest first; the ARP request that waits
    with them is counted, not listed) and ``embnic state ring`` marks them; once the TX stage
    resumes they are forwarded and listed as such, and nothing waits. With 2 state lcores the
    frames wait in two header rings (one per partition), listed together in arrival order; the
    two lcores forward in their own time, so the forwarded log holds them in some order."""
    s = Suite([CardPort(0, "10.2.0.1"), CardPort(1, "10.2.1.1")], [C1], [S0, S1])
    frames = []
    for i in range(12):
        frames += s.message(C1, MsgType.LOOKUP_REQ, msg_id=500 + i, client_id=1, shard_id=i % 2,
                            num_keys=1 + i, table=i % 4)
    arp = bytes(Ether(src=C1.mac, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=C1.mac, psrc=C1.ip, pdst="10.2.0.1"))
    frames.insert(5, arp)
    msgs = [f for f in frames if f != arp]
    card = _run(card_bin, tmp_path, frames, {0: "10.2.0.1", 1: "10.2.1.1"}, state_lcores)  # port 0 answers ARP
    try:
        card.call("pause", stage="tx")
        with pytest.raises(Exception, match="stage"):
            card.call("pause", stage="both")
        info = card.call("info")
        assert info["tx_paused"] is True and info["paused"] is True  # the card starts --paused (RX)
        card.call("resume", stage="rx")  # RX alone runs
        deadline = time.monotonic() + 30
        while sum(p["rx_frames"] for p in card.counters()["ports"]) < len(frames):
            assert time.monotonic() < deadline, "the card did not receive every frame"
            time.sleep(0.05)
        r = card.call("ring_last", last=LOG_SIZE)
        assert r["ring_count"] == len(frames) == r["in_ring_count"]
        assert [{f: e[f] for f in FIELDS} for e in r["in_ring"]] == [_expected(f) for f in reversed(msgs)]
        assert all(e["ingress_port"] == 0 and "egress_port" not in e for e in r["in_ring"])
        assert r["entries"] == [] and r["logged"] == 0
        assert [e["msg_id"] for e in card.call("ring_last", last=3)["in_ring"]] == [511, 510, 509]
        run = CliRunner().invoke(cli, ["state", "ring", "--target", "dpdk", "--ctl", str(card.ctl_path),
                                       "--last", "2"])
        assert run.exit_code == 0, run.output
        lines = run.output.splitlines()
        assert lines[0].split()[-1] == "AT" and [ln.split()[-1] for ln in lines[1:3]] == ["ring", "ring"]
        assert lines[-1] == "2 headers (2 waiting in the header ring)"

        card.call("resume")
        wait_drained(card, len(frames))
        r = card.call("ring_last", last=LOG_SIZE)
        assert r["in_ring"] == [] and r["in_ring_count"] == 0 == r["ring_count"]
        got = [{f: e[f] for f in FIELDS} for e in r["entries"]]
        if state_lcores > 1:  # each lcore's own log is in its order; the merge is by TX time
            key = lambda e: e["msg_id"]  # noqa: E731
            assert sorted(got, key=key) == sorted((_expected(f) for f in msgs), key=key)
            assert {e["lcore"] for e in r["entries"]} == set(card.call("info")["state_lcore_ids"])
            return
        assert got == [_expected(f) for f in reversed(msgs)]
        run = CliRunner().invoke(cli, ["state", "ring", "--target", "dpdk", "--ctl", str(card.ctl_path),
                                       "--last", "1", "--json"])
        got = json.loads(run.output)
        assert [(e["msg_id"], e["in_ring"]) for e in got] == [(511, False)]
    finally:
        card.stop()
        card.cleanup()
