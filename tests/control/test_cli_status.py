"""`embnic status` and `embnic state dump|summary` against a fake card socket.

Run alone: python3 -m pytest -q tests/control/test_cli_status.py
"""
from __future__ import annotations

import json


def test_status_text(invoke, card):
    r = invoke("status")
    assert r.exit_code == 0, r.output
    out = r.output
    assert "pipeline 'embnic' (dpdk)" in out
    assert "drops     total 4: unknown_shard 3, bad_magic 1" in out
    assert "ring      5/4,096 (0.1%), high water 1,024 (25.0%)" in out
    assert ("state     2/65,536 messages in flight in the state map (receiving 0, forwarded 1, replying 1)"
            in out)
    assert "completed messages by reply type  LOOKUP_REPLY 40  UPDATE_ACK 10  ERROR 0  SIZE_ACK 0  UPDATE_NACK 0" in out
    # 10 samples in [64, 128) µs, 30 in [128, 256), 10 in [256, 512): p50 < 256, p99 < 512
    assert ("shard     0  completed 50, expired 4; request->reply on the card: mean 150.0 µs, p50 < 256 µs, "
            "p99 < 512 µs") in out
    assert "mempool   in use 191/8,191" in out
    assert "LOOKUP_REQ 0" in out and "ERROR 4" in out
    # the card counts frames per type (a 3-fragment message counts 3): the label says so
    assert "frames by message type  LOOKUP_REQ 0" in out and "messages  LOOKUP_REQ" not in out
    assert "bad_ip" not in out  # zero reasons hidden by default
    # per port: the largest frame it sends and the frames dropped as too long for it
    assert "max frame    too long" in out
    ports = [ln.split() for ln in out.splitlines() if ln.strip().startswith(("0 ", "1 "))]
    assert ports == [["0", "10", "1,000", "9", "900", "2,016", "0"], ["1", "20", "2,000", "18", "1,800", "1,514", "2"]]


def test_status_all_shows_every_reason(invoke, card):
    """Every drop reason the real card defines (its X-macro), not a list of the fake's own."""
    from ctl_fake_card import card_drop_reasons

    real = card_drop_reasons()
    # the parser found the card's list: the first reason and ones added later are in it
    assert real[0] == "too_short" and {"wrong_dst", "frag_mismatch"} <= set(real) and len(real) >= 22
    assert list(card.drops) == list(real)
    r = invoke("status", "--all")
    assert r.exit_code == 0, r.output
    for reason in real:
        assert f"{reason} " in r.output, reason


def test_status_json(invoke, card):
    r = invoke("status", "--json")
    assert r.exit_code == 0
    d = json.loads(r.output)
    assert d["counters"]["drops"]["unknown_shard"] == 3
    assert d["counters"]["ring"]["high_water"] == 1024
    assert d["state"]["by_state"]["forwarded"] == 1
    assert d["counters"]["completed"]["LOOKUP_REPLY"] == 40
    assert sum(d["counters"]["shards"][0]["latency_hist"]) == 50
    assert [q["cmd"] for q in card.requests] == ["counters", "state_summary"]


def test_status_watch_json_lines(invoke, card):
    r = invoke("status", "--watch", "0.1", "--count", "3", "--json")
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 3
    assert all(json.loads(ln)["counters"]["drops"]["bad_magic"] == 1 for ln in lines)


def test_status_watch_text_with_rates(invoke, card):
    r = invoke("status", "--watch", "0.1", "--count", "2")
    assert r.exit_code == 0, r.output
    assert r.output.count("Ctrl-C to stop") == 2
    assert "(0/s)" in r.output and "rx frames/s" in r.output  # second sample shows rates


def test_status_watch_needs_a_sane_interval(invoke, card):
    """--watch 0 polled the card ~200 times a second: at least 0.1 s."""
    for bad in ("0", "0.05"):
        r = invoke("status", f"--watch={bad}", "--count", "1")
        assert r.exit_code == 2 and "0.1" in r.output, (bad, r.output)
    assert not card.requests


def test_status_watch_default_interval_parses(invoke, card):
    r = invoke("status", "--watch", "--count", "1", "--json")
    assert r.exit_code == 0, r.output
    assert len(r.output.strip().splitlines()) == 1


def test_status_not_loaded(invoke, env):
    r = invoke("status")
    assert r.exit_code == 1 and "pipeline not loaded" in r.output


