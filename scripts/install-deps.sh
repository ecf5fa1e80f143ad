#!/usr/bin/env bash
# Install what embnic needs on a fresh Debian/Ubuntu machine, as root. Idempotent: packages
# already present are not downloaded again. Used by `make deps` (and so `make demo`/`make test`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
top="$(dirname "$here")"
PY="${PYTHON:-python3}"

mapfile -t pkgs < <(grep -v '^\s*#' "$here/apt-packages.txt" | grep -v '^\s*$')
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# python3/pip may come from elsewhere (pyenv); only ask apt for them when absent entirely
if command -v "$PY" >/dev/null 2>&1 && "$PY" -m pip --version >/dev/null 2>&1; then
    missing=("${missing[@]/python3}"); missing=("${missing[@]/python3-pip}"); missing=("${missing[@]/python3-venv}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "embnic: missing Debian packages: ${missing[*]}; run as root (sudo make ...) or: apt-get install ${missing[*]}" >&2
        exit 1
    fi
    echo "embnic: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # tshark (wireshark-common) asks whether non-root users may capture: answer no, ahead, so that
    # no prompt waits for a stdin that CI does not have
    if printf '%s\n' "${missing[@]}" | grep -qx tshark; then
        echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
    fi
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python package (editable, with the test extras and, unless EMBNIC_TORCH=0, the `torch` extra:
# torch 2.14.1, fbgemm-gpu-cpu 1.9.0 and torchrec's other runtime dependencies; about 5.5 GB,
# taken from the local wheel cache where pip has one). torchrec 1.9.2 follows WITHOUT its
# dependencies: it declares the CUDA fbgemm-gpu, which clashes with fbgemm-gpu-cpu (one import
# name, fbgemm_gpu). PIP_BREAK_SYSTEM_PACKAGES lets Debian's own python3 accept it; a venv or
# pyenv python ignores it.
# The `bmv2` extra (the Thrift runtime, small) and the `p4runtime` extra (finsy, grpcio, protobuf:
# the P4Runtime client, ~15 MB) come along so that wherever BMv2 is installed (p4/README.md, "P4 tools")
# its runtime CLI, the P4Runtime channel and the bmv2 tests work; the `metrics` extra
# (prometheus-client, small) for the card's exporter and the shards' metrics endpoints; the `disk`
# extra (rocksdict, a wheel with RocksDB inside, ~10 MB) for the shards' disk tier and its tests.
extras="test,bmv2,p4runtime,metrics,disk"
probe="import embnic.client_lib, hypothesis, pytest, thrift, prometheus_client, rocksdict, grpc, finsy.proto"
torch=0
if [ "${EMBNIC_TORCH:-1}" != 0 ]; then
    extras="$extras,torch"
    probe="$probe, torch, torchrec, fbgemm_gpu"
    torch=1
fi
# The package's build tools in this Python itself (a fresh pyenv has setuptools 65 and no wheel;
# for `pip wheel`): `make libs` runs setup.py with them, and the packaging tests build without isolation.
if ! "$PY" -c "import setuptools, wheel, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" >/dev/null 2>&1; then
    PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip install -q --disable-pip-version-check 'setuptools>=77' wheel
fi
# (the editable install also builds the package's C libraries in place: setup.py; `make libs` rebuilds
# them when their sources change)
if ! "$PY" -c "$probe" >/dev/null 2>&1 || [ "$top/pyproject.toml" -nt "$top/.deps-stamp" ] \
        || [ "$top/setup.py" -nt "$top/.deps-stamp" ]; then
    PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip install -q --disable-pip-version-check -e "$top[$extras]"
    if [ "$torch" = 1 ]; then
        PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip install -q --disable-pip-version-check --no-deps torchrec==1.9.2
        "$PY" -c "import torch, torchrec, fbgemm_gpu" \
            || { echo "embnic: torch/torchrec/fbgemm_gpu installed but do not import (see above)" >&2; exit 1; }
    fi
    touch "$top/.deps-stamp"
fi

# DPDK's SWX pipeline headers that libdpdk-dev lacks, for the p4dpdk target (the P4 card for PNA
# compiled by p4c-dpdk): from Debian's source package of the installed DPDK, with a private
# sources list (scripts/dpdk-pipeline-headers.sh). Not fatal: without them the p4dpdk target and
# its tests say what is missing and how to get it.
if [ "$(id -u)" = 0 ]; then
    "$here/dpdk-pipeline-headers.sh" >/dev/null \
        || echo "embnic: DPDK pipeline headers not fetched (see above): the p4dpdk target cannot build its pipeline" >&2
fi
