"""A shard's Prometheus endpoint (``--metrics-port``, embnic.testbed.server.shard_metrics), on loopback.

Shard 0 runs plain, shard 1 with a write-ahead log; a client looks rows up, pushes updates and
re-sends one update (an exactly-once duplicate). Each shard's endpoint, parsed with
prometheus-client's parser, equals — sample for sample — the counters the shard logs when it
stops, the service-time histogram counts every reply, and every query of the Grafana dashboard
names a metric the shard and card exporters emit.

Run alone: python3 -m pytest -q tests/testbed/test_shard_metrics.py
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

pytest.importorskip("prometheus_client", reason="pip install 'embnic[metrics]'")

from metrics_util import assert_agree, check_dashboard, families, samples, shard_expected  # noqa: E402

from embnic.client_lib import codec  # noqa: E402
from embnic.client_lib.client import EmbeddingClient  # noqa: E402
from embnic.client_lib.config import load_config  # noqa: E402
from embnic.client_lib.consts import MsgType  # noqa: E402
from embnic.control.card_metrics import card_families  # noqa: E402
from embnic.testbed.server.shard_metrics import ServiceTimes, shard_families  # noqa: E402
import clientref  # noqa: E402


def _free_port(kind=socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cfg(tmp_path, ports):
    p = tmp_path / "c.toml"
    p.write_text(f"""
[cluster]
seed = 3
sharding = "hash"
timeout_ms = 500
[[tables]]
id = 0
rows = 5000
dim = 8
[[tables]]
id = 1
dim = 4
optimizer = "adagrad"
[[shards]]
id = 0
ip = "127.0.0.1"
port = {ports[0]}
[[shards]]
id = 1
ip = "127.0.0.1"
port = {ports[1]}
[[clients]]
id = 1
ip = "127.0.0.1"
port = {ports[2]}
""")
    return p


def _start(cfg, shard, *extra):
    return subprocess.Popen([sys.executable, "-m", "embnic.testbed.server", "--shard", str(shard), "--config", str(cfg),
                             "--metrics-port", "0", "--metrics-bind", "127.0.0.1", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))


def _metrics_url(p, timeout=30.0) -> str:
    """The shard's metrics URL from its log (``metrics on http://IP:PORT/metrics``), once it listens."""
    deadline = time.monotonic() + timeout
    url, lines = None, []
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if not line:
            raise AssertionError(f"shard exited: {''.join(lines)}")
        lines.append(line)
        m = re.search(r"metrics on (http://\S+/metrics)", line)
        if m:
            url = m.group(1)
        if url and " listening on " in line:
            return url
    raise AssertionError(f"no metrics line within {timeout} s: {''.join(lines)}")


def _stop(p) -> dict:
    """SIGTERM, then the counters it logged at exit."""
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err[-2000:]
    line = [ln for ln in err.splitlines() if " stopped; counters " in ln][-1]
    return json.loads(line.split(" stopped; counters ", 1)[1])


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        return r.read().decode()


def test_shard_endpoints_equal_their_counters_plain_and_wal(tmp_path):
    ports = [_free_port(), _free_port(), _free_port()]
    cfg_path = _cfg(tmp_path, ports)
    cfg = load_config(cfg_path)
    s0 = _start(cfg_path, 0)
    s1 = _start(cfg_path, 1, "--checkpoint-dir", str(tmp_path / "wal"),
                "--checkpoint-every", "3")
    procs = [s0, s1]
    try:
        urls = [_metrics_url(s0), _metrics_url(s1)]
        rng = np.random.default_rng(1)
        with EmbeddingClient(cfg, 1, tail_probes=False) as c:
            for step in range(4):
                keys0 = np.unique(rng.integers(0, 5000, 300).astype(np.uint64))
                keys1 = np.unique(rng.integers(0, 2**63, 40, dtype=np.int64).astype(np.uint64))
                c.lookup({0: keys0, 1: keys1})
                c.update({0: (keys0, rng.standard_normal((keys0.size, 8)).astype(np.float32)),
                          1: (keys1, rng.standard_normal((keys1.size, 4)).astype(np.float32))})
        # one update re-sent with its msg_id: the shard acks it again without applying it (exactly once)
        upd = clientref.encode_table_update(msg_id=77, client_id=1, table_id=1, shard_id=1, dtype=1,
                                  keys=np.array([5], np.uint64), grads=np.ones((1, 4), np.float32))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.settimeout(10)
            u.bind(("127.0.0.1", 0))
            for _ in range(2):
                u.sendto(upd[0], ("127.0.0.1", ports[1]))
                assert codec.parse_header(u.recv(65536)).msg_type == MsgType.UPDATE_ACK
        texts = [_scrape(u) for u in urls]
    finally:
        counters = [_stop(p) for p in procs]
    for text, c in zip(texts, counters):
        got = samples(text)
        assert_agree(got, shard_expected(c), f"shard {c['shard']}")
        fam = families(text)
        assert fam["embnic_shard_service_seconds"] == "histogram" and fam["embnic_shard_requests"] == "counter"
        sh = str(c["shard"])
        replies = sum(v for (n, ls), v in got.items() if n == "embnic_shard_replies_total")
        assert replies == got[("embnic_shard_service_seconds_count", (("shard", sh),))] > 0
        # every reply answers a request, or a poll of an update the window holds (ack) or holds in part
        # (NACK): a loaded machine delays an ack past the client's timer and the client polls
        assert replies == sum(c["requests"].values()) + c["update_poll_acks"] + c["update_nacks"]
    w = samples(texts[0])
    assert w[("embnic_shard_wakeups_total", (("shard", "0"),))] == counters[0]["engine"]["wakeups"] > 0
    one = samples(texts[1])
    assert one[("embnic_shard_duplicates_total", (("shard", "1"),))] == 1
    assert one[("embnic_shard_wal_records_total", (("shard", "1"),))] == counters[1]["updates_applied"] > 0
    assert one[("embnic_shard_checkpoints_total", (("shard", "1"),))] >= 1


