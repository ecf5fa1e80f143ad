"""The client's round transport in numpy — the readable reference the C round
(``client_lib/csrc/round.c``) was written after, moved out of ``client_lib/client.py``: the test
oracle ``test_native_round.py`` and ``test_transport.py`` compare the C round with, frame for
frame and counter for counter.

:class:`PyRoundClient` is an :class:`~embnic.client_lib.client.EmbeddingClient` whose rounds are
planned as the production client plans them (the C plan: the same messages, ids and queue order)
but exchanged here: each message encoded by :mod:`embnic.client_lib.codec`, sent with
``sendto``, its reply reassembled by :class:`~embnic.client_lib.reassembly.Reassembler`, under
the send window, per-message RFC 6298 timers (:class:`RttEstimator`), RACK loss detection, tail
probes, lookup repairs and update polls/NACKs — step for step what round.c does.
"""
from __future__ import annotations

import collections
import errno
import itertools
import select
import time
from typing import Callable

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.client import EmbeddingClient
from embnic.client_lib.consts import MsgType
from embnic.client_lib.errors import ShardError
from embnic.client_lib.reassembly import Message, Reassembler
from embnic.client_lib.roundplan import (C_DIR0, C_KA, C_KB, C_NKEYS, C_NT, C_SHARD, C_VLEN, C_VOFF, MSG_COLUMNS,
                                         concat_ranges)
from embnic.client_lib.rtt import REO_WND_MIN_MS

from outstanding import Outstanding
import clientref

_REPLY = {MsgType.LOOKUP_REQ: MsgType.LOOKUP_REPLY, MsgType.UPDATE_REQ: MsgType.UPDATE_ACK,
          MsgType.SIZE_REQ: MsgType.SIZE_ACK}  # the reply type that answers each request type


class RttEstimator:
    """Round-trip time and retransmission timeout of one shard (RFC 6298, section 2).

    Args:
        rto_init_s: RTO before the first sample (s).
        rto_min_s, rto_max_s: bounds of the RTO (s).

    The first sample R sets ``SRTT = R``, ``RTTVAR = R/2``; later ones
    ``RTTVAR = 3/4·RTTVAR + 1/4·|SRTT − R|``, ``SRTT = 7/8·SRTT + 1/8·R``; then
    ``RTO = SRTT + max(G, 4·RTTVAR)`` (G: 1 µs) clamped to ``[rto_min_s, rto_max_s]``.
    Backoff (section 5.5) is per message: the client doubles a message's own timer each
    time it fires.

    Example: samples 2 ms then 4 ms → SRTT 2.25 ms, RTTVAR 1.25 ms, RTO 7.25 ms (50 ms with the
    default floor).
    """

    ALPHA, BETA, K, G = 0.125, 0.25, 4.0, 1e-6

    def __init__(self, rto_init_s: float, rto_min_s: float, rto_max_s: float):
        if not 0 < rto_min_s <= rto_max_s:
            raise ValueError(f"RTO bounds must satisfy 0 < min <= max, got {rto_min_s}, {rto_max_s}")
        self.rto_min, self.rto_max = float(rto_min_s), float(rto_max_s)
        self.srtt: float | None = None
        self.min_rtt: float | None = None
        self.rttvar = 0.0
        self.rto = min(max(float(rto_init_s), self.rto_min), self.rto_max)
        self.samples = 0

    def sample(self, r: float) -> None:
        """Take one RTT measurement ``r`` (s) of a message sent once (Karn's rule is the caller's)."""
        self.min_rtt = r if self.min_rtt is None else min(self.min_rtt, r)
        if self.srtt is None:
            self.srtt, self.rttvar = r, r / 2
        else:
            self.rttvar = (1 - self.BETA) * self.rttvar + self.BETA * abs(self.srtt - r)
            self.srtt = (1 - self.ALPHA) * self.srtt + self.ALPHA * r
        self.samples += 1
        self.rto = min(max(self.srtt + max(self.G, self.K * self.rttvar), self.rto_min), self.rto_max)


