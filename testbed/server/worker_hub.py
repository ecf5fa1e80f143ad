"""The workers' hub: ``--workers N`` worker processes of one shard, rows split by id range.

Key ``k`` of table ``t`` belongs to worker :func:`worker_of`; the worker a message reaches (its
**home**, :func:`~.foreground.steering_program`) serves it whole and asks the owners of the keys
it does not hold for their rows, or to apply their share, with one **sub-request** per peer for
every table of a flush (:meth:`PeerHub.lookup_many`, :meth:`PeerHub.apply_many`) over a Unix
socket pair per pair of workers. A worker waiting for its sub-replies serves the sub-requests
that reach it meanwhile (a sub-request never makes one of its own: no deadlock). Why, and what
keeps the rows bit-identical and updates exactly once: docs/server.md, "Workers".
"""
from __future__ import annotations

import collections
import select
import socket
import struct
import time

import numpy as np

from embnic.client_lib.splitmix import splitmix64
from embnic.client_lib.rowstore import TableShard

_FRAME = struct.Struct("<BBHIQ")  #: kind, op, table_id, count, payload bytes
REQUEST, REPLY = 1, 2
#: every table of a flush in one sub-request: one exchange per peer, not one per table
OP_LOOKUP_MANY, OP_APPLY_MANY = 3, 4
PEER_TIMEOUT_S = 60.0  #: a sub-request unanswered this long means the peer is wedged (a bug)


class PeerGone(RuntimeError):
    """A peer worker closed its end (it died or stopped): the shard is going down."""


def worker_of(table_id: int, keys: np.ndarray, workers: int) -> np.ndarray:
    """Worker owning every key: int64 (N,) in ``[0, workers)``.

    ``floor(hi32(splitmix64((table_id << 48) ^ k)) · workers / 2^32)``: worker ``w`` owns the
    keys whose hash's top 32 bits fall in ``[w · 2^32 / workers, (w + 1) · 2^32 / workers)``.

    Args:
        table_id: the table of the keys. keys: uint64 (N,). workers: N >= 1.

    Example: ``worker_of(0, np.array([7], np.uint64), 1)`` → ``array([0])``.
    """
    if workers <= 1:
        return np.zeros(np.shape(keys)[0], np.int64)
    h = splitmix64(np.asarray(keys, np.uint64) ^ np.uint64(table_id << 48))
    return (((h >> np.uint64(32)) * np.uint64(workers)) >> np.uint64(32)).astype(np.int64)


def segment_bounds(counts: np.ndarray) -> np.ndarray:
    """Segment bounds int64 (M+1,) of segments of ``counts`` (M,) elements: ``[0, c0, c0+c1, ...]``."""
    out = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def sub_bounds(mask: np.ndarray, offs: np.ndarray) -> np.ndarray:
    """Bounds int64 (M+1,) of the segments ``offs`` (M+1,) restricted to the elements where
    ``mask`` (bool (K,)) is set: the segments of ``keys[mask]``."""
    if offs.size <= 1:
        return np.zeros(1, np.int64)
    cnt = np.add.reduceat(mask.astype(np.int64), offs[:-1])
    cnt[offs[:-1] == offs[1:]] = 0  # reduceat reads one element for an empty segment
    return segment_bounds(cnt)


