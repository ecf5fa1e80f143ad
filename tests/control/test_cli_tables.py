"""`embnic route|client add|del|list` against a fake card socket: arguments, messages, exit codes.

Run alone: python3 -m pytest -q tests/control/test_cli_tables.py
"""
from __future__ import annotations

import json
import socket

ROUTE = ["--port", "1", "--mac", "02:00:00:00:01:09", "--ip", "10.0.1.9", "--udp-port", "7900"]


def test_route_add_with_flags(invoke, card):
    r = invoke("route", "add", "5", *ROUTE)
    assert r.exit_code == 0, r.output
    assert card.requests[-1] == {"cmd": "route_add", "shard": 5, "port": 1, "mac": "02:00:00:00:01:09",
                                 "ip": "10.0.1.9", "udp_port": 7900}
    assert r.output.startswith("route for shard 5 → port 1, 02:00:00:00:01:09, 10.0.1.9:7900")


def test_route_add_from_config_and_override(invoke, card, card_config):
    r = invoke("route", "add", "1", "--config", card_config)
    assert r.exit_code == 0, r.output
    assert card.routes[1] == {"shard": 1, "port": 2, "mac": "02:00:00:00:01:03", "ip": "10.0.1.3", "udp_port": 7879}
    r = invoke("route", "add", "1", "--config", card_config, "--mac", "02:AA:00:00:01:03")
    assert r.exit_code == 0
    assert card.routes[1]["mac"] == "02:aa:00:00:01:03"


def test_route_default_udp_port_without_config(invoke, card):
    r = invoke("route", "add", "2", "--port", "0", "--mac", "02:00:00:00:00:05", "--ip", "10.0.0.5")
    assert r.exit_code == 0, r.output
    assert card.routes[2]["udp_port"] == 7878


def test_route_list_text_and_json(invoke, card, card_config):
    assert invoke("route", "list").output.startswith("no routes")
    invoke("route", "add", "0", "-c", card_config)
    invoke("route", "add", "1", "-c", card_config)
    r = invoke("route", "list")
    assert r.exit_code == 0
    lines = r.output.strip().splitlines()
    assert lines[0].split() == ["SHARD", "PORT", "MAC", "IP", "UDP"]
    assert lines[1].split() == ["0", "1", "02:00:00:00:01:02", "10.0.1.2", "7878"]
    assert lines[2].split() == ["1", "2", "02:00:00:00:01:03", "10.0.1.3", "7879"]
    d = json.loads(invoke("route", "list", "--json").output)
    assert d == [card.routes[0], card.routes[1]]


def test_route_del(invoke, card):
    invoke("route", "add", "5", *ROUTE)
    r = invoke("route", "del", "5")
    assert r.exit_code == 0 and 5 not in card.routes
    assert r.output.strip() == "deleted route for shard 5"
    r = invoke("route", "del", "5")  # an unknown id is a usage error, like everywhere
    assert r.exit_code == 2
    assert "the card has no route for shard 5: `embnic route list` shows what it has" in r.output
    assert r.output.count("shard 5") == 1  # said once
    assert "embnic route list" in r.output and "Traceback" not in r.output


def test_route_to_unknown_shard(invoke, card, card_config):
    r = invoke("route", "add", "9", "--config", card_config)
    assert r.exit_code == 2
    assert "unknown shard 9" in r.output and "has shards 0, 1" in r.output and "[[shards]]" in r.output
    assert not card.requests


