"""A disk-tier shard on a file system that fills up and frees again (issue 34, item 5).

A small tmpfs (root only; unmounted in teardown) holds the disk tables' stores; a filler file
takes its free space and is removed later:

* :class:`DiskTable` with no reserve (so RocksDB itself meets ENOSPC: memtables that cannot be
  flushed, writes that stall): lookups keep answering bit-identically to the in-memory store,
  ``writable()`` says no once the store refuses, rows an update had taken are kept in memory,
  and once the filler is gone the table takes writes again by itself — every row of every
  update it took identical to the in-memory store's.
* A shard (both engines) with ``store_dir`` on the tmpfs, through the client: updates are
  refused ``STORE_FULL`` (``ShardError``, retryable, nothing applied), lookups that miss the cache
  are answered; after the space returns the same updates are taken without a restart, and the
  shard's rows equal a ``LocalBackend`` that applied exactly the acknowledged updates.

Run alone: python3 -m pytest -q tests/testbed/test_disk_full.py
"""
from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rocksdict", reason="pip install 'embnic[disk]'")

from embnic.client_lib.client import EmbeddingClient  # noqa: E402
from embnic.client_lib.config import parse_config  # noqa: E402
from embnic.client_lib.consts import Status  # noqa: E402
from embnic.client_lib.errors import ShardError  # noqa: E402
from embnic.client_lib.local import LocalBackend  # noqa: E402
from embnic.client_lib.rowstore import TableShard  # noqa: E402
from embnic.testbed.server import diskstore as DS  # noqa: E402
from embnic.testbed.server import disktable as DT  # noqa: E402
from embnic.testbed.server.runner import ServerCluster  # noqa: E402

from test_durability import _state_equal  # noqa: E402
from reference_shard import engine_kw  # noqa: E402


