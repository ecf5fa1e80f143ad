"""A bounded libFuzzer run of the card's frame parser (`make -C dataplane fuzz`).

Builds dataplane/fuzz/fuzz_parse.c + parse.c with clang -fsanitize=fuzzer,address,undefined in a
temporary BUILD directory and fuzzes for FUZZ_SECONDS (default here 20 s; override with the
EMBNIC_FUZZ_SECONDS environment variable). Any crash, sanitizer report or violated invariant
fails the test and leaves the input in the artifacts directory named in the message.
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
SECONDS = int(os.environ.get("EMBNIC_FUZZ_SECONDS", "20"))

pytestmark = [pytest.mark.slow]


def test_fuzz_parse_bounded(tmp_path):
    # scripts/apt-packages.txt has clang, libclang-rt-14-dev (libFuzzer, ASan) and libdpdk-dev
    if shutil.which("clang") is None:
        pytest.fail("clang absent (needed for libFuzzer): run `make deps`")
    if subprocess.run(["pkg-config", "--exists", "libdpdk"]).returncode != 0:
        pytest.fail("DPDK headers absent (pkg-config libdpdk): run `make deps`")
    build = tmp_path / "build"
    r = subprocess.run(["make", "-s", "-C", str(REPO / "dataplane"), "fuzz", f"BUILD={build}",
                        f"FUZZ_SECONDS={SECONDS}"], capture_output=True, text=True, timeout=SECONDS + 300)
    out = r.stdout + r.stderr
    artifacts = sorted((build / "fuzz-artifacts").glob("*")) if (build / "fuzz-artifacts").exists() else []
    assert r.returncode == 0, f"fuzzer failed (artifacts: {artifacts}):\n{out[-4000:]}"
    assert not artifacts, f"fuzzer left crash inputs: {artifacts}"
    m = re.search(r"Done (\d+) runs in (\d+) second", out)
    assert m, out[-2000:]
    assert int(m.group(1)) > 10_000, "the fuzzer barely ran"
    # the seeds (valid frames of every type) were loaded, so coverage went past the IPv4 checks
    seeds = len(list((REPO / "dataplane" / "fuzz" / "seeds").iterdir()))
    assert re.search(rf"seed corpus: files: {seeds}\b", out), out[:2000]
    cov = re.findall(r"cov: (\d+)", out)
    assert cov and int(cov[-1]) >= 60, out[-2000:]
