"""The shard as a module of the library: ``python -m embnic.testbed.server`` (what the testbed starts).

Run alone: python3 -m pytest -q tests/testbed/test_server_module.py
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np

from embnic.client_lib import codec
from embnic.client_lib.consts import MsgType


def _cfg(tmp_path, port: int):
    p = tmp_path / "c.toml"
    p.write_text(f"""
[cluster]
seed = 1
[[tables]]
id = 0
rows = 100
dim = 4
[[shards]]
id = 0
ip = "127.0.0.1"
port = {port}
[[clients]]
id = 1
ip = "127.0.0.1"
port = 40001
""")
    return p


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(*args):
    return subprocess.Popen([sys.executable, "-m", "embnic.testbed.server", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def test_module_serves_a_lookup_and_stops_on_sigterm_with_its_counters(tmp_path):
    port = _free_udp_port()
    p = _run("--shard", "0", "--config", str(_cfg(tmp_path, port)))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(0.2)
    try:
        keys = np.array([3, 7], dtype=np.uint64)
        frames = codec.encode_lookup(msg_id=1, client_id=1, shard_id=0, keys=keys,
                                     directory=codec.make_directory([0], [4], [1], [2]))
        deadline = time.monotonic() + 30
        reply = None
        while reply is None and time.monotonic() < deadline:  # readiness: it answers
            assert p.poll() is None, p.communicate()
            for f in frames:
                sock.sendto(f, ("127.0.0.1", port))
            try:
                reply = sock.recv(65536)
            except socket.timeout:
                pass
        assert reply is not None, "no reply within 30 s"
        h = codec.parse_header(reply, expect="reply")
        assert h.msg_type == MsgType.LOOKUP_REPLY and h.msg_id == 1 and h.num_keys == 2 and h.value_len == 32
    finally:
        sock.close()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert f"shard 0 listening on 127.0.0.1:{port}" in err and "embnic-server[" in err
    assert "stopped; counters {" in err


def test_module_refuses_a_shard_the_config_lacks_with_exit_2(tmp_path):
    p = _run("--shard", "5", "--config", str(_cfg(tmp_path, 17899)))
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and err.strip() == f"Error: no shard 5 in {tmp_path / 'c.toml'} (shards: 0)"


def test_module_names_the_address_it_cannot_bind_with_exit_1(tmp_path):
    holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    holder.bind(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    try:
        p = _run("--shard", "0", "--config", str(_cfg(tmp_path, port)))
        _, err = p.communicate(timeout=60)
    finally:
        holder.close()
    assert p.returncode == 1 and f"cannot bind 127.0.0.1:{port}: address already in use" in err


# One set of option checks for both entry points (foreground.check_server_options); found by a
# new user: the module accepted --port 70000 (a traceback), a missing --restore source
# (it made /that/dir/shard-0/ and served empty tables), --bind 999.1.1.1 (exit 1), no -c.
BAD_OPTIONS = [
    (["--port", "70000"], "--port 70000"),
    (["--metrics-port", "99999"], "--metrics-port 99999"),
    (["--dedup-window", "-5"], "--dedup-window -5"),
    (["--checkpoint-every", "-1"], "--checkpoint-every -1"),
    (["--bind", "999.1.1.1"], "--bind 999.1.1.1"),
    (["--metrics-bind", "nowhere"], "--metrics-bind nowhere"),
]


def _bad_cases(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    missing = tmp_path / "missing"
    return BAD_OPTIONS + [
        (["--checkpoint-dir", str(afile)], f"--checkpoint-dir {afile}: not a directory"),
        (["--restore", str(missing)], f"--restore {missing}: no such directory"),
        (["--restore", str(afile)], f"--restore {afile}: not a directory"),
    ], missing


def test_module_and_cli_refuse_the_same_bad_options_in_one_line_with_exit_2(tmp_path):
    from click.testing import CliRunner

    from embnic.cli.main import cli

    cfg = str(_cfg(tmp_path, 17898))
    cases, missing = _bad_cases(tmp_path)
    for extra, named in cases:
        p = _run("--shard", "0", "-c", cfg, *extra)
        out, err = p.communicate(timeout=60)
        lines = err.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"Error: {named}"), (extra, err)
        r = CliRunner().invoke(cli, ["server", "--shard", "0", "-c", cfg, *extra])
        assert r.exit_code == 2 and f"Error: {named}" in r.output, (extra, r.output)
        assert lines[0] in r.output  # the same words from both entry points
    assert not missing.exists()  # the restore source was not created (no shard-0/ in it)


def test_module_usage_errors_are_one_line_and_a_hint(tmp_path):
    p = _run("--shard", "0", "-c", str(_cfg(tmp_path, 17897)), "--dedup-window", "two")
    _, err = p.communicate(timeout=60)
    lines = err.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 2, err
    assert lines[0].startswith("python -m embnic.testbed.server: error: argument --dedup-window")
    assert "--help" in lines[1]


def test_cli_workers_is_gone_in_one_line_naming_more_shards(tmp_path):
    """``embnic server --workers N`` (one shard in N processes, gone: docs/server.md "More cores:
    more shards") is refused before anything starts, in one line naming the fix."""
    from click.testing import CliRunner

    from embnic.cli.main import cli

    r = CliRunner().invoke(cli, ["server", "--shard", "0", "-c", str(_cfg(tmp_path, 17896)), "--workers", "2"])
    assert r.exit_code == 2 and "--workers is gone" in r.output and "run more shards" in r.output, r.output


def test_a_missing_shard_library_stops_the_shard_at_start_in_one_line(tmp_path):
    """The shard's C library is its one production path: without it (or built from other sources)
    the shard does not start — one line naming the rebuild command, exit 1, through the module
    and ``embnic server`` — and nothing is bound."""
    port = _free_udp_port()
    cfg = str(_cfg(tmp_path, port))
    env = dict(os.environ, EMBNIC_SHARD_LIB=str(tmp_path / "absent.so"))
    for cmd in (["-m", "embnic.testbed.server", "--shard", "0", "--config", cfg],
                ["-m", "embnic", "server", "--shard", "0", "-c", cfg]):
        r = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 1, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "absent.so" in r.stderr, r.stderr
        assert "pip install -e ." in r.stderr, r.stderr
