"""hypothesis drives the shard's one-frame path (``ShardState.take_frame``, through the reference
shard's ``handle_datagram``: the path every datagram the serving loop's fast path does not take goes through) with sequences of arbitrary and near-valid datagrams
(tests/client_lib/fuzzframes.py: truncated, lying lengths, fragment floods, mixed clients and
senders, any order, duplicates), on a server whose transport records what it sends.

After every datagram: no exception escaped and none was caught inside (``internal_errors`` 0);
the datagram is accounted for — dropped and counted by a known reason (``refused`` for the
frames the header checks refuse), or taken by the reassembler (which counts its own drops); the
reassembler's pending messages stay within their limits; every frame sent is a valid reply from
this shard, for the client and message id the datagram names. At the end
no row holds a NaN or an infinity. The serving loop (``embnic server``) gets the same
sequences through its socket (test_batch_engine_sequences).
"""
from __future__ import annotations

import socket
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from embnic.client_lib import codec, consts
from embnic.client_lib.config import parse_config
from embnic.client_lib.routing import owns
from embnic.testbed.server.shard_state import SERVER_DROP_REASONS

from reference_shard import ReferenceShard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client_lib"))
from fuzzframes import ADDRS, datagrams  # noqa: E402  (tests/client_lib)

CFG = parse_config({
    "cluster": {"seed": 7, "sharding": "hash", "mtu": 576, "timeout_ms": 200, "retries": 1},
    "tables": [
        {"id": 0, "rows": 500, "dim": 8, "optimizer": "adagrad", "lr": 0.1},
        {"id": 1, "dim": 16, "optimizer": "sgd", "lr": 0.3},
        {"id": 3, "rows": 1000, "dim": 12, "optimizer": "adagrad", "dtype": "fp16"},
    ],
    "shards": [{"id": i, "ip": "127.0.0.1", "port": 7900 + i} for i in range(2)],
    "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7990}],
})
REASONS = set(consts.DROP_REASONS) | set(SERVER_DROP_REASONS)


class Recorder:
    """A stand-in for the server's asyncio transport: keeps every (frame, addr) sent."""

    def __init__(self):
        self.sent: list[tuple[bytes, tuple]] = []

    def sendto(self, data, addr):
        self.sent.append((bytes(data), addr))

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 7900) if name == "sockname" else default

    def close(self):
        pass


def accounted(srv: ReferenceShard) -> int:
    """Datagrams the handler has accounted for: dropped by the server, or fed to the reassembler
    (update polls too)."""
    return sum(srv.state.drops.values()) + srv.reasm.stats["frames"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(datagrams(max_len=25, key_space=1200))
def test_handle_datagram_sequences(seq):
    srv = ReferenceShard(CFG, 0, port=0, reassembly_timeout_s=0.5)
    srv.transport = tr = Recorder()
    for n, (payload, addr) in enumerate(seq, 1):
        tr.sent.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. NaN arithmetic in an optimizer
            srv.handle_datagram(payload, addr)
        c = srv.counters()
        assert c["internal_errors"] == 0 and c["rx_frames"] == n
        assert accounted(srv) == n, (srv.state.drops, srv.reasm.stats)
        assert set(k for k, v in c["drops"].items() if v) <= REASONS, c["drops"]
        r = srv.reasm
        assert len(r) <= r.max_pending and r.pending_bytes == sum(e.nbytes for e in r._pending.values())
        assert r.pending_bytes <= r.max_pending_bytes or len(r) == 1
        for frame, to in tr.sent:
            h = codec.parse_header(frame, expect="reply")  # raises FrameError if it is not one
            # to the sender of the message's first fragment seen: fragments are keyed by client
            # id, message id and type, not by sender (behind the card every request comes from
            # the card's address, and the card authenticates client ids)
            assert to in ADDRS and h.shard_id == 0
            assert (h.client_id, h.msg_id) == (int.from_bytes(payload[12:14], "big"),
                                               int.from_bytes(payload[8:12], "big"))
    for _keys, rows, acc in srv.state_dict().values():
        assert np.isfinite(rows).all() and np.isfinite(acc).all()


# ---- the batch engine (the default `embnic server`), through its socket -------------------------

PROBE_ID = 1 << 30


@pytest.fixture(scope="module")
def batch_shard():
    from embnic.testbed.server.runner import ServerThread

    with ServerThread(CFG, 0, reassembly_timeout_s=0.5) as st:
        socks = []
        for _ in ADDRS:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            s.settimeout(20.0)  # a bound for a lost shard, not a timing assertion
            socks.append(s)
        try:
            yield st, socks
        finally:
            for s in socks:
                s.close()


_probe = iter(range(PROBE_ID, PROBE_ID + 1_000_000))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.data_too_large,
                                                                HealthCheck.function_scoped_fixture])
