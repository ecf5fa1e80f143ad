"""Cluster config parsing: valid examples load, errors name the field.

Run alone: python3 -m pytest -q tests/client_lib/test_config.py
"""
from pathlib import Path

import pytest

from embnic.client_lib.config import ConfigError, load_config, parse_config

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
])
def test_errors_name_the_field(over, field):
    with pytest.raises(ConfigError) as e:
        parse_config(_raw(**over))
    assert e.value.field == field
    assert str(e.value).startswith(field + ":")


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
