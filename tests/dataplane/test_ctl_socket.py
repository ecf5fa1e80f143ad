"""The card's control socket (docs/control-socket.md), its command line and DPDK telemetry.

Runs embnic-dp on net_null vdevs (no traffic). Run alone:
sudo python3 -m pytest -q tests/dataplane/test_ctl_socket.py
"""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from embnic.client_lib import consts
from embnic.control.targets.dpdk.process import CardProcess, eal_argv, remove_runtime_dir, unique_prefix

pytestmark = [pytest.mark.dataplane, pytest.mark.root]
NULLS = ["net_null0,no-rx=1", "net_null1,no-rx=1"]


@pytest.fixture(scope="module")
def card(card_bin):
    c = CardProcess(card_bin, NULLS, lcores="0", port_ips={0: "10.9.0.1", 1: "10.9.1.1"})
    c.start()
    yield c
    c.cleanup()


def raw(card: CardProcess, data: bytes, lines: int = 1, timeout: float = 5.0) -> list[str]:
    """Send raw bytes on one connection, read ``lines`` response lines."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(card.ctl_path))
        s.sendall(data)
        buf = b""
        while buf.count(b"\n") < lines:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return buf.decode().splitlines()


def test_socket_mode_0600(card):
    st = os.stat(card.ctl_path)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600


def test_ping_pid(card):
    assert card.call("ping")["pid"] == card.proc.pid


def test_info(card, card_bin):
    info = card.call("info")
    assert info["mode"] == "run_to_completion" and info["lcores"] == 1
    assert [(p["port"], p["ip"]) for p in info["ports"]] == [(0, "10.9.0.1"), (1, "10.9.1.1")]
    assert all(len(p["mac"]) == 17 for p in info["ports"])
    b = info["build"]
    with open(card_bin, "rb") as f:
        sec = ELFFile(f).get_section_by_name(".embnic_buildinfo").data()
    assert b["magic"] == sec[:8].decode()
    assert (b["proto_version"], b["hdr_len"], b["udp_port"]) == (consts.VERSION, consts.HDR_LEN, consts.UDP_PORT)
    assert b["n_fields"] == len(b["fields"]) == len(consts.HEADER_FIELDS)
    assert b["git_rev"] in sec.decode(errors="replace")


def test_route_add_list_update_del(card):
    card.call("route_add", shard=5, port=1, mac="02:00:00:00:00:05", ip="10.9.1.5", udp_port=7878)
    card.call("route_add", shard=3, port=0, mac="02:00:00:00:00:03", ip="10.9.0.3", udp_port=7000)
    card.call("route_add", shard=5, port=0, mac="02:00:00:00:00:55", ip="10.9.0.55")  # update, default port
    routes = card.call("route_list")["routes"]
    assert routes == [
        {"shard": 3, "port": 0, "mac": "02:00:00:00:00:03", "ip": "10.9.0.3", "udp_port": 7000},
        {"shard": 5, "port": 0, "mac": "02:00:00:00:00:55", "ip": "10.9.0.55", "udp_port": 7878},
    ]
    card.call("route_del", shard=3)
    card.call("route_del", shard=5)
    assert card.call("route_list")["routes"] == []
    r = card.call("route_del", shard=5, check=False)
    assert r["ok"] is False and "no shard 5" in r["error"] and r["kind"] == "argument"


def test_client_add_list_del(card):
    card.call("client_add", client=7, port=0, mac="02:00:00:00:07:07", ip="10.9.0.7", udp_port=40007)
    assert card.call("client_list")["clients"] == [
        {"client": 7, "port": 0, "mac": "02:00:00:00:07:07", "ip": "10.9.0.7", "udp_port": 40007}]
    r = card.call("client_add", client=8, port=0, mac="02:00:00:00:07:08", ip="10.9.0.8", check=False)
    assert r["ok"] is False and "udp_port" in r["error"]
    card.call("client_del", client=7)
    assert card.call("client_list")["clients"] == []
    assert not card.call("client_del", client=7, check=False)["ok"]


@pytest.mark.parametrize("fields,word", [
    ({"port": 0, "mac": "02:00:00:00:00:01", "ip": "10.0.0.1"}, "shard"),
    ({"shard": 70000, "port": 0, "mac": "02:00:00:00:00:01", "ip": "10.0.0.1"}, "shard"),
    ({"shard": 1, "port": 2, "mac": "02:00:00:00:00:01", "ip": "10.0.0.1"}, "port"),
    ({"shard": 1, "port": 0, "mac": "zz:00:00:00:00:01", "ip": "10.0.0.1"}, "mac"),
    ({"shard": 1, "port": 0, "mac": "02:00:00:00:00:01", "ip": "10.0.0.300"}, "ip"),
    ({"shard": 1, "port": 0, "mac": "02:00:00:00:00:01", "ip": "10.0.0.1", "udp_port": 0}, "udp_port"),
    ({"shard": "1", "port": 0, "mac": "02:00:00:00:00:01", "ip": "10.0.0.1"}, "shard"),
])
def test_route_add_rejects(card, fields, word):
    shards = card.call("counters").get("shards", [])
    r = card.call("route_add", check=False, **fields)
    assert r["ok"] is False and word in r["error"], r
    assert r["kind"] == "argument", r  # the CLI exits 2 on it (control/ctlsock.py CtlArgumentError)
    assert card.call("route_list")["routes"] == []
    # a refused route_add assigns no per-shard statistics slot (it did for a valid shard id with
    # a bad port, MAC or IP: found by the control socket's fuzz target, seeds/ctl/refused)
    assert card.call("counters").get("shards", []) == shards


def test_counters_shape(card):
    c = card.call("counters")
    assert [p["port"] for p in c["ports"]] == [0, 1]
    assert set(c["types"]) == {t.name for t in consts.MsgType}
    assert set(c["ring"]) == {"size", "count", "high_water", "rings"} and c["ring"]["size"] == 4096
    assert c["ring"]["rings"] == 1  # one header ring per state lcore
    assert set(c["mempool"]) == {"size", "available", "in_use"}
    assert set(c["state"]) == {"entries", "partitions", "capacity", "overflow", "expired"}
    assert c["state"]["capacity"] == 65536
    assert card.call("ring_stats") == {"size": 4096, "count": 0, "high_water": 0, "rings": 1, "ok": True}
    assert card.call("reset_counters") == {"ok": True}


def test_state_commands_empty(card):
    s = card.call("state_summary")
    assert s["entries"] == 0 and set(s["by_state"]) == {"receiving", "forwarded", "replying"}
    assert s["partitions"] == 1 and [(p["partition"], p["entries"], p["capacity"]) for p in s["by_partition"]] == [
        (0, 0, 65536)]
    assert card.call("state_dump", limit=5)["entries"] == []
    assert not card.call("state_dump", limit=-1, check=False)["ok"]


def test_errors_and_pipelining(card):
    lines = raw(card, b'{"cmd":"ping","id":1}\n\nnot json\n[1,2]\n{"cmd":"nope"}\n{"cmd":"ping","id":"x"}\n',
                lines=5)
    resp = [json.loads(x) for x in lines]
    assert resp[0]["ok"] and resp[0]["id"] == 1
    assert not resp[1]["ok"] and "invalid JSON" in resp[1]["error"]
    assert not resp[2]["ok"] and "cmd" in resp[2]["error"]
    assert not resp[3]["ok"] and "unknown cmd 'nope'" in resp[3]["error"]
    assert resp[4]["ok"] and resp[4]["id"] == "x"
    assert [r.get("kind") for r in resp] == [None, "argument", "argument", "argument", None]


def test_request_split_across_writes(card):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(card.ctl_path))
        s.sendall(b'{"cmd":')
        time.sleep(0.1)
        s.sendall(b'"ping"}\n')
        assert json.loads(s.recv(4096))["ok"]


def test_overlong_line_closes(card):
    lines = raw(card, b"x" * 70000, lines=1)
    assert lines and "longer than" in json.loads(lines[0])["error"]
    assert json.loads(lines[0])["kind"] == "argument"
    assert card.call("ping")["ok"]  # still serving


def test_pause_resume(card):
    card.call("pause")
    assert card.call("info")["paused"] is True
    card.call("resume")
    assert card.call("info")["paused"] is False


def test_telemetry(card):
    """/embnic/counters, /embnic/ring and /embnic/state answer on DPDK's telemetry socket."""
    path = Path("/var/run/dpdk") / card.prefix / "dpdk_telemetry.v2"
    assert path.exists(), f"no telemetry socket at {path}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(5)
        s.connect(str(path))
        json.loads(s.recv(16384))  # greeting
        s.send(b"/")
        assert "/embnic/counters" in json.loads(s.recv(16384))["/"]
        s.send(b"/embnic/counters")
        c = json.loads(s.recv(65536))["/embnic/counters"]
        assert set(c) >= {"port0", "port1", "types", "drops", "ring", "mempool", "state", "completed", "arp"}
        assert set(c["completed"]) == {t.name for t in consts.REPLY_TYPES}
        assert "unknown_shard" in c["drops"] and c["ring"]["size"] == 4096
        # per port, as on the control socket: the frames dropped as too long for it, its largest frame
        assert "too_long_for_port" in c["drops"]
        assert c["port0"]["too_long_for_port"] == 0 and c["port0"]["max_frame"] == 14 + 65535
        s.send(b"/embnic/ring")
        assert json.loads(s.recv(16384))["/embnic/ring"]["size"] == 4096
        s.send(b"/embnic/state")
        assert json.loads(s.recv(16384))["/embnic/state"]["capacity"] == 65536


