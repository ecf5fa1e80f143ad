"""The ``bmv2`` target: the P4 program (p4/) on BMv2, over P4Runtime or Thrift (its two control
channels, the namespace it runs in and the frames lost before the switch: p4/README.md "Control
plane"). Card port ``i`` is the interface ``interfaces[i]``, or the ``iface=`` of
``--vdev net_af_packet<i>,iface=NAME`` (what the testbed passes the dpdk target).

    t = Bmv2Target(load_config("examples/testbed.toml"), netns="tb-card",
                   interfaces=["tbp0", "tbp1", "tbp2", "tbp3"], name="tb")
    t.load(); print(t.counters()["drops"]); t.unload()
"""
from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

from embnic.client_lib.config import ClusterConfig, ConfigError
from embnic.control import netns
from embnic.control.targets.bmv2 import switch as bmv2
from embnic.control.targets.bmv2 import runtime as bmv2_runtime
from embnic.control.targets.bmv2 import p4runtime
from embnic.control.targets import p4program as p4prog
from embnic.control.errors import MissingDependencyError, NoSuchEntryError, OperationalError, UsageError
from embnic.control.netns import Netns, NetnsError
from embnic.control.runstate import (ensure_run_dir, pid_matches, proc_starttime, read_state, remove_state,
                                     require_netns, require_root, write_state)
from embnic.control.targets.dpdk.process import stop_recorded
from embnic.control.targets.dpdk.xdp import devargs
from embnic.control.targets.base import Peer, Target, check_peer_port, count_peers, describe_state, peer_kind, peers_from_config


def _operational(fn):
    """``fn`` with a :class:`Bmv2Error` or :class:`P4RuntimeError` raised as :class:`OperationalError`
    (same message): what the CLI reports of a switch that refused or failed."""
    @functools.wraps(fn)
    def wrapper(*args, **kw):
        try:
            return fn(*args, **kw)
        except (bmv2.Bmv2Error, p4runtime.P4RuntimeError) as e:
            raise OperationalError(str(e)) from None
    return wrapper


def interfaces_from_vdevs(vdevs: Sequence[str]) -> list[str]:
    """``["net_af_packet0,iface=Np0", ...]`` → ``["Np0", ...]`` (port order kept).

    Raises:
        UsageError: a vdev without ``iface=`` (BMv2 needs a network interface per port).
    """
    for v in vdevs:
        if not devargs(v).get("iface"):
            raise UsageError(f"--vdev {v!r}: the bmv2 target needs an interface per card port "
                             "(net_af_packet<i>,iface=NAME)")
    return [devargs(v)["iface"] for v in vdevs]


