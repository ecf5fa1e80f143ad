"""Every control-plane command says what it does, with an example, under --help.

Run alone: python3 -m pytest -q tests/control/test_cli_help.py
"""
from __future__ import annotations

import click
import pytest

from embnic.control.cli import cli

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
