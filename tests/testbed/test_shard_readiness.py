"""A shard binds its UDP port last, right before it serves (issue 34, item 7).

The testbed (and anything else) takes a bound UDP port as "the shard is ready"; a shard that
bound it and then spent seconds starting its metrics endpoint let probes pile up in the socket
and answered every copy at once (the card dropped the extra replies as ``unsolicited_reply``).
Here ``serve_metrics`` is replaced by a stand-in that checks the UDP port is still free when it is
called, then asks the shard to stop; both engines, through :func:`run_server`.

Run alone: python3 -m pytest -q tests/testbed/test_shard_readiness.py
"""
from __future__ import annotations

import os
import signal
import socket


from embnic.client_lib.config import parse_config
from embnic.testbed.server import foreground


def _free_udp_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class _Metrics:
    closed = False

    def close(self):
        self.closed = True


def test_metrics_start_before_the_udp_port_is_bound(monkeypatch):
    port = _free_udp_port()
    cfg = parse_config({"tables": [{"id": 0, "dim": 4}], "shards": [{"id": 0, "ip": "127.0.0.1", "port": port}],
                        "clients": [{"id": 1, "ip": "127.0.0.1"}]})
    seen = {}

    def fake_serve_metrics(read, metrics_port, bind="0.0.0.0"):
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.bind(("127.0.0.1", port))  # free: the shard has not bound it yet
            seen["udp_free"] = True
        except OSError:
            seen["udp_free"] = False
        finally:
            probe.close()
        os.kill(os.getpid(), signal.SIGTERM)  # the shard stops as soon as it serves
        seen["metrics"] = _Metrics()
        return seen["metrics"]

    monkeypatch.setattr(foreground, "serve_metrics", fake_serve_metrics)
    old = signal.getsignal(signal.SIGTERM)
    try:
        rc = foreground.run_server(cfg, 0, "127.0.0.1", port, metrics_port=0)
    finally:
        signal.signal(signal.SIGTERM, old)
    assert rc == 0
    assert seen["udp_free"] is True, "the UDP port was bound before the metrics endpoint started"
    assert seen["metrics"].closed
