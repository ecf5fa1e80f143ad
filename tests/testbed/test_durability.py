"""A shard that loses nothing: write-ahead log, checkpoints, restore (testbed/server/durability.py).

Run alone: python3 -m pytest -q tests/testbed/test_durability.py
"""
import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from embnic.client_lib import codec
from embnic.client_lib.config import load_config
from embnic.client_lib.local import LocalBackend
from embnic.client_lib.rowstore import TableShard
from embnic.testbed.server import durability as D
from embnic.testbed.server.runner import ServerThread
from embnic.testbed.server.shard_state import ShardState

import clientref
from reference_shard import engine_kw
from test_server import Raw, make_cfg, multi_update_frames
from test_server_engine import _comparable, build_stream, run_stream


def _updates(cfg, n, seed=0, keys_per=50):
    """``n`` updates of shard 0 as ``(parts, msg_id)``, parts ``[(table, keys, grads), ...]``: every
    other one of two tables (protocol v2), some overlapping in keys."""
    rng = np.random.default_rng(seed)
    out = []
    for m in range(1, n + 1):
        parts = []
        for t in ([cfg.tables[m % len(cfg.tables)]] + ([cfg.tables[(m + 1) % len(cfg.tables)]] if m % 2 else [])):
            own = clientref.owned_keys(cfg, t.id, 0)
            k = np.sort(rng.choice(own[:200], size=min(keys_per, own[:200].size), replace=False)).astype(np.uint64)
            parts.append((t.id, k, rng.standard_normal((k.size, t.dim)).astype(np.float32)))
        out.append((parts, m))
    return out


def _send_all(st, cfg, ups, client_id=1):
    """Send updates one at a time, each waiting for its ack (so all were acknowledged)."""
    raw = Raw(st.address)
    try:
        for parts, m in ups:
            raw.send(multi_update_frames(cfg, parts, m, client_id=client_id))
            rep = raw.recv()
            assert rep.header.msg_type == 4 and rep.header.msg_id == m, rep.header  # UPDATE_ACK
    finally:
        raw.close()


def _state_equal(a, b):
    assert sorted(a) == sorted(b)
    for tid in a:
        for x, y in zip(a[tid], b[tid]):
            assert np.array_equal(x, y), tid


@pytest.mark.parametrize("engine", ["batch", "reference"])
def test_log_does_not_change_replies_and_restore_rebuilds_state(tmp_path, engine):
    """The mixed stream (retransmissions, reused ids, refusals, junk) through a logging shard:
    the same replies, counters and rows as without the log; a restart from the log alone
    rebuilds the rows and the exactly-once window exactly."""
    cfg = make_cfg()
    stream = build_stream(cfg, 5)
    plain = run_stream(cfg, engine, stream)
    logged = run_stream(cfg, engine, stream, checkpoint_dir=str(tmp_path))
    assert logged[0] == plain[0]
    dur = logged[1].pop("durability")
    assert _comparable(logged[1]) == _comparable(plain[1])
    assert dur["log_records"] == plain[1]["updates_applied"] > 5
    assert dur["log_commits"] <= dur["log_records"]
    wal = list((tmp_path / "shard-0").glob("wal-*.log"))
    assert len(wal) == 1 and wal[0].stat().st_size == len(D.WAL_HEADER) + dur["log_bytes"]
    back = ShardState(cfg, 0, restore=str(tmp_path))
    assert back.durability.restored["replayed"] == dur["log_records"] and back.durability.restored["corrupt"] is None
    _state_equal(back.state_dict(), logged[2])
    back.close()


@pytest.mark.parametrize("engine", ["batch", "reference"])
def test_retransmitted_update_after_restart_is_not_applied_twice(tmp_path, engine):
    cfg = make_cfg()
    ups = _updates(cfg, 12)
    with ServerThread(cfg, 0, **engine_kw(engine), checkpoint_dir=str(tmp_path), checkpoint_every=5) as st:
        _send_all(st, cfg, ups)
        before = st.state_dict()
        c = st.counters()["durability"]
    assert c["checkpoints"] == 2 and c["seq"] == 12
    d = tmp_path / "shard-0"
    # the log was cut behind the last checkpoint: one checkpoint (at 10), one log (from 10)
    assert sorted(p.name for p in d.iterdir()) == ["LOCK", f"ckpt-{10:020d}.npz", f"wal-{10:020d}.log"]
    with ServerThread(cfg, 0, **engine_kw(engine), restore=str(tmp_path)) as st:
        assert st.counters()["durability"]["restored"]["replayed"] == 2
        _state_equal(st.state_dict(), before)
        _send_all(st, cfg, ups[-8:])  # the client retransmits what it may not have seen acked
        c2 = st.counters()
        _state_equal(st.state_dict(), before)
    assert c2["updates_applied"] == 0 and c2["duplicates"] == 8


