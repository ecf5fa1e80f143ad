"""The card's message state map: states, per-direction frames/bytes, timestamps, expiry, bound.

All frames enter on one net_pcap port so their order through the card is fixed: the client and
the shards all hang off it (the card takes a frame only from the card port its sender's entry
names, else ``wrong_port``), and the card sends back on it (to out0.pcap); port 1 (net_null) is
not used.
Run alone: sudo python3 -m pytest -q tests/dataplane/test_state_map.py
"""
from __future__ import annotations

import time

import pytest

from conformance import CardPort, Peer, Suite, write_pcap
from embnic.client_lib.consts import DType, MsgType, Status
from embnic.control.targets.dpdk.process import CardProcess
from drain import wait_drained

pytestmark = [pytest.mark.dataplane, pytest.mark.root]

C1 = Peer("client", 1, 0, "02:00:00:00:01:01", "10.2.0.2", 40001)
S0 = Peer("shard", 0, 0, "02:00:00:00:02:00", "10.2.0.10", 7878)
S1 = Peer("shard", 1, 0, "02:00:00:00:02:01", "10.2.0.11", 7878)
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
    # A: 400-key lookup (3 fragments, 16 + 3200 bytes) answered by 5 reply fragments -> freed
    frames += s.message(C1, L, msg_id=11, client_id=1, shard_id=0, num_keys=400)
    frames += s.message(S0, LR, msg_id=11, client_id=1, shard_id=0, num_keys=400)
    # B: 2-fragment update of 2 tables, never acked -> forwarded
    frames += s.message(C1, U, msg_id=12, client_id=1, shard_id=1,
                        tables=[(3, 16, DType.FP32, 20), (8, 16, DType.FP16, 10)])
    # C: only the first fragment of a 250-key lookup -> receiving
    frames += s.message(C1, L, msg_id=13, client_id=1, shard_id=1, num_keys=250)[:1]
    # D: 1-key lookup answered with ERROR -> freed
    frames += s.message(C1, L, msg_id=14, client_id=1, shard_id=0, num_keys=1)
    frames += s.message(S0, E, msg_id=14, client_id=1, shard_id=0, num_keys=1, status=Status.NOT_OWNER)
    # E: 3-fragment lookup whose fragment 0 arrives twice and fragment 2 never -> receiving
    frames += s.message(C1, L, msg_id=15, client_id=1, shard_id=0, num_keys=400, only=[0, 0, 1])
    # F: 400-key lookup with 2 of its 5 reply fragments -> replying
    frames += s.message(C1, L, msg_id=16, client_id=1, shard_id=0, num_keys=400)
    frames += s.message(S0, LR, msg_id=16, client_id=1, shard_id=0, num_keys=400, only=[3, 1])
    # a reply to a message the card never saw: dropped, not tracked
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
    """Answered messages left the map; the rest are in the state their frames say."""
    d, s, c = lifecycle["dump"], lifecycle["summary"], lifecycle["counters"]
    assert {k: v for k, v in c["drops"].items() if v} == {"unsolicited_reply": 1}
    assert {k: v["state"] for k, v in d.items()} == {12: "forwarded", 13: "receiving", 15: "receiving",
                                                      16: "replying"}
    assert s["entries"] == 4 and s["by_state"] == {"receiving": 2, "forwarded": 1, "replying": 1}


def test_fragments_tracked_not_counted(lifecycle):
    """Frames count duplicates; fragments and bytes count each fragment once (never > msg_len)."""
    d = lifecycle["dump"]
    b, c, e, f = d[12], d[13], d[15], d[16]
    b_len = 2 * 16 + 30 * 8 + 20 * 64 + 10 * 32  # directory, keys, gradients: 1872 bytes
    assert (b["frags_in"], b["frag_count"], b["frames_in"], b["bytes_in"], b["msg_len"]) == (
        2, 2, 2, b_len, b_len)
    assert (c["frags_in"], c["frag_count"], c["frames_in"], c["bytes_in"]) == (1, 2, 1, 1428)
    assert (e["frags_in"], e["frag_count"], e["frames_in"], e["bytes_in"], e["msg_len"]) == (
        2, 3, 3, 2 * 1428, 3216)
    assert (f["frags_in"], f["frames_in"], f["bytes_in"]) == (3, 3, 3216)
    assert (f["reply_type"], f["reply_frag_count"], f["frags_out"], f["frames_out"], f["bytes_out"]) == (
        "LOOKUP_REPLY", 5, 2, 2, 2 * 1428)
    assert (b["client"], b["shard"], b["type"], b["reply_type"]) == (1, 1, "UPDATE_REQ", None)
    # what the card records of a request's v2 header (its reply's length is checked against value_len)
    assert (b["num_tables"], b["num_keys"], b["value_len"]) == (2, 30, 20 * 64 + 10 * 32)
    assert (f["num_tables"], f["num_keys"], f["value_len"], f["msg_len"]) == (1, 400, 400 * 16, 3216)


