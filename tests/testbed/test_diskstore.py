"""The shard's disk tier (``store = "disk"``: RocksDB behind a cache of hot rows, testbed/server/diskstore.py).

* :class:`DiskTable` against the in-memory :class:`TableShard`, operation by operation, with caches
  from 1 row (every key past the cache) to larger than the table: every lookup, row and
  accumulator bit-identical; snapshots round-trip.
* Shards (the serving loop and the reference shard, 2 shards, a cache far smaller than the rows) trained the same steps with
  the table on disk and in memory: every lookup, row and optimizer state identical.
* Durability: ``--checkpoint-dir`` snapshots the store (hard links, no arrays in the ``.npz``),
  SIGKILL + ``--restore`` gives identical tables and re-acks retransmissions; a checkpoint taken
  with the table on disk restores into memory and back; ``tables export`` streams from it (never
  ``state()``) and writes the same bytes as the in-memory run; ``tables import`` fills a disk table.
* Refusals in one line: a store directory of something else, one in use, rocksdict missing.

Run alone: python3 -m pytest -q tests/testbed/test_diskstore.py
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("rocksdict", reason="pip install 'embnic[disk]'")

from embnic.client_lib.client import EmbeddingClient  # noqa: E402
from embnic.client_lib.config import load_config, parse_config  # noqa: E402
from embnic.client_lib.local import LocalBackend  # noqa: E402
from embnic.client_lib.rowstore import TableShard  # noqa: E402
from embnic.cli.main import cli  # noqa: E402
from embnic.testbed.server import diskstore as DS  # noqa: E402
from embnic.testbed.server import disktable as DT  # noqa: E402
from embnic.testbed.server import durability as D  # noqa: E402
from embnic.testbed.server import tables_io as TIO  # noqa: E402
from embnic.testbed.server.runner import ServerCluster, ServerThread  # noqa: E402
from embnic.testbed.server.shard_state import ShardState  # noqa: E402
from embnic.testbed.server.stores import StoreSetupError  # noqa: E402

from test_durability import _send_all, _state_equal  # noqa: E402
from test_tables_io import save_safetensors  # noqa: E402
from reference_shard import engine_kw  # noqa: E402

TABLES = [{"id": 0, "dim": 8, "optimizer": "adagrad", "lr": 0.1},
          {"id": 1, "dim": 5, "optimizer": "sgd", "lr": 0.3, "dtype": "fp16"},
          {"id": 4, "rows": 3000, "dim": 12, "optimizer": "adagrad", "lr": 0.05}]


def _cfg(store: str, cache_rows: int = 40, shards: int = 2, tables=TABLES, **shard_keys):
    """The test cluster with every table's ``store`` set (disk tables cache ``cache_rows`` rows)."""
    tabs = [dict(t, name=f"t{t['id']}", store=store, **({"cache_rows": cache_rows} if store == "disk" else {}))
            for t in tables]
    return parse_config({"cluster": {"seed": 9, "timeout_ms": 300, "retries": 20}, "tables": tabs,
                         "shards": [{"id": i, "ip": "127.0.0.1", "port": 7930 + i, **shard_keys}
                                    for i in range(shards)],
                         "clients": [{"id": 1, "ip": "127.0.0.1"}]})


def _table(opt="adagrad", dim=8, tid=3):
    return parse_config({"tables": [{"id": tid, "dim": dim, "optimizer": opt, "lr": 0.1}],
                         "shards": [{"id": 0, "ip": "127.0.0.1"}], "clients": [{"id": 1, "ip": "127.0.0.1"}]}).tables[0]


@pytest.fixture
def env():
    e = DS.scratch_env(8)
    yield e
    e.close()
    assert not e.root.exists()  # a scratch store is removed when closed


@pytest.mark.parametrize("opt,dim,policy", [("adagrad", 8, "lfu-aged"), ("sgd", 5, "lfu-aged"), ("adagrad", 8, "lfu"),
                                            ("sgd", 5, "lru")])
