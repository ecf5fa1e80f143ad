"""Running shards in threads of this process: pick an engine (:func:`make_server`), serve it on a
thread (:class:`ServerThread`), or every shard of a config (:class:`ServerCluster`).

What tests, the benchmarks and in-process clusters use (either engine). A shard as a process of
its own (``embnic server``, ``python -m embnic.testbed.server``) is run by
:func:`~.foreground.run_server`. The engines themselves live in :mod:`.shard` (the readable
reference) and :mod:`.engine` (the batch engine).
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.table_numerics import merge_states

from .engine import BatchShardServer
from .shard import ShardServer

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
