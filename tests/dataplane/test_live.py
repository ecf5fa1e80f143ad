"""Live: the card on net_af_packet vdevs over veth pairs, real `embnic server` shards, a real client.

Wiring (namespaces created here, named enT<pid>{k,c,a,b}; all removed afterwards)::

    ns ...c  client 1           ns ...k  embnic-dp (af_packet)          ns ...a  shard 0
    eTc<pid> 10.88.0.2 ==veth== eTk0<pid> port 0  10.88.0.1
                                eTk1<pid> port 1  10.88.1.1 ==veth== eTa<pid> 10.88.1.2:7878
                                eTk2<pid> port 2  10.88.2.1 ==veth== eTb<pid> 10.88.2.2:7878  ns ...b  shard 1

Nobody has static neighbour entries: the client's and shards' kernels ARP for the card, which
answers. The client (embnic.client_lib.client.EmbeddingClient, in its namespace) looks rows up,
looks them up again (same rows), sends SGD updates and looks up again (rows moved by -lr·grad),
with messages large enough to be fragmented both ways. Then the card's counters must show every
message type, no authorisation or malformed drops, every message completed (its entry freed, its
latency in its shard's histogram), and no leaked mbufs.
Run alone: sudo python3 -m pytest -q tests/dataplane/test_live.py
With the state map partitioned over 2 state lcores (``-l 0,1 -- --state-lcores 2``; af_packet has
one TX queue, so state lcore 1 hands its frames back to the RX lcore):
``sudo EMBNIC_LIVE_STATE_LCORES=2 python3 -m pytest -q tests/dataplane/test_live.py``.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from drops import embnic_drops

from embnic.control.targets.dpdk.process import CardProcess
from embnic.control.netns import Netns, exec_argv

pytestmark = [pytest.mark.dataplane, pytest.mark.root, pytest.mark.slow]

TAG = f"{os.getpid() % 100000}"
NS = {k: f"enT{TAG}{k}" for k in ("k", "c", "a", "b")}
MAC = {"c": "02:88:00:00:00:02", "a": "02:88:00:00:01:02", "b": "02:88:00:00:02:02"}
LR = 0.5
#: state lcores of the card (``EMBNIC_LIVE_STATE_LCORES``, default 1: run to completion on ``-l 0``)
STATE_LCORES = int(os.environ.get("EMBNIC_LIVE_STATE_LCORES", "1"))

CONFIG = """
[cluster]
name = "live"
udp_port = 7878
mtu = 1500
sharding = "hash"
seed = 7
timeout_ms = 300
retries = 10

[card]
enabled = true
lcores = "0"
ports = [ {{ id = 0, ip = "10.88.0.1" }}, {{ id = 1, ip = "10.88.1.1" }}, {{ id = 2, ip = "10.88.2.1" }} ]

[[clients]]
id = 1
ip = "10.88.0.2"
port = 40000
mac = "{c}"
card_port = 0

[[shards]]
id = 0
ip = "10.88.1.2"
port = 7878
mac = "{a}"
card_port = 1

[[shards]]
id = 1
ip = "10.88.2.2"
port = 7878
mac = "{b}"
card_port = 2

[[tables]]
id = 0
rows = 4096
dim = 16
dtype = "fp32"
optimizer = "sgd"
lr = {lr}

[[tables]]
id = 1
rows = 8192
dim = 8
dtype = "fp16"
optimizer = "sgd"
lr = {lr}
"""

CLIENT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from embnic.client_lib.config import load_config
    from embnic.client_lib.client import EmbeddingClient
    cfg = load_config(sys.argv[1])
    rng = np.random.default_rng(1)
    keys = {0: np.unique(rng.integers(0, 4096, 700)).astype(np.uint64),
            1: np.unique(rng.integers(0, 8192, 400)).astype(np.uint64)}
    out = {}
    with EmbeddingClient(cfg, 1) as c:
        r0 = c.lookup(keys)
        r1 = c.lookup(keys)
        grads = {t: rng.standard_normal((len(k), cfg.table(t).dim)).astype(np.float32) for t, k in keys.items()}
        c.update({t: (keys[t], grads[t]) for t in keys})
        r2 = c.lookup(keys)
        for t in keys:
            out[t] = {"n": len(keys[t]), "shape": list(r0[t].shape),
                      "same": bool(np.array_equal(r0[t], r1[t])),
                      "nonzero": bool(np.any(r0[t] != 0)),
                      "sgd_err": float(np.max(np.abs(r2[t] - (r0[t].astype(np.float32) - {lr} * grads[t]))))}
        out["stats"] = c.stats.as_dict()
    print(json.dumps(out))
""").replace("{lr}", repr(LR))


