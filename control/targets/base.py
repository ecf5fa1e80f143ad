"""Pipeline targets: one interface for every place the embnic pipeline can run.

A :class:`Target` loads the pipeline (starts the card), programs its route table (shard →
card port, MAC, IPv4, UDP port) and client table (client → the same), reads its counters and
message state map, and unloads it. ``dpdk`` (:mod:`embnic.control.targets.dpdk.target`) runs embnic-dp,
``bmv2`` (:mod:`embnic.control.targets.bmv2.target`) the P4 program on ``simple_switch``; another
registers beside them::

    register_target("mynic", "mypkg.target:MyNicTarget")

Targets are looked up by name with :func:`get_target_class`, imported only when used.

Every loaded pipeline has a state file ``RUN_DIR/NAME.json`` (RUN_DIR: ``EMBNIC_RUN_DIR``
or ``/run/embnic``) with its pid, control socket, log and command line, so a second load
says what is already running and ``unload`` knows what to stop.
"""
from __future__ import annotations

import abc
import dataclasses
import importlib
import ipaddress
import time
from pathlib import Path
from typing import Any, Iterable

from embnic.client_lib import consts
from embnic.client_lib.config import ClusterConfig, ConfigError
from embnic.control.errors import OperationalError, UsageError
from embnic.control.runstate import read_state, run_dir as default_run_dir

# --------------------------------------------------------------------------- registry
_REGISTRY: dict[str, str | type] = {
    "dpdk": "embnic.control.targets.dpdk.target:DpdkTarget",
    "bmv2": "embnic.control.targets.bmv2.target:Bmv2Target",
    "p4dpdk": "embnic.control.targets.p4dpdk.target:P4DpdkTarget",
}


def register_target(name: str, spec: str | type) -> None:
    """Register a target class (or ``"module:Class"`` to import lazily) under ``name``."""
    _REGISTRY[name] = spec


def target_names() -> list[str]:
    """Names of the registered targets, sorted."""
    return sorted(_REGISTRY)


def get_target_class(name: str) -> type["Target"]:
    """The target class registered as ``name``.

    Raises:
        UsageError: no such target (names the ones there are).
    """
    spec = _REGISTRY.get(name)
    if spec is None:
        raise UsageError(f"no target {name!r}; available: {', '.join(target_names())}", param="target")
    if isinstance(spec, str):
        mod, attr = spec.split(":")
        spec = getattr(importlib.import_module(mod), attr)
        _REGISTRY[name] = spec
    return spec


# --------------------------------------------------------------------------- table entries
@dataclasses.dataclass(frozen=True)
class Entry:
    """One route (``id`` = shard) or client (``id`` = client) table entry of the card."""

    id: int
    port: int  #: card (DPDK) port the peer hangs off
    mac: str  #: the peer's MAC (destination of frames the card sends it)
    ip: str  #: the peer's IPv4 address
    udp_port: int  #: the peer's UDP port

    def route_fields(self) -> dict:
        return {"shard": self.id, "port": self.port, "mac": self.mac, "ip": self.ip, "udp_port": self.udp_port}

    def client_fields(self) -> dict:
        return {"client": self.id, "port": self.port, "mac": self.mac, "ip": self.ip, "udp_port": self.udp_port}


def _entries(cfg: ClusterConfig, kind: str) -> list[Entry]:
    eps = cfg.shards if kind == "shards" else cfg.clients
    out = []
    for i, e in enumerate(eps):
        if e.mac is None:
            raise ConfigError(f"{kind}[{i}].mac", "required to program the card, which does not resolve "
                              f"MACs by ARP; add mac = \"..\" to the {kind[:-1]} with id {e.id} "
                              "(`ip link show` in its namespace prints it)", cfg.path)
        if e.card_port is None:
            raise ConfigError(f"{kind}[{i}].card_port", "required to program the card: the card port "
                              f"the {kind[:-1]} with id {e.id} is reached through", cfg.path)
        out.append(Entry(e.id, e.card_port, e.mac, e.ip, e.port))
    return out


def routes_from_config(cfg: ClusterConfig) -> list[Entry]:
    """The route table the config implies: one entry per ``[[shards]]`` (shard → port, MAC, IP, UDP port).

    Raises:
        ConfigError: a shard without ``mac`` or ``card_port`` (names the field).
    """
    return _entries(cfg, "shards")


def clients_from_config(cfg: ClusterConfig) -> list[Entry]:
    """The client table the config implies: one entry per ``[[clients]]``.

    Raises:
        ConfigError: a client without ``mac`` or ``card_port`` (names the field).
    """
    return _entries(cfg, "clients")