def test_malformed_addresses(invoke, card):
    r = invoke("route", "add", "5", "--port", "1", "--mac", "02:00:00:00:01", "--ip", "10.0.1.9")
    assert r.exit_code == 2 and "is not a MAC address (write e.g. 02:00:00:00:00:01)" in r.output
    for group in ("ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:01", "33:33:00:00:00:01"):
        for kind in ("route", "client"):
            r = invoke(kind, "add", "5", *ROUTE[:2], "--mac", group, *ROUTE[4:])
            assert r.exit_code == 2 and "is a multicast/broadcast MAC" in r.output, (kind, group, r.output)
    for ip, what in (("0.0.0.0", "the unspecified"), ("224.0.0.5", "a multicast"), ("255.255.255.255", "the broadcast")):
        for kind in ("route", "client"):
            r = invoke(kind, "add", "5", *ROUTE[:4], "--ip", ip, *ROUTE[6:])
            assert r.exit_code == 2 and f"{ip} is {what} address" in r.output, (kind, ip, r.output)
    assert not card.requests
    r = invoke("route", "add", "5", "--port", "1", "--mac", "02:00:00:00:01:09", "--ip", "10.0.1.300")
    assert r.exit_code == 2 and "is not an IPv4 address" in r.output
    r = invoke("route", "add", "5", *ROUTE[:-2], "--udp-port", "70000")
    assert r.exit_code == 2
    r = invoke("route", "add", "65536", *ROUTE)
    assert r.exit_code == 2
    assert not card.requests


def test_missing_fields_say_which_flag(invoke, card, card_config):
    r = invoke("route", "add", "5", "--port", "1", "--ip", "10.0.1.9")
    assert r.exit_code == 2 and "give --mac" in r.output and "does not resolve MACs" in r.output
    r = invoke("route", "add", "5", "--mac", "02:00:00:00:01:09", "--ip", "10.0.1.9")
    assert r.exit_code == 2 and "give --port" in r.output
    card_config.write_text(card_config.read_text().replace('mac = "02:00:00:00:01:02"\n', ""))
    r = invoke("route", "add", "0", "-c", card_config)
    assert r.exit_code == 2 and "shard 0 has no MAC in" in r.output


def test_port_not_on_card(invoke, card, card_config):
    r = invoke("route", "add", "0", "-c", card_config, "--port", "3")
    assert r.exit_code == 2 and "the card has no port 3" in r.output


def test_card_refusals_exit_by_kind(invoke, card):
    """Without a config only the card knows its ports: its refusal of an argument ("kind":
    "argument") exits 2 naming the option; a request it cannot carry out ("failure") exits 1."""
    fields = ["--mac", "02:00:00:00:01:09", "--ip", "10.0.1.9", "--udp-port", "7000"]
    r = invoke("route", "add", "5", "--port", "7", *fields)
    assert r.exit_code == 2, r.output
    assert r.output.startswith("Error: --port 7: card refused route_add: field 'port' must be an integer 0..2") and \
        len(r.output.strip().splitlines()) == 1, r.output
    card.table_size = 0
    r = invoke("route", "add", "5", "--port", "1", *fields)
    assert r.exit_code == 1 and "card refused route_add: shard table is full (0 entries)" in r.output, r.output


def test_loopback_and_the_cards_own_address_or_mac_are_refused(invoke, card, card_config):
    """What the config refuses for its own entries, the flags may not bring in either."""
    card_config.write_text(card_config.read_text().replace('{ id = 0, ip = "10.0.0.1" }',
                                                           '{ id = 0, ip = "10.0.0.1", mac = "02:00:00:00:00:01" }'))
    for args, msg in ((["--ip", "127.0.0.1"], "--ip 127.0.0.1 is a loopback address"),
                      (["--ip", "10.0.1.1"], "--ip 10.0.1.1 is the card's own address on port 1"),
                      (["--mac", "02:00:00:00:00:01"], "--mac 02:00:00:00:00:01 is the MAC of card port 0")):
        r = invoke("route", "add", "1", "-c", card_config, *args)
        assert r.exit_code == 2 and msg in r.output, r.output
        r = invoke("client", "add", "1", "-c", card_config, *args)
        assert r.exit_code == 2 and msg in r.output, r.output
    assert not card.requests
    r = invoke("route", "add", "5", "--port", "1", "--mac", "02:00:00:00:01:09", "--ip", "127.0.0.2")
    assert r.exit_code == 2 and "loopback" in r.output and not card.requests