def test_second_card_on_same_socket_refused(card, card_bin):
    prefix = unique_prefix("d")
    r = subprocess.run([str(card_bin), *eal_argv("0", prefix, ["net_null0"]),
                        "--", "--ctl", str(card.ctl_path)], capture_output=True, text=True, timeout=60)
    remove_runtime_dir(prefix)
    assert r.returncode != 0
    assert "control socket" in (r.stdout + r.stderr)
    assert card.call("ping")["ok"]


@pytest.mark.parametrize("args,word", [
    (["--ring-size", "1000"], "ring-size"),
    (["--burst", "65"], "burst"),
    (["--port-ip", "0=10.0.0.300"], "port-ip"),
    (["--port-ip", "5=10.0.0.1"], "port 5"),
    (["--bogus"], "Usage"),
    (["extra"], "unexpected argument"),
])
def test_bad_command_line(card_bin, tmp_path, args, word):
    prefix = unique_prefix("a")
    r = subprocess.run([str(card_bin), *eal_argv("0", prefix, ["net_null0,no-rx=1"]),
                        "--", "--ctl", str(tmp_path / "s"), *args],
                       capture_output=True, text=True, timeout=60)
    remove_runtime_dir(prefix)
    assert r.returncode == 2, r.stdout + r.stderr
    assert word in r.stdout + r.stderr


