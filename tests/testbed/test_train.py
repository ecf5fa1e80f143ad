"""Training through parameter-server shards over real UDP equals the in-process reference.

Also: loss/duplication/reordering between client and shards (a lossy UDP relay) changes
nothing (retries + exactly-once updates), and a dead shard fails with an error naming it.

Run alone: python3 -m pytest -q tests/testbed/test_train.py
"""
import dataclasses
import json
import os
import random
import select
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from embnic.client_lib.client import EmbeddingClient, ShardUnavailableError
from embnic.client_lib.config import parse_config
from embnic.client_lib.local import LocalBackend
from embnic.testbed.training import criteo
from embnic.testbed.server.runner import ServerCluster
from embnic.testbed.training.train import load_training_data, train

STEPS = 6
BATCH = 128


def _cfg(tables=None, n_shards=2, sharding="hash", mtu=1500, **cluster):
    tables = tables or criteo.default_tables(rows=4096, dim=8)
    return parse_config({
        "cluster": {"seed": 7, "sharding": sharding, "mtu": mtu, "timeout_ms": 100, "retries": 30, **cluster},
        "tables": tables,
        "shards": [{"id": i, "ip": "127.0.0.1", "port": 1 + i} for i in range(n_shards)],
        "clients": [{"id": 3, "ip": "127.0.0.1", "port": 1}],
    })


def _data(cfg):
    tr, va = load_training_data(cfg, max_rows=1500)
    return tr, va


def _reference(cfg, tr, va):
    local = LocalBackend(cfg)
    res = train(cfg, tr, steps=STEPS, batch_size=BATCH, backend=local, eval_data=va)
    return res, local.state_dict()


def _assert_same_state(a, b):
    assert a.keys() == b.keys()
    for t in a:
        for x, y in zip(a[t], b[t]):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("optimizer,dtype,mtu,rows", [("adagrad", "fp32", 1500, 4096), ("sgd", "fp16", 576, 4096),
                                                     ("adagrad", "fp32", 1500, None)])
