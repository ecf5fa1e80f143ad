"""Running a shard as a process of its own, in the foreground until SIGTERM/SIGINT.

``embnic server`` and ``python -m embnic.testbed.server`` call :func:`run_server` (the one runner
of a shard process, STYLE.md): the serving loop (:class:`~.engine.BatchShardServer`) in this
process, or in ``--workers N`` forked worker processes behind one address — a ``SO_REUSEPORT``
group whose classic BPF program (:func:`steering_program`) sends every message to its home
worker (the rows split over the workers, :mod:`.worker_hub`). Also the lines such a process writes: :data:`LOG_FORMAT`, the listening line's
:func:`describe`, :func:`bind_error_message`. Threads of this process: :mod:`.runner`.
"""
from __future__ import annotations

import ctypes
import errno
import json
import logging
import multiprocessing
import os
import signal
import socket
import struct
import threading
from multiprocessing.connection import wait

from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.sockets import set_socket_buffers

from .engine import BatchShardServer
from .shard_metrics import serve_metrics

log = logging.getLogger("embnic.server")


def steering_program(workers: int) -> bytes:
    """The classic BPF program that picks a worker socket of a ``SO_REUSEPORT`` group:
    ``(client_id + msg_id) mod workers`` — the message's **home** worker.

    The kernel runs it on the UDP payload (the embnic header: ``msg_id`` at offset 8,
    ``client_id`` at 12; ``msg_id`` reduced first, so the sum never wraps); a datagram too short
    goes to worker 0, whose one-frame path counts it ``too_short``. docs/server.md, "Workers".

    Returns:
        the ``struct sock_fprog`` filter array (7 instructions of 8 bytes).
    """
    ins = (
        (0x20, 0, 0, 8),         # BPF_LD | BPF_W | BPF_ABS: A = u32 at payload offset 8 (msg_id)
        (0x94, 0, 0, workers),   # BPF_ALU | BPF_MOD | BPF_K: A %= workers
        (0x07, 0, 0, 0),         # BPF_MISC | BPF_TAX: X = A
        (0x28, 0, 0, 12),        # BPF_LD | BPF_H | BPF_ABS: A = u16 at payload offset 12 (client_id)
        (0x0c, 0, 0, 0),         # BPF_ALU | BPF_ADD | BPF_X: A += X (< 2^16 + workers: no wrap)
        (0x94, 0, 0, workers),   # A %= workers
        (0x16, 0, 0, 0),         # BPF_RET | BPF_A
    )
    return b"".join(struct.pack("HBBI", *i) for i in ins)