def test_quit_command_exits_cleanly(card_bin):
    c = CardProcess(card_bin, NULLS[:1], lcores="0")
    c.start()
    try:
        assert c.call("quit")["ok"]
        assert c.proc.wait(20) == 0
        assert not c.ctl_path.exists(), "socket not removed on exit"
    finally:
        c.cleanup()


@pytest.mark.parametrize("lcores, eal_args, ops", [
    ("0", [], "ring_mp_mc"),                                            # run to completion: the default
    ("0,1", [], "stack"),                                               # pipeline: LIFO pool
    ("0,1", ["--mbuf-pool-ops-name", "ring_mp_mc"], "ring_mp_mc"),      # EAL's choice wins
])
def test_mempool_ops(card_bin, lcores, eal_args, ops):
    c = CardProcess(card_bin, NULLS, lcores=lcores, eal_args=eal_args)
    c.start()
    try:
        info = c.call("info")
        assert info["mempool_ops"] == ops
        assert c.counters()["mempool"]["in_use"] == 0
    finally:
        assert c.stop() == 0
        c.cleanup()


def test_sigterm_in_pipeline_mode(card_bin):
    c = CardProcess(card_bin, NULLS, lcores="0,1")
    c.start()
    try:
        assert c.call("info")["mode"] == "pipeline"
    finally:
        rc = c.stop()
        log = c.log()
        c.cleanup()
    assert rc == 0
    assert "embnic-dp: bye" in log