@pytest.fixture
def small_fs(tmp_path):
    """A 24 MiB tmpfs mounted for the test (skipped where mounting is not allowed), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0755", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _free(mnt: Path) -> int:
    st = os.statvfs(mnt)
    return st.f_bavail * st.f_frsize


def _fill(mnt: Path) -> Path:
    """Take every free byte of ``mnt`` with a filler file (its path)."""
    p = mnt / "filler"
    with open(p, "ab") as f:
        while True:
            try:
                f.write(b"\0" * (256 << 10))
                f.flush()
            except OSError as e:
                assert e.errno == errno.ENOSPC
                break
    return p


def _table(dim=32):
    return parse_config({"tables": [{"id": 3, "dim": dim, "optimizer": "adagrad", "lr": 0.1}],
                         "shards": [{"id": 0, "ip": "127.0.0.1"}], "clients": [{"id": 1, "ip": "127.0.0.1"}]}).tables[0]


def test_disk_table_refuses_then_recovers_by_itself(small_fs, monkeypatch):
    """RocksDB meets ENOSPC itself (no reserve): lookups stay right, nothing taken is lost, and
    the table takes writes again once there is room, with no reopen."""
    monkeypatch.setattr(DS, "STALL_WAIT_S", 0.2)
    monkeypatch.setattr(DT, "RETRY_S", 0.1)
    env = DS.StoreEnv(small_fs / "store", 4)
    env.reserve_bytes = 0  # only the store's own refusals make the table full
    t = _table()
    mem, dk = TableShard(t, 5), DT.DiskTable(t, 5, env, 64)
    pool = np.arange(30000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    rng = np.random.default_rng(0)

    def step(expect_lookup=True):
        k = rng.choice(pool, 600)  # far more than the cache: misses read from the store
        assert np.array_equal(mem.lookup(k), dk.lookup(k))
        if not dk.writable():
            return False
        ku = np.unique(rng.choice(pool, 700))
        g = rng.standard_normal((ku.size, t.dim)).astype(np.float32)
        mem.apply(ku, g)
        dk.apply(ku, g)
        return True

    for _ in range(5):
        assert step()
    filler = _fill(small_fs)
    taken = refused = 0
    for _ in range(400):
        if step():
            taken += 1
        else:
            refused += 1
            if refused >= 20:
                break
    c = dk.counters()
    assert refused >= 20, c  # the store did refuse
    assert c["full"] == 1 and c["store_write_errors"] > 0 and c["full_periods"] >= 1, c
    with pytest.raises(DS.StoreFullError):
        dk.flush()  # a checkpoint or export now fails, naming it (an OSError)
    filler.unlink()
    deadline = time.monotonic() + 20
    while not dk.writable():  # RocksDB retries its flush about every second
        assert time.monotonic() < deadline, dk.counters()
        time.sleep(0.05)
    for _ in range(5):
        assert step()
    assert dk.counters()["full"] == 0 and dk.counters()["pending"] == 0
    _state_equal({3: mem.state()}, {3: dk.state()})  # every row of every update taken
    assert len(dk) == len(mem)
    env.close()


def _cfg(mnt: Path):
    return parse_config({
        "cluster": {"seed": 4, "timeout_ms": 300, "retries": 8},
        "tables": [{"id": 0, "name": "t0", "dim": 16, "optimizer": "adagrad", "lr": 0.1, "store": "disk",
                    "cache_rows": 32},
                   {"id": 1, "name": "t1", "dim": 4, "optimizer": "sgd", "lr": 0.2}],
        "shards": [{"id": 0, "ip": "127.0.0.1", "port": 7960, "store_dir": str(mnt), "block_cache_mb": 4}],
        "clients": [{"id": 1, "ip": "127.0.0.1"}]})


@pytest.mark.parametrize("engine", ["batch", "reference"])
def test_shard_on_a_full_disk_refuses_updates_answers_lookups_and_recovers(small_fs, engine):
    cfg = _cfg(small_fs)
    ref = LocalBackend(cfg)
    rng = np.random.default_rng(1)
    pool = np.unique(rng.integers(0, 2**64 - 1, 4000, dtype=np.uint64))

    def batch():
        return {0: np.unique(rng.choice(pool, 400)), 1: np.unique(rng.choice(pool, 50))}

    def grads(req):
        return {t: (k, rng.standard_normal((k.size, cfg.table(t).dim)).astype(np.float32)) for t, k in req.items()}

    def check_lookup(c):
        req = batch()
        got, want = c.lookup(req), ref.lookup(req)
        for t in req:
            assert np.array_equal(got[t], want[t]), t

    with ServerCluster(cfg, **engine_kw(engine)) as cl, EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0)) as c:
        for _ in range(4):
            u = grads(batch())
            c.update(u)
            ref.update(u)
        check_lookup(c)
        filler = _fill(small_fs)
        time.sleep(DS.SPACE_CHECK_S + 0.1)  # the shard reads the free space at most this often
        held = grads(batch())
        with pytest.raises(ShardError) as ei:
            c.update(held)
        e = ei.value
        assert e.status == Status.STORE_FULL and e.table_id == 0 and e.retryable, e
        assert "retry" in str(e)
        only_memory = grads({1: batch()[1]})
        c.update(only_memory)  # a table in memory is not held up
        ref.update(only_memory)
        for _ in range(3):
            check_lookup(c)  # cache misses answered from the store
        counters = cl.counters()[0]
        assert counters["errors"].get("STORE_FULL", 0) >= 1, counters["errors"]
        assert counters["stores"]["tables"]["0"]["full"] == 1
        filler.unlink()
        deadline = time.monotonic() + 20
        while True:  # the same update, sent again once there is room: taken without a restart
            try:
                c.update(held)
                break
            except ShardError as e2:
                assert e2.status == Status.STORE_FULL
                assert time.monotonic() < deadline
                time.sleep(0.2)
        ref.update(held)
        for _ in range(3):
            u = grads(batch())
            c.update(u)
            ref.update(u)
            check_lookup(c)
        assert cl.counters()[0]["stores"]["tables"]["0"]["full"] == 0
    _state_equal(ref.state_dict(), cl.state_dict())
