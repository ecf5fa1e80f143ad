"""Cluster config parsing: valid examples load, errors name the field.

Run alone: python3 -m pytest -q tests/client_lib/test_config.py
"""
import dataclasses
from pathlib import Path

import pytest

from embnic.client_lib.config import ConfigError, load_config, parse_config, parse_lcores

ROOT = Path(__file__).resolve().parents[2]


def _raw(**over):
    raw = {
        "cluster": {"mtu": 1500},
        "tables": [{"id": 0, "rows": 100, "dim": 4}],
        "shards": [{"id": 0, "ip": "10.0.0.1"}],
        "clients": [{"id": 1, "ip": "10.0.0.2"}],
    }
    raw.update(over)
    return raw


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.toml")))
def test_examples_load(path):
    cfg = load_config(path)
    assert cfg.tables and cfg.shards and cfg.clients
    assert cfg.name == cfg.raw["cluster"]["name"]       # not the last table's name


@pytest.mark.parametrize("over,field", [
    ({"tables": [{"id": 0, "rows": 100, "dim": 0}]}, "tables[0].dim"),
    ({"tables": [{"id": 0, "rows": 100}]}, "tables[0].dim"),
    ({"tables": [{"id": 0, "rows": 100, "dim": 4, "dtype": "bf16"}]}, "tables[0].dtype"),
    ({"tables": [{"id": 0, "rows": 100, "dim": 4, "optimizer": "adam"}]}, "tables[0].optimizer"),
    ({"tables": [{"id": 0, "rows": 100, "dim": 4}, {"id": 0, "rows": 1, "dim": 1}]}, "tables[1].id"),
    ({"shards": [{"id": 0, "ip": "10.0.0.300"}]}, "shards[0].ip"),
    ({"shards": [{"id": 0, "ip": "10.0.0.3", "mac": "zz:00:00:00:00:00"}]}, "shards[0].mac"),
    ({"clients": []}, "clients"),
    ({"cluster": {"sharding": "range"}}, "cluster.sharding"),
    ({"cluster": {"mtu": "big"}}, "cluster.mtu"),
    ({"card": {"ports": [{"id": 0, "ip": "10.0.0.9"}]}}, "shards[0].card_port"),
    ({"tables": [{"id": 0, "rows": 100, "dim": 4, "shard": 5}]}, "tables[0].shard"),
    ({"tables": [{"id": 0, "rows": 0, "dim": 4}]}, "tables[0].rows"),
    ({"tables": [{"id": 0, "rows": "many", "dim": 4}]}, "tables[0].rows"),
])
def test_errors_name_the_field(over, field):
    with pytest.raises(ConfigError) as e:
        parse_config(_raw(**over))
    assert e.value.field == field
    assert str(e.value).startswith(field + ":")


def _table(**kw):
    return {"id": 0, "rows": 100, "dim": 4, **kw}


@pytest.mark.parametrize("over,field,msg", [
    # two tables of one name: `tables export` would write one over the other, TorchRec keys clash
    ([_table(name="C1"), _table(id=1, name="C1")], "tables[1].name", "duplicate table name 'C1' (also tables[0])"),
    ([_table(name="t1"), _table(id=1)], "tables[1].name", "duplicate table name 't1'"),  # the default name
    ([_table(name="")], "tables[0].name", "must not be empty"),
    ([_table(lr=float("inf"))], "tables[0].lr", "finite number > 0"),
    ([_table(eps=-1.0)], "tables[0].eps", "finite number > 0"),
    ([_table(eps=0.0)], "tables[0].eps", "finite number > 0"),
    ([_table(eps=float("nan"))], "tables[0].eps", "finite number > 0"),
    ([_table(init_scale=float("nan"))], "tables[0].init_scale", "finite number >= 0"),
    ([_table(init_scale=-0.5)], "tables[0].init_scale", "finite number >= 0"),
    ([_table(init_scale=1e300)], "tables[0].init_scale", "float32"),  # rows are float32: inf
])
def test_table_names_and_numbers(over, field, msg):
    with pytest.raises(ConfigError) as e:
        parse_config(_raw(tables=over))
    assert e.value.field == field
    assert msg in str(e.value)