def test_completed_and_latency(lifecycle):
    """What answered messages leave behind: completed by reply type, per shard, with latencies."""
    c = lifecycle["counters"]
    assert c["completed"] == {"LOOKUP_REPLY": 1, "UPDATE_ACK": 0, "ERROR": 1, "SIZE_ACK": 0, "UPDATE_NACK": 0}
    shards = {s["shard"]: s for s in c["shards"]}
    assert set(shards) == {0, 1}
    s0 = shards[0]
    assert (s0["LOOKUP_REPLY"], s0["ERROR"], s0["UPDATE_ACK"], s0["expired"]) == (1, 1, 0, 0)
    assert sum(s0["latency_hist"]) == 2 and len(s0["latency_hist"]) == 24
    # both answered within the run (a request and its reply in one burst share a TSC: 0 ns)
    assert 0 <= s0["latency_sum_ns"] <= lifecycle["t1"] - lifecycle["t0"]
    assert sum(shards[1]["latency_hist"]) == 0


def test_timestamps(lifecycle):
    """first_ns/last_ns are Unix time in ns, inside the run, first <= last."""
    slack = 50_000_000  # TSC-derived clock vs CLOCK_REALTIME
    for e in lifecycle["dump"].values():
        assert lifecycle["t0"] - slack <= e["first_ns"] <= e["last_ns"] <= lifecycle["t1"] + slack


def test_expiry(lifecycle):
    """Entries idle for the timeout are freed and counted as expired, overall and per shard."""
    card = lifecycle["card"]
    st = _poll(card, lambda s: s["entries"] == 0)
    assert st["expired"] == 4 and st["by_state"] == {"receiving": 0, "forwarded": 0, "replying": 0}
    assert card.call("state_dump")["entries"] == []
    c = card.counters()
    assert c["state"]["expired"] == 4
    assert {s["shard"]: s["expired"] for s in c["shards"]} == {0: 2, 1: 2}


def test_reset_counters_keeps_state(lifecycle):
    card = lifecycle["card"]
    card.call("reset_counters")
    c = card.counters()
    assert all(p["rx_frames"] == 0 and p["tx_frames"] == 0 for p in c["ports"])
    assert c["ring"]["high_water"] == 0
    assert c["state"]["entries"] == lifecycle["summary"]["entries"]
    assert sum(c["completed"].values()) == 0
    assert all(sum(s["latency_hist"]) == 0 and s["LOOKUP_REPLY"] == 0 for s in c["shards"])


def test_error_before_the_whole_request_leaves_the_entry_answered(card_bin, tmp_path):
    """A shard refusing a 3-fragment lookup at fragment 0 (its ERROR passes before fragments 1
    and 2): the message is completed, the entry stays replying with its whole reply passed
    (answered: waiting for fragments 1 and 2, which would open no new entry; conformance covers
    them); a second ERROR is unsolicited_reply; when the rest never comes it expires."""
    s = _suite()
    L, E = MsgType.LOOKUP_REQ, MsgType.ERROR
    kw = dict(msg_id=21, client_id=1, shard_id=0, num_keys=400)
    frames = s.message(C1, L, only=[0], **kw) + s.message(S0, E, status=Status.MALFORMED, **kw) * 2
    card, _ = _start(card_bin, tmp_path, frames, "--state-timeout-ms", str(TIMEOUT_MS))
    try:
        card.call("resume")
        c = wait_drained(card, len(frames))
        (e,) = card.call("state_dump")["entries"]
        assert (e["msg_id"], e["state"], e["frags_in"], e["frag_count"]) == (21, "replying", 1, 3)
        assert (e["reply_type"], e["frags_out"], e["reply_frag_count"]) == ("ERROR", 1, 1)
        assert c["completed"]["ERROR"] == 1
        assert {k: v for k, v in c["drops"].items() if v} == {"unsolicited_reply": 1}
        st = _poll(card, lambda x: x["entries"] == 0)
        assert st["expired"] == 1
    finally:
        card.stop()
        card.cleanup()


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


def test_capacity_is_messages_in_flight(card_bin, tmp_path):
    """Answered messages free their entry at once: 1000 messages, 8 in flight at a time, pass a
    64-entry map with no state_full, and leave it empty."""
    s = _suite()
    L, LR = MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY
    frames = []
    for w in range(0, 1000, 8):
        ids = range(5000 + w, 5008 + w)
        frames += [f for m in ids for f in s.message(C1, L, msg_id=m, client_id=1, shard_id=0, num_keys=1)]
        frames += [f for m in ids for f in s.message(S0, LR, msg_id=m, client_id=1, shard_id=0, num_keys=1)]
    card, _ = _start(card_bin, tmp_path, frames, "--state-size", "64")
    try:
        card.call("resume")
        c = wait_drained(card, len(frames))
        summary = card.call("state_summary")
    finally:
        card.stop()
        card.cleanup()
    assert c["drops"]["state_full"] == 0 and sum(c["drops"].values()) == 0
    assert c["completed"]["LOOKUP_REPLY"] == 1000
    assert summary["entries"] == 0
