"""The metrics endpoint (:class:`embnic.control.card_metrics.MetricsServer`: the card's exporter and
``embnic server --metrics-port``) against clients that do not play along (issue 34, item 7): a
cap on the connections served at once (one more is answered 503 without a thread), an idle
timeout per connection, and an answer to an HTTP/0.9 request.

Run alone: python3 -m pytest -q tests/control/test_metrics_server.py
"""
from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.core import GaugeMetricFamily  # noqa: E402

from embnic.control import card_metrics  # noqa: E402


class _Collector:
    def describe(self):
        return []

    def collect(self):
        g = GaugeMetricFamily("embnic_test_value", "A test value.")
        g.add_metric([], 42)
        yield g


def _connect(port: int, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def _read_all(s: socket.socket) -> bytes:
    out = b""
    while True:
        b = s.recv(65536)
        if not b:
            return out
        out += b


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


@pytest.fixture
def server():
    made = []

    def make(**kw):
        srv = card_metrics.MetricsServer(_Collector(), 0, "127.0.0.1", **kw)
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.close()


def test_http09_request_is_answered_at_once(server):
    srv = server()
    with _connect(srv.port) as s:
        t0 = time.monotonic()
        s.sendall(b"GET /metrics\r\n")
        body = _read_all(s)  # the server closes: HTTP/0.9 has no length
    assert time.monotonic() - t0 < 3
    assert b"embnic_test_value 42.0" in body and not body.startswith(b"HTTP/")
    assert "embnic_test_value 42.0" in _scrape(srv.port)  # HTTP/1.x as before


def test_a_silent_connection_is_closed_after_the_idle_timeout(server):
    srv = server(idle_timeout_s=0.5)
    with _connect(srv.port) as s:
        t0 = time.monotonic()
        assert _read_all(s) == b""  # nothing sent: closed, unanswered
        assert 0.3 < time.monotonic() - t0 < 4
    with _connect(srv.port) as s:  # a request line and then silence (no end of the headers)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        _read_all(s)
        assert time.monotonic() - t0 < 4
    assert "embnic_test_value" in _scrape(srv.port)


def test_connections_beyond_the_cap_get_503_and_no_thread(server):
    srv = server(max_connections=3, idle_timeout_s=30)
    before = threading.active_count()
    idle = [_connect(srv.port) for _ in range(3)]  # slowloris: connected, nothing sent
    try:
        time.sleep(0.3)
        extra = []
        for _ in range(20):
            s = _connect(srv.port)
            extra.append(s)
            assert _read_all(s).startswith(b"HTTP/1.0 503 ")
        assert srv.refused == 20
        assert threading.active_count() <= before + 3  # one thread per served connection, no more
        for s in extra:
            s.close()
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 5
    while True:  # the idle ones' threads end when their peers close: scrapes are served again
        try:
            assert "embnic_test_value" in _scrape(srv.port)
            break
        except (OSError, AssertionError):
            assert time.monotonic() < deadline
            time.sleep(0.1)
