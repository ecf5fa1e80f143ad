"""`embnic bench client`: a round of the same keys over 2 and 26 tables (the C round), into bench.json (no root: the shards run on loopback).

Run alone: python3 -m pytest -q tests/testbed/test_bench_client_round.py
"""
import json

from click.testing import CliRunner

from embnic.cli.commands.bench import bench
from embnic.testbed.bench import client_round as bench_client
from embnic.testbed.bench.results import merge_json


def test_bench_client_merges_its_figures(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_client, "KEYS", (832,))
    merge_json(tmp_path / "bench.json", "prep", {"ids_per_s": 1.0})
    r = CliRunner().invoke(bench, ["client", "--out", str(tmp_path), "--rounds", "3"])
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["prep"] == {"ids_per_s": 1.0}
    c = data["client"]
    assert "numpy" not in c and list(c["ratios"]) == ["native"]  # one round: the C one
    for op in ("lookup", "update"):
        for t in (2, 26):
            v = c["native"][f"{op}_832_{t}"]
            assert v["client_cpu_us"] > 0 and v["wall_us"] >= v["client_cpu_us"] * 0.5
        assert c["ratios"]["native"][f"ratio_cpu_{op}_832"] > 0
    assert c["native"]["shards_per_round"] == 2.0  # 832 keys of hash-sharded tables: both shards
    t = c["targets"]["client_round_26_over_2_tables_le_1.2"]
    assert t["ratio"] == max(v for k, v in c["ratios"]["native"].items() if k.startswith("ratio_cpu_"))
    assert "ratio_cpu_lookup_832" in r.output


def test_both_table_counts_carry_the_same_keys():
    import numpy as np

    rng = np.random.default_rng(0)
    for k in bench_client.KEYS:
        two, many = (bench_client._round_keys(rng, k, t, 1)[0] for t in (2, 26))
        assert sum(map(len, two.values())) == sum(map(len, many.values())) == k
        assert sorted(two) == [0, 1] and sorted(many) == list(range(26))