def test_client_add_list_del(invoke, card, card_config):
    r = invoke("client", "add", "1", "-c", card_config)
    assert r.exit_code == 0, r.output
    assert r.output.startswith("client 1 → port 0, 02:00:00:00:00:02, 10.0.0.2:40000")  # not "client client 1"
    assert card.requests[-1] == {"cmd": "client_add", "client": 1, "port": 0, "mac": "02:00:00:00:00:02",
                                 "ip": "10.0.0.2", "udp_port": 40000}
    r = invoke("client", "list")
    assert r.output.strip().splitlines()[1].split() == ["1", "0", "02:00:00:00:00:02", "10.0.0.2", "40000"]
    assert json.loads(invoke("client", "list", "--json").output)[0]["client"] == 1
    r = invoke("client", "add", "4", "-c", card_config)
    assert r.exit_code == 2 and "unknown client 4" in r.output
    r = invoke("client", "add", "4", "--port", "0", "--mac", "02:00:00:00:00:04", "--ip", "10.0.0.4")
    assert r.exit_code == 2 and "give --udp-port" in r.output
    r = invoke("client", "del", "1")
    assert r.exit_code == 0 and r.output.strip() == "deleted client 1"  # not "deleted client for client 1"
    r = invoke("client", "del", "1")
    assert r.exit_code == 2 and "the card has no client 1: `embnic client list` shows what it has" in r.output


def test_socket_absent(invoke, env):
    r = invoke("route", "list")
    assert r.exit_code == 1
    out = r.output.strip()
    assert "pipeline not loaded" in out and "embnic pipeline load" in out and str(env / "embnic.sock") in out
    assert "a testbed's card: -c RUN_DIR/testbed-NAME/cluster.toml" in out  # the trial's README line failed so
    assert len(out.splitlines()) == 1


def test_socket_stale(invoke, env):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(env / "embnic.sock"))
    s.close()  # the file stays, nobody listens
    r = invoke("status")
    assert r.exit_code == 1 and "pipeline not loaded: nothing answers" in r.output


def test_name_selects_socket(invoke, env):
    from ctl_fake_card import FakeCard

    c = FakeCard(str(env / "other.sock")).start()
    try:
        r = invoke("route", "list", "--name", "other")
        assert r.exit_code == 0 and c.requests
        r = invoke("route", "list", "--name", "third")
        assert r.exit_code == 1 and "--name third" in r.output
    finally:
        c.stop()


def test_no_root_on_socket(invoke, env, monkeypatch):
    """A non-root user cannot connect to the 0600 root socket: the message says to run as root."""
    import embnic.control.ctlsock as cs

    class Denied(socket.socket):
        def connect(self, addr):
            raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cs.socket, "socket", Denied)
    open(env / "embnic.sock", "w").close()
    r = invoke("route", "list")
    assert r.exit_code == 2  # not root: exit 2 everywhere
    assert "permission denied on control socket" in r.output and "run as root" in r.output


def test_one_peer_type_for_both_tables(card_config):
    """Routes and clients are one type (``Peer``, by kind): the config gives shards then clients,
    the control socket's form round-trips, an unknown kind is refused."""
    import pytest

    from embnic.client_lib.config import load_config
    from embnic.control.targets.base import Peer, count_peers, peer_kind, peers_from_config

    peers = peers_from_config(load_config(card_config))
    assert [p.kind for p in peers] == sorted((p.kind for p in peers), key=["shard", "client"].index)
    assert count_peers(peers) == {"routes": sum(p.kind == "shard" for p in peers),
                                  "clients": sum(p.kind == "client" for p in peers)}
    for p in peers:
        assert Peer.from_fields(p.fields()) == p == Peer.from_fields(p.fields(), p.kind)
        assert next(iter(p.fields())) == p.kind and p.spec.noun == ("route" if p.kind == "shard" else "client")
    assert [p.kind for p in peers_from_config(load_config(card_config), ("client",))] == \
        [p.kind for p in peers if p.kind == "client"]
    with pytest.raises(ValueError, match="peer kind 'route'"):
        peer_kind("route")
    with pytest.raises(ValueError):
        Peer("server", 1, 0, "02:00:00:00:00:01", "10.0.0.1", 7878)