def handle_zero_placeholders(commands: Sequence[str]) -> tuple[list[str], list[str]]:
    """Commands that keep entry handle 0 free in every table a saved state will restore (BMv2
    1.15.5 would give a restored handle 0 again: p4/README.md "Control plane").

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


#: offloads that make libpcap size its capture ring's slots for 64 KiB frames (see
#: :func:`tune_port_interfaces`)
PORT_OFFLOADS_OFF = ("tso", "gso", "gro", "lro", "tx-udp-segmentation", "rx-gro-list", "rx-udp-gro-forwarding")


def tune_port_interfaces(ns: Netns, ifaces: Sequence[str]) -> None:
    """Turn segmentation and receive offloads off on the switch's port interfaces, best effort per
    feature: with them on, libpcap's capture ring holds a few dozen frames (p4/README.md).

    Raises:
        MissingDependencyError: no ethtool (apt-get install ethtool).
    """
    for ifname in ifaces:
        ns.offloads_off(ifname, PORT_OFFLOADS_OFF, each=True)


def interface_rx(ns_name: str, ifaces: dict[int, str]) -> dict[int, int]:
    """Frames each port's interface took in: kernel ``rx_packets + rx_dropped``, by port.

    Raises:
        OperationalError: ``ip`` failed (an interface or the namespace is gone).
    """
    by_name = {d["ifname"]: d["stats64"]["rx"] for d in Netns(ns_name).links(stats=True) if "stats64" in d}
    out = {}
    for port, name in ifaces.items():
        if name not in by_name:
            raise OperationalError(f"card port {port}: no interface {name} in namespace {ns_name} any more")
        rx = by_name[name]
        out[int(port)] = int(rx["packets"]) + int(rx.get("dropped", 0))
    return out


class Bmv2Target(Target):
    """The embnic pipeline as the P4 program on BMv2 (``simple_switch_grpc`` or ``simple_switch``).

    Args:
        config: cluster config; ``[card].ports`` give the card's MAC/IPv4 per port, its
            ``state_timeout_ms`` the state map timeout.
        json_path: a compiled program to run instead of compiling ``p4/v1model/embnic.p4`` (its
            P4Info beside it, for the P4Runtime channel).
        netns: run the switch in this existing namespace (it must have no address but loopback).
        interfaces: card port ``i`` = ``interfaces[i]`` (in ``netns`` if given, else moved into
            the namespace made for the switch).
        vdevs: alternatively ``net_af_packet<i>,iface=NAME`` specs (:func:`interfaces_from_vdevs`).
        thrift_port: the switch's Thrift port (reachable inside its namespace only).
        channel: ``auto`` (P4Runtime where ``simple_switch_grpc`` is on PATH), ``p4runtime`` or
            ``thrift``; None: ``$EMBNIC_BMV2_CHANNEL``, else ``auto`` (module docstring).
        ready_timeout: seconds to wait for the switch to start.
        stop_timeout: seconds between SIGTERM and SIGKILL on unload.

    Raises (constructor):
        UsageError: ``channel`` (or ``$EMBNIC_BMV2_CHANNEL``) is none of the three.
    """

    name = "bmv2"
    OPTIONS = frozenset({"json_path", "netns", "interfaces", "vdevs", "thrift_port", "ready_timeout",
                         "stop_timeout", "channel"})

    def __init__(self, config: ClusterConfig | None = None, *, name: str = "embnic",
                 run_dir: str | os.PathLike | None = None, json_path: str | os.PathLike | None = None,
                 netns: str | None = None, interfaces: Sequence[str] = (), vdevs: Sequence[str] = (),
                 thrift_port: int = bmv2.DEFAULT_THRIFT_PORT, ready_timeout: float = 60.0,
                 stop_timeout: float = 10.0, channel: str | None = None):
        super().__init__(config, name=name, run_dir=run_dir)
        try:
            self.requested_channel = bmv2.choose_channel(channel)
        except ValueError as e:
            raise UsageError(str(e)) from None
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
    def _remove_transient_files(self) -> None:
        """Remove the run-directory files a load makes that the running card does not need once its
        switch is up: the programming switch's logs and the saved state it hands over (and the build
        directory earlier versions kept here). Only the card switch's logs outlive an unload,
        as the dpdk target's log does."""
        base = self.run_dir / self.instance
        for path in (Path(f"{base}.bmv2state"), Path(f"{base}-program.log.txt"), Path(f"{base}-program.log.out"),
                     Path(f"{base}-p4")):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    @property
    def p4rt_socket(self) -> Path:
        """The P4Runtime server's unix socket (p4runtime channel): ``RUN_DIR/NAME.p4rt``."""
        return self.run_dir / f"{self.instance}.p4rt"

    def channel(self, state: dict | None = None) -> str:
        """The control channel: the loaded pipeline's (state file), else the one a load would use."""
        st = state if state is not None else (self.state() or {})
        return st.get("channel") or ("thrift" if st.get("target") == "bmv2" else self.requested_channel)

    def _switch(self, state: dict | None = None) -> bmv2.SimpleSwitch:
        """A handle on the running switch (from the state file) for CLI and P4Runtime calls."""
        st = state or self.state()
        if not st or st.get("corrupt") or st.get("target") != "bmv2":
            raise OperationalError(f"no bmv2 pipeline {self.instance!r} loaded: run `embnic pipeline load "
                                   f"--target bmv2 --config FILE" +
                                   (f" --name {self.instance}`" if self.instance != "embnic" else "`"))
        if not pid_matches(st):
            raise OperationalError(f"the bmv2 pipeline {self.instance!r} is not running any more "
                                   f"({describe_state(st)}); see its log {st.get('log')}")
        return bmv2.SimpleSwitch(Path(st["json"]), Netns(st["netns"]), {}, log=Path(st["log"]),
                                 thrift_port=int(st["thrift_port"]), grpc_addr=st.get("p4rt"))

    @_operational
    def cli(self, commands: Sequence[str]) -> str:
        """Run runtime-CLI commands on the loaded switch.

        Raises:
            OperationalError: not loaded, or the CLI refused a command (its message).
        """
        return self._switch().cli(commands)

    # ------------------------------------------------------------------ lifecycle
    def _tools(self, channel: str) -> None:
        """Raise MissingDependencyError (one line) naming every missing tool (and, for P4Runtime,
        Python package) and how to get each."""
        missing = bmv2.missing_tools([bmv2.CHANNEL_SWITCH[channel], "simple_switch_CLI"])
        if channel == "p4runtime" and not missing:
            p4runtime.require()  # MissingDependencyError naming finsy/grpcio and the pip line
        if missing:
            raise MissingDependencyError(f"the bmv2 target needs {', '.join(missing)}, not found on PATH: " +
                                         "; ".join(f"{t}: {bmv2.TOOL_HINTS[t]}" for t in missing),
                                         dependency=missing[0])

    def load(self, program: bool = True) -> dict:
        """Take the compiled program, start the switch and program it before it takes a frame (module docstring),
        on the channel ``channel`` chose.

        Returns:
            the state file contents plus ``routes``/``clients`` counts.
        Raises:
            UsageError: no config, or no interfaces for the card's ports; a run directory too
                long for the P4Runtime socket.
            ConfigError: no ``[card]``, a card port without ``mac``, a shard/client without
                ``mac``/``card_port``.
            MissingDependencyError: simple_switch(_grpc) / simple_switch_CLI missing, or
                finsy/grpcio for P4Runtime (names them); p4/ edited and no p4c 1.2.4.8 to compile it.
            UsageError: the config sets ``ring_size``/``state_size`` other than the compiled ones.
            OperationalError: compiling an edited p4/ failed, already running, the
                namespace has addresses besides loopback, the switch did not start.
        """
        cfg = self.config
        if cfg is None:
            raise UsageError("loading the bmv2 target needs the cluster config: pass --config FILE")
        if cfg.card is None or not cfg.card.enabled:
            raise ConfigError("card", "the bmv2 target needs a [card] section (enabled = true) with its "
                              "ports; see docs/config.md", cfg.path)
        sizes = p4prog.card_sizes(cfg.card, "bmv2", cfg.path)
        ids = sorted(p.id for p in cfg.card.ports)
        if len(self.interfaces) < len(ids) or ids != list(range(len(ids))):
            raise UsageError(f"the bmv2 target needs one interface per card port (ports {ids}, "
                                   f"{len(self.interfaces)} interface(s) given): --vdev "
                                   "net_af_packet<i>,iface=NAME in port order")
        self._tools(self.requested_channel)  # a missing tool first: nothing can be checked or fixed without it
        if not self.netns:  # before the compile, and before any interface moves: a namespace deleted with a
            # veth end in it destroys that veth pair
            for i, ifname in enumerate(self.interfaces[:len(ids)]):
                if not Path("/sys/class/net", ifname).exists():
                    raise UsageError(f"card port {i}: no interface {ifname!r} in this network namespace "
                                     f"(`ip link show`): give the port's interface as --vdev "
                                     f"net_af_packet{i},iface=NAME, or --netns the namespace that holds them")
        peers = peers_from_config(cfg) if program else []
        for p in cfg.card.ports:
            if p.mac is None:
                raise ConfigError(f"card.ports[{p.id}].mac", "required by the bmv2 target (the switch has no "
                                  "MAC of its own): add mac = \"02:..\"", cfg.path)
        card = bmv2_runtime.card_program([bmv2_runtime.CardPortAddr(p.id, p.mac, p.ip) for p in cfg.card.ports],
                                         peers, state_timeout_us=cfg.card.state_timeout_ms * 1000)
        channel = self.requested_channel
        if channel == "p4runtime" and len(str(self.p4rt_socket)) > 100:  # sun_path holds 108 bytes
            raise UsageError(f"the P4Runtime socket path {self.p4rt_socket} is too long for a unix socket: "
                             "use a shorter run directory (EMBNIC_RUN_DIR) or name")
        require_root("loading the bmv2 target", "network namespaces for simple_switch")
        ensure_run_dir(self.run_dir)
        old = read_state(self.run_dir, self.instance)
        if old is not None and not old.get("corrupt") and pid_matches(old):
            raise OperationalError(f"pipeline {self.instance!r} is already running ({describe_state(old)}); "
                                   f"run `embnic pipeline unload --name {self.instance}` first")
        if self.netns:  # checked before the (slow) compile: a refusal comes at once
            ns = self._prepare_netns(self.netns, self.interfaces[:len(ids)])
        json_path, note = (self.json_path, None) if self.json_path else bmv2.program_json()

        made_ns = None
        if not self.netns:
            ns = self._own_netns(self.interfaces[:len(ids)])
            made_ns = ns.name
        sw = None
        try:
            self._check_loopback_only(ns)
            ports = {i: self.interfaces[i] for i in ids}
            tune_port_interfaces(ns, list(ports.values()))
            sw = self._card_switch(channel, json_path, ns, ports, card)  # held before it starts
            state = self._start(sw, json_path, ns, ports, channel)
            if channel == "p4runtime":  # the pipeline, tables, registers and queues, then the ports
                state["programmed"] = bmv2_runtime.program_p4runtime(sw, json_path, card,
                                                                     timeout=self.ready_timeout)
                sw.port_add(ports)
            else:
                sw.cli([f"set_queue_depth {bmv2.EGRESS_QUEUE_DEPTH}"])
            state.update({"netns_made": made_ns is not None, "config": cfg.path})
            # frames lost before the switch are counted from here (and from each counter reset)
            state["port_base"] = self._port_base(state)
            write_state(self.run_dir, self.instance, state)
            self._remove_transient_files()  # the card switch is up and programmed
        except BaseException as e:  # whatever failed (Ctrl-C too): no switch is left running
            if sw is not None:
                sw.stop(self.stop_timeout)  # (one not started yet is left as it is)
            remove_state(self.run_dir, self.instance)
            self.p4rt_socket.unlink(missing_ok=True)
            if made_ns:
                netns.delete(made_ns)
            if isinstance(e, (bmv2.Bmv2Error, OperationalError)):
                raise OperationalError(str(e)) from None
            raise
        info = {"mode": "bmv2", "state_size": sizes["state_size"], "ring_size": sizes["ring_size"],
                "state_timeout_ms": cfg.card.state_timeout_ms,
                "ports": [{"port": p.id, "name": ports.get(p.id), "mac": p.mac, "ip": p.ip} for p in cfg.card.ports]}
        return {**state, **count_peers(peers), "info": info,
                "warnings": [note] if note else []}

    def _own_netns(self, ifnames: list[str]) -> Netns:
        """A namespace of the card's own, ``embnic-bmv2-<instance>`` (one a crashed load left removed
        first), holding ``ifnames``.

        Raises:
            OperationalError: it cannot be made or take an interface (then it is removed again).
        """
        name = f"embnic-bmv2-{self.instance}"
        netns.delete(name)
        try:
            ns = Netns.create(name, ipv6=True)  # IPv6 off per port (take_interface): ::1 stays
            for ifname in ifnames:
                ns.take_interface(ifname)
        except NetnsError as e:
            netns.delete(name)
            raise OperationalError(f"cannot set up namespace {name}: {e}") from None
        return ns

    def _start(self, sw: bmv2.SimpleSwitch, json_path: Path, ns: Netns, ports: dict, channel: str) -> dict:
        """Start the card's switch ``sw``, write the state file (before waiting: ``unload`` finds a
        half-started one), wait until it is ready; returns the state."""
        pid = sw.start()
        ctl = f"thrift 127.0.0.1:{self.thrift_port} in netns {ns.name}"
        if channel == "p4runtime":
            ctl = f"p4runtime {sw.grpc_addr} (tables); {ctl} (registers, counters, queues)"
        state = {"target": "bmv2", "channel": channel, "pid": pid, "starttime": proc_starttime(pid),
                "netns": ns.name, "thrift_port": self.thrift_port, "p4rt": sw.grpc_addr, "json": str(json_path),
                "p4info": str(bmv2.p4info_path(json_path)) if channel == "p4runtime" else None,
                "log": str(sw.log_file), "ctl": ctl, "started": time.time(), "interfaces": ports,
                "argv": sw.command(), "switch": bmv2.CHANNEL_SWITCH[channel]}
        write_state(self.run_dir, self.instance, state)
        sw.wait_ready(self.ready_timeout)
        return state

    def _card_switch(self, channel: str, json_path: Path, ns: Netns, ports: dict,
                     card: bmv2_runtime.CardProgram) -> bmv2.SimpleSwitch:
        """The card's switch, not started yet (module docstring). P4Runtime: ``simple_switch_grpc``
        with no program and no port (``load`` pushes the pipeline, writes and reads back every
        table, then adds the ports). Thrift: a port-less switch programmed with the runtime CLI
        saves its state, and the card's switch has the ports and ``--restore-state``."""
        if channel == "p4runtime":
            self.p4rt_socket.unlink(missing_ok=True)  # a stale socket of a killed switch
            return bmv2.SimpleSwitch(None, ns, {}, log=self.log_path, thrift_port=self.thrift_port,
                                     grpc_addr=f"unix:{self.p4rt_socket}")
        commands = card.cli_commands()
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
        return bmv2.SimpleSwitch(json_path, ns, ports, log=self.log_path, restore_state=state_file,
                                 thrift_port=self.thrift_port)

    def _port_base(self, state: dict) -> dict:
        """``{port: {"iface_rx": n, "switch_rx": n}}`` now: the zero of ``lost_before_switch``."""
        ifaces = {int(k): v for k, v in (state.get("interfaces") or {}).items()}
        iface = interface_rx(state["netns"], ifaces)
        sw = self._switch(state)
        c = bmv2_runtime.parse_counters(sw.cli([f"counter_read rx_frames {p}" for p in sorted(ifaces)]))
        return {str(p): {"iface_rx": iface[p], "switch_rx": c.get("rx_frames", {}).get(p, (0, 0))[0]}
                for p in sorted(ifaces)}

    def _prepare_netns(self, name: str, ports: Sequence[str]) -> Netns:
        """The given namespace, made ready for the switch: loopback up (the runtime CLI reaches
        Thrift on 127.0.0.1) and IPv6 off on the card's port interfaces (the card speaks IPv4;
        a link-local address there would let Thrift be reached from the segment).

        Raises:
            UsageError: not a namespace name, or no such namespace (exit 2).
            OperationalError: it still has an address besides loopback
                (one line naming the addresses and the command that removes them).
        """
        require_netns(name)
        ns = Netns(name)
        ns.link_up("lo")
        have = {a.split()[0] for a in ns.addresses() if ":" in a.split()[1]}
        for ifname in ports:
            if ifname in have:
                ns.disable_ipv6(ifname)
        self._check_loopback_only(ns)
        return ns

    @staticmethod
    def _check_loopback_only(ns: Netns) -> None:
        """Refuse a namespace with any address but 127.0.0.1/::1: Thrift would listen on it.

        Raises:
            OperationalError: one line naming the addresses and how to remove them.
        """
        other = [a for a in ns.addresses() if not a.startswith("lo ")]
        if other:
            ifs = sorted({a.split()[0] for a in other})
            fix = "; ".join(f"ip -n {ns.name} addr flush dev {i} && "
                            + shlex.join(ns.exec_argv(["sysctl", "-qw", f"net.ipv6.conf.{i}.disable_ipv6=1"]))
                            for i in ifs)
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
        res = {"was_running": False, "killed": False, "exit": None}
        if not st.get("corrupt"):
            res = stop_recorded(st, self.stop_timeout)  # SIGTERM, SIGKILL: only if pid and start time match
        if st.get("netns_made") and st.get("netns"):
            netns.delete(st["netns"])
        remove_state(self.run_dir, self.instance)
        self._remove_transient_files()
        if st.get("p4rt"):
            self.p4rt_socket.unlink(missing_ok=True)
        return {**st, **res}

    def is_loaded(self) -> bool:
        st = self.state()
        return bool(st) and not st.get("corrupt") and st.get("target") == "bmv2" and pid_matches(st)

    # ------------------------------------------------------------------ tables
    @_operational
    def _p4rt(self, st: dict):
        """A P4Runtime client of the loaded switch (its P4Info fetched from the switch)."""
        c = self._switch(st).p4runtime(timeout=self.ready_timeout)
        c.get_p4info()
        return c

    @_operational
    def _dump(self, table: str) -> list[dict]:
        """Entries of ``table`` as ``[{key: [ints], action, params: [ints]}]`` (Thrift: with
        ``handle``), over the loaded pipeline's channel."""
        st = self.state() or {}
        if self.channel(st) != "p4runtime":
            return parse_table_dump(self.cli([f"table_dump {table}"]))
        c = self._p4rt(st)
        try:
            return [{"key": list(e.key), "action": e.action, "params": list(e.params)} for e in c.read_table(table)]
        finally:
            c.close()

    @_operational
    def _replace(self, kind: str, id_: int, add: list) -> None:
        """Replace the entry of peer ``id_`` of ``kind`` in its table and its allowlist entries by
        ``add`` (TableEntry objects; none: delete them)."""
        table, is_request = peer_kind(kind).p4_table, peer_kind(kind).is_request
        st = self.state() or {}
        if self.channel(st) != "p4runtime":
            cmds = [f"table_delete {table} {e['handle']}" for e in self._dump(table) if e["key"] == [id_]]
            cmds += [f"table_delete sender_allowlist {e['handle']}" for e in self._dump("sender_allowlist")
                     if e["key"][:2] == [is_request, id_]]
            self.cli(cmds + [e.cli_add() for e in add])
            return
        c = self._p4rt(st)
        try:
            old = [e for e in c.read_table(table) if e.key == (id_,)]
            old += [e for e in c.read_table("sender_allowlist") if e.key[:2] == (is_request, id_)]
            new_keys = {(e.table, e.key) for e in add}
            old_by_key = {(e.table, e.key): e for e in old}
            stale = [e for e in old if (e.table, e.key) not in new_keys]
            c.become_primary()
            # P4Runtime may apply the updates of one Write in any order: deletes in a Write of their own
            c.write(deletes=stale)
            c.write(inserts=[e for e in add if (e.table, e.key) not in old_by_key],
                    modifies=[e for e in add if (e.table, e.key) in old_by_key and old_by_key[(e.table, e.key)] != e])
        finally:
            c.close()

    def peer_add(self, p: Peer) -> None:
        check_peer_port(p, self._nb_ports())
        self._replace(p.kind, p.id, bmv2_runtime.peer_entries(p))

    def peer_del(self, kind: str, id_: int) -> None:
        k = peer_kind(kind)
        if not any(e["key"] == [id_] for e in self._dump(k.p4_table)):
            raise NoSuchEntryError(k.noun, id_)
        self._replace(kind, id_, [])

    def peer_list(self, kind: str) -> list[Peer]:
        return p4prog.peers_of(kind, self._dump(peer_kind(kind).p4_table))

    # ------------------------------------------------------------------ observation
    def _nb_ports(self) -> int:
        st = self.state() or {}
        return len(st.get("interfaces") or {}) or (len(self.config.card.ports) if self.config else 1)

    @_operational
    def counters(self) -> dict:
        """Counters in the dpdk target's shape; ``ring`` is the header ring (size, entries logged),
        ``mempool`` is absent (BMv2 has none), ``state`` has ``entries``/``capacity`` too, and
        ``shards`` is ``[{shard, completed}]`` for every shard the card routes (``route_by_shard``):
        the messages of that shard whose whole reply passed, all reply types together (BMv2 keeps
        no per-shard latency histogram: p4/README.md, "Differences").

        Each port also has ``iface_rx_frames`` (frames its interface took in since the load or the
        last :meth:`reset_counters`: kernel ``rx_packets + rx_dropped``) and
        ``lost_before_switch`` (those minus the frames the switch's ingress counted; the switch's
        counters are read first, so a frame still queued for the switch while traffic flows
        counts as lost until it is processed: exact at rest); ``lost_before_switch`` is their
        total. ``control`` says which channel programs the tables: ``{"channel": "p4runtime" |
        "thrift", "tables": address, "registers": address}``.
        """
        st = self.state() or {}
        shards = sorted(e["key"][0] for e in self._dump("route_by_shard"))
        c = bmv2_runtime.read_counters(self._switch(st), self._nb_ports(), shards)
        ring = bmv2_runtime.parse_registers(self.cli(["register_read ring_head"])).get("ring_head", [0])[0]
        base = st.get("port_base") or {}
        ifaces = {int(k): v for k, v in (st.get("interfaces") or {}).items()}
        iface = interface_rx(st["netns"], ifaces) if ifaces else {}
        lost = 0
        for p in c["ports"]:
            b = base.get(str(p["port"]))
            if b is None or p["port"] not in iface:
                continue
            p["iface_rx_frames"] = iface[p["port"]] - b["iface_rx"]
            p["lost_before_switch"] = p["iface_rx_frames"] - (p["rx_frames"] - b["switch_rx"])
            lost += p["lost_before_switch"]
        c["lost_before_switch"] = lost
        c.update(p4prog.ring_state_counters(ring, self.state_summary()))
        c["control"] = self.control_channel(st)
        return c

    def control_channel(self, state: dict | None = None) -> dict:
        """``{"channel", "switch", "tables", "registers"}``: which channel programs the tables
        (``p4runtime``: the P4Runtime address; ``thrift``: the runtime CLI), which reads registers
        and counters (always Thrift, in the switch's namespace)."""
        st = state if state is not None else (self.state() or {})
        ch = self.channel(st)
        thrift = f"thrift 127.0.0.1:{st.get('thrift_port', self.thrift_port)} in netns {st.get('netns')}"
        return {"channel": ch, "switch": st.get("switch") or bmv2.CHANNEL_SWITCH[ch],
                "tables": st.get("p4rt") if ch == "p4runtime" else thrift, "registers": thrift}

    @_operational
    def state_summary(self) -> dict:
        entries = bmv2_runtime.read_state_map(self._switch())
        full = p4prog.constants()["DROP_STATE_FULL"]
        c = bmv2_runtime.parse_counters(self.cli(["counter_read state_expired 0",
                                                  f"counter_read drop_reasons {full}"]))
        return p4prog.summarize_state(entries, c.get("drop_reasons", {}).get(full, (0, 0))[0],
                                      c.get("state_expired", {}).get(0, (0, 0))[0])

    @_operational
    def state_dump(self, limit: int = 1000) -> list[dict]:
        """Live state map entries in the dpdk target's keys (timestamps: ns since the switch started)."""
        return p4prog.dump_state(bmv2_runtime.read_state_map(self._switch())[:limit])

    @_operational
    def ring(self, last: int) -> list[dict]:
        """The ``last`` most recent accepted headers (newest first), ``in_ring`` False: BMv2
        runs each frame through the whole pipeline at once, so none is ever waiting."""
        return [{**e, "in_ring": False} for e in bmv2_runtime.read_ring(self._switch(), last)]

    def info(self) -> dict:
        st = self.state() or {}
        sw = self._switch(st)
        return {"target": "bmv2", "versions": bmv2.tool_versions(), "json": st.get("json"),
                "p4info": st.get("p4info"), "control": self.control_channel(st),
                "build": bmv2.build_info(st.get("switch") or "simple_switch"),
                "netns": st.get("netns"), "netns_addresses": sw.netns.addresses(),
                "thrift_port": st.get("thrift_port"),
                "ports": [{"port": p.id, "ip": p.ip, "mac": p.mac, "iface": (st.get("interfaces") or {}).get(str(p.id))}
                          for p in (self.config.card.ports if self.config and self.config.card else ())],
                "state_size": p4prog.constants()["STATE_SLOTS"], "ring_size": p4prog.constants()["RING_SLOTS"]}

    def reset_counters(self) -> None:
        """Zero the card's counters and restart the count of frames lost before the switch
        (exact when no frame is in flight)."""
        self.cli([f"counter_reset {n}" for n in p4prog.COUNTERS])
        st = self.state()
        if st and st.get("interfaces"):
            st["port_base"] = self._port_base(st)
            write_state(self.run_dir, self.instance, st)
