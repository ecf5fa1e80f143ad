"""A probe of the testbed: what it asks each shard (a key it owns, :func:`probe_key`) and one
one-key lookup's round trip (:func:`ask`)."""
from __future__ import annotations

import select
import socket
import time

from embnic.client_lib import codec
from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.consts import Status


def probe_key(cfg: ClusterConfig, shard_id: int):
    """The (table, key, owned) a readiness probe of shard ``shard_id`` looks up.

    The first table (config order) with a key the shard owns among ids ``0 .. min(rows, 4096)-1``
    and the smallest such key: under the ``hash`` policy a shard of S owns one id in S, so
    4096 candidates miss with probability (1-1/S)^4096. ``owned`` is False only when the shard
    owns none of them (``table`` policy, no table on it): then table 0, key 0.

    Returns:
        (``TableConfig``, keys uint64 (1,), owned bool).
    """
    import numpy as np

    from embnic.client_lib.routing import shard_of

    for t in cfg.tables:
        cand = np.arange(min(t.rows, 4096) if t.rows is not None else 4096, dtype=np.uint64)
        hit = np.flatnonzero(shard_of(cfg, t.id, cand) == shard_id)
        if hit.size:
            return t, cand[hit[:1]], True
    return cfg.tables[0], np.zeros(1, dtype=np.uint64), False


def ask(sock: socket.socket, cfg: ClusterConfig, client_id: int, shard_id: int, msg_id: int, timeout_s: float,
        resend_s: float) -> tuple[float | None, codec.Header | None, int]:
    """Look :func:`probe_key`'s key of shard ``shard_id`` up from client ``client_id`` on ``sock``
    (through the card: :meth:`~embnic.client_lib.config.ClusterConfig.request_destination`), sent
    again every ``resend_s`` s until a reply to (``client_id``, ``msg_id``) comes or ``timeout_s`` s
    have passed.

    Returns:
        (round trip in s from the last send, the reply's header, sends), or (None, None, sends)
        without a reply.
    """
    t0, key, _ = probe_key(cfg, shard_id)
    frames = codec.encode_table_lookup(msg_id=msg_id, client_id=client_id, table_id=t0.id, shard_id=shard_id,
                                       dim=t0.dim, dtype=t0.wire_dtype, keys=key, mtu=cfg.mtu)
    dest = cfg.request_destination(client_id, shard_id)
    deadline = time.monotonic() + timeout_s
    sends = 0
    while time.monotonic() < deadline:
        sent = time.monotonic()
        for f in frames:
            sock.sendto(f, dest)
        sends += 1
        end = min(deadline, sent + resend_s)
        while (left := end - time.monotonic()) > 0:
            if not select.select([sock], [], [], left)[0]:
                break
            try:
                h = codec.parse_header(sock.recv(65536), expect="reply")
            except (BlockingIOError, codec.FrameError):
                continue
            if h.msg_id == msg_id and h.client_id == client_id:
                return time.monotonic() - sent, h, sends
    return None, None, sends


def status_name(status: int) -> str:
    """The name of a reply's status (``Status``), or its number when it is none of them."""
    try:
        return Status(status).name
    except ValueError:
        return str(status)
