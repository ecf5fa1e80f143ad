"""The ``bmv2`` target: the P4 program (p4/) on BMv2's ``simple_switch``, driven by its runtime CLI.

``load`` = find p4c / simple_switch / simple_switch_CLI (a missing one: one line naming it and
how to get it, exit 1) → compile ``p4/embnic.p4`` (or take ``json_path``) → make sure the
switch's network namespace has no address but loopback (its Thrift server listens on every
address; see below) → start a first switch without ports, program the card's port addresses,
the config's routes and clients and the state timeout, save its state → start the card's
switch with the ports and that state restored, so no frame meets an empty table → write the
state file. ``unload`` stops the recorded pid (checked by its start time) and deletes a
namespace the target made.

Ports: card port ``i`` is the interface ``interfaces[i]``; given as names (``["Np0", ...]``)
or taken from ``--vdev net_af_packet<i>,iface=NAME`` (what the testbed passes the dpdk target).
The namespace: ``netns`` (the testbed's card namespace, whose kernel has no address), else one
made for it (``embnic-bmv2-NAME``), into which the interfaces are moved with IPv6 off.

    from embnic.client_lib.config import load_config
    from embnic.control.target_bmv2 import Bmv2Target
    t = Bmv2Target(load_config("examples/testbed.toml"), netns="tb-card",
                   interfaces=["tbp0", "tbp1", "tbp2", "tbp3"], name="tb")
    t.load(); print(t.counters()["drops"]); t.unload()
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

from embnic.client_lib.config import ClusterConfig, ConfigError
from embnic.client_lib.consts import MsgType
from embnic.control import bmv2, bmv2_runtime, p4prog
from embnic.control.errors import MissingDependencyError, NoSuchEntryError, OperationalError, UsageError
from embnic.control.runstate import (ensure_run_dir, pid_matches, proc_starttime, read_state, remove_state,
                                     require_netns, require_root, write_state)
from embnic.control.target import Entry, Target, clients_from_config, describe_state, routes_from_config

_IFACE = re.compile(r"(?:^|,)iface=([^,]+)")


def interfaces_from_vdevs(vdevs: Sequence[str]) -> list[str]:
    """``["net_af_packet0,iface=Np0", ...]`` → ``["Np0", ...]`` (port order kept).

    Raises:
        UsageError: a vdev without ``iface=`` (BMv2 needs a network interface per port).
    """
    out = []
    for v in vdevs:
        m = _IFACE.search(v)
        if not m:
            raise UsageError(f"--vdev {v!r}: the bmv2 target needs an interface per card port "
                                   "(net_af_packet<i>,iface=NAME)")
        out.append(m.group(1))
    return out


def _mac_hex(v: str) -> str:
    return int(v, 16).to_bytes(6, "big").hex(":")


def _ip_hex(v: str) -> str:
    return ".".join(str(b) for b in int(v, 16).to_bytes(4, "big"))


def handle_zero_placeholders(commands: Sequence[str]) -> tuple[list[str], list[str]]:
    """Commands that keep entry handle 0 free in every table a saved state will restore.

    BMv2 1.15.5 restores saved entries with their handles but leaves the table's "first free
    handle" at 0 (``HandleMgr::set_handle`` resets it from the size *before* growing), so the
    next runtime ``table_add`` on a table whose handle 0 was restored is given handle 0 again:
    it overwrites that entry, and a later ``table_dump`` kills the switch. A state saved with
    handle 0 unused restores correctly (its first free handle really is 0).

    Returns:
        ``(adds, deletes)``: run ``adds`` before ``commands`` (one placeholder ``table_add`` per
        table: the table's first entry with its last key field changed to a value no entry of
        that table uses, so it gets handle 0), and ``deletes`` after them, before saving.
    """
    keys: dict[str, set[tuple[str, ...]]] = {}
    first: dict[str, list[str]] = {}
    for c in commands:
        w = c.split()
        if len(w) < 4 or w[0] != "table_add" or "=>" not in w:
            continue
        arrow = w.index("=>")
        keys.setdefault(w[1], set()).add(tuple(w[3:arrow]))
        first.setdefault(w[1], w)
    adds, deletes = [], []
    for table, w in first.items():
        arrow = w.index("=>")
        key = list(w[3:arrow])
        if not key:
            continue
        v = 0
        while tuple(key[:-1] + [str(v)]) in keys[table]:
            v += 1
        adds.append(" ".join(w[:3] + key[:-1] + [str(v)] + w[arrow:]))
        deletes.append(f"table_delete {table} 0")
    return adds, deletes


def parse_table_dump(text: str) -> list[dict]:
    """``table_dump`` output as ``[{handle, key: [ints], action, params: [ints]}]`` (default entry left out)."""
    out = []
    for block in text.split("**********"):
        h = re.search(r"Dumping entry (0x[0-9a-fA-F]+)", block)
        a = re.search(r"Action entry: (\w+) - ?([0-9a-fA-F, ]*)", block)
        if not h or not a:
            continue
        keys = [int(k, 16) for k in re.findall(r"^\* \S+\s*: EXACT\s+([0-9a-fA-F]+)", block, re.M)]
        params = [int(p, 16) for p in a.group(2).replace(",", " ").split()]
        out.append({"handle": int(h.group(1), 16), "key": keys, "action": a.group(1), "params": params})
    return out


class Bmv2Target(Target):
    """The embnic pipeline as the P4 program on BMv2 ``simple_switch``.

    Args:
        config: cluster config; ``[card].ports`` give the card's MAC/IPv4 per port, its
            ``state_timeout_ms`` the state map timeout.
        json_path: a compiled program to run instead of compiling ``p4/embnic.p4``.
        netns: run the switch in this existing namespace (it must have no address but loopback).
        interfaces: card port ``i`` = ``interfaces[i]`` (in ``netns`` if given, else moved into
            the namespace made for the switch).
        vdevs: alternatively ``net_af_packet<i>,iface=NAME`` specs (:func:`interfaces_from_vdevs`).
        thrift_port: the switch's Thrift port (reachable inside its namespace only).
        ready_timeout: seconds to wait for the switch to start.
        stop_timeout: seconds between SIGTERM and SIGKILL on unload.
    """

    name = "bmv2"
    OPTIONS = frozenset({"json_path", "netns", "interfaces", "vdevs", "thrift_port", "ready_timeout",
                         "stop_timeout"})

    def __init__(self, config: ClusterConfig | None = None, *, name: str = "embnic",
                 run_dir: str | os.PathLike | None = None, json_path: str | os.PathLike | None = None,
                 netns: str | None = None, interfaces: Sequence[str] = (), vdevs: Sequence[str] = (),
                 thrift_port: int = bmv2.DEFAULT_THRIFT_PORT, ready_timeout: float = 60.0,
                 stop_timeout: float = 10.0):
        super().__init__(config, name=name, run_dir=run_dir)
        self.json_path = Path(json_path) if json_path else None
        self.netns = netns
        self.interfaces = list(interfaces) or interfaces_from_vdevs(vdevs or ())
        self.thrift_port = int(thrift_port)
        self.ready_timeout = float(ready_timeout)
        self.stop_timeout = float(stop_timeout)

    @classmethod
    def from_settings(cls, s, **opts: Any) -> "Bmv2Target":
        """Build from resolved CLI settings (``--netns``, ``--vdev ...,iface=NAME``)."""
        return cls(s.config, name=s.name, run_dir=s.run_dir, netns=s.netns, vdevs=s.vdevs,
                   json_path=getattr(s, "binary", None) if str(getattr(s, "binary", "") or "").endswith(".json")
                   else None, **{k: v for k, v in opts.items() if v is not None and k in cls.OPTIONS})

    # ------------------------------------------------------------------ paths
    @property
    def log_path(self) -> Path:
        return self.run_dir / f"{self.instance}.log"

    @property
    def build_dir(self) -> Path:
        """Where the program is compiled: shared by every load of the same sources
        (:func:`embnic.control.bmv2.cached_build_dir`), outside the run directory."""
        return bmv2.cached_build_dir()

    def _transient_files(self) -> list[Path]:
        """Run-directory files a load makes that the running card does not need once its switch
        is up: the programming switch's logs and the saved state it hands over (and the build
        directory earlier versions kept here). Only the card switch's logs outlive an unload,
        as the dpdk target's log does."""
        base = self.run_dir / self.instance
        return [Path(f"{base}.bmv2state"), Path(f"{base}-program.log.txt"), Path(f"{base}-program.log.out"),
                Path(f"{base}-p4")]

    def _remove_transient_files(self) -> None:
        for path in self._transient_files():
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def _switch(self, state: dict | None = None) -> bmv2.SimpleSwitch:
        """A handle on the running switch (from the state file) for CLI calls."""
        st = state or self.state()
        if not st or st.get("corrupt") or st.get("target") != "bmv2":
            raise OperationalError(f"no bmv2 pipeline {self.instance!r} loaded: run `embnic pipeline load "
                                   f"--target bmv2 --config FILE" +
                                   (f" --name {self.instance}`" if self.instance != "embnic" else "`"))
        if not pid_matches(st):
            raise OperationalError(f"the bmv2 pipeline {self.instance!r} is not running any more "
                                   f"({describe_state(st)}); see its log {st.get('log')}")
        return bmv2.SimpleSwitch(Path(st["json"]), bmv2.Netns(st["netns"]), {}, log=Path(st["log"]),
                                 thrift_port=int(st["thrift_port"]))

    def cli(self, commands: Sequence[str]) -> str:
        """Run runtime-CLI commands on the loaded switch.

        Raises:
            OperationalError: not loaded, or the CLI refused a command (its message).
        """
        try:
            return self._switch().cli(commands)
        except bmv2.Bmv2Error as e:
            raise OperationalError(str(e)) from None

    # ------------------------------------------------------------------ lifecycle
    def _tools(self) -> None:
        """Raise MissingDependencyError (one line) naming every missing tool and how to get each."""
        missing = bmv2.missing_tools((["p4c"] if self.json_path is None else []) +
                                     ["simple_switch", "simple_switch_CLI"])
        if missing:
            raise MissingDependencyError(f"the bmv2 target needs {', '.join(missing)}, not found on PATH: " +
                                         "; ".join(f"{t}: {bmv2.TOOL_HINTS[t]}" for t in missing),
                                         dependency=missing[0])

    def _card_commands(self, routes: list[Entry], clients: list[Entry]) -> list[str]:
        card = self.config.card
        ports = []
        for p in card.ports:
            if p.mac is None:
                raise ConfigError(f"card.ports[{p.id}].mac", "required by the bmv2 target (the switch has no "
                                  "MAC of its own): add mac = \"02:..\"", self.config.path)
            ports.append(bmv2_runtime.CardPortAddr(p.id, p.mac, p.ip))
        peer = lambda e: bmv2_runtime.PeerEntry(e.id, e.port, e.mac, e.ip, e.udp_port)
        return bmv2_runtime.table_commands(ports, [peer(r) for r in routes], [peer(c) for c in clients],
                                           state_timeout_us=card.state_timeout_ms * 1000)

    def load(self, program: bool = True) -> dict:
        """Compile, start ``simple_switch`` with the tables already programmed (see module doc).

        Returns:
            the state file contents plus ``routes``/``clients`` counts.
        Raises:
            UsageError: no config, or no interfaces for the card's ports.
            ConfigError: no ``[card]``, a card port without ``mac``, a shard/client without
                ``mac``/``card_port``.
            MissingDependencyError: p4c / simple_switch / simple_switch_CLI missing (names them).
            OperationalError: p4c failed, already running, the
                namespace has addresses besides loopback, the switch did not start.
        """
        cfg = self.config
        if cfg is None:
            raise UsageError("loading the bmv2 target needs the cluster config: pass --config FILE")
        if cfg.card is None or not cfg.card.enabled:
            raise ConfigError("card", "the bmv2 target needs a [card] section (enabled = true) with its "
                              "ports; see docs/config.md", cfg.path)
        ids = sorted(p.id for p in cfg.card.ports)
        if len(self.interfaces) < len(ids) or ids != list(range(len(ids))):
            raise UsageError(f"the bmv2 target needs one interface per card port (ports {ids}, "
                                   f"{len(self.interfaces)} interface(s) given): --vdev "
                                   "net_af_packet<i>,iface=NAME in port order")
        self._tools()  # a missing tool first: nothing else can be checked or fixed without it
        if not self.netns:  # before the compile, and before any interface moves: a namespace deleted with a
            # veth end in it destroys that veth pair
            for i, ifname in enumerate(self.interfaces[:len(ids)]):
                if not Path("/sys/class/net", ifname).exists():
                    raise UsageError(f"card port {i}: no interface {ifname!r} in this network namespace "
                                     f"(`ip link show`): give the port's interface as --vdev "
                                     f"net_af_packet{i},iface=NAME, or --netns the namespace that holds them")
        routes = routes_from_config(cfg) if program else []
        clients = clients_from_config(cfg) if program else []
        commands = self._card_commands(routes, clients)
        require_root("loading the bmv2 target", "network namespaces for simple_switch")
        ensure_run_dir(self.run_dir)
        old = read_state(self.run_dir, self.instance)
        if old is not None and not old.get("corrupt") and pid_matches(old):
            raise OperationalError(f"pipeline {self.instance!r} is already running ({describe_state(old)}); "
                                   f"run `embnic pipeline unload --name {self.instance}` first")
        if self.netns:  # checked before the (slow) compile: a refusal comes at once
            ns = self._prepare_netns(self.netns, self.interfaces[:len(ids)])
        try:
            json_path = self.json_path or bmv2.compile_program(self.build_dir)
        except bmv2.Bmv2Error as e:
            raise OperationalError(str(e)) from None

        made_ns = None
        if not self.netns:
            made_ns = f"embnic-bmv2-{self.instance}"
            subprocess.run(["ip", "netns", "del", made_ns], capture_output=True)
            try:
                ns = bmv2.Netns.create(made_ns)
                for ifname in self.interfaces[:len(ids)]:
                    ns.take_interface(ifname)
            except (bmv2.Bmv2Error, subprocess.CalledProcessError) as e:
                subprocess.run(["ip", "netns", "del", made_ns], capture_output=True)
                raise OperationalError(f"cannot set up namespace {made_ns}: {e}") from None
        try:
            self._check_loopback_only(ns)
            ports = {i: self.interfaces[i] for i in ids}
            state_file = self.run_dir / f"{self.instance}.bmv2state"
            prog = bmv2.SimpleSwitch(json_path, ns, {}, log=self.run_dir / f"{self.instance}-program.log",
                                     thrift_port=self.thrift_port)
            prog.start()
            try:
                prog.wait_ready(self.ready_timeout)
                # handle 0 left free in every table: see handle_zero_placeholders
                placeholders, unplace = handle_zero_placeholders(commands)
                prog.cli(placeholders)
                prog.cli(commands)
                prog.cli(unplace)
                prog.save_state(state_file)
            finally:
                prog.stop(self.stop_timeout)
            sw = bmv2.SimpleSwitch(json_path, ns, ports, log=self.log_path, restore_state=state_file,
                                   thrift_port=self.thrift_port)
            pid = sw.start()
            state = {"target": "bmv2", "pid": pid, "starttime": proc_starttime(pid), "netns": ns.name,
                     "netns_made": made_ns is not None, "thrift_port": self.thrift_port,
                     "json": str(json_path), "log": str(sw.log_file), "ctl": f"thrift 127.0.0.1:{self.thrift_port} "
                     f"in netns {ns.name}", "config": cfg.path, "started": time.time(),
                     "interfaces": ports, "argv": sw.command()}
            write_state(self.run_dir, self.instance, state)
            sw.wait_ready(self.ready_timeout)
            sw.cli([f"set_queue_depth {bmv2.EGRESS_QUEUE_DEPTH}"])
            self._remove_transient_files()  # the card switch restored the state and is up
        except bmv2.Bmv2Error as e:
            remove_state(self.run_dir, self.instance)
            if made_ns:
                bmv2.Netns(made_ns).delete()
            raise OperationalError(str(e)) from None
        info = {"mode": "bmv2", "state_size": p4prog.constants()["STATE_SLOTS"],
                "state_timeout_ms": cfg.card.state_timeout_ms,
                "ports": [{"port": p.id, "name": ports.get(p.id), "mac": p.mac, "ip": p.ip} for p in cfg.card.ports]}
        return {**state, "routes": len(routes), "clients": len(clients), "info": info}

    def _prepare_netns(self, name: str, ports: Sequence[str]) -> bmv2.Netns:
        """The given namespace, made ready for the switch: loopback up (the runtime CLI reaches
        Thrift on 127.0.0.1) and IPv6 off on the card's port interfaces (the card speaks IPv4;
        a link-local address there would let Thrift be reached from the segment).

        Raises:
            UsageError: not a namespace name, or no such namespace (exit 2).
            OperationalError: it still has an address besides loopback
                (one line naming the addresses and the command that removes them).
        """
        require_netns(name)
        ns = bmv2.Netns(name)
        try:
            ns.run(["ip", "link", "set", "lo", "up"])
            have = {a.split()[0] for a in ns.addresses() if ":" in a.split()[1]}
            for ifname in ports:
                if ifname in have:
                    ns.disable_ipv6(ifname)
        except bmv2.Bmv2Error as e:
            raise OperationalError(str(e)) from None
        self._check_loopback_only(ns)
        return ns

    @staticmethod
    def _check_loopback_only(ns: bmv2.Netns) -> None:
        """Refuse a namespace with any address but 127.0.0.1/::1: Thrift would listen on it.

        Raises:
            OperationalError: one line naming the addresses and how to remove them.
        """
        other = [a for a in ns.addresses() if not a.startswith("lo ")]
        if other:
            ifs = sorted({a.split()[0] for a in other})
            fix = "; ".join(f"ip -n {ns.name} addr flush dev {i} && ip netns exec {ns.name} sysctl -qw "
                            f"net.ipv6.conf.{i}.disable_ipv6=1" for i in ifs)
            raise OperationalError(f"namespace {ns.name} has addresses besides loopback ({', '.join(other)}), "
                                   f"where simple_switch's Thrift server would be reachable: remove them "
                                   f"({fix}) or omit --netns to let the bmv2 target make its own namespace")

    def unload(self) -> dict:
        """Stop the switch (SIGTERM, SIGKILL after ``stop_timeout``), delete a namespace the target
        made, remove the state file and whatever else the load left in the run directory but the
        switch's logs (``NAME.log.txt``, ``NAME.log.out``). Returns the state that was stopped.

        Raises:
            OperationalError: nothing loaded under this name.
        """
        st = self.state()
        if st is None or st.get("target") != "bmv2":
            raise OperationalError(f"no bmv2 pipeline {self.instance!r} loaded (no state file in {self.run_dir})")
        running = not st.get("corrupt") and pid_matches(st)
        killed = False
        if running:
            pid = int(st["pid"])
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout
            while pid_matches(st) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_matches(st):
                os.kill(pid, signal.SIGKILL)
                killed = True
        if st.get("netns_made") and st.get("netns"):
            bmv2.Netns(st["netns"]).delete()
        remove_state(self.run_dir, self.instance)
        self._remove_transient_files()
        return {**st, "was_running": running, "killed": killed, "exit": None}

    def is_loaded(self) -> bool:
        st = self.state()
        return bool(st) and not st.get("corrupt") and st.get("target") == "bmv2" and pid_matches(st)

    # ------------------------------------------------------------------ tables
    def _dump(self, table: str) -> list[dict]:
        return parse_table_dump(self.cli([f"table_dump {table}"]))

    def _allow_handle(self, is_request: int, id_: int) -> list[int]:
        return [e["handle"] for e in self._dump("sender_allowlist") if e["key"][:2] == [is_request, id_]]

    def _replace(self, table: str, id_: int, is_request: int, add: list[str]) -> None:
        cmds = [f"table_delete {table} {e['handle']}" for e in self._dump(table) if e["key"] == [id_]]
        cmds += [f"table_delete sender_allowlist {h}" for h in self._allow_handle(is_request, id_)]
        self.cli(cmds + add)

    def _check_port(self, e: Entry) -> None:
        n = self._nb_ports()
        if not 0 <= int(e.port) < n:
            raise UsageError(f"--port {e.port}: the card has {n} port(s) (0..{n - 1})")

    def route_add(self, e: Entry) -> None:
        """Add or replace the route of shard ``e.id``.

        Raises:
            UsageError: ``e.port`` is not one of the card's ports (exit 2).
            OperationalError: not loaded, or the switch refused the entry.
        """
        self._check_port(e)
        self._replace("route_by_shard", e.id, 0, bmv2_runtime.route_add_commands(
            bmv2_runtime.PeerEntry(e.id, e.port, e.mac, e.ip, e.udp_port)))

    def route_del(self, shard: int) -> None:
        if not any(e["key"] == [shard] for e in self._dump("route_by_shard")):
            raise NoSuchEntryError("route", shard)
        self._replace("route_by_shard", shard, 0, [])

    def route_list(self) -> list[Entry]:
        return sorted((Entry(e["key"][0], e["params"][0], _mac_hex(f"{e['params'][1]:x}"),
                             _ip_hex(f"{e['params'][2]:x}"), e["params"][3])
                       for e in self._dump("route_by_shard")), key=lambda x: x.id)

    def client_add(self, e: Entry) -> None:
        """Add or replace client ``e.id``.

        Raises:
            UsageError: ``e.port`` is not one of the card's ports (exit 2).
            OperationalError: not loaded, or the switch refused the entry.
        """
        self._check_port(e)
        self._replace("client_by_id", e.id, 1, bmv2_runtime.client_add_commands(
            bmv2_runtime.PeerEntry(e.id, e.port, e.mac, e.ip, e.udp_port)))

    def client_del(self, client: int) -> None:
        if not any(e["key"] == [client] for e in self._dump("client_by_id")):
            raise NoSuchEntryError("client", client)
        self._replace("client_by_id", client, 1, [])

    def client_list(self) -> list[Entry]:
        return sorted((Entry(e["key"][0], e["params"][0], _mac_hex(f"{e['params'][1]:x}"),
                             _ip_hex(f"{e['params'][2]:x}"), e["params"][3])
                       for e in self._dump("client_by_id")), key=lambda x: x.id)

    # ------------------------------------------------------------------ observation
    def _nb_ports(self) -> int:
        st = self.state() or {}
        return len(st.get("interfaces") or {}) or (len(self.config.card.ports) if self.config else 1)

    def counters(self) -> dict:
        """Counters in the dpdk target's shape; ``ring`` is the header ring (size, entries logged),
        ``mempool`` is absent (BMv2 has none), ``state`` has ``entries``/``capacity`` too, and
        ``shards`` is ``[{shard, completed}]`` for every shard the card routes (``route_by_shard``):
        the messages of that shard whose whole reply passed, all reply types together (BMv2 keeps
        no per-shard latency histogram: p4/README.md, "Differences")."""
        try:
            shards = sorted(e["key"][0] for e in self._dump("route_by_shard"))
            c = bmv2_runtime.read_counters(self._switch(), self._nb_ports(), shards)
            ring = bmv2_runtime.parse_registers(self.cli(["register_read ring_head"])).get("ring_head", [0])[0]
        except bmv2.Bmv2Error as e:
            raise OperationalError(str(e)) from None
        size = p4prog.constants()["RING_SLOTS"]
        summ = self.state_summary()
        c["ring"] = {"size": size, "count": min(ring, size), "logged": ring}
        c["state"] = {k: summ[k] for k in ("entries", "capacity", "overflow", "expired")}
        return c

    def state_summary(self) -> dict:
        try:
            entries = bmv2_runtime.read_state_map(self._switch())
            c = bmv2_runtime.parse_counters(self.cli(["counter_read state_expired 0",
                                                      f"counter_read drop_reasons {p4prog.constants()['DROP_STATE_FULL']}"]))
        except bmv2.Bmv2Error as e:
            raise OperationalError(str(e)) from None
        by = {"receiving": 0, "forwarded": 0, "answered": 0, "expired": 0}
        for e in entries:
            by[e["state"]] = by.get(e["state"], 0) + 1
        return {"entries": len(entries), "capacity": p4prog.constants()["STATE_SLOTS"],
                "overflow": c.get("drop_reasons", {}).get(p4prog.constants()["DROP_STATE_FULL"], (0, 0))[0],
                "expired": c.get("state_expired", {}).get(0, (0, 0))[0], "by_state": by}

    def state_dump(self, limit: int = 1000) -> list[dict]:
        """Live state map entries in the dpdk target's keys (timestamps: ns since the switch started):
        ``client``, ``msg_id``, ``type``, ``state``, ``shard``, the request's ``num_tables``,
        ``num_keys``, ``value_len``, ``msg_len``, ``frag_count``, frames and body bytes each way,
        ``first_ns``/``last_ns`` and the register ``slot``."""
        try:
            entries = bmv2_runtime.read_state_map(self._switch())[:limit]
        except bmv2.Bmv2Error as e:
            raise OperationalError(str(e)) from None
        return [{"client": e["client_id"], "msg_id": e["msg_id"], "type": MsgType(e["msg_type"]).name
                 if e["msg_type"] in MsgType._value2member_map_ else e["msg_type"], "state": e["state"],
                 "shard": e["shard_id"], "num_tables": e["num_tables"], "num_keys": e["num_keys"],
                 "value_len": e["value_len"], "msg_len": e["msg_len"], "frag_count": e["frag_count"],
                 "frames_in": e["frames_in"],
                 "bytes_in": e["bytes_in"], "frames_out": e["frames_out"], "bytes_out": e["bytes_out"],
                 "first_ns": e["first_us"] * 1000, "last_ns": e["last_us"] * 1000, "slot": e["slot"]}
                for e in entries]

    def ring(self, last: int) -> list[dict]:
        """The ``last`` most recent accepted headers (newest first), ``in_ring`` False: BMv2
        runs each frame through the whole pipeline at once, so none is ever waiting."""
        try:
            return [{**e, "in_ring": False} for e in bmv2_runtime.read_ring(self._switch(), last)]
        except bmv2.Bmv2Error as e:
            raise OperationalError(str(e)) from None

    def info(self) -> dict:
        st = self.state() or {}
        sw = self._switch(st)
        return {"target": "bmv2", "versions": bmv2.tool_versions(), "json": st.get("json"),
                "netns": st.get("netns"), "netns_addresses": sw.netns.addresses(),
                "thrift_port": st.get("thrift_port"),
                "ports": [{"port": p.id, "ip": p.ip, "mac": p.mac, "iface": (st.get("interfaces") or {}).get(str(p.id))}
                          for p in (self.config.card.ports if self.config and self.config.card else ())],
                "state_size": p4prog.constants()["STATE_SLOTS"], "ring_size": p4prog.constants()["RING_SLOTS"]}

    def reset_counters(self) -> None:
        names = ["rx_frames", "tx_frames", "drop_reasons", "frames_by_type", "messages_completed",
                 "arp_replies", "state_expired"]
        self.cli([f"counter_reset {n}" for n in names])
