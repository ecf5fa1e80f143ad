"""CLI of the testbed commands: root required (exit 2, one line), argument errors, help with examples.

The no-root cases run the real CLI without CAP_NET_ADMIN/CAP_SYS_ADMIN (as root: dropped from
the capability bounding set with setpriv; as a normal user: as is).

Run alone: python3 -m pytest -q tests/testbed/test_cli_testbed.py
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from embnic.cli.main import cli
from embnic.control.pcap import write_pcap
from embnic.control.runstate import is_root, pid_matches
from embnic.testbed.net import topology as T

from tbutil import TESTBED_TOML, assert_gone, build_dataplane, cleanup, run_dir, tb_name  # noqa: F401

COMMANDS = [
    ["testbed", "up", "-c", str(TESTBED_TOML)],
    ["testbed", "down"],
    ["testbed", "status"],
    ["testbed", "netem", "--loss", "1", "--reorder", "5", "--duplicate", "1"],
    ["trace", "record", "-c", str(TESTBED_TOML), "--batches", "1", "--out", "OUT/t.pcap"],
    ["replay", "PCAP", "-c", str(TESTBED_TOML)],
    ["demo", "--steps", "1", "--out", "OUT/demo"],
]


def _unprivileged(argv: list[str]) -> list[str]:
    if os.geteuid() != 0 and not is_root():
        return argv
    if shutil.which("setpriv") is None:
        pytest.fail("running as root and setpriv (util-linux, essential in Debian) is missing to drop CAP_NET_ADMIN")
    return ["setpriv", "--bounding-set=-net_admin,-sys_admin", "--inh-caps=-net_admin,-sys_admin"] + argv


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_every_testbed_command_needs_root_and_exits_2(args, tmp_path, run_dir):  # noqa: F811
    pcap = tmp_path / "t.pcap"
    write_pcap(pcap, [])  # a pcap (replay refuses a file that is none before the root check)
    args = [str(pcap) if a == "PCAP" else a.replace("OUT", str(tmp_path)) for a in args]
    r = subprocess.run(_unprivileged([sys.executable, "-m", "embnic", *args]), capture_output=True, text=True,
                       env=dict(os.environ, EMBNIC_RUN_DIR=str(run_dir)), timeout=60)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "needs root (CAP_NET_ADMIN" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["testbed"], ["testbed", "up"], ["testbed", "down"], ["testbed", "status"],
                                  ["testbed", "netem"], ["trace"], ["trace", "record"], ["replay"], ["demo"]])
def test_help_says_what_and_gives_an_example(args):
    r = CliRunner().invoke(cli, [*args, "--help"])
    assert r.exit_code == 0, r.output
    assert "Example" in r.output and "embnic " in r.output


@pytest.mark.skipif(not is_root(), reason="argument checks run after the root check")
@pytest.mark.parametrize("args, needle", [
    (["testbed", "up"], "--config FILE is required"),
    (["testbed", "up", "-c", str(TESTBED_TOML), "--name", "9-bad"], "testbed name"),
    (["demo", "--name", "9bad", "--steps", "2"], "testbed name '9bad'"),
    (["trace", "record", "-c", str(TESTBED_TOML), "--batches", "1", "--out", "x.pcap", "--name", "9bad"],
     "testbed name '9bad'"),
    (["replay", "PCAP", "-c", str(TESTBED_TOML), "--name", "waytoolongname"], "testbed name"),
    (["replay", str(TESTBED_TOML), "-c", str(TESTBED_TOML)],
     f"Invalid value for 'PCAP': {TESTBED_TOML} is not a pcap file (magic "),
    (["testbed", "netem", "--loss", "200"], "200"),
    (["demo", "--kill-shard", "7", "--steps", "2"], "no shard 7"),
    (["demo", "--kill-shard", "1", "--kill-at-step", "50", "--steps", "5"], "--kill-at-step 50 must be between 1"),
    (["demo", "--kill-shard", "1", "--kill-at-step", "5", "--steps", "5"], "--kill-at-step 5 must be between 1"),
    (["demo", "--kill-shard", "1", "--steps", "1"], "--kill-at-step 1 must be between 1"),
    (["demo", "--kill-at-step", "2", "--steps", "5"], "--kill-at-step needs --kill-shard"),
    (["trace", "record", "-c", str(TESTBED_TOML), "--out", "x.pcap"], "--batches"),
])
def test_usage_errors_exit_2(args, needle, run_dir, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.delenv("EMBNIC_CONFIG", raising=False)
    write_pcap(tmp_path / "t.pcap", [])
    r = CliRunner().invoke(cli, [str(tmp_path / "t.pcap") if a == "PCAP" else a for a in args])
    assert r.exit_code == 2, r.output
    assert needle in r.output


@pytest.mark.skipif(not is_root(), reason="needs root")
def test_status_and_netem_of_a_testbed_that_is_not_up_exit_1(run_dir):  # noqa: F811
    for args in (["testbed", "status", "--name", "enZ0"], ["testbed", "netem", "--name", "enZ0", "--loss", "1"]):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 1, r.output
        assert "no testbed 'enZ0'" in r.output
    r = CliRunner().invoke(cli, ["testbed", "down", "--name", "enZ0"])
    assert r.exit_code == 0 and "nothing to remove" in r.output


@pytest.mark.skipif(not is_root(), reason="needs root")
def test_status_of_a_damaged_state_file_exits_1_and_says_down(run_dir):  # noqa: F811
    """A truncated testbed state file (a crash mid-write by hand, a full disk) is not a healthy testbed."""
    (run_dir / "testbed-enZ1.json").write_text('{"name": "enZ1", "netns": [')
    r = CliRunner().invoke(cli, ["testbed", "status", "--name", "enZ1"])
    assert r.exit_code == 1, r.output
    assert "state file" in r.output and "damaged" in r.output and "embnic testbed down --name enZ1" in r.output
    assert "None" not in r.output


@pytest.mark.skipif(not is_root(), reason="needs root")
@pytest.mark.parametrize("cmd", [["demo", "--steps", "2", "--name", "enZ2"],
                                 ["trace", "record", "-c", str(TESTBED_TOML), "--batches", "1", "--name", "enZ2"]])
def test_malformed_data_is_a_usage_error(cmd, run_dir, tmp_path):  # noqa: F811
    """--data that is no Criteo TSV: a usage error (exit 2) naming --data, file and line (as `embnic train`),
    not the last-resort 'CriteoFormatError: ... (run with --debug ...)'; nothing is left behind."""
    bad = tmp_path / "bad.tsv"
    bad.write_text("garbage\tline\n")
    r = _embnic(run_dir, *cmd, "--data", str(bad), "--out", str(tmp_path / "o"))
    assert r.returncode == 2, r.stderr
    where = " ".join(cmd[:2] if cmd[0] == "trace" else cmd[:1])
    assert r.stderr.strip().splitlines() == [f"Error: Invalid value for --data: {bad}:1: 2 fields, expected 40 "
                                             f"(label, I1..I13, C1..C26) or 39 (no label) (see 'embnic {where} --help')"]
    assert "Traceback" not in r.stderr
    assert not list(run_dir.glob("testbed-enZ2*.json"))


def _embnic(run_dir, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "embnic", *args], capture_output=True, text=True,
                          env=dict(os.environ, EMBNIC_RUN_DIR=str(run_dir)), timeout=timeout)


@pytest.mark.skipif(not is_root(), reason="needs root")
def test_status_names_dead_nodes_exits_1_and_says_restart(run_dir, cleanup):  # noqa: F811
    """The card and a shard killed: status says which (with logs), advises down + up, exits 1."""
    build_dataplane()
    name = tb_name("s")
    cleanup.append(name)
    r = _embnic(run_dir, "testbed", "up", "-c", str(TESTBED_TOML), "--name", name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the card: sudo embnic status" in r.stdout and "no card" not in r.stdout
    r = _embnic(run_dir, "testbed", "status", "--name", name)
    assert r.returncode == 0, r.stdout + r.stderr
    # the card's counters are formatted (the probes went through it), not a Python dict
    assert "card  frames by type: LOOKUP_REQ 4, LOOKUP_REPLY" in r.stdout, r.stdout
    assert "{" not in r.stdout and "'" not in r.stdout
    st = T.testbed_state(name)
    card = next(p for p in st["procs"] if p["role"] == "card")
    s1 = next(p for p in st["procs"] if p["node"] == "s1")
    for p in (card, s1):
        os.kill(p["pid"], signal.SIGKILL)
    for p in (card, s1):
        for _ in range(200):
            if not pid_matches(p):
                break
            time.sleep(0.01)
    r = _embnic(run_dir, "testbed", "status", "--name", name)
    assert r.returncode == 1, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in r.stderr
    assert f"the card, pid {card['pid']}, is not running: see {card['log']}" in err[0]
    assert f"shard 1's server, pid {s1['pid']}, is not running: see {s1['log']}" in err[0]
    assert f"embnic testbed down --name {name}` then `embnic testbed up" in err[0]
    assert "pipeline load" not in r.stdout + r.stderr
    assert "NOT RUNNING" in r.stdout
    # the head no longer says plain "up" over a dead card
    assert r.stdout.splitlines()[0].startswith(
        f"testbed {name}: up, degraded: the card, shard 1's server NOT RUNNING   config"), r.stdout
    # --json says the same
    r = _embnic(run_dir, "testbed", "status", "--name", name, "--json")
    assert r.returncode == 1
    js = json.loads(r.stdout)
    assert js["healthy"] is False and [d["what"] for d in js["dead"]] == ["the card", "shard 1's server"]
    assert js["card"]["running"] is False
    r = _embnic(run_dir, "testbed", "down", "--name", name)
    assert r.returncode == 0, r.stderr
    assert_gone(name)


@pytest.mark.skipif(not is_root(), reason="needs root")
def test_up_with_an_unusable_run_dir_says_so_in_one_line(tmp_path, cleanup):  # noqa: F811
    name = tb_name("r")
    cleanup.append(name)
    (tmp_path / "afile").write_text("")
    r = _embnic(tmp_path / "afile" / "run", "testbed", "up", "-c", str(TESTBED_TOML), "--name", name)
    err = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert err.startswith(f"Error: cannot create {tmp_path / 'afile' / 'run'}") and "set EMBNIC_RUN_DIR" in err, err
    assert_gone(name)


@pytest.mark.skipif(not is_root(), reason="needs root")
def test_up_without_a_card_does_not_point_at_one(run_dir, cleanup):  # noqa: F811
    name = tb_name("o")
    cleanup.append(name)
    r0 = r = _embnic(run_dir, "testbed", "up", "-c", str(TESTBED_TOML), "--name", name, "--no-card")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the card: sudo embnic status" not in r.stdout and "train as client" not in r.stdout
    assert f"no card (--no-card): the clients reach no shard until one runs in netns {name}-card" in r.stdout
    r = _embnic(run_dir, "testbed", "status", "--name", name)
    assert r.returncode == 0 and "\n  card  none (up --no-card; `embnic pipeline load -c " in r.stdout, r.stdout + r.stderr
    # the hint's own load and unload commands work as printed
    m = re.search(r"sudo embnic (pipeline load -c \S+)   \(pipeline (\S+); `testbed down` stops it too, "
                  r"`sudo embnic (pipeline unload [^`]+)` alone", r0.stdout)
    assert m, r0.stdout
    assert m[2] == f"{name}-card" and m[3] == f"pipeline unload --name {name}-card", m.groups()
    build_dataplane()
    r = _embnic(run_dir, *shlex.split(m[1]))
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        r = _embnic(run_dir, *shlex.split(m[3]))
        assert r.returncode == 0 and "unloaded pipeline" in r.stdout, r.stdout + r.stderr
    finally:
        if r.returncode != 0:
            _embnic(run_dir, "pipeline", "unload", "--name", f"{name}-card")
    assert _embnic(run_dir, "testbed", "down", "--name", name).returncode == 0
    assert_gone(name)


@pytest.mark.skipif(not is_root(), reason="needs root")
def test_two_no_card_testbeds_each_load_their_own_card_and_down_stops_it(run_dir, cleanup):  # noqa: F811
    """Two `up --no-card` testbeds side by side: each one's cluster.toml names its own pipeline
    (NAME-card), so `pipeline load -c` of both runs two cards; `testbed status` shows the loaded
    card (pid, running, counters), and a dead one as dead (exit 1); `testbed down` without a
    `pipeline unload` stops the card and leaves no state file."""
    build_dataplane()
    names = [tb_name("p"), tb_name("q")]
    cleanup.extend(names)
    pids = {}
    for n in names:
        r = _embnic(run_dir, "testbed", "up", "-c", str(TESTBED_TOML), "--name", n, "--no-card")
        assert r.returncode == 0, r.stdout + r.stderr
        conf = run_dir / f"testbed-{n}" / "cluster.toml"
        assert f'name = "{n}-card"' in conf.read_text()
    for n in names:
        r = _embnic(run_dir, "pipeline", "load", "-c", str(run_dir / f"testbed-{n}" / "cluster.toml"), "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        pids[n] = json.loads(r.stdout)["pid"]
        assert (run_dir / f"{n}-card.json").exists()
    for n in names:
        r = _embnic(run_dir, "testbed", "status", "--name", n, "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        card = json.loads(r.stdout)["card"]
        assert card["pipeline"] == f"{n}-card" and card["pid"] == pids[n] and card["running"] is True, card
        assert "frames_by_type" in card and "error" not in card, card
        r = _embnic(run_dir, "testbed", "status", "--name", n)
        assert f"  card  pipeline {n}-card (from `pipeline load`) pid {pids[n]} running" in r.stdout, r.stdout
    # the second one's card dies: its status says so and exits 1
    os.kill(pids[names[1]], signal.SIGKILL)
    for _ in range(100):
        if T.proc_starttime(pids[names[1]]) is None:
            break
        time.sleep(0.05)
    r = _embnic(run_dir, "testbed", "status", "--name", names[1])
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"the card (pipeline {names[1]}-card, from `pipeline load`), pid {pids[names[1]]}, is not running" \
        in r.stderr, r.stderr
    for n in names:  # no `pipeline unload` first
        r = _embnic(run_dir, "testbed", "down", "--name", n)
        assert r.returncode == 0, r.stdout + r.stderr
        assert not (run_dir / f"{n}-card.json").exists()
        assert_gone(n, pids=[pids[n]])


def test_readme_names_a_testbeds_card_as_testbed_up_writes_it(monkeypatch):
    """The README's plain `embnic route list; ... status` needs the socket `pipeline load` makes; with
    only a testbed up the card is reached through the testbed's effective config: the path in the
    README must be the one `testbed up` writes for the default name and run dir."""
    from embnic.control import runstate
    from embnic.cli.commands import options as cmd_options
    from embnic.testbed.net.procs import node_dir

    monkeypatch.delenv("EMBNIC_RUN_DIR", raising=False)
    text = open(os.path.dirname(os.path.abspath(__file__)) + "/../../README.md").read()
    using = text[text.index("## Using it"):text.index("## Performance")]
    path = node_dir(cmd_options.DEFAULT_TESTBED_NAME, runstate.run_dir()) / "cluster.toml"
    assert f"embnic status -c {path}" in using
    assert f"embnic testbed netem --name {cmd_options.DEFAULT_TESTBED_NAME} " in using
    for word in ("tc (sch_netem)", "bpf (loss only, in the kernel)", "user"):
        assert word in " ".join(using.split()), word
    for cmd in ("trace record", "trace replay"):  # they start testbeds of their own
        line = next(ln for ln in using.splitlines() if ln.startswith(f"embnic {cmd} "))
        assert "own" in line, line
    bmv2 = " ".join(using[using.index("--target bmv2"):].split()[:60])
    for word in ("p4c", "simple_switch", "p4/README.md", "iface="):
        assert word in bmv2, word


def test_make_demo_passes_name_only_when_set():
    repo = os.path.dirname(os.path.abspath(__file__)) + "/../.."
    out = subprocess.run(["make", "-n", "-s", "-C", repo, "demo", "NAME=q2d"], capture_output=True, text=True).stdout
    assert "embnic demo --steps 60 --out out/demo --name q2d" in out, out
    out = subprocess.run(["make", "-n", "-s", "-C", repo, "demo"], capture_output=True, text=True).stdout
    assert "embnic demo --steps 60 --out out/demo" in out and "--name" not in out, out
