"""`embnic pipeline load|unload|status` and `DpdkTarget` driving a stand-in embnic-dp.

The stand-in is an ELF with a real `.embnic_buildinfo` section whose main execs a Python
control-socket server (ctl_fake_card.py), so start, build-info check, readiness wait,
programming, state file, second-load refusal, SIGTERM/SIGKILL and cleanup are exercised
without DPDK. The real binary: test_control_dataplane_real.py.
Run alone: python3 -m pytest -q tests/control/test_control_pipeline_fake.py
"""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from pathlib import Path

from embnic.client_lib import consts
from embnic.client_lib.config import load_config
from embnic.control.targets.dpdk import process as dpdk_proc
from embnic.control.errors import NeedsRootError, OperationalError, UsageError
from embnic.control.runstate import pid_matches, read_state
from embnic.control.targets.dpdk.process import start_failure_reason
from embnic.control.targets.dpdk.target import DpdkTarget

EAL_LOGS = Path(__file__).resolve().parent / "eal_logs"

VDEVS = ["--vdev", "net_ring0", "--vdev", "net_ring1", "--vdev", "net_ring2"]


@pytest.fixture
def dp(fake_dp_factory, monkeypatch):
    """The stand-in embnic-dp. It has no EAL, so it runs without root: let the tests load it as any user."""
    if os.geteuid() != 0:
        monkeypatch.setattr(DpdkTarget, "NEEDS_ROOT", False)
    return fake_dp_factory()


@pytest.fixture
def loaded(invoke, env, dp, card_config):
    """A stand-in card loaded under the default name; unloaded (or killed) afterwards."""
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    assert r.exit_code == 0, r.output
    st = read_state(env, "embnic")
    yield st
    st2 = read_state(env, "embnic")
    if st2 and pid_matches(st2):
        os.kill(st2["pid"], signal.SIGKILL)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"


def test_load_programs_routes_and_clients(invoke, env, loaded, card_config):
    st = loaded
    assert st["target"] == "dpdk" and pid_matches(st)
    assert st["ctl"] == str(env / "embnic.sock")
    argv = st["argv"]
    eal = argv[1:argv.index("--")]
    assert eal[:7] == ["-l", "0", "--no-huge", "--no-pci", "-m", "256", "--file-prefix"]
    assert eal[7].startswith("embnic-embnic-") and eal[8:] == VDEVS
    assert argv[argv.index("--"):] == ["--", "--ctl", st["ctl"], "--port-ip", "0=10.0.0.1", "--port-ip", "1=10.0.1.1",
                                       "--port-ip", "2=10.0.2.1",
                                       "--ring-size", "1024", "--state-size", "4096", "--state-timeout-ms", "5000",
                                       "--mtu", "1500", "--paused"]
    # started paused, resumed after the tables were programmed
    assert json.loads(invoke("pipeline", "status", "--json").output)["info"]["paused"] is False
    r = invoke("route", "list", "--json")
    assert [(x["shard"], x["port"], x["mac"], x["ip"], x["udp_port"]) for x in json.loads(r.output)] == \
        [(0, 1, "02:00:00:00:01:02", "10.0.1.2", 7878), (1, 2, "02:00:00:00:01:03", "10.0.1.3", 7879)]
    r = invoke("client", "list", "--json")
    assert [x["client"] for x in json.loads(r.output)] == [1]
    assert "fake embnic-dp: 3 ports" in open(st["log"]).read()


def test_second_load_says_what_runs(invoke, loaded, dp, card_config):
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    assert r.exit_code == 1
    assert f"pipeline 'embnic' is already running (dpdk target, pid {loaded['pid']}" in r.output
    assert "embnic pipeline unload --name embnic" in r.output
    assert pid_matches(loaded)