@given(datagrams(max_len=20, key_space=1200))
def test_batch_engine_sequences(batch_shard, seq):
    """The same sequences into the batch engine over loopback (one socket per sender; its fast
    path takes the valid frames in wake-ups, the rest go to the one-frame path), then a
    probe lookup whose answer shows every datagram before it was handled: none raised inside,
    every one counted as received, drops only by known reasons, every frame sent a valid reply
    from this shard."""
    st, socks = batch_shard
    before = st.counters()
    for payload, addr in seq:
        socks[ADDRS.index(addr)].sendto(payload, st.address)
    probe = next(_probe)
    key = np.array([k for k in range(1200) if owns(CFG, 0, 0, np.array([k], np.uint64))[0]][:1], np.uint64)
    socks[0].sendto(codec.encode_lookup(msg_id=probe, client_id=1, shard_id=0, keys=key,
                                        directory=codec.make_directory([0], [8], [1], [1]))[0], st.address)
    while True:  # the probe's answer comes after every reply to what was sent before it
        h = codec.parse_header(socks[0].recv(65536), expect="reply")
        assert h.shard_id == 0
        if h.msg_id == probe:
            break
    for s in socks[1:]:  # what the other senders got: valid replies only
        s.setblocking(False)
        try:
            while True:
                assert codec.parse_header(s.recv(65536), expect="reply").shard_id == 0
        except BlockingIOError:
            pass
        finally:
            s.settimeout(20.0)
    after = st.counters()
    assert after["internal_errors"] == before["internal_errors"] == 0
    assert after["rx_frames"] - before["rx_frames"] == len(seq) + 1
    assert set(k for k, v in after["drops"].items() if v) <= REASONS, after["drops"]


def test_every_kind_of_poll_is_accounted_for():
    """Update polls (the last fragment re-sent with RETRANSMIT) are taken like any fragment and
    accounted for: one that leaves its update incomplete is kept (NACK); one of an applied update
    is acked from the window (its fragment dropped again)."""
    srv = ReferenceShard(CFG, 0, port=0)
    srv.transport = tr = Recorder()
    keys = np.array([k for k in range(1200) if owns(CFG, 0, 0, np.array([k], np.uint64))[0]][:40], np.uint64)
    d = codec.make_directory([0], [8], [1], [keys.size])
    fr = codec.encode_update(msg_id=9, client_id=1, shard_id=0, directory=d, keys=keys,
                             values=np.ones((keys.size, 8), "<f4").tobytes(), mtu=576)
    assert len(fr) > 2
    poll = fr[-1][:4] + bytes([fr[-1][4] | consts.Flags.RETRANSMIT]) + fr[-1][5:]
    seq = [poll, fr[0]] + fr[1:-1] + [poll]  # NACK, (completes: ACK), then a poll of the applied update: ACK
    for n, f in enumerate(seq, 1):
        srv.handle_datagram(f, ADDRS[0])
        assert accounted(srv) == n and srv.counters()["internal_errors"] == 0
    types = [codec.parse_header(f, expect="reply").msg_type for f, _ in tr.sent]
    assert types == [consts.MsgType.UPDATE_NACK, consts.MsgType.UPDATE_ACK, consts.MsgType.UPDATE_ACK]
    c = srv.counters()
    assert (c["update_polls"], c["update_nacks"], c["update_poll_acks"], c["updates_applied"]) == (2, 1, 1, 1)
