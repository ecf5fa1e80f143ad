"""The bmv2 target through the CLI, on each control channel installed (P4Runtime with
simple_switch_grpc, Thrift with simple_switch): load onto veths, a lookup and its reply between
kernel UDP sockets through the switch, routes/clients/status/state, every frame accounted for
(none lost before the switch), Thrift reachable only inside the switch's namespace, unload; and
the one-line error (missing dependency, exit 2) when a tool is missing.
Run alone: sudo python3 -m pytest -q tests/p4/test_bmv2_target.py
"""
from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest
from click.testing import CliRunner

from embnic.client_lib import codec
from embnic.client_lib.consts import NO_TABLE, DType, MsgType
from embnic.client_lib.protocol import Embnic
from embnic.control import netns
from embnic.cli.main import cli
from embnic.control.netns import Netns, exec_argv

TAG = f"{os.getpid() % 100000}"
CARD_MACS = ("02:cc:00:00:00:10", "02:cc:00:00:00:11")
CLIENT_MAC, SHARD_MAC = "02:c1:00:00:00:01", "02:5a:00:00:00:00"


def config_text(target: str = "bmv2") -> str:
    return textwrap.dedent(f"""\
        [cluster]
        name = "bmv2test"
        [[tables]]
        id = 0
        dim = 4
        [[shards]]
        id = 0
        ip = "10.88.1.2"
        mac = "{SHARD_MAC}"
        card_port = 1
        [[clients]]
        id = 1
        ip = "10.88.0.2"
        port = 40001
        mac = "{CLIENT_MAC}"
        card_port = 0
        [card]
        ports = [{{ id = 0, ip = "10.88.0.1", mac = "{CARD_MACS[0]}" }},
                 {{ id = 1, ip = "10.88.1.1", mac = "{CARD_MACS[1]}" }}]
        [control]
        target = "{target}"
        """)


def test_missing_tool_is_one_line_missing_dependency(tmp_path, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text(config_text())
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("EMBNIC_RUN_DIR", str(tmp_path / "run"))
    r = CliRunner().invoke(cli, ["pipeline", "load", "-c", str(cfg), "--vdev", "net_af_packet0,iface=x0",
                                 "--vdev", "net_af_packet1,iface=x1"])
    assert r.exit_code == 2, r.output  # the missing-dependency category (control/errors.py)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    # the compiled program is committed: p4c is not needed; the switch's docs are pointed to, no build
    assert "needs simple_switch, simple_switch_CLI, not found on PATH" in lines[0]
    assert "p4lang/behavioral-model 1.15.5" in lines[0] and 'p4/README.md, "P4 tools"' in lines[0]
    assert "p4c" not in lines[0] and "make " not in lines[0]


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def wiring(bmv2_ready):
    """client netns -- veth -- (card end, left in the root ns for the target to take) ... shard netns."""
    cns, sns = f"e12c{TAG}", f"e12s{TAG}"
    links = [(f"e12c{TAG}", f"e12p0{TAG}", cns, "10.88.0.2/30", "10.88.0.1", CLIENT_MAC, CARD_MACS[0]),
             (f"e12s{TAG}", f"e12p1{TAG}", sns, "10.88.1.2/30", "10.88.1.1", SHARD_MAC, CARD_MACS[1])]
    made = []
    try:
        for peer, card, ns, addr, gw, mac, card_mac in links:
            n = Netns.create(ns)  # loopback up, IPv6 off
            made.append(n)
            netns.veth(card, peer, peer_ns=ns, peer_mac=mac)  # the card's end here, in the root namespace
            n.add_address(peer, addr)
            n.link_up(peer)
            n.offloads_off(peer)
            n.default_route(peer, gw)
            n.neigh_permanent(peer, gw, card_mac)
            netns.run(["ethtool", "-K", card, "tx", "off", "rx", "off"])
        yield {"client_ns": cns, "shard_ns": sns, "ifaces": [links[0][1], links[1][1]]}
    finally:
        for n in made:
            n.delete()
        for _, card, *_ in links:
            netns.ip("link", "del", card, check=False)


SHARD_PY = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("10.88.1.2", 7878)); s.settimeout(20)
print("ready", flush=True)
data, peer = s.recvfrom(65535)
print(peer[0], peer[1], data.hex(), flush=True)
s.sendto(bytes.fromhex(sys.argv[1]), peer)
"""
CLIENT_PY = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("10.88.0.2", 40001)); s.settimeout(20)
s.sendto(bytes.fromhex(sys.argv[1]), ("10.88.0.1", 7878))
data, peer = s.recvfrom(65535)
print(peer[0], peer[1], data.hex(), flush=True)
"""