#: how the two peer tables name their peers: (noun, plural config section, what one entry is called)
_TABLES = {"route": ("shard", "shards", "route for shard"), "client": ("client", "clients", "client")}


def resolve_entry(table: str, id_: int, cfg: ClusterConfig | None, port: int | None, mac: str | None,
                  ip: str | None, udp_port: int | None) -> Entry:
    """The ``route`` or ``client`` table entry for ``id_``: the given fields first (``None`` = not
    given), then the config's ``[[shards]]``/``[[clients]]`` entry; without a config a route's UDP
    port defaults to the protocol's (7878).

    Raises:
        UsageError: unknown shard/client in the config, a field neither argument nor config gives,
            a loopback IP, a card port the config's [card] does not have, or the IP or MAC of a
            card port itself.
    """
    noun, plural, _ = _TABLES[table]
    if cfg is not None:
        eps = cfg.shards if table == "route" else cfg.clients
        ep = next((e for e in eps if e.id == id_), None)
        if ep is None:
            ids = ", ".join(str(e.id) for e in eps)
            raise UsageError(f"unknown {noun} {id_}: {cfg.path or 'the config'} has {plural} {ids}; "
                             f"add a [[{plural}]] entry with id = {id_} or pick one of those")
        port = ep.card_port if port is None else port
        mac = ep.mac if mac is None else mac
        ip = ep.ip if ip is None else ip
        udp_port = ep.port if udp_port is None else udp_port
    elif table == "route" and udp_port is None:
        udp_port = consts.UDP_PORT
    src = f" in {cfg.path or 'the config'}" if cfg is not None else " (and no --config)"
    if mac is None:
        raise UsageError(f"{noun} {id_} has no MAC{src}: give --mac (the card does not resolve MACs by ARP)")
    for opt, v in (("--port", port), ("--ip", ip), ("--udp-port", udp_port)):
        if v is None:
            raise UsageError(f"{noun} {id_} has no {opt[2:]}{src}: give {opt}")
    if ipaddress.IPv4Address(ip).is_loopback:
        raise UsageError(f"--ip {ip} is a loopback address, which the card cannot reach: give the {noun}'s own "
                         "address on its card port's segment")
    if cfg is not None and cfg.card is not None and cfg.card.ports:
        have = sorted(p.id for p in cfg.card.ports)
        if port not in have:
            raise UsageError(f"--port {port}: the card has no port {port} (card.ports in "
                             f"{cfg.path or 'the config'}: {', '.join(map(str, have))})")
        for p in cfg.card.ports:  # the config refuses these for its own entries (docs/config.md)
            if p.ip == ip:
                raise UsageError(f"--ip {ip} is the card's own address on port {p.id}: give the {noun}'s own "
                                 "address (the card would send the frames to itself)")
            if p.mac and p.mac == str(mac).lower():
                raise UsageError(f"--mac {mac} is the MAC of card port {p.id}: give the {noun}'s own MAC")
    return Entry(id_, int(port), mac, ip, int(udp_port))


def format_entries(table: str, entries: list[Entry]) -> str:
    """The ``route`` or ``client`` table as fixed-width text (a header line, one line per entry)."""
    head = f"{_TABLES[table][0].upper():>6}  {'PORT':>4}  {'MAC':<17}  {'IP':<15}  {'UDP':>5}"
    rows = [f"{e.id:>6}  {e.port:>4}  {e.mac:<17}  {e.ip:<15}  {e.udp_port:>5}" for e in entries]
    return "\n".join([head, *rows])


# --------------------------------------------------------------------------- state file
def describe_state(state: dict) -> str:
    """One-line description of a state file for messages ("pid 42, ctl ..., since ...")."""
    since = state.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    ns = f", netns {state['netns']}" if state.get("netns") else ""
    return (f"{state.get('target', '?')} target, pid {state.get('pid', '?')}, ctl {state.get('ctl', '?')}{ns}, "
            f"config {state.get('config') or '-'}, since {when}")


