"""The card exporter (``embnic exporter``, embnic.control.card_metrics) against the fake card.

What it serves equals the card's ``counters`` and ``state_summary`` sample for sample
(tests/metrics_util.py maps every leaf), parsed with prometheus-client's own parser; a card that
does not answer is ``embnic_card_up 0``; the HTTP endpoint serves the same; a taken port is one
line naming ``--port``. The live card: tests/testbed/test_metrics_live.py.

Run alone: python3 -m pytest -q tests/control/test_card_metrics.py
"""
from __future__ import annotations

import socket
import urllib.request

import pytest

pytest.importorskip("prometheus_client", reason="pip install 'embnic[metrics]'")

from metrics_util import assert_agree, card_expected, families, samples  # noqa: E402

from embnic.control import card_metrics  # noqa: E402
from embnic.control.errors import OperationalError  # noqa: E402
from embnic.control.targets.dpdk.target import DpdkTarget  # noqa: E402

UP = ("embnic_card_up", ())
INFO = ("embnic_card_info", (("pipeline", "embnic"), ("target", "dpdk")))


def _want(card) -> dict:
    want = card_expected(card.do_counters({}), card.do_state_summary({}))
    want[UP] = 1
    want[INFO] = 1
    return want


def test_exporter_once_equals_the_cards_counters(card, invoke):
    r = invoke("exporter", "--once")
    assert r.exit_code == 0, r.output
    assert_agree(samples(r.output), _want(card), "fake card")
    fam = families(r.output)
    assert fam["embnic_card_drops"] == "counter" and fam["embnic_card_shard_latency_seconds"] == "histogram"
    assert fam["embnic_card_state_entries"] == "gauge"
    assert 'embnic_card_drops_total{port="0",reason="bad_magic"} 1.0' in r.output


def test_a_card_that_does_not_answer_is_up_0(env, invoke, caplog):
    """The reading says embnic_card_up 0; as a one-shot check --once then exits 1 saying why (a
    serving exporter keeps serving: test_the_endpoint_serves_what_once_prints)."""
    r = invoke("exporter", "--once")
    assert r.exit_code == 1, r.output
    assert "Error: could not read the card: " in r.output
    # said once: the Error line, no log warning besides it
    assert not [x for x in caplog.records if "cannot read the card" in x.getMessage()]
    assert samples(r.output[:r.output.index("Error:")]) == {UP: 0}


def test_the_endpoint_serves_what_once_prints(card, env):
    target = DpdkTarget(None, name="embnic", run_dir=env)
    col = card_metrics.CardCollector(target, {"target": "dpdk", "pipeline": "embnic"})
    srv = card_metrics.MetricsServer(col, 0, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert_agree(samples(text), _want(card), "fake card over HTTP")
        with pytest.raises(OperationalError, match=r"the port is in use; pick another --port"):
            card_metrics.MetricsServer(col, srv.port, "127.0.0.1")
    finally:
        srv.close()
    with socket.socket() as s:  # closed: the port is free again (a closed connection may be in TIME_WAIT)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", srv.port))
        s.listen(1)


def test_log2_histogram_buckets():
    assert card_metrics.log2_us_histogram([1, 0, 2]) == [("1e-06", 1), ("2e-06", 1), ("+Inf", 3)]
    assert [card_metrics.log2_us_bucket(ns) for ns in (0, 999, 1000, 1999, 2000, 4_194_304_000, 10 ** 15)] == \
        [0, 0, 1, 1, 2, 23, 23]


class _Bmv2Like:
    """A target answering in the bmv2 target's shape (control/targets/bmv2/target.py ``counters``: no
    mempool, no latency histograms, the ring as registers logged; per-shard completions)."""

    def counters(self):
        return {"ports": [{"port": p, "rx_frames": 3 + p, "rx_bytes": 300, "tx_frames": 2, "tx_bytes": 200}
                          for p in range(2)],
                "types": {"LOOKUP_REQ": 1, "LOOKUP_REPLY": 1}, "drops": {"bad_magic": 2, "unknown_client": 0},
                "arp": {"replies": 1}, "completed": {"LOOKUP_REPLY": 1, "UPDATE_ACK": 0, "ERROR": 0, "SIZE_ACK": 0},
                "shards": [{"shard": 0, "completed": 1}], "state": {"entries": 0, "capacity": 1024, "overflow": 0,
                                                                    "expired": 0},
                "ring": {"size": 64, "count": 2, "logged": 2}}

    def state_summary(self):
        return {"entries": 0, "capacity": 1024, "overflow": 0, "expired": 0,
                "by_state": {"receiving": 0, "forwarded": 0, "answered": 0, "expired": 0}}


def test_a_bmv2_shaped_reading_exports_what_it_has():
    t = _Bmv2Like()
    text = card_metrics.exposition(card_metrics.CardCollector(t))
    want = card_expected(t.counters(), t.state_summary())
    want[UP] = 1
    assert_agree(samples(text), want, "bmv2-shaped card")
    assert "embnic_card_mempool" not in text and "embnic_card_shard_latency" not in text
