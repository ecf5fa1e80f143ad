"""The CLI maps the library's error categories to click errors and exit codes in one place.

Run alone: python3 -m pytest -q tests/control/test_cli_errors.py
"""
from __future__ import annotations

import os
import shutil

import click
import pytest
from click.testing import CliRunner

from embnic.client_lib.config import ConfigError
from embnic.control import errors as E
from embnic.cli.main import OneLineUsageGroup, _map_errors, cli, to_click
from embnic.control.pcap import write_pcap

CASES = [
    (E.UsageError("no DPDK ports: give one --vdev per card port", param="vdevs"), click.UsageError, 2),
    (E.OperationalError("pipeline not loaded: run `embnic pipeline load`"), click.ClickException, 1),
    (E.NeedsRootError("testbed up needs root: run as root (sudo embnic ...)"), click.ClickException, 2),
    (E.MissingDependencyError("simple_switch is not installed: apt-get install ...", dependency="simple_switch"),
     click.ClickException, 2),
    (ConfigError("card.ports[0].ip", "not an IPv4 address", "t.toml"), click.ClickException, 2),
]


@pytest.mark.parametrize("err,cls,code", CASES, ids=lambda c: getattr(c, "category", None) or type(c).__name__)
def test_to_click_by_category(err, cls, code):
    out = to_click(err)
    assert type(out) is cls and out.exit_code == code
    assert out.format_message() == str(err)


def test_categories_and_exit_codes_are_the_documented_ones():
    assert E.EXIT_CODES == {"usage": 2, "operational": 1, "needs-root": 2, "missing-dependency": 2}
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "cli.md")).read()
    for cat, code in E.EXIT_CODES.items():
        assert f"| `{cat}` | `{code}` |" in doc, cat


def test_subclasses_keep_or_change_their_category():
    from embnic.control.buildinfo import BinaryArgumentError, BinaryPermissionError
    from embnic.control.ctlsock import CtlNotLoaded, CtlPermission
    from embnic.testbed.net.topology import NeedsRoot, TestbedError
    from embnic.testbed.traces.trace import ConfigMismatch, TraceError
    from embnic.testbed.training.demo import DemoError

    assert {c.category for c in (CtlNotLoaded, TestbedError, TraceError, DemoError)} == {"operational"}
    assert {c.category for c in (CtlPermission, BinaryPermissionError, NeedsRoot)} == {"needs-root"}
    assert BinaryArgumentError.category == ConfigMismatch.category == "usage"


def test_the_testbed_root_check_is_the_one_root_check(monkeypatch):
    from embnic.control import runstate
    from embnic.testbed.net.procs import NeedsRoot, require_net_admin

    monkeypatch.setattr(runstate, "is_root", lambda: False)
    with pytest.raises(NeedsRoot, match=r"^testbed up \(x\) needs root \(CAP_NET_ADMIN") as e:
        require_net_admin("testbed up (x)")
    assert isinstance(e.value, E.NeedsRootError) and e.value.exit_code == 2
    monkeypatch.setattr(runstate, "is_root", lambda: True)
    require_net_admin("testbed up (x)")


@pytest.mark.parametrize("err,cls,code", CASES, ids=lambda c: getattr(c, "category", None) or type(c).__name__)
def test_a_command_raising_it_exits_with_its_code(err, cls, code):
    @click.group(cls=OneLineUsageGroup)
    def grp():
        """group"""

    @grp.command("do")
    def do():
        raise err

    r = CliRunner().invoke(_map_errors(grp), ["do"], catch_exceptions=False)
    assert r.exit_code == code, r.output
    assert f"Error: {err}" in r.output
    # every error is one line; a usage error names the --help of the command that raised it
    assert len(r.output.strip().splitlines()) == 1, r.output
    assert "Usage:" not in r.output and "Try '" not in r.output
    assert ("(see 'grp do --help')" in r.output) == (cls is click.UsageError)


def test_library_modules_raise_no_click_errors(invoke, card_config):
    """A usage error of the dpdk target (no vdevs) reaches the user as exit 2 with the command's usage."""
    r = invoke("pipeline", "load", "-c", card_config)
    assert r.exit_code == 2, r.output
    assert "no DPDK ports: give one --vdev per card port" in r.output and "(see 'cli pipeline load --help')" in r.output


def test_operational_error_of_the_control_socket(invoke):
    r = invoke("route", "list")
    assert r.exit_code == 1 and "pipeline not loaded: no control socket at" in r.output


@pytest.mark.skipif(os.geteuid() != 0, reason="replay checks root before its dependencies")
def test_missing_program_is_a_missing_dependency(invoke, tmp_path, monkeypatch):
    pcap = tmp_path / "t.pcap"
    write_pcap(pcap, [])
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    r = invoke("replay", pcap, "-c", os.path.join(os.path.dirname(__file__), "..", "..", "examples", "testbed.toml"))
    assert r.exit_code == 2, r.output
    assert "Error: tcpreplay is not installed: apt-get install tcpreplay" in r.output


