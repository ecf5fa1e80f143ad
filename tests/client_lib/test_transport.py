"""The client's transport (docs/protocol.md, "Reliability"): RFC 6298 retransmission timers per
message, a send window per shard, loss found by later answers (RACK) and lookups repaired, on
real UDP shards — loss-free (no retransmission, the window never exceeded) and through relays
that drop frames, at random (seeded) or by rule (every row still right, updates once).

Every test runs on both round engines: the C one (the package's ``libembnic_client``,
:mod:`embnic.client_lib.native`) and the numpy transport it was written after
(``pyround.PyRoundClient``, the test oracle).

Run alone: python3 -m pytest -q tests/client_lib/test_transport.py
"""
from __future__ import annotations

import random
import select
import socket
import threading

import numpy as np
import pytest

from embnic.client_lib.client import EmbeddingClient
from embnic.client_lib.config import parse_config
from embnic.client_lib.local import LocalBackend
from embnic.testbed.server.runner import ServerCluster
from pyround import PyRoundClient, RttEstimator

TABLES = [{"id": 0, "dim": 16, "optimizer": "adagrad", "lr": 0.1},
          {"id": 1, "rows": 50000, "dim": 8, "optimizer": "sgd", "lr": 0.3}]


def make_cfg(**cluster):
    return parse_config({
        "cluster": {"seed": 7, "sharding": "hash", "timeout_ms": 200, "retries": 30, **cluster},
        "tables": TABLES,
        "shards": [{"id": i, "ip": "127.0.0.1", "port": 7900 + i} for i in range(2)],
        "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7990}],
    })


@pytest.fixture(params=["native", "numpy"])
def client_class(request) -> type:
    """Which round engine a client runs: the C one (EmbeddingClient) or the numpy oracle."""
    return EmbeddingClient if request.param == "native" else PyRoundClient


