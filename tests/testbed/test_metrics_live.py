"""Prometheus metrics of a live namespace testbed: the card (``embnic exporter``) and its shards
(``--metrics-port``), scraped over HTTP and parsed with prometheus-client's parser.

examples/testbed.toml's wiring (2 clients, the card = embnic-dp, 2 shards); shard 1 keeps a
write-ahead log. Client 1 looks rows up and pushes updates
through the card and re-sends one update whole after its ack (the card forwards it as a new
message, the shard acks it as a duplicate). Then, with the card quiet:

* the exporter's every sample equals what ``embnic status --json -c CONFIG`` prints, leaf for leaf
  (tests/metrics_util.py), read between two equal status readings;
* each shard's endpoint equals the counters the shard logs when it stops;
* the card's completions per shard and reply type equal the replies each shard counted in the
  same interval, and each shard's service-time histogram counted each of them;
* every query of contrib/grafana/embnic.json names a metric these endpoints emit.

Run alone: python3 -m pytest -q tests/testbed/test_metrics_live.py   (needs root and DPDK)
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("prometheus_client", reason="pip install 'embnic[metrics]'")

from metrics_util import assert_agree, card_expected, check_dashboard, samples, shard_expected  # noqa: E402
from tbutil import TESTBED_TOML, assert_gone, build_dataplane, cleanup, needs_root, run_dir, tb_name  # noqa: E402,F401

from embnic.client_lib import codec  # noqa: E402
from embnic.client_lib.client import EmbeddingClient  # noqa: E402
from embnic.client_lib.config import load_config  # noqa: E402
from embnic.client_lib.consts import MsgType  # noqa: E402
from embnic.client_lib.routing import owns  # noqa: E402
from embnic.testbed.net import topology as T  # noqa: E402
from embnic.testbed.traces.trace import shard_counters_from_log  # noqa: E402
import clientref  # noqa: E402

METRICS_PORT = 9465  # each shard's endpoint, in its own namespace


def _get(url: str, ns: str | None = None) -> str:
    if ns is None:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.read().decode()
    with T.in_netns(ns):
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.read().decode()


def _status(config) -> dict:
    r = subprocess.run([sys.executable, "-m", "embnic", "status", "--json", "-c", str(config)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    return {"counters": s["counters"], "state": s["state"]}


def _free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_root
def test_live_card_and_shards_agree_with_their_counters(run_dir, tmp_path, cleanup):  # noqa: F811
    build_dataplane()
    cfg = load_config(TESTBED_TOML)
    name = tb_name("p")
    cleanup.append(name)
    topo = T.Topology.from_config(cfg, name)

    def server_argv(shard_id, config_path, ip):
        argv = [sys.executable, "-m", "embnic.testbed.server", "--shard", str(shard_id), "--config", config_path,
                "--bind", ip, "--metrics-port", str(METRICS_PORT), "--metrics-bind", ip]
        return argv + ([] if shard_id == 0 else ["--checkpoint-dir", str(tmp_path / "wal")])

    tb = T.Testbed(topo, run_dir).up(server_argv=server_argv)
    exporter = None
    shard_urls = {s.id: (topo.shard_ns(s.id), f"http://{s.ip}:{METRICS_PORT}/metrics") for s in cfg.shards}
    try:
        port = _free_tcp_port()
        exporter = subprocess.Popen([sys.executable, "-m", "embnic", "exporter", "-c", str(tb.config_path),
                                     "--port", str(port), "--bind", "127.0.0.1"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(url)
                break
            except (urllib.error.URLError, ConnectionError):
                assert exporter.poll() is None, exporter.communicate()
                assert time.monotonic() < deadline, "exporter did not answer within 30 s"
                time.sleep(0.2)
        tb.target.reset_counters()
        before = {s: samples(_get(u, ns)) for s, (ns, u) in shard_urls.items()}
        tcfg = tb.cfg
        rng = np.random.default_rng(7)
        tables = list(tcfg.tables)[:3]
        with T.in_netns(topo.client_ns(1)):
            client = EmbeddingClient(tcfg, 1, tail_probes=False)
        with client:
            for _ in range(3):
                req = {t.id: np.unique(rng.integers(0, t.rows or 2**63, 200, dtype=np.int64).astype(np.uint64))
                       for t in tables}
                client.lookup(req)
                client.update({t.id: (k, rng.standard_normal((k.size, t.dim)).astype(np.float32))
                               for t, k in zip(tables, req.values())})
        retx = client.stats.retransmits  # a busy machine's re-sends: a second answer the card refuses
        # one update sent twice through the card, from client 1's address: acked twice, applied once
        c1, t0 = tcfg.client(1), tables[0]
        key = np.array([(t0.rows or 2**40) - 1], np.uint64)
        shard = next(s.id for s in tcfg.shards if bool(owns(tcfg, t0.id, s.id, key)[0]))
        upd = clientref.encode_table_update(msg_id=4242, client_id=1, table_id=t0.id, shard_id=shard, dtype=int(t0.wire_dtype),
                                  keys=key, grads=np.ones((1, t0.dim), np.float32))
        card_ip = tcfg.card.ports[c1.card_port].ip
        with T.in_netns(topo.client_ns(1)):
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with u:
            u.settimeout(10)
            u.bind((c1.ip, c1.port))
            for _ in range(2):
                u.sendto(upd[0], (card_ip, tcfg.udp_port))
                assert codec.parse_header(u.recv(65536)).msg_type == MsgType.UPDATE_ACK
        deadline = time.monotonic() + 30
        while tb.target.state_summary()["entries"]:
            assert time.monotonic() < deadline, "messages still in the card's state map after 30 s"
            time.sleep(0.1)
        # the card: status, exporter, status; a stray frame of the kernel between them: read again
        for _ in range(10):
            s1 = _status(tb.config_path)
            card_text = _get(url)
            s2 = _status(tb.config_path)
            if s1 == s2:
                break
        assert s1 == s2, "the card's counters kept changing"
        after = {s: _get(u, ns) for s, (ns, u) in shard_urls.items()}
    finally:
        if exporter is not None:
            exporter.terminate()
            exporter.communicate(timeout=30)
        tb.down()
    assert exporter.returncode == 0
    got = samples(card_text)
    want = card_expected(s1["counters"], s1["state"])
    want[("embnic_card_up", ())] = 1
    want[("embnic_card_info", (("pipeline", f"{name}-card"), ("target", "dpdk")))] = 1
    assert_agree(got, want, "live card")
    logged = {s.id: shard_counters_from_log(tb.log_path(f"s{s.id}")) for s in cfg.shards}
    for s, text in after.items():
        assert logged[s] is not None, f"shard {s} logged no counters"
        assert_agree(samples(text), shard_expected(logged[s]), f"live shard {s}")
    # the card and the shards saw the same messages: completions = replies in the interval (a
    # re-sent request still in flight draws a second answer, which the card drops as unsolicited)
    for s, text in after.items():
        a, b = samples(text), before[s]
        for t in ("LOOKUP_REPLY", "UPDATE_ACK", "ERROR"):
            k = ("embnic_shard_replies_total", (("shard", str(s)), ("type", t)))
            card = got.get(("embnic_card_shard_messages_completed_total", (("reply_type", t), ("shard", str(s)))), 0)
            assert card <= a[k] - b[k] <= card + retx, (s, t, retx)
        n = (("shard", str(s)),)
        replies = sum(v - b[k] for k, v in a.items() if k[0] == "embnic_shard_replies_total")
        assert a[("embnic_shard_service_seconds_count", n)] - b[("embnic_shard_service_seconds_count", n)] == replies > 0
    dup = ("embnic_shard_duplicates_total", (("shard", str(shard)),))
    assert 1 <= samples(after[shard])[dup] - before[shard][dup] <= 1 + retx  # ours, and re-sent updates
    assert samples(after[0])[("embnic_shard_wakeups_total", (("shard", "0"),))] > 0
    assert samples(after[1])[("embnic_shard_wal_records_total", (("shard", "1"),))] > 0
    assert got[("embnic_card_messages_completed_total", (("reply_type", "UPDATE_ACK"),))] >= 2
    assert check_dashboard(card_text + "".join(after.values())) >= 20
    assert_gone(name)
