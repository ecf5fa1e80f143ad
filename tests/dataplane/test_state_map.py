"""The card's message state map: states, per-direction frames/bytes, timestamps, expiry, bound.

All frames enter on one net_pcap port so their order through the card is fixed (the card does
not tie a peer to an ingress port); shards hang off a net_null port.
Run alone: sudo python3 -m pytest -q tests/dataplane/test_state_map.py
"""
from __future__ import annotations

import time

import pytest

from conformance import CardPort, Peer, Suite, write_pcap
from embnic.client_lib.consts import DType, MsgType, Status
from embnic.testbed.bench_dataplane import CardProcess, wait_drained

pytestmark = [pytest.mark.dataplane, pytest.mark.root]

C1 = Peer("client", 1, 0, "02:00:00:00:01:01", "10.2.0.2", 40001)
S0 = Peer("shard", 0, 1, "02:00:00:00:02:00", "10.2.1.10", 7878)
S1 = Peer("shard", 1, 1, "02:00:00:00:02:01", "10.2.1.11", 7878)
TIMEOUT_MS = 400


def _suite() -> Suite:
    # port 0 has no card address (--port-ip not given), so frames to any address are accepted
    return Suite([CardPort(0, "10.2.0.1"), CardPort(1, "10.2.1.1")], [C1], [S0, S1])


def _start(card_bin, tmp_path, frames: list[bytes], *args: str) -> tuple[CardProcess, Suite]:
    s = _suite()
    write_pcap(tmp_path / "in0.pcap", frames)
    vdevs = [f"net_pcap0,rx_pcap={tmp_path / 'in0.pcap'},tx_pcap={tmp_path / 'out0.pcap'}",
             "net_null0,no-rx=1"]
    card = CardProcess(card_bin, vdevs, lcores="0", port_ips={1: "10.2.1.1"},
                       args=["--paused", *args], log=tmp_path / "card.log")
    card.start()
    for p in [S0, S1, C1]:
        c = p.cmd()
        card.call(c.pop("cmd"), **c)
    return card, s