def batches(n, size, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        k0 = np.unique(rng.integers(0, 2**64 - 1, size, dtype=np.uint64, endpoint=True))
        k1 = np.unique(rng.integers(0, 50000, size, dtype=np.uint64))
        yield {0: k0, 1: k1}


def test_rtt_estimator_rfc6298_worked_example():
    e = RttEstimator(0.2, 0.001, 10.0)
    assert e.rto == pytest.approx(0.2) and e.srtt is None
    e.sample(0.002)
    assert (e.srtt, e.rttvar) == pytest.approx((0.002, 0.001))
    assert e.rto == pytest.approx(0.002 + 4 * 0.001)
    e.sample(0.004)
    assert e.rttvar == pytest.approx(0.75 * 0.001 + 0.25 * 0.002)
    assert e.srtt == pytest.approx(0.875 * 0.002 + 0.125 * 0.004)
    assert e.rto == pytest.approx(0.00225 + 4 * 0.00125)
    for _ in range(30):
        e.sample(60.0)
    assert e.rto == 10.0
    floor = RttEstimator(0.2, 0.05, 1.0)
    floor.sample(0.001)
    assert floor.rto == 0.05
    with pytest.raises(ValueError):
        RttEstimator(0.2, 0.0, 1.0)


def test_window_bounds_in_flight_and_no_retransmits_loss_free(client_class):
    cfg = make_cfg()
    ref = LocalBackend(cfg)
    with ServerCluster(cfg) as cl, client_class(cl.cfg, 1, bind=("127.0.0.1", 0), window_frames=24,
                                                rto_min_ms=1000) as c:
        seen = []
        if client_class is PyRoundClient:
            orig = c._send

            def spy(m, retransmit):  # frames in flight per shard at every send, window included
                orig(m, retransmit)
                seen.append(m.cost)

            c._send = spy
        for b in batches(3, 6000):
            got = c.lookup(b)
            for tid, keys in b.items():
                assert np.array_equal(got[tid], ref.lookup({tid: keys})[tid])
            grads = {tid: (k, np.full((len(k), cfg.table(tid).dim), 0.01, np.float32)) for tid, k in b.items()}
            c.update(grads)
            for tid, (k, g) in grads.items():
                ref.update({tid: (k, g)})
        # nothing is lost on loopback: no timer fires (the 1 s floor, RFC 6298's, rides out a busy machine)
        assert c.stats.retransmits == 0 and c.stats.timeouts == 0
        assert c.stats.max_inflight_frames <= 24
        assert max(seen, default=0) <= 24  # every message here fits the window alone
        assert c.stats.messages_sent > 2 * 2 * 2 * 3  # the window split rounds into many messages in turn
        assert c.rtt(0)["samples"] > 0 and c.rtt(0)["srtt_ms"] > 0
        for b in batches(1, 50, seed=9):
            got = c.lookup(b)
            assert all(np.array_equal(got[t], ref.lookup({t: b[t]})[t]) for t in b)


def test_msg_frames_bounds_every_message_and_reply(client_class):
    import dataclasses

    cfg = make_cfg()
    ref = LocalBackend(cfg)
    with ServerCluster(cfg) as cl:
        relays = [RuleRelay((s.ip, s.port), lambda d, h: False) for s in cl.cfg.shards]
        shards = tuple(dataclasses.replace(s, ip=r.address[0], port=r.address[1]) for s, r in zip(cl.cfg.shards, relays))
        try:
            with client_class(dataclasses.replace(cl.cfg, shards=shards), 1, bind=("127.0.0.1", 0),
                              msg_frames=3) as c:
                _msg_frames_round(c, cfg, ref)
        finally:
            for r in relays:
                r.close()
    sizes = [h.frag_count for r in relays for _, h in r.seen]
    assert max(sizes) == 3 and len({(h.msg_id, h.msg_type) for r in relays for d, h in r.seen if d == "req"}) > 20
    with pytest.raises(ValueError, match="msg_frames"):
        EmbeddingClient(cfg, 1, bind=("127.0.0.1", 0), msg_frames=0)


def _msg_frames_round(c, cfg, ref):
    if True:
        b = next(batches(1, 3000, seed=5))
        got = c.lookup(b)
        assert all(np.array_equal(got[t], ref.lookup({t: k})[t]) for t, k in b.items())
        c.update({t: (k, np.full((len(k), cfg.table(t).dim), 0.5, np.float32)) for t, k in b.items()})
        for t, k in b.items():
            ref.update({t: (k, np.full((len(k), cfg.table(t).dim), 0.5, np.float32))})
        got = c.lookup(b)
        assert all(np.array_equal(got[t], ref.lookup({t: k})[t]) for t, k in b.items())


class LossyRelay:
    """A UDP relay in front of one shard that drops each datagram, either way, with
    probability ``loss`` (seeded). The client sends to ``address``; replies come back through it."""

    def __init__(self, shard_addr, loss: float, seed: int):
        self.shard_addr = shard_addr
        self.loss = loss
        self.rng = random.Random(seed)
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind(("127.0.0.1", 0))
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back.bind(("127.0.0.1", 0))
        for s in (self.front, self.back):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.address = self.front.getsockname()
        self.client = None
        self.dropped = self.passed = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            r, _, _ = select.select([self.front, self.back], [], [], 0.05)
            for s in r:
                data, addr = s.recvfrom(65536)
                if s is self.front:
                    self.client = addr
                    dest, out = self.shard_addr, self.back
                else:
                    dest, out = self.client, self.front
                if self.rng.random() < self.loss:
                    self.dropped += 1
                    continue
                self.passed += 1
                out.sendto(data, dest)

    def close(self):
        self._stop.set()
        self._t.join(5)
        self.front.close()
        self.back.close()


def test_loss_retransmits_per_message_and_stays_exact(client_class):
    import dataclasses

    cfg = make_cfg()
    ref = LocalBackend(cfg)
    with ServerCluster(cfg) as cl:
        relays = [LossyRelay((s.ip, s.port), 0.03, seed=s.id) for s in cl.cfg.shards]
        try:
            shards = tuple(dataclasses.replace(s, ip=r.address[0], port=r.address[1])
                           for s, r in zip(cl.cfg.shards, relays))
            lcfg = dataclasses.replace(cl.cfg, shards=shards)
            with client_class(lcfg, 1, bind=("127.0.0.1", 0), window_frames=64) as c:
                for b in batches(3, 1500, seed=3):
                    got = c.lookup(b)
                    for tid, keys in b.items():
                        assert np.array_equal(got[tid], ref.lookup({tid: keys})[tid])
                    grads = {tid: (k, np.full((len(k), cfg.table(tid).dim), 0.02, np.float32))
                             for tid, k in b.items()}
                    c.update(grads)
                    for tid, (k, g) in grads.items():
                        ref.update({tid: (k, g)})
                final = {t: np.concatenate([b[t] for b in batches(3, 1500, seed=3)]) for t in (0, 1)}
                got = c.lookup({t: np.unique(k) for t, k in final.items()})
                for t, k in final.items():
                    assert np.array_equal(got[t], ref.lookup({t: np.unique(k)})[t])  # each update applied once
                assert c.stats.retransmits > 0
                assert c.stats.retransmits == c.stats.timeouts + c.stats.fast_retransmits
                assert sum(r.dropped for r in relays) > 0
        finally:
            for r in relays:
                r.close()


def test_fast_retransmit_when_a_later_message_is_answered_first(client_class):
    """A bare socket plays shard 0: it ignores the first lookup message, answers the second;
    the client re-sends the first at once (RETRANSMIT set), long before its 5 s timer. Both are
    of one table (a 2-fragment-window client splits it); no fragment of the first one's reply
    came, so it is re-sent whole (not repaired)."""
    from embnic.client_lib import codec, consts
    from embnic.client_lib.consts import Flags, MsgType
    from embnic.client_lib.reassembly import Reassembler

    from embnic.client_lib.sockets import set_socket_buffers

    shard = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    set_socket_buffers(shard)  # 256 request frames arrive at once
    shard.bind(("127.0.0.1", 0))
    shard.settimeout(10.0)  # a bound for a broken client, not a timing assertion
    cfg = parse_config({
        "cluster": {"seed": 1, "timeout_ms": 5000, "retries": 3},
        "tables": [{"id": 0, "dim": 4}],
        "shards": [{"id": 0, "ip": "127.0.0.1", "port": shard.getsockname()[1]}],
        "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7995}],
    })
    seen = []

    def play_shard():
        reasm = Reassembler(expect="request")
        while len(seen) < 3:
            data, addr = shard.recvfrom(65536)
            m = reasm.feed(data, addr)
            if m is None:
                continue
            if m.header.num_keys > 1:  # (one-key lookups are the client's tail probes: answered)
                seen.append((m.header.num_keys, bool(m.header.flags & Flags.RETRANSMIT)))
                if len(seen) == 1:
                    continue  # the first message is "lost"
            rows = np.full((m.header.num_keys, 4), float(m.header.num_keys), dtype=np.float32)
            for f in codec.encode_reply(m.header, MsgType.LOOKUP_REPLY, shard_id=0, body=codec.rows_to_body(rows)):
                shard.sendto(f, addr)

    t = threading.Thread(target=play_shard, daemon=True)
    t.start()
    n = consts.MAX_FRAGS * consts.max_body_per_frame(1500) // 16  # 22848 rows of 16 bytes: a 256-fragment reply
    keys = np.arange(1, 1 + 2 * n, dtype=np.uint64)  # two messages of table 0, both in the window
    with client_class(cfg, 1, bind=("127.0.0.1", 0), rto_min_ms=5000, window_frames=1000, msg_frames=None) as c:
        got = c.lookup({0: keys})
        stats = c.stats
    t.join(10)
    shard.close()
    assert seen == [(n, False), (n, False), (n, True)]
    assert np.array_equal(got[0], np.full((len(keys), 4), float(n), np.float32))
    assert (stats.fast_retransmits, stats.timeouts, stats.retransmits) == (1, 0, 1)


class RuleRelay:
    """A UDP relay in front of one shard that drops the frames ``drop(direction, header)`` names
    (``direction`` "req" or "rep"; a deterministic rule on the header, no randomness, no timing)
    and records the header of every frame it saw."""

    def __init__(self, shard_addr, drop):
        from embnic.client_lib.sockets import set_socket_buffers

        self.shard_addr, self.drop = shard_addr, drop
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for s in (self.front, self.back):
            set_socket_buffers(s)
            s.bind(("127.0.0.1", 0))
        self.address = self.front.getsockname()
        self.client = None
        self.seen: list = []
        self.dropped: list = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        from embnic.client_lib.codec import parse_header

        while not self._stop.is_set():
            r, _, _ = select.select([self.front, self.back], [], [], 0.05)
            for s in r:
                data, addr = s.recvfrom(65536)
                h = parse_header(data)
                if s is self.front:
                    self.client = addr
                    d, dest, out = "req", self.shard_addr, self.back
                else:
                    d, dest, out = "rep", self.client, self.front
                self.seen.append((d, h))
                if self.drop(d, h):
                    self.dropped.append((d, h))
                    continue
                out.sendto(data, dest)

    def close(self):
        self._stop.set()
        self._t.join(5)
        self.front.close()
        self.back.close()


def test_lost_fragments_recovered_by_later_answers_and_repairs(client_class):
    """One shard behind a relay that drops, once each: fragment 5 of the first lookup message's
    reply, fragment 0 of the second lookup message, the first update message's ack and fragment 3
    of the second update message (a round of 4 tables to one shard is 4 messages each way here:
    ``msg_frames=40``). The shard answers in order, so the later messages' answers show each loss
    (RACK; a one-key probe follows each shard's last message) long before the 5 s timers: the
    partly answered lookup is completed by a repair that asks only for the rows of the missing
    fragment, the unanswered lookup is sent again, and each lost update is *polled* (its last
    fragment again): the one whose ack was lost is acked from the shard's window, the one that
    lost a fragment is answered UPDATE_NACK and only that fragment is re-sent. Rows and tables
    equal LocalBackend's (each update applied once)."""
    import dataclasses

    from embnic.client_lib.consts import Flags, MsgType

    tables = [{"id": 0, "dim": 16}, {"id": 1, "dim": 8}, {"id": 2, "dim": 8}, {"id": 3, "dim": 4}]
    cfg = parse_config({"cluster": {"seed": 5, "timeout_ms": 5000, "retries": 3}, "tables": tables,
                        "shards": [{"id": 0, "ip": "127.0.0.1", "port": 7910}],
                        "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7991}]})
    ref = LocalBackend(cfg)
    once: set = set()
    order: dict = {MsgType.LOOKUP_REQ: [], MsgType.UPDATE_REQ: []}  # msg ids of the round's messages, in order

    def nth(h) -> int:
        """1-based place of request ``h``'s message among those of its type (one-key probes aside)."""
        ids = order[h.msg_type]
        if h.msg_id not in ids and h.num_keys > 1:
            ids.append(h.msg_id)
        return ids.index(h.msg_id) + 1 if h.msg_id in ids else 0

    def first(key) -> bool:
        if key in once:
            return False
        once.add(key)
        return True

    def drop(d, h) -> bool:
        if d == "req" and h.msg_type in order:
            k = nth(h)
            if h.msg_type == MsgType.LOOKUP_REQ and k == 2 and h.frag_index == 0:
                return first("lq")
            if h.msg_type == MsgType.UPDATE_REQ and k == 2 and h.frag_index == 3:
                return first("uq")
            return False
        ids = order.get(MsgType.LOOKUP_REQ if h.msg_type == MsgType.LOOKUP_REPLY else MsgType.UPDATE_REQ, [])
        if d == "rep" and h.msg_type == MsgType.LOOKUP_REPLY and ids[:1] == [h.msg_id] and h.frag_index == 5:
            return first("lr")
        if d == "rep" and h.msg_type == MsgType.UPDATE_ACK and ids[:1] == [h.msg_id]:
            return first("ua")
        return False

    rng = np.random.default_rng(4)
    sizes = {0: 2000, 1: 1500, 2: 300, 3: 50}
    req = {t: np.unique(rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)) for t, n in sizes.items()}
    with ServerCluster(cfg) as cl:
        relay = RuleRelay((cl.cfg.shards[0].ip, cl.cfg.shards[0].port), drop)
        try:
            lcfg = dataclasses.replace(cl.cfg, shards=(dataclasses.replace(cl.cfg.shards[0], ip=relay.address[0],
                                                                            port=relay.address[1]),))
            with client_class(lcfg, 1, bind=("127.0.0.1", 0), rto_min_ms=5000, msg_frames=40) as c:
                got = c.lookup(req)
                for t, k in req.items():
                    assert np.array_equal(got[t], ref.lookup({t: k})[t]), t
                assert (c.stats.repairs, c.stats.fast_retransmits, c.stats.timeouts) == (1, 2, 0)
                assert c.stats.round_messages == 4 and c.stats.round_shards == 1
                upd = {t: (k, rng.standard_normal((k.size, cfg.table(t).dim)).astype(np.float32))
                       for t, k in req.items()}
                order[MsgType.LOOKUP_REQ] = []
                c.update(upd)
                for t, (k, g) in upd.items():
                    ref.update({t: (k, g)})
                assert (c.stats.repairs, c.stats.fast_retransmits, c.stats.timeouts) == (1, 4, 0)
                assert c.stats.retransmits == 4
                assert (c.stats.update_polls, c.stats.nacks, c.stats.frames_resent) == (2, 1, 1)
                for t, k in req.items():
                    assert np.array_equal(c.lookup({t: k})[t], ref.lookup({t: k})[t]), t
                assert c.stats.timeouts == 0 and c.stats.probes >= 3  # after each round's tail at least
        finally:
            relay.close()
        counters = cl.counters()[0]
    assert len(relay.dropped) == 4
    resent = [h for d, h in relay.seen if d == "req" and h.flags & Flags.RETRANSMIT]
    # the lookup sent again whole; each lost update polled with its last fragment, then fragment 3
    # of the one that lost it — nothing else of either update again
    lq = [h for h in resent if h.msg_type == MsgType.LOOKUP_REQ]
    assert {h.frag_index for h in lq} == set(range(lq[0].frag_count))
    up = [(h.msg_id, h.frag_index, h.frag_count) for h in resent if h.msg_type == MsgType.UPDATE_REQ]
    u1, u2 = order[MsgType.UPDATE_REQ][:2]
    assert sorted((i, fi) for i, fi, fc in up) == sorted([(u1, next(fc for i, _, fc in up if i == u1) - 1),
                                                         (u2, next(fc for i, _, fc in up if i == u2) - 1), (u2, 3)])
    # the repair: a new lookup (no RETRANSMIT) of only the rows of the lost reply fragment
    reps = [h for d, h in relay.seen if d == "req" and h.msg_type == MsgType.LOOKUP_REQ and h.frag_index == 0
            and h.num_keys > 1 and not h.flags & Flags.RETRANSMIT]
    assert any(h.num_keys < 100 for h in reps)
    nacks = [h for d, h in relay.seen if d == "rep" and h.msg_type == MsgType.UPDATE_NACK]
    assert len(nacks) == 1 and nacks[0].msg_id == u2
    assert counters["updates_applied"] == 4 and counters["update_poll_acks"] == 1 and counters["update_nacks"] == 1