def test_table_number_edges_accepted():
    cfg = parse_config(_raw(tables=[_table(init_scale=0.0, eps=1e-30, lr=3.4e38)]))
    assert cfg.tables[0].init_scale == 0.0 and cfg.tables[0].eps == 1e-30


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[cluster\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_request_destination_direct_and_card():
    cfg = parse_config(_raw())
    assert cfg.request_destination(1, 0) == ("10.0.0.1", 7878)
    raw = _raw(card={"ports": [{"id": 0, "ip": "10.1.0.1"}, {"id": 1, "ip": "10.2.0.1"}]})
    raw["shards"][0]["card_port"] = 1
    raw["clients"][0]["card_port"] = 0
    cfg = parse_config(raw)
    assert cfg.request_destination(1, 0) == ("10.1.0.1", 7878)


def _card_raw(**card):
    """Two shards, two clients, each on a card port of its own (the testbed shape)."""
    raw = _raw(shards=[{"id": 0, "ip": "10.0.2.2", "card_port": 2, "mac": "02:00:00:00:02:02"},
                       {"id": 1, "ip": "10.0.3.2", "card_port": 3, "mac": "02:00:00:00:03:02"}],
               clients=[{"id": 1, "ip": "10.0.0.2", "card_port": 0, "mac": "02:00:00:00:00:02"},
                        {"id": 2, "ip": "10.0.1.2", "card_port": 1, "mac": "02:00:00:00:01:02"}])
    raw["card"] = {"ports": [{"id": i, "ip": f"10.0.{i}.1", "mac": f"02:ee:00:00:00:0{i}"} for i in range(4)],
                   **card}
    return raw


@pytest.mark.parametrize("mutate,field,hint", [
    (lambda r: r.update(clustr=r.pop("cluster")), "clustr", "did you mean 'cluster'?"),
    (lambda r: r.update(table=r.pop("tables")), "table", "did you mean 'tables'?"),
    (lambda r: r["cluster"].update(udpport=7000), "cluster.udpport", "did you mean 'udp_port'?"),
    (lambda r: r["tables"][0].update(optimiser="sgd"), "tables[0].optimiser", "did you mean 'optimizer'?"),
    (lambda r: r["shards"][1].update(card_prt=3), "shards[1].card_prt", "did you mean 'card_port'?"),
    (lambda r: r["clients"][0].update(mca="02:00:00:00:00:09"), "clients[0].mca", "did you mean 'mac'?"),
    (lambda r: r["card"].update(lcore="0"), "card.lcore", "did you mean 'lcores'?"),
    (lambda r: r["card"]["ports"][2].update(nmae="x"), "card.ports[2].nmae", "did you mean 'name'?"),
    (lambda r: r["cluster"].update(colour="red"), "cluster.colour", "known: name, udp_port"),
])
def test_unknown_sections_and_fields_suggest_the_closest(mutate, field, hint):
    raw = _card_raw()
    mutate(raw)
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    assert e.value.field == field
    assert "unknown" in e.value.message and hint in e.value.message


def test_many_nodes_per_card_port_and_clients_sharing_a_host():
    """Two card ports, each an L2 segment: port 0 has clients 1-4 on two hosts (one IPv4 and MAC,
    distinct UDP ports) and shard 0; port 1 has shards 1-3. A valid config (issue 11)."""
    host = [("10.0.0.2", "02:00:00:00:00:02"), ("10.0.0.3", "02:00:00:00:00:03")]
    raw = _raw(shards=[{"id": 0, "ip": "10.0.0.9", "card_port": 0, "mac": "02:00:00:00:00:09"}]
               + [{"id": s, "ip": f"10.0.1.{s + 1}", "card_port": 1, "mac": f"02:00:00:00:01:0{s + 1}"}
                  for s in (1, 2, 3)],
               clients=[{"id": c, "ip": host[c % 2][0], "mac": host[c % 2][1], "port": 40000 + c, "card_port": 0}
                        for c in (1, 2, 3, 4)])
    raw["card"] = {"ports": [{"id": i, "ip": f"10.0.{i}.1", "mac": f"02:ee:00:00:00:0{i}"} for i in range(2)]}
    cfg = parse_config(raw)
    assert [c.card_port for c in cfg.clients] == [0, 0, 0, 0]
    assert {(c.ip, c.mac) for c in cfg.clients} == set(host)
    assert cfg.request_destination(3, 2) == ("10.0.0.1", 7878)
    raw["clients"][3]["mac"] = "02:00:00:00:00:03"  # client 4 on host 10.0.0.2 with host 10.0.0.3's MAC
    with pytest.raises(ConfigError, match=r"clients\[3\]\.mac: 02:00:00:00:00:03 differs from 02:00:00:00:00:02"):
        parse_config(raw)


@pytest.mark.parametrize("mutate,field,text", [
    (lambda r: r["shards"][1].update(ip="10.0.2.2"), "shards[1].port",
     "10.0.2.2:7878 is already the address of shards[0] (id 0)"),
    (lambda r: r["clients"][1].update(ip="10.0.0.2"), "clients[1].port",
     "10.0.0.2:40000 is already the address of clients[0] (id 1)"),
    (lambda r: r["clients"][1].update(ip="10.0.0.2", port=40001), "clients[1].mac",
     "02:00:00:00:01:02 differs from 02:00:00:00:00:02 of clients[0] (id 1), which has the same ip 10.0.0.2"),
    (lambda r: r["clients"][1].update(ip="10.0.0.2", port=40001, mac="02:00:00:00:00:02"), "clients[1].card_port",
     "1 differs from 0 of clients[0] (id 1), which has the same ip 10.0.0.2"),
    (lambda r: r["clients"][0].update(ip="10.0.0.1"), "clients[0].ip", "10.0.0.1 is the address of card port 0"),
    (lambda r: r["clients"][1].update(mac="02:00:00:00:02:02"), "clients[1].mac",
     "02:00:00:00:02:02 is already the MAC of shards[0] (id 0)"),
    (lambda r: r["shards"][0].update(mac="02:EE:00:00:00:01"), "shards[0].mac",
     "02:ee:00:00:00:01 is already the MAC of card.ports[1] (id 1)"),
    (lambda r: r["card"]["ports"][3].update(mac="02:ee:00:00:00:00"), "card.ports[3].mac", "already the MAC of"),
    (lambda r: r["shards"][0].update(mac="ff:ff:ff:ff:ff:ff"), "shards[0].mac", "multicast/broadcast"),
    (lambda r: r["clients"][0].update(mac="01:00:5e:00:00:01"), "clients[0].mac", "multicast/broadcast"),
    (lambda r: r["card"]["ports"][0].update(mac="33:33:00:00:00:01"), "card.ports[0].mac", "multicast/broadcast"),
    (lambda r: r["clients"][0].update(ip="0.0.0.0"), "clients[0].ip", "0.0.0.0 is the unspecified address"),
    (lambda r: r["shards"][1].update(ip="239.1.2.3"), "shards[1].ip", "239.1.2.3 is a multicast address"),
    (lambda r: r["card"]["ports"][0].update(ip="255.255.255.255"), "card.ports[0].ip", "is the broadcast address"),
    (lambda r: r["card"].update(lcores="banana"), "card.lcores", "is not a DPDK core list"),
    (lambda r: r["card"].update(lcores="3-1"), "card.lcores", "goes backwards"),
    (lambda r: r["card"].update(lcores="0,200"), "card.lcores", "out of range"),
    (lambda r: r["card"].update(lcores="0,1", state_lcores=3), "card.state_lcores",
     "3 state lcores need at least as many lcores, but lcores = '0,1' names 2"),
    (lambda r: r["card"].update(state_lcores=0), "card.state_lcores", "0"),
    (lambda r: r["card"].update(state_lcore=2), "card.state_lcore", "did you mean 'state_lcores'?"),
])
def test_clashes_and_bad_addresses_name_the_field(mutate, field, text):
    raw = _card_raw()
    parse_config(raw)  # valid before the mutation
    mutate(raw)
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    assert e.value.field == field
    assert text in e.value.message


def test_shared_card_port_is_fine_without_the_card():
    raw = _card_raw(enabled=False)
    raw["shards"][1]["card_port"] = 2
    assert parse_config(raw).shard(1).card_port == 2


def test_same_ip_different_ports_is_fine():
    raw = _raw(shards=[{"id": 0, "ip": "127.0.0.1", "port": 7000}, {"id": 1, "ip": "127.0.0.1", "port": 7001}],
               clients=[{"id": 1, "ip": "127.0.0.1", "port": 7000}])  # a client may share a shard's address
    assert parse_config(raw).num_shards == 2


def test_parse_lcores():
    assert parse_lcores("0") == [0]
    assert parse_lcores("0,1") == [0, 1]
    assert parse_lcores("0-3,6,2") == [0, 1, 2, 3, 6]
    for bad in ("", "banana", "0,", "-1", "1-", "0;1", "0x1"):
        with pytest.raises(ValueError):
            parse_lcores(bad)


def test_rows_is_optional():
    """Without rows a table takes any uint64 id (collision-free); with it, ids are < rows."""
    cfg = parse_config(_raw(tables=[{"id": 0, "dim": 4}, {"id": 1, "rows": 2**63 - 1, "dim": 4}]))
    assert cfg.table(0).rows is None and cfg.table(1).rows == 2**63 - 1


# ---- the card's state map: messages in flight and loss tolerance (docs/control-socket.md) ------

def test_state_map_plan():
    from embnic.client_lib.statemap import state_map_plan

    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / "testbed.toml")
    p = state_map_plan(cfg, rate=100_000)
    # protocol v2: 2 clients x 2 shards (hash sharding: a round touches both), a message and its
    # tail probe each: one round puts 8 messages in flight (v1: 104, one per table and shard)
    assert (p.capacity, p.timeout_s, p.round_messages) == (65536, 5.0, 8)
    assert p.loss_tolerated == pytest.approx((65536 - 8) / (100_000 * 5.0))
    assert "65,536 messages in flight" in p.describe() and "13.11% of messages unanswered" in p.describe()
    # table sharding: the shards that hold a table (table t on shard t mod 2: both)
    t = state_map_plan(dataclasses.replace(cfg, sharding="table"), rate=100_000)
    assert t.round_messages == 8
    one = dataclasses.replace(cfg, sharding="table", tables=tuple(dataclasses.replace(x, shard=cfg.shards[0].id)
                                                                   for x in cfg.tables))
    assert state_map_plan(one, rate=100_000).round_messages == 4
    # the running card's size and timeout win; a small enough rate tolerates any loss
    q = state_map_plan(cfg, rate=100, capacity=1024, timeout_ms=1000)
    assert q.loss_tolerated == pytest.approx((1024 - 8) / 100) and "any loss" in q.describe()
    with pytest.raises(ValueError, match="rate"):
        state_map_plan(cfg, rate=0)


