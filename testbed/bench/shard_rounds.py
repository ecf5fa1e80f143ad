"""Shard-side cost of one round by number of tables (``embnic bench server``, ``server.rounds``).

The method: docs/bench.md, "embnic bench server, rounds: one round by number of tables".
"""
from __future__ import annotations

import contextlib
import itertools
import socket
import time

import numpy as np

from embnic.client_lib import codec
from embnic.client_lib.config import parse_config
from embnic.client_lib.sockets import set_socket_buffers

TABLE_COUNTS = (2, 26)
DIM = 8
TARGET_RATIO = 1.2  #: CPU per round with 26 tables ÷ with 2 tables, at most
POOL_ROWS = 26 * 8192  #: rows the shard holds before timing, spread evenly over its tables


class _Rig:
    """One shard of a one-shard loopback cluster with ``ntables`` tables (ids 0..T-1, dim 8 fp32,
    Adagrad, any uint64 id) and a client socket aimed at it."""

    def __init__(self, ntables: int, total: int, rng: np.random.Generator, **engine_kw):
        from embnic.testbed.server.engine import BatchShardServer

        self.ntables = ntables
        self.cfg = parse_config({
            "cluster": {"name": "bench-rounds", "mtu": 1500, "seed": 5},
            "tables": [{"id": t, "name": f"C{t + 1}", "dim": DIM, "dtype": "fp32", "optimizer": "adagrad",
                        "lr": 0.01} for t in range(ntables)],
            "shards": [{"id": 0, "ip": "127.0.0.1", "port": 17890}], "clients": [{"id": 1, "ip": "127.0.0.1"}]})
        self.srv = BatchShardServer(self.cfg, 0, "127.0.0.1", 0, **engine_kw)
        self.addr = self.srv.open()
        self.cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        set_socket_buffers(self.cli)
        self.cli.bind(("127.0.0.1", 0))
        self.cli.setblocking(False)
        pool = POOL_ROWS // ntables
        self.pool = np.sort(rng.choice(np.iinfo(np.int64).max, size=(ntables, pool), replace=False), axis=1
                            ).astype(np.uint64)
        self.counts = np.full(ntables, total // ntables, np.int64)
        self.counts[: total % ntables] += 1
        self.msg_ids = itertools.count(2)
        # materialise every pool row (one update per table slice), untimed
        step = max(1, 6000 // ntables)  # an update of at most 6000 rows: within MAX_FRAGS fragments
        for a in range(0, pool, step):
            keys = self.pool[:, a:a + step].reshape(-1)
            self._serve(self.encode("update", keys, [min(step, pool - a)] * ntables,
                                    np.zeros(keys.size * DIM, "<f4").tobytes()))

    def encode(self, op: str, keys: np.ndarray, counts, values: bytes = b"") -> list[bytes]:
        """The frames of a lookup or update (fp32 ``values``) of ``keys``, ``counts[t]`` of table t."""
        d = codec.make_directory(np.arange(self.ntables), [DIM] * self.ntables, [1] * self.ntables, counts)
        kw = dict(msg_id=next(self.msg_ids), client_id=1, shard_id=0, directory=d, keys=keys)
        return codec.encode_lookup(**kw) if op == "lookup" else codec.encode_update(**kw, values=values)

    def frames(self, op: str, rng: np.random.Generator) -> list[bytes]:
        """One round's request frames: ``counts[t]`` ids of table t (sorted, distinct)."""
        keys = np.concatenate([np.sort(rng.choice(self.pool[t], int(c), replace=False))
                               for t, c in enumerate(self.counts.tolist())])
        g = (rng.standard_normal((keys.size, DIM)) * 0.1).astype("<f4").tobytes() if op == "update" else b""
        return self.encode(op, keys, self.counts, g)

    def _serve(self, frames: list[bytes]) -> tuple[float, int]:
        """Send ``frames`` to the shard, then time its wake-ups until every frame is taken.
        Returns (CPU seconds of the shard's receive + serve, wake-ups)."""
        for f in frames:
            self.cli.sendto(f, self.addr)
        srv, bs = self.srv, self.srv.bs
        left, cpu, wakeups = len(frames), 0.0, 0
        t_end = time.monotonic() + 10.0
        while left > 0:
            c0 = time.thread_time()
            n = bs.recv()
            if n:
                srv.serve_batch(n)
            cpu += time.thread_time() - c0
            if n:
                left -= n
                wakeups += 1
            elif time.monotonic() > t_end:
                raise RuntimeError(f"bench rounds: the shard's socket lost {left} of {len(frames)} frames")
        with contextlib.suppress(BlockingIOError):  # the replies, untimed
            while True:
                self.cli.recv(65536)
        return cpu, wakeups

    def close(self) -> None:
        self.cli.close()
        self.srv.close()


def run(*, total: int = 1300, rounds: int = 200, seed: int = 0, **engine_kw) -> dict:
    """Measure one lookup round and one update round of ``total`` ids over 2 and over 26 tables.

    Args:
        total: ids per round (spread evenly over the tables).
        rounds: timed rounds per table count and operation (median).
        engine_kw: passed to the shard (e.g. ``c_answer=False`` for the numpy answer path).

    Returns:
        ``{"total_ids", "rounds", "<op>_<T>_us"`` (median CPU µs per round), ``"<op>_<T>_p90_us"``,
        ``"<op>_<T>_wakeups"``, ``"ratio_26_vs_2_<op>"``, ``"target"``, ``"met"``}.
    """
    rng = np.random.default_rng(seed)
    rigs = {t: _Rig(t, total, rng, **engine_kw) for t in TABLE_COUNTS}
    out: dict = {"total_ids": total, "rounds": rounds, "dim": DIM, "optimizer": "adagrad",
                 "request": "one message per round (one shard)"}
    try:
        for op in ("lookup", "update"):
            times = {t: [] for t in TABLE_COUNTS}
            wk = {t: 0 for t in TABLE_COUNTS}
            for r in range(rounds + 5):
                for t, rig in rigs.items():
                    cpu, w = rig._serve(rig.frames(op, rng))
                    if r >= 5:  # the first rounds warm caches and the engine's buffers
                        times[t].append(cpu)
                        wk[t] += w
            for t in TABLE_COUNTS:
                out[f"{op}_{t}_us"] = float(np.median(times[t]) * 1e6)
                out[f"{op}_{t}_p90_us"] = float(np.percentile(times[t], 90) * 1e6)
                out[f"{op}_{t}_wakeups"] = wk[t] / rounds
            out[f"ratio_26_vs_2_{op}"] = out[f"{op}_26_us"] / out[f"{op}_2_us"]
        out["target"] = TARGET_RATIO
        out["met"] = all(out[f"ratio_26_vs_2_{op}"] <= TARGET_RATIO for op in ("lookup", "update"))
        out["engine"] = rigs[2].srv.counters()["engine"]["intake"]
    finally:
        for rig in rigs.values():
            rig.close()
    return out