def test_two_udp_shards_match_in_process(optimizer, dtype, mtu, rows):
    """rows=None: tables without a row count, the Criteo ids kept as full 64-bit hashes."""
    cfg = _cfg(criteo.default_tables(rows=rows, dim=8, optimizer=optimizer, dtype=dtype), mtu=mtu)
    tr, va = _data(cfg)
    if rows is None:
        assert int(tr.sparse.max()) >= 2**63 and {t.rows for t in cfg.tables} == {None}
    ref, ref_state = _reference(cfg, tr, va)
    with ServerCluster(cfg) as cl:
        with EmbeddingClient(cl.cfg, 3, bind=("127.0.0.1", 0)) as client:
            res = train(cl.cfg, tr, steps=STEPS, batch_size=BATCH, backend=client, eval_data=va)
            stats = client.stats
    assert np.max(np.abs(np.array(res.loss) - np.array(ref.loss))) <= 1e-6
    assert res.loss == ref.loss  # in fact bit-identical
    assert res.auc == pytest.approx(ref.auc, abs=1e-9)
    _assert_same_state(cl.state_dict(), ref_state)
    # one lookup round and one update round per step, plus the evaluation lookups
    assert stats.rounds == 2 * STEPS + -(-len(va.labels) // 1024)
    # protocol v2: one message per shard a round touches (both shards: hash sharding) at this batch
    assert stats.round_messages == stats.round_shards == 2 * stats.data_rounds
    assert stats.messages_sent >= 2 * STEPS * 2
    assert stats.frames_sent > stats.messages_sent  # large messages were fragmented


def test_table_wise_sharding_matches_in_process():
    cfg = _cfg(sharding="table", n_shards=3)
    tr, va = _data(cfg)
    ref, ref_state = _reference(cfg, tr, va)
    with ServerCluster(cfg) as cl, EmbeddingClient(cl.cfg, 3, bind=("127.0.0.1", 0)) as client:
        res = train(cl.cfg, tr, steps=STEPS, batch_size=BATCH, backend=client, eval_data=va)
    assert res.loss == ref.loss
    _assert_same_state(cl.state_dict(), ref_state)


class LossyRelay:
    """A UDP relay per shard: client → relay → shard and back, dropping, duplicating and
    delaying (reordering) datagrams with the given probabilities, both ways."""

    def __init__(self, target, loss, dup, reorder, seed):
        self.target = target
        self.loss, self.dup, self.reorder = loss, dup, reorder
        self.rnd = random.Random(seed)
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind(("127.0.0.1", 0))
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back.bind(("127.0.0.1", 0))
        for s in (self.front, self.back):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.client_addr = None
        self.stop_ev = threading.Event()
        self.held = []
        self.counts = {"dropped": 0, "duplicated": 0, "delayed": 0}
        self.thread = threading.Thread(target=self._run, daemon=True)

    @property
    def addr(self):
        return self.front.getsockname()

    def _out(self, sock, data, addr):
        r = self.rnd.random()
        if r < self.loss:
            self.counts["dropped"] += 1
            return
        if r < self.loss + self.reorder:
            self.counts["delayed"] += 1
            self.held.append((sock, data, addr))
            return
        sock.sendto(data, addr)
        if self.rnd.random() < self.dup:
            self.counts["duplicated"] += 1
            sock.sendto(data, addr)
        if self.held and self.rnd.random() < 0.5:  # release a delayed one after a later one
            s, d, a = self.held.pop(self.rnd.randrange(len(self.held)))
            s.sendto(d, a)

    def _run(self):
        while not self.stop_ev.is_set():
            r, _, _ = select.select([self.front, self.back], [], [], 0.01)
            if not r:
                while self.held:
                    s, d, a = self.held.pop()
                    s.sendto(d, a)
            for s in r:
                data, addr = s.recvfrom(65536)
                if s is self.front:
                    self.client_addr = addr
                    self._out(self.back, data, self.target)
                elif self.client_addr:
                    self._out(self.front, data, self.client_addr)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.thread.join()
        self.front.close()
        self.back.close()


def test_loss_duplicates_reordering_change_nothing():
    cfg = _cfg(criteo.default_tables(rows=4096, dim=8, optimizer="adagrad"))
    tr, va = _data(cfg)
    ref, ref_state = _reference(cfg, tr, None)
    with ServerCluster(cfg) as cl:
        relays = [LossyRelay((s.ip, s.port), loss=0.03, dup=0.03, reorder=0.05, seed=i)
                  for i, s in enumerate(cl.cfg.shards)]
        for r in relays:
            r.__enter__()
        try:
            lossy_cfg = dataclasses.replace(cl.cfg, shards=tuple(
                dataclasses.replace(s, ip=r.addr[0], port=r.addr[1]) for s, r in zip(cl.cfg.shards, relays)))
            with EmbeddingClient(lossy_cfg, 3, bind=("127.0.0.1", 0)) as client:
                res = train(lossy_cfg, tr, steps=STEPS, batch_size=BATCH, backend=client)
                stats = client.stats
        finally:
            for r in relays:
                r.__exit__(None, None, None)
    assert sum(r.counts["dropped"] for r in relays) > 0
    assert sum(r.counts["duplicated"] for r in relays) > 0
    assert stats.retransmits > 0
    assert res.loss == ref.loss
    _assert_same_state(cl.state_dict(), ref_state)  # every update applied exactly once


def test_dead_shard_raises_naming_it():
    cfg = _cfg(timeout_ms=20, retries=3)
    dead = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dead.bind(("127.0.0.1", 0))  # bound but never read: requests vanish
    with ServerCluster(cfg) as cl:
        shards = (cl.cfg.shards[0], dataclasses.replace(cl.cfg.shards[1], port=dead.getsockname()[1]))
        bad = dataclasses.replace(cl.cfg, shards=shards)
        with EmbeddingClient(bad, 3, bind=("127.0.0.1", 0)) as client:
            with pytest.raises(ShardUnavailableError) as e:
                client.lookup({0: np.arange(100, dtype=np.uint64)})
    dead.close()
    assert e.value.shard_id == 1 and e.value.tries == 3
    assert "shard 1" in str(e.value)


def _free_udp_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def test_cli_train_with_server_processes(tmp_path):
    """`embnic server` processes + `embnic train` give the `--local` losses."""
    ports = [_free_udp_port() for _ in range(3)]
    tables = "\n".join(f'[[tables]]\nid = {i}\nname = "C{i + 1}"\nrows = 4096\ndim = 8\n' for i in range(26))
    conf = tmp_path / "c.toml"
    conf.write_text(f'[cluster]\nseed = 3\ntimeout_ms = 100\nretries = 20\n{tables}\n'
                    f'[[shards]]\nid = 0\nip = "127.0.0.1"\nport = {ports[0]}\n'
                    f'[[shards]]\nid = 1\nip = "127.0.0.1"\nport = {ports[1]}\n'
                    f'[[clients]]\nid = 1\nip = "127.0.0.1"\nport = {ports[2]}\n')
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "embnic"]
    servers = [subprocess.Popen(cmd + ["server", "--shard", str(i), "--config", str(conf)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env) for i in (0, 1)]
    try:
        time.sleep(0.5)
        for s in servers:
            assert s.poll() is None, s.stdout.read().decode()
        net = subprocess.run(cmd + ["train", "-c", str(conf), "--steps", "3", "--batch-size", "64",
                                    "--max-rows", "800", "--json-out", str(tmp_path / "net.json")],
                             capture_output=True, text=True, timeout=120)
        assert net.returncode == 0, net.stderr
        assert "final AUC" in net.stdout and "step     3" in net.stdout
    finally:
        for s in servers:
            s.terminate()
        for s in servers:
            assert s.wait(10) == 0  # SIGTERM → clean exit 0
    loc = subprocess.run(cmd + ["train", "-c", str(conf), "--local", "--steps", "3", "--batch-size", "64",
                                "--max-rows", "800", "--json-out", str(tmp_path / "loc.json")],
                         capture_output=True, text=True, timeout=120)
    assert loc.returncode == 0, loc.stderr
    a = json.loads((tmp_path / "net.json").read_text())
    b = json.loads((tmp_path / "loc.json").read_text())
    assert a["loss"] == b["loss"]
    assert a["client"]["messages_sent"] > 0 and b["client"] is None


def _run_cli(*args):
    return subprocess.run([sys.executable, "-m", "embnic", *args], capture_output=True, text=True, timeout=120)


CFG = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "cluster.toml")


