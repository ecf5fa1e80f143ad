"""The readable reference shard: the specification and test oracle of the shard's serving loop.

One datagram at a time on an asyncio loop, every message served on its own — the shortest
reading of docs/server.md's rules, all of which it takes from the shard's one
:class:`~embnic.testbed.server.shard_state.ShardState` (the frame rules, the body and table checks,
exactly once, the rows). Production serves with :class:`~embnic.testbed.server.engine.BatchShardServer`
(many datagrams per wake-up, the C answer path); the tests run both on the same frames and
compare every reply byte, counter and row (``test_server_engine.py``, ``test_server.py``, ...).

It has the serving loop's lifecycle (``open``, ``run``, ``request_stop``, ``call``, ``close``), so
:class:`~embnic.testbed.server.runner.ServerThread` and ``ServerCluster`` run it
(``server_class=ReferenceShard``; :data:`ENGINES` names both for parametrised tests)::

    client ──UDP (LOOKUP_REQ / UPDATE_REQ, fragmented)──▶ shard I
       ▲                                                     │ take_frame → message → rows
       └──────────UDP (LOOKUP_REPLY / UPDATE_ACK / ERROR)────┘ to the request's source address
"""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.codec import DirectoryError
from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.consts import MsgType, Status
from embnic.client_lib.reassembly import Message, Reassembler, fragment_size
from embnic.client_lib.sockets import SOCK_BUF, set_socket_buffers
from embnic.testbed.server.engine import BatchShardServer
from embnic.testbed.server.shard_state import (MAX_MSG_LEN, REASSEMBLY_BYTES, REASSEMBLY_PENDING, Refused,
                                               ShardState)


def last_fragment_offset(h: codec.Header) -> int:
    """The byte offset of the last fragment of the message of fragment header ``h`` (any of its
    fragments: they all give the fragment size P, :func:`~embnic.client_lib.reassembly.fragment_size`):
    ``(frag_count - 1) · P``; 0 for a message of one fragment."""
    if h.frag_count <= 1:
        return 0
    return (h.frag_count - 1) * fragment_size(h)


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, server: "ReferenceShard"):
        self.server = server

    def connection_made(self, transport):
        self.server.transport = transport

    def datagram_received(self, data, addr):
        st = self.server.state
        before = sum(st.replies.values())
        t0 = time.monotonic_ns()
        self.server.handle_datagram(data, addr)
        n = sum(st.replies.values()) - before
        if n:  # the replies this datagram completed: its service time
            st.service.add(time.monotonic_ns() - t0, n)

    def error_received(self, exc):
        # ICMP errors for earlier sends (e.g. a client that went away): count, keep serving
        self.server.state.counts["send_errors"] += 1


