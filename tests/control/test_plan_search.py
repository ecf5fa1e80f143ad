"""``embnic plan``'s shard search gives the answers it gave before it was made fast (issue 34): the
plan of every example config under a range of workloads, and one step's traffic and storage at many
shard counts, equal what the planner before the change (control/plan.py at 3b11cc0) computed —
recorded in tests/control/data/plan_golden.json. To record it again from another planner:

    git show 3b11cc0:control/plan.py > /tmp/plan_old.py
    python3 tests/control/test_plan_search.py /tmp/plan_old.py

``--steps-per-s 100000`` (a search up to 4096 shards) still ends in the same words; ``--mtu`` has
the config's bounds.

Run alone: python3 -m pytest -q tests/control/test_plan_search.py
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from embnic.client_lib.config import MTU_LIMITS, load_config
from embnic.control import capacity as P
from embnic.cli.main import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GOLDEN = Path(__file__).resolve().parent / "data" / "plan_golden.json"
PLAN_CASES = [(example, batch, steps_per_s, hw)
              for example in ("testbed", "cluster", "testbed-shared", "plan-criteo1tb", "plan-10tb-disk")
              for batch, steps_per_s, hw in ((256, 10.0, "testbed"), (4096, 300.0, "server"), (8192, 2000.0, "server"),
                                             (1000, None, "server"), (64, 50.0, "testbed"))]
TRAFFIC_CASES = [(sharding, shards) for sharding in ("hash", "table") for shards in (1, 7, 64, 300)]


def _plain(x):
    """``x`` as JSON-able builtins (arrays to lists), to compare two plans exactly."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    return x


def _plan(mod, example, batch, steps_per_s, hw) -> str:
    """The plan ``mod`` (control/capacity.py now, control/plan.py as recorded) makes of one case, as sorted JSON
    (or its ValueError), searching up to 256 shards."""
    cfg = load_config(EXAMPLES / f"{example}.toml")
    try:
        w = mod.uniform_workload(cfg, batch, unique_ratio=0.7, clients=3, steps_per_s=steps_per_s)
        return json.dumps(_plain(mod.plan(cfg, w, mod.PROFILES[hw], max_shards=256)), sort_keys=True)
    except ValueError as e:
        return f"ValueError: {e}"


def _digest(x) -> str:
    """SHA-256 of ``x`` as sorted JSON (a plan or a traffic figure set, compared exactly)."""
    return hashlib.sha256((x if isinstance(x, str) else json.dumps(x, sort_keys=True)).encode()).hexdigest()


def _traffic(mod, sharding, shards) -> dict:
    """One step's traffic, the disk tables and the shard storage ``mod`` computes at ``shards``."""
    cfg = load_config(EXAMPLES / "plan-10tb-disk.toml")
    cfg = mod._with_shards(dataclasses.replace(cfg, sharding=sharding), shards)
    unique = {t.id: 3000.0 * (1 + t.id % 5) for t in cfg.tables}
    return {"shard_ids": [s.id for s in cfg.shards],
            "traffic": _plain(dataclasses.asdict(mod.step_traffic(cfg, unique))),
            "disk_tables": _plain(mod.disk_tables(cfg)),
            "storage": _plain(mod.shard_storage(cfg, mod.Hardware()))}


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("case", PLAN_CASES, ids=repr)
def test_the_plan_equals_the_old_planners(case, golden):
    """Every figure of the plan (the shards and cards needed, the traffic, the storage) is the
    old planner's, searching up to 256 shards (the old one takes minutes beyond)."""
    assert _digest(_plan(P, *case)) == golden["plans"][repr(case)]


@pytest.mark.parametrize("case", TRAFFIC_CASES, ids=repr)
def test_step_traffic_equals_the_old_on_many_shards(case, golden):
    """What the search evaluates at each shard count: one step's traffic, shard for shard."""
    assert _digest(_traffic(P, *case)) == golden["traffic"][repr(case)]


def test_a_rate_past_4096_shards_searches_them_all():
    """``--steps-per-s 100000`` searches up to 4096 shards (~9 s before the search was made
    fast, ~2 s after on an idle machine: no time is asserted here, the machines are shared) and
    ends in the same words."""
    r = CliRunner().invoke(cli, ["plan", "-c", str(EXAMPLES / "testbed.toml"), "--steps-per-s", "100000"])
    assert r.exit_code == 0, r.output
    assert "no shard count meets it" in r.output and "4096 shards" in r.output


@pytest.mark.parametrize("mtu,ok", [(MTU_LIMITS[0] - 1, False), (MTU_LIMITS[0], True), (MTU_LIMITS[1], True),
                                    (MTU_LIMITS[1] + 1, False), (100, False), (65535, False)])
def test_mtu_has_the_configs_bounds(mtu, ok):
    """``plan --mtu`` plans only what a config may hold ([cluster] mtu, client_lib/config.py MTU_LIMITS)."""
    r = CliRunner().invoke(cli, ["plan", "-c", str(EXAMPLES / "testbed.toml"), "--mtu", str(mtu), "--json"],
                           prog_name="embnic")
    if ok:
        assert r.exit_code == 0 and json.loads(r.output)["config"]["mtu"] == mtu, r.output
    else:
        assert r.exit_code == 2, r.output
        assert r.output.strip().splitlines() == [
            f"Error: Invalid value for '--mtu': {mtu} is not in the range {MTU_LIMITS[0]}<=x<={MTU_LIMITS[1]} "
            "(see 'embnic plan --help')"], r.output


if __name__ == "__main__":  # record the golden file from another planner (module docstring)
    spec = importlib.util.spec_from_file_location("plan_reference", sys.argv[1])
    old = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = old  # dataclasses look their module up
    spec.loader.exec_module(old)
    GOLDEN.write_text(json.dumps({"recorded_from": sys.argv[1],
                                  "plans": {repr(c): _digest(_plan(old, *c)) for c in PLAN_CASES},
                                  "traffic": {repr(c): _digest(_traffic(old, *c)) for c in TRAFFIC_CASES}},
                                 sort_keys=True, indent=1) + "\n")
