"""``embnic plan`` (control/capacity.py, control/traffic.py, cli/commands/plan.py): its traffic model
against the client's own counters on real shards (loopback, no card) and its closed form of the
message cut against the client's C plan, storage arithmetic, the CLI.

Run alone: python3 -m pytest -q tests/control/test_plan.py
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

from embnic.client_lib import consts
from embnic.client_lib.client import EmbeddingClient
from embnic.client_lib.config import ConfigError, load_config, parse_config
from embnic.control import capacity as P
from embnic.control import traffic
from embnic.cli.main import cli
from embnic.testbed.bench import e2e
from embnic.testbed.server.runner import ServerCluster
from embnic.testbed.training import criteo
from embnic.testbed.training.train import feature_tables

from clientref import c_plan

STEPS = 6


@pytest.mark.parametrize("sharding", ["hash", "table"])
def test_predicted_messages_frames_bytes_match_a_run_on_real_shards(sharding):
    """The plan's request messages, frames and bytes per step (and the replies') within 10 % of
    what an EmbeddingClient counts (``client.stats``) doing ``bench e2e``'s steps — Criteo
    batches of 26 features, lookup of the unique ids then their update — on two real shards;
    the workload measured from the same sample file as ``embnic plan --data`` does. Batch 2048
    splits a round past 64 fragments (several messages per shard)."""
    cfg = dataclasses.replace(load_config(e2e.CONFIG), sharding=sharding, card=None)
    rows = [t.rows for t in cfg.tables]
    data = criteo.load_criteo(criteo.sample_path("train"), rows=rows)
    figures = {}
    with ServerCluster(cfg) as cl:
        with EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0), rto_min_ms=1000) as c:
            for batch in (32, 256, 2048):
                sp = e2e.sample_batches(batch, STEPS + 1, seed=batch, rows=rows, data=data)
                e2e.embnic_steps(c, cl.cfg, sp[:1])  # the shards make their rows
                s0 = dataclasses.replace(c.stats)
                r = e2e.embnic_steps(c, cl.cfg, sp[1:])
                s1 = c.stats
                assert r["retransmits"] == 0, "loss on loopback: the counts below would include re-sends"
                figures[batch] = {k: (getattr(s1, a) - getattr(s0, a)) / STEPS for k, a in (
                    ("request_messages", "messages_sent"), ("request_frames", "frames_sent"),
                    ("request_bytes", "bytes_sent"), ("reply_frames", "frames_received"),
                    ("reply_bytes", "bytes_received"), ("probes", "probes"))}
    for batch, meas in figures.items():
        w = P.measure_workload(cfg, data.sparse, feature_tables(cfg, 26), batch)
        pred = P.plan(cfg, w)["per_step"]
        for k, v in meas.items():
            assert v > 0
            assert abs(pred[k] - v) <= 0.10 * v, (sharding, batch, k, pred[k], v)
    assert figures[2048]["request_messages"] > 4  # the split path was taken (2 shards, 2 rounds)


def test_traffic_arithmetic_on_one_table():
    """One fp32 table of dim 8 on one shard, 1000 unique ids: the message sizes by hand."""
    cfg = parse_config({"cluster": {"mtu": 1500}, "tables": [{"id": 0, "rows": 10**6, "dim": 8}],
                        "shards": [{"id": 0, "ip": "10.0.0.1"}], "clients": [{"id": 1, "ip": "10.0.0.2"}]})
    tr = traffic.step_traffic(cfg, {0: 1000})
    p = consts.max_body_per_frame(1500)
    look, reply, upd = 16 + 8000, 32000, 16 + 8000 + 32000
    f = lambda b: -(-b // p)  # noqa: E731
    assert tr.req_messages == 2 and tr.probes == 2
    assert tr.req_frames == f(look) + f(upd) + 2
    assert tr.rep_frames == f(reply) + 1 + 2
    assert tr.req_bytes == look + upd + 44 * (f(look) + f(upd)) + 2 * (24 + 44)
    assert tr.rep_bytes == reply + 44 * (f(reply) + 1) + 2 * (32 + 44)
    # 3000 ids: the lookup's reply needs more than 64 fragments, so the round is split
    assert traffic.step_traffic(cfg, {0: 3000}).req_messages > 2


def test_storage_memory_disk_and_expected_rows():
    raw = {"cluster": {"sharding": "hash"},
           "tables": [{"id": 0, "rows": 1000, "dim": 4}, {"id": 1, "dim": 8, "optimizer": "sgd", "expected_rows": 500}],
           "shards": [{"id": 0, "ip": "10.0.0.1"}, {"id": 1, "ip": "10.0.0.3"}],
           "clients": [{"id": 1, "ip": "10.0.0.2"}]}
    cfg = parse_config(raw)
    assert cfg.table(1).expected_rows == 500 and cfg.table(0).expected_rows is None
    hw = P.Hardware(arena_slack=1.0)
    st = P.shard_storage(cfg, hw)
    assert st["rows"].tolist() == [750, 750]
    # dims 4 and 8 on each shard: the row store's flat arena, an offset per row
    assert st["memory_bytes"].tolist() == [500 * (16 + 4 + 18 + 8) + 250 * (32 + 18 + 8)] * 2
    assert st["disk_bytes"].tolist() == [2 * (500 * (8 + 16 + 4) + 250 * (8 + 32 + 4))] * 2
    bad = json.loads(json.dumps(raw))
    del bad["tables"][1]["expected_rows"]
    with pytest.raises(ValueError, match="expected_rows"):
        P.shard_storage(parse_config(bad), hw)
    bad["tables"][0]["expected_rows"] = 2000
    with pytest.raises(ConfigError, match=r"tables\[0\].expected_rows"):
        parse_config(bad)


def test_more_steps_need_more_shards_and_the_binding_limit_is_the_smallest():
    cfg = load_config(e2e.CONFIG)
    w = P.uniform_workload(cfg, 4096, unique_ratio=0.5, clients=4, steps_per_s=None)
    res = P.plan(cfg, w)
    assert res["binds"] == min(res["limits"], key=res["limits"].get)
    assert res["rate"] == pytest.approx(res["limits"][res["binds"]])
    want = [P.plan(cfg, dataclasses.replace(w, steps_per_s=s))["needed"] for s in (10, 40, 160)]
    assert want[0]["shards"] <= want[1]["shards"] <= want[2]["shards"] and want[2]["shards"] > want[0]["shards"]
    assert want[0]["cards"] <= want[2]["cards"]


def test_cli_text_json_and_errors(tmp_path):
    r = CliRunner().invoke(cli, ["plan", "-c", str(e2e.CONFIG), "--batch", "256", "--data",
                                 str(criteo.sample_path("train")), "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["workload"]["source"].endswith(".tsv") and 0 < res["workload"]["unique_ratio"] < 1
    assert {"frames_per_s", "messages_per_s", "gbps", "state_entries_in_flight"} <= set(res["card"])
    assert len(res["shards"]) == 2 and res["binds"] in res["limits"]
    r = CliRunner().invoke(cli, ["plan", "-c", str(e2e.CONFIG), "--batch", "256", "--steps-per-s", "50",
                                 "--hardware", "testbed", "--nic-gbps", "1"])
    assert r.exit_code == 0, r.output
    assert "binds first" in r.output and "card(s) for 50 steps/s" in r.output and "state-map entries" in r.output
    p = tmp_path / "c.toml"
    p.write_text('[[tables]]\nid = 0\ndim = 8\n[[shards]]\nid = 0\nip = "10.0.0.1"\n[[clients]]\nid = 1\nip = "10.0.0.2"\n')
    r = CliRunner().invoke(cli, ["plan", "-c", str(p)])
    assert r.exit_code == 2 and "expected_rows" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    r = CliRunner().invoke(cli, ["plan", "-c", str(e2e.CONFIG), "--batch", "1", "--unique-ratio", "0.1"])
    assert r.exit_code == 2 and "has no ids" in r.output and "--unique-ratio" in r.output, r.output
    # no config at all (a new-user trial got a Python TypeError): one usage line naming --config
    r = CliRunner(env={"EMBNIC_CONFIG": None}).invoke(cli, ["plan"])
    assert r.exit_code == 2 and "--config FILE is required" in r.output and len(r.output.strip().splitlines()) == 1, \
        r.output


def test_bench_e2e_reports_the_plan_beside_its_measurement(monkeypatch, tmp_path):
    """``bench e2e``'s plan rows from a loopback run's summary (no card, no timing checked), and
    the CLI's line for them."""
    cfg = dataclasses.replace(load_config(e2e.CONFIG), sharding="table", card=None)
    rows = [t.rows for t in cfg.tables]
    sample = criteo.load_criteo(criteo.sample_path("train"), rows=rows)
    sp = e2e.sample_batches(256, 4, seed=256, rows=rows, data=sample)
    with ServerCluster(cfg) as cl:
        with EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0), rto_min_ms=1000) as c:
            e2e.embnic_steps(c, cl.cfg, sp[:1])
            summ = e2e._summ([e2e.embnic_steps(c, cl.cfg, sp[1:])])
    pb = e2e.plan_rows(cfg, sample, [256, 4096], {"256": summ})
    assert list(pb) == ["256"]
    v = pb["256"]
    assert v["plan_step_us"] > 0 and v["step_p50_us"] == summ["step_p50_us"]["median"]
    assert v["plan_over_measured"] == v["plan_step_us"] / v["step_p50_us"]
    # messages per step: requests and replies, probes aside, as the run counts them
    assert v["plan_messages_per_step"] == pytest.approx(v["messages_per_step"], rel=0.1)

    emb = {"model": "embeddings", "batch": 256, "varlen_p50_us": 1.0e4, "varlen_p99_us": 2.0e4, "fixed_p50_us": 3.0e4,
           "fixed_p99_us": 4.0e4, "torchrec_p50_us": 5.0e3, "torchrec_p99_us": 6.0e3, "messages_varlen": 8.0,
           "messages_fixed": 16.0, "rounds_varlen": 2.0, "rounds_fixed": 4.0, "request_messages_per_round_varlen": 2.0,
           "request_messages_per_round_fixed": 2.0, "shards_per_round": 2.0}
    monkeypatch.setattr(e2e, "run", lambda out, **kw: {"rows": [emb], "targets": {}, "machine": {"before": {}},
                                                       "plots": [], "loss": {}, "plan": {"by_batch": pb}})
    r = CliRunner().invoke(cli, ["bench", "e2e", "--out", str(tmp_path), "--no-dlrm"])
    assert r.exit_code == 0, r.output
    assert "embnic plan's estimate" in r.output and f"= {v['plan_over_measured']:.2f} x" in r.output