@pytest.fixture(scope="module")
def topo():
    """Namespaces and veth pairs; torn down afterwards whatever happened."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    with contextlib.ExitStack() as stack:
        n = {k: stack.enter_context(Netns.create(ns)) for k, ns in NS.items()}  # loopback up, IPv6 off
        links = [("c", "0", "10.88.0"), ("a", "1", "10.88.1"), ("b", "2", "10.88.2")]
        for peer, port, net in links:
            pdev, kdev = f"eT{peer}{TAG}", f"eTk{port}{TAG}"
            n[peer].veth(pdev, kdev, peer_ns=NS["k"], mac=MAC[peer])
            n[peer].add_address(pdev, f"{net}.2/24")
            n[peer].link_up(pdev)
            n[peer].default_route(pdev, f"{net}.1")
            # full checksums in the frames (a veth otherwise leaves them to "hardware")
            n[peer].offloads_off(pdev, each=True)
        for port in "012":
            n["k"].link_up(f"eTk{port}{TAG}")
            n["k"].offloads_off(f"eTk{port}{TAG}", each=True)
        yield NS


@pytest.fixture(scope="module")
def live(topo, card_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("live")
    cfg = d / "cluster.toml"
    cfg.write_text(CONFIG.format(lr=LR, **MAC))
    card = CardProcess(card_bin, [f"net_af_packet{p},iface=eTk{p}{TAG}" for p in range(3)],
                       lcores="0" if STATE_LCORES == 1 else ",".join(map(str, range(STATE_LCORES))),
                       port_ips={0: "10.88.0.1", 1: "10.88.1.1", 2: "10.88.2.1"}, netns=topo["k"],
                       args=["--idle-us", "20", "--state-lcores", str(STATE_LCORES)], log=d / "card.log")
    servers = []
    try:
        card.start()
        for s, (ns, ip, mac) in enumerate([("a", "10.88.1.2", MAC["a"]), ("b", "10.88.2.2", MAC["b"])]):
            card.call("route_add", shard=s, port=s + 1, mac=mac, ip=ip, udp_port=7878)
        card.call("client_add", client=1, port=0, mac=MAC["c"], ip="10.88.0.2", udp_port=40000)
        for s, ns in enumerate("ab"):
            log = open(d / f"s{s}.log", "wb")
            p = subprocess.Popen(exec_argv(topo[ns], [sys.executable, "-m", "embnic", "server", "--shard", str(s),
                                                      "--config", str(cfg), "--bind", f"10.88.{s + 1}.2"]),
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            servers.append((p, log, d / f"s{s}.log"))
        deadline = time.monotonic() + 60
        for p, _, path in servers:
            while b"listening on" not in path.read_bytes():
                assert p.poll() is None, f"embnic server exited: {path.read_text()[-2000:]}"
                assert time.monotonic() < deadline, f"embnic server not listening: {path}"
                time.sleep(0.1)
        script = d / "client.py"
        script.write_text(CLIENT)
        r = subprocess.run(exec_argv(topo["c"], [sys.executable, str(script), str(cfg)]),
                           capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, (f"client failed:\n{r.stderr[-3000:]}\ncard counters: "
                                   f"{json.dumps(card.counters())}\ncard log: {card.log()[-1500:]}")
        result = json.loads(r.stdout.strip().splitlines()[-1])
        time.sleep(0.3)
        counters = card.counters()
        state = card.call("state_summary")
        yield {"client": result, "counters": counters, "state": state, "card": card}
    finally:
        for p, log, _ in servers:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
            log.close()
        card.stop()
        card.cleanup()


def test_lookups_through_the_card(live):
    for t, dim in ((0, 16), (1, 8)):
        r = live["client"][str(t)]
        assert r["shape"] == [r["n"], dim]
        assert r["nonzero"], "rows are all zero"
        assert r["same"], "two lookups of the same keys disagree"


def test_updates_applied_once_through_the_card(live):
    assert live["client"]["0"]["sgd_err"] < 1e-5          # fp32 rows: exact up to rounding
    assert live["client"]["1"]["sgd_err"] < 5e-3          # fp16 rows


def test_card_saw_every_type_fragmented(live):
    c = live["counters"]
    t = c["types"]
    assert t["LOOKUP_REQ"] > 0 and t["LOOKUP_REPLY"] > 0 and t["UPDATE_REQ"] > 0 and t["UPDATE_ACK"] > 0
    # 700 fp32 rows of dim 16 per lookup: replies are fragmented (more reply frames than requests)
    assert t["LOOKUP_REPLY"] > t["LOOKUP_REQ"]
    assert c["arp"]["replies"] >= 3, "the kernels ARPed for the card and got no answer"


def test_no_authorisation_or_malformed_drops(live):
    # the hosts' kernels send a few frames of their own (ARP, IGMP, an ICMP port unreachable for a
    # late reply): a handful, before the card knows it is embnic traffic (drops.embnic_drops)
    drops = embnic_drops(live["counters"]["drops"])
    # a second answer to a retransmitted request is unsolicited once the first freed the entry
    ok = ("unsolicited_reply",) if live["client"]["stats"]["retransmits"] else ()
    bad = {k: v for k, v in drops.items() if v and k not in ok}
    assert not bad, bad


def test_every_message_completed(live):
    """Every request was answered through the card: no entry left, completions counted per shard."""
    st, c = live["state"], live["counters"]
    assert st["entries"] == 0, st
    assert st["overflow"] == 0 and st["expired"] == 0
    assert c["completed"]["LOOKUP_REPLY"] >= 4 and c["completed"]["UPDATE_ACK"] >= 2
    shards = {s["shard"]: s for s in c["shards"]}
    assert set(shards) == {0, 1}
    for s in shards.values():
        assert sum(s["latency_hist"]) == s["LOOKUP_REPLY"] + s["UPDATE_ACK"] + s["ERROR"] + s["SIZE_ACK"] > 0
        assert s["latency_sum_ns"] > 0


def test_no_mbuf_leak_live(live):
    c = live["card"].counters()
    assert c["ring"]["count"] == 0
    assert c["mempool"]["in_use"] == 0, c["mempool"]