class ReferenceShard:
    """One shard served a datagram at a time (module docstring).

    Args:
        cfg, shard_id, bind, port: as :class:`~embnic.testbed.server.engine.BatchShardServer`.
        **state_kw: :class:`~embnic.testbed.server.shard_state.ShardState`'s options.
    """

    def __init__(self, cfg: ClusterConfig, shard_id: int, bind: str | None = None, port: int | None = None,
                 **state_kw):
        self.state = ShardState(cfg, shard_id, **state_kw)
        #: the reassembly of every frame (the one-frame path's assembly)
        self.reasm = Reassembler(max_pending=REASSEMBLY_PENDING, timeout_s=self.state.reassembly_timeout_s,
                                 expect="request", max_msg_len=MAX_MSG_LEN, max_pending_bytes=REASSEMBLY_BYTES)
        self.cfg = cfg
        self.shard_id = self.state.shard_id
        at = cfg.shard(shard_id)
        self.bind = bind if bind is not None else at.ip
        self.port = int(port) if port is not None else at.port
        self.transport: asyncio.DatagramTransport | None = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = threading.Event()
        self._stop: asyncio.Event | None = None
        self._stop_asked = False

    @property
    def durable_failed(self) -> bool:
        return self.state.durable_failed

    # -- lifecycle (the serving loop's) --------------------------------------------------------

    def open(self) -> tuple[str, int]:
        """Bind the UDP socket; returns (ip, port)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            set_socket_buffers(sock, SOCK_BUF)
            sock.bind((self.bind, self.port))
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        return sock.getsockname()[:2]

    def run(self) -> None:
        """Serve on an asyncio loop of this thread until :meth:`request_stop`."""
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        loop = self._loop = asyncio.get_running_loop()
        if self._stop_asked:
            self._stop.set()
        await loop.create_datagram_endpoint(lambda: _Protocol(self), sock=self._sock)

        def tick():
            self.reasm.expire()
            handle[0] = loop.call_later(0.5, tick)

        handle = [loop.call_later(0.5, tick)]
        self._running.set()
        try:
            await self._stop.wait()
        finally:
            handle[0].cancel()
            if self.transport is not None:
                self.transport.close()
                self.transport = None
            self._running.clear()

    def request_stop(self) -> None:
        """Make :meth:`run` return (thread-safe)."""
        self._stop_asked = True
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def request_checkpoint(self) -> None:
        """Checkpoint on the loop (thread-safe)."""
        self._loop.call_soon_threadsafe(self.state.checkpoint_or_log)

    def call(self, fn, *args, timeout_s: float = 10.0):
        """Run ``fn(*args)`` on the server's loop and return its result."""
        if not self._running.wait(timeout_s):
            raise TimeoutError("the reference shard's loop is not running")

        async def go():
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(go(), self._loop).result(timeout_s)

    def close(self) -> None:
        """Close the log and the stores."""
        self.state.close()

    def close_stores(self) -> None:
        self.state.stores.close()

    def counters(self) -> dict[str, Any]:
        """The state's counters with the reassembler's."""
        c = self.state.counters()
        for r, v in self.reasm.drops.items():
            c["drops"][r] = c["drops"].get(r, 0) + v
        rs = self.reasm.stats
        c["reassembly"] = {"pending": len(self.reasm), "expired": rs["expired"], "evicted": rs["evicted"],
                           "duplicate_frames": rs["duplicates"]}
        return c

    def state_dict(self) -> dict:
        return self.state.state_dict()

    # -- one datagram ----------------------------------------------------------------------------

    def _reply_to(self, addr):
        def reply(h, msg_type, status, table_id, body):
            self._send(codec.encode_reply(h, msg_type, shard_id=self.shard_id, body=body, status=status,
                                          table_id=table_id, mtu=self.state.mtu), addr)
        return reply

    def _send(self, frames: list[bytes], addr) -> None:
        tr = self.transport
        if tr is None:
            return
        for f in frames:
            tr.sendto(f, addr)
            self.state.counts["tx_frames"] += 1
            self.state.counts["tx_bytes"] += len(f)

    # the one-frame path's assembly (state.Assembly): the Reassembler
    def feed(self, h, data: bytes, addr) -> Message | None:
        return self.reasm.feed(data, addr, header=h)

    def feed_poll(self, h, data: bytes, addr):
        drops = self.reasm.drops.total()
        msg = self.reasm.feed(data, addr, header=h)
        if msg is not None:
            return msg, None
        # the fragments held so far (a white-box read of the reassembler: no production caller needs it)
        ent = self.reasm._pending.get((h.client_id, h.msg_id, MsgType.UPDATE_REQ))
        return None, (ent.parts if ent is not None and self.reasm.drops.total() == drops else None)  # not contradicting

    def discard(self, client_id: int, msg_id: int, msg_type: int) -> None:
        self.reasm.discard(client_id, msg_id, msg_type)

    def handle_datagram(self, data: bytes, addr) -> None:
        """Process one UDP payload from ``addr``. Never raises."""
        msg = self.state.take_frame(data, addr, self._reply_to(addr), self)
        if msg is None:
            return
        reply = self._reply_to(msg.addr)
        try:
            self._handle_message(msg, reply)
        except Exception:  # noqa: BLE001 - one bad message must not stop the shard
            self.state.internal_error(msg.header, reply, f"a message from {msg.addr}")

    def _handle_message(self, msg: Message, reply) -> None:
        st = self.state
        h = msg.header
        st.requests[MsgType(h.msg_type)] += 1
        if h.msg_type == MsgType.SIZE_REQ:
            if st.admit_sizes(h, msg.body):
                st.count_reply(MsgType.SIZE_ACK)
                reply(h, MsgType.SIZE_ACK, 0, consts.NO_TABLE, b"")
            else:
                st.refuse(h, Status.MALFORMED, reply)
            return
        try:
            rb = codec.parse_request_body(h, msg.body)
        except DirectoryError as e:
            st.refuse(h, Status(e.status), reply, e.table_id)
            return
        try:
            if h.msg_type == MsgType.LOOKUP_REQ:
                self._lookup(h, rb, reply)
            else:
                self._update(msg, rb, reply)
        except Refused as r:
            st.refuse(h, r.status, reply, r.table_id)

    def _lookup(self, h, rb, reply) -> None:
        """One LOOKUP_REPLY: every table's rows, in directory order, cast to its wire dtype."""
        st = self.state
        fault = st.table_fault(rb)
        if fault is not None:
            raise Refused(*fault)
        body = np.empty(h.value_len, np.uint8)
        ko, vo = rb.key_offsets.tolist(), rb.value_offsets.tolist()
        for t, tid in enumerate(rb.directory["table_id"].tolist()):
            ts = st.tables[tid]
            rows = ts.lookup(rb.keys[ko[t]:ko[t + 1]])
            body[vo[t]:vo[t + 1]] = rows.astype(codec.value_dtype(ts.table.wire_dtype)).reshape(-1).view(np.uint8)
        st.counts["lookup_keys"] += h.num_keys
        st.count_reply(MsgType.LOOKUP_REPLY)
        reply(h, MsgType.LOOKUP_REPLY, 0, consts.NO_TABLE, body)

    def _update(self, msg: Message, rb, reply) -> None:
        """Admit (window, checks, log), apply, commit the log, then ack."""
        st = self.state
        h = msg.header
        grads = st.admit_update(h, msg.body, rb, last_fragment_offset(h))
        if grads is not None:
            d = rb.directory
            st.rows_apply(d["table_id"].astype(np.int64), d["num_keys"].astype(np.int64), rb.keys, grads)
        if not st.commit_log():
            self.request_stop()
            return
        st.count_reply(MsgType.UPDATE_ACK)
        reply(h, MsgType.UPDATE_ACK, 0, consts.NO_TABLE, b"")


#: the serving loops a parametrised test runs: production's and the reference
ENGINES = {"batch": BatchShardServer, "reference": ReferenceShard}


def engine_kw(engine: str, kw: dict | None = None) -> dict:
    """``ServerThread``/``ServerCluster`` keywords running ``engine`` (:data:`ENGINES`) with the
    options ``kw``; ``c_intake=False`` or ``c_answer=False`` run the serving loop on the numpy
    oracle of its C path (``shard_oracle.numpy_path``, ``small``: frames checked one by one)."""
    from shard_oracle import numpy_path

    kw = dict(kw or {})
    small = kw.pop("small", 4)
    c = kw.pop("c_intake", True) and kw.pop("c_answer", True)
    kw.pop("c_answer", None)
    if engine == "batch" and not c:
        kw["answer_path"] = numpy_path(small)
    return {"server_class": ENGINES[engine], **kw}
