"""The [card] bounds of the config validator are the card's own option bounds.

``client_lib/config.py`` ``CARD_LIMITS`` and ``dataplane/include/embnic_limits.h`` (plus
``EMBNIC_MAX_PORTS``) state the same numbers; every limit is accepted by both the validator and
the real embnic-dp, and one past each limit is refused by both. "Accepted" by the card means
its option parsing passes: with ``-m 256`` (this machine, no hugepages) a 2^24-entry ring or
state map then fails to reserve its memory (``RING: Cannot reserve memory``, exit 1), which is a
sizing matter, not a refused option (exit 2, ``bad value for --ring-size``).

Run alone: sudo python3 -m pytest -q tests/dataplane/test_limits.py
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from embnic.client_lib.config import CARD_LIMITS, MTU_LIMITS, ConfigError, parse_config
from embnic.control.targets.dpdk.process import CardProcess, DpdkProcError

INCLUDE = Path(__file__).resolve().parents[2] / "dataplane" / "include"
OPTION = {"ring_size": "--ring-size", "state_size": "--state-size", "state_timeout_ms": "--state-timeout-ms"}


def _c_constants() -> dict[str, int]:
    out = {}
    for h in ("embnic_limits.h", "embnic_dp.h"):
        for name, val in re.findall(r"^#define\s+(EMBNIC_\w+)\s+\(?([0-9]+u?(?:\s*<<\s*[0-9]+)?)\)?", (INCLUDE / h).read_text(), re.M):
            out[name] = eval(val.replace("u", ""))  # noqa: S307 - integer literals of our own header
    return out


def test_python_and_c_state_the_same_bounds():
    c = _c_constants()
    assert CARD_LIMITS["ring_size"] == (c["EMBNIC_RING_SIZE_MIN"], c["EMBNIC_RING_SIZE_MAX"])
    assert CARD_LIMITS["state_size"] == (c["EMBNIC_STATE_SIZE_MIN"], c["EMBNIC_STATE_SIZE_MAX"])
    assert CARD_LIMITS["state_timeout_ms"] == (c["EMBNIC_STATE_TIMEOUT_MS_MIN"], c["EMBNIC_STATE_TIMEOUT_MS_MAX"])
    assert CARD_LIMITS["port_id"] == (0, c["EMBNIC_MAX_PORTS"] - 1)
    assert CARD_LIMITS["state_lcores"] == (1, c["EMBNIC_MAX_STATE_LCORES"])


def _config(**card) -> dict:
    ports = card.pop("ports", [{"id": 0, "ip": "10.0.0.1"}])
    p = ports[0]["id"]
    return {"tables": [{"id": 0, "rows": 10, "dim": 4}], "shards": [{"id": 0, "ip": "10.0.1.2", "card_port": p}],
            "clients": [{"id": 1, "ip": "10.0.0.2"}], "card": {"ports": ports, "enabled": False, **card}}


def _cases():
    """(field, value, within bounds?) for every limit and one past it."""
    for field in OPTION:
        lo, hi = CARD_LIMITS[field]
        if field == "ring_size":  # a power of two: one past is the next power of two outside
            yield field, lo, True
            yield field, hi, True
            yield field, lo // 2, False
            yield field, hi * 2, False
        else:
            yield field, lo, True
            yield field, hi, True
            yield field, lo - 1, False
            yield field, hi + 1, False


CASES = list(_cases())


@pytest.mark.parametrize("field,value,ok", CASES, ids=[f"{f}={v}" for f, v, _ in CASES])
def test_config_validator(field, value, ok):
    if ok:
        assert getattr(parse_config(_config(**{field: value})).card, field) == value
    else:
        with pytest.raises(ConfigError, match=field):
            parse_config(_config(**{field: value}))


def test_config_validator_port_ids():
    lo, hi = CARD_LIMITS["port_id"]
    assert parse_config(_config(ports=[{"id": hi, "ip": "10.0.0.1"}])).card.ports[0].id == hi
    with pytest.raises(ConfigError, match=r"card.ports\[0\].id"):
        parse_config(_config(ports=[{"id": hi + 1, "ip": "10.0.0.1"}]))


def test_config_validator_state_lcores():
    """1..16 state lcores, at most as many as card.lcores names."""
    lo, hi = CARD_LIMITS["state_lcores"]
    assert parse_config(_config(state_lcores=hi, lcores=f"0-{hi - 1}")).card.state_lcores == hi
    assert parse_config(_config(lcores="0")).card.state_lcores == lo == 1
    for bad, lcores in ((lo - 1, "0"), (hi + 1, f"0-{hi}"), (2, "0")):
        with pytest.raises(ConfigError, match="state_lcores"):
            parse_config(_config(state_lcores=bad, lcores=lcores))


def _card(card_bin, args, vdevs=("net_null0,no-rx=1",)) -> tuple[bool, str]:
    """(the card started and answered, or failed for a reason other than a refused option; detail)."""
    card = CardProcess(card_bin, list(vdevs), lcores="0", args=list(args), ready_timeout=60)
    try:
        card.start()
        return True, "started"
    except DpdkProcError as e:
        msg = str(e)
        refused = "bad value for" in msg or "code 2 " in msg
        return not refused, msg
    finally:
        card.cleanup()


@pytest.mark.dataplane
@pytest.mark.parametrize("field,value,ok", CASES, ids=[f"{f}={v}" for f, v, _ in CASES])
def test_card_binary(card_bin, field, value, ok):
    accepted, detail = _card(card_bin, [OPTION[field], str(value)])
    assert accepted == ok, detail
    if not ok:
        assert f"bad value for {OPTION[field]}" in detail, detail


@pytest.mark.dataplane
def test_card_binary_port_ids(card_bin):
    lo, hi = CARD_LIMITS["port_id"]
    nulls = [f"net_null{i},no-rx=1" for i in range(hi + 1)]
    accepted, detail = _card(card_bin, ["--port-ip", f"{hi}=10.0.7.1"], nulls)
    assert accepted, detail
    accepted, detail = _card(card_bin, ["--port-ip", f"{hi + 1}=10.0.8.1"], nulls)
    assert not accepted and "bad value for --port-ip" in detail, detail


@pytest.mark.dataplane
def test_card_binary_state_lcores(card_bin):
    """--state-lcores: 1..16 parse; 0 and past 16 are bad values; more state lcores than EAL lcores
    exits 2 naming both (16 state lcores need 16 EAL lcores, beyond this machine: that the option
    parsed shows in the message, which is the lcore count's, not a bad value)."""
    lo, hi = CARD_LIMITS["state_lcores"]
    accepted, detail = _card(card_bin, ["--state-lcores", str(lo)])
    assert accepted, detail
    accepted, detail = _card(card_bin, ["--state-lcores", str(hi)])
    assert f"--state-lcores {hi}: EAL -l must give at least {hi} lcores, got 1" in detail, detail
    assert "bad value for --state-lcores" not in detail, detail
    for bad in (lo - 1, hi + 1):
        accepted, detail = _card(card_bin, ["--state-lcores", str(bad)])
        assert not accepted and "bad value for --state-lcores" in detail, detail
    accepted, detail = _card(card_bin, ["--state-lcores", "2"])
    assert not accepted and "--state-lcores 2: EAL -l must give at least 2 lcores, got 1" in detail, detail


@pytest.mark.dataplane
def test_card_binary_takes_every_config_mtu(card_bin):
    """[cluster] mtu is every node's (not a card bound): the card's --mtu range holds the
    validator's, so no MTU that passes `config check` is refused at load."""
    lo, hi = MTU_LIMITS
    c = _c_constants()
    assert c["EMBNIC_MTU_MIN"] <= lo and hi <= c["EMBNIC_MAX_MTU"]
    for mtu in (lo, hi):
        accepted, detail = _card(card_bin, ["--mtu", str(mtu)])
        assert accepted, detail
    accepted, detail = _card(card_bin, ["--mtu", str(c["EMBNIC_MAX_MTU"] + 1)])
    assert not accepted and "bad value for --mtu" in detail, detail