def test_state_dump(invoke, card):
    r = invoke("state", "dump")
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert lines[0].split()[:4] == ["CLIENT", "MSG_ID", "TYPE", "STATE"]
    assert lines[0].split()[4:8] == ["SHARD", "TABLES", "KEYS", "VALUE_LEN"]
    assert lines[1].split() == ["1", "7", "LOOKUP_REQ", "replying", "0", "2", "360", "2880", "2", "2900", "2",
                                "2900", "50.0", "2/2"]
    assert lines[-1] == "2 entries"
    assert card.requests[-1] == {"cmd": "state_dump", "limit": 1000}


def test_state_dump_filters_and_json(invoke, card):
    d = json.loads(invoke("state", "dump", "--json", "--limit", "5").output)
    assert [e["msg_id"] for e in d] == [7, 9] and card.requests[-1]["limit"] == 5
    d = json.loads(invoke("state", "dump", "--json", "--state", "forwarded").output)
    assert [e["msg_id"] for e in d] == [9]
    d = json.loads(invoke("state", "dump", "--json", "--client", "1").output)
    assert [e["msg_id"] for e in d] == [7]
    r = invoke("state", "dump", "--client", "3")
    assert "no entries matching" in r.output
    r = invoke("state", "dump", "--state", "lost")
    assert r.exit_code == 2


def test_state_ring(invoke, card):
    """The header ring and log: the v2 header's tables, keys and value_len per frame, and the table
    an ERROR names ("-" where the header names none); waiting frames first, marked "ring"."""
    r = invoke("state", "ring", "--last", "5")
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert lines[0].split() == ["TYPE", "CLIENT", "MSG_ID", "SHARD", "TABLES", "KEYS", "VALUE_LEN", "TABLE", "FRAG",
                                "FRAG_LEN", "MSG_LEN", "PORT", "TIME_US", "AT"]
    assert lines[1].split() == ["ERROR", "1", "8", "0", "1", "2", "16", "4", "0/1", "0", "0", "0", "60", "ring"]
    assert lines[2].split() == ["LOOKUP_REPLY", "1", "7", "0", "2", "360", "2880", "-", "1/3", "1428", "2880", "1",
                                "51", "sent"]
    assert lines[-1] == "3 headers (1 waiting in the header ring)"
    d = json.loads(invoke("state", "ring", "--json").output)
    assert [(e["msg_id"], e["num_tables"], e["value_len"], e["in_ring"]) for e in d] == [
        (8, 1, 16, True), (7, 2, 2880, False), (7, 2, 2880, False)]


def test_state_summary(invoke, card):
    r = invoke("state", "summary")
    assert r.exit_code == 0
    assert "2/65536 entries, overflow 0, expired 4" in r.output
    assert json.loads(invoke("state", "summary", "--json").output)["by_state"]["replying"] == 1


def test_status_watch_stops_on_ctrl_c(invoke, card, monkeypatch):
    import embnic.cli.commands.status as cs

    def interrupt(_sec):
        raise KeyboardInterrupt

    monkeypatch.setattr(cs.time, "sleep", interrupt)
    r = invoke("status", "--watch", "5")
    assert r.exit_code == 0
    assert r.output.count("Ctrl-C to stop") == 1


def test_status_of_a_torn_down_testbed_says_bring_the_testbed_up(invoke, env):
    """`testbed down` leaves RUN_DIR/testbed-NAME/ (config copy, logs); status -c of that config named
    `pipeline load` as the fix. The card belongs to the testbed: bring the testbed up again."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / "examples" / "testbed.toml").read_text()
    tb = env / "testbed-tb9"
    tb.mkdir()
    (tb / "cluster.toml").write_text(text + f'\n[control]\nname = "tb9-card"\nctl = "{tb / "card.sock"}"\n')
    r = invoke("status", "-c", tb / "cluster.toml")
    assert r.exit_code == 1, r.output
    assert (f"testbed tb9 is down (its logs remain in {tb}): bring it up with "
            "`embnic testbed up -c CONFIG --name tb9`") in r.output
    (env / "testbed-tb9.json").write_text("{}")  # a testbed that is up: its card is the one missing
    r = invoke("status", "-c", tb / "cluster.toml")
    assert r.exit_code == 1 and "embnic pipeline load" in r.output and "is down" not in r.output
