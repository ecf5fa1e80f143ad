"""``embnic bench server`` on a tiny workload: every figure the issue asks for is there, the
ratios are the quotients of the figures they name, one shard and two shards really ran. No timing is
asserted (figures are benchmarks, not tests).

Run alone: python3 -m pytest -q tests/testbed/test_bench_shard_serving.py
"""
import json

import pytest
from click.testing import CliRunner

from embnic.cli.main import cli


@pytest.mark.slow
def test_bench_server_writes_every_figure(tmp_path):
    r = CliRunner().invoke(cli, ["bench", "server", "--out", str(tmp_path), "--scale", "0.02", "--repeats", "2"])
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "bench.json").read_text())["server"]
    for op in ("lookup", "update"):
        for k in (1, 64, 4096):
            key = f"{op}_{k}"
            for part in ("shards_1", "shards_2"):
                f = res[part][key]
                assert f["rows_per_s"] > 0 and f["p50_us"] <= f["p99_us"] and f["rows_per_s"] == pytest.approx(
                    f["msgs_per_s"] * k)
                assert f["repeats"] == len(f["rows_per_s_runs"]) == 2
                assert min(f["rows_per_s_runs"]) <= f["rows_per_s"] <= max(f["rows_per_s_runs"])
            assert res[f"ratio_{key}"] == pytest.approx(res["shards_1"][key]["rows_per_s"]
                                                        / res["local"][key]["rows_per_s"])
            assert res[f"ratio_shards2_{key}"] == pytest.approx(res["shards_2"][key]["rows_per_s"]
                                                                / res["shards_1"][key]["rows_per_s"])
            assert res[f"ratio_shards2_cpu_{key}"] == pytest.approx(res["shards_2"][key]["rows_per_shard_cpu_s"]
                                                                    / res["shards_1"][key]["rows_per_shard_cpu_s"])
    assert res["targets"]["shards2_vs_shards1_per_cpu"]["measured"] == min(
        res[f"ratio_shards2_cpu_{op}_{k}"] for op in ("lookup", "update") for k in (64, 4096))
    assert res["shards_1"]["lookup_4096"]["reply_frames_per_msg"] == 92  # 4096 x 8 fp32 at MTU 1500
    assert res["shards_1"]["lookup_4096"]["request_frames_per_msg"] == 23
    assert res["targets"]["lookup_4096_vs_local"]["measured"] == res["ratio_lookup_4096"]
    assert len(res["load"]["loadavg_before"]) == 3
    rd = res["rounds"]  # a round over 2 and over 26 tables: both measured, the ratio theirs
    for op in ("lookup", "update"):
        assert rd[f"{op}_2_wakeups"] >= 1 and rd[f"{op}_26_wakeups"] >= 1
        assert rd[f"ratio_26_vs_2_{op}"] == pytest.approx(rd[f"{op}_26_us"] / rd[f"{op}_2_us"])
    assert res["targets"]["rounds_26_vs_2_tables"]["met"] == rd["met"]
    assert res["targets"]["lookup_1_vs_local"]["measured"] == res["ratio_lookup_1"]
    for s in (0, 1):  # both shards of the two-shard run served (each message went to its keys' owner)
        log2 = open(res["shards_2"]["log"].replace("shards-2-0", f"shards-2-{s}")).read()
        c2 = json.loads(log2.split("counters ")[1].splitlines()[0])
        assert "over 2 shards" in log2 and c2["shard"] == s and c2["engine"]["wakeups"] > 0
        assert c2["errors"] == {} or not any(c2["errors"].values()), c2["errors"]
    # the write-ahead log run: updates only, the shard really logged (and synced) them
    for k in (1, 64, 4096):
        key = f"update_{k}"
        assert res[f"ratio_wal_{key}"] == pytest.approx(res["shards_1_wal"][key]["rows_per_s"]
                                                        / res["shards_1"][key]["rows_per_s"])
    assert "lookup_4096" not in res["shards_1_wal"]
    for k in (4096, 1):
        assert res["targets"][f"wal_update_{k}_vs_no_wal"]["measured"] == res[f"ratio_wal_update_{k}"]
    logw = open(res["shards_1_wal"]["log"]).read()
    dur = json.loads(logw.split("counters ")[1].splitlines()[0])["durability"]
    assert dur["log_records"] >= sum(res["shards_1_wal"][f"update_{k}"]["messages"] for k in (1, 64, 4096))
    assert 0 < dur["log_commits"] <= dur["log_records"]
