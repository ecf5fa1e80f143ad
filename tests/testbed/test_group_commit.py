"""Group commit of the write-ahead log (docs/server.md, "Durability"): the serving loop hands the
``fdatasync`` to the log's sync thread and keeps serving; an update's ack (a duplicate's re-ack,
a poll's ack) leaves only once the ``fdatasync`` covering its record has returned.

The log's ``fdatasync`` is replaced by a fake that blocks in the sync thread until the test lets
it go (or fails), so what the shard sends meanwhile is decided, not timed.

Run alone: python3 -m pytest -q tests/testbed/test_group_commit.py
"""
import errno
import os
import socket
import threading
import time
import zlib

import numpy as np
import pytest

from embnic.client_lib.consts import MsgType
from embnic.testbed.server import durability as D
from embnic.testbed.server.runner import ServerThread

import clientref
from test_server import Raw, lookup_frames, make_cfg, update_frames


class GatedSync:
    """``os.fdatasync`` for the test: in the log's sync thread it waits for :attr:`gate` (and
    raises ``OSError(EIO)`` once :attr:`fail` is set); elsewhere (a new log file's header) it is
    the real one. :attr:`entered` is set when the sync thread is inside it."""

    def __init__(self):
        self.real = os.fdatasync
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.fail = False
        self.calls = 0

    def __call__(self, fd):
        if not threading.current_thread().name.startswith("embnic-wal"):
            return self.real(fd)
        self.calls += 1
        self.entered.set()
        assert self.gate.wait(30), "the test never let the fdatasync go"
        if self.fail:
            raise OSError(errno.EIO, "injected")
        return self.real(fd)


@pytest.fixture
def gated(monkeypatch):
    g = GatedSync()
    monkeypatch.setattr(D.os, "fdatasync", g)
    yield g
    g.gate.set()  # never leave a sync thread waiting


def _update(cfg, m, n=20):
    t = cfg.tables[0]
    keys = clientref.owned_keys(cfg, t.id, 0)[m:m + n]
    return update_frames(cfg, t.id, keys, np.full((keys.size, t.dim), 0.01 * m, np.float32), m)


def _nothing_received(raw) -> list:
    """The reply frames waiting at ``raw`` now (non-blocking)."""
    got = []
    raw.sock.setblocking(False)
    try:
        while True:
            got.append(raw.sock.recv(65536))
    except BlockingIOError:
        pass
    finally:
        raw.sock.settimeout(10.0)
    return got


def _until(cond, what):
    end = time.monotonic() + 30  # a bound for a lost shard, not a timing assertion
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.01)


def test_no_ack_before_its_record_is_durable_and_one_fdatasync_covers_many(tmp_path, gated):
    """Update 1's fdatasync blocks: no ack leaves, while updates 2..5 and a duplicate of 1 are
    received, checked and applied, and a lookup is answered (with the updated rows). Once it
    returns, 1 is acked; the next fdatasync covers 2..5 at once and then their acks (and the
    duplicate's re-ack) leave: 2 fdatasyncs for 5 updates."""
    cfg = make_cfg()
    with ServerThread(cfg, 0, checkpoint_dir=str(tmp_path)) as st:
        raw = Raw(st.address)
        try:
            raw.send(_update(cfg, 1))
            assert gated.entered.wait(30)  # the sync thread holds update 1's fdatasync
            for m in range(2, 6):
                raw.send(_update(cfg, m))
            raw.send(_update(cfg, 1))  # a retransmission of 1: re-acked only once 1 is durable
            _until(lambda: st.counters()["updates_applied"] == 5 and st.counters()["duplicates"] == 1,
                   "the loop stopped applying while the log synced")
            key = clientref.owned_keys(cfg, 0, 0)[1:2]
            raw.send(lookup_frames(cfg, 0, key, 99))  # lookups are not held
            m = raw.recv()
            assert m.header.msg_type == MsgType.LOOKUP_REPLY and m.header.msg_id == 99
            assert not _nothing_received(raw)  # no ack: nothing is durable yet
            c = st.counters()["durability"]
            assert c["seq"] == 5 and c["log_records"] == 0 and c["log_commits"] == 0
            gated.gate.set()
            acks = [raw.recv() for _ in range(6)]
            assert [a.header.msg_type for a in acks] == [MsgType.UPDATE_ACK] * 6
            assert [a.header.msg_id for a in acks] == [1, 2, 3, 4, 5, 1]  # in the order given
            c = st.counters()
            assert c["durability"]["log_records"] == 5 and c["durability"]["log_commits"] == 2 == gated.calls
            assert c["replies"]["UPDATE_ACK"] == 6 and sum(c["service"]["hist"]) == 7  # each reply timed once
        finally:
            raw.close()


def test_a_failed_fdatasync_acks_nothing_and_stops_the_shard(tmp_path, gated):
    """The disk refuses update 1's fdatasync: neither 1 nor an update applied meanwhile is ever
    acked, the shard stops (durable_failed, log_errors 1) and the log is not synced again."""
    cfg = make_cfg()
    st = ServerThread(cfg, 0, checkpoint_dir=str(tmp_path)).start()
    raw = Raw(st.address)
    try:
        raw.send(_update(cfg, 1))
        assert gated.entered.wait(30)
        raw.send(_update(cfg, 2))
        _until(lambda: st.counters()["updates_applied"] == 2, "update 2 was not applied")
        gated.fail = True
        gated.gate.set()
        st._thread.join(30)
        assert not st._thread.is_alive() and st.server.durable_failed
        c = st.server.counters()
        assert c["durability"]["log_errors"] == 1 and c["durability"]["log_records"] == 0 and gated.calls == 1
        raw.sock.settimeout(0.2)  # nothing may come: wait a little for a wrongly sent ack
        with pytest.raises(socket.timeout):
            raw.recv()
    finally:
        raw.close()
        st.stop()


def test_durability_sequences(tmp_path, gated):
    """The log's own sequences: handoff returns at once with what is durable; commit waits; a
    failure is raised by every later call and durable never moves again."""
    d = D.Durability(str(tmp_path), 0, 7)
    d.start_fresh()
    try:
        body = np.zeros(40, np.uint8)
        fp = (1, 2, 8, zlib.crc32(body))
        d.append(1, 1, fp, body)
        assert d.handoff() == 0 and d.written == 1 and gated.entered.wait(30)
        d.append(1, 2, fp, body)
        d.append(1, 3, fp, body)
        assert d.handoff() == 0 and d.written == 3 and d.poll() == 0
        gated.gate.set()
        assert d.commit() == 3 and d.durable == 3 and d.commits == 2 and d.records == 3
        gated.gate.clear()
        gated.entered.clear()
        d.append(1, 4, fp, body)
        d.handoff()
        assert gated.entered.wait(30)
        gated.fail = True
        gated.gate.set()
        with pytest.raises(OSError, match="injected"):
            d.commit()
        with pytest.raises(OSError, match="injected"):
            d.handoff()
        assert d.durable == 3 and d.records == 3
    finally:
        d.close()
    recs, bad = D.read_log(next(tmp_path.glob("shard-0/wal-*.log")), 0)
    assert [r[2] for r in recs] == [1, 2, 3, 4] and bad is None  # written, whatever the disk said
