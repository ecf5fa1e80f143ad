"""Trace record → replay through the card: every recorded request gets its reply.

Run alone: python3 -m pytest -q tests/testbed/test_trace.py   (needs root, DPDK and tcpreplay)
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from tbutil import TESTBED_TOML, assert_gone, build_dataplane, embnic_drops, cleanup, needs_root, run_dir, tb_name  # noqa: F401

BATCHES = 2

TCPREPLAY_OUT = """Actual: 457 packets (401602 bytes) sent in 0.456003 seconds
Rated: 880700.3 Bps, 7.04 Mbps, 1002.18 pps
Flows: 1 flows, 2.19 fps, 457 unique flow packets, 0 unique non-flow packets
Statistics for network device: qa
\tSuccessful packets:        457
\tFailed packets:            0
"""


def _frame(payload: bytes, outgoing: bool, client_ip="10.77.0.2", card_ip="10.77.0.1", port=7878) -> bytes:
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    if outgoing:
        p = Ether(src="02:ee:01:00:00:01", dst="02:ee:00:00:00:00") / IP(src=client_ip, dst=card_ip) / \
            UDP(sport=40000, dport=port) / payload
    else:
        p = Ether(src="02:ee:00:00:00:00", dst="02:ee:01:00:00:01") / IP(src=card_ip, dst=client_ip) / \
            UDP(sport=7878, dport=40000) / payload
    return bytes(p)


def _lookup(msg_id, keys=3, mtu=1500):
    import numpy as np

    from embnic.client_lib import codec

    return codec.encode_lookup(msg_id=msg_id, client_id=1, shard_id=1, keys=np.arange(keys, dtype=np.uint64),
                               mtu=mtu, directory=codec.make_directory([0], [8], [1], [keys]))


def test_trace_helpers_parse_group_and_match(tmp_path):
    import numpy as np

    from embnic.client_lib import codec
    from embnic.client_lib.consts import MsgType
    from embnic.testbed.traces import trace as TR

    assert TR._parse_tcpreplay(TCPREPLAY_OUT) == {"packets": 457, "bytes": 401602, "seconds": 0.456003,
                                                   "pps": 1002.18, "failed": 0}
    # requests: a 1-fragment lookup, a 3-fragment lookup, an update; plus a non-embnic frame
    reqs_frames = _lookup(1) + _lookup(2, keys=400) + codec.encode_update(
        msg_id=3, client_id=1, shard_id=0, keys=np.arange(2, dtype=np.uint64),
        directory=codec.make_directory([0], [8], [1], [2]), values=np.ones((2, 8), np.float32).tobytes())
    frames = [(i * 1e-3, _frame(p, True)) for i, p in enumerate(reqs_frames)]
    frames.append((1.0, _frame(b"not embnic", True, port=53)))
    assert TR.udp_payload(frames[0][1])[:2] == (40000, 7878)
    p = tmp_path / "t.pcap"
    from embnic.control.pcap import write_pcap

    write_pcap(p, [f for _, f in frames], times=[t for t, _ in frames])
    back = TR.read_pcap(p)
    assert [f for _, f in back] == [f for _, f in frames]
    assert abs(back[1][0] - 1e-3) < 1e-6
    reqs, per_client, other = TR.parse_requests(back)
    assert other == 1 and list(per_client) == [1] and len(per_client[1]) == 5
    assert {k: (v["type"], v["frag_count"], len(v["frags"])) for k, v in reqs.items()} == {
        (1, 1): (MsgType.LOOKUP_REQ, 1, 1), (1, 2): (MsgType.LOOKUP_REQ, 3, 3), (1, 3): (MsgType.UPDATE_REQ, 1, 1)}

    # replies: msg 2's reply fragments out of order and one duplicated; msg 3 acked; msg 1 gets
    # nothing; a reply for an unknown msg_id is counted as unexpected
    t = TR._ReplyTracker(1, reqs)
    for i, (ts, f) in enumerate(frames[:5]):
        t.feed((int(ts * 1e9), True, f))
    h2 = codec.parse_header(reqs_frames[1])
    rows = np.zeros((400, 8), np.float32).tobytes()
    reply2 = codec.encode_reply(h2, MsgType.LOOKUP_REPLY, shard_id=1, body=rows)
    assert len(reply2) > 2
    h3 = codec.parse_header(reqs_frames[-1])
    ack3 = codec.encode_reply(h3, MsgType.UPDATE_ACK, shard_id=0)
    stray = codec.encode_reply(codec.parse_header(_lookup(99)[0]), MsgType.LOOKUP_REPLY, shard_id=1,
                               body=np.zeros((3, 8), np.float32).tobytes())
    rev = reply2[::-1]  # last fragment first
    order = rev[:-1] + [rev[0], ack3[0], stray[0], rev[-1]]  # one duplicate; fragment 0 completes it
    for j, pl in enumerate(order):
        t.feed((10_000_000 + j * 1_000_000, False, _frame(pl, False)))
    assert set(t.done) == {2, 3} and t.unexpected == 1 and t.sent_frames == 5
    assert t.done[2][1] == MsgType.LOOKUP_REPLY and t.done[3][1] == MsgType.UPDATE_ACK
    # latency of msg 2: the reply fragment that completed it - the first request fragment (t=1 ms)
    assert t.done[2][0] - t.first_sent[2] == (10 + len(order) - 1) * 1_000_000 - 1_000_000
    assert t.reasm.stats["duplicates"] == 1


@needs_root
def test_record_then_replay_answers_every_request(run_dir, tmp_path, cleanup):  # noqa: F811
    if shutil.which("tcpreplay") is None:
        pytest.fail("tcpreplay is not installed: scripts/install-deps.sh installs it (scripts/apt-packages.txt)")
    build_dataplane()
    env = dict(os.environ, EMBNIC_RUN_DIR=str(run_dir))
    pcap = tmp_path / "t.pcap"
    rec_name, rpl_name = tb_name("r"), tb_name("p")
    cleanup += [rec_name, rpl_name]
    r = subprocess.run([sys.executable, "-m", "embnic", "trace", "record", "-c", str(TESTBED_TOML), "--batches",
                        str(BATCHES), "--batch-size", "128", "--out", str(pcap), "--name", rec_name,
                        "--no-progress"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_gone(rec_name)
    side = json.loads(pcap.with_suffix(".json").read_text())
    assert side["format"] == "embnic-trace/1" and side["batches"] == BATCHES and side["clients"] == [1, 2]
    # two rounds per batch (lookups, updates), one message per (shard, table) that has ids, and the
    # clients' tail probes (one-key lookups after a shard's last message of a round)
    probes = sum(s["probes"] for s in side["client_stats"].values())
    assert probes > 0
    assert side["messages_by_type"]["LOOKUP_REQ"] - probes == side["messages_by_type"]["UPDATE_REQ"] > 0
    assert side["frames"] >= side["messages"] and side["incomplete_messages"] == 0

    # Scapy dissects the recording down to the Embnic layer
    from scapy.utils import rdpcap

    from embnic.client_lib.protocol import Embnic

    pkts = rdpcap(str(pcap))
    assert len(pkts) == side["frames"]
    emb = [p[Embnic] for p in pkts if Embnic in p]
    assert len(emb) == len(pkts)
    assert {int(e.client_id) for e in emb} == {1, 2} and {int(e.msg_type) for e in emb} == {1, 3}
    assert len({(int(e.client_id), int(e.msg_id)) for e in emb}) == side["messages"]

    out = tmp_path / "replay"
    r = subprocess.run([sys.executable, "-m", "embnic", "replay", str(pcap), "-c", str(TESTBED_TOML), "--rate",
                        "2000", "--out", str(out), "--name", rpl_name, "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["requests"] == side["messages"]
    assert rep["messages_completed"] == rep["requests"] and rep["all_replied"] is True
    assert rep["drops"]["no_reply"] == 0 and rep["missing"] == []
    assert rep["replies_per_client"] == {str(c): v["messages"] for c, v in side["by_client"].items()}
    assert rep["frames_sent"] == side["frames"] and rep["frames_per_s"] > 0
    assert rep["reply_types"].get("LOOKUP_REPLY", 0) + rep["reply_types"].get("ERROR", 0) == \
        side["messages_by_type"]["LOOKUP_REQ"]
    assert rep["reply_types"]["UPDATE_ACK"] == side["messages_by_type"]["UPDATE_REQ"]
    assert rep["lookup_latency_us"]["n"] == side["messages_by_type"]["LOOKUP_REQ"]
    fbt = rep["card"]["frames_by_type"]
    assert fbt["LOOKUP_REQ"] + fbt["UPDATE_REQ"] == side["frames"]
    # nothing dropped, except that a request the recording holds twice (a client's retransmission)
    # is answered twice, and the second answer is unsolicited once the first freed the entry
    card_drops = embnic_drops(rep["drops"]["card"])
    assert sum(card_drops.values()) == card_drops["unsolicited_reply"], card_drops
    assert card_drops["unsolicited_reply"] == 0 or side["retransmits"] > 0, (card_drops, side["retransmits"])
    assert rep["frames_lost"] == {"client_to_card": {"1": 0, "2": 0}, "card_to_client": {"1": 0, "2": 0}}
    assert rep["capture_drops"] == {"1": 0, "2": 0}
    assert "types" not in rep["card"]
    sm = rep["card"]["messages_in_state_map"]  # answered messages leave the map at once
    assert sm["entries"] == 0, sm
    done = sum(rep["card"]["messages_completed"].values())  # the replayed messages (+ readiness probes)
    assert side["messages"] <= done <= side["messages"] + side["retransmits"] + 4, rep["card"]["messages_completed"]
    assert sum(sum(s["latency_hist"]) for s in rep["card"]["latency_by_shard"]) == done
    assert rep["config_check"] == {"recorded_with": str(TESTBED_TOML.resolve()), "match": True,
                                   "compared": "digest", "forced": False}
    assert rep["dead_nodes"] == []
    for k in ("latency_cdf", "replies"):
        assert open(rep["plots"][k], "rb").read(4) == b"\x89PNG"
    assert_gone(rpl_name)

    # another config: refused before anything starts (exit 2, naming the recorded config) ...
    other = tmp_path / "other.toml"
    other.write_text(TESTBED_TOML.read_text().replace("seed = 2024", "seed = 2025"))
    r = subprocess.run([sys.executable, "-m", "embnic", "replay", str(pcap), "-c", str(other), "--out", str(out),
                        "--name", rpl_name, "--no-progress"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"recorded with config {TESTBED_TOML.resolve()}" in r.stderr and "--force" in r.stderr, r.stderr
    assert_gone(rpl_name)
    # ... unless --force
    r = subprocess.run([sys.executable, "-m", "embnic", "replay", str(pcap), "-c", str(other), "--out", str(out),
                        "--name", rpl_name, "--no-progress", "--force", "--rate", "2000"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "replaying anyway (--force)" in r.stdout
    rep = json.loads((out / "report.json").read_text())
    assert rep["config_check"]["match"] is False and rep["config_check"]["forced"] is True
    assert_gone(rpl_name)

    # the card dies before the replay: the error names the card, not a shard
    from click.testing import CliRunner

    from embnic.cli.main import cli
    from embnic.testbed.net import topology as T
    from embnic.testbed.traces import trace as TR

    real_argv = TR._tcpreplay_argv
    killed = {}

    def kill_card_first(*a, **kw):
        if not killed:
            rec = next(p for p in T.testbed_state(rpl_name, run_dir)["procs"] if p["role"] == "card")
            os.kill(rec["pid"], signal.SIGKILL)
            killed.update(rec)
        return real_argv(*a, **kw)

    TR._tcpreplay_argv = kill_card_first
    try:
        r = CliRunner().invoke(cli, ["replay", str(pcap), "-c", str(TESTBED_TOML), "--out", str(out), "--name",
                                     rpl_name, "--no-progress", "--wait", "0.5", "--rate", "5000"])
    finally:
        TR._tcpreplay_argv = real_argv
    assert r.exit_code == 1, r.output
    assert f"got no reply (the card, pid {killed['pid']}, is not running: see {killed['log']})" in r.output
    rep = json.loads((out / "report.json").read_text())
    assert [d["what"] for d in rep["dead_nodes"]] == ["the card"] and rep["all_replied"] is False
    assert_gone(rpl_name, [killed["pid"]])


def test_config_digest_ignores_comments_and_control_and_check_config(tmp_path):
    from embnic.client_lib.config import load_config
    from embnic.testbed.traces import trace as TR

    text = TESTBED_TOML.read_text()
    a = load_config(TESTBED_TOML)
    p = tmp_path / "b.toml"
    p.write_text("# another comment\n" + text + "\n[control]\nctl = \"/tmp/x.sock\"\n")
    assert TR.config_digest(load_config(p)) == TR.config_digest(a)
    p.write_text(text.replace("seed = 2024", "seed = 7"))
    assert TR.config_digest(load_config(p)) != TR.config_digest(a)
    side = {"config": "/x/testbed.toml", "config_digest": TR.config_digest(a)}
    assert TR.check_config(side, TESTBED_TOML, a)["match"] is True
    assert TR.check_config(side, p, load_config(p)) == {"recorded_with": "/x/testbed.toml", "match": False,
                                                         "compared": "digest"}
    # older sidecars only have the file's sha256
    import hashlib

    old = {"config": "/x/testbed.toml", "config_sha256": hashlib.sha256(TESTBED_TOML.read_bytes()).hexdigest()}
    assert TR.check_config(old, TESTBED_TOML, a)["match"] is True
    assert TR.check_config(old, p, load_config(p))["match"] is False
    assert TR.check_config(None, p, load_config(p))["match"] is None


@needs_root
def test_record_names_a_dead_card(run_dir, tmp_path, cleanup, monkeypatch):  # noqa: F811
    """The card dies while recording: the error names the card, not only the shard that did not answer."""
    from embnic.testbed.net import topology as T
    from embnic.testbed.traces import trace as TR
    from embnic.testbed.training import train as TRN

    build_dataplane()
    name = tb_name("q")
    cleanup.append(name)
    real_train = TRN.train
    killed = {}

    def train_after_killing_the_card(*a, **kw):
        if not killed:
            rec = next(p for p in T.testbed_state(name, run_dir)["procs"] if p["role"] == "card")
            os.kill(rec["pid"], signal.SIGKILL)
            killed.update(rec)
        return real_train(*a, **kw)

    monkeypatch.setattr(TRN, "train", train_after_killing_the_card)
    with pytest.raises(TR.TraceError) as ei:
        TR.record(TESTBED_TOML, tmp_path / "t.pcap", batches=1, batch_size=64, name=name, rdir=run_dir,
                  progress=False, log=lambda s: None)
    msg = str(ei.value)
    assert "did not answer" in msg and f"(the card, pid {killed['pid']}, is not running: see {killed['log']})" in msg
    assert_gone(name, [killed["pid"]])


@needs_root
def test_replay_refuses_a_file_without_embnic_requests(run_dir, tmp_path):  # noqa: F811
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    p = tmp_path / "other.pcap"
    wrpcap(str(p), [Ether() / IP(dst="10.0.0.1") / UDP(dport=53) / b"x"])
    r = subprocess.run([sys.executable, "-m", "embnic", "replay", str(p), "-c", str(TESTBED_TOML)],
                       capture_output=True, text=True, env=dict(os.environ, EMBNIC_RUN_DIR=str(run_dir)))
    # a pcap, but no trace: the wrong file was given (usage, exit 2), as a file that is no pcap at all
    assert r.returncode == 2 and "no embnic request frames" in r.stderr


@needs_root
def test_replay_warns_of_a_trace_cut_short(run_dir, tmp_path):  # noqa: F811
    """A trace copied short (its last record cut) replays what it holds, but says it is cut short."""
    from embnic.control.pcap import write_pcap
    from embnic.testbed.traces import trace as TR

    p = tmp_path / "cut.pcap"
    write_pcap(p, [_frame(f, True) for f in _lookup(1) + _lookup(2)])
    p.write_bytes(p.read_bytes()[:-5])  # the second lookup's record cut short
    # the sidecar of the full recording (3 frames), made with another config: replay stops there
    (tmp_path / "cut.json").write_text(json.dumps({"frames": 3, "config": "other.toml", "config_digest": "0" * 64}))
    lines = []
    with pytest.raises(TR.ConfigMismatch):
        TR.replay(p, TESTBED_TOML, out=tmp_path / "o", log=lines.append)
    assert lines == ["warning: cut.pcap holds 1 frames but its sidecar says 3 were recorded: the file is cut "
                     "short; only those are replayed (record it again with `embnic trace record`)"]
    assert TR.truncation_warning(p, 3, {"frames": 3}) is None
    assert TR.truncation_warning(p, 1, None) is None  # no sidecar, whole records: nothing to say


def test_a_pcap_cut_mid_record_is_named_without_a_sidecar(tmp_path):
    """A copy cut inside its last record says so even with no sidecar to count frames against."""
    from embnic.control.pcap import partial_tail, read_pcap, write_pcap
    from embnic.testbed.traces import trace as TR

    p = tmp_path / "cut.pcap"
    write_pcap(p, [_frame(f, True) for f in _lookup(1) + _lookup(2)])
    assert partial_tail(p) == 0
    p.write_bytes(p.read_bytes()[:-5])
    assert partial_tail(p) == 16 + len(_frame(_lookup(2)[0], True)) - 5
    n = len(read_pcap(p))
    assert TR.truncation_warning(p, n, None, partial_tail(p)) == (
        f"warning: cut.pcap ends in {partial_tail(p)} bytes that form no whole frame record: the file is cut "
        f"short after {n} frames; only those are replayed (record it again with `embnic trace record`)")


def test_latency_cdf_of_a_run_without_samples_is_drawn_without_warnings(tmp_path):
    import warnings

    from embnic.testbed.training import report as R

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # matplotlib: "No artists with labels found"
        p = R.plot_cdf(tmp_path / "cdf.png", {"lookup": [], "update": []}, "nothing answered")
    assert p.read_bytes()[:4] == b"\x89PNG"


CASE = os.path.join(os.path.dirname(__file__), "cases", "replay-not-owner")


def test_error_replies_are_failures_not_completions(tmp_path):
    """A request answered with ERROR is counted by status as failed, never as completed, and
    the summary says so."""
    import numpy as np

    from embnic.client_lib import codec
    from embnic.client_lib.consts import MsgType, Status
    from embnic.testbed.traces import trace as TR

    reqs_frames = _lookup(1) + _lookup(2)
    frames = [(i * 1e-3, _frame(p, True)) for i, p in enumerate(reqs_frames)]
    reqs, _, _ = TR.parse_requests(frames)
    t = TR._ReplyTracker(1, reqs)
    for ts, f in frames:
        t.feed((int(ts * 1e9), True, f))
    h1, h2 = (codec.parse_header(f) for f in reqs_frames)
    t.feed((5_000_000, False, _frame(codec.encode_reply(h1, MsgType.LOOKUP_REPLY, shard_id=1,
                                                        body=np.zeros((3, 8), np.float32).tobytes())[0], False)))
    t.feed((6_000_000, False, _frame(codec.encode_reply(h2, MsgType.ERROR, shard_id=1, table_id=0,
                                                        status=Status.NOT_OWNER)[0], False)))
    rep = TR.replay_report(tmp_path / "t.pcap", None, reqs, {1: t}, {}, None, {}, None, False, 0,
                            tmp_path)
    assert (rep["messages_replied"], rep["messages_completed"], rep["messages_failed"]) == (2, 1, 1)
    assert rep["all_replied"] is True and rep["all_completed"] is False
    assert rep["error_statuses"] == {"NOT_OWNER": 1}
    rep["shards"] = {"1": {"errors": {"NOT_OWNER": 1, "MALFORMED": 0}}, "0": None}
    text = "\n".join(TR.replay_summary(rep))
    assert "1/2 completed (1 answered ERROR: NOT_OWNER 1; 0 unanswered)" in text, text
    assert "shard 1 NOT_OWNER 1" in text, text


def test_a_trace_of_another_protocol_version_is_refused_by_name(tmp_path):
    """A v1 trace (recorded before protocol v2) is a usage error naming the version and the fix,
    from its sidecar or, without one, from its frames."""
    from embnic.testbed.traces import trace as TR

    v1 = bytes.fromhex("454d0101" "00010000" "00000007" "00020003" "00010008" "00000001" "00000008"
                       "00000000" "00000001" "00080000") + bytes(8)
    frames = [(0.0, _frame(v1, True))]
    for sidecar in ({"protocol_version": 1}, None):
        with pytest.raises(TR.TraceUsageError, match="protocol version 1 frames; this embnic speaks version 2.*"
                                                     "record the trace again"):
            TR.check_version(tmp_path / "t.pcap", frames, sidecar)
    TR.check_version(tmp_path / "t.pcap", [(0.0, _frame(_lookup(1)[0], True))], None)  # v2: fine


def test_shard_counters_from_log(tmp_path):
    from embnic.testbed.traces import trace as TR

    log = tmp_path / "s0.log"
    log.write_text('# ip netns exec x-s0 python3 -m embnic server --shard 0\n'
                   '2026-11-30 07:51:51,019 embnic-server[1] INFO shard 0 listening on 10.77.2.2:7878\n'
                   '2026-11-30 07:51:53,348 embnic-server[1] INFO shard 0 stopped; counters '
                   '{"errors": {"NOT_OWNER": 2}, "requests": {"LOOKUP_REQ": 386}}\n')
    assert TR.shard_counters_from_log(log) == {"errors": {"NOT_OWNER": 2}, "requests": {"LOOKUP_REQ": 386}}
    log.write_text("killed before it stopped\n")
    assert TR.shard_counters_from_log(log) is None
    assert TR.shard_counters_from_log(tmp_path / "absent.log") is None


def test_probe_asks_each_shard_for_a_key_it_owns():
    """The readiness probe's lookups are ones the shards serve (the NOT_OWNER of the case)."""
    import numpy as np

    from embnic.client_lib.config import load_config, parse_config
    from embnic.client_lib.routing import shard_of
    from embnic.testbed.net.topology import probe_key

    cfg = load_config(os.path.join(CASE, "testbed.toml"))
    # key 0 of table 0 is shard 1's: probing shard 0 with it was the error of the case
    assert int(shard_of(cfg, 0, np.zeros(1, np.uint64))[0]) == 1
    for s in cfg.shards:
        t, key, owned = probe_key(cfg, s.id)
        assert owned and key.dtype == np.uint64 and key.shape == (1,)
        assert int(shard_of(cfg, t.id, key)[0]) == s.id
    # table policy: shard 7 holds only table 1; shard 9 holds nothing
    raw = {"cluster": {"sharding": "table"},
           "tables": [{"id": 0, "rows": 10, "dim": 4, "shard": 4}, {"id": 1, "rows": 10, "dim": 4, "shard": 7}],
           "shards": [{"id": i, "ip": "127.0.0.1", "port": 20000 + i} for i in (4, 7, 9)],
           "clients": [{"id": 1, "ip": "127.0.0.1"}]}
    cfg = parse_config(raw)
    assert [(t.id, int(k[0]), o) for t, k, o in (probe_key(cfg, s) for s in (4, 7, 9))] == \
        [(0, 0, True), (1, 0, True), (0, 0, False)]