def test_status_and_unload(invoke, env, loaded):
    r = invoke("pipeline", "status")
    assert r.exit_code == 0, r.output
    assert f"pid {loaded['pid']}" in r.output and "mode pipeline" in r.output and "net_ring1" in r.output
    assert json.loads(invoke("pipeline", "status", "--json").output)["answers"] is True
    assert invoke("status").exit_code == 0
    r = invoke("pipeline", "unload")
    assert r.exit_code == 0, r.output
    assert f"unloaded pipeline 'embnic': pid {loaded['pid']} stopped" in r.output
    assert _gone(loaded["pid"])
    assert read_state(env, "embnic") is None
    assert not os.path.exists(loaded["ctl"])
    assert "fake embnic-dp: stopped" in open(loaded["log"]).read()  # SIGTERM, clean exit
    r = invoke("pipeline", "unload")
    assert r.exit_code == 1 and "pipeline 'embnic' is not loaded" in r.output
    r = invoke("pipeline", "status")
    assert r.exit_code == 1 and "is not loaded: run `embnic pipeline load" in r.output


def test_status_and_unload_take_the_config_of_load(invoke, env, dp, card_config, tmp_path):
    """Users pass the same -c to load, status and unload: the config's [control] name and ctl find the
    pipeline; an explicit --name still wins."""
    sock = tmp_path / "c.sock"
    card_config.write_text(card_config.read_text() + f'\n[control]\nname = "fromcfg"\nctl = "{sock}"\n')
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    assert r.exit_code == 0, r.output
    pid = read_state(env, "fromcfg")["pid"]
    try:
        _status_and_unload_by_config(invoke, env, card_config, sock, tmp_path, pid)
    finally:
        st = read_state(env, "fromcfg")
        if st and pid_matches(st):
            os.kill(pid, signal.SIGKILL)


def _status_and_unload_by_config(invoke, env, card_config, sock, tmp_path, pid):
    r = invoke("pipeline", "status", "-c", card_config)
    assert r.exit_code == 0, r.output
    assert f"pipeline 'fromcfg': running (dpdk target, pid {pid}" in r.output
    assert json.loads(invoke("pipeline", "status", "-c", card_config, "--json").output)["ctl"] == str(sock)
    r = invoke("pipeline", "status")  # without -c: the default name, not loaded
    assert r.exit_code == 1 and "pipeline 'embnic' is not loaded" in r.output
    r = invoke("pipeline", "status", "-c", card_config, "--name", "other", "--ctl", tmp_path / "o.sock")
    assert r.exit_code == 1 and "pipeline 'other' is not loaded" in r.output
    r = invoke("pipeline", "unload", "-c", card_config, "--name", "other")
    assert r.exit_code == 1 and "pipeline 'other' is not loaded" in r.output and pid_matches(read_state(env, "fromcfg"))
    r = invoke("pipeline", "unload", "-c", card_config)
    assert r.exit_code == 0, r.output
    assert f"unloaded pipeline 'fromcfg': pid {pid} stopped" in r.output
    assert _gone(pid) and read_state(env, "fromcfg") is None


def test_load_refuses_wrong_protocol(invoke, env, fake_dp_factory, card_config):
    bad = fake_dp_factory(proto_version=1)  # a version-1 card
    r = invoke("pipeline", "load", "-c", card_config, "--binary", bad, *VDEVS)
    assert r.exit_code == 1
    assert f"refusing {bad}: built for another protocol (proto_version 1 != client library's {consts.VERSION})" \
        in r.output
    assert read_state(env, "embnic") is None and not (env / "embnic.log").exists()


def test_load_refuses_udp_port_mismatch(invoke, env, dp, card_config):
    card_config.write_text(card_config.read_text().replace("udp_port = 7878", "udp_port = 9000"))
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    assert r.exit_code == 1 and "udp_port 7878 != cluster.udp_port 9000" in r.output