# ---------------------------------------------------------------------------- the disk tier
TEN_TB = e2e.CONFIG.parent / "plan-10tb.toml"


def _variant(path, *, shards: dict | None = None, big_tables: dict | None = None):
    """The example config at ``path`` with ``shards`` keys on every [[shards]] entry and
    ``big_tables`` keys on every table that has ``expected_rows`` (its large ones)."""
    import tomllib

    raw = tomllib.loads(path.read_text())
    for s in raw["shards"]:
        s.update(shards or {})
    for t in raw["tables"]:
        if "expected_rows" in t:
            t.update(big_tables or {})
    return parse_config(raw, path)


def test_the_10tb_example_on_the_disk_tier_fits_memory_and_says_which_tables_are_on_disk():
    """A new user's config: every shard of examples/plan-10tb.toml `store = "disk"`, `cache_rows =
    1000000`: memory is the caches + block cache + fixed overhead, not the arena; disk is the
    stores; the shards' keys cost disk_keys_per_s."""
    mem_cfg = load_config(TEN_TB)
    disk_cfg = _variant(TEN_TB, shards={"store": "disk", "cache_rows": 1_000_000})
    w = P.uniform_workload(mem_cfg, 4096, unique_ratio=0.35, clients=128, steps_per_s=None)
    hw = P.Hardware()  # 256 GB of RAM, 2 TB of disk per shard
    mem, disk = P.plan(mem_cfg, w, hw), P.plan(disk_cfg, w, hw)
    assert not mem["fits"]["memory"] and mem["shards"][0]["memory_gb"] > 300
    assert mem["disk_tier"] == {"tables_on_disk": 0, "shards_with_disk_tables": 0, "rows_on_disk": 0}
    assert mem["shards"][0]["tables_on_disk"] == [] and mem["shards"][0]["disk_keys_per_s"] == 0
    assert disk["fits"] == {"memory": True, "disk": True, "state_map": True}
    # memory: 26 caches of 1,000,000 slots (dim 128 + accumulator + 19 B), 64 MiB block cache, 51 MiB
    want = 26 * 1_000_000 * (4 * 128 + 4 + 19) + (64 << 20) + P.DISK_FIXED_OVERHEAD
    for sh in disk["shards"]:
        assert sh["memory_gb"] * 1e9 == pytest.approx(want) and sh["arena_memory_gb"] == 0
        assert sh["tables_on_disk"] == [t.name for t in disk_cfg.tables]
        assert sh["disk_rows"] == sh["rows"]
    # disk: every row in RocksDB (key, row, accumulator + the assumed overhead, x amplification), twice
    rows = disk["shards"][0]["rows"]
    store = rows * (8 + 512 + 4 + P.ROCKSDB_ENTRY_OVERHEAD) * P.ROCKSDB_SPACE_AMP
    assert disk["shards"][0]["store_gb"] * 1e9 == pytest.approx(store)
    assert disk["shards"][0]["disk_gb"] == pytest.approx(mem["shards"][0]["disk_gb"] + (2 * store - 2 * rows * 524) / 1e9)
    # keys of disk tables at the measured ratio: the shards' key limit drops by ~1/0.08 (probes stay in memory)
    assert disk["limits"]["shard_keys"] == pytest.approx(mem["limits"]["shard_keys"] * P.DISK_KEYS_RATIO_MEASURED,
                                                         rel=0.01)
    assert disk["step_time_us"] > mem["step_time_us"]
    a = disk["disk_tier"]["assumptions"]
    assert a["disk_keys_per_s"] == P.DISK_KEYS_RATIO_MEASURED * hw.shard_keys_per_s and "hit ratio" in \
        a["disk_keys_per_s_source"]
    # C6 has 3 rows: its 1,000,000-row cache on every shard is memory spent on empty slots
    assert {"table": "C6", "cache_rows": 1_000_000} in disk["disk_tier"]["caches_larger_than_rows_held"]
    assert all(c["table"] not in ("C1", "C10", "C21") for c in disk["disk_tier"]["caches_larger_than_rows_held"])
    # memory alone: the disk tier does not spread over shards, so 1 shard of 256 GB holds the arena (none)
    assert disk["needed"]["shards_for_memory"] == 1 and mem["needed"]["shards_for_memory"] == 80