def test_checkpoint_file_is_documented_npz(tmp_path):
    cfg = make_cfg()
    ups = _updates(cfg, 4)
    with ServerThread(cfg, 0, checkpoint_dir=str(tmp_path)) as st:
        _send_all(st, cfg, ups)
        path = st.call(st.server.state.checkpoint)
        state = st.state_dict()
    with np.load(path) as z:  # plain numpy, no pickle
        meta = json.loads(bytes(z["meta"]).decode())
        assert meta["format"] == "embnic-checkpoint" and meta["seq"] == 4 and meta["shard"] == 0
        assert meta["version"] == D.FORMAT_VERSION == 2
        for tid, (k, r, a) in state.items():
            assert np.array_equal(z[f"t{tid}.keys"], k) and np.array_equal(z[f"t{tid}.rows"], r)
            assert np.array_equal(z[f"t{tid}.acc"], a)
        assert z["applied"].shape == (4, 6) and z["applied"][:, 1].tolist() == [1, 2, 3, 4]
        assert z["applied"][:, 2].tolist() == [2, 1, 2, 1]  # num_tables of each (the fingerprint's)
    assert not list((tmp_path / "shard-0").glob(".*tmp"))


@pytest.mark.parametrize("damage", ["cut_header", "cut_body", "flip_body", "flip_header", "garbage"])
def test_bad_log_tail_is_reported_and_cut(tmp_path, damage):
    cfg = make_cfg()
    ups = _updates(cfg, 6)
    with ServerThread(cfg, 0, **engine_kw("reference"), checkpoint_dir=str(tmp_path)) as st:
        _send_all(st, cfg, ups[:5])
        state5 = st.state_dict()
        _send_all(st, cfg, ups[5:])
    wal = next((tmp_path / "shard-0").glob("wal-*.log"))
    data = bytearray(wal.read_bytes())
    recs, bad = D.read_log(wal, 0)
    assert len(recs) == 6 and bad is None
    last = len(data) - (D.REC_LEN + len(recs[-1][-1]))  # offset of record 5
    if damage == "cut_header":
        data = data[:last + 10]
    elif damage == "cut_body":
        data = data[:-7]
    elif damage == "flip_body":
        data[-3] ^= 0x40
    elif damage == "flip_header":
        data[last + 12] ^= 1
    if damage == "garbage":
        data += os.urandom(100)
        want_good, cut_at = 6, len(data) - 100
    else:
        want_good, cut_at = 5, last
    wal.write_bytes(bytes(data))
    srv = ShardState(cfg, 0, restore=str(tmp_path))
    rep = srv.durability.restored
    assert rep["replayed"] == want_good and rep["corrupt"]["offset"] == cut_at
    assert wal.stat().st_size == cut_at  # cut off: new records follow the last good one
    if want_good == 5:
        _state_equal(srv.state_dict(), state5)
    srv.close()


