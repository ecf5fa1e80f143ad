"""Fixtures of the control-plane tests: isolated run dir and env, a fake card, fake embnic-dp ELFs.

Run alone: python3 -m pytest -q tests/control
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from embnic.cli.main import cli

import ctl_elf
from ctl_fake_card import FakeCard

CARD_TOML = """
[cluster]
name = "t"
udp_port = 7878

[[tables]]
id = 0
rows = 100
dim = 4

[[shards]]
id = 0
ip = "10.0.1.2"
port = 7878
mac = "02:00:00:00:01:02"
card_port = 1

[[shards]]
id = 1
ip = "10.0.1.3"
port = 7879
mac = "02:00:00:00:01:03"
card_port = 2

[[clients]]
id = 1
ip = "10.0.0.2"
port = 40000
mac = "02:00:00:00:00:02"
card_port = 0

[card]
ports = [ { id = 0, ip = "10.0.0.1" }, { id = 1, ip = "10.0.1.1" }, { id = 2, ip = "10.0.2.1" } ]
ring_size = 1024
state_size = 4096
lcores = "0"
"""


@pytest.fixture
def sockdir():
    """A short directory for UNIX sockets (paths must stay under 108 bytes)."""
    d = tempfile.mkdtemp(prefix="enc")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def env(monkeypatch, sockdir):
    """EMBNIC_* cleared, EMBNIC_RUN_DIR set to a fresh directory; returns that directory."""
    for k in list(os.environ):
        if k.startswith("EMBNIC_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("EMBNIC_RUN_DIR", str(sockdir))
    return sockdir


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def invoke(runner, env):
    """``invoke("route", "list")`` → click Result (stdout and stderr in ``.output``)."""

    def run(*args, **kw):
        return runner.invoke(cli, [str(a) for a in args], catch_exceptions=False, **kw)

    return run


@pytest.fixture
def card(env):
    """A fake card serving RUN_DIR/embnic.sock (the default control socket)."""
    c = FakeCard(str(env / "embnic.sock")).start()
    yield c
    c.stop()


@pytest.fixture
def card_config(tmp_path):
    p = tmp_path / "card.toml"
    p.write_text(CARD_TOML)
    return p


@pytest.fixture(scope="session")
def fake_dp_factory(tmp_path_factory):
    """``fake_dp_factory(proto_version=1)`` → path of a stand-in embnic-dp ELF (cached per arguments)."""
    if not ctl_elf.have_cc():
        pytest.fail("gcc not installed: cannot build the stand-in embnic-dp (scripts/install-deps.sh installs "
                    "build-essential)")
    d = tmp_path_factory.mktemp("fakedp")
    cache = {}

    def make(**kw):
        key = tuple(sorted((k, str(v)) for k, v in kw.items()))
        if key not in cache:
            cache[key] = ctl_elf.build_fake_dp(d / f"embnic-dp-{len(cache)}", **kw)
        return cache[key]

    return make
