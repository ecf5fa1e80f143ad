"""`embnic config check|show` and settings precedence (defaults < config < env < flags).

Run alone: python3 -m pytest -q tests/control/test_cli_config.py
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from embnic.control import settings

REPO = Path(__file__).resolve().parents[2]


def test_check_example_ok(invoke):
    r = invoke("config", "check", REPO / "examples" / "cluster.toml")
    assert r.exit_code == 0, r.output
    assert "cluster.toml: ok" in r.output
    assert "2 shard(s)" in r.output


def test_check_names_the_field(invoke, tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text((REPO / "examples" / "cluster.toml").read_text().replace("dim = 8", "dim = 0", 1))
    r = invoke("config", "check", p)
    assert r.exit_code == 2
    assert "tables[0].dim: must be 1..4096, got 0" in r.output
    assert "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_check_missing_file_and_bad_toml(invoke, tmp_path):
    r = invoke("config", "check", tmp_path / "nope.toml")
    assert r.exit_code == 2 and "cannot read config" in r.output and "<file>" not in r.output
    assert r.output.startswith(f"Error: {tmp_path / 'nope.toml'}: cannot read config: "), r.output
    p = tmp_path / "x.toml"
    p.write_text("[cluster\n")
    r = invoke("config", "check", p)
    assert r.exit_code == 2 and "not valid TOML" in r.output


def test_check_without_file(invoke):
    r = invoke("config", "check")
    assert r.exit_code == 2
    assert "EMBNIC_CONFIG" in r.output


def test_check_uses_env(invoke, monkeypatch):
    monkeypatch.setenv("EMBNIC_CONFIG", str(REPO / "examples" / "cluster.toml"))
    r = invoke("config", "check")
    assert r.exit_code == 0 and ": ok" in r.output


def test_check_control_section(invoke, card_config):
    card_config.write_text(card_config.read_text() + '\n[control]\nvdevs = "net_ring0"\n')
    r = invoke("config", "check", card_config)
    assert r.exit_code == 2
    assert "control.vdevs: must be a list of strings" in r.output
    card_config.write_text(card_config.read_text().replace('vdevs = "net_ring0"', 'colour = "red"'))
    r = invoke("config", "check", card_config)
    assert r.exit_code == 2 and "control.colour: unknown field" in r.output
    card_config.write_text(card_config.read_text().replace('colour = "red"', 'vdev = ["net_ring0"]'))
    r = invoke("config", "check", card_config)
    assert r.exit_code == 2 and "control.vdev: unknown field (did you mean 'vdevs'?)" in r.output
    card_config.write_text(card_config.read_text().replace('vdev = ["net_ring0"]', 'target = "p4nic"'))
    r = invoke("config", "check", card_config)
    assert r.exit_code == 2
    assert "control.target: no target 'p4nic'; available: bmv2, dpdk" in r.output


def test_check_warns_about_missing_mac(invoke, card_config):
    card_config.write_text(card_config.read_text().replace('mac = "02:00:00:00:01:02"\n', ""))
    r = invoke("config", "check", card_config)
    assert r.exit_code == 0
    assert "warning:" in r.output and "shards[0].mac: required to program the card" in r.output
    r = invoke("config", "check", "--strict", card_config)
    assert r.exit_code == 2
    assert "shards[0].mac" in r.output


def test_check_and_show_print_every_card_setting(invoke, card_config):
    card_config.write_text(card_config.read_text().replace('lcores = "0"', 'lcores = "0,1"\nstate_lcores = 2'))
    for cmd in ("check", "show"):
        r = invoke("config", cmd, card_config)
        assert r.exit_code == 0, r.output
        assert "ring 1024, state 4096, lcores 0,1, state lcores 2" in r.output
    assert "expires" in invoke("config", "check", card_config).output  # state_timeout_ms: in the state map line
    assert json.loads(invoke("config", "show", "--json", card_config).output)["card"]["state_lcores"] == 2


def test_show_json(invoke, card_config):
    r = invoke("config", "show", "--json", card_config)
    assert r.exit_code == 0
    d = json.loads(r.output)
    assert [s["id"] for s in d["shards"]] == [0, 1]
    assert d["card"]["ring_size"] == 1024
    r = invoke("config", "show", card_config)
    assert r.exit_code == 0 and "10.0.1.2:7878 mac 02:00:00:00:01:02 via card port 1" in r.output


def test_precedence_default_config_env_flag(env, card_config, monkeypatch):
    s = settings.resolve(None)
    assert (s.target, s.name, s.ctl, s.netns) == ("dpdk", "embnic", None, None)
    card_config.write_text(card_config.read_text() + '\n[control]\nname = "fromcfg"\nctl = "/cfg.sock"\n'
                           'vdevs = ["net_null0"]\nbinary = "bin/dp"\neal_args = "-l 0 --no-huge"\n')
    s = settings.resolve(str(card_config))
    assert (s.name, s.ctl, s.vdevs, s.eal_args) == ("fromcfg", "/cfg.sock", ("net_null0",), ["-l", "0", "--no-huge"])
    assert s.binary == str(card_config.parent / "bin" / "dp")  # relative to the config file
    monkeypatch.setenv("EMBNIC_DP", "/env/dp")
    monkeypatch.setenv("EMBNIC_EAL_ARGS", "-l 1")
    monkeypatch.setenv("EMBNIC_NETNS", "envns")
    s = settings.resolve(str(card_config))
    assert (s.binary, s.eal_args, s.netns) == ("/env/dp", ["-l", "1"], "envns")
    s = settings.resolve(str(card_config), name="flag", ctl="/flag.sock", binary="/flag/dp", eal_args="-l 2",
                        vdevs=("net_ring0",), netns="flagns")
    assert (s.name, s.ctl, s.binary, s.eal_args, s.vdevs, s.netns) == \
        ("flag", "/flag.sock", "/flag/dp", ["-l", "2"], ("net_ring0",), "flagns")


def test_env_beats_config_through_click(invoke, card_config, env, monkeypatch):
    """EMBNIC_CTL (env) wins over [control] ctl; --ctl wins over EMBNIC_CTL."""
    from ctl_fake_card import FakeCard

    a, b = FakeCard(str(env / "a.sock")).start(), FakeCard(str(env / "b.sock")).start()
    try:
        card_config.write_text(card_config.read_text() + f'\n[control]\nctl = "{env / "nobody.sock"}"\n')
        r = invoke("route", "list", "--config", card_config)
        assert r.exit_code == 1 and "nobody.sock" in r.output
        monkeypatch.setenv("EMBNIC_CTL", a.path)
        r = invoke("route", "list", "--config", card_config)
        assert r.exit_code == 0 and len(a.requests) == 1 and not b.requests
        r = invoke("route", "list", "--config", card_config, "--ctl", b.path)
        assert r.exit_code == 0 and len(a.requests) == 1 and len(b.requests) == 1
    finally:
        a.stop()
        b.stop()


def test_bad_config_on_any_command(invoke, tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('[cluster]\nmtu = "big"\n')
    r = invoke("route", "list", "--config", p)
    assert r.exit_code == 2
    assert "cluster.mtu: must be int" in r.output


def test_bad_name(invoke):
    r = invoke("route", "list", "--name", "../etc")
    assert r.exit_code == 2 and "not a valid name" in r.output


def test_check_misspelled_section_and_fields(invoke, card_config):
    """A misspelled section or key used to pass silently (only [control] was checked)."""
    good = card_config.read_text()
    for old, new, want in [
        ("[cluster]", "[clustr]", "clustr: unknown section (did you mean 'cluster'?)"),
        ("udp_port = 7878\n", "udpport = 7878\n", "cluster.udpport: unknown field (did you mean 'udp_port'?)"),
        ("rows = 100", "rows = 100\nlearning_rate = 0.1", "tables[0].learning_rate: unknown field"),
        ('card_port = 2', 'card_prot = 2', "shards[1].card_prot: unknown field (did you mean 'card_port'?)"),
        ("port = 40000", "prot = 40000", "clients[0].prot: unknown field (did you mean 'port'?)"),
        ("ring_size = 1024", "ringsize = 1024", "card.ringsize: unknown field (did you mean 'ring_size'?)"),
    ]:
        assert old in good, old
        card_config.write_text(good.replace(old, new, 1))
        r = invoke("config", "check", card_config)
        assert r.exit_code == 2, (new, r.output)
        assert f"{card_config}: {want}" in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1


def test_check_clashes(invoke, card_config):
    good = card_config.read_text()
    for old, new, want in [
        ('ip = "10.0.1.3"\nport = 7879', 'ip = "10.0.1.2"\nport = 7878',
         "shards[1].port: 10.0.1.2:7878 is already the address of shards[0] (id 0)"),
        ('ip = "10.0.1.3"', 'ip = "10.0.1.2"', "shards[1].mac: 02:00:00:00:01:03 differs from 02:00:00:00:01:02 "
         "of shards[0] (id 0), which has the same ip 10.0.1.2"),
        ('mac = "02:00:00:00:01:03"', 'mac = "02:00:00:00:00:02"',
         "clients[0].mac: 02:00:00:00:00:02 is already the MAC of shards[1] (id 1)"),
        ('mac = "02:00:00:00:01:03"', 'mac = "ff:ff:ff:ff:ff:ff"', "shards[1].mac: ff:ff:ff:ff:ff:ff is a multicast"),
        ('lcores = "0"', 'lcores = "banana"', "card.lcores: 'banana' is not a DPDK core list"),
    ]:
        assert old in good, old
        card_config.write_text(good.replace(old, new, 1))
        r = invoke("config", "check", card_config)
        assert r.exit_code == 2, (new, r.output)
        assert want in r.output, r.output


def test_check_warns_about_cores_this_machine_lacks(invoke, card_config):
    lacking = max(os.sched_getaffinity(0)) + 1
    card_config.write_text(card_config.read_text().replace('lcores = "0"', f'lcores = "0,{lacking}"'))
    r = invoke("config", "check", card_config)
    assert r.exit_code == 0, r.output
    assert f"warning: {card_config}: card.lcores: '0,{lacking}' names core(s) {lacking} but this machine has" \
        in r.stderr
    r = invoke("config", "check", "--strict", card_config)
    assert r.exit_code == 2 and f"names core(s) {lacking}" in r.output


def test_file_is_optional_in_the_usage_line(invoke):
    for sub in ("check", "show"):
        r = invoke("config", sub, "--help")
        assert f"Usage: cli config {sub} [OPTIONS] [FILE]" in r.output


def test_check_states_the_state_map_capacity(invoke):
    """With a [card], check says how many messages in flight the map allows and the loss it
    tolerates at --rate (docs/control-socket.md, "Capacity")."""
    r = invoke("config", "check", "--rate", "1000000", str(REPO / "examples" / "testbed.toml"))
    assert r.exit_code == 0, r.output
    assert "state map: 65,536 messages in flight at once (one round of every client puts 8 in flight)" in r.output
    assert "at 1,000,000 messages/s it tolerates 1.31% of messages unanswered" in r.output
    r = invoke("config", "check", "--rate", "0", str(REPO / "examples" / "testbed.toml"))
    assert r.exit_code == 2


def test_target_defaults_to_the_loaded_pipelines(env, card_config):
    """With no --target/EMBNIC_TARGET/[control] target, a pipeline NAME loaded on bmv2 is addressed as
    bmv2 (its state file says so): `embnic route list --name NAME` must not try the dpdk socket."""
    (env / "tb.json").write_text(json.dumps({"target": "bmv2", "pid": 1, "ctl": "thrift 127.0.0.1:9090"}))
    assert settings.resolve(None, name="tb").target == "bmv2"
    assert settings.resolve(None, name="tb", target="dpdk").target == "dpdk"  # a flag still wins
    assert settings.resolve(None, name="other").target == "dpdk"  # nothing loaded: the default
    (env / "bad.json").write_text("{not json")
    assert settings.resolve(None, name="bad").target == "dpdk"  # a damaged state file: the default


@pytest.mark.parametrize("example,cluster", [("cluster.toml", "loopback"), ("testbed.toml", "testbed"),
                                             ("testbed-shared.toml", "shared")])
@pytest.mark.parametrize("how", ["arg", "-c"])
def test_check_and_show_name_the_cluster_not_a_table(invoke, example, cluster, how):
    # a table loop's `name` once overwrote the cluster's: "cluster 'C26'"
    path = str(REPO / "examples" / example)
    for cmd in ("check", "show"):
        r = invoke("config", cmd, *((path,) if how == "arg" else ("-c", path)))
        assert r.exit_code == 0, r.output
        assert f"cluster '{cluster}':" in r.output
        assert "cluster 'C26'" not in r.output