def test_load_needs_mac(invoke, env, dp, card_config):
    card_config.write_text(card_config.read_text().replace('mac = "02:00:00:00:00:02"\n', ""))
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    assert r.exit_code == 2
    assert "clients[0].mac: required to program the card, which does not resolve MACs by ARP" in r.output
    assert read_state(env, "embnic") is None
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS, "--no-program", "--name", "np")
    assert r.exit_code == 0, r.output
    assert "0 route(s), 0 client(s)" in r.output
    assert invoke("pipeline", "unload", "--name", "np").exit_code == 0


def test_load_usage_errors(invoke, env, dp, card_config, tmp_path):
    r = invoke("pipeline", "load", "--binary", dp, *VDEVS)
    assert r.exit_code == 2 and "no cluster config" in r.output
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp)
    assert r.exit_code == 2 and "no DPDK ports: give one --vdev per card port" in r.output
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, "--vdev", "net_ring0")
    assert r.exit_code == 2 and "card.ports[1] is DPDK port 1 but only 1 vdev(s) given" in r.output
    nocard = tmp_path / "nocard.toml"
    nocard.write_text(card_config.read_text().split("[card]")[0].replace("card_port", "#"))
    r = invoke("pipeline", "load", "-c", nocard, "--binary", dp, *VDEVS)
    assert r.exit_code == 2 and "card: the dpdk target needs a [card] section" in r.output
    r = invoke("pipeline", "load", "-c", card_config, "--binary", tmp_path / "nope", *VDEVS)
    assert r.exit_code == 2 and "no embnic-dp binary at" in r.output and "make -C dataplane" in r.output
    r = invoke("pipeline", "load", "-c", card_config, "--target", "bmv2", *VDEVS)
    assert r.exit_code == 2 and "the bmv2 target needs an interface per card port" in r.output


def test_malformed_option_values_are_usage_errors(invoke, env, dp, card_config, monkeypatch):
    """A value that is wrong as written exits 2 naming the option, never 1 ("ValueError: No closing quotation")."""
    for opt, val in (("--eal-args", "'-l 0 --no-huge"), ("--card-args", "--burst 8 \\")):
        r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS, opt, val)
        assert r.exit_code == 2, r.output
        assert f"Error: {opt} {val!r} is not a shell-quoted argument list" in r.output
        assert "(see 'cli pipeline load --help')" in r.output and len(r.output.strip().splitlines()) == 1
    monkeypatch.setenv("EMBNIC_EAL_ARGS", "-l '0")
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    assert r.exit_code == 2 and "EMBNIC_EAL_ARGS \"-l '0\" is not a shell-quoted argument list" in r.output
    monkeypatch.delenv("EMBNIC_EAL_ARGS")
    card_config.write_text(card_config.read_text() + "\n[control]\neal_args = \"-l '0\"\n")
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    assert r.exit_code == 2 and "control.eal_args: \"-l '0\" is not a shell-quoted argument list" in r.output
    with pytest.raises(UsageError, match="card_args \"x'\" is not a shell-quoted"):
        DpdkTarget(load_config(card_config), card_args="x'")
    assert read_state(env, "embnic") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="the namespace is checked after the root check")
@pytest.mark.parametrize("ns,msg", [("enTnope", "--netns 'enTnope': no such network namespace: create it "
                                                 "(ip netns add enTnope) or drop --netns"),
                                    ("..", "--netns '..' is not a network namespace name"),
                                    ("a/b", "--netns 'a/b' is not a network namespace name")])
def test_netns_that_is_not_there_is_a_usage_error(invoke, env, dp, card_config, ns, msg):
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS, "--netns", ns)
    assert r.exit_code == 2 and f"Error: {msg}" in r.output, r.output
    assert read_state(env, "embnic") is None


def test_eal_args_replace_defaults(invoke, env, dp, card_config):
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, "--eal-args",
               "-l 0 --no-huge --no-pci -m 128 --file-prefix x --vdev net_null0 --vdev net_null1 --vdev net_null2")
    assert r.exit_code == 0, r.output
    st = read_state(env, "embnic")
    assert st["argv"][1:st["argv"].index("--")] == ["-l", "0", "--no-huge", "--no-pci", "-m", "128", "--file-prefix",
                                                    "x", "--vdev", "net_null0", "--vdev", "net_null1",
                                                    "--vdev", "net_null2"]
    assert invoke("pipeline", "unload").exit_code == 0


