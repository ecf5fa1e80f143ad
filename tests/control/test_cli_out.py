"""One rule for every output path (issue 34; docs/cli.md "Output paths",
``embnic.cli.commands.options.OutPath``): a folder is created with its parents, a file goes
into a folder that must exist; a fault is one usage line naming the path and the fix (exit 2),
before anything runs (before the root check of the testbed commands). Before, ``trace record``,
``demo`` and ``trace replay`` created a missing folder while ``tables`` and ``train`` refused one.

Run alone: python3 -m pytest -q tests/control/test_cli_out.py
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from embnic.cli.main import cli
from embnic.cli.commands.options import OutPath, out_path_problem
from embnic.control.pcap import write_pcap

ROOT = Path(__file__).resolve().parents[2]
TESTBED = str(ROOT / "examples" / "testbed.toml")


def _run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="embnic")


# (command words before the path, the option, words after; the path given as OUT, a pcap as PCAP)
FILE_OUTPUTS = [
    (["trace", "record", "-c", TESTBED, "--batches", "1", "--out"], "--out", []),
    (["tables", "export", "-c", TESTBED, "--from", "FROM", "--out"], "--out", []),
    (["dissector", "--out"], "--out", []),
    (["train", "-c", TESTBED, "--local", "--steps", "1", "--json-out"], "--json-out", []),
]
DIR_OUTPUTS = [
    (["demo", "--steps", "1", "--out"], "--out", []),
    (["trace", "replay", "PCAP", "-c", TESTBED, "--out"], "--out", []),
    (["replay", "PCAP", "-c", TESTBED, "--out"], "--out", []),
    (["bench", "prep", "--out"], "--out", []),
    (["bench", "server", "--out"], "--out", []),
    (["tables", "import", "-c", TESTBED, "PCAP", "--into"], "--into", []),
]


def _argv(words, path, tmp_path):
    pcap = tmp_path / "t.pcap"
    if not pcap.exists():
        write_pcap(pcap, [])
    (tmp_path / "from").mkdir(exist_ok=True)
    subst = {"PCAP": str(pcap), "FROM": str(tmp_path / "from")}
    return [subst.get(w, w) for w in words] + [str(path)]


def _one_usage_line(r, option, *needles):
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: Invalid value for '{option}'"), r.output
    for n in needles:
        assert n in lines[0], r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("words,option,_", FILE_OUTPUTS, ids=lambda a: " ".join(a[:2]) if isinstance(a, list) else None)
def test_a_file_in_a_missing_folder_is_refused_naming_mkdir(words, option, _, tmp_path):
    missing = tmp_path / "no" / "such"
    r = _run(*_argv(words, missing / "x.out", tmp_path))
    _one_usage_line(r, option, f"folder {missing} does not exist", f"mkdir -p {missing}")
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("words,option,_", FILE_OUTPUTS, ids=lambda a: " ".join(a[:2]) if isinstance(a, list) else None)
def test_a_folder_given_as_a_file_is_refused(words, option, _, tmp_path):
    r = _run(*_argv(words, tmp_path, tmp_path))
    _one_usage_line(r, option, f"{tmp_path} is a folder: give a file name")


@pytest.mark.parametrize("words,option,_", DIR_OUTPUTS, ids=lambda a: " ".join(a[:2]) if isinstance(a, list) else None)
def test_a_file_given_as_a_folder_is_refused(words, option, _, tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    r = _run(*_argv(words, f, tmp_path))
    _one_usage_line(r, option, f"{f} is a file: give a folder")
    r = _run(*_argv(words, f / "sub", tmp_path))
    _one_usage_line(r, option, f"{f} is a file, so folder {f / 'sub'} cannot be created")


def test_a_missing_folder_is_created_with_its_parents(tmp_path):
    out = tmp_path / "a" / "b" / "bench"
    r = _run("bench", "prep", "--out", out, "--batch-size", "64", "--repeats", "1")
    assert r.exit_code == 0, r.output
    assert json.loads((out / "bench.json").read_text())


def test_a_file_in_an_existing_folder_is_written(tmp_path):
    r = _run("dissector", "--out", tmp_path / "embnic.lua")
    assert r.exit_code == 0 and (tmp_path / "embnic.lua").stat().st_size > 1000, r.output
    r = _run("train", "-c", TESTBED, "--local", "--steps", "1", "--max-rows", "64", "--json-out", tmp_path / "t.json")
    assert r.exit_code == 0 and json.loads((tmp_path / "t.json").read_text())["steps"] == 1, r.output


def test_an_unwritable_folder_is_named():
    """A folder the user may not write in is named. As root (who writes anywhere) the check runs in a
    child that drops to nobody, on a folder nobody can reach but not write."""
    base = Path(tempfile.mkdtemp(prefix="embnic-ro-"))
    try:
        base.chmod(0o755)
        ro = base / "ro"
        ro.mkdir()
        ro.chmod(0o555)

        def check() -> None:
            assert "permission denied" in out_path_problem(ro / "x.lua", "file")
            assert "no write permission in" in out_path_problem(ro / "new" / "dir", "dir")
            assert str(ro) in out_path_problem(ro / "new" / "dir", "dir")

        if os.geteuid() != 0:
            check()
            return
        pid = os.fork()
        if pid == 0:  # the child: nobody, then the check; its exit code is the verdict
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                check()
                code = 0
            except BaseException:  # noqa: BLE001 - reported through the exit code and stderr
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the check failed as nobody (its traceback is above)"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_helper_and_the_dash(tmp_path):
    assert out_path_problem(tmp_path / "x", "file") is None
    assert out_path_problem(tmp_path / "new" / "dir", "dir") is None
    assert out_path_problem(tmp_path, "dir") is None
    assert OutPath("file", allow_dash=True).convert("-", None, None) == "-"
    with pytest.raises(Exception, match="empty path"):
        OutPath("dir").convert("", None, None)
    with pytest.raises(ValueError):
        OutPath("folder")