# --------------------------------------------------------------------------- the interface
class Target(abc.ABC):
    """A place the embnic pipeline runs. Subclasses set :attr:`name` and :attr:`OPTIONS`.

    Args:
        config: the cluster config (needed by :meth:`load`; optional for an already loaded pipeline).
        name: pipeline instance name (state file ``RUN_DIR/NAME.json``).
        run_dir: directory of state files, sockets and logs (default ``EMBNIC_RUN_DIR`` or /run/embnic).
    """

    name: str = "?"
    #: names of target-specific options accepted by ``from_settings`` (e.g. ``{"binary", "vdevs"}``)
    OPTIONS: frozenset[str] = frozenset()

    def __init__(self, config: ClusterConfig | None = None, *, name: str = "embnic",
                 run_dir: str | Path | None = None):
        self.config = config
        self.instance = name
        self.run_dir = Path(run_dir) if run_dir is not None else default_run_dir()

    @classmethod
    def from_settings(cls, s, **opts: Any) -> "Target":
        """Build from resolved CLI :class:`~embnic.control.settings.Settings` plus target options.

        Raises:
            UsageError: an option this target does not take.
        """
        bad = sorted(k for k, v in opts.items() if v not in (None, (), []) and k not in cls.OPTIONS)
        if bad:
            raise UsageError(f"--{bad[0].replace('_', '-')} is not an option of the {cls.name} target", param=bad[0])
        return cls(s.config, name=s.name, run_dir=s.run_dir,
                   **{k: v for k, v in opts.items() if k in cls.OPTIONS})

    # -- lifecycle
    @abc.abstractmethod
    def load(self, program: bool = True) -> dict:
        """Start the pipeline and (``program``) install the config's routes and clients.

        Returns:
            the state written to the state file (pid, ctl, log, ...).
        Raises:
            OperationalError: already running, cannot start, not ready in time, or refused.
        """

    @abc.abstractmethod
    def unload(self) -> dict:
        """Stop the pipeline and remove its state file; returns what was stopped.

        Raises:
            OperationalError: nothing loaded under this name.
        """

    @abc.abstractmethod
    def is_loaded(self) -> bool:
        """True if this pipeline runs and answers."""

    def state(self) -> dict | None:
        """This pipeline's state file (None when not loaded)."""
        return read_state(self.run_dir, self.instance)

    # -- tables
    @abc.abstractmethod
    def route_add(self, e: Entry) -> None:
        """Add or replace the route for shard ``e.id``."""

    @abc.abstractmethod
    def route_del(self, shard: int) -> None:
        """Delete the route for ``shard``.

        Raises:
            NoSuchEntryError: the card has no route for ``shard`` (exit 2).
        """

    @abc.abstractmethod
    def route_list(self) -> list[Entry]:
        """Routes installed on the card, by shard."""

    @abc.abstractmethod
    def client_add(self, e: Entry) -> None:
        """Add or replace client ``e.id``."""

    @abc.abstractmethod
    def client_del(self, client: int) -> None:
        """Delete client ``client``.

        Raises:
            NoSuchEntryError: the card has no client ``client`` (exit 2).
        """

    @abc.abstractmethod
    def client_list(self) -> list[Entry]:
        """Clients installed on the card, by id."""

    def program(self, config: ClusterConfig | None = None) -> tuple[int, int]:
        """Install every route and client of ``config`` (default: this target's).

        Returns:
            (#routes, #clients) installed.
        Raises:
            ConfigError: a shard/client lacks ``mac`` or ``card_port``.
        """
        cfg = config or self.config
        routes, clients = routes_from_config(cfg), clients_from_config(cfg)
        for r in routes:
            self.route_add(r)
        for c in clients:
            self.client_add(c)
        return len(routes), len(clients)

    # -- observation
    @abc.abstractmethod
    def counters(self) -> dict:
        """Counters: ``ports``, ``types``, ``drops`` (every reason), ``ring``, ``mempool``, ``state``
        (the shape of the ``counters`` control command, docs/control-socket.md)."""

    @abc.abstractmethod
    def state_summary(self) -> dict:
        """Message state map summary: ``entries``, ``capacity``, ``overflow``, ``expired``, ``by_state``."""

    @abc.abstractmethod
    def state_dump(self, limit: int = 1000) -> list[dict]:
        """Up to ``limit`` message state entries (client, msg_id, state, frames, bytes, timestamps in ns)."""

    @abc.abstractmethod
    def info(self) -> dict:
        """Build info, ports, lcores, mode of the running pipeline."""

    def reset_counters(self) -> None:  # optional
        raise OperationalError(f"the {self.name} target cannot reset counters")

    def ring(self, last: int) -> list[dict]:  # optional
        """The ``last`` most recent headers of the header ring, newest first (``msg_type``,
        ``msg_id``, ``client_id``, ``shard_id``, ``frag_index``, ``frag_count``, ...)."""
        raise OperationalError(f"the {self.name} target does not log the headers it accepted "
                               "(`embnic state ring` works on the dpdk and bmv2 targets)")


def entries_from_dicts(items: Iterable[dict], key: str) -> list[Entry]:
    """Entries from control-socket dicts (``key`` = ``"shard"`` or ``"client"``), sorted by id, MACs in lower case."""
    out = [Entry(int(d[key]), int(d["port"]), str(d["mac"]).lower(), str(d["ip"]), int(d["udp_port"])) for d in items]
    return sorted(out, key=lambda e: e.id)
