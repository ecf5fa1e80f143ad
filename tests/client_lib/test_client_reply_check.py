"""The client takes a reply only from the shard its request went to (docs/protocol.md, "The
card's state map"): a reply naming another shard is dropped and counted, like the card does; and
a client whose large messages go unanswered while small ones pass blames the path's MTU.

A bare UDP socket plays shard 0. Run alone: python3 -m pytest -q tests/client_lib/test_client_reply_check.py
"""
from __future__ import annotations

import socket
import threading

import numpy as np

from embnic.client_lib import codec
from embnic.client_lib.client import EmbeddingClient
from embnic.client_lib.config import parse_config
from embnic.client_lib.consts import MsgType
from embnic.client_lib.reassembly import Reassembler


def test_reply_from_another_shard_dropped_and_counted():
    shard = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    shard.bind(("127.0.0.1", 0))
    shard.settimeout(10.0)  # a bound for a broken client, not a timing assertion
    cfg = parse_config({
        "cluster": {"seed": 1, "timeout_ms": 2000, "retries": 3},
        "tables": [{"id": 0, "rows": 100, "dim": 4}],
        "shards": [{"id": 0, "ip": "127.0.0.1", "port": shard.getsockname()[1]}],
        "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7995}],
    })
    keys = np.array([3, 5], dtype=np.uint64)
    seen = []

    def play_shard():
        reasm = Reassembler(expect="request")
        while True:
            data, addr = shard.recvfrom(65536)
            m = reasm.feed(data, addr)
            if m is None:
                continue
            seen.append(m.header)
            rows = np.full((m.header.num_keys, 4), 7.0, dtype=np.float32)
            body = codec.rows_to_body(rows)
            for sid in (1, 0):  # first a reply naming shard 1 (not the request's), then the right one
                for f in codec.encode_reply(m.header, MsgType.LOOKUP_REPLY, shard_id=sid, body=body):
                    shard.sendto(f, addr)
            return

    t = threading.Thread(target=play_shard, daemon=True)
    t.start()
    with EmbeddingClient(cfg, 1, bind=("127.0.0.1", 0)) as c:
        got = c.lookup({0: keys})
        drops = c.drops
    t.join(10)
    shard.close()
    assert [h.shard_id for h in seen] == [0]
    assert np.array_equal(got[0], np.full((2, 4), 7.0, dtype=np.float32))
    assert drops["wrong_shard_reply"] == 1
    assert c.stats.retransmits == 0


def test_large_messages_unanswered_while_small_pass_blame_the_path_mtu():
    """A path that drops datagrams above 600 bytes: small lookups are answered, a large one is
    not, and the error says the path may not carry the MTU (issue: jumbo frames)."""
    import pytest

    from embnic.client_lib.client import ShardUnavailableError

    shard = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    shard.bind(("127.0.0.1", 0))
    shard.settimeout(0.2)
    cfg = parse_config({
        "cluster": {"seed": 1, "timeout_ms": 200, "retries": 4},  # the small lookup survives 3 s of a busy box
        "tables": [{"id": 0, "rows": 10_000, "dim": 4}],
        "shards": [{"id": 0, "ip": "127.0.0.1", "port": shard.getsockname()[1]}],
        "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7995}],
    })
    stop = threading.Event()

    def small_path_shard():
        reasm = Reassembler(expect="request")
        while not stop.is_set():
            try:
                data, addr = shard.recvfrom(65536)
            except OSError:
                continue
            if len(data) + 28 > 600:  # the path's real MTU
                continue
            m = reasm.feed(data, addr)
            if m is not None:
                rows = np.zeros((m.header.num_keys, 4), dtype=np.float32)
                for f in codec.encode_reply(m.header, MsgType.LOOKUP_REPLY, shard_id=0,
                                            body=codec.rows_to_body(rows)):
                    shard.sendto(f, addr)

    t = threading.Thread(target=small_path_shard, daemon=True)
    t.start()
    try:
        with EmbeddingClient(cfg, 1, bind=("127.0.0.1", 0)) as c:
            assert c.lookup({0: np.arange(4, dtype=np.uint64)})[0].shape == (4, 4)
            with pytest.raises(ShardUnavailableError) as e:
                c.lookup({0: np.arange(1000, dtype=np.uint64)})
    finally:
        stop.set()
        t.join(5)
        shard.close()
    msg = str(e.value)
    # 4 keys: a 120-byte request, a 136-byte reply datagram; 1000 keys: 1500-byte request datagrams
    assert "at most 136 bytes were answered, these need 1500-byte datagrams" in msg, msg
    assert "the path may not carry MTU 1500" in msg and e.value.path_mtu_hint


def test_unanswered_error_names_the_config_for_the_cli_hints():
    """The hints of a shard that never answers carry the config's path (`embnic status -c F`: a
    testbed's card has no default control socket) and mention a lossy path."""
    from embnic.client_lib.client import ShardUnavailableError

    e = ShardUnavailableError(1, ("10.77.0.1", 7878), 5, 3.2, "2 lookup messages", via_card=True,
                              config_path="/run/embnic/testbed-t/cluster.toml")
    msg = str(e)
    assert "`embnic status -c /run/embnic/testbed-t/cluster.toml`" in msg, msg
    assert "`embnic route list -c /run/embnic/testbed-t/cluster.toml`" in msg and "embnic testbed status" in msg
    assert "-c" not in str(ShardUnavailableError(1, ("10.77.0.1", 7878), 5, 3.2, "x", via_card=True))
