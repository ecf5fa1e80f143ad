"""Trace record → replay through the card: every recorded request gets its reply.

Run alone: python3 -m pytest -q tests/testbed/test_trace.py   (needs root, DPDK and tcpreplay)
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tbutil import TESTBED_TOML, assert_gone, build_dataplane, cleanup, needs_root, run_dir, tb_name  # noqa: F401

BATCHES = 2


@needs_root
@pytest.mark.skipif(shutil.which("tcpreplay") is None, reason="tcpreplay is not installed (apt-get install tcpreplay)")
def test_record_then_replay_answers_every_request(run_dir, tmp_path, cleanup):  # noqa: F811
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
    # two rounds per batch (lookups, updates), one message per (shard, table) that has ids
    assert side["messages_by_type"]["LOOKUP_REQ"] == side["messages_by_type"]["UPDATE_REQ"] > 0
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
    assert rep["card"]["types"]["LOOKUP_REQ"] + rep["card"]["types"]["UPDATE_REQ"] == side["frames"]
    assert sum(rep["drops"]["card"].values()) == 0
    for k in ("latency_cdf", "replies"):
        assert open(rep["plots"][k], "rb").read(4) == b"\x89PNG"
    assert_gone(rpl_name)


@needs_root
def test_replay_refuses_a_file_without_embnic_requests(run_dir, tmp_path):  # noqa: F811
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    p = tmp_path / "other.pcap"
    wrpcap(str(p), [Ether() / IP(dst="10.0.0.1") / UDP(dport=53) / b"x"])
    r = subprocess.run([sys.executable, "-m", "embnic", "replay", str(p), "-c", str(TESTBED_TOML)],
                       capture_output=True, text=True, env=dict(os.environ, EMBNIC_RUN_DIR=str(run_dir)))
    assert r.returncode == 1 and "no embnic request frames" in r.stderr