@pytest.mark.parametrize("over,field,msg", [
    ({"tables": [_table(store="ssd")]}, "tables[0].store", "must be one of memory, disk, got 'ssd'"),
    ({"tables": [_table(store="disk", cache_rows=0)]}, "tables[0].cache_rows", "must be 1..1099511627776, got 0"),
    ({"tables": [_table(store="memory", cache_rows=10)]}, "tables[0].cache_rows",
     'is the cache of a store = "disk" table'),
    ({"tables": [_table(cache_rows="lots")]}, "tables[0].cache_rows", "must be int"),
    # no store key, and the shards' default is memory (unset or said): ignored before (a new-user trial)
    ({"tables": [_table(cache_rows=10)]}, "tables[0].cache_rows", 'table 0 has no store key and its shards keep'),
    ({"tables": [_table(cache_rows=10)], "shards": [{"id": 0, "ip": "10.0.0.1", "store": "memory"}]},
     "tables[0].cache_rows", 'set store = "disk" (on the table or its shards) or drop cache_rows'),
    ({"tables": [_table(cache_rows=10, shard=0)], "shards": [{"id": 0, "ip": "10.0.0.1"},
                                                             {"id": 1, "ip": "10.0.0.3", "store": "disk"}]},
     "tables[0].cache_rows", "table 0 has no store key"),
    ({"shards": [{"id": 0, "ip": "10.0.0.1", "cache_rows": 10}]}, "shards[0].cache_rows",
     "shard 0 keeps every table in memory"),
    ({"shards": [{"id": 0, "ip": "10.0.0.1", "store": "tape"}]}, "shards[0].store", "must be one of memory, disk"),
    ({"shards": [{"id": 0, "ip": "10.0.0.1", "block_cache_mb": 0}]}, "shards[0].block_cache_mb", "must be 1..1048576"),
    ({"shards": [{"id": 0, "ip": "10.0.0.1", "store_dir": " "}]}, "shards[0].store_dir", "must not be empty"),
    ({"clients": [{"id": 1, "ip": "10.0.0.2", "store": "disk"}]}, "clients[0].store", "unknown field"),
])
def test_disk_tier_keys_are_checked_in_one_line(over, field, msg):
    with pytest.raises(ConfigError) as e:
        parse_config(_raw(**over))
    assert e.value.field == field and msg in str(e.value)
    assert "\n" not in str(e.value)