@pytest.mark.parametrize("target", ["p4dpdk", "bmv2"])
def test_idle_us_is_refused_before_anything_on_other_targets(invoke, env, card_config, target):
    """embnic-swx rejected --idle-us only after the pipeline's compile (exit 1, 12 s): exit 2 first."""
    r = invoke("pipeline", "load", "--target", target, "-c", card_config, *VDEVS, "--idle-us", "50")
    assert r.exit_code == 2, r.output
    assert r.output == (f"Error: --idle-us is an embnic-dp option (the dpdk target); the {target} target has no "
                        "idle sleep: leave it out (see 'cli pipeline load --help')\n")
    assert read_state(env, "embnic") is None


def test_card_args_and_idle_us(invoke, env, dp, card_config):
    card_config.write_text(card_config.read_text() + '\n[control]\ncard_args = ["--burst", "16"]\n')
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS, "--idle-us", "50")
    assert r.exit_code == 0, r.output
    argv = read_state(env, "embnic")["argv"]
    assert argv[-5:] == ["--paused", "--burst", "16", "--idle-us", "50"]
    assert invoke("pipeline", "unload").exit_code == 0
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS, "--card-args", "--burst 8")
    assert r.exit_code == 0, r.output
    assert read_state(env, "embnic")["argv"][-3:] == ["--paused", "--burst", "8"]  # the flag replaces [control]
    assert invoke("pipeline", "unload").exit_code == 0


def test_card_exits_during_start(invoke, env, dp, card_config, monkeypatch):
    monkeypatch.setenv("FAKE_CARD_FAIL", "no ports")
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    assert r.exit_code == 1
    assert "embnic-dp exited with code 1 while starting: EAL: fake failure: no ports" in r.output
    assert f"(full log: {env / 'embnic.log'})" in r.output
    assert read_state(env, "embnic") is None
    assert "needs root" not in r.output


def test_load_as_non_root_is_refused_up_front(invoke, env, dp, card_config, monkeypatch):
    """Not root exits 2 everywhere; `pipeline load` used to start the card and report it died (exit 1)."""
    monkeypatch.setattr(DpdkTarget, "NEEDS_ROOT", True)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    assert r.exit_code == 2, r.output
    assert "loading the dpdk target (embnic-dp and its DPDK EAL) needs root: run as root (sudo embnic ...)" in r.output
    assert "exited" not in r.output
    assert read_state(env, "embnic") is None and not (env / "embnic.log").exists()
    with pytest.raises(NeedsRootError):
        DpdkTarget(load_config(card_config), binary=dp, vdevs=["net_ring0", "net_ring1", "net_ring2"]).load()


def test_unload_not_permitted(invoke, env, loaded, monkeypatch):
    def deny(pid, sig):
        raise PermissionError(1, "Operation not permitted")

    with monkeypatch.context() as m:
        m.setattr(os, "kill", deny)
        r = invoke("pipeline", "unload")
    assert r.exit_code == 2  # not root: exit 2 everywhere
    assert f"not allowed to stop pid {loaded['pid']} (started by another user): run as root" in r.output
    assert invoke("pipeline", "unload").exit_code == 0


def test_port_missing_on_card(invoke, env, dp, card_config):
    """The card came up with fewer ports than the config names: load fails and stops it."""
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, "--eal-args", "-l 0 --vdev net_ring0")
    assert r.exit_code == 1
    assert "card.ports[1] is DPDK port 1 but embnic-dp has ports [0]" in r.output
    assert read_state(env, "embnic") is None


