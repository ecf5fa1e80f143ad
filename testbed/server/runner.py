"""Running a shard: pick an engine, serve in the foreground, or in a thread of this process.

One runner per kind of process (STYLE.md): ``embnic server`` and ``python -m
embnic.testbed.server`` call :func:`run_server`; tests, the benchmarks and in-process clusters
use :class:`ServerThread` / :class:`ServerCluster` (either engine). The engines themselves live
in :mod:`.shard` (the readable reference) and :mod:`.engine` (the batch engine); worker
processes behind one address in :mod:`.workers`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import logging
import signal
import threading
from typing import Any

from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.table_numerics import merge_states

from .shard import ShardServer

log = logging.getLogger("embnic.server")

ENGINES = ("batch", "reference")  #: shard engines: the batch engine (default) and the readable reference


def make_server(engine: str, cfg: ClusterConfig, shard_id: int, bind: str | None = None, port: int | None = None,
                **kwargs) -> ShardServer:
    """A shard server of ``engine`` (:data:`ENGINES`): ``"batch"`` →
    :class:`~embnic.testbed.server.engine.BatchShardServer`, ``"reference"`` → :class:`ShardServer`.

    Raises:
        ValueError: unknown engine. KeyError: unknown shard.
    """
    if engine == "reference":
        return ShardServer(cfg, shard_id, bind, port, **kwargs)
    if engine == "batch":
        from .engine import BatchShardServer

        return BatchShardServer(cfg, shard_id, bind, port, **kwargs)
    raise ValueError(f"unknown shard engine {engine!r} (engines: {', '.join(ENGINES)})")


class ServerThread:
    """Run a :class:`ShardServer` on its own event loop in a background thread (for tests and
    in-process clusters). A context manager; ``port`` is the bound port once entered.

    Args:
        cfg, shard_id, bind, port, **kwargs: as :class:`ShardServer` (``bind`` defaults to
            127.0.0.1 and ``port`` to 0 — a free port — here).
        engine: ``"batch"`` (:class:`~embnic.testbed.server.engine.BatchShardServer`, its own
            poll loop) or ``"reference"`` (:class:`ShardServer` on an asyncio loop).

    Raises:
        OSError: (on ``start``/enter) the address cannot be bound.
        ValueError: unknown ``engine``.
    """

    def __init__(self, cfg: ClusterConfig, shard_id: int, bind: str = "127.0.0.1", port: int = 0, *,
                 engine: str = "batch", **kwargs):
        self.server = make_server(engine, cfg, shard_id, bind, port, **kwargs)
        self.engine = engine
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.address: tuple[str, int] | None = None

    @property
    def port(self) -> int:
        return self.address[1]

    def start(self, timeout_s: float = 10.0) -> "ServerThread":
        """Start the thread and wait until the socket is bound.

        Raises:
            OSError: the bind failed. RuntimeError: the loop did not start in ``timeout_s``.
        """
        ready = threading.Event()
        err: list[BaseException] = []

        def run_batch():
            try:
                self.address = self.server.open()
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                err.append(e)
                ready.set()
                return
            ready.set()
            try:
                self.server.run()
            finally:
                self.server.close()

        def run():
            loop = asyncio.new_event_loop()
            self.loop = loop
            asyncio.set_event_loop(loop)
            try:
                self.address = loop.run_until_complete(self.server.start())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                err.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                self.server.stop()
                loop.run_until_complete(asyncio.sleep(0))
                loop.close()
                self.server.close_stores()

        self._thread = threading.Thread(target=run if self.engine == "reference" else run_batch,
                                        name=f"embnic-shard-{self.server.shard_id}", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise RuntimeError(f"shard {self.server.shard_id} did not start within {timeout_s} s")
        if err:
            self._thread.join()
            raise err[0]
        return self

    def call(self, fn, *args, timeout_s: float = 10.0):
        """Run ``fn(*args)`` on the server's loop and return its result (thread-safe access)."""
        if self.engine != "reference":
            return self.server.call(fn, *args, timeout_s=timeout_s)

        async def go():
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(go(), self.loop).result(timeout_s)

    def counters(self) -> dict[str, Any]:
        """:meth:`ShardServer.counters`, read on the server's loop."""
        return self.call(self.server.counters)

    def state_dict(self) -> dict:
        """:meth:`ShardServer.state_dict`, read on the server's loop."""
        return self.call(self.server.state_dict)

    def stop(self) -> None:
        """Stop the loop and join the thread. Idempotent."""
        if self._thread is None:
            return
        if self.engine != "reference":
            self.server.request_stop()
        elif self.loop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10.0)
        self._thread = None

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ServerCluster:
    """Every shard of ``cfg`` as a :class:`ServerThread` on ``bind`` with free ports.

    ``cluster.cfg`` is ``cfg`` with each shard's ``ip``/``port`` replaced by where it really
    listens and the card disabled, so an :class:`~embnic.client_lib.client.EmbeddingClient`
    built from it talks to these servers directly.

    Example::

        with ServerCluster(cfg) as cl, EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0)) as c:
            rows = c.lookup({0: np.arange(10, dtype=np.uint64)})
        state = cl.state_dict()      # merged over shards, after the servers stopped
    """

    def __init__(self, cfg: ClusterConfig, bind: str = "127.0.0.1", **kwargs):
        self.base_cfg = cfg
        self.threads = [ServerThread(cfg, s.id, bind, 0, **kwargs) for s in cfg.shards]
        self.cfg: ClusterConfig | None = None
        self._final_state: dict | None = None
        self._final_counters: list | None = None

    def start(self) -> "ServerCluster":
        try:
            for t in self.threads:
                t.start()
        except BaseException:
            self.stop()
            raise
        shards = tuple(dataclasses.replace(s, ip=t.address[0], port=t.port)
                       for s, t in zip(self.base_cfg.shards, self.threads))
        self.cfg = dataclasses.replace(self.base_cfg, shards=shards, card=None)
        return self

    def counters(self) -> list[dict]:
        """Counters of every shard (live, or as they were at stop)."""
        if self._final_counters is not None:
            return self._final_counters
        return [t.counters() for t in self.threads]

    def state_dict(self) -> dict:
        """Updated rows of every shard merged (:func:`~embnic.client_lib.table_numerics.merge_states`)."""
        if self._final_state is not None:
            return self._final_state
        return merge_states([t.state_dict() for t in self.threads])

    def stop(self) -> None:
        """Snapshot state and counters, then stop every shard (reverse order)."""
        live = [t for t in self.threads if t._thread is not None]
        if live and len(live) == len(self.threads) and self._final_state is None:
            self._final_state = merge_states([t.state_dict() for t in self.threads])
            self._final_counters = [t.counters() for t in self.threads]
        for t in reversed(self.threads):
            t.stop()

    def __enter__(self) -> "ServerCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def run_server(cfg: ClusterConfig, shard_id: int, bind: str | None = None, port: int | None = None, *,
               engine: str = "batch", workers: int = 1, metrics_port: int | None = None,
               metrics_bind: str = "0.0.0.0", **kwargs) -> int:
    """Run one shard in the foreground until SIGTERM/SIGINT (the ``embnic server`` command).

    Logs ``listening on IP:PORT`` once bound, and the counters as one JSON line at exit.
    With ``checkpoint_dir`` (``**kwargs``, see :class:`ShardServer`) SIGUSR1 writes a checkpoint.

    Args:
        engine: ``"batch"`` (default) or ``"reference"`` (:func:`make_server`).
        workers: worker processes behind the one address (batch engine only; see
            :func:`embnic.testbed.server.workers.run_workers`).
        metrics_port: serve Prometheus metrics on ``metrics_bind:metrics_port`` (TCP; 0: a free
            port) while serving (:mod:`embnic.testbed.server.metrics`); None: no endpoint.

    Returns:
        0 after a clean stop; 1 if a worker process died or the log could not be written.

    Raises:
        KeyError: unknown shard. OSError: the address cannot be bound. ValueError: unknown
        engine, or ``workers > 1`` with the reference engine. ControlError: the metrics port
        cannot be served (taken: ``OperationalError``) or prometheus-client is missing.
    """
    if workers > 1 or engine == "batch":
        if engine != "batch":
            raise ValueError("--workers needs the batch engine")
        from .workers import run_workers

        return run_workers(cfg, shard_id, bind, port, workers=workers, metrics_port=metrics_port,
                           metrics_bind=metrics_bind, **kwargs)
    # a SIGTERM before the loop's handlers are in (the disk tables' temporary stores opening) would
    # end the process with no handler and leave them behind: keep it for when the server can stop
    early: list = []
    old = {sig: signal.signal(sig, lambda *_: early.append(1)) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server = make_server(engine, cfg, shard_id, bind, port, **kwargs)
    except BaseException:
        for sig, h in old.items():
            signal.signal(sig, h)
        raise

    async def main() -> None:
        ip, p = await server.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        metrics = None
        if metrics_port is not None:
            from .metrics import serve_metrics

            async def read():
                return server.counters()

            try:
                metrics = serve_metrics(lambda: asyncio.run_coroutine_threadsafe(read(), loop).result(10),
                                        metrics_port, metrics_bind)
            except BaseException:
                server.stop()
                raise
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if early:
            stop.set()
        if server._dur is not None:
            loop.add_signal_handler(signal.SIGUSR1, server.checkpoint)
        log.info("shard %d listening on %s:%d (%s; engine reference)", shard_id, ip, p, describe(cfg))
        try:
            await stop.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            if metrics is not None:
                metrics.close()
            server.stop()
            if server._dur is not None:
                server._dur.close()
            server.close_stores()
        log.info("shard %d stopped; counters %s", shard_id, json.dumps(server.counters(), sort_keys=True))

    asyncio.run(main())
    return 1 if server.durable_failed else 0


def describe(cfg: ClusterConfig) -> str:
    """``26 tables 0..25, sharding hash over 2 shards, MTU 1500`` (for the listening line)."""
    return f"{len(cfg.tables)} tables {cfg.table_ids_text()}, sharding {cfg.sharding} over {cfg.num_shards} shards, MTU {cfg.mtu}"


def bind_error_message(e: OSError, ip: str, port: int) -> str:
    """One line explaining a failed bind, naming the fix."""
    if e.errno == errno.EADDRINUSE:
        return (f"cannot bind {ip}:{port}: address already in use; stop the process holding it "
                f"(ss -ulpn | grep :{port}) or pick another --port")
    if e.errno == errno.EADDRNOTAVAIL:
        return (f"cannot bind {ip}:{port}: {ip} is not an address of this host (or network namespace); "
                f"run inside the shard's namespace or pass --bind")
    return f"cannot bind {ip}:{port}: {e.strerror or e}"


#: log line format of a shard process (``embnic server`` and ``python -m embnic.testbed.server``);
#: trace replay reads the ``stopped; counters {...}`` line back from it
LOG_FORMAT = "%(asctime)s embnic-server[%(process)d] %(levelname)s %(message)s"