@pytest.mark.parametrize("cache_rows", [1, 7, 64, 5000])
def test_disk_table_equals_the_in_memory_store_operation_by_operation(env, opt, dim, policy, cache_rows):
    """Random lookups (duplicates, ids never updated) and updates (one message, and several
    messages whose keys overlap) on both stores: every lookup and the final rows, accumulators
    and row count identical, whatever part of the table the cache holds and whichever rows it
    evicts (every replacement policy)."""
    t = _table(opt, dim)
    mem, dk = TableShard(t, 7), DT.DiskTable(t, 7, env, cache_rows, policy)
    pool = np.arange(400, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    rng = np.random.default_rng(cache_rows)
    for step in range(40):
        k = rng.choice(pool, int(rng.integers(1, 150)))  # duplicates, any order
        assert np.array_equal(mem.lookup(k), dk.lookup(k)), step
        ku = rng.permutation(np.unique(rng.choice(pool, int(rng.integers(1, 120)))))
        g = rng.standard_normal((ku.size, dim)).astype(np.float32)
        mem.apply(ku, g)
        dk.apply(ku, g)
        if step % 5 == 0:
            a, b = np.unique(rng.choice(pool, 40)), np.unique(rng.choice(pool, 40))
            kk, offs = np.concatenate([a, b]), np.array([0, a.size, a.size + b.size])
            gg = rng.standard_normal((kk.size, dim)).astype(np.float32)
            mem.apply_segments(kk, gg, offs)
            dk.apply_segments(kk, gg, offs)
    assert len(dk) == len(mem) > 0
    _state_equal({0: mem.state()}, {0: dk.state()})
    c = dk.counters()
    assert c["cache_rows"] == min(cache_rows, 5000 // 8 * 8) and c["hits"] + c["misses"] > 0
    if cache_rows < 400:
        assert c["evictions"] > 0 and c["writebacks"] > 0  # the cache really was too small
    else:
        assert c["evictions"] == 0


def test_snapshot_round_trip_and_load_state(env, tmp_path):
    t = _table()
    dk, mem = DT.DiskTable(t, 1, env, 16), TableShard(t, 1)
    rng = np.random.default_rng(0)
    for _ in range(5):
        k = np.unique(rng.integers(0, 2**64 - 1, 200, dtype=np.uint64, endpoint=True))
        g = rng.standard_normal((k.size, 8)).astype(np.float32)
        dk.apply(k, g)
        mem.apply(k, g)
    info = dk.snapshot(tmp_path / "snap")
    assert info == {"rows_held": len(mem)}
    assert DS.read_meta(tmp_path / "snap")["rows_held"] == len(mem)
    dk.apply(k, g)  # the live store moves on; the snapshot does not
    dk.load_snapshot(tmp_path / "snap")
    _state_equal({0: dk.state()}, {0: mem.state()})
    assert len(dk) == len(mem)
    parts = list(DS.read_snapshot(tmp_path / "snap", t, chunk_rows=100))
    assert len(parts) > 1 and all(np.all(p[0][1:] > p[0][:-1]) for p in parts)
    _state_equal({0: tuple(np.concatenate([p[i] for p in parts]) for i in range(3))}, {0: mem.state()})
    other = _table(tid=4)
    with pytest.raises(DS.StoreError, match="snapshot of"):
        DT.DiskTable(other, 1, env, 16).load_snapshot(tmp_path / "snap")
    k, r, a = mem.state()
    dk.load_state(k[::2], r[::2], a[::2])
    mem.load_state(k[::2], r[::2], a[::2])
    _state_equal({0: dk.state()}, {0: mem.state()})
    with pytest.raises(ValueError, match="strictly increasing"):
        dk.load_state(k[::-1], r, a)


def test_a_stalled_write_is_retried_with_a_new_batch(env, tmp_path):
    """RocksDB refuses a ``no_slowdown`` write that would stall (``Incomplete``) after the binding
    has consumed its WriteBatch: the retry must write a new batch of the same rows, not fail
    (which made the table full, refusing updates for RETRY_S)."""
    t = _table()
    dk, mem = DT.DiskTable(t, 1, env, 16), TableShard(t, 1)
    real, sink = dk.store.db, DS.rocksdict.Rdict(str(tmp_path / "sink"), DS.rocksdict.Options(raw_mode=True))

    class Stalls:
        """The store's db whose first two writes consume their batch and stall."""
        stalls = 2

        def __getattr__(self, name):
            return getattr(real, name)

        def __getitem__(self, keys):
            return real[keys]

        def write(self, wb, opts=None):
            if self.stalls:
                self.stalls -= 1
                sink.write(wb)  # consumed, as RocksDB's refusal leaves it
                raise Exception("Incomplete: Write stall")
            real.write(wb, opts)

    dk.store.db = Stalls()
    k = np.arange(1, 200, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    g = np.ones((k.size, 8), np.float32)
    dk.apply(k, g)  # 199 keys through a 16-row cache: most written straight through
    mem.apply(k, g)
    assert dk.store.db.stalls == 0 and dk.writable() and dk.counters()["store_write_errors"] == 0
    dk.store.db = real
    _state_equal({0: dk.state()}, {0: mem.state()})
    sink.close()


def _train(cfg, steps=6, seed=0, **kw):
    """``steps`` rounds (lookup of every table, then an update) through a ServerCluster of ``cfg``;
    returns (every lookup's rows, the merged state, the shards' counters)."""
    rng = np.random.default_rng(seed)
    pools = {t.id: np.unique(rng.integers(0, t.rows or 2**64 - 1, 1500, dtype=np.uint64)) for t in cfg.tables}
    got = []
    with ServerCluster(cfg, **kw) as cl, EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0)) as c:
        for _ in range(steps):
            req = {t: np.unique(rng.choice(p, 300)) for t, p in pools.items()}  # rows come back
            got.append(c.lookup(req))
            c.update({t: (k, rng.standard_normal((k.size, cfg.table(t).dim)).astype(np.float32))
                      for t, k in req.items()})
    return got, cl.state_dict(), cl.counters()


@pytest.mark.parametrize("engine", ["batch", "reference"])
def test_training_through_shards_is_bit_identical_on_disk_and_in_memory(engine):
    """The same steps through two shards with every table on disk (a cache of 40 rows per table,
    ~6 % of the rows each shard ends with) and in memory: every lookup, every row and every
    Adagrad accumulator identical; the disk tier really evicted and read back."""
    mem = _train(_cfg("memory"), **engine_kw(engine))
    disk = _train(_cfg("disk", 40), **engine_kw(engine))
    for a, b in zip(mem[0], disk[0]):
        for t in a:
            assert np.array_equal(a[t], b[t]), t
    _state_equal(mem[1], disk[1])
    for c in disk[2]:
        st = c["stores"]
        assert st["block_cache_capacity"] == 64 << 20
        for tid, tc in st["tables"].items():
            assert tc["cache_rows"] == 40 and tc["evictions"] > 0 and tc["store_found"] > 0, (tid, tc)
            assert tc["rows_held"] == c["rows"][tid]
    assert all("stores" not in c for c in mem[2])


def test_shard_default_store_and_a_table_of_its_own():
    """``[[shards]] store = "disk"`` puts every table that does not say on disk, with the shard's
    ``cache_rows``; a table saying ``store = "memory"`` stays in memory."""
    tabs = [dict(TABLES[0]), dict(TABLES[1], store="memory"), dict(TABLES[2], cache_rows=24)]
    cfg = parse_config({"tables": tabs, "shards": [{"id": 0, "ip": "127.0.0.1", "store": "disk", "cache_rows": 16,
                                                    "block_cache_mb": 4}],
                        "clients": [{"id": 1, "ip": "127.0.0.1"}]})
    assert [cfg.store_of(t, 0) for t in (0, 1, 4)] == [("disk", 16), ("memory", None), ("disk", 24)]
    srv = ShardState(cfg, 0)
    try:
        assert type(srv.tables[1]) is TableShard and isinstance(srv.tables[0], DT.DiskTable)
        assert srv.tables[4].capacity == 24 and srv.tables[0].capacity == 16
        assert srv.counters()["stores"]["block_cache_capacity"] == 4 << 20
    finally:
        srv.close()


def _disk_toml(path: Path, cache_rows: int = 30, store: str = "disk") -> Path:
    path.write_text('[cluster]\nseed = 7\n[[tables]]\nid = 0\nname = "users"\ndim = 8\noptimizer = "adagrad"\n'
                    f'store = "{store}"\n' + (f"cache_rows = {cache_rows}\n" if store == "disk" else "")
                    + '[[tables]]\nid = 1\nrows = 100000\ndim = 4\noptimizer = "sgd"\n'
                    '[[shards]]\nid = 0\nip = "127.0.0.1"\nport = 7900\nblock_cache_mb = 4\n'
                    '[[clients]]\nid = 1\nip = "127.0.0.1"\n')
    return path


def _start(cfg_path, *extra):
    p = subprocess.Popen([sys.executable, "-m", "embnic", "server", "--shard", "0", "-c", str(cfg_path), "--port", "0",
                          *extra], stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    lines = []
    while True:
        line = p.stderr.readline()
        lines.append(line)
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if m:
            return p, int(m.group(1)), lines
        if not line:
            p.wait(10)
            pytest.fail("".join(lines))


class _At:
    def __init__(self, port):
        self.address = ("127.0.0.1", port)


def _ups(n, seed=1):
    rng = np.random.default_rng(seed)
    return [([(0, np.sort(rng.choice(2**62, 250, replace=False)).astype(np.uint64),
               rng.standard_normal((250, 8)).astype(np.float32)),
              (1, np.sort(rng.choice(100000, 120, replace=False)).astype(np.uint64),
               rng.standard_normal((120, 4)).astype(np.float32))], m) for m in range(1, n + 1)]


def test_kill_9_and_restore_a_disk_table(tmp_path):
    """A shard with a disk table (cache of 30 rows, 2000 rows updated) and ``--checkpoint-dir``:
    checkpoints are RocksDB snapshots named by the ``.npz`` (no arrays for the disk table, older
    ones removed); SIGKILL after acknowledged updates, ``--restore``: identical tables (against
    LocalBackend), retransmissions re-acked and not applied."""
    cfg_path = _disk_toml(tmp_path / "c.toml")
    cfg = load_config(str(cfg_path))
    ups = _ups(8)
    p, port, _ = _start(cfg_path, "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "3")
    try:
        _send_all(_At(port), cfg, ups)
    finally:
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=30)
    d = tmp_path / "ck" / "shard-0"
    snaps = sorted(x.name for x in d.glob("ckpt-*.store"))
    assert len(snaps) == 1 and snaps[0].startswith(f"ckpt-{6:020d}."), sorted(x.name for x in d.iterdir())
    with np.load(d / f"ckpt-{6:020d}.npz") as z:
        meta = json.loads(bytes(z["meta"]).decode())
        assert "t0.rows" not in z.files and "t1.rows" in z.files  # the disk table is in the snapshot only
    t0 = next(t for t in meta["tables"] if t["id"] == 0)
    assert t0["store"] == "disk" and t0["snapshot"] == f"{snaps[0]}/t0" and t0["rows_held"] == 6 * 250
    assert (d / "store" / "t0").is_dir()  # the live store (scratch)
    p, port, lines = _start(cfg_path, "--restore", str(tmp_path / "ck"))
    try:
        assert any("2 updates replayed" in x for x in lines), lines
        _send_all(_At(port), cfg, ups[-3:])  # retransmissions of acknowledged updates
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    counters = json.loads(err[err.index("counters ") + len("counters "):].splitlines()[0])
    assert counters["updates_applied"] == 0 and counters["duplicates"] == 3
    ref = LocalBackend(cfg)
    for parts, _ in ups:
        for tid, k, g in parts:
            ref.update({tid: (k, g)})
    stores, rep = D.load_shard_stores(str(tmp_path / "ck"), 0, cfg)
    tables = stores.tables
    assert isinstance(tables[0], DT.DiskTable) and rep["replayed"] == 2
    _state_equal({t: ts.state() for t, ts in tables.items()}, ref.state_dict())
    # export streams from the disk table (never its whole state() at once) and equals the same
    # training kept in memory
    out_disk = tmp_path / "disk.safetensors"

    def no_state(self):
        raise AssertionError("export read a disk table whole")

    orig = DT.DiskTable.state
    DT.DiskTable.state = no_state
    try:
        r = TIO.export_tables(cfg, tmp_path / "ck", out_disk, layout="ids", chunk_rows=97)
    finally:
        DT.DiskTable.state = orig
    assert r["tables"] == {"users": 8 * 250, "t1": ref.state_dict()[1][0].size}
    mem_cfg = _disk_toml(tmp_path / "m.toml", store="memory")
    srv = ShardState(load_config(str(mem_cfg)), 0, checkpoint_dir=str(tmp_path / "mem"))
    for parts, m in ups:  # the same updates, applied in memory and checkpointed
        for tid, k, g in parts:
            srv.tables[tid].apply(k, g)
    srv.checkpoint()
    srv.close()
    out_mem = tmp_path / "mem.safetensors"
    TIO.export_tables(load_config(str(mem_cfg)), tmp_path / "mem", out_mem, layout="ids")
    assert out_disk.read_bytes() == out_mem.read_bytes()


def test_a_checkpoint_moves_between_the_stores(tmp_path):
    """A checkpoint written with the table on disk restores into the in-memory store and back
    (the config decides where a table lives, not the checkpoint)."""
    disk, mem = _cfg("disk", 20, shards=1), _cfg("memory", shards=1)
    rng = np.random.default_rng(3)
    ups = []
    for m in range(1, 5):
        parts = []
        for t in disk.tables:
            k = np.unique(rng.integers(0, t.rows or 2**63, 150, dtype=np.uint64))
            parts.append((t.id, k, rng.standard_normal((k.size, t.dim)).astype(np.float32)))
        ups.append((parts, m))
    with ServerThread(disk, 0, checkpoint_dir=str(tmp_path / "a"), checkpoint_every=2) as st:
        _send_all(st, disk, ups[:3])
    with ServerThread(mem, 0, restore=str(tmp_path / "a"), checkpoint_dir=str(tmp_path / "b")) as st:
        assert st.counters()["durability"]["restored"]["replayed"] == 1
        _send_all(st, mem, ups[3:])
        want = st.state_dict()
    with ServerThread(disk, 0, restore=str(tmp_path / "b"), checkpoint_dir=str(tmp_path / "c")) as st:
        got = st.state_dict()
        assert isinstance(st.server.state.tables[0], DT.DiskTable)
    _state_equal(got, want)


def test_tables_import_into_a_disk_table_is_served(tmp_path):
    """``tables import`` with a disk table writes its rows as a snapshot; ``--restore`` serves them."""
    cfg = _cfg("disk", 20, shards=1)
    rng = np.random.default_rng(8)
    tensors = {}
    want = {}
    for t in cfg.tables:
        k = np.unique(rng.integers(0, t.rows or 2**63, 300, dtype=np.uint64))
        r = rng.standard_normal((k.size, t.dim)).astype(np.float32)
        a = np.abs(rng.standard_normal(k.size)).astype(np.float32) if t.optimizer == "adagrad" \
            else np.zeros(k.size, np.float32)
        tensors.update({f"tables.{t.name}.ids": k, f"tables.{t.name}.weight": r, f"tables.{t.name}.acc": a})
        want[t.id] = (k, r, a)
    save_safetensors(tmp_path / "in.safetensors", tensors, TIO._meta(cfg, "ids"))
    rep = TIO.import_tables(cfg, tmp_path / "in.safetensors", tmp_path / "d")
    assert rep["rows"] == {0: sum(v[0].size for v in want.values())}
    assert len(list((tmp_path / "d" / "shard-0").glob("ckpt-*.store"))) == 1
    with ServerThread(cfg, 0, restore=str(tmp_path / "d")) as st:
        _state_equal(st.state_dict(), want)


def test_store_dir_refusals_name_the_directory(tmp_path):
    """``store_dir`` holding files of something else is refused (its contents would be replaced);
    a second shard process on a live store is refused naming the first's pid; both through
    ``embnic server`` as one line, exit 1."""
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "shard-0").mkdir()
    (tmp_path / "other" / "shard-0" / "precious.txt").write_text("x")
    cfg = _cfg("disk", 8, shards=1, store_dir=str(tmp_path / "other"))
    with pytest.raises(StoreSetupError, match="precious.txt, which is not a shard's row store"):
        ShardState(cfg, 0)
    # refused before anything is made in it (a new-user trial found a LOCK file left there)
    assert sorted(p.name for p in (tmp_path / "other" / "shard-0").iterdir()) == ["precious.txt"]
    cfg = _cfg("disk", 8, shards=1, store_dir=str(tmp_path / "mine"))
    first = ShardState(cfg, 0)
    try:
        assert (tmp_path / "mine" / "shard-0" / "t0").is_dir()
        cfg_path = tmp_path / "c.toml"
        cfg_path.write_text(f'[[tables]]\nid = 0\ndim = 8\nstore = "disk"\n[[shards]]\nid = 0\nip = "127.0.0.1"\n'
                            f'store_dir = "{tmp_path / "mine"}"\n[[clients]]\nid = 1\nip = "127.0.0.1"\n')
        r = subprocess.run([sys.executable, "-m", "embnic", "server", "--shard", "0", "-c", str(cfg_path),
                            "--port", "0"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, r.stderr
        assert re.search(r"Error: .*mine/shard-0 is in use by another shard process \(pid \d+\)", r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        # the shard module `embnic testbed up` runs: the same one line, no traceback (a new-user trial)
        r = subprocess.run([sys.executable, "-m", "embnic.testbed.server", "--shard", "0", "--config", str(cfg_path),
                            "--port", "0"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, r.stderr
        assert re.search(r"^Error: store_dir .*mine of shard 0's disk table 0: .*mine/shard-0 is in use by another "
                         r"shard process \(pid \d+\)", r.stderr), r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    finally:
        first.close()
    second = ShardState(cfg, 0)  # a stopped shard's store is scratch: taken over
    second.close()


@pytest.mark.parametrize("module", [False, True])
def test_an_unusable_store_dir_is_named_not_a_bind_error(tmp_path, module):
    """``store_dir`` a file, or under a directory that cannot hold one: one line naming store_dir
    and the table, exit 1, through ``embnic server`` and the shard module — never "cannot bind"
    (a new-user trial got ``cannot bind 127.0.0.1:17880: Not a directory``)."""
    (tmp_path / "afile").write_text("x")
    for store_dir, why in ((tmp_path / "afile", "Not a directory"), (Path("/proc/nope"), "No such file or directory")):
        cfg_path = tmp_path / "c.toml"
        cfg_path.write_text(f'[[tables]]\nid = 0\ndim = 8\n[[tables]]\nid = 2\ndim = 4\n[[shards]]\nid = 0\n'
                            f'ip = "127.0.0.1"\nstore = "disk"\nstore_dir = "{store_dir}"\n'
                            '[[clients]]\nid = 1\nip = "127.0.0.1"\n')
        cmd = (["-m", "embnic.testbed.server", "--config"] if module else ["-m", "embnic", "server", "-c"])
        r = subprocess.run([sys.executable, *cmd, str(cfg_path), "--shard", "0", "--port", "0"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, r.stderr
        assert f"store_dir {store_dir} of shard 0's disk tables 0,2: cannot use {store_dir}" in r.stderr, r.stderr
        assert why in r.stderr and "give store_dir a directory" in r.stderr and "bind" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_cache_larger_than_memory_is_refused_up_front(tmp_path):
    """``cache_rows = 2**40`` was a ``MemoryError: Unable to allocate 8.00 TiB`` traceback (a new-user
    trial): one line naming the table and its cache_rows, exit 1, before any store is made."""
    cfg_path = _disk_toml(tmp_path / "c.toml", cache_rows=1 << 40)
    r = subprocess.run([sys.executable, "-m", "embnic", "server", "--shard", "0", "-c", str(cfg_path), "--port", "0"],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, EMBNIC_STORE_TMP=str(tmp_path)))
    assert r.returncode == 1, r.stderr
    assert re.search(r"^Error: shard 0's disk-table caches need [\d.]+ TiB of memory .*table 0 cache_rows = "
                     r"1099511627776 .*more than this machine's .*: lower cache_rows$", r.stderr.strip()), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]  # no temporary store made


def test_sigterm_while_the_temporary_stores_open_leaves_nothing(tmp_path):
    """A shard of 26 disk tables without store_dir (temporary stores) killed with SIGTERM while it
    still opens them stops cleanly and removes them (a new-user trial found
    /var/tmp/embnic-rows-shard*-* left behind: the signal came before the handlers were in)."""
    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text("".join(f"[[tables]]\nid = {i}\ndim = 16\ncache_rows = 64\n" for i in range(26))
                        + '[[shards]]\nid = 0\nip = "127.0.0.1"\nstore = "disk"\nblock_cache_mb = 4\n'
                        '[[clients]]\nid = 1\nip = "127.0.0.1"\n')
    st = tmp_path / "st"
    st.mkdir()
    for delay in (0.0, 0.05, 0.2):
        p = subprocess.Popen([sys.executable, "-m", "embnic", "server", "--shard", "0", "-c", str(cfg_path),
                              "--port", "0"], stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, EMBNIC_STORE_TMP=str(st)))
        try:
            deadline = time.monotonic() + 60
            while not any(st.iterdir()) and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(delay)
            p.send_signal(signal.SIGTERM)
            _, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 0, err
        assert list(st.iterdir()) == [], (delay, err)


def test_missing_rocksdict_is_one_line_naming_the_extra(tmp_path):
    cfg_path = _disk_toml(tmp_path / "c.toml")
    code = ("import sys; sys.modules['rocksdict'] = None; from embnic.cli.main import main; "
            f"sys.argv = ['embnic', 'server', '--shard', '0', '-c', {str(cfg_path)!r}, '--port', '0']; main()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "rocksdict" in r.stderr and r.stderr.count("pip install 'embnic[disk]'") == 1, r.stderr  # the fix once
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_client_library_never_loads_rocksdict():
    code = ("import sys, embnic.client_lib.client, embnic.client_lib.local, embnic.client_lib.config, "
            "embnic.testbed.server.shard_state, embnic.testbed.server.engine; "
            "assert 'rocksdict' not in sys.modules, 'imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_metrics_of_the_disk_tier():
    pytest.importorskip("prometheus_client", reason="pip install 'embnic[metrics]'")
    from embnic.testbed.server.shard_metrics import shard_families

    _, _, counters = _train(_cfg("disk", 16, shards=1), steps=2)
    fams = {f.name: f for f in shard_families(counters[0])}
    hits = {s.labels["table"]: s.value for s in fams["embnic_shard_store_cache_hits"].samples
            if s.name.endswith("_total")}
    assert hits == {t: float(v["hits"]) for t, v in counters[0]["stores"]["tables"].items()}
    assert fams["embnic_shard_store_block_cache_capacity_bytes"].samples[0].value == 64 << 20
    assert {s.labels["table"] for s in fams["embnic_shard_store_cache_capacity_rows"].samples} == {"0", "1", "4"}
