"""``embnic bench server --disk-only`` on a small table: every figure of the disk-tier run is there
and adds up (rows/s of both shards — disk and memory — and the ratios, the cache's hit ratio from the shard's
metrics, the memory samples against the budget plus the measured fixed overhead, the table on
disk against the budget, the cache's replacement policies compared on the same streams). No
timing is asserted (figures are benchmarks, not tests).

Run alone: python3 -m pytest -q tests/testbed/test_bench_shard_disk.py
"""
import json

import pytest
from click.testing import CliRunner

from embnic.cli.main import cli

pytest.importorskip("rocksdict", reason="pip install 'embnic[disk]'")
pytest.importorskip("prometheus_client", reason="pip install 'embnic[metrics]'")


@pytest.mark.slow
def test_bench_server_disk_writes_every_figure(tmp_path):
    r = CliRunner().invoke(cli, ["bench", "server", "--disk-only", "--out", str(tmp_path), "--disk-rows", "98304",
                                 "--disk-cache-rows", "8192", "--disk-block-cache-mb", "1", "--scale", "0.07",
                                 "--repeats", "2"])
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "bench.json").read_text())
    assert "server" not in res  # --disk-only
    d = res["server_disk"]
    assert d["config"]["rows"] == 98304 and d["config"]["cache_rows"] == 8192
    assert d["budget"]["bytes"] == d["budget"]["cache_bytes"] + (1 << 20) == 8192 * (4 * 8 + 4 + 19) + (1 << 20)
    for op in ("lookup_4096", "update_4096"):
        f = d[op]
        assert f["ratio"] == pytest.approx(f["disk_rows_per_s"] / f["memory_rows_per_s"])
        assert len(f["disk_rows_per_s_runs"]) == len(f["memory_rows_per_s_runs"]) == 2
        assert min(f["disk_rows_per_s_runs"]) <= f["disk_rows_per_s"] <= max(f["disk_rows_per_s_runs"])
        assert 0 < f["hit_ratio"] < 1  # a table 12 x the cache: some keys hit, some are read from RocksDB
    fo = d["fixed_overhead"]
    assert fo["bytes"] == max(s["beyond_budget"] for s in fo["samples"]) > 0
    assert all(s["beyond_budget"] == s["rss_anon"] - d["budget"]["cache_bytes"] - s["block_cache_in_use"]
               for s in fo["samples"])
    g = d["growth"]["samples"]
    assert [s["rows"] for s in g] == sorted(s["rows"] for s in g) and g[-1]["rows"] == 98304
    mb = d["memory_bound"]
    assert mb["bound"] == fo["bytes"] + d["budget"]["bytes"]
    assert mb["within"] == all(s["rss_anon"] <= mb["bound"] for s in g + d["zipf_samples"])
    assert mb["disk_bytes"] == g[-1]["disk_bytes"] > 0
    assert mb["disk_over_budget"] == pytest.approx(mb["disk_bytes"] / d["budget"]["bytes"])
    assert d["targets"]["lookup_4096_disk_vs_memory"]["measured"] == d["lookup_4096"]["ratio"]
    pol = d["policies"]  # the cache's replacement policies on the same streams, in process
    assert pol["kept"] == "lfu-aged" and pol["messages"] >= 20
    for stream in ("stationary", "shifted"):
        p = pol[stream]
        assert set(p["policies"]) == {"lfu-aged", "lfu", "lru"} and p["best"] in p["policies"]
        assert all(0 < v["hit_ratio"] < 1 and v["rows_per_s"] > 0 and v["rows_per_cpu_s"] > 0
                   for v in p["policies"].values())
        assert p["policies"][p["best"]]["hit_ratio"] == max(v["hit_ratio"] for v in p["policies"].values())
        assert 0 < p["static_best_hit_ratio"] < 1
    log = open(d["logs"]["disk"]).read()
    counters = json.loads(log.split("counters ")[1].splitlines()[0])
    t0 = counters["stores"]["tables"]["0"]
    assert t0["rows_held"] == 98304 and t0["cache_rows"] == 8192 and t0["evictions"] > 0
    assert "stores" not in json.loads(open(d["logs"]["memory"]).read().split("counters ")[1].splitlines()[0])


def test_bench_server_disk_refuses_a_table_smaller_than_8_caches(tmp_path):
    r = CliRunner().invoke(cli, ["bench", "server", "--disk-only", "--out", str(tmp_path), "--disk-rows", "65536",
                                 "--disk-cache-rows", "16384"])
    assert r.exit_code == 2 and "less than 8 x --disk-cache-rows" in r.output