class PyRoundClient(EmbeddingClient):
    """An :class:`EmbeddingClient` whose rounds run in numpy (module docstring): the same
    arguments, the same plan, message ids, counters and errors; :meth:`rtt` reads this
    transport's estimators, :attr:`drops` adds its reassembler's."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        # one estimator per (shard, request type): a 1-frame SIZE_REQ and a 200-frame lookup do
        # not share a round-trip time
        self._rtt = {(s.id, t): RttEstimator(self.timeout_s, self.rto_min_s, self.rto_max_s)
                     for s in self.cfg.shards for t in consts.REQUEST_TYPES}
        self._late_probes: collections.OrderedDict[int, None] = collections.OrderedDict()  # probe ids after their round
        self._reasm = Reassembler(max_pending=65536, timeout_s=max(1.0, 4 * self.timeout_s), expect="reply")
        self._buf = bytearray(65536)
        self._seqs = itertools.count()  # the current round's transmission order (_round_msgs)

    def rtt(self, shard_id: int, msg_type: int = MsgType.LOOKUP_REQ) -> dict:
        """As :meth:`EmbeddingClient.rtt`, of this transport's :class:`RttEstimator`."""
        e = self._rtt[shard_id, msg_type]
        return {"srtt_ms": None if e.srtt is None else e.srtt * 1e3, "rttvar_ms": e.rttvar * 1e3,
                "rto_ms": e.rto * 1e3, "samples": e.samples}

    @property
    def drops(self) -> collections.Counter:
        """Frames dropped by the reassembler by reason, plus mismatched replies."""
        c = collections.Counter(self._reasm.drops)
        c.update(self.stats.drops)
        return c

    def _exchange(self, tab, directory, keys, vals, dst, rb, so, out, record_latency: bool) -> None:
        """The round of ``tab`` (in queue order) through this transport (:meth:`_round_msgs`)."""
        self._round_msgs(self._outs(tab, directory, keys, vals, dst, rb, out), record_latency=record_latency)

    def _outs(self, tab, directory, keys, vals, dst, rb, out) -> list[Outstanding]:
        """The round's messages as :class:`Outstanding`: frames encoded by the codec, a lookup's
        reply scattered to its rows in ``out`` (``dst``, ``rb``: each grouped key's row offset
        and bytes)."""
        msgs: list[Outstanding] = []
        nc = len(MSG_COLUMNS)
        for r in tab.tolist():  # per message
            sid, msg_id, mt = int(self._shard_ids[r[C_SHARD]]), r[nc], r[nc + 1]
            if mt == MsgType.SIZE_REQ:
                e = vals[r[C_VOFF]:r[C_VOFF] + r[C_NKEYS] * consts.SIZE_ENTRY].view(codec.SIZE_ENTRY_DTYPE)
                frames = clientref.encode_size(msg_id=msg_id, client_id=self.client_id, shard_id=sid, entries=e,
                                           mtu=self.mtu)
                msgs.append(Outstanding(msg_id, MsgType.SIZE_REQ, sid, None, r[C_NKEYS], self._dest[sid], frames,
                                        lambda m: None))
                continue
            d, k = directory[r[C_DIR0]:r[C_DIR0] + r[C_NT]], keys[r[C_KA]:r[C_KB]]
            if mt == MsgType.LOOKUP_REQ:
                def fill(msg: Message, at=concat_ranges(dst[r[C_KA]:r[C_KB]], rb[r[C_KA]:r[C_KB]])) -> None:
                    out[at] = np.frombuffer(msg.body, np.uint8)

                msgs.append(self._lookup_out(sid, d, k, fill, self._dest[sid], msg_id=msg_id))
            else:
                v = vals[r[C_VOFF]:r[C_VOFF] + r[C_VLEN]]
                frames = codec.encode_update(msg_id=msg_id, client_id=self.client_id, shard_id=sid, directory=d,
                                             keys=k, values=v, mtu=self.mtu)
                msgs.append(Outstanding(msg_id, MsgType.UPDATE_REQ, sid, d, len(k), self._dest[sid], frames,
                                        lambda m: None, datagram=self._datagram(frames, 0), keys=k,
                                        value_len=len(v)))
        return msgs

    def _datagram(self, frames: list, reply_len: int) -> int:
        """Largest IPv4 datagram (bytes) of a request's ``frames`` (UDP payloads) or of its reply
        of ``reply_len`` body bytes: what the path must carry for the message to be answered."""
        reply = consts.HDR_LEN + min(reply_len, consts.max_body_per_frame(self.mtu))
        return consts.IPV4_HDR_LEN + consts.UDP_HDR_LEN + max(max(len(f) for f in frames), reply)

    def _alloc_id(self) -> int:
        """One message id of the id clock (:class:`~.msgid.MsgIds`)."""
        return self._ids.take(1)

    def _send(self, m: Outstanding, retransmit: bool, frames: list | None = None, tries: bool = True) -> None:
        """Send ``m``'s frames (or only ``frames``, some of them: an update's poll or the fragments
        a shard lacks), with ``RETRANSMIT`` set if ``retransmit``; counts a try of ``m`` (and a
        retransmit) unless ``tries`` is False (the fragments an UPDATE_NACK asks for: the second
        half of the poll's try)."""
        for f in (m.frames if frames is None else frames):
            if retransmit:
                f = f[:4] + bytes([f[4] | consts.Flags.RETRANSMIT]) + f[5:]
            while True:
                try:
                    self.sock.sendto(f, m.dest)
                    break
                except BlockingIOError:
                    select.select([], [self.sock], [], self.timeout_s)
                except OSError as e:
                    if e.errno in (errno.ENOBUFS, errno.EAGAIN):
                        time.sleep(0.0005)
                        continue
                    raise
            self._stats.frames_sent += 1
            self._stats.bytes_sent += len(f)
        if not tries:
            return
        m.tries += 1
        if retransmit:
            self._stats.retransmits += 1

    def _round_msgs(self, msgs: list[Outstanding], record_latency: bool) -> None:
        """Send ``msgs`` and wait for every reply: one round (see the production client's module
        docstring for the window, the send order, the per-message timers and the loss detection).

        Raises:
            ShardUnavailableError: a message was tried ``retries`` times without a reply.
            ShardError: a shard answered ERROR.
        """
        if not msgs:
            return
        queues: dict[int, collections.deque] = {}
        # largest first per shard (a stable sort keeps a table's pieces in order): the last messages
        # a shard gets in a round have no later answer to show them lost, only their timer, so they
        # should be the ones least likely to lose a frame
        for m in sorted(msgs, key=lambda m: -m.cost):
            queues.setdefault(m.shard_id, collections.deque()).append(m)
        inflight = dict.fromkeys(queues, 0)  # frames held in each shard's window
        seqs = self._seqs = itertools.count()  # order of every transmission in the round, re-sends included
        pending: dict[int, Outstanding] = {}
        live = [0]  # messages of the round not answered yet (probes aside)
        probes = self.tail_probes
        probe_src: dict[int, Outstanding] = {}  # per shard due a tail probe: the message it follows
        t0 = time.monotonic()

        def fill(shard_id: int) -> None:
            q = queues[shard_id]
            m = None
            while q and (inflight[shard_id] == 0 or inflight[shard_id] + q[0].cost <= self.window_frames):
                m = q.popleft()
                now = time.monotonic()
                m.t_first = m.t_sent = now  # latency: from this message's first frame to its reply
                m.seq0 = m.seq = next(seqs)
                m.rto = self._rtt[shard_id, m.msg_type].rto
                self._send(m, retransmit=False)
                m.deadline = time.monotonic() + m.rto
                self._stats.messages_sent += 1
                pending[m.msg_id] = m
                live[0] += 1
                inflight[shard_id] += m.cost
                if inflight[shard_id] > self._stats.max_inflight_frames:
                    self._stats.max_inflight_frames = inflight[shard_id]
            if m is not None and not q and probes:
                # the shard's last message of the round: nothing sent later could show it lost, so
                # a probe follows it (RFC 8985 7's tail loss probe, sent at once: it costs one
                # small message, and waiting for a probe timeout of 2·SRTT would cost more than a
                # whole round where a round is window-bound)
                probe_src[shard_id] = m

        def resend(m: Outstanding) -> None:
            """Recover ``m``: ask for the missing rows of a partly received lookup reply in a repair
            message (:meth:`_repair`), else send ``m`` again."""
            r = self._repair(m) if m.msg_type == MsgType.LOOKUP_REQ and not self.fixed_length else None
            if r is not None:
                del pending[m.msg_id]
                m = pending[r.msg_id] = r
                self._stats.repairs += 1
            m.seq = next(seqs)
            if r is not None:
                m.seq0 = m.seq  # a new message: its answer shows what was sent before it
            m.lost_at = 0.0
            m.t_sent = time.monotonic()
            poll = m.msg_type == MsgType.UPDATE_REQ and len(m.frames) > 1
            if poll:
                # an update of several fragments: one of them asks the shard what it holds (ACK if
                # applied, else UPDATE_NACK with its fragments, answered in _drain with the rest)
                self._stats.update_polls += 1
            self._send(m, retransmit=r is None, frames=m.frames[-1:] if poll else None)
            if r is not None:
                self._stats.retransmits += 1
            m.deadline = time.monotonic() + m.rto
            if probes and not queues[m.shard_id]:
                probe_src[m.shard_id] = m  # a probe right behind it: its answer shows a second loss

        def probe(shard_id: int) -> None:
            src = probe_src.pop(shard_id)
            if src.keys is None or not any(x.shard_id == shard_id and not x.probe for x in pending.values()):
                return
            now = time.monotonic()
            one = src.directory[:1].copy()
            one["num_keys"] = 1
            p = self._lookup_out(shard_id, one, src.keys[:1], lambda r: None, src.dest, t_first=now,
                                 t_sent=now, rto=self._rtt[shard_id, MsgType.LOOKUP_REQ].rto, probe=True)
            p.seq0 = p.seq = next(seqs)
            self._send(p, retransmit=False)
            p.deadline = time.monotonic() + p.rto
            pending[p.msg_id] = p
            self._stats.probes += 1

        for sid in queues:
            fill(sid)
        for sid in list(probe_src):
            probe(sid)
        while live[0] > 0:
            wait = min(min(m.deadline, m.lost_at or m.deadline) for m in pending.values()) - time.monotonic()
            if wait > 0:
                select.select([self.sock], [], [], wait)
            # read before any timer is acted on: a reply that arrived while this process was not
            # scheduled (a busy machine) is taken, not answered with a retransmission
            done, partial = self._drain(pending, record_latency)
            now = time.monotonic()
            for m in done:
                if m.probe:
                    continue
                live[0] -= 1
                inflight[m.shard_id] -= (m.root or m).cost  # a repair holds its round message's room
                if m.tries == 1 and m.root is None:  # Karn: a re-sent or repair message gives no sample
                    self._rtt[m.shard_id, m.msg_type].sample(now - m.t_first)
                fill(m.shard_id)
            if done or partial:
                # Loss detection (RACK, RFC 8985, by transmission order): a shard answers in the
                # order it was asked, so a message whose latest transmission
                # went out before the first transmission of an answered message of its shard (or of
                # one whose reply has begun to come; or a probe's) lost a frame — unless its answer
                # is merely reordered on the path: it is recovered once the
                # shard's reordering window (_reo_wnd) has passed without its answer.
                # RFC 6298 5.3 per shard: a shard that answers (a whole reply or a fragment) is making
                # progress, so the timers of its other messages restart (they may be queued behind).
                ev = dict(partial)  # a fragment of a later message's reply shows it as well
                for m in done:
                    # which transmission was answered: the latest, unless the answer came sooner than
                    # the shortest round trip seen after it (then it may be the first's; RFC 8985 6.2)
                    e = self._rtt[m.shard_id, m.msg_type]
                    s = m.seq if e.min_rtt is not None and now - m.t_sent >= e.min_rtt else m.seq0
                    ev[m.shard_id] = max(ev.get(m.shard_id, -1), s)
                for x in pending.values():
                    e = ev.get(x.shard_id)
                    if e is None or x.probe:
                        continue
                    if x.seq < e and not x.lost_at:
                        x.lost_at = now + self._reo_wnd(x)
                    if x.deadline < now + x.rto:
                        x.deadline = now + x.rto
            now = time.monotonic()
            for x in [x for x in pending.values() if x.lost_at and x.lost_at <= now]:
                if x.tries >= self.retries:  # later answers (probes too) keep showing it lost: a bound
                    self._give_up_on(x, pending, now, t0)
                self._stats.fast_retransmits += 1
                resend(x)
            for sid in list(probe_src):
                probe(sid)
            if done or live[0] == 0:
                continue  # read again before a timer is acted on (replies may have come meanwhile)
            now = time.monotonic()
            if min(m.deadline for m in pending.values()) <= now:
                self._expire(pending, now, t0, resend)
        for m in pending.values():  # probes still out: their answers are no stale replies
            self._late_probes[m.msg_id] = None
        while len(self._late_probes) > 4096:
            self._late_probes.popitem(last=False)

    def _repair(self, m: Outstanding) -> Outstanding | None:
        """A repair of lookup ``m`` whose reply came in part: a new LOOKUP_REQ (its own ``msg_id``)
        for only the keys whose rows lie in ``m``'s missing reply fragments, of whichever tables.
        Its reply's rows and the fragments already held make ``m``'s whole reply, handed to
        ``m.on_reply``. Lookups are idempotent reads, so asking again for some keys under a new id
        is safe; the card and the shards see an ordinary message. Returns None when no fragment
        of ``m``'s reply is held (its request may not have arrived: re-send ``m`` instead)."""
        # the reply's fragments held so far (moved here from Reassembler.partial, which no production caller
        # used): the header of the first seen, {frag_index: body bytes} and the body bytes P per non-last one
        held = self._reasm._pending.get((self.client_id, m.msg_id, MsgType.LOOKUP_REPLY))
        if held is None:
            return None
        h, parts, p = held.header, held.parts, held.p
        d = m.directory
        total = m.value_len
        if (p <= 0 or d is None or h.msg_len != total or h.num_keys != m.num_keys
                or h.num_tables != len(d) or h.shard_id != m.shard_id or m.keys is None):
            return None  # not a reply of m's shape: let the whole message be asked again
        # every key's row: its table, its byte range [ks, ks + kl) in the reply body
        counts = d["num_keys"].astype(np.int64)
        tix = np.repeat(np.arange(len(d)), counts)
        kl = codec.row_bytes(d)[tix]
        ks = np.zeros(m.num_keys, np.int64)
        np.cumsum(kl[:-1], out=ks[1:])
        missing = np.ones(h.frag_count, bool)
        missing[np.fromiter(parts.keys(), np.int64, len(parts))] = False
        cm = np.zeros(h.frag_count + 1, np.int64)
        np.cumsum(missing, out=cm[1:])
        f0, f1 = ks // p, (ks + kl - 1) // p  # the fragments a row spans
        idx = np.flatnonzero(cm[f1 + 1] - cm[f0] > 0)
        body = bytearray(total)
        for j, b in parts.items():  # per fragment held (at most MAX_FRAGS)
            body[j * p:j * p + len(b)] = b
        self._reasm.discard(self.client_id, m.msg_id, MsgType.LOOKUP_REPLY)
        sub_counts = np.bincount(tix[idx], minlength=len(d))
        sub = d[sub_counts > 0].copy()
        sub["num_keys"] = sub_counts[sub_counts > 0]
        # where each byte of the repair's reply goes in the whole reply
        lens = kl[idx]
        dst = np.repeat(ks[idx] - np.concatenate(([0], np.cumsum(lens)[:-1])), lens) + np.arange(int(lens.sum()))

        def assemble(r: Message, body=body, dst=dst, target=m, h=h) -> None:
            np.frombuffer(body, np.uint8)[dst] = np.frombuffer(r.body, np.uint8)
            target.on_reply(Message(h, bytes(body), r.addr))

        root = m.root or m
        return self._lookup_out(m.shard_id, sub, m.keys[idx], assemble, m.dest, t_first=root.t_first,
                                t_sent=time.monotonic(), rto=m.rto, tries=m.tries, root=root)

    def _lookup_out(self, shard_id: int, directory: np.ndarray, keys: np.ndarray,
                    on_reply: Callable[[Message], None], dest: tuple[str, int], msg_id: int | None = None,
                    **kw) -> Outstanding:
        """A LOOKUP_REQ of ``keys`` (uint64 (n,), table by table as ``directory`` —
        :data:`codec.DIR_DTYPE` (T,) — says) to ``shard_id`` via ``dest``, under a new message id,
        encoded to the MTU, with its reply's fragment count and largest datagram (bytes); ``kw``
        sets more :class:`Outstanding` fields (times, a repair's ``root``, ``probe``). Every lookup message
        is made here: a round's (``msg_id`` given), a repair's and a tail probe's."""
        msg_id = self._alloc_id() if msg_id is None else msg_id
        frames = codec.encode_lookup(msg_id=msg_id, client_id=self.client_id, shard_id=shard_id,
                                     directory=directory, keys=keys, mtu=self.mtu)
        reply_len = codec.value_len_of(directory)
        return Outstanding(msg_id, MsgType.LOOKUP_REQ, shard_id, directory, len(keys), dest, frames, on_reply,
                    reply_frames=codec.frag_geometry(reply_len, self.mtu)[1],
                    datagram=self._datagram(frames, reply_len), keys=keys, value_len=reply_len, **kw)

    def _give_up_on(self, m: Outstanding, pending: dict, now: float, t0: float) -> None:
        """Raise :class:`ShardUnavailableError` for ``m``, tried ``retries`` times (the production
        client's message, :meth:`EmbeddingClient._give_up`)."""
        n = sum(1 for x in pending.values() if x.shard_id == m.shard_id and not x.probe)
        big = max(x.datagram for x in pending.values() if x.shard_id == m.shard_id)
        self._give_up(m.shard_id, m.msg_type, m.tries, now - t0, n, big)

    def _reo_wnd(self, m: Outstanding) -> float:
        """Reordering window (s) of ``m``'s shard and type (RFC 8985 6.2): a quarter of its shortest
        round trip seen (of its RTO before any sample), at least :data:`REO_WND_MIN_MS` — room for
        answers the path reorders. (RFC 8985
        widens it on proof of a needless re-send; here an answer sooner than usual proves nothing:
        a lone re-sent message is answered faster than one queued in a burst.)"""
        e = self._rtt[m.shard_id, m.msg_type]
        return max(REO_WND_MIN_MS / 1000.0, (e.min_rtt if e.min_rtt is not None else e.rto) / 4)

    def _expire(self, pending: dict, now: float, t0: float, resend: Callable[[Outstanding], None]) -> None:
        """Timers that fired: per shard, re-send only the fired message transmitted first (RFC
        6298 5.4: a shard that stalled on a busy machine costs one spurious re-send, not one per
        message in flight; a real loss of the others shows when the re-sent one is answered, or by
        their own timers, restarted here) and double that message's timer (5.5, per message: the
        shard's estimate is left to the next sample, so one lossy message does not slow every
        other message's timer)."""
        self._reasm.expire()
        for m in [m for m in pending.values() if m.probe and m.deadline <= now]:
            del pending[m.msg_id]  # a probe is never re-sent: the timers of what it followed cover it
            self._late_probes[m.msg_id] = None
        fired = [m for m in pending.values() if m.deadline <= now]
        for m in fired:
            if m.tries >= self.retries:
                self._give_up_on(m, pending, now, t0)
        first: dict[int, Outstanding] = {}  # per shard, the fired message transmitted first
        for m in fired:
            if m.shard_id not in first or m.seq < first[m.shard_id].seq:
                first[m.shard_id] = m
        for m in fired:
            if first[m.shard_id] is not m:
                m.deadline = now + m.rto  # its turn comes if the one re-sent does not show progress
                continue
            self._stats.timeouts += 1
            m.rto = min(m.rto * 2, self._rtt[m.shard_id, m.msg_type].rto_max)
            resend(m)

    def _drain(self, pending: dict, record_latency: bool) -> tuple[list[Outstanding], dict[int, int]]:
        """Read every waiting datagram. Returns the messages whose reply completed and, per shard,
        the latest first transmission (``seq0``) of a pending message of which a reply fragment
        came without completing it (its shard answered everything sent before it)."""
        buf = self._buf
        done: list[Outstanding] = []
        partial: dict[int, int] = {}
        while True:
            try:
                n, addr = self.sock.recvfrom_into(buf)
            except (BlockingIOError, InterruptedError):
                return done, partial
            self._stats.frames_received += 1
            self._stats.bytes_received += n
            payload = bytes(buf[:n])
            try:
                fh = codec.parse_header(payload, expect="reply")
            except codec.FrameError:
                fh = None  # the reassembler counts it by reason
            msg = self._reasm.feed(payload, addr, header=fh)
            if msg is None:
                if fh is not None and fh.frag_count > 1:
                    m = pending.get(fh.msg_id)
                    if (m is not None and fh.client_id == self.client_id and fh.shard_id == m.shard_id
                            and fh.msg_type == _REPLY[m.msg_type] and m.seq0 > partial.get(m.shard_id, -1)):
                        partial[m.shard_id] = m.seq0
                continue
            h = msg.header
            m = pending.get(h.msg_id)
            if m is None or h.client_id != self.client_id:
                if m is None and h.client_id == self.client_id and h.msg_id in self._late_probes:
                    del self._late_probes[h.msg_id]  # a probe's answer after its round
                    continue
                self._stats.stale_replies += 1
                continue
            if h.shard_id != m.shard_id:  # docs/protocol.md, "The card's state map"
                self._stats.drops["wrong_shard_reply"] += 1
                continue
            if h.msg_type == MsgType.ERROR:
                raise ShardError(m.shard_id, h.table_id, h.status)
            if h.msg_type == MsgType.UPDATE_NACK and m.msg_type == MsgType.UPDATE_REQ:
                self._answer_nack(m, msg)
                if m.seq0 > partial.get(m.shard_id, -1):
                    partial[m.shard_id] = m.seq0  # the shard answered: what it was sent before m arrived
                continue
            if (h.msg_type != _REPLY[m.msg_type] or h.num_keys != m.num_keys or h.num_tables != m.num_tables
                    or h.value_len != m.value_len):
                self._stats.drops["mismatched_reply"] += 1
                continue
            self._largest_answered = max(self._largest_answered, m.datagram)
            m.on_reply(msg)
            del pending[h.msg_id]
            done.append(m)
            if m.probe:
                continue
            self._stats.messages_received += 1
            if record_latency:
                self._stats.lookup_latency_us.append((time.monotonic() - m.t_first) * 1e6)

    def _answer_nack(self, m: Outstanding, msg: Message) -> None:
        """An UPDATE_NACK for update ``m``: re-send (``RETRANSMIT``) exactly the fragments the shard
        does not hold, at once; ``m`` stays pending until its UPDATE_ACK, under its timer."""
        h = msg.header
        if h.num_keys != m.num_keys or h.value_len != m.value_len or len(msg.body) != consts.NACK_LEN:
            self._stats.drops["mismatched_reply"] += 1
            return
        held = clientref.nack_held(msg.body, len(m.frames))
        missing = [f for f, have in zip(m.frames, held.tolist()) if not have]
        self._stats.nacks += 1
        if missing:
            # a transmission of its own: answers of what was sent before it (a tail probe after
            # the poll) must not show it lost again
            m.seq = next(self._seqs)
            m.lost_at = 0.0
            self._send(m, retransmit=True, frames=missing, tries=False)
            self._stats.tries_by_nack += 1
            self._stats.frames_resent += len(missing)
        m.t_sent = time.monotonic()
        m.deadline = m.t_sent + m.rto
