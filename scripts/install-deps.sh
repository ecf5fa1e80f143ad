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
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python package (editable, with test extras). PIP_BREAK_SYSTEM_PACKAGES lets Debian's own
# python3 accept it; a venv or pyenv python ignores it.
if ! "$PY" -c "import embnic.client_lib, hypothesis, pytest" >/dev/null 2>&1 \
   || [ "$top/pyproject.toml" -nt "$top/.deps-stamp" ]; then
    PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip install -q --disable-pip-version-check -e "$top[test]"
    touch "$top/.deps-stamp"
fi