def test_a_file_that_is_not_what_it_claims_is_a_usage_error(invoke, tmp_path):
    """A file argument of the wrong kind exits 2 naming it, like a missing one (docs/cli.md), never 1."""
    cfg = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "testbed.toml")
    txt = tmp_path / "t.pcap"
    txt.write_text("not a capture, but text long enough for a pcap header\n")
    r = invoke("replay", txt, "-c", cfg)  # refused while parsing: before the root and tcpreplay checks
    assert r.exit_code == 2, r.output
    assert f"Error: Invalid value for 'PCAP': {txt} is not a pcap file (magic 6e6f7420; pcapng is not read): give " \
           "a trace recorded by `embnic trace record`" in r.output
    bad = tmp_path / "bad.tsv"
    bad.write_text("hello\tworld\n")
    r = invoke("train", "-c", os.path.join(os.path.dirname(__file__), "..", "..", "examples", "cluster.toml"),
               "--local", "--data", bad, "--steps", "1")
    assert r.exit_code == 2, r.output
    assert f"Error: Invalid value for --data: {bad}:1: 2 fields, expected 40" in r.output


def test_trace_library_errors_of_the_wrong_file_are_usage(tmp_path):
    from embnic.testbed.traces import trace as TR
    from embnic.testbed.training.criteo import CriteoFormatError

    txt = tmp_path / "t.pcap"
    txt.write_text("hello")
    with pytest.raises(TR.TraceUsageError, match="is not a pcap file .*: give a trace recorded by") as e:
        TR.read_pcap(txt)
    assert e.value.exit_code == 2 and isinstance(e.value, TR.TraceError)
    assert CriteoFormatError.category == E.USAGE
    with pytest.raises(TR.TraceError) as e:
        TR.read_pcap(tmp_path / "none.pcap")  # unreadable: operational
    assert e.value.exit_code == 1


def _leaf_paths(cmd, path=()):
    ctx = click.Context(cmd)
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            yield from _leaf_paths(cmd.get_command(ctx, name), path + (name,))
    else:
        yield path


@pytest.mark.parametrize("args,where", [(("--no-such-flag",), "cli"), (("no-such-command",), "cli"),
                                        (("config", "nope"), "cli config")])
def test_click_usage_errors_are_one_line(invoke, args, where):
    r = invoke(*args)
    assert r.exit_code == 2
    assert r.output.startswith("Error: ") and r.output.rstrip().endswith(f"(see '{where} --help')"), r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


def test_every_command_shows_a_usage_error_as_one_line(invoke):
    """Not click's three lines (Usage: / Try '... --help' for help. / Error: ...): one line, exit 2."""
    paths = list(_leaf_paths(cli))
    assert len(paths) > 20
    for path in paths:
        r = invoke(*path, "--no-such-flag")
        assert r.exit_code == 2, (path, r.output)
        assert r.output.startswith("Error: No such option '--no-such-flag'"), (path, r.output)
        assert r.output.endswith(f" (see 'cli {' '.join(path)} --help')\n"), (path, r.output)
        assert len(r.output.splitlines()) == 1, (path, r.output)


@pytest.mark.parametrize("args,where", [(("testbed", "up", "--pmd"), "cli testbed up"),
                                        (("route", "add", "--port"), "cli route add"),
                                        (("plan", "--batch"), "cli plan")])
def test_an_option_missing_its_value_names_the_subcommand(invoke, args, where):
    """click raises "requires an argument" without a context: the hint named 'embnic --help'."""
    r = invoke(*args)
    assert r.exit_code == 2
    assert r.output == f"Error: Option '{args[-1]}' requires an argument (see '{where} --help')\n", r.output


def test_a_group_without_a_subcommand_still_shows_its_help(invoke):
    r = invoke("config")
    assert "Usage: cli config" in r.output and "Commands:" in r.output


def test_trace_replay_and_the_top_level_replay_are_one_command(invoke, tmp_path):
    """`embnic trace replay` is the command; `embnic replay` (its name before it joined `trace`) stays
    as an alias: the same options, the same checks, the same exit code and message."""
    from embnic.cli.main import cli

    alias, sub = cli.get_command(None, "replay"), cli.get_command(None, "trace").get_command(None, "replay")
    assert alias is sub
    helps = [invoke(*path, "--help") for path in (["replay"], ["trace", "replay"])]
    assert [r.exit_code for r in helps] == [0, 0]
    assert helps[0].output.split("Options:")[1] == helps[1].output.split("Options:")[1]
    cfg = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "testbed.toml")
    txt = tmp_path / "t.pcap"
    txt.write_text("not a capture, but text long enough for a pcap header\n")
    for path in (["replay"], ["trace", "replay"]):
        r = invoke(*path, txt, "-c", cfg)
        assert r.exit_code == 2, r.output
        assert "is not a pcap file (magic 6e6f7420; pcapng is not read)" in r.output
        assert f" {' '.join(path)} --help')" in r.output  # the hint names the path it was called by