def test_a_taken_metrics_port_is_one_line_naming_the_option(tmp_path):
    ports = [_free_port(), _free_port(), _free_port()]
    cfg_path = _cfg(tmp_path, ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        p = subprocess.run([sys.executable, "-m", "embnic.testbed.server", "--shard", "0", "--config", str(cfg_path),
                            "--metrics-port", str(busy.getsockname()[1]), "--metrics-bind", "127.0.0.1"],
                           capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert "the port is in use; pick another --metrics-port" in p.stderr


def test_service_times_buckets_are_the_cards():
    st = ServiceTimes()
    st.add(500, 2)          # < 1 µs: bucket 0
    st.add(1_000)           # 1 µs: [1, 2) µs, bucket 1
    st.add(3_000_000, 4)    # 3000 µs: [2048, 4096) µs, bucket 12
    st.add(10 ** 12)        # 1000 s: the last bucket
    d = st.as_dict()
    assert d["hist"][0] == 2 and d["hist"][1] == 1 and d["hist"][12] == 4 and d["hist"][-1] == 1
    assert sum(d["hist"]) == 8 and d["sum_ns"] == 1000 + 1000 + 12_000_000 + 10 ** 12


def test_dashboard_queries_name_emitted_metrics(tmp_path):
    """Every query of contrib/grafana/embnic.json names a metric of the card's and shards'
    exporters, read from families built the way they build them: a card with two state lcores
    and per-shard latency (the fake card's counters plus partitions) and a shard with a write-ahead
    log."""
    from prometheus_client import CollectorRegistry, generate_latest

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "control"))
    from ctl_fake_card import FakeCard

    fake = FakeCard(str(tmp_path / "x.sock"))
    st = {**fake.do_state_summary({}), "partitions": 2,
          "by_partition": [{"partition": i, "lcore": i + 1, "entries": 1, "capacity": 10, "completed_since_start": 5,
                            "expired_since_start": 0} for i in range(2)]}
    shard = {"shard": 0, "rx_frames": 1, "rx_bytes": 1, "tx_frames": 1, "tx_bytes": 1, "requests": {"LOOKUP_REQ": 1},
             "replies": {"LOOKUP_REPLY": 1}, "errors": {"MALFORMED": 0}, "drops": {"too_short": 0},
             "lookup_keys": 1, "updates_applied": 0, "update_keys": 0, "duplicates": 0, "dedup_entries": 0,
             "rows": {"0": 1}, "reassembly": {"pending": 0, "expired": 0, "evicted": 0, "duplicate_frames": 0},
             "internal_errors": 0, "send_errors": 0, "service": ServiceTimes().as_dict(), "announced": 0,
             "durability": {"seq": 1, "log_records": 1, "log_bytes": 9, "log_commits": 1, "checkpoints": 1,
                            "since_checkpoint": 0, "log_errors": 0, "checkpoint_errors": 0},
             "engine": {"name": "batch", "intake": "c", "gso": True, "batch": 256, "wakeups": 1}}

    class Fixed:
        def __init__(self, fams):
            self.fams = fams

        def collect(self):
            return self.fams

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Fixed(card_families(fake.do_counters({}), st)))
    reg.register(Fixed(shard_families(shard)))
    text = generate_latest(reg).decode() + "embnic_card_up 1\n"
    assert check_dashboard(text) >= 20