class PeerLink:
    """One end of the stream socket between two workers: framed messages, non-blocking.

    A frame is :data:`_FRAME` (kind, op, table_id, count, payload length; little endian)
    followed by the payload.
    """

    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self.sock = sock
        self.fd = sock.fileno()
        self._out: collections.deque = collections.deque()
        self._in = bytearray()
        self._rbuf = bytearray(1 << 20)

    def queue(self, kind: int, op: int, table_id: int, count: int, parts: list) -> None:
        """Queue one frame whose payload is the concatenation of ``parts`` (bytes-like / arrays)."""
        views = [memoryview(np.ascontiguousarray(p)).cast("B") if isinstance(p, np.ndarray) else memoryview(p)
                 for p in parts]
        self._out.append(memoryview(_FRAME.pack(kind, op, table_id, count, sum(v.nbytes for v in views))))
        self._out.extend(v for v in views if v.nbytes)

    @property
    def want_write(self) -> bool:
        return bool(self._out)

    def flush(self) -> None:
        """Write what the socket takes now. Raises :class:`PeerGone` if the peer closed."""
        out = self._out
        try:
            while out:
                n = self.sock.send(out[0])
                if n == out[0].nbytes:
                    out.popleft()
                else:
                    out[0] = out[0][n:]
        except BlockingIOError:
            pass
        except (BrokenPipeError, ConnectionResetError) as e:
            raise PeerGone(str(e)) from None

    def read(self) -> list[tuple[int, int, int, int, memoryview]]:
        """Every complete frame readable now, as (kind, op, table_id, count, payload).

        Raises:
            PeerGone: the peer closed its end.
        """
        while True:
            try:
                n = self.sock.recv_into(self._rbuf)
            except BlockingIOError:
                break
            except ConnectionResetError as e:
                raise PeerGone(str(e)) from None
            if n == 0:
                raise PeerGone("peer closed")
            self._in += memoryview(self._rbuf)[:n]
            if n < len(self._rbuf):
                break
        frames = []
        buf, at = self._in, 0
        while len(buf) - at >= _FRAME.size:
            kind, op, tid, count, ln = _FRAME.unpack_from(buf, at)
            if len(buf) - at - _FRAME.size < ln:
                break
            s = at + _FRAME.size
            frames.append((kind, op, tid, count, memoryview(bytes(buf[s:s + ln]))))
            at = s + ln
        if at:
            del buf[:at]
        return frames