def test_cli_train_refuses_unlabelled_data():
    r = _run_cli("train", "-c", CFG, "--local", "--steps", "1", "--data",
                 str(criteo.sample_path("test")))
    assert r.returncode == 2  # the wrong file for training: a usage error naming --data
    assert "Invalid value for --data: " in r.stderr and "has no label column" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_train_tiny_inputs_and_bad_json_out(tmp_path):
    r = _run_cli("train", "-c", CFG, "--local", "--steps", "1", "--max-rows", "2")
    assert r.returncode == 0, r.stderr
    assert "final AUC n/a" in r.stdout
    r = _run_cli("train", "-c", CFG, "--local", "--steps", "1", "--json-out", str(tmp_path / "no" / "x.json"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    assert "step" not in r.stdout  # refused before training


def test_cli_train_bind_errors_name_the_fix(tmp_path):
    """A client address this host lacks (run outside the testbed's client namespace) and one in use."""
    busy = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    busy.bind(("127.0.0.1", 0))
    try:
        text = open(CFG).read()
        for ip_port, want in ((("192.0.2.77", 40000), "192.0.2.77 is not an address of this host"),
                              (busy.getsockname(), "address already in use (another client 1 running?)")):
            conf = tmp_path / "c.toml"
            conf.write_text(text.replace('[[clients]]\nid = 1\nip = "127.0.0.1"\nport = 17890',
                                         f'[[clients]]\nid = 1\nip = "{ip_port[0]}"\nport = {ip_port[1]}'))
            assert ip_port[0] in conf.read_text()
            r = _run_cli("train", "-c", str(conf), "--steps", "1", "--max-rows", "50")
            err = r.stderr.strip().splitlines()
            assert r.returncode == 1 and len(err) == 1 and want in err[0], r.stderr
    finally:
        busy.close()


def test_cli_debug_flag_anywhere(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[cluster\n")
    for args in (("--debug", "config", "check", str(bad)), ("config", "check", str(bad), "--debug")):
        r = _run_cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "No such option" not in r.stderr


# ---- issue 23: what a new user hits with `embnic train` -------------------------------------

def _one_line_exit_2(r, want):
    err = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(err) == 1 and want in err[0], r.stderr


def test_cli_train_empty_config_path_is_one_line_usage_error():
    from click.testing import CliRunner

    from embnic.cli.main import cli

    _one_line_exit_2(CliRunner().invoke(cli, ["train", "-c", ""]), "--config' / '-c': empty path; give the cluster config file")


def test_cli_train_reads_gzip_and_names_zstd(tmp_path):
    import gzip

    from click.testing import CliRunner

    from embnic.cli.main import cli

    lines = criteo.sample_path("train").read_bytes().splitlines(keepends=True)[:600]
    plain, gz, zst = tmp_path / "x.tsv", tmp_path / "x.tsv.gz", tmp_path / "x.tsv.zst"
    plain.write_bytes(b"".join(lines))
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    zst.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 64)
    losses = []
    for p in (plain, gz):
        out = tmp_path / f"{p.name}.json"
        r = CliRunner().invoke(cli, ["train", "-c", CFG, "--local", "--steps", "2", "--batch-size", "64",
                                     "--data", str(p), "--json-out", str(out)])
        assert r.exit_code == 0, r.output
        assert "training on 480 rows" in r.output
        losses.append(json.loads(out.read_text())["loss"])
    assert losses[0] == losses[1]
    r = CliRunner().invoke(cli, ["train", "-c", CFG, "--local", "--steps", "1", "--data", str(zst)])
    _one_line_exit_2(r, "x.tsv.zst is zstd-compressed; decompress it first (unzstd")


def test_cli_train_again_on_trained_shards_says_so(tmp_path):
    """A second `embnic train` against shards that kept the first run's rows warns (one line,
    exit 0) and records it in the JSON; the first run (fresh shards) does not."""
    from click.testing import CliRunner

    from embnic.cli.main import cli

    cfg = _cfg(tables=criteo.default_tables(rows=4096, dim=8))
    with ServerCluster(cfg) as cl:
        tables = "\n".join(f'[[tables]]\nid = {i}\nname = "C{i + 1}"\nrows = 4096\ndim = 8\n' for i in range(26))
        shards = "".join(f'[[shards]]\nid = {s.id}\nip = "{s.ip}"\nport = {s.port}\n' for s in cl.cfg.shards)
        conf = tmp_path / "c.toml"
        conf.write_text(f'[cluster]\nseed = 7\ntimeout_ms = 100\nretries = 20\n{tables}\n{shards}'
                        f'[[clients]]\nid = 1\nip = "127.0.0.1"\nport = {_free_udp_port()}\n')
        runs = []
        for k in range(2):
            out = tmp_path / f"run{k}.json"
            r = CliRunner().invoke(cli, ["train", "-c", str(conf), "--steps", "2", "--batch-size", "64",
                                         "--max-rows", "400", "--json-out", str(out)])
            assert r.exit_code == 0, r.output
            runs.append((r, json.loads(out.read_text())))
    (r0, j0), (r1, j1) = runs
    assert "warning" not in r0.stderr and j0["rows_already_trained"] == {"changed": 0, "read": j0["rows_already_trained"]["read"]}
    warn = [x for x in r1.stderr.splitlines() if x.startswith("warning: the shards already hold trained rows")]
    assert len(warn) == 1 and "this run continues from them" in warn[0], r1.stderr
    assert j1["rows_already_trained"]["changed"] > 0 and j0["rows_already_trained"]["read"] > 0
    assert j1["client"]["rounds"] == j0["client"]["rounds"]  # the probe round is not counted
    assert j1["loss"] != j0["loss"]  # it did continue from the trained rows