def _poll(card: CardProcess, pred, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        st = card.call("state_summary")
        if pred(st):
            return st
        assert time.monotonic() < deadline, f"state map never reached the expected state: {st}"
        time.sleep(0.05)


@pytest.fixture
def lifecycle(card_bin, tmp_path):
    s = _suite()
    L, LR, U, E = MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY, MsgType.UPDATE_REQ, MsgType.ERROR
    frames = []
    # A: 400-key lookup (3 fragments, 3200 bytes) answered by 5 reply fragments (6400 bytes)
    frames += s.message(C1, L, msg_id=11, client_id=1, shard_id=0, num_keys=400)
    frames += s.message(S0, LR, msg_id=11, client_id=1, shard_id=0, num_keys=400)
    # B: 2-fragment update, never acked -> forwarded
    frames += s.message(C1, U, msg_id=12, client_id=1, shard_id=1, num_keys=30, dim=16)
    # C: only the first fragment of a 250-key lookup -> receiving
    frames += s.message(C1, L, msg_id=13, client_id=1, shard_id=1, num_keys=250)[:1]
    # D: 1-key lookup answered with ERROR
    frames += s.message(C1, L, msg_id=14, client_id=1, shard_id=0, num_keys=1)
    frames += s.message(S0, E, msg_id=14, client_id=1, shard_id=0, num_keys=1, status=Status.NOT_OWNER)
    # a reply to a message the card never saw: forwarded, not tracked
    frames += s.message(S1, LR, msg_id=99, client_id=1, shard_id=1, num_keys=2, dtype=DType.FP16)
    t0 = time.time_ns()
    card, _ = _start(card_bin, tmp_path, frames, "--state-timeout-ms", str(TIMEOUT_MS))
    try:
        card.call("resume")
        c = wait_drained(card, len(frames))
        t1 = time.time_ns()
        dump = {e["msg_id"]: e for e in card.call("state_dump")["entries"]}
        summary = card.call("state_summary")
        yield {"card": card, "counters": c, "dump": dump, "summary": summary, "t0": t0, "t1": t1,
               "n": len(frames)}
    finally:
        card.stop()
        card.cleanup()


def test_states_after_drain(lifecycle):
    d, s = lifecycle["dump"], lifecycle["summary"]
    assert lifecycle["counters"]["drops"] == {k: 0 for k in lifecycle["counters"]["drops"]}
    assert set(d) == {11, 12, 13, 14}
    assert {k: v["state"] for k, v in d.items()} == {11: "answered", 12: "forwarded", 13: "receiving",
                                                      14: "answered"}
    assert s["entries"] == 4 and s["by_state"] == {"receiving": 1, "forwarded": 1, "answered": 2,
                                                   "expired": 0}


def test_frames_and_bytes_each_way(lifecycle):
    d = lifecycle["dump"]
    a, b, c, e = d[11], d[12], d[13], d[14]
    assert (a["frames_in"], a["bytes_in"], a["frames_out"], a["bytes_out"]) == (3, 3200, 5, 6400)
    assert (b["frames_in"], b["bytes_in"], b["frames_out"], b["bytes_out"]) == (2, 30 * (8 + 64), 0, 0)
    assert (c["frames_in"], c["bytes_in"], c["frames_out"]) == (1, 1432, 0)
    assert (e["frames_in"], e["bytes_in"], e["frames_out"], e["bytes_out"]) == (1, 8, 1, 0)
    assert (a["client"], a["shard"], a["table"], a["type"]) == (1, 0, 3, "LOOKUP_REQ")
    assert (b["shard"], b["type"]) == (1, "UPDATE_REQ")


def test_timestamps(lifecycle):
    """first_ns/last_ns are Unix time in ns, inside the run, first <= last."""
    slack = 50_000_000  # TSC-derived clock vs CLOCK_REALTIME
    for e in lifecycle["dump"].values():
        assert lifecycle["t0"] - slack <= e["first_ns"] <= e["last_ns"] <= lifecycle["t1"] + slack


def test_expiry(lifecycle):
    """Unanswered entries expire (counted); answered and expired entries are then removed."""
    card = lifecycle["card"]
    st = _poll(card, lambda s: s["expired"] == 2)
    assert st["by_state"]["receiving"] == 0 and st["by_state"]["forwarded"] == 0
    dump = {e["msg_id"]: e["state"] for e in card.call("state_dump")["entries"]}
    assert all(dump.get(m, "expired") == "expired" for m in (12, 13))
    _poll(card, lambda s: s["entries"] == 0)
    assert card.call("state_dump")["entries"] == []
    assert card.counters()["state"]["expired"] == 2


def test_reset_counters_keeps_state(lifecycle):
    card = lifecycle["card"]
    card.call("reset_counters")
    c = card.counters()
    assert all(p["rx_frames"] == 0 and p["tx_frames"] == 0 for p in c["ports"])
    assert c["ring"]["high_water"] == 0
    assert c["state"]["entries"] == lifecycle["summary"]["entries"]


def test_state_full_drops_and_counts(card_bin, tmp_path):
    """A full state map drops new requests (state_full) and counts the overflow; others pass."""
    s = _suite()
    n_msgs, size = 80, 64
    frames = [f for m in range(n_msgs) for f in
              s.message(C1, MsgType.LOOKUP_REQ, msg_id=1000 + m, client_id=1, shard_id=0, num_keys=1)]
    card, _ = _start(card_bin, tmp_path, frames, "--state-size", str(size))
    try:
        card.call("resume")
        c = wait_drained(card, len(frames))
        summary = card.call("state_summary")
    finally:
        card.stop()
        card.cleanup()
    assert summary["capacity"] == size
    assert summary["entries"] == size
    assert c["drops"]["state_full"] == n_msgs - size
    assert c["state"]["overflow"] == n_msgs - size
    assert c["types"]["LOOKUP_REQ"] == size
    assert c["mempool"]["in_use"] == 0