def test_load_lookup_status_unload(wiring, channel_env, tmp_path, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text(config_text())
    monkeypatch.setenv("EMBNIC_RUN_DIR", str(tmp_path / "run"))
    name = f"e12t{TAG}"
    runner = CliRunner()
    vdevs = [a for i, f in enumerate(wiring["ifaces"]) for a in ("--vdev", f"net_af_packet{i},iface={f}")]
    r = runner.invoke(cli, ["pipeline", "load", "-c", str(cfg), "--name", name, *vdevs])
    assert r.exit_code == 0, r.output
    try:
        st = json.loads((tmp_path / "run" / f"{name}.json").read_text())
        assert st["channel"] == channel_env
        if channel_env == "p4runtime":
            # programmed the P4Runtime way: no saved state restored, no placeholder entries; every
            # table written and read back (2 card ports, 1 route, 1 client, their allowlist entries)
            assert st["switch"] == "simple_switch_grpc" and "--restore-state" not in st["argv"]
            assert "--no-p4" in st["argv"] and st["p4rt"] == f"unix:{tmp_path / 'run' / name}.p4rt"
            assert st["programmed"]["tables"] == {"sender_allowlist": 2, "route_by_shard": 1, "client_by_id": 1,
                                                  "card_port_by_ingress": 2, "source_by_egress_port": 2}
            assert (tmp_path / "run" / f"{name}.p4rt").is_socket()
        # Thrift listens on every address of the switch's namespace: there is only loopback
        addrs = Netns(st["netns"]).ip("-o", "addr", "show").stdout.split("\n")
        assert {ln.split()[1] for ln in addrs if ln.strip()} == {"lo"}, addrs
        # pipeline status asks the bmv2 target (it has no control socket): running, its log and ports
        ps = runner.invoke(cli, ["pipeline", "status", "--name", name])
        assert ps.exit_code == 0, ps.output
        assert f"pipeline {name!r}: running (bmv2 target, pid {st['pid']}" in ps.output
        assert f"ports 0: {wiring['ifaces'][0]}, 1: {wiring['ifaces'][1]}" in ps.output
        ls = runner.invoke(cli, ["route", "list", "-c", str(cfg), "--name", name, "--json"])
        assert ls.exit_code == 0, ls.output
        assert [(e["shard"], e["ip"], e["udp_port"], e["mac"]) for e in json.loads(ls.output)] == [
            (0, "10.88.1.2", 7878, SHARD_MAC)]

        # a v2 lookup (table 0, dim 3, fp16, 3 keys: directory + keys = 40 bytes, value_len 18) and
        # its reply (3 rows of 3 fp16 = 18 bytes), kernel sockets both ends
        d = codec.make_directory([0], [3], [DType.FP16], [3])
        (req,) = codec.encode_lookup(msg_id=42, client_id=1, shard_id=0, directory=d, keys=[7, 8, 9])
        (rep,) = codec.encode_reply(codec.parse_header(req), MsgType.LOOKUP_REPLY, shard_id=0, body=b"r" * 18)
        assert bytes(Embnic(req)).hex() == req.hex() and Embnic(rep).value_len == 18 == len(rep) - 44
        shard = subprocess.Popen(exec_argv(wiring["shard_ns"], ["python3", "-c", SHARD_PY, rep.hex()]),
                                 stdout=subprocess.PIPE, text=True)
        assert shard.stdout.readline().strip() == "ready"
        client = subprocess.run(exec_argv(wiring["client_ns"], ["python3", "-c", CLIENT_PY, req.hex()]),
                                capture_output=True, text=True, timeout=60)
        got_req = shard.stdout.readline().split()
        shard.wait(30)
        assert got_req == ["10.88.1.1", "7878", req.hex()]
        assert client.returncode == 0, client.stderr
        assert client.stdout.split() == ["10.88.0.1", "7878", rep.hex()]

        s = runner.invoke(cli, ["status", "-c", str(cfg), "--name", name, "--json"])
        assert s.exit_code == 0, s.output
        c = json.loads(s.output)
        counters = c.get("counters", c)
        assert counters["types"]["LOOKUP_REQ"] == 1 and counters["types"]["LOOKUP_REPLY"] == 1
        # every frame accounted for: each port's interface took in what the switch counted
        assert [(p["iface_rx_frames"], p["rx_frames"], p["lost_before_switch"]) for p in counters["ports"]] == [
            (1, 1, 0), (1, 1, 0)]
        assert counters["lost_before_switch"] == 0
        assert counters["control"]["channel"] == channel_env
        # every reply type, as the dpdk card keys them (SIZE_ACK included)
        assert counters["completed"] == {"LOOKUP_REPLY": 1, "UPDATE_ACK": 0, "ERROR": 0, "SIZE_ACK": 0,
                                         "UPDATE_NACK": 0}
        # per routed shard, the messages whose whole reply passed (BMv2: a count, no histogram)
        assert counters["shards"] == [{"shard": 0, "completed": 1}]
        t = runner.invoke(cli, ["status", "-c", str(cfg), "--name", name])
        assert t.exit_code == 0 and "shard     0  completed 1, expired 0" in t.output, t.output
        assert f"control   {channel_env} ({st['switch']}): tables over " in t.output, t.output
        assert "lost before switch" in t.output
        # the exporter reads the same counters and registers: every number of status, sample for sample
        pytest.importorskip("prometheus_client", reason="pip install 'embnic[metrics]'")
        from metrics_util import assert_agree, card_expected, samples

        e = runner.invoke(cli, ["exporter", "--once", "-c", str(cfg), "--name", name])
        assert e.exit_code == 0, e.output
        want = card_expected(counters, c["state"])
        want[("embnic_card_up", ())] = 1
        want[("embnic_card_info", (("pipeline", name), ("target", "bmv2")))] = 1
        assert_agree(samples(e.output), want, "bmv2 card")
        g = runner.invoke(cli, ["state", "ring", "-c", str(cfg), "--name", name, "--last", "5", "--json"])
        assert g.exit_code == 0, g.output
        assert [(h["msg_type"], h["msg_id"], h["client_id"], h["ingress_port"], h["num_tables"], h["num_keys"],
                 h["value_len"], h["msg_len"], h["table_id"]) for h in json.loads(g.output)] == [
            (MsgType.LOOKUP_REPLY, 42, 1, 1, 1, 3, 18, 18, NO_TABLE), (MsgType.LOOKUP_REQ, 42, 1, 0, 1, 3, 18, 40, NO_TABLE)]
        d = runner.invoke(cli, ["state", "summary", "-c", str(cfg), "--name", name, "--json"])
        assert d.exit_code == 0, d.output
        assert json.loads(d.output)["entries"] == 0  # the reply freed the entry
    finally:
        u = runner.invoke(cli, ["pipeline", "unload", "--name", name])
    assert u.exit_code == 0, u.output
    assert "unloaded pipeline" in u.output
    assert st["netns"] not in sh("ip", "netns", "list")
    # nothing of the load is left in the run directory but the switch's logs (as the dpdk target)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [f"{name}.log.out", f"{name}.log.txt"]


def test_runtime_route_and_client_changes_keep_switch_up(wiring, channel_env, tmp_path, monkeypatch):
    """Regression (Thrift): BMv2 restores saved entries but would then hand out handle 0 again, so
    the first runtime ``table_add`` overwrote a restored entry and the next ``table_dump`` (route
    list) killed simple_switch. Entries added after load must sit beside the loaded ones. Over
    P4Runtime the same changes are Write RPCs (replacing a route modifies it in place)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(config_text())
    monkeypatch.setenv("EMBNIC_RUN_DIR", str(tmp_path / "run"))
    name = f"e12r{TAG}"
    runner = CliRunner()
    vdevs = [a for i, f in enumerate(wiring["ifaces"]) for a in ("--vdev", f"net_af_packet{i},iface={f}")]
    r = runner.invoke(cli, ["pipeline", "load", "-c", str(cfg), "--name", name, *vdevs])
    assert r.exit_code == 0, r.output

    def routes():
        ls = runner.invoke(cli, ["route", "list", "--name", name, "--json"])
        assert ls.exit_code == 0, ls.output
        return [(e["shard"], e["port"], e["mac"], e["ip"], e["udp_port"]) for e in json.loads(ls.output)]

    def clients():
        ls = runner.invoke(cli, ["client", "list", "--name", name, "--json"])
        assert ls.exit_code == 0, ls.output
        return [(e["client"], e["port"], e["mac"], e["ip"], e["udp_port"]) for e in json.loads(ls.output)]

    try:
        a = runner.invoke(cli, ["route", "add", "--name", name, "5", "--port", "1", "--mac", "02:5a:00:00:00:05",
                                "--ip", "10.88.1.5"])
        assert a.exit_code == 0, a.output
        assert routes() == [(0, 1, SHARD_MAC, "10.88.1.2", 7878), (5, 1, "02:5a:00:00:00:05", "10.88.1.5", 7878)]
        # a route replaced: the entry changes in place, its allowlist entry follows the new address
        a = runner.invoke(cli, ["route", "add", "--name", name, "5", "--port", "1", "--mac", "02:5a:00:00:00:55",
                                "--ip", "10.88.1.55", "--udp-port", "7879"])
        assert a.exit_code == 0, a.output
        assert routes() == [(0, 1, SHARD_MAC, "10.88.1.2", 7878), (5, 1, "02:5a:00:00:00:55", "10.88.1.55", 7879)]
        a = runner.invoke(cli, ["route", "add", "--name", name, "6", "--port", "7", "--mac", "02:5a:00:00:00:06",
                                "--ip", "10.88.1.6"])
        assert a.exit_code == 2 and "--port 7" in a.output, a.output
        a = runner.invoke(cli, ["client", "add", "--name", name, "2", "--port", "0", "--mac", "02:c1:00:00:00:02",
                                "--ip", "10.88.0.3", "--udp-port", "40002"])
        assert a.exit_code == 0, a.output
        assert clients() == [(1, 0, CLIENT_MAC, "10.88.0.2", 40001), (2, 0, "02:c1:00:00:00:02", "10.88.0.3", 40002)]
        d = runner.invoke(cli, ["client", "del", "--name", name, "2"])
        assert d.exit_code == 0, d.output
        assert clients() == [(1, 0, CLIENT_MAC, "10.88.0.2", 40001)]
        d = runner.invoke(cli, ["route", "del", "--name", name, "5"])
        assert d.exit_code == 0, d.output
        assert routes() == [(0, 1, SHARD_MAC, "10.88.1.2", 7878)]
        s = runner.invoke(cli, ["status", "-c", str(cfg), "--name", name, "--json"])
        assert s.exit_code == 0, s.output
        ps = runner.invoke(cli, ["pipeline", "status", "--name", name])
        assert ps.exit_code == 0 and "running (bmv2 target" in ps.output, ps.output
    finally:
        u = runner.invoke(cli, ["pipeline", "unload", "--name", name])
    assert u.exit_code == 0, u.output


@pytest.fixture
def addressed_netns():
    """A namespace holding a veth pair, both ends up with IPv6 on (link-local addresses)."""
    ns = f"e12v{TAG}"
    with Netns.create(ns, ipv6=True) as n:
        n.veth("v0", "v1")
        for dev in ("v0", "v1"):
            n.link_up(dev)
        n.ip("-6", "addr", "add", "fe80::e12:1/64", "dev", "v0", "scope", "link", "nodad")
        yield ns


def test_given_netns_link_local_is_turned_off_other_addresses_refused_at_once(bmv2_ready, addressed_netns,
                                                                              tmp_path, monkeypatch):
    """Regression: IPv6 link-local addresses on the card's veths made load fail after the
    compile (~12 s) with no fix named. The target turns IPv6 off on the card's port interfaces;
    any other address is refused before compiling, in one line naming the command that fixes it."""
    from embnic.client_lib.config import load_config
    from embnic.control.errors import OperationalError
    from embnic.control.targets.bmv2.target import Bmv2Target

    ns = addressed_netns
    assert "fe80::e12:1" in sh("ip", "-n", ns, "-o", "addr", "show", "dev", "v0")
    cfg = tmp_path / "c.toml"
    cfg.write_text(config_text())
    t = Bmv2Target(load_config(cfg), netns=ns, interfaces=["v0", "v1"], run_dir=tmp_path / "run")
    t._prepare_netns(ns, ["v0", "v1"])
    assert {ln.split()[1] for ln in sh("ip", "-n", ns, "-o", "addr", "show").splitlines()} == {"lo"}

    sh("ip", "-n", ns, "addr", "add", "10.88.7.1/24", "dev", "v1")
    monkeypatch.setenv("EMBNIC_RUN_DIR", str(tmp_path / "run"))
    r = CliRunner().invoke(cli, ["pipeline", "load", "-c", str(cfg), "--netns", ns,
                                 "--vdev", "net_af_packet0,iface=v0", "--vdev", "net_af_packet1,iface=v1"])
    assert r.exit_code == 1, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert "v1 10.88.7.1/24" in lines[0] and f"ip -n {ns} addr flush dev v1" in lines[0], lines[0]
    assert not (tmp_path / "run" / "embnic.json").exists()  # refused before anything started
    with pytest.raises(OperationalError, match="omit --netns"):
        t._prepare_netns(ns, ["v0", "v1"])


def test_handle_zero_placeholders_pick_unused_keys():
    from embnic.control.targets.bmv2.target import handle_zero_placeholders
    cmds = ["table_add t a 0 => 1 2", "table_add t a 1 => 3 4", "table_add u b 0 7 0 => ",
            "table_add u b 0 7 1 =>", "register_write r 0 5", "table_add v c => 1"]
    adds, dels = handle_zero_placeholders(cmds)
    assert adds == ["table_add t a 2 => 1 2", "table_add u b 0 7 2 =>"]
    assert dels == ["table_delete t 0", "table_delete u 0"]


def test_a_missing_interface_is_a_usage_error_before_anything_moves(tmp_path, monkeypatch):
    """Regression: a mistyped iface= failed after the compile as 'cannot set up namespace ...:
    Command [...] returned non-zero exit status 1', after moving the ports before it into a
    namespace that was then deleted (which destroys a veth pair). No p4c or root needed (a missing
    tool is reported first: test_missing_tool_is_one_line_missing_dependency)."""
    from embnic.client_lib.config import load_config
    from embnic.control.errors import UsageError
    from embnic.control.targets.bmv2.target import Bmv2Target

    cfg = tmp_path / "c.toml"
    cfg.write_text(config_text())
    # names no interface has: the test must never move a real one (before the fix, load moved
    # every port's interface up to the missing one into a namespace it then deleted)
    monkeypatch.setattr(Bmv2Target, "_tools", lambda self, channel: None)  # p4c & co. need not be here (checked first)
    t = Bmv2Target(load_config(cfg), interfaces=[f"qanone{TAG}a", f"qanone{TAG}b"], name=f"qa{TAG}",
                   run_dir=tmp_path / "run")
    with pytest.raises(UsageError, match=f"card port 0: no interface 'qanone{TAG}a' in this network namespace"):
        t.load()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("channel", ["thrift", "p4runtime"])
def test_a_card_switch_that_fails_after_starting_is_stopped(tmp_path, monkeypatch, channel):
    """Regression: when the card's switch had started and then failed (not ready, a failed
    programming), ``load``'s clean-up did not know it (it was made in a helper), so it kept
    running while its state file was removed: an orphan simple_switch. No BMv2 needed (fakes)."""
    from embnic.client_lib.config import load_config
    from embnic.control.errors import OperationalError
    from embnic.control.targets.bmv2 import switch, target as bt

    switches = []

    class FakeSwitch:
        def __init__(self, json_path, ns, ports, *, log, restore_state=None, thrift_port=9090, grpc_addr=None):
            self.log, self.grpc_addr, self.log_file, self.calls = log, grpc_addr, log, []
            switches.append(self)

        def start(self):
            self.calls.append("start")
            return os.getpid()

        def wait_ready(self, timeout):
            if self.log == t.log_path:  # the card's switch (not the Thrift channel's programming one)
                raise switch.Bmv2Error("simple_switch exited with 1: (fake)")

        def cli(self, commands):
            return ""

        def save_state(self, path):
            pass

        def command(self):
            return ["simple_switch"]

        def stop(self, timeout=10.0):
            self.calls.append("stop")

    class FakeNetns:
        name = f"fake{TAG}"

    monkeypatch.setattr(switch, "SimpleSwitch", FakeSwitch)
    monkeypatch.setattr(bt.Bmv2Target, "_tools", lambda self, channel: None)
    monkeypatch.setattr(bt.Bmv2Target, "_prepare_netns", lambda self, name, ports: FakeNetns())
    monkeypatch.setattr(bt.Bmv2Target, "_check_loopback_only", staticmethod(lambda ns: None))
    monkeypatch.setattr(bt, "tune_port_interfaces", lambda ns, ifaces: None)
    monkeypatch.setattr(bt, "require_root", lambda *a, **kw: None)
    cfg = tmp_path / "c.toml"
    cfg.write_text(config_text())
    json_path = tmp_path / "embnic.json"
    json_path.write_text("{}")
    t = bt.Bmv2Target(load_config(cfg), netns=f"fake{TAG}", interfaces=["v0", "v1"], channel=channel,
                      json_path=json_path, run_dir=tmp_path / "run")
    with pytest.raises(OperationalError, match="exited with 1"):
        t.load()
    card = [s for s in switches if s.log == t.log_path]
    assert len(card) == 1 and card[0].calls == ["start", "stop"]
    assert all(s.calls in ([], ["start", "stop"]) for s in switches)  # the programming switch stopped too
    assert t.state() is None