def test_a_full_table_is_a_failure_not_an_argument(card):
    """A well-formed add the card cannot carry out says "kind": "failure" (the CLI exits 1 on it,
    and 2 on "argument" refusals): fill the client table, then one more."""
    n = card.call("info")["build"]["client_table_size"]
    reqs = b"".join(json.dumps({"cmd": "client_add", "client": i, "port": 0, "mac": "02:00:00:00:09:09",
                                "ip": "10.9.0.9", "udp_port": 40000}).encode() + b"\n" for i in range(n + 1))
    try:
        resp = [json.loads(x) for x in raw(card, reqs, lines=n + 1, timeout=30)]
        assert all(r["ok"] for r in resp[:n])
        assert not resp[n]["ok"] and "client table is full" in resp[n]["error"] and resp[n]["kind"] == "failure"
    finally:
        dels = b"".join(json.dumps({"cmd": "client_del", "client": i}).encode() + b"\n" for i in range(n))
        raw(card, dels, lines=n, timeout=30)
    assert card.call("client_list")["clients"] == []


def _connections(card: CardProcess, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(str(card.ctl_path))
        out.append(s)
    return out


def _read_all(s: socket.socket) -> bytes:
    buf = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return buf
        buf += chunk


def test_sixteen_idle_connections_leave_room_for_the_cli(card):
    """Monitoring tools hold every connection, idle: `embnic route list` still gets through; the
    connection idle longest is told in one JSON line and closed to make room, the others stay."""
    from click.testing import CliRunner

    from embnic.cli.main import cli
    from embnic.control.ctlsock import MAX_CONNECTIONS

    card.call("route_add", shard=9, port=1, mac="02:00:00:00:00:09", ip="10.9.1.9", udp_port=7878)
    held = _connections(card, MAX_CONNECTIONS)
    try:
        for s in held:  # every one accepted and answered once, then idle
            s.sendall(b'{"cmd":"ping"}\n')
            assert json.loads(s.recv(65536))["ok"] is True
        run = CliRunner().invoke(cli, ["route", "list", "--target", "dpdk", "--ctl", str(card.ctl_path)])
        assert run.exit_code == 0, run.output
        assert "10.9.1.9" in run.output
        told = _read_all(held[0]).decode()
        assert told.count("\n") == 1
        msg = json.loads(told)
        assert msg["ok"] is False and msg["kind"] == "failure" and "idle" in msg["error"]
        for s in held[1:]:  # still served
            s.sendall(b'{"cmd":"ping"}\n')
            assert json.loads(s.recv(65536))["pid"] == card.proc.pid
    finally:
        for s in held:
            s.close()
        card.call("route_del", shard=9)


def test_connection_over_the_limit_gets_a_json_error(card):
    """Every connection busy (a request line under way): a new one gets one JSON line, then EOF;
    the CLI says why in one line (exit 1); the busy ones are still answered."""
    from click.testing import CliRunner

    from embnic.cli.main import cli
    from embnic.control.ctlsock import MAX_CONNECTIONS

    held = _connections(card, MAX_CONNECTIONS)
    try:
        for s in held:
            s.sendall(b'{"cmd":"pi')
        time.sleep(1.0)  # the card reads the partial lines as it polls its socket (every ms)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(card.ctl_path))
            got = _read_all(s).decode()
        assert got.count("\n") == 1, got
        msg = json.loads(got)
        assert msg["ok"] is False and msg["kind"] == "failure"
        assert f"at most {MAX_CONNECTIONS} control connections" in msg["error"] and "busy" in msg["error"]
        run = CliRunner().invoke(cli, ["route", "list", "--target", "dpdk", "--ctl", str(card.ctl_path)])
        assert run.exit_code == 1 and "every one is busy with a request: retry" in run.output, run.output
        assert len(run.output.strip().splitlines()) == 1
        for s in held:
            s.sendall(b'ng"}\n')
            assert json.loads(s.recv(65536))["pid"] == card.proc.pid
    finally:
        for s in held:
            s.close()
