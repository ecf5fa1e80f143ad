"""How DLRM workers under a real ``torchrun`` end (issue 34): a peer rank that dies and Ctrl-C
are one line on each worker's stderr, never a traceback (embnic.testbed.training.dlrm_workers
``main``). Two local gloo ranks on loopback shards (no card, no root); torchrun keeps each rank's
stderr apart (``--redirects 2 --log-dir``). torchrun's own failure summary (a traceback of the
launcher, then its table of failures) is torchrun's and is not checked here.

Run alone: python3 -m pytest -q tests/testbed/test_workers_endings.py   (needs embnic[torch])
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchrec")

from embnic.client_lib.config import parse_config  # noqa: E402
from embnic.testbed.net.toml_writer import dump_toml  # noqa: E402
from embnic.testbed.server.runner import ServerCluster  # noqa: E402
from embnic.testbed.training.dlrm_workers import _first_line, peer_lost  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = shutil.which("torchrun") or ""


def _free(kind=socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def loopback_cfg(tmp_path):
    """Clients 1, 2 on 127.0.0.1 (two ranks of one host) and two shards serving on loopback."""
    raw = tomllib.loads((REPO / "examples" / "testbed-shared.toml").read_text())
    raw.pop("card", None)
    raw.pop("control", None)
    raw["clients"] = [dict(id=i, ip="127.0.0.1", port=_free()) for i in (1, 2)]
    raw["shards"] = [dict(id=i, ip="127.0.0.1", port=_free()) for i in (0, 1)]
    raw["tables"] = [{"id": i, "name": n, "rows": 4096, "dim": 4, "optimizer": "sgd", "lr": 0.05}
                     for i, n in enumerate("abc")]
    with ServerCluster(parse_config(raw)) as cl:
        for s, real in zip(raw["shards"], cl.cfg.shards):
            s["port"] = real.port
        p = tmp_path / "cfg.toml"
        p.write_text(dump_toml(raw))
        yield p


def _start(cfg: Path, logs: Path) -> subprocess.Popen:
    argv = [TORCHRUN, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(_free(socket.SOCK_STREAM)),
            "--redirects", "2", "--log-dir", str(logs), "-m", "embnic.testbed.training.dlrm_workers", "-c", str(cfg),
            "--client-id-base", "1", "--steps", "100000", "--batch-size", "8", "--max-rows", "200"]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    seen = set()
    deadline = time.monotonic() + 240
    for line in p.stdout:  # both ranks have stepped: the process group is up, training runs
        if line.startswith("rank ") and " step " in line and int(line.split()[5]) >= 3:
            seen.add(line.split()[1])
        if seen == {"0", "1"} or time.monotonic() > deadline:
            break
    assert seen == {"0", "1"}, "the workers did not start training"
    return p


def _worker_pid(torchrun: subprocess.Popen, rank: int) -> int:
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == torchrun.pid and f"RANK={rank}".encode() in env:
            return int(d.name)
    raise AssertionError(f"no rank {rank} under torchrun {torchrun.pid}")


#: torch's and gloo's own log records (``[rank0]:W1202 04:35:07.009000 ...``, ``[W1202 ...]``): not ours
_TORCH_LOG = re.compile(r"^(\[rank\d+\]:)?\[?[WIE]\d{4} \d\d:\d\d:\d\d")


def _stderr_lines(logs: Path, rank: int) -> list[str]:
    """The rank's stderr, less torch's own log records (warnings at import, gloo's notes); a
    traceback is kept whole."""
    (f,) = logs.glob(f"*/attempt_0/{rank}/stderr.log")
    text = f.read_text()
    assert "Traceback" not in text, text
    return [ln for ln in text.splitlines() if ln.strip() and not _TORCH_LOG.match(ln)]


def _finish(p: subprocess.Popen) -> int:
    try:
        p.stdout.read()
        return p.wait(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@pytest.mark.skipif(not TORCHRUN, reason="torchrun is not on PATH (embnic[torch])")
def test_a_peer_that_dies_is_one_line(loopback_cfg, tmp_path):
    logs = tmp_path / "logs"
    p = _start(loopback_cfg, logs)
    os.kill(_worker_pid(p, 1), signal.SIGKILL)
    assert _finish(p) != 0
    assert _stderr_lines(logs, 1) == []  # SIGKILLed: nothing to say
    lines = _stderr_lines(logs, 0)
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: rank 0: a peer rank is gone (") or lines[0].startswith(
        "rank 0: stopped by SIGTERM"), lines


@pytest.mark.skipif(not TORCHRUN, reason="torchrun is not on PATH (embnic[torch])")
def test_ctrl_c_is_one_line_per_rank(loopback_cfg, tmp_path):
    logs = tmp_path / "logs"
    p = _start(loopback_cfg, logs)
    os.killpg(p.pid, signal.SIGINT)  # as a terminal's Ctrl-C: torchrun and both workers
    assert _finish(p) != 0
    for rank in (0, 1):
        lines = _stderr_lines(logs, rank)
        assert len(lines) <= 1 and not any("Traceback" in ln for ln in lines), lines
        assert all(ln.startswith((f"rank {rank}: interrupted (Ctrl-C)", f"rank {rank}: stopped by SIGTERM",
                                  f"error: rank {rank}: a peer rank is gone")) for ln in lines), lines
    assert _stderr_lines(logs, 0) or _stderr_lines(logs, 1)


def test_gloo_errors_are_told_from_others():
    e = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
                     "[127.0.0.1]:28858: Connection reset by peer. This is typically caused by a remote worker "
                     "hanging or bugs in the application.\nException raised from ...")
    assert peer_lost(e) and _first_line(e) == "Read error [127.0.0.1]:28858: Connection reset by peer"
    assert not peer_lost(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) and not peer_lost(ValueError("x"))
