"""Every control-plane command says what it does, with an example, under --help; the examples run.

Run alone: python3 -m pytest -q tests/control/test_cli_help.py
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path

import click
import pytest

from embnic.client_lib.config import load_config
from embnic.cli.main import cli
from embnic.control.runstate import read_state
from embnic.control.targets.dpdk.target import DpdkTarget

REPO = Path(__file__).resolve().parents[2]

MINE = ("config", "pipeline", "route", "client", "status", "state", "inspect")


def _walk(cmd, path):
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from _walk(sub, path + [name])


def _all():
    out = []
    for name in MINE:
        cmd = cli.get_command(None, name)
        assert cmd is not None, f"command {name} not found"
        out.extend(_walk(cmd, [name]))
    return out


def test_top_level_help_lists_my_commands(invoke):
    r = invoke("--help")
    assert r.exit_code == 0
    for name in MINE:
        assert f"  {name} " in r.output, name


@pytest.mark.parametrize("path", [p for p, _ in _all()], ids=lambda p: " ".join(p))
def test_help_has_example(invoke, path):
    r = invoke(*path, "--help")
    assert r.exit_code == 0, r.output
    assert "Example" in r.output, f"`embnic {' '.join(path)} --help` has no example"
    # the example comes last in the description, before the options
    desc = r.output.split("Options:")[0]
    assert f"embnic {path[0]}" in desc.split("Example")[-1]


def test_unknown_option_is_usage_error(invoke):
    r = invoke("route", "list", "--bogus")
    assert r.exit_code == 2
    assert "No such option" in r.output


def test_target_choices_are_the_registered_targets(invoke):
    """`--target bmv2` was listed everywhere but answered "no target 'bmv2'"."""
    from embnic.control.targets.base import target_names

    for path in (["pipeline", "load"], ["route", "list"], ["status"], ["state", "dump"]):
        out = " ".join(invoke(*path, "--help").output.split())
        assert f"--target [{'|'.join(target_names())}]" in out, path
        assert "bmv2 the P4 program on simple_switch" in out
        assert "[dpdk|bmv2]" not in out


def test_target_registered_later_is_accepted(invoke, card, monkeypatch):
    from embnic.control.targets import base as T
    from embnic.control.targets.dpdk.target import DpdkTarget

    monkeypatch.setitem(T._REGISTRY, "other", DpdkTarget)
    assert "--target [bmv2|dpdk|other|p4dpdk]" in invoke("status", "--help").output
    assert invoke("status", "--target", "other").exit_code == 0
    r = invoke("status", "--target", "p4nic")
    assert r.exit_code == 2 and "no target 'p4nic'; available: bmv2, dpdk, other, p4dpdk" in r.output


# --------------------------------------------------------------------------- the examples run
def _examples():
    """(command path, argv) of every `embnic ...` line in the help of my commands."""
    out, seen = [], set()
    for path, cmd in _all():
        for line in (cmd.help or "").splitlines():
            line = line.strip()
            if not line.startswith(f"embnic {path[0]}") or "..." in line or line in seen:
                continue
            seen.add(line)
            out.append((path, shlex.split(line)[1:]))
    return out


EXAMPLES = _examples()
TESTBED = REPO / "examples" / "testbed.toml"
TESTBED_VDEVS = [a for i in range(4) for a in ("--vdev", f"net_ring{i}")]


def test_examples_were_found():
    assert len(EXAMPLES) >= 20
    assert {p[0] for p, _ in EXAMPLES} == set(MINE)


@pytest.mark.parametrize("argv", [a for _, a in EXAMPLES], ids=lambda a: " ".join(a))
def test_example_ids_exist_in_the_example_config(argv):
    """`embnic client add 0 --config examples/testbed.toml` failed: testbed.toml has clients 1 and 2."""
    for a in argv:
        if a.startswith("examples/"):
            assert (REPO / a).is_file(), a
    if argv[0] in ("route", "client") and argv[1] in ("add", "del"):
        cfg = load_config(TESTBED)
        ids = {e.id for e in (cfg.shards if argv[0] == "route" else cfg.clients)}
        assert int(argv[2]) in ids, f"{argv[0]} id {argv[2]} is not in examples/testbed.toml ({sorted(ids)})"


@pytest.fixture
def example_env(env, monkeypatch, fake_dp_factory):
    """cwd = the repo (examples name repo paths); the stand-in embnic-dp as EMBNIC_DP (it runs as any user)."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("EMBNIC_DP", str(fake_dp_factory()))
    monkeypatch.setattr(DpdkTarget, "NEEDS_ROOT", False)
    return env


@pytest.mark.parametrize("argv", [a for _, a in EXAMPLES], ids=lambda a: " ".join(a))
def test_example_runs(invoke, example_env, argv, monkeypatch):
    """Every help example runs: against a fake card programmed from examples/testbed.toml, or
    (pipeline) the stand-in embnic-dp loaded with that config."""
    from ctl_fake_card import FakeCard

    env = example_env
    if "--watch" in argv:  # Ctrl-C after the first sample
        import embnic.cli.commands.status as cs

        def ctrl_c(_sec):
            raise KeyboardInterrupt

        monkeypatch.setattr(cs.time, "sleep", ctrl_c)
    if argv[0] == "inspect":  # the real card binary: build it (a no-op when up to date), never skip
        import subprocess

        b = subprocess.run(["make", "-s", "-C", str(REPO / "dataplane")], capture_output=True, text=True)
        assert b.returncode == 0, f"make -C dataplane failed:\n{b.stdout[-2000:]}\n{b.stderr[-2000:]}"
    if argv[0] == "pipeline":
        try:
            if argv[1] != "load":
                r = invoke("pipeline", "load", "-c", TESTBED, *TESTBED_VDEVS)
                assert r.exit_code == 0, r.output
            r = invoke(*argv)
            assert r.exit_code == 0, r.output
        finally:
            if read_state(env, "embnic") is not None:
                invoke("pipeline", "unload")
        return
    cfg = load_config(TESTBED)
    card = FakeCard(str(env / "embnic.sock"), ports=[
        {"port": p.id, "name": f"net_ring{p.id}", "mac": p.mac, "ip": p.ip} for p in cfg.card.ports]).start()
    try:
        for kind, eps in (("shard", cfg.shards), ("client", cfg.clients)):
            for e in eps:
                (card.routes if kind == "shard" else card.clients)[e.id] = {
                    kind: e.id, "port": e.card_port, "mac": e.mac, "ip": e.ip, "udp_port": e.port}
        r = invoke(*argv)
        assert r.exit_code == 0, r.output
    finally:
        card.stop()


def test_every_float_option_refuses_nan_and_inf(invoke):
    """click's FloatRange checks the bounds only, so `nan` passed them all (`--loss nan` reached
    netem, `testbed up --timeout nan` probed forever): every float option refuses it, exit 2."""
    cmds = [pc for name in cli.list_commands(None) for pc in _walk(cli.get_command(None, name), [name])]
    floats = [(path, p) for path, cmd in cmds for p in cmd.params if isinstance(p.type, click.FloatRange)]
    assert len(floats) >= 19  # --loss, --timeout, --rate, --watch, ... of every command
    for path, p in floats:
        for bad in ("nan", "inf", "-inf"):
            with pytest.raises(click.BadParameter, match="not a finite number|not in the range"):
                p.type.convert(bad, p, None)
    r = invoke("testbed", "netem", "--loss", "nan")
    assert r.exit_code == 2 and "'nan' is not a finite number" in r.output, r.output
