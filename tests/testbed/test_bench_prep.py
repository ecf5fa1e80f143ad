"""`embnic bench prep` writes its figures into bench.json without losing other benchmarks'.

Run alone: python3 -m pytest -q tests/testbed/test_bench_prep.py
"""
import json

import numpy as np
import pytest

from click.testing import CliRunner

from embnic.cli.commands.bench import bench
from embnic.testbed.bench.results import merge_json


@pytest.mark.parametrize("old", ["{broken", "[1, 2]", "\udcff"])
def test_unreadable_bench_json_is_kept_aside(tmp_path, capsys, old):
    path = tmp_path / "bench.json"
    path.write_bytes(old.encode("utf-8", "surrogateescape"))
    data = merge_json(path, "prep", {"ids_per_s": 1.0})
    assert data == {"prep": {"ids_per_s": 1.0}} == json.loads(path.read_text())
    kept = list(tmp_path.glob("bench.json.unreadable-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == old.encode("utf-8", "surrogateescape")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"kept as {kept[0]}" in err


def test_bench_prep_merges_into_bench_json(tmp_path):
    merge_json(tmp_path / "bench.json", "dataplane", {"card_mpps": 1.0})
    r = CliRunner().invoke(bench, ["prep", "--out", str(tmp_path), "--batch-size", "256", "--repeats", "1"])
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["dataplane"] == {"card_mpps": 1.0}
    prep = data["prep"]
    assert prep["ids_per_s"] > 0 and prep["np_unique_ids_per_s"] > 0 and prep["batch_size"] == 256
    assert "ratio" in r.output
    # the dedup ratio of the whole sample, counted here column by column (26 tables, one per column)
    from embnic.testbed.bench import prep as bench_prep
    from embnic.testbed.training import criteo

    d = criteo.load_criteo(criteo.sample_path("train"),
                           rows=[t.rows for t in bench_prep.bench_config().tables])
    want = sum(np.unique(d.sparse[:, j]).size for j in range(26)) / d.sparse.size
    assert prep["dedup_ratio"] == pytest.approx(want, rel=1e-12)


def test_bench_prep_figures_on_a_known_clock(tmp_path, monkeypatch):
    """With a clock that charges 2 ms per prepared batch and 1 ms per bare np.unique, the
    throughputs are ids/(2 ms) and ids/(1 ms) per batch and the ratio is 0.5: the figures
    measure what they say, whatever formula the code uses."""
    from embnic.testbed.bench import prep as bench_prep

    clock = [0.0]
    real_prepare = bench_prep.prepare_batch

    def prepare(k, ftab):
        clock[0] += 2e-3
        return real_prepare(k, ftab)

    class NumpyWithCharge:
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def unique(*a, **kw):
            clock[0] += 1e-3
            return np.unique(*a, **kw)

    monkeypatch.setattr(bench_prep, "prepare_batch", prepare)
    monkeypatch.setattr(bench_prep, "np", NumpyWithCharge())
    monkeypatch.setattr(bench_prep.time, "perf_counter", lambda: clock[0])
    res = bench_prep.run(tmp_path, batch_size=100, batches=3, repeats=3)
    ids_per_batch = 100 * 26
    assert res["ids_per_s"] == pytest.approx(ids_per_batch / 2e-3)
    assert res["np_unique_ids_per_s"] == pytest.approx(ids_per_batch / 1e-3)
    assert res["ratio"] == pytest.approx(0.5)