def test_stale_state_and_socket_are_replaced(invoke, env, dp, card_config):
    (env / "embnic.json").write_text(json.dumps({"target": "dpdk", "pid": 2**22 + 7, "ctl": str(env / "embnic.sock")}))
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.bind(str(env / "embnic.sock"))
    s.close()
    r = invoke("pipeline", "status")
    assert r.exit_code == 1 and "is not running: pid 4194311 is gone" in r.output
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    assert r.exit_code == 0, r.output
    assert invoke("pipeline", "unload").exit_code == 0


def test_unload_stale(invoke, env):
    (env / "embnic.json").write_text(json.dumps({"target": "dpdk", "pid": 2**22 + 7, "ctl": str(env / "x.sock")}))
    r = invoke("pipeline", "unload")
    assert r.exit_code == 0 and "was not running (pid 4194311 gone); removed its stale state file" in r.output
    assert not (env / "embnic.json").exists()


def test_unload_kills_a_card_that_ignores_sigterm(invoke, env, dp, card_config, monkeypatch):
    monkeypatch.setenv("FAKE_CARD_IGNORE_TERM", "1")
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    assert r.exit_code == 0, r.output
    pid = read_state(env, "embnic")["pid"]
    r = invoke("pipeline", "unload", "--timeout", "0.3")
    assert r.exit_code == 0
    assert "did not stop within 0.3s of SIGTERM and was killed (SIGKILL)" in r.output
    assert _gone(pid)


def test_two_pipelines_by_name(invoke, env, dp, card_config):
    for n in ("a", "b"):
        r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS, "--name", n)
        assert r.exit_code == 0, r.output
    a, b = read_state(env, "a"), read_state(env, "b")
    assert a["pid"] != b["pid"] and a["ctl"] != b["ctl"]
    pa, pb = (x["argv"][x["argv"].index("--file-prefix") + 1] for x in (a, b))
    assert pa.startswith("embnic-a-") and pb.startswith("embnic-b-")
    assert invoke("route", "del", "0", "--name", "a").exit_code == 0
    assert len(json.loads(invoke("route", "list", "--json", "--name", "a").output)) == 1
    assert len(json.loads(invoke("route", "list", "--json", "--name", "b").output)) == 2
    for n in ("a", "b"):
        assert invoke("pipeline", "unload", "--name", n).exit_code == 0


def test_python_api(env, dp, card_config):
    """The API the testbed uses: DpdkTarget(config, binary, eal_args, ctl_path, netns).load()/counters()/unload()."""
    cfg = load_config(card_config)
    ctl = str(env / "api.sock")
    t = DpdkTarget(cfg, binary=dp, ctl_path=ctl, name="api", vdevs=["net_ring0", "net_ring1", "net_ring2"])
    res = t.load()
    try:
        assert res["routes"] == 2 and res["clients"] == 1 and res["ctl"] == ctl
        assert t.is_loaded()
        assert t.counters()["ring"]["size"] == 1024
        assert [e.id for e in t.peer_list("shard")] == [0, 1]
        assert t.state_summary()["capacity"] == 65536
        assert len(t.state_dump(1)) == 1
        assert t.info()["mode"] == "pipeline"
        from embnic.control.ctlsock import CtlClient

        assert CtlClient(ctl).call("ping")["pid"] == res["pid"]
    finally:
        out = t.unload()
    assert out["was_running"] and not out["killed"] and out["exit"] == 0
    assert not t.is_loaded()


def test_netns_needs_root(env, dp, card_config, monkeypatch):
    t = DpdkTarget(load_config(card_config), binary=dp, netns="enTnope", vdevs=["net_ring0", "net_ring1", "net_ring2"])
    with monkeypatch.context() as m:
        m.setattr(os, "geteuid", lambda: 1000)
        with pytest.raises(NeedsRootError, match=r"needs root: run as root \(sudo embnic \.\.\.\)"):
            t.load()
    if os.geteuid() == 0:  # a namespace that is not there is a usage error (exit 2), not an operational one
        with pytest.raises(UsageError, match=r"--netns 'enTnope': no such network namespace: create it") as e:
            t.load()
        assert e.value.exit_code == 2 and e.value.param == "netns"