class PeerHub:
    """All links of one worker to the others, and the synchronous sub-request call.

    Args:
        me: this worker's index. workers: N. links: ``{peer index: PeerLink}`` for every other
            worker. serve: ``serve(op, table_id, count, payload) -> list of payload parts``,
            answers one sub-request from this worker's own rows.
    """

    def __init__(self, me: int, workers: int, links: dict[int, PeerLink], serve):
        self.me, self.workers = int(me), int(workers)
        self.links = links
        self.serve = serve
        self.stats = collections.Counter(peer_calls=0, peer_rows_asked=0, peer_requests=0, peer_rows_served=0,
                                         peer_wait_us=0)

    def fds(self) -> list[int]:
        return [ln.fd for ln in self.links.values()]

    def poll_masks(self) -> dict[int, int]:
        """``{link fd: poll events}`` to wait for: readable, and also writable while a frame is
        only partly sent (a reply larger than the socket buffer goes out as the peer reads it;
        polling for input alone would leave its rest unsent while the peer waits for it)."""
        return {ln.fd: select.POLLIN | (select.POLLOUT if ln.want_write else 0) for ln in self.links.values()}

    def _serve(self, link: PeerLink, fr) -> None:
        kind, op, tid, count, payload = fr
        if kind != REQUEST:
            raise RuntimeError(f"worker {self.me}: a sub-reply nobody waits for (op {op}, table {tid})")
        self.stats["peer_requests"] += 1
        self.stats["peer_rows_served"] += count if op == OP_LOOKUP_MANY else 0
        link.queue(REPLY, op, tid, count, self.serve(op, tid, count, payload))

    def pump(self) -> None:
        """Serve every sub-request readable now and send what each link's socket takes (called
        when a link's fd polls readable or writable, :meth:`poll_masks`)."""
        for link in self.links.values():
            for fr in link.read():
                self._serve(link, fr)
            link.flush()

    def send(self, reqs: dict[int, tuple[int, int, int, list]]) -> None:
        """Send one sub-request per peer: ``{peer: (op, table_id, count, payload parts)}``; then
        :meth:`wait` for the answers (do this worker's own share in between)."""
        for v, (op, tid, count, parts) in reqs.items():
            link = self.links[v]
            link.queue(REQUEST, op, tid, count, parts)
            link.flush()
            self.stats["peer_calls"] += 1
            self.stats["peer_rows_asked"] += count if op == OP_LOOKUP_MANY else 0

    def wait(self, peers) -> dict[int, memoryview]:
        """The payload of each peer's answer to what :meth:`send` sent it, serving sub-requests
        that come in meanwhile.

        Raises:
            PeerGone: a peer closed its end. TimeoutError: no answer in :data:`PEER_TIMEOUT_S`.
        """
        t0 = time.monotonic()
        want = set(peers)
        got: dict[int, memoryview] = {}
        by_fd = {ln.fd: (v, ln) for v, ln in self.links.items()}
        poller = select.poll()
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        while want:
            for fd, ev in self.poll_masks().items():
                poller.modify(fd, ev)
            for fd, ev in poller.poll(1000):
                v, link = by_fd[fd]
                if ev & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    for fr in link.read():
                        if fr[0] == REPLY and v in want:
                            got[v] = fr[4]
                            want.discard(v)
                        else:
                            self._serve(link, fr)
                link.flush()
            if want and time.monotonic() - t0 > PEER_TIMEOUT_S:
                raise TimeoutError(f"worker {self.me}: workers {sorted(want)} did not answer in {PEER_TIMEOUT_S} s")
        self.stats["peer_wait_us"] += int((time.monotonic() - t0) * 1e6)
        return got

    def lookup_many(self, local: dict[int, TableShard], parts: list[tuple[int, np.ndarray]]) -> list[np.ndarray]:
        """Rows of several tables' keys, wherever they live: ``parts`` ``[(table_id, keys uint64
        (n_t,)), ...]`` → ``[float32 (n_t, dim_t), ...]``. One ``LOOKUP_MANY`` sub-request per peer
        that owns any of the keys (all tables in it), this worker's share from ``local`` (its own
        :class:`TableShard` per table) meanwhile, then one wait: a message of 26 tables costs one
        exchange per peer, not 26."""
        me, n = self.me, self.workers
        ws = [worker_of(tid, k, n) for tid, k in parts]
        out = [np.empty((k.size, local[tid].dim), np.float32) for tid, k in parts]
        reqs, sel = {}, {}
        for v, items in self._peer_items(ws):
            keys = [parts[i][1][m] for i, m in items]
            meta = np.array([len(items)] + [x for (i, _), k in zip(items, keys) for x in (parts[i][0], k.size)],
                            np.int64)
            reqs[v] = (OP_LOOKUP_MANY, 0xFFFF, sum(k.size for k in keys), [meta] + keys)
            sel[v] = items
        if reqs:
            self.send(reqs)
        for i, (tid, k) in enumerate(parts):
            mine = ws[i] == me
            if mine.all():
                out[i] = local[tid].lookup(k)
            elif mine.any():
                out[i][mine] = local[tid].lookup(k[mine])
        if reqs:
            for v, payload in self.wait(reqs).items():
                at = 0
                for i, m in sel[v]:
                    dim = out[i].shape[1]
                    cnt = int(np.count_nonzero(m)) * dim
                    out[i][m] = np.frombuffer(payload, np.float32, cnt, at).reshape(-1, dim)
                    at += 4 * cnt
        return out

    def _peer_items(self, ws: list[np.ndarray]):
        """For each peer owning any key of the parts whose owners are ``ws`` (per part, int (n_t,)
        from :func:`worker_of`): ``(peer, [(part index, bool (n_t,) mask of its keys), ...])``."""
        for v in range(self.workers):
            if v == self.me:
                continue
            items = [(i, m) for i, m in ((i, w == v) for i, w in enumerate(ws)) if m.any()]
            if items:
                yield v, items

    def apply_many(self, local: dict[int, TableShard], parts: list[tuple]) -> None:
        """Apply several tables' segments, each owner its keys: ``parts`` ``[(table_id, keys
        uint64 (K,), grads float32 (K, dim), segment bounds int64 (M+1,)), ...]`` as
        :meth:`TableShard.apply_segments` per table. One ``APPLY_MANY`` per peer owning any of
        the keys, this worker's share meanwhile, then one wait (every owner has applied its
        share when it returns)."""
        me, n = self.me, self.workers
        ws = [worker_of(tid, k, n) for tid, k, _, _ in parts]
        reqs = {}
        for v, items in self._peer_items(ws):
            meta, body = [len(items)], []
            for i, m in items:
                tid, k, g, offs = parts[i]
                b = sub_bounds(m, offs)
                meta += [tid, b.size - 1, int(np.count_nonzero(m))]
                body += [b, k[m], np.ascontiguousarray(g[m], np.float32)]
            reqs[v] = (OP_APPLY_MANY, 0xFFFF, len(items), [np.array(meta, np.int64)] + body)
        if reqs:
            self.send(reqs)
        for i, (tid, k, g, offs) in enumerate(parts):
            mine = ws[i] == me
            if mine.all():
                local[tid].apply_segments(k, g, offs)
            elif mine.any():
                local[tid].apply_segments(k[mine], g[mine], sub_bounds(mine, offs))
        if reqs:
            self.wait(reqs)

    def close(self) -> None:
        for link in self.links.values():
            link.sock.close()


