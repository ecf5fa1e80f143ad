"""Prometheus metrics of the card: a collector that reads the card's counters at scrape time.

``embnic exporter -c CONFIG --port 9464`` serves them. :class:`CardCollector` asks the
pipeline's target on every scrape (``counters`` and ``state_summary``, as ``embnic status``)
and turns the answer into metric families (:func:`card_families`); nothing is polled or copied
between scrapes. docs/cli.md lists the metrics and their conventions.

The latency histograms (the card's per shard, the shards' service times) count in powers of two
of microseconds: bucket ``i`` holds ``[2^(i-1), 2^i)`` µs (bucket 0: < 1 µs), the last bucket
everything above; in Prometheus terms bucket ``i``'s ``le`` is ``2^i`` µs
(:func:`log2_us_histogram`), the last ``+Inf``. The shard's metrics are
:mod:`embnic.testbed.server.shard_metrics`.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import threading
from typing import Iterable

from embnic.client_lib import consts
from embnic.control.errors import ControlError, MissingDependencyError, OperationalError, UsageError

log = logging.getLogger("embnic.metrics")

#: buckets of the card's latency histograms (docs/control-socket.md, ``shards[].latency_hist``)
CARD_LATENCY_BUCKETS = 24
DEFAULT_PORT = 9464  #: the exporter's default TCP port (Prometheus' port allocation wiki: 9464 is free)


def require_prometheus():
    """The ``prometheus_client`` module.

    Raises:
        MissingDependencyError: it is not installed (names the extra that brings it).
    """
    try:
        import prometheus_client
    except ImportError:
        raise MissingDependencyError("prometheus-client is not installed: pip install 'embnic[metrics]' "
                                     "(scripts/install-deps.sh installs it)", dependency="prometheus-client") from None
    return prometheus_client


def latency_bucket_upper_us(i: int, n: int) -> float:
    """Upper bound (µs) of bucket ``i`` of an ``n``-bucket log2 latency histogram (inf for the last)."""
    return float("inf") if i >= n - 1 else float(2 ** i)


def log2_us_bucket(ns: int, n: int = CARD_LATENCY_BUCKETS) -> int:
    """The bucket of a duration of ``ns`` nanoseconds in an ``n``-bucket log2 µs histogram: 0 for
    < 1 µs, ``i`` for ``[2^(i-1), 2^i)`` µs, at most ``n - 1`` (the card's rule, dataplane/counters.c)."""
    us = max(0, int(ns)) // 1000
    return min(us.bit_length(), n - 1)


def log2_us_histogram(hist: Iterable[int]) -> list[tuple[str, int]]:
    """Prometheus buckets of a log2 µs histogram: ``[(le in seconds, cumulative count), ...,
    ("+Inf", total)]``.

    Args:
        hist: counts per bucket (bucket ``i``: ``[2^(i-1), 2^i)`` µs; the last: the rest).

    Example: ``log2_us_histogram([1, 0, 2])`` → ``[("1e-06", 1), ("2e-06", 1), ("+Inf", 3)]``.
    """
    from prometheus_client.utils import floatToGoString

    hist = [int(c) for c in hist]
    ups = (latency_bucket_upper_us(i, len(hist)) for i in range(len(hist)))
    return [("+Inf" if up == float("inf") else floatToGoString(up * 1e-6), acc)
            for up, acc in zip(ups, itertools.accumulate(hist))]


class _Out:
    """The metric families of one reading, as they are made (``embnic_card_`` prefixed)."""

    def __init__(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        self.Counter, self.Gauge, self.Histogram = CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
        self.families: list = []

    def _add(self, kind, name, doc, labels=(), rows=(), optional=False):
        if optional and not rows:  # a part this target does not have: no family
            return
        f = getattr(self, kind)(f"embnic_card_{name}", doc, labels=list(labels))
        for values, v in rows:
            f.add_metric([str(x) for x in values], v)
        self.families.append(f)

    counter = functools.partialmethod(_add, "Counter")
    gauge = functools.partialmethod(_add, "Gauge")


def card_families(c: dict, st: dict) -> list:
    """Metric families of one reading of the card.

    Args:
        c: the target's ``counters()`` (docs/control-socket.md ``counters``; the bmv2 target
            gives the same shape without ``mempool`` and latency histograms).
        st: the target's ``state_summary()``.

    Returns:
        prometheus_client metric families (``embnic_card_*``); a part the target does not have
        (``mempool`` on bmv2, ``shards`` latency) is left out, not reported as 0.
    """
    out = _Out()
    _port_families(out, c)
    _traffic_families(out, c)
    _ring_families(out, c)
    _state_families(out, st)
    _shard_families(out, c.get("shards", []))
    return out.families


def _port_families(out: _Out, c: dict) -> None:
    """Per card port: frames and bytes in and out, what the port refuses or loses; the control channel."""
    ports = c.get("ports", [])
    for k, what in (("rx_frames", "Frames received"), ("rx_bytes", "Bytes received"),
                    ("tx_frames", "Frames sent"), ("tx_bytes", "Bytes sent")):
        out.counter(k, f"{what} per card port.", ["port"], [((p["port"],), p.get(k, 0)) for p in ports])
    for k, what in (("too_long_for_port", "Frames for this port longer than it sends (dropped as too_long_for_port)."),
                    ("iface_rx_frames", "Frames the card port's interface took in (bmv2: kernel rx_packets "
                                        "+ rx_dropped since the load or the last counter reset)."),
                    ("lost_before_switch", "Frames the card port's interface took in that the switch's ingress "
                                           "never counted (bmv2: lost in its capture; exact at rest).")):
        out.counter(k, what, ["port"], [((p["port"],), p[k]) for p in ports if k in p], optional=True)
    if c.get("control"):  # bmv2: which channel programs the tables
        ctl = c["control"]
        out.gauge("control_info", "The card's control channel (value 1): p4runtime or thrift, and its switch.",
                  ["channel", "switch"], [((ctl.get("channel"), ctl.get("switch")), 1)])
    out.gauge("port_max_frame_bytes", "Largest frame the port sends (from the Ethernet header, no CRC).",
              ["port"], [((p["port"],), p["max_frame"]) for p in ports if "max_frame" in p], optional=True)


def _traffic_families(out: _Out, c: dict) -> None:
    """Frames by message type, drops by reason (and port), completed messages, ARP replies."""
    out.counter("frames", "Frames accepted and sent on, by message type (a message of N fragments counts N).",
                ["type"], [((t,), n) for t, n in c.get("types", {}).items()])
    if "drops_by_port" in c:  # dpdk: per port (the one a frame came in on; tx_full: the one it could not leave by)
        out.counter("drops", "Frames dropped, by card port and reason (docs/control-socket.md, drop reasons).",
                    ["port", "reason"], [((p["port"], r), n) for p in c["drops_by_port"] for r, n in p.items()
                                         if r != "port"])
    else:  # bmv2 counts drops by reason only
        out.counter("drops", "Frames dropped, by reason (docs/control-socket.md, drop reasons).", ["reason"],
                    [((r,), n) for r, n in c.get("drops", {}).items()])
    if "completed" in c:
        out.counter("messages_completed", "Messages whose whole reply passed the card, by reply type.",
                    ["reply_type"], [((t,), n) for t, n in c["completed"].items()])
    if "arp" in c:
        out.counter("arp_replies", "ARP requests for a card port's address answered.",
                    rows=[((), c["arp"].get("replies", 0))])


def _ring_families(out: _Out, c: dict) -> None:
    """The header ring(s) and the mbuf pool."""
    ring = c.get("ring", {})
    if "size" in ring:
        out.gauge("ring_size", "Header ring slots (summed over the rings of several state lcores).",
                  rows=[((), ring["size"])])
        out.gauge("ring_entries", "Headers waiting in the header ring.", rows=[((), ring.get("count", 0))])
    for add, k, name, what in (
            (out.gauge, "rings", "rings", "Header rings (one per state lcore)."),
            (out.gauge, "high_water", "ring_high_water", "Most headers the ring held after an enqueue since the "
                                                         "counters were reset."),
            (out.counter, "logged", "ring_logged", "Headers the card logged in its register ring (bmv2).")):
        if k in ring:
            add(name, what, rows=[((), ring[k])])
    mp = c.get("mempool")
    for k, what in (("size", "mbufs in the card's mempool."), ("available", "mbufs free (per-lcore caches included)."),
                    ("in_use", "mbufs in use.")) if mp else ():
        out.gauge(f"mempool_{k}", what, rows=[((), mp.get(k, 0))])


def _state_families(out: _Out, st: dict) -> None:
    """The message state map: entries, capacity, states, overflow, expiry, partitions."""
    out.gauge("state_entries", "Messages in flight in the message state map.", rows=[((), st.get("entries", 0))])
    out.gauge("state_capacity", "Messages the state map can hold.", rows=[((), st.get("capacity", 0))])
    if "partitions" in st:
        out.gauge("state_partitions", "Partitions of the state map (one per state lcore).",
                  rows=[((), st["partitions"])])
    out.gauge("state_messages", "Messages in flight by state.", ["state"],
              [((k,), v) for k, v in st.get("by_state", {}).items()])
    out.counter("state_overflow", "New messages refused because the state map was full (dropped as state_full).",
                rows=[((), st.get("overflow", 0))])
    out.counter("state_expired", "State map entries freed by the state timeout.", rows=[((), st.get("expired", 0))])
    parts = st.get("by_partition", [])
    for add, name, k, what in (
            (out.gauge, "entries", "entries", "Messages in flight per state-map partition (one per state lcore)."),
            (out.counter, "completed", "completed_since_start", "Messages completed per partition since the card "
                                                                "started."),
            (out.counter, "expired", "expired_since_start", "Entries expired per partition since the card started.")
    ) if parts else ():
        add(f"state_partition_{name}", what, ["partition", "lcore"],
            [((p["partition"], p["lcore"]), p[k]) for p in parts])


def _shard_families(out: _Out, shards: list[dict]) -> None:
    """Per routed shard: completed and expired messages, the card's latency histogram."""
    reply_names = [t.name for t in sorted(consts.REPLY_TYPES)]
    rows = [((_shard(s), t), s[t]) for s in shards for t in reply_names if t in s]
    out.counter("shard_messages_completed", "Messages completed per shard, by reply type.",
                ["shard", "reply_type"], rows, optional=True)
    for k, what in (("completed", "Messages completed per shard (every reply type)."),  # bmv2: not by type
                    ("expired", "State map entries of each shard's messages that expired.")):
        out.counter(f"shard_{k}", what, ["shard"], [((_shard(s),), s[k]) for s in shards if k in s],
                    optional=True)
    hists = [s for s in shards if "latency_hist" in s]
    if hists:
        f = out.Histogram("embnic_card_shard_latency_seconds", "Time from a message's first request frame to its "
                          "last reply frame through the card, per shard (measured on the card).", labels=["shard"])
        for s in hists:
            f.add_metric([_shard(s)], log2_us_histogram(s["latency_hist"]), s.get("latency_sum_ns", 0) / 1e9)
        out.families.append(f)


def _shard(rec: dict) -> str:
    """The ``shard`` label of a per-shard record: its id, or ``other`` for the card's catch-all (-1)."""
    s = rec.get("shard", -1)
    return "other" if s is None or s < 0 else str(s)


class CardCollector:
    """A prometheus_client collector of one loaded pipeline: every scrape reads the card.

    Args:
        target: a :class:`~embnic.control.targets.base.Target` of a loaded pipeline (dpdk, bmv2 or p4dpdk).
        describe_target: ``{"target": "dpdk", "pipeline": "embnic"}``: the labels of
            ``embnic_card_info``.

    ``embnic_card_up`` is 1 when the reading worked; when the card does not answer (not loaded,
    stopped, its socket busy) it is 0, the reason is logged and no other family is reported, so
    the exporter outlives the card it watches.
    """

    def __init__(self, target, describe_target: dict | None = None):
        self.target = target
        self.labels = dict(describe_target or {})
        self._lock = threading.Lock()  # one reading at a time: the control socket takes 16 connections
        self.last_error: ControlError | None = None  #: why the last scrape could not read the card
        self.quiet = False  #: no warning per failed reading (a one-shot caller reports last_error itself)

    def describe(self):
        return []  # no reading at registration

    def collect(self) -> list:
        out = _Out()
        try:
            with self._lock:
                c = self.target.counters()
                st = self.target.state_summary()
        except ControlError as e:
            if not self.quiet:
                log.warning("cannot read the card: %s", e)
            self.last_error = e
            out.gauge("up", "1 when the exporter could read the card at this scrape.", rows=[((), 0)])
            return out.families
        self.last_error = None
        out.gauge("up", "1 when the exporter could read the card at this scrape.", rows=[((), 1)])
        keys = sorted(self.labels)
        out.gauge("info", "The pipeline this exporter reads (value 1).", keys,
                  [([self.labels[k] for k in keys], 1)] if keys else [], optional=True)
        return out.families + card_families(c, st)


#: connections the metrics endpoint serves at once (one thread each); more are answered ``503`` and closed
MAX_CONNECTIONS = 16
#: seconds a metrics connection may stay silent (no request line, no header) before it is closed
IDLE_TIMEOUT_S = 10.0

_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
         b"Content-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n")


def _http_server(pc, registry, bind: str, port: int, max_connections: int, idle_timeout_s: float):
    """A threading WSGI server of ``registry``'s metrics (prometheus_client's app) with a cap on
    the connections served at once, an idle timeout per connection and an answer to HTTP/0.9
    (:class:`MetricsServer`). Bound, not yet serving.

    Raises:
        OSError: the address cannot be bound.
    """
    import socketserver
    from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer

    app = pc.make_wsgi_app(registry)

    class Handler(WSGIRequestHandler):
        timeout = idle_timeout_s  # StreamRequestHandler.setup: the socket's timeout (silence closes it)

        def log_message(self, format, *args):  # noqa: A002 - the base class's name
            pass

        def handle(self):
            """One request (WSGIRequestHandler.handle), except that an HTTP/0.9 request — a request
            line without a version, after which no headers come — is answered at once with the
            exposition text alone (no status line or headers: HTTP/0.9's response) instead of
            waiting for headers that never come."""
            try:
                self.raw_requestline = self.rfile.readline(65537)
            except OSError:  # idle past the timeout, or reset
                return
            if len(self.raw_requestline) > 65536:
                self.requestline, self.request_version, self.command = "", "", ""
                self.send_error(414)
                return
            words = self.raw_requestline.split()
            if len(words) == 2 and words[0] == b"GET":
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.wfile.write(pc.generate_latest(registry))
                return
            try:
                if not self.parse_request():
                    return
            except OSError:
                return
            handler = ServerHandler(self.rfile, self.wfile, self.get_stderr(), self.get_environ(),
                                    multithread=False)
            handler.request_handler = self
            handler.run(self.server.get_app())

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = pc.exposition._get_best_family(bind, port)[0]

        def __init__(self, *a, **kw):
            self.slots = threading.BoundedSemaphore(max_connections)
            self.refused = 0
            super().__init__(*a, **kw)

        def process_request(self, request, client_address):
            if not self.slots.acquire(blocking=False):  # at the cap: no thread, a short answer
                self.refused += 1
                with contextlib.suppress(OSError):
                    request.setblocking(False)
                    request.send(_BUSY)
                self.shutdown_request(request)
                return
            try:
                super().process_request(request, client_address)
            except BaseException:
                self.slots.release()
                raise

        def process_request_thread(self, request, client_address):
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.slots.release()

    httpd = Server((bind, int(port)), Handler)
    httpd.set_app(app)
    return httpd


class MetricsServer:
    """An HTTP server of one collector's metrics (``GET /metrics``) on a thread of this process.

    At most ``max_connections`` connections are served at once, each on a thread of its own;
    one more is answered ``503 Service Unavailable`` and closed at once (no thread), so a client
    that opens connections and never finishes a request (slowloris) costs a bounded number of
    threads. A connection silent for ``idle_timeout_s`` seconds is closed. An HTTP/0.9 request
    (``GET /metrics`` with no version) gets the exposition text, as HTTP/0.9 answers, and the
    connection is closed. One request per connection (HTTP/1.0 semantics), as prometheus_client's
    own server.

    Args:
        collector: a prometheus_client collector (``collect()`` yields metric families).
        port: TCP port (0: a free one; :attr:`port` says which).
        bind: address to listen on.
        max_connections: connections served at once (default :data:`MAX_CONNECTIONS`).
        idle_timeout_s: seconds of silence before a connection is closed (default
            :data:`IDLE_TIMEOUT_S`).

    Raises:
        MissingDependencyError: prometheus-client is not installed.
        UsageError: ``bind`` is not an address of this host.
        OperationalError: the port is taken (names the option to change).
    """

    def __init__(self, collector, port: int = DEFAULT_PORT, bind: str = "0.0.0.0", *, option: str = "--port",
                 max_connections: int = MAX_CONNECTIONS, idle_timeout_s: float = IDLE_TIMEOUT_S):
        pc = require_prometheus()
        self.registry = pc.CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        try:
            self._server = _http_server(pc, self.registry, bind, int(port), int(max_connections),
                                        float(idle_timeout_s))
        except OSError as e:
            if e.errno == 98:  # EADDRINUSE
                raise OperationalError(f"cannot serve metrics on {bind}:{port}: the port is in use; "
                                       f"pick another {option} (ss -tlpn | grep :{port})") from None
            if e.errno == 99:  # EADDRNOTAVAIL
                raise UsageError(f"cannot serve metrics on {bind}:{port}: {bind} is not an address of this host "
                                 "(or network namespace)") from None
            raise OperationalError(f"cannot serve metrics on {bind}:{port}: {e.strerror or e}") from None
        self._thread = threading.Thread(target=self._server.serve_forever, name="embnic-metrics-http", daemon=True)
        self._thread.start()
        self.bind = bind
        self.port = self._server.server_address[1]

    @property
    def refused(self) -> int:
        """Connections answered ``503`` because ``max_connections`` were being served."""
        return self._server.refused if self._server is not None else 0

    def text(self) -> str:
        """The exposition text a scrape would get now (for tests and ``--once``)."""
        return require_prometheus().generate_latest(self.registry).decode()

    def close(self) -> None:
        """Stop serving and close the socket. Idempotent."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def exposition(collector) -> str:
    """The Prometheus text format of one reading of ``collector`` (no server)."""
    pc = require_prometheus()
    reg = pc.CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return pc.generate_latest(reg).decode()