def test_netns_argv(card_config):
    t = DpdkTarget(load_config(card_config), netns="enT1card", vdevs=["net_ring0"], name="x")
    argv = t.argv("/bin/dp", "/run/x.sock")
    assert argv[:5] == ["ip", "netns", "exec", "enT1card", "/bin/dp"]


def test_no_root_for_run_dir(invoke, env, dp, card_config, monkeypatch):
    monkeypatch.setenv("EMBNIC_RUN_DIR", str(env / "ro"))
    (env / "ro").mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, m: False if str(p).endswith("/ro") else real_access(p, m))
    monkeypatch.setattr(DpdkTarget, "NEEDS_ROOT", False)  # get as far as the run dir
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    assert r.exit_code == 2  # not root: exit 2
    assert "run as root (sudo embnic ...) or set EMBNIC_RUN_DIR" in r.output
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    assert r.exit_code == 1  # root and still not writable: operational
    assert "(even as root): set EMBNIC_RUN_DIR" in r.output


# --------------------------------------------------------------------------- failed starts
# Logs of the real embnic-dp failing to start (DPDK 22.11), and the line `pipeline load` must show.
FAILED_STARTS = [
    ("bogus_vdev.log", 'EAL: failed to parse device "net_bogus0"'),  # not "Unregistering with invalid input ..."
    ("banana_lcores.log", "EAL: invalid core list syntax"),  # not a line of EAL's usage text
    ("bogus_eal_flag.log", "embnic-dp: unrecognized option '--bogus-flag'"),
    ("missing_lcore.log", "EAL: lcore 5 unavailable"),
    ("burst_zero.log", "embnic-dp: bad value for --burst: '0'"),  # not "Cause: invalid arguments"
]


@pytest.mark.parametrize("log,line", FAILED_STARTS, ids=[x[0] for x in FAILED_STARTS])
def test_failure_reason_picks_the_informative_line(log, line):
    assert start_failure_reason(EAL_LOGS / log) == line


def test_failure_reason_fallbacks(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("# embnic-dp ...\nEAL: Detected CPU lcores: 2\nEAL: Error - exiting with code: 1\n"
                 "  Cause: invalid arguments\n")
    assert start_failure_reason(p) == "Cause: invalid arguments"  # generic, but the best there is
    p.write_text("# embnic-dp ...\nEAL: Selected IOVA mode 'VA'\n  Cause: need 1..8 ports, found 0 (add --vdev)\n")
    assert start_failure_reason(p) == "Cause: need 1..8 ports, found 0 (add --vdev)"
    p.write_text("# embnic-dp ...\nEAL: Physical addresses are unavailable, selecting IOVA as VA mode.\nsomething\n")
    assert start_failure_reason(p) == "something"
    assert start_failure_reason(tmp_path / "none.log") == ""


@pytest.mark.parametrize("log,line", FAILED_STARTS, ids=[x[0] for x in FAILED_STARTS])
def test_failed_start_shows_the_reason_and_removes_the_runtime_dir(invoke, env, dp, card_config, monkeypatch,
                                                                    tmp_path, log, line):
    rt = tmp_path / "dpdk"
    monkeypatch.setattr(dpdk_proc, "DPDK_RUNTIME_DIR", rt)
    monkeypatch.setenv("FAKE_CARD_RUNTIME_DIR", str(rt))
    monkeypatch.setenv("FAKE_CARD_LOG", str(EAL_LOGS / log))
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    assert r.exit_code == 1
    assert f"embnic-dp exited with code 1 while starting: {line} (full log: {env / 'embnic.log'})" in r.output
    assert read_state(env, "embnic") is None
    assert not rt.exists() or list(rt.iterdir()) == [], "the failed start's EAL runtime dir was left behind"


def test_failed_start_keeps_a_runtime_dir_it_did_not_create(invoke, env, dp, card_config, monkeypatch, tmp_path):
    """A runtime dir that was there before the start may belong to a running EAL process: not ours to remove."""
    rt = tmp_path / "dpdk"
    monkeypatch.setattr(dpdk_proc, "DPDK_RUNTIME_DIR", rt)
    monkeypatch.setenv("FAKE_CARD_FAIL", "x")
    prefix = DpdkTarget(load_config(card_config), run_dir=env).file_prefix
    (rt / prefix).mkdir(parents=True)
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    assert r.exit_code == 1
    assert (rt / prefix).is_dir()


def test_lcores_checked_before_start(invoke, env, dp, card_config):
    for bad, why in (("banana", "is not a DPDK core list"), ("4095", "out of range"),
                     (str(max(os.sched_getaffinity(0)) + 1), "but this machine has core(s)")):
        r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS, "--lcores", bad)
        assert r.exit_code == 2 and f"--lcores: '{bad}'" in r.output and why in r.output, r.output
        assert not (env / "embnic.log").exists()
    card_config.write_text(card_config.read_text().replace('lcores = "0"', 'lcores = "0-127"'))
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    assert r.exit_code == 2 and "card.lcores in " in r.output and "but this machine has core(s)" in r.output


