"""The state map partitioned over state lcores: a message's request and reply meet on one partition.

The RX stage steers every frame to the state lcore that owns the partition of its (client id,
message id) (``embnic_partition`` in ``dataplane/include/embnic_dp.h``: CRC32C of
``client_id << 32 | msg_id`` seeded with ``EMBNIC_PART_SEED``, reduced by multiply-shift). A
request and its reply come from different 5-tuples (client ip:port vs shard ip:port), so RSS or
af_packet fanout would split them; here 64 messages from two clients to two shards (some of 3
request and 5 reply fragments) send their requests first and the replies of 48 of them after,
all on one ingress port (so each reply follows its request), where every client and shard hangs
(the card takes a frame only from its sender's card port) and everything leaves. Checked, with 1
and with 2 state lcores (``-l 0,1``; state lcore 1 hands its frames to the RX lcore, net_pcap
having one TX queue): the 48
answered messages complete and their entries are freed; the 16 left
sit in the partition this file's own CRC32C predicts (``state_dump``), per partition as
``state_summary`` counts them; each partition completed the messages predicted for it; and the
counters summed over lcores equal the frames sent (received, forwarded by type, no drop).

Run alone: sudo python3 -m pytest -q tests/dataplane/test_partitions.py
"""
from __future__ import annotations

import collections

import pytest

from conformance import CardPort, Peer, Suite, write_pcap
from embnic.client_lib.consts import MsgType
from embnic.control.targets.dpdk.process import CardProcess
from drain import wait_drained

pytestmark = [pytest.mark.dataplane, pytest.mark.root]

C1 = Peer("client", 1, 0, "02:00:00:00:01:01", "10.3.0.2", 40001)
C2 = Peer("client", 2, 0, "02:00:00:00:01:01", "10.3.0.2", 40002)   # same host as client 1
S0 = Peer("shard", 0, 0, "02:00:00:00:02:00", "10.3.0.10", 7878)
S1 = Peer("shard", 1, 0, "02:00:00:00:02:01", "10.3.0.11", 7979)
PART_SEED = 0x9E3779B9  #: EMBNIC_PART_SEED
N_MSGS, N_ANSWERED = 64, 48


def _crc32c_table() -> list[int]:
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_T = _crc32c_table()