def test_kill_9_and_restore_through_the_cli(tmp_path):
    """A real shard process killed with SIGKILL after acknowledging updates loses none of them."""
    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text('[cluster]\nseed = 7\n[[tables]]\nid = 0\ndim = 8\noptimizer = "adagrad"\n'
                        '[[shards]]\nid = 0\nip = "127.0.0.1"\nport = 7900\n'
                        '[[clients]]\nid = 1\nip = "127.0.0.1"\n')
    from embnic.client_lib.config import load_config

    cfg = load_config(str(cfg_path))
    rng = np.random.default_rng(1)
    ups = [([(0, np.sort(rng.choice(2**60, 300, replace=False)).astype(np.uint64),
              rng.standard_normal((300, 8)).astype(np.float32))], m) for m in range(1, 9)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")

    def start(*extra):
        p = subprocess.Popen([sys.executable, "-m", "embnic", "server", "--shard", "0", "-c", str(cfg_path),
                              "--port", "0", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
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

    class _St:
        def __init__(self, port):
            self.address = ("127.0.0.1", port)

    p, port, _ = start("--checkpoint-dir", str(tmp_path), "--checkpoint-every", "3")
    try:
        _send_all(_St(port), cfg, ups[:4])
        p.send_signal(signal.SIGUSR1)  # the control request: a checkpoint now (after update 4)
        guard = threading.Timer(60.0, p.kill)  # a safety bound for a hung server, not a timing assertion
        guard.start()
        seen = []
        while not seen or f"ckpt-{4:020d}.npz" not in seen[-1]:
            seen.append(p.stderr.readline())
            assert seen[-1], seen  # EOF: the server died (or was killed by the guard)
        guard.cancel()
        assert f"ckpt-{3:020d}.npz" in seen[0]  # --checkpoint-every 3 came first
        _send_all(_St(port), cfg, ups[4:])
    finally:
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=30)
    p, port, lines = start("--restore", str(tmp_path))
    try:
        # checkpoints at 3 (every 3), 4 (SIGUSR1), 7 (every 3): the log holds record 7 only
        assert any("1 updates replayed" in x for x in lines), lines
        _send_all(_St(port), cfg, ups[-3:])  # retransmissions of acknowledged updates
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    counters = json.loads(err[err.index("counters ") + len("counters "):].splitlines()[0])
    assert counters["updates_applied"] == 0 and counters["duplicates"] == 3
    stores, rep = D.load_shard_stores(str(tmp_path), 0, cfg)
    tables = stores.tables
    ref = LocalBackend(cfg)
    for parts, _ in ups:
        for tid, k, g in parts:
            ref.update({tid: (k, g)})
    _state_equal({0: tables[0].state()}, ref.state_dict())


def test_a_second_shard_process_on_a_live_directory_is_refused(tmp_path):
    """`--restore D` (or `--checkpoint-dir D`) while a shard process runs on D: refused in one line
    naming its pid, before the live log is read, cut or joined by a new log file."""
    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text('[cluster]\nseed = 7\n[[tables]]\nid = 0\ndim = 8\n'
                        '[[shards]]\nid = 0\nip = "127.0.0.1"\nport = 7900\n[[clients]]\nid = 1\nip = "127.0.0.1"\n')
    cmd = [sys.executable, "-m", "embnic", "server", "--shard", "0", "-c", str(cfg_path), "--port", "0"]
    live = subprocess.Popen(cmd + ["--checkpoint-dir", str(tmp_path / "d")], stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not lines or "listening on" not in lines[-1]:
            lines.append(live.stderr.readline())
            assert lines[-1], lines  # EOF: the shard died
        before = sorted(p.name for p in (tmp_path / "d" / "shard-0").iterdir())
        for opt in ("--restore", "--checkpoint-dir"):
            r = subprocess.run(cmd + [opt, str(tmp_path / "d")], capture_output=True, text=True, timeout=60)
            err = [x for x in r.stderr.splitlines() if x.startswith("Error")]
            assert r.returncode == 1 and len(err) == 1, r.stderr
            assert f"in use by another shard process (pid {live.pid})" in err[0], r.stderr
            assert sorted(p.name for p in (tmp_path / "d" / "shard-0").iterdir()) == before
    finally:
        live.terminate()
        live.communicate(timeout=30)
    # once it stopped, the directory restores as before (nothing was logged: an empty start)
    d = D.Durability(str(tmp_path / "d"), 0, 7)
    assert d.restore({}, collections.OrderedDict(), 16)["replayed"] == 0
    d.close()


def test_fresh_start_refuses_a_used_directory_and_other_shards_checkpoint(tmp_path):
    cfg = make_cfg()
    with ServerThread(cfg, 0, checkpoint_dir=str(tmp_path)) as st:
        _send_all(st, cfg, _updates(cfg, 1))
        st.call(st.server.state.checkpoint)
    with pytest.raises(D.DurabilityError, match="--restore"):
        ShardState(cfg, 0, checkpoint_dir=str(tmp_path))
    (tmp_path / "shard-1").mkdir()
    ck = next((tmp_path / "shard-0").glob("ckpt-*.npz"))
    os.link(ck, tmp_path / "shard-1" / ck.name)
    with pytest.raises(D.DurabilityError, match="shard 0's checkpoint"):
        ShardState(cfg, 1, restore=str(tmp_path))


def test_table_shard_load_state_round_trip():
    cfg = make_cfg()
    t = cfg.tables[1]
    a = TableShard(t, cfg.seed)
    rng = np.random.default_rng(0)
    a.apply(np.array([5, 2**63, 9], np.uint64), rng.standard_normal((3, t.dim)).astype(np.float32))
    b = TableShard(t, cfg.seed)
    b.load_state(*a.state())
    for x, y in zip(a.state(), b.state()):
        assert np.array_equal(x, y)
    g = rng.standard_normal((2, t.dim)).astype(np.float32)
    a.apply(np.array([9, 11], np.uint64), g)
    b.apply(np.array([9, 11], np.uint64), g)
    for x, y in zip(a.state(), b.state()):
        assert np.array_equal(x, y)
    with pytest.raises(ValueError, match="strictly increasing"):
        b.load_state(np.array([3, 1], np.uint64), np.zeros((2, t.dim), np.float32), np.zeros(2, np.float32))


def test_restore_from_a_directory_without_this_shard_is_a_usage_error(tmp_path):
    """A typo in --restore DIR must not start a shard silently serving fresh rows."""
    from click.testing import CliRunner

    from embnic.cli.main import cli

    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text('[cluster]\nseed = 7\n[[tables]]\nid = 0\ndim = 8\n'
                        '[[shards]]\nid = 0\nip = "127.0.0.1"\nport = 7900\n'
                        '[[clients]]\nid = 1\nip = "127.0.0.1"\n')
    (tmp_path / "ck").mkdir()
    r = CliRunner().invoke(cli, ["server", "--shard", "0", "-c", str(cfg_path), "--port", "0",
                                 "--restore", str(tmp_path / "ck")])
    assert r.exit_code == 2, r.output
    assert "no shard-0/" in r.output and "--checkpoint-dir" in r.output
    # a shard-0/ holding no checkpoint or log (files of unknown origin): refused, nothing written there
    sd = tmp_path / "ck" / "shard-0"
    sd.mkdir()
    for name in ("checkpoint.bin", "wal.log"):
        (sd / name).write_bytes(b"\x00" * 64)
    r = CliRunner().invoke(cli, ["server", "--shard", "0", "-c", str(cfg_path), "--port", "0",
                                 "--restore", str(tmp_path / "ck")])
    assert r.exit_code == 2, r.output
    assert "holds no checkpoint (ckpt-*.npz) or write-ahead log (wal-*.log) (it holds checkpoint.bin, wal.log)" \
        in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert sorted(p.name for p in sd.iterdir()) == ["checkpoint.bin", "wal.log"]


def test_restore_from_a_damaged_checkpoint_names_it(tmp_path):
    """--restore DIR with a truncated checkpoint: exit 1 naming the file (was 'BadZipFile: ...')."""
    from click.testing import CliRunner

    from embnic.cli.main import cli
    from embnic.testbed.server import durability as D

    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text('[cluster]\nseed = 7\n[[tables]]\nid = 0\ndim = 8\n'
                        '[[shards]]\nid = 0\nip = "127.0.0.1"\nport = 7900\n'
                        '[[clients]]\nid = 1\nip = "127.0.0.1"\n')
    cfg = load_config(cfg_path)
    d = D.shard_dir(tmp_path / "ck", 0)
    D.write_checkpoint(d, 0, 0, cfg.seed, {0: TableShard(cfg.tables[0], cfg.seed, capacity=64)},
                       collections.OrderedDict())
    ck = sorted(d.glob("ckpt-*.npz"))[0]
    ck.write_bytes(ck.read_bytes()[:200])
    r = CliRunner().invoke(cli, ["server", "--shard", "0", "-c", str(cfg_path), "--port", "0",
                                 "--restore", str(tmp_path / "ck")])
    assert r.exit_code == 1, r.output
    assert f"{ck}: unreadable checkpoint (not a complete .npz file" in r.output and "BadZipFile" not in r.output


def _v1_directory(tmp_path, what):
    """``tmp_path/old/shard-0`` as a protocol-v1 shard left it: a format-1 log (records without a
    file header) and/or a format-1 checkpoint (meta version 1, a 7-column window)."""
    import struct
    import zlib

    d = D.shard_dir(tmp_path / "old", 0)
    d.mkdir(parents=True)
    if "log" in what:  # one v1 record: hdr_crc, body_len, seq, msg_id, client, table, num_keys, dim, dtype, body_crc
        body = np.array([3], "<u8").tobytes() + np.ones(8, "<f4").tobytes()
        hdr = struct.pack("<IQIHHIHBxI", len(body), 0, 1, 1, 0, 1, 8, 1, zlib.crc32(body))
        (d / f"wal-{0:020d}.log").write_bytes(struct.pack("<I", zlib.crc32(hdr)) + hdr + body)
    if "ckpt" in what:
        meta = {"format": "embnic-checkpoint", "version": 1, "shard": 0, "seq": 0, "seed": 42, "tables": []}
        np.savez(d / f"ckpt-{0:020d}.npz", meta=np.frombuffer(json.dumps(meta).encode(), np.uint8),
                 applied=np.zeros((0, 7), np.int64))
    return d


@pytest.mark.parametrize("what", ["log", "ckpt", "log+ckpt"])
def test_a_v1_directory_is_refused_by_name(tmp_path, what):
    """A directory a protocol-v1 shard wrote (checkpoint/log format 1): --restore refuses it in one
    line naming the directory (or its checkpoint) and what to do, before anything in it is
    read, cut or added; ``tables export --from`` refuses it the same way."""
    cfg = make_cfg()
    d = _v1_directory(tmp_path, what)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    with pytest.raises(D.DurabilityError) as e:
        ShardState(cfg, 0, restore=str(tmp_path / "old"))
    msg = str(e.value)
    assert "\n" not in msg and str(d) in msg and ("format 1" in msg or "format-1" in msg)
    assert "embnic tables export" in msg and "--checkpoint-dir" in msg
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.name != "LOCK"} == before
    with pytest.raises(D.DurabilityError, match="format"):
        D.load_shard_stores(str(tmp_path / "old"), 0, cfg)


def test_a_v1_directory_through_the_cli(tmp_path):
    from click.testing import CliRunner

    from embnic.cli.main import cli

    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text('[cluster]\nseed = 7\n[[tables]]\nid = 0\ndim = 8\n'
                        '[[shards]]\nid = 0\nip = "127.0.0.1"\nport = 7900\n[[clients]]\nid = 1\nip = "127.0.0.1"\n')
    d = _v1_directory(tmp_path, "log")
    r = CliRunner().invoke(cli, ["server", "--shard", "0", "-c", str(cfg_path), "--port", "0",
                                 "--restore", str(tmp_path / "old")])
    assert r.exit_code == 1, r.output
    err = [x for x in r.output.splitlines() if x.startswith("Error")]
    assert len(err) == 1 and str(d) in err[0] and "format-1 log" in err[0], r.output


def test_log_file_header_carries_the_format(tmp_path):
    """Every log file starts with ``WAL_HEADER`` (magic + format 2); a file whose header was torn
    at a crash (a prefix of it) holds no records and is rewritten, not refused."""
    cfg = make_cfg()
    with ServerThread(cfg, 0, checkpoint_dir=str(tmp_path)) as st:
        _send_all(st, cfg, _updates(cfg, 2))
    wal = next((tmp_path / "shard-0").glob("wal-*.log"))
    data = wal.read_bytes()
    assert data[:16] == D.WAL_HEADER == b"embnic-wal\0\0" + (2).to_bytes(4, "little")
    assert D.log_format(wal) == 2 and len(D.read_log(wal, 0)[0]) == 2
    for p in (tmp_path / "shard-0").iterdir():
        if p.name != "LOCK":
            p.unlink()
    wal.write_bytes(D.WAL_HEADER[:7])
    assert D.log_format(wal) is None
    srv = ShardState(cfg, 0, restore=str(tmp_path))
    assert srv.durability.restored["replayed"] == 0 and wal.read_bytes() == D.WAL_HEADER
    srv.close()