def test_state_file_has_the_absolute_config_path(invoke, env, dp, card_config, monkeypatch):
    monkeypatch.chdir(card_config.parent)
    r = invoke("pipeline", "load", "-c", card_config.name, "--binary", dp, *VDEVS)
    assert r.exit_code == 0, r.output
    try:
        assert read_state(env, "embnic")["config"] == str(card_config.resolve())
        monkeypatch.chdir("/")
        assert f"config {card_config.resolve()}," in invoke("pipeline", "status").output
    finally:
        assert invoke("pipeline", "unload").exit_code == 0


def test_port_mac_that_differs_from_the_card_is_warned(invoke, env, dp, card_config):
    """embnic-dp cannot set a port's MAC: a different [card].ports[].mac is a warning, not silently ignored."""
    # the stand-in's port i has MAC 02:00:00:00:00:0i; port 1 matches, port 2 does not
    card_config.write_text(card_config.read_text().replace(
        '{ id = 1, ip = "10.0.1.1" }, { id = 2, ip = "10.0.2.1" }',
        '{ id = 1, ip = "10.0.1.1", mac = "02:00:00:00:00:01" }, { id = 2, ip = "10.0.2.1", mac = "02:aa:00:00:00:02" }'))
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS)
    try:
        assert r.exit_code == 0, r.output
        warns = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
        assert warns == ["warning: card.ports[2].mac is 02:aa:00:00:00:02 but DPDK port 2 has 02:00:00:00:00:02; "
                         "embnic-dp cannot set a port's MAC: give the port that MAC (for af_packet: `ip link set "
                         "dev IF address 02:aa:00:00:00:02`) or write mac = \"02:00:00:00:00:02\" in the config"]
    finally:
        assert invoke("pipeline", "unload").exit_code == 0
    r = invoke("pipeline", "load", "-c", card_config, "--binary", dp, *VDEVS, "--json")
    try:
        assert len(json.loads(r.stdout)["warnings"]) == 1
    finally:
        assert invoke("pipeline", "unload").exit_code == 0


def test_interrupted_readiness_wait_stops_the_process(tmp_path):
    """Ctrl-C while a DPDK process starts (`bench dataplane`, `pipeline load`): the process, in its
    own session, is stopped before the interrupt goes on, not left busy-polling."""
    p = dpdk_proc.DpdkProcess("/bin/true", ["--file-prefix", f"qaint{os.getpid()}"], log=tmp_path / "p.log",
                              wrapper=["sh", "-c", "exec sleep 60", "sh"])  # a process that stays up
    p.start()
    try:
        def probe():
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            p.wait_ready(probe, 30.0)
        assert p.proc.poll() is not None, "still running after the interrupted wait"
    finally:
        p.stop(timeout=1.0)
