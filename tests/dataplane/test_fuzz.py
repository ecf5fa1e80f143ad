"""Bounded libFuzzer runs of every fuzz target of the card (`make -C dataplane fuzz`).

Builds dataplane/fuzz/fuzz_{parse,card,ctl}.c with clang -fsanitize=fuzzer,address,undefined in
a temporary BUILD directory and fuzzes each for FUZZ_SECONDS (default here 5 s; override with
the EMBNIC_FUZZ_SECONDS environment variable): CI catches a target that no longer builds, or
that crashes on its seeds (every crash ever found is one of them: dataplane/fuzz/seeds/<target>/)
or soon after. Any crash, sanitizer report or violated invariant fails the test and leaves the
input in the artifacts directory named in the message.
Run alone: python3 -m pytest -q tests/dataplane/test_fuzz.py
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SEEDS = REPO / "dataplane" / "fuzz" / "seeds"
SECONDS = int(os.environ.get("EMBNIC_FUZZ_SECONDS", "5"))
#: edges each target must reach in a few seconds from its seeds (the parser alone: ~100; the
#: card's whole per-frame path: ~500; the control socket: ~270)
MIN_COV = {"parse": 60, "card": 350, "ctl": 200}

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def fuzz_run(tmp_path_factory):
    # scripts/apt-packages.txt has clang, libclang-rt-14-dev (libFuzzer, ASan) and libdpdk-dev
    if shutil.which("clang") is None:
        pytest.fail("clang absent (needed for libFuzzer): run `make deps`")
    if subprocess.run(["pkg-config", "--exists", "libdpdk"]).returncode != 0:
        pytest.fail("DPDK headers absent (pkg-config libdpdk): run `make deps`")
    build = tmp_path_factory.mktemp("fuzz") / "build"
    r = subprocess.run(["make", "-s", "-C", str(REPO / "dataplane"), "fuzz", f"BUILD={build}",
                        f"FUZZ_SECONDS={SECONDS}"], capture_output=True, text=True,
                       timeout=3 * SECONDS + 900)
    return build, r


def test_every_target_runs_clean(fuzz_run):
    build, r = fuzz_run
    out = r.stdout + r.stderr
    artifacts = sorted((build / "fuzz-artifacts").glob("*")) if (build / "fuzz-artifacts").exists() else []
    assert r.returncode == 0, f"fuzzer failed (artifacts: {artifacts}):\n{out[-4000:]}"
    assert not artifacts, f"fuzzer left crash inputs: {artifacts}"


@pytest.mark.parametrize("target", sorted(MIN_COV))
def test_target_summary(fuzz_run, target):
    build, r = fuzz_run
    log = (build / f"fuzz-{target}.log").read_text(errors="replace")
    m = re.search(rf"^fuzz-{target} summary: runs (\d+), cov (\d+) edges, ft (\d+), corpus (\d+), "
                  rf"findings (\d+), exit (\d+)$", r.stdout, re.M)
    assert m, r.stdout[-3000:]
    runs, cov, _ft, _corpus, findings, rc = map(int, m.groups())
    assert (findings, rc) == (0, 0), log[-3000:]
    assert runs > 100, f"fuzz-{target} barely ran:\n{log[-2000:]}"
    # every seed was loaded (and ran without a crash, or libFuzzer stops before INITED)
    seeds = len(list((SEEDS / target).iterdir()))
    assert re.search(rf"seed corpus: files: {seeds}\b", log), log[:2000]
    assert "INITED" in log, log[-2000:]
    assert cov >= MIN_COV[target], f"fuzz-{target}: {cov} edges:\n{log[-2000:]}"


#: every input a fuzz target ever crashed on, kept as a seed named regress-*, and what it found
REGRESSIONS = {
    ("card", "regress-trailer-2-segs"):
        "a frame in 2 segments whose trailer past the IPv4 datagram was longer than its last "
        "segment was sent with the trailer (rte_pktmbuf_trim cuts the last segment only)",
}


def test_regression_seeds_listed():
    found = {(t.name, f.name) for t in SEEDS.iterdir() for f in t.glob("regress-*")}
    assert found == set(REGRESSIONS), "list every regress-* seed in REGRESSIONS with what it found"


@pytest.mark.parametrize("target,seed", sorted(REGRESSIONS))
def test_regression_seed(fuzz_run, target, seed):
    """The input alone, run once by the target: passes every check of the harness now."""
    build, _ = fuzz_run
    r = subprocess.run([str(build / f"fuzz-{target}"), str(SEEDS / target / seed)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{REGRESSIONS[(target, seed)]}:\n{(r.stdout + r.stderr)[-3000:]}"
    assert f"Executed {SEEDS / target / seed}" in r.stderr, r.stderr[-2000:]