def test_store_of_resolves_table_shard_and_default():
    cfg = parse_config(_raw(
        tables=[_table(), _table(id=1, name="b", store="disk"), _table(id=2, name="c", store="disk", cache_rows=7),
                _table(id=3, name="d", store="memory")],
        shards=[{"id": 0, "ip": "10.0.0.1"}, {"id": 1, "ip": "10.0.0.3", "store": "disk", "cache_rows": 50,
                                              "store_dir": "/srv/rows", "block_cache_mb": 16}]))
    from embnic.client_lib.config import DEFAULT_CACHE_ROWS

    assert [cfg.store_of(t, 0) for t in range(4)] == [("memory", None), ("disk", DEFAULT_CACHE_ROWS), ("disk", 7),
                                                      ("memory", None)]
    assert [cfg.store_of(t, 1) for t in range(4)] == [("disk", 50), ("disk", 50), ("disk", 7), ("memory", None)]
    assert cfg.shard(1).store_dir == "/srv/rows" and cfg.shard(1).block_cache_mb == 16
    assert cfg.shard(0).store is None and cfg.tables[0].store is None


def test_a_relative_store_dir_is_taken_from_the_config_folder(tmp_path, monkeypatch):
    """A relative store_dir resolved against the working directory of `server`/`testbed up`, and the
    testbed's effective config copy (in RUN_DIR) would have moved it again: the config's folder."""
    raw = _raw(tables=[_table(store="disk")],
               shards=[{"id": 0, "ip": "10.0.0.1", "store_dir": "rows"}, {"id": 1, "ip": "10.0.0.3"}])
    assert parse_config(raw).shard(0).store_dir == "rows"  # no file: as given
    cfg = parse_config(raw, tmp_path / "sub" / "c.toml")
    assert cfg.shard(0).store_dir == str(tmp_path / "sub" / "rows")
    assert cfg.shard(1).store_dir is None
    monkeypatch.chdir(tmp_path)
    assert parse_config(raw, "c.toml").shard(0).store_dir == str(tmp_path / "rows")
    raw["shards"][0]["store_dir"] = "/abs/rows"
    assert parse_config(raw, tmp_path / "c.toml").shard(0).store_dir == "/abs/rows"
