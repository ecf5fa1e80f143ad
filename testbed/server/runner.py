"""Running shards in threads of this process: one shard on a thread (:class:`ServerThread`), or
every shard of a config (:class:`ServerCluster`).

What tests, the benchmarks and in-process clusters use. A shard as a process of its own
(``embnic server``, ``python -m embnic.testbed.server``) is run by
:func:`~.foreground.run_server`. The serving loop is :class:`~.engine.BatchShardServer` (its state
and rules: :mod:`.shard_state`).
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any

from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.table_numerics import merge_states

from .engine import BatchShardServer


class ServerThread:
    """Run a shard's serving loop on a background thread (for tests and in-process clusters).
    A context manager; ``port`` is the bound port once entered.

    Args:
        cfg, shard_id, bind, port, **kwargs: as :class:`~.engine.BatchShardServer` (``bind``
            defaults to 127.0.0.1 and ``port`` to 0 — a free port — here).
        server_class: the serving loop (anything with :class:`~.engine.BatchShardServer`'s
            ``open``, ``run``, ``request_stop``, ``call``, ``close``, ``counters``, ``state_dict``;
            the tests run their reference shard through it).

    Raises:
        OSError: (on ``start``/enter) the address cannot be bound.
    """

    def __init__(self, cfg: ClusterConfig, shard_id: int, bind: str = "127.0.0.1", port: int = 0, *,
                 server_class=BatchShardServer, **kwargs):
        self.server = server_class(cfg, shard_id, bind, port, **kwargs)
        self._thread: threading.Thread | None = None
        self.address: tuple[str, int] | None = None

    @property
    def port(self) -> int:
        return self.address[1]

    def start(self, timeout_s: float = 10.0) -> "ServerThread":
        """Start the thread and wait until the socket is bound.

        Raises:
            OSError: the bind failed. RuntimeError: the thread did not bind in ``timeout_s``.
        """
        ready = threading.Event()
        err: list[BaseException] = []

        def run():
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

        self._thread = threading.Thread(target=run, name=f"embnic-shard-{self.server.shard_id}", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise RuntimeError(f"shard {self.server.shard_id} did not start within {timeout_s} s")
        if err:
            self._thread.join()
            raise err[0]
        return self

    def call(self, fn, *args, timeout_s: float = 10.0):
        """Run ``fn(*args)`` on the serving thread and return its result (thread-safe access)."""
        return self.server.call(fn, *args, timeout_s=timeout_s)

    def counters(self) -> dict[str, Any]:
        """The shard's counters, read on its serving thread."""
        return self.call(self.server.counters)

    def state_dict(self) -> dict:
        """The shard's updated rows (:meth:`.ShardState.state_dict`), read on its serving thread."""
        return self.call(self.server.state_dict)

    def stop(self) -> None:
        """Stop the loop and join the thread. Idempotent."""
        if self._thread is None:
            return
        self.server.request_stop()
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
