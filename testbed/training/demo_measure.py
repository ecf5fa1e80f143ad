"""What the demo measures and checks beside its training loop (:mod:`.demo` runs them): the
reference run, the probes between steps, the other clients' load, the counters at the end of
training and the tables read back."""
from __future__ import annotations

import threading
import time

import numpy as np

from embnic.client_lib.config import ClusterConfig
from embnic.testbed.net.probe import ask

from . import report as R

class Reader(threading.Thread):
    """Another client's load during training: lookups of its own batches, no updates.

    ``offset``: its first sample (row of ``data``); batch ``k`` is rows ``offset + k*batch_size ...`` modulo
    the rows. ``result()`` gives its rounds, messages, frames, retransmits and error (None if none).
    """

    def __init__(self, client, cfg: ClusterConfig, data, batch_size: int, offset: int):
        super().__init__(daemon=True, name=f"reader-{client.client_id}")
        self.client, self.cfg, self.data, self.batch_size, self.offset = client, cfg, data, batch_size, offset
        self.stop = threading.Event()
        self.rounds = 0
        self.error: str | None = None

    def run(self) -> None:
        from .train import embed_batch

        n = len(self.data.labels)
        try:
            while not self.stop.is_set():
                idx = (self.offset + self.rounds * self.batch_size + np.arange(self.batch_size)) % n
                embed_batch(self.client, self.cfg, self.data.sparse[idx])
                self.rounds += 1
        except Exception as e:  # noqa: BLE001 - reported, the training client decides the run
            self.error = f"{type(e).__name__}: {e}"

    def result(self) -> dict:
        """What this reader did (see the class docstring)."""
        s = self.client.stats
        return {"lookup_rounds": self.rounds, "messages": s.messages_sent + s.messages_received,
                "requests_sent": s.messages_sent, "frames_sent": s.frames_sent, "retransmits": s.retransmits,
                "tail_probes": s.probes, "error": self.error}


def stop_readers(readers: list) -> None:
    """Stop every :class:`Reader` (its current round completes), join it (≤ 30 s) and close its client."""
    for r in readers:
        r.stop.set()
    for r in readers:
        r.join(30)
        if r.client.sock.fileno() != -1:  # not closed yet
            r.client.close()


_SNAPSHOT = ("messages_sent", "messages_received", "frames_sent", "frames_received", "bytes_sent", "bytes_received",
             "retransmits", "rounds", "data_rounds", "round_messages", "round_shards", "stale_replies")


def client_snapshot(client) -> dict:
    """The counters of an :class:`~embnic.client_lib.client.EmbeddingClient` now (message, frame and byte
    counts, retransmits, tail probes (one-key lookups after a round's last message, not among the
    messages), rounds (and of the lookup/update rounds: their request messages and the shards they
    touched), stale replies, the number of lookup latencies so far, drops by reason)."""
    s = client.stats
    return {**{k: getattr(s, k) for k in _SNAPSHOT}, "tail_probes": s.probes,
            "latencies": len(s.lookup_latency_us), "drops": dict(client.drops)}


_PROBE_ID_BASE = 0xFFFE0000  #: msg ids of the between-step probes (the testbed's own probes use 0xFFFF....)


def probe_rtts(client, cfg: ClusterConfig, seq: int, timeout_s: float = 1.0, tries: int = 3,
               sent: dict | None = None) -> dict[int, float]:
    """One-key lookup round trips (µs) through the card to every shard, on the training client's
    own socket and path, between two steps (no request of the client is in flight then).

    The same probe as the testbed's readiness probe (:func:`~embnic.testbed.net.probe.ask`:
    a key each shard owns), so ``lookup p50 / probe p50`` compares a training lookup with the
    smallest message on the same path at the same moment of the run. A probe unanswered after
    ``tries`` × ``timeout_s`` is left out (the step's own retries report a dead path).

    Args:
        sent: counters ``sent`` (probe messages, retries included) and ``frames_sent`` to add to
            (the card counts these frames too).

    Returns:
        ``{shard_id: rtt_us}`` for the shards that answered.
    """
    out = {}
    for i, s in enumerate(cfg.shards):
        msg_id = _PROBE_ID_BASE + ((seq * len(cfg.shards) + i) & 0xFFFF)
        got, _, sends = ask(client.sock, cfg, client.client_id, s.id, msg_id, tries * timeout_s, timeout_s)
        if sent is not None:
            sent["frames_sent"] += sends  # a one-key lookup is one frame
            sent["sent"] += sends
        if got is not None:
            out[s.id] = got * 1e6
    return out


def reference_run(cfg: ClusterConfig, train_data, valid_data, steps: int, batch_size: int,
                  progress: bool | None = None, model: str = "fm"):
    """Train ``model`` with in-process tables. Returns (TrainResult, LocalBackend, seconds)."""
    from embnic.client_lib.local import LocalBackend

    from .train import trainer

    train = trainer(model)
    local = LocalBackend(cfg)
    t0 = time.monotonic()
    with R.Progress(steps, "reference (in-process tables)", enabled=progress) as bar:
        res = train(cfg, train_data, steps=steps, batch_size=batch_size, backend=local, eval_data=valid_data,
                    progress=lambda i, loss: bar.update(1, loss=f"{loss:.4f}"))
    return res, local, time.monotonic() - t0


def compare_tables(client, local, tables_per_round: int = 2) -> dict:
    """Read every row the reference run updated back from the shards (through ``client``) and
    compare with the reference tables.

    Returns:
        ``{"rows": N, "max_abs_diff": float, "equal": bool, "tables": T}`` (equal = bitwise).
    """
    state = {t: ks for t, (ks, _, _) in local.state_dict().items() if ks.size}
    ref = local.lookup(state) if state else {}
    ids = sorted(state)
    n, worst, equal = 0, 0.0, True
    for i in range(0, len(ids), tables_per_round):
        chunk = {t: state[t] for t in ids[i:i + tables_per_round]}
        got = client.lookup(chunk)
        for t in chunk:
            d = np.abs(got[t].astype(np.float64) - ref[t].astype(np.float64))
            worst = max(worst, float(d.max()) if d.size else 0.0)
            equal = equal and bool(np.array_equal(got[t], ref[t]))
            n += len(chunk[t])
    return {"rows": n, "tables": len(ids), "max_abs_diff": worst, "equal": equal}