@needs_root
def test_replay_case_not_owner(run_dir, tmp_path, cleanup):  # noqa: F811
    """The trace of the NOT_OWNER case (tests/testbed/cases/replay-not-owner/README.md), replayed
    with the config it was recorded with: every request completes, no reply is an ERROR and no
    shard counts an error (before the fix, each readiness probe drew one NOT_OWNER at shard 0)."""
    if shutil.which("tcpreplay") is None:
        pytest.fail("tcpreplay is not installed: scripts/install-deps.sh installs it (scripts/apt-packages.txt)")
    build_dataplane()
    env = dict(os.environ, EMBNIC_RUN_DIR=str(run_dir))
    name = tb_name("o")
    cleanup.append(name)
    out = tmp_path / "replay"
    r = subprocess.run([sys.executable, "-m", "embnic", "replay", os.path.join(CASE, "t.pcap"), "-c",
                        os.path.join(CASE, "testbed.toml"), "--out", str(out), "--name", name, "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((out / "report.json").read_text())
    side = json.loads(open(os.path.join(CASE, "t.json")).read())
    assert rep["config_check"]["match"] is True
    assert side["protocol_version"] == 2 and side["messages"] == 128  # re-recorded in v2 (README.md)
    assert rep["requests"] == side["messages"]
    assert rep["messages_completed"] == side["messages"] and rep["messages_failed"] == 0 and rep["all_completed"] is True
    assert "ERROR" not in rep["reply_types"] and rep["error_statuses"] == {}
    # each shard served exactly the trace's requests for it plus one probe lookup per client
    from embnic.testbed.traces import trace as TR

    reqs, _, _ = TR.parse_requests(TR.read_pcap(os.path.join(CASE, "t.pcap")))
    for sid, c in rep["shards"].items():
        assert c is not None, f"shard {sid} logged no counters"
        assert {k: v for k, v in c["errors"].items() if v} == {}, (sid, c["errors"])
        want_lk = sum(1 for q in reqs.values() if q["shard"] == int(sid) and q["type"] == 1)
        want_up = sum(1 for q in reqs.values() if q["shard"] == int(sid) and q["type"] == 3)
        assert c["requests"] == {"LOOKUP_REQ": want_lk + 2, "UPDATE_REQ": want_up, "SIZE_REQ": 0}, (sid, c["requests"])
    assert "shard errors        none" in r.stdout, r.stdout
    assert_gone(name)