def _reuseport_sockets(ip: str, port: int, workers: int) -> list[socket.socket]:
    """``workers`` UDP sockets bound to (ip, port) in one ``SO_REUSEPORT`` group, steered by
    :func:`steering_program` (socket ``i`` serves ``(client_id + msg_id) % workers == i``)."""
    socks: list[socket.socket] = []
    try:
        for i in range(workers):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            set_socket_buffers(s)
            s.bind((ip, port))
            port = s.getsockname()[1]  # port 0: the others join the one the first got
            if i == 0:
                code = steering_program(workers)
                prog = ctypes.create_string_buffer(code)
                fprog = struct.pack("HL", len(code) // 8, ctypes.addressof(prog))
                s.setsockopt(socket.SOL_SOCKET, 51, fprog)  # SO_ATTACH_REUSEPORT_CBPF
    except OSError:
        for s in socks:
            s.close()
        raise
    return socks


def _merge_counters(parts: list[dict]) -> dict:
    """Sum the counters of several workers (numbers add up, lists of numbers — histograms —
    element by element; ``shard`` is kept; ``engine`` becomes the per-worker list ``workers``)."""
    def add(a, b):
        if isinstance(a, dict):
            return {k: add(a.get(k, 0), b.get(k, 0)) if k in b else a[k] for k in a} | \
                   {k: v for k, v in b.items() if k not in a}
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            return [add(x, y) for x, y in zip(a, b)]
        if isinstance(a, bool) or not isinstance(a, (int, float)):
            return a
        return a + b

    out = {k: v for k, v in parts[0].items() if k != "engine"}
    for p in parts[1:]:
        out = add(out, {k: v for k, v in p.items() if k not in ("engine", "shard")})
    out["shard"] = parts[0]["shard"]
    out["workers"] = [p.get("engine", {}) for p in parts]
    return out


def _peer_pairs(workers: int) -> dict[tuple[int, int], tuple[socket.socket, socket.socket]]:
    """One Unix stream socket pair per pair of workers ``(i, j)``, ``i < j`` (i's end first)."""
    pairs = {}
    try:
        for i in range(workers):
            for j in range(i + 1, workers):
                pairs[(i, j)] = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError:
        for a, b in pairs.values():
            a.close()
            b.close()
        raise
    return pairs


def _ends_of(me: int, pairs: dict) -> dict[int, socket.socket]:
    """Worker ``me``'s ends of the pairs: ``{other worker: socket}``."""
    out = {}
    for (i, j), (a, b) in pairs.items():
        if i == me:
            out[j] = a
        elif j == me:
            out[i] = b
    return out


def _answer_stats(conn, server: BatchShardServer) -> None:
    """A worker's metrics thread: every request on ``conn`` is answered with the worker's
    counters, read on its serving thread between wake-ups (``None`` if it did not answer)."""
    while True:
        try:
            conn.recv()
        except (EOFError, OSError):
            return
        try:
            c = server.call(server.counters, timeout_s=5.0)
        except Exception:  # noqa: BLE001 - a stopping worker: the parent says which did not answer
            c = None
        try:
            conn.send(c)
        except OSError:
            return


def _read_workers(stats: list, lock) -> dict:
    """Every worker's counters through its stats pipe, summed (:func:`_merge_counters`).

    Raises:
        RuntimeError: a worker did not answer within 10 s (the scrape fails; Prometheus marks
            the target down).
    """
    with lock:
        for c in stats:
            c.send("counters")
        parts = []
        for i, c in enumerate(stats):
            got = c.recv() if c.poll(10) else None
            if got is None:
                raise RuntimeError(f"worker {i} did not answer for its counters")
            parts.append(got)
    return _merge_counters(parts)


def _on_signals(server: BatchShardServer, early: list) -> None:
    """SIGTERM/SIGINT stop ``server`` (at once if one came while it was built: ``early``),
    SIGUSR1 checkpoints it."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.request_stop())
    if early:
        server.request_stop()
    signal.signal(signal.SIGUSR1, lambda *_: server.request_checkpoint())


def _worker_main(cfg, shard_id, me, socks, pairs, conn, kwargs, stats=None) -> None:
    try:  # PR_SET_PDEATHSIG: a worker never outlives its parent (killed with SIGKILL, say)
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        return
    # keep only our own sockets: a peer's end left open here would hide its death from it
    mine = _ends_of(me, pairs)
    for s in [x for pair in pairs.values() for x in pair] + socks:
        if s is not socks[me] and all(s is not m for m in mine.values()):
            s.close()
    # the parent's handlers came along with the fork: a SIGTERM (the parent's death, say) while the
    # server is built (a disk table's store opening) would go to them and be lost; keep it for later
    early: list = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: early.append(1))
    server = BatchShardServer(cfg, shard_id, sock=socks[me], worker=(me, len(socks)), peer_socks=mine, **kwargs)
    _on_signals(server, early)
    server.open()
    if stats is not None:
        threading.Thread(target=_answer_stats, args=(stats, server), name="embnic-metrics", daemon=True).start()
    try:
        server.run()
    finally:
        conn.send(server.counters())
        conn.close()
        server.close_stores()  # a worker ends in os._exit: no finalizer would remove a scratch store


def _one_process(cfg: ClusterConfig, shard_id: int, ip: str, port: int, metrics_port: int | None,
                 metrics_bind: str, kwargs: dict) -> int:
    """:func:`run_server` with one worker: the serving loop in this process."""
    # a SIGTERM while the server is built (its disk tables' temporary stores opening) would end
    # the process with no handler and leave them behind: keep it for when the server can stop
    early: list = []
    old = {sig: signal.signal(sig, lambda *_: early.append(1)) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server = BatchShardServer(cfg, shard_id, ip, port, **kwargs)
    except BaseException:
        for sig, h in old.items():
            signal.signal(sig, h)
        raise
    _on_signals(server, early)
    # everything else first, the UDP port last, right before serving: a bound port is what says
    # "ready" (the testbed waits for it), and datagrams sent to it before the loop runs would
    # wait in the socket and be answered late (a re-sent probe answered twice)
    metrics = None
    if metrics_port is not None:
        try:
            metrics = serve_metrics(lambda: server.call(server.counters, timeout_s=10.0), metrics_port, metrics_bind)
        except BaseException:
            server.close()
            raise
    try:
        ip2, p2 = server.open()
    except BaseException:
        if metrics is not None:
            metrics.close()
        server.close()
        raise
    log.info("shard %d listening on %s:%d (%s; engine batch)", shard_id, ip2, p2, describe(cfg))
    try:
        server.run()
    finally:
        if metrics is not None:
            metrics.close()
        server.close()
    log.info("shard %d stopped; counters %s", shard_id, json.dumps(server.counters(), sort_keys=True))
    return 1 if server.durable_failed else 0


def _start_workers(cfg, shard_id: int, socks: list, pairs: dict, kwargs: dict, with_stats: bool):
    """Fork one worker process per socket: (processes, their counters pipes, their stats pipes)."""
    ctx = multiprocessing.get_context("fork")
    procs, conns, stats = [], [], []
    for i in range(len(socks)):
        a, b = ctx.Pipe(duplex=False)
        sa = sb = None
        if with_stats:
            sa, sb = ctx.Pipe(duplex=True)
        pr = ctx.Process(target=_worker_main, args=(cfg, shard_id, i, socks, pairs, b, kwargs, sb),
                         name=f"embnic-shard-{shard_id}-w{i}", daemon=True)
        pr.start()
        b.close()
        procs.append(pr)
        conns.append(a)
        if sb is not None:
            sb.close()
            stats.append(sa)
    for pair in pairs.values():  # the workers hold them now; a dead worker's end must close
        for x in pair:
            x.close()
    return procs, conns, stats


def _end_workers(shard_id: int, procs: list, conns: list, died) -> int:
    """Stop the workers, log their counters summed; 1 if one of them died first (``died``)."""
    for x in procs:
        if x.is_alive():
            os.kill(x.pid, signal.SIGTERM)
    parts = []
    for x, c in zip(procs, conns):
        x.join(30)
        try:
            if c.poll(5):
                parts.append(c.recv())
        except (EOFError, OSError):
            pass
    if parts:
        log.info("shard %d stopped; counters %s", shard_id, json.dumps(_merge_counters(parts), sort_keys=True))
    if died is not None:
        log.error("shard %d: worker %s (pid %d) died with exit code %s; stopped the others",
                  shard_id, died.name, died.pid, died.exitcode)
        return 1
    return 0


def run_workers(cfg: ClusterConfig, shard_id: int, ip: str, port: int, *, workers: int,
                metrics_port: int | None = None, metrics_bind: str = "0.0.0.0", **kwargs) -> int:
    """Serve one shard in ``workers`` (> 1) forked worker processes behind one address until
    SIGTERM/SIGINT: rows split by id range (:mod:`.worker_hub`), every datagram steered to its
    message's home worker (:func:`steering_program`), each home with its own exactly-once window
    (docs/server.md, "Workers"). ``metrics_port``: one endpoint for the shard, served here; a
    scrape asks every worker for its counters over a pipe of its own and sums them.

    Returns:
        0 after a clean stop; 1 if a worker died (the others are stopped).

    Raises:
        OSError: the address cannot be bound.
    """
    socks = _reuseport_sockets(ip, port, workers)
    try:
        pairs = _peer_pairs(workers)
    except OSError:
        for s in socks:
            s.close()
        raise
    ip2, p2 = socks[0].getsockname()[:2]
    procs, stats, metrics = [], [], None
    stop = {"flag": False}
    r, w = os.pipe()
    os.set_blocking(w, False)

    def on_signal(*_):
        stop["flag"] = True
        try:
            os.write(w, b"x")
        except OSError:
            pass

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        procs, conns, stats = _start_workers(cfg, shard_id, socks, pairs, kwargs, metrics_port is not None)
        if metrics_port is not None:
            lock = threading.Lock()
            metrics = serve_metrics(lambda: _read_workers(stats, lock), metrics_port, metrics_bind)
        log.info("shard %d listening on %s:%d (%s; engine batch, %d workers: rows split by id range, "
                 "messages steered by (client_id + msg_id) %% %d; pids %s)", shard_id, ip2, p2, describe(cfg),
                 workers, workers, ",".join(str(x.pid) for x in procs))
        died = None
        while not stop["flag"]:
            ready = wait([x.sentinel for x in procs] + [r])
            for x in procs:
                if x.sentinel in ready and not stop["flag"]:
                    died = x
                    stop["flag"] = True
        return _end_workers(shard_id, procs, conns, died)
    finally:
        if metrics is not None:
            metrics.close()
        for c in stats:
            c.close()
        for sig, h in old.items():
            signal.signal(sig, h)
        for x in procs:
            if x.is_alive():
                x.kill()
        for s in socks:
            s.close()
        for pair in pairs.values():
            for x in pair:
                x.close()
        os.close(r)
        os.close(w)


def run_server(cfg: ClusterConfig, shard_id: int, bind: str | None = None, port: int | None = None, *,
               workers: int = 1, metrics_port: int | None = None, metrics_bind: str = "0.0.0.0", **kwargs) -> int:
    """Run one shard in the foreground until SIGTERM/SIGINT (the ``embnic server`` command), in
    this process or in ``workers`` worker processes behind one address (:func:`run_workers`).

    Logs ``listening on IP:PORT`` once bound, and the counters as one JSON line at exit; SIGUSR1
    checkpoints (``**kwargs``: :class:`~.shard_state.ShardState`'s options).

    Args:
        workers: worker processes behind the one address.
        metrics_port: serve Prometheus metrics on ``metrics_bind:metrics_port`` (TCP; 0: a free
            port) while serving (:mod:`.shard_metrics`); None: no endpoint.

    Returns:
        0 after a clean stop; 1 if a worker process died or the log could not be written.

    Raises:
        KeyError: unknown shard. OSError: the address cannot be bound. ValueError:
        ``fixed_length``, ``checkpoint_dir`` or ``restore`` with ``workers > 1`` (a SIZE_REQ reaches
        one worker, the data messages it announces the homes of their own message ids; each worker
        would need its own log). NativeLibraryError: the shard's C library is missing or was built
        from other sources. ControlError: the metrics port cannot be served (taken:
        ``OperationalError``) or prometheus-client is missing.
    """
    me = cfg.shard(shard_id)
    ip = bind if bind is not None else me.ip
    p = me.port if port is None else int(port)
    if workers <= 1:
        return _one_process(cfg, shard_id, ip, p, metrics_port, metrics_bind, kwargs)
    if kwargs.get("fixed_length"):
        raise ValueError("--fixed-length needs one worker: a SIZE_REQ announces data messages that reach "
                         "other workers (each message's home is (client_id + msg_id) % workers)")
    if kwargs.get("checkpoint_dir") is not None or kwargs.get("restore") is not None:
        raise ValueError("--checkpoint-dir/--restore need --workers 1 (each worker would need its own log)")
    return run_workers(cfg, shard_id, ip, p, workers=workers, metrics_port=metrics_port, metrics_bind=metrics_bind,
                       **kwargs)


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


class ServerOptionError(ValueError):
    """A shard option that cannot work (a usage error: exit 2); ``str()`` is one line naming the fix."""


#: most worker processes one shard address takes (``--workers``)
MAX_WORKERS = 64


def check_server_options(cfg: ClusterConfig, shard_id: int, *, config_name: str = "the config",
                         bind: str | None = None, port: int | None = None,
                         dedup_window: int = 65536, workers: int = 1,
                         fixed_length: bool = False, checkpoint_dir: str | None = None,
                         checkpoint_every: int = 0, restore: str | None = None,
                         metrics_port: int | None = None, metrics_bind: str = "0.0.0.0") -> None:
    """The one set of checks of a shard process's options, before anything binds or touches the disk.

    ``embnic server`` and ``python -m embnic.testbed.server`` both call it with their parsed
    options (same names as :func:`run_server`'s) and turn the error into a one-line usage error.
    Creates nothing: a ``restore`` source must already hold ``shard-<id>/`` with a checkpoint or
    a write-ahead log (:func:`~embnic.testbed.server.durability.restorable`).

    ``config_name`` (the config's path) only names it in the message.

    Raises:
        ServerOptionError: the first problem found, in the order of the checks below.
    """
    import ipaddress
    from pathlib import Path

    from .durability import restorable
    from .stores import shard_dir

    ids = [s.id for s in cfg.shards]
    if shard_id not in ids:
        raise ServerOptionError(f"no shard {shard_id} in {config_name} (shards: {', '.join(map(str, ids))})")
    for name, value in (("--port", port), ("--metrics-port", metrics_port)):
        if value is not None and not 0 <= value <= 65535:
            raise ServerOptionError(f"{name} {value}: not a port; give 0..65535 (0 picks a free one)")
    for name, value in (("--bind", bind), ("--metrics-bind", metrics_bind)):
        if value is None:
            continue
        try:
            ipaddress.IPv4Address(value)
        except ValueError:
            raise ServerOptionError(f"{name} {value}: not an IPv4 address (write e.g. 10.0.0.2)") from None
    if not 1 <= workers <= MAX_WORKERS:
        raise ServerOptionError(f"--workers {workers}: give 1..{MAX_WORKERS} worker processes")
    if dedup_window < 1:
        raise ServerOptionError(f"--dedup-window {dedup_window}: give at least 1 (updates remembered)")
    if checkpoint_every < 0:
        raise ServerOptionError(f"--checkpoint-every {checkpoint_every}: give 0 (SIGUSR1 only) or more updates")
    if workers > 1 and fixed_length:
        raise ServerOptionError("--fixed-length needs one worker (--workers 1)")
    if workers > 1 and (checkpoint_dir or restore):
        raise ServerOptionError("--checkpoint-dir/--restore need --workers 1 (one log per shard process)")
    if checkpoint_dir is not None and os.path.exists(checkpoint_dir) and not os.path.isdir(checkpoint_dir):
        raise ServerOptionError(f"--checkpoint-dir {checkpoint_dir}: not a directory; give a directory "
                                "(it is made if missing)")
    if restore is None:
        return
    if not os.path.isdir(restore):
        what = "not a directory" if os.path.exists(restore) else "no such directory"
        raise ServerOptionError(f"--restore {restore}: {what}; give the directory this shard ran with "
                                "--checkpoint-dir; start without --restore for fresh rows")
    sd = Path(shard_dir(restore, shard_id))
    if not sd.is_dir():
        raise ServerOptionError(
            f"--restore {restore}: no {sd.name}/ in it (nothing of shard {shard_id} to "
            "restore): give the directory this shard ran with --checkpoint-dir, or one `embnic tables import` "
            "filled; start without --restore for fresh rows")
    if not restorable(sd):
        # refuse rather than start fresh rows and a new log among files of unknown origin
        others = sorted(p.name for p in sd.iterdir())
        what = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "") if others else "nothing"
        raise ServerOptionError(
            f"--restore {restore}: {sd} holds no checkpoint (ckpt-*.npz) or write-ahead log (wal-*.log) "
            f"(it holds {what}): give the directory this shard ran with --checkpoint-dir; start without "
            "--restore for fresh rows")
