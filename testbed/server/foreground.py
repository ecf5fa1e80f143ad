"""Running a shard as a process of its own, in the foreground until SIGTERM/SIGINT.

``embnic server`` and ``python -m embnic.testbed.server`` call :func:`run_server` (the one runner
of a shard process, STYLE.md): the serving loop (:class:`~.engine.BatchShardServer`) in this
process — one process per shard; a host's cores serve more shards (docs/server.md, "More cores:
more shards"). Also the lines such a process writes: :data:`LOG_FORMAT`, the listening line's
:func:`describe`, :func:`bind_error_message`. Threads of this process: :mod:`.runner`.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import signal

from embnic.client_lib.config import ClusterConfig

from .engine import BatchShardServer
from .shard_metrics import serve_metrics

log = logging.getLogger("embnic.server")


def run_server(cfg: ClusterConfig, shard_id: int, bind: str | None = None, port: int | None = None, *,
               metrics_port: int | None = None, metrics_bind: str = "0.0.0.0", **kwargs) -> int:
    """Run one shard in the foreground until SIGTERM/SIGINT (the ``embnic server`` command).

    Logs ``listening on IP:PORT`` once bound, and the counters as one JSON line at exit; SIGUSR1
    checkpoints (``**kwargs``: :class:`~.shard_state.ShardState`'s options).

    Args:
        bind, port: the address to serve (default: the shard's in the config; port 0: a free one).
        metrics_port: serve Prometheus metrics on ``metrics_bind:metrics_port`` (TCP; 0: a free
            port) while serving (:mod:`.shard_metrics`); None: no endpoint.

    Returns:
        0 after a clean stop; 1 if the log could not be written.

    Raises:
        KeyError: unknown shard. OSError: the address cannot be bound. NativeLibraryError: the
        shard's C library is missing or was built from other sources. ControlError: the metrics
        port cannot be served (taken: ``OperationalError``) or prometheus-client is missing.
    """
    me = cfg.shard(shard_id)
    ip = bind if bind is not None else me.ip
    port = me.port if port is None else int(port)
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
    # SIGTERM/SIGINT stop the server (at once if one came while it was built), SIGUSR1 checkpoints it
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.request_stop())
    if early:
        server.request_stop()
    signal.signal(signal.SIGUSR1, lambda *_: server.request_checkpoint())
    with contextlib.ExitStack() as closing:  # the metrics endpoint closed first, then the server
        closing.callback(server.close)
        # everything else first, the UDP port last, right before serving: a bound port is what says
        # "ready" (the testbed waits for it), and datagrams sent to it before the loop runs would
        # wait in the socket and be answered late (a re-sent probe answered twice)
        if metrics_port is not None:
            read = functools.partial(server.call, server.counters, timeout_s=10.0)
            closing.callback(serve_metrics(read, metrics_port, metrics_bind).close)
        ip2, p2 = server.open()
        log.info("shard %d listening on %s:%d (%s; engine batch)", shard_id, ip2, p2, describe(cfg))
        server.run()
    log.info("shard %d stopped; counters %s", shard_id, json.dumps(server.counters(), sort_keys=True))
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


class ServerOptionError(ValueError):
    """A shard option that cannot work (a usage error: exit 2); ``str()`` is one line naming the fix."""


def check_server_options(cfg: ClusterConfig, shard_id: int, *, config_name: str = "the config",
                         bind: str | None = None, port: int | None = None,
                         dedup_window: int = 65536,
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
    if dedup_window < 1:
        raise ServerOptionError(f"--dedup-window {dedup_window}: give at least 1 (updates remembered)")
    if checkpoint_every < 0:
        raise ServerOptionError(f"--checkpoint-every {checkpoint_every}: give 0 (SIGUSR1 only) or more updates")
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