def serve_sub_request(tables: dict[int, TableShard], op: int, table_id: int, count: int, payload) -> list:
    """Answer one sub-request from this worker's own rows (``tables``: table id → its local
    :class:`TableShard`).

    LOOKUP_MANY (``table_id`` unused, ``count`` = keys): int64 ``[T, tid_0, n_0, ...]``, then
    every table's uint64 keys → [float32 rows of every table, in order]. APPLY_MANY (``count``
    = T): int64 ``[T, (tid, segments, keys) × T]``, then per table its int64 segment bounds,
    uint64 keys and float32 gradients → [] (ack).

    Raises:
        ValueError: unknown op, unknown table, or a payload that does not add up (a bug: only
        workers of the same shard talk here).
    """
    if op not in (OP_LOOKUP_MANY, OP_APPLY_MANY):
        raise ValueError(f"sub-request with unknown op {op}")
    width = 2 if op == OP_LOOKUP_MANY else 3  # int64 meta per table: (tid, keys) or (tid, segments, keys)
    t = int(np.frombuffer(payload, np.int64, 1)[0])
    meta = np.frombuffer(payload, np.int64, width * t, 8).reshape(t, width).tolist()
    unknown = [m[0] for m in meta if m[0] not in tables]
    if unknown:
        raise ValueError(f"sub-request for unknown table {unknown[0]}")
    at = 8 * (1 + width * t)
    if op == OP_LOOKUP_MANY:
        if sum(n for _, n in meta) != count:
            raise ValueError(f"sub-request LOOKUP_MANY: {sum(n for _, n in meta)} keys, header says {count}")
        out = []
        for tid, n in meta:
            out.append(tables[tid].lookup(np.frombuffer(payload, np.uint64, n, at)))
            at += 8 * n
        return out
    for tid, nseg, k in meta:
        ts = tables[tid]
        offs = np.frombuffer(payload, np.int64, nseg + 1, at)
        keys = np.frombuffer(payload, np.uint64, k, at + 8 * (nseg + 1))
        g = np.frombuffer(payload, np.float32, k * ts.dim, at + 8 * (nseg + 1 + k)).reshape(k, ts.dim)
        ts.apply_segments(keys, g, offs)
        at += 8 * (nseg + 1 + k) + 4 * k * ts.dim
    return []
