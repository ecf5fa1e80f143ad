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