def partition(client_id: int, msg_id: int, n: int) -> int:
    """The card's ``embnic_partition``: CRC32C (SSE4.2 ``crc32q``: no inversion) of the 8
    little-endian bytes of ``client_id << 32 | msg_id`` from ``PART_SEED``, times ``n``, >> 32."""
    crc = PART_SEED
    for b in ((client_id << 32) | msg_id).to_bytes(8, "little"):
        crc = _T[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return (crc * n) >> 32


def _messages() -> list[dict]:
    out = []
    for i in range(N_MSGS):
        c, s = (C1, C2)[i % 2], (S0, S1)[(i // 2) % 2]
        out.append({"client": c, "shard": s, "msg_id": 5000 + 7 * i, "num_keys": 400 if i % 8 == 3 else 1 + i % 5,
                    "answered": i < N_ANSWERED})
    return out


@pytest.fixture(scope="module", params=[1, 2], ids=["1_state_lcore", "2_state_lcores"])
def run(request, card_bin, tmp_path_factory):
    n = request.param
    d = tmp_path_factory.mktemp("part")
    s = Suite([CardPort(0, "10.3.0.1"), CardPort(1, "10.3.1.1")], [C1, C2], [S0, S1])
    msgs = _messages()
    L, LR = MsgType.LOOKUP_REQ, MsgType.LOOKUP_REPLY
    reqs, reps = [], []
    for m in msgs:
        kw = dict(msg_id=m["msg_id"], client_id=m["client"].id, shard_id=m["shard"].id, num_keys=m["num_keys"])
        reqs += s.message(m["client"], L, **kw)
        if m["answered"]:
            reps += s.message(m["shard"], LR, **kw)
    frames = reqs + reps
    write_pcap(d / "in0.pcap", frames)
    # every frame enters on port 0 (no card address there: any destination is taken), where the
    # clients and shards hang (the card takes a frame only from its sender's card port) and
    # everything leaves; port 1 (net_null) is not used
    vdevs = [f"net_pcap0,rx_pcap={d / 'in0.pcap'},tx_pcap={d / 'out0.pcap'}", "net_null0,no-rx=1"]
    card = CardProcess(card_bin, vdevs, lcores="0,1" if n > 1 else "0", port_ips={1: "10.3.1.1"},
                       args=["--paused", "--state-lcores", str(n)], log=d / "card.log")
    card.start()
    try:
        for p in (S0, S1, C1, C2):
            c = p.cmd()
            card.call(c.pop("cmd"), **c)
        card.call("resume")
        counters = wait_drained(card, len(frames), mbufs_back=True)  # lcore 1 counts, then frees
        summary = card.call("state_summary")
        dump = card.call("state_dump")["entries"]
        info = card.call("info")
    finally:
        rc = card.stop()
    card.cleanup()
    return {"n": n, "msgs": msgs, "frames": frames, "n_req": len(reqs), "n_rep": len(reps), "counters": counters,
            "summary": summary, "dump": dump, "info": info, "rc": rc}


def test_both_partitions_are_exercised():
    """The chosen ids spread over both partitions, answered and unanswered alike (else the test
    below would prove nothing)."""
    for answered in (True, False):
        parts = collections.Counter(partition(m["client"].id, m["msg_id"], 2) for m in _messages()
                                    if m["answered"] == answered)
        assert set(parts) == {0, 1}, parts


def test_unanswered_entries_sit_in_their_partition(run):
    n = run["n"]
    want = {(m["client"].id, m["msg_id"]): partition(m["client"].id, m["msg_id"], n)
            for m in run["msgs"] if not m["answered"]}
    got = {(e["client"], e["msg_id"]): e["partition"] for e in run["dump"]}
    assert got == want
    assert all(e["state"] == "forwarded" for e in run["dump"])
    per = collections.Counter(want.values())
    assert [(p["partition"], p["entries"]) for p in run["summary"]["by_partition"]] == [
        (k, per.get(k, 0)) for k in range(n)]
    assert run["summary"]["entries"] == N_MSGS - N_ANSWERED and run["summary"]["partitions"] == n
    assert [p["lcore"] for p in run["summary"]["by_partition"]] == run["info"]["state_lcore_ids"]


def test_request_and_reply_meet_and_complete(run):
    """Every answered message completed, on the partition of its ids, whatever its 5-tuples."""
    n = run["n"]
    per = collections.Counter(partition(m["client"].id, m["msg_id"], n) for m in run["msgs"] if m["answered"])
    assert [p["completed_since_start"] for p in run["summary"]["by_partition"]] == [per.get(k, 0)
                                                                                    for k in range(n)]
    c = run["counters"]
    assert c["completed"]["LOOKUP_REPLY"] == N_ANSWERED
    assert sum(s["LOOKUP_REPLY"] for s in c["shards"]) == N_ANSWERED
    assert sum(v for v in c["completed"].values()) == N_ANSWERED
    assert c["state"]["overflow"] == 0 and c["state"]["expired"] == 0


def test_counters_sum_to_frames_sent(run):
    """Summed over the lcores: every frame received, forwarded by type, none dropped, no mbuf left."""
    c = run["counters"]
    assert [p["rx_frames"] for p in c["ports"]] == [len(run["frames"]), 0]
    assert [p["tx_frames"] for p in c["ports"]] == [len(run["frames"]), 0]
    assert [p["tx_bytes"] for p in c["ports"]] == [sum(len(f) for f in run["frames"]), 0]
    assert {k: v for k, v in c["types"].items() if v} == {"LOOKUP_REQ": run["n_req"], "LOOKUP_REPLY": run["n_rep"]}
    assert {k: v for k, v in c["drops"].items() if v} == {}
    assert c["mempool"]["in_use"] == 0 and c["ring"]["count"] == 0 and c["ring"]["rings"] == run["n"]
    assert run["info"]["mode"] == ("partitioned" if run["n"] > 1 else "run_to_completion")
    # net_pcap has one TX queue: state lcore 1 hands its frames for port 0, where everything
    # leaves, to the RX lcore; net_null would give it a queue of its own on port 1
    assert [p["tx_queues"] for p in run["info"]["ports"]] == ([1, 2] if run["n"] > 1 else [1, 1])
    assert run["rc"] == 0