def test_only_the_large_tables_on_disk_and_caches_that_do_not_fit():
    cfg = _variant(TEN_TB, big_tables={"store": "disk", "cache_rows": 4_000_000})
    w = P.uniform_workload(cfg, 4096, unique_ratio=0.35, clients=128)
    res = P.plan(cfg, w)
    big = [t.name for t in cfg.tables if t.expected_rows]
    assert len(big) == 8 and all(sh["tables_on_disk"] == big for sh in res["shards"])
    st = P.shard_storage(cfg, P.Hardware())
    small = [t for t in cfg.tables if not t.expected_rows]
    mem_rows = sum(int(traffic.split_keys(cfg, t.id, t.rows)[0]) for t in small)
    assert st["rows"][0] - st["disk_rows"][0] == mem_rows
    assert st["disk_tier_memory_bytes"][0] == 8 * 4_000_000 * 535 + (64 << 20) + P.DISK_FIXED_OVERHEAD
    assert st["arena_bytes"][0] > 0 and st["memory_bytes"][0] == st["arena_bytes"][0] + st["disk_tier_memory_bytes"][0]
    # disk keys per shard: lookup + update of the 8 tables' keys on it
    tr = traffic.step_traffic(cfg, {t.id: w.unique_ids(t.id) for t in cfg.tables})
    assert tr.disk_keys[0] == 2 * sum(int(traffic.split_keys(cfg, t.id, w.unique_ids(t.id))[0]) for t in cfg.tables
                                      if t.expected_rows)
    assert 0 < tr.disk_keys[0] < tr.per_shard[0, 0]
    # caches a shard cannot hold at all: no number of shards fits
    huge = _variant(TEN_TB, big_tables={"store": "disk", "cache_rows": 200_000_000})
    res = P.plan(huge, dataclasses.replace(w, steps_per_s=10.0))
    assert not res["fits"]["memory"] and res["needed"]["shards_for_memory"] is None
    assert res["needed"]["shards"] is None and "lower cache_rows" in res["needed"]["shards_note"]


