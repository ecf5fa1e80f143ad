"""`embnic bench prep` writes its figures into bench.json without losing other benchmarks'.

Run alone: python3 -m pytest -q tests/testbed/test_bench_prep.py
"""
import json

from click.testing import CliRunner

from embnic.control.cmd_bench import bench
from embnic.testbed.bench_prep import merge_json


def test_bench_prep_merges_into_bench_json(tmp_path):
    merge_json(tmp_path / "bench.json", "dataplane", {"card_mpps": 1.0})
    r = CliRunner().invoke(bench, ["prep", "--out", str(tmp_path), "--batch-size", "256", "--repeats", "1"])
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["dataplane"] == {"card_mpps": 1.0}
    prep = data["prep"]
    assert prep["ids_per_s"] > 0 and prep["np_unique_ids_per_s"] > 0
    assert prep["ratio"] == prep["ids_per_s"] / prep["np_unique_ids_per_s"]
    assert 0 < prep["dedup_ratio"] < 1
    assert "ratio" in r.output