def test_cache_bytes_is_the_shards_own():
    ds = pytest.importorskip("embnic.testbed.server.diskstore", exc_type=ImportError)
    cfg = _variant(TEN_TB, shards={"store": "disk", "cache_rows": 1_000_003})
    for t, n in ((cfg.table(0), 1_000_003), (cfg.table(5), 3), (cfg.table(5), 13)):
        assert P.cache_bytes(t.dim, t.optimizer, n) == ds.cache_bytes(t, n)


def test_cli_disk_tier_text_and_json(tmp_path):
    # examples/plan-10tb.toml with its first 32 shards on disk, written as TOML
    parts = TEN_TB.read_text().split("[[shards]]\n")
    cfg_path = tmp_path / "half.toml"
    cfg_path.write_text(parts[0] + "".join("[[shards]]\n" + ('store = "disk"\ncache_rows = 1000000\n' if i < 32 else "")
                                           + x for i, x in enumerate(parts[1:])))
    args = ["plan", "-c", str(cfg_path), "--batch", "4096", "--unique-ratio", "0.35", "--clients", "128"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert "disk tier: 26 table(s) on disk on 32 shard(s)" in r.output
    assert "shards 0-31: on disk 26 tables: C1" in r.output and "shards 32-63: on disk none" in r.output
    assert "does not fit: memory" in r.output  # the 32 shards in memory still need 317 GB
    assert "does not model the hit ratio" in r.output
    r = CliRunner().invoke(cli, args + ["--json", "--shard-keys-per-s", "1000000"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["disk_tier"]["shards_with_disk_tables"] == 32
    assert res["hardware"]["disk_keys_per_s"] == pytest.approx(P.DISK_KEYS_RATIO_MEASURED * 1e6)
    assert res["shards"][0]["memory_gb"] < 15 and res["shards"][40]["memory_gb"] > 300
    assert res["shards"][0]["disk_keys_per_s"] > 0 and res["shards"][40]["disk_keys_per_s"] == 0
    r = CliRunner().invoke(cli, args + ["--json", "--disk-keys-per-s", "500000"])
    assert json.loads(r.output)["disk_tier"]["assumptions"]["disk_keys_per_s"] == 500000


def test_the_10tb_disk_example_fits_server_shards_where_the_memory_one_does_not():
    """examples/plan-10tb-disk.toml (docs/planning.md): the five tables past a billion rows on disk,
    the rest in memory — the same rows and traffic as examples/plan-10tb.toml, a shard's memory
    from 317 GB to ~26 GB, which fits the server profile's 256 GB, and its disk the stores."""
    mem_cfg, disk_cfg = load_config(TEN_TB), load_config(TEN_TB.parent / "plan-10tb-disk.toml")
    w = P.uniform_workload(mem_cfg, 4096, unique_ratio=0.35, clients=128, steps_per_s=10.0)
    mem, disk = P.plan(mem_cfg, w), P.plan(disk_cfg, w)
    assert mem["per_step"] == disk["per_step"] and mem["config"]["rows"] == disk["config"]["rows"]
    assert not mem["fits"]["memory"] and disk["fits"]["memory"] and disk["fits"]["disk"]
    big = [t.name for t in disk_cfg.tables if (t.expected_rows or 0) > 1e9]
    assert big == ["C1", "C10", "C20", "C21", "C22"]
    assert all(sh["tables_on_disk"] == big for sh in disk["shards"])
    assert 20 < disk["shards"][0]["memory_gb"] < 30 < 300 < mem["shards"][0]["memory_gb"]
    assert disk["disk_tier"]["caches_larger_than_rows_held"] == []
    assert disk["needed"]["shards_for_memory"] < mem["needed"]["shards_for_memory"]
    assert disk["needed"]["shards"] > mem["needed"]["shards"]  # the disk tier's keys are slower


TESTBED = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "testbed.toml"


def c_plan_counts(cfg, mt, parts, **cut) -> list[tuple[int, int, int, int]]:
    """The messages the client's C plan (``clientref.c_plan``, client_lib/csrc/plan.c) cuts a one-shard
    round of ``parts`` (``[(table_id, keys)]``) into: ``(first table id, tables, keys, value bytes)``."""
    from embnic.client_lib.roundplan import C_DIR0, C_NKEYS, C_NT, C_VLEN, TableArrays

    ta = TableArrays(cfg)
    tix = ta.index([t for t, _ in parts])
    counts = np.array([k for _, k in parts], np.int64)
    keys = np.concatenate([np.arange(k, dtype=np.uint64) for _, k in parts])
    p = c_plan(ta, mt, tix, counts, keys, **cut)
    return [(int(p.dir["table_id"][r[C_DIR0]]), r[C_NT], r[C_NKEYS], r[C_VLEN]) for r in p.msgs.tolist()]


@pytest.mark.parametrize("mtu,msg_frames,window_frames", [(1500, 64, 1024), (74, 64, 1024), (9000, None, 0),
                                                           (576, 4, 8), (73, 1, 3)])
def test_pack_counts_is_the_c_plan_message_for_message(mtu, msg_frames, window_frames):
    """The planner's key-free closed form cuts a round exactly as the client's C plan does."""
    cfg = load_config(str(TESTBED))
    sizes = [1, 2, 37, 500, 3000, 20000]
    parts = [(t.id, sizes[i % len(sizes)]) for i, t in enumerate(cfg.tables)]
    cfg = dataclasses.replace(cfg, shards=cfg.shards[:1])  # one shard: the round is that shard's part
    cut = {"mtu": mtu, "msg_frames": msg_frames, "window_frames": window_frames}
    for mt in (consts.MsgType.LOOKUP_REQ, consts.MsgType.UPDATE_REQ):
        got = [x[:4] for x in traffic.pack_counts(cfg, mt, parts, **cut) for _ in range(x[4])]
        assert got == c_plan_counts(cfg, mt, parts, **cut)


def test_pack_counts_is_the_c_plan_on_random_rounds():
    """Random tables (dims, fp32/fp16), key counts and cuts (MTU, msg_frames, window): the closed
    form and the C plan give the same messages, in the same order."""
    rng = np.random.default_rng(35)
    for _ in range(150):
        T = int(rng.integers(1, 7))
        cfg = parse_config({"cluster": {}, "shards": [{"id": 0, "ip": "10.0.0.1"}],
                            "clients": [{"id": 1, "ip": "10.0.0.2"}],
                            "tables": [{"id": int(t), "dim": int(rng.choice([1, 3, 8, 16, 64, 300])),
                                        "dtype": str(rng.choice(["fp32", "fp16"]))}
                                       for t in rng.choice(100, T, replace=False)]})
        parts = [(t.id, int(rng.choice([1, 2, 7, 100, 999, 5000]))) for t in cfg.tables if rng.random() < 0.8]
        if not parts:
            continue
        cut = {"mtu": int(rng.choice([73, 200, 576, 1500, 9000])),
               "msg_frames": [None, 1, 2, 5, 64][int(rng.integers(5))],
               "window_frames": int(rng.choice([0, 1, 3, 4, 9, 64, 512]))}
        for mt in (consts.MsgType.LOOKUP_REQ, consts.MsgType.UPDATE_REQ):
            got = [x[:4] for x in traffic.pack_counts(cfg, mt, parts, **cut) for _ in range(x[4])]
            assert got == c_plan_counts(cfg, mt, parts, **cut), (cut, parts)


def test_a_step_of_a_trillion_ids_is_counted_not_packed():
    """--batch 10^9 packed every key (GBs, minutes): the counts come by division, in little memory."""
    import tracemalloc
    cfg = parse_config({"cluster": {"mtu": 1500}, "tables": [{"id": 0, "rows": 10**6, "dim": 8}],
                        "shards": [{"id": 0, "ip": "10.0.0.1"}], "clients": [{"id": 1, "ip": "10.0.0.2"}]})
    tracemalloc.start()
    try:
        tr = traffic.step_traffic(cfg, {0: 10**12})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    # the exact count: lookups hold as many keys as their reply's 64 fragments allow, updates
    # as many as their request's; each a full message but the last
    p = consts.max_body_per_frame(1500)
    look = min((64 * p - 16) // 8, 64 * p // 32)
    upd = (64 * p - 16) // 40
    assert tr.req_messages == -(-10**12 // look) + -(-10**12 // upd)
    assert tr.per_shard[0, 0] == 2 * 10**12 + 2  # every key twice, and the two tail probes
    w = P.uniform_workload(load_config(str(TESTBED)), 10**9)
    res = P.plan(load_config(str(TESTBED)), w)
    assert res["per_step"]["unique_ids"] == pytest.approx(26e9, rel=1e-6) and res["per_step"]["request_messages"] > 10**6


@pytest.mark.parametrize("args,option", [
    (["--batch", "999999999999999999999"], "--batch"), (["--batch", "1000000000"], "--batch"),
    (["--ids-per-feature", "1e308"], "--ids-per-feature"), (["--steps-per-s", "1e300"], "--steps-per-s"),
    (["--shard-ram-gb", "1e-300"], "--shard-ram-gb"), (["--clients", "10000000"], "--clients")])
def test_absurd_figures_are_one_usage_line_naming_the_option_and_its_range(args, option):
    r = CliRunner().invoke(cli, ["plan", "-c", str(TESTBED), *args])
    assert r.exit_code == 2, r.output
    assert option in r.output and "range" in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_a_rate_no_shard_count_meets_is_said_in_words():
    """--steps-per-s 100000 printed "needed: None shard(s)": no shard count keeps up; say so and why."""
    r = CliRunner().invoke(cli, ["plan", "-c", str(TESTBED), "--steps-per-s", "100000"])
    assert r.exit_code == 0, r.output
    last = r.output.strip().splitlines()[-1]
    assert "None" not in last and "no shard count meets it" in last and "4096 shards" in last, last
