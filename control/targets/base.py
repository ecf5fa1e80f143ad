"""Pipeline targets: one interface (:class:`Target`) for every place the embnic pipeline can run:
load, the peer table (:class:`Peer`: a shard's route or a client), counters, the message state
map, unload. Targets register by name (``register_target("mynic", "mypkg.target:MyNicTarget")``)
and are imported when first used (:func:`get_target_class`). A loaded pipeline has a state file
``RUN_DIR/NAME.json`` (RUN_DIR: ``EMBNIC_RUN_DIR`` or ``/run/embnic``): pid, control socket, log,
command line.
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


# --------------------------------------------------------------------------- the peer table
@dataclasses.dataclass(frozen=True)
class PeerKind:
    """What one kind of peer is called where: the card keeps one table per kind (the C card's
    route and client tables, the P4 program's ``route_by_shard`` and ``client_by_id``)."""

    kind: str  #: ``"shard"`` or ``"client"``: what :attr:`Peer.id` names; the control socket's id field
    noun: str  #: the CLI noun and the control socket's command prefix: ``"route"`` or ``"client"``
    section: str  #: the cluster config's list of them: ``"shards"`` or ``"clients"``
    what: str  #: one entry in messages: ``"route for shard"`` or ``"client"``
    p4_table: str  #: the P4 program's table
    p4_action: str  #: that table's action
    #: ``sender_allowlist``'s first key: 1 for requests from a client, 0 for replies from a shard
    is_request: int


#: the two kinds of peer, by :attr:`Peer.kind`
PEER_KINDS = {
    "shard": PeerKind("shard", "route", "shards", "route for shard", "route_by_shard", "forward_to_server", 0),
    "client": PeerKind("client", "client", "clients", "client", "client_by_id", "forward_to_client", 1),
}


def peer_kind(kind: str) -> PeerKind:
    """:data:`PEER_KINDS` ``[kind]``.

    Raises:
        ValueError: ``kind`` is neither ``"shard"`` nor ``"client"``.
    """
    try:
        return PEER_KINDS[kind]
    except KeyError:
        raise ValueError(f"peer kind {kind!r}: expected one of {', '.join(PEER_KINDS)}") from None


@dataclasses.dataclass(frozen=True)
class Peer:
    """One entry of the card's peer table: a shard (its route) or a client, by ``kind``."""

    kind: str  #: ``"shard"`` or ``"client"`` (:data:`PEER_KINDS`)
    id: int  #: the shard id or the client id
    port: int  #: card (DPDK) port the peer hangs off
    mac: str  #: the peer's MAC (destination of frames the card sends it)
    ip: str  #: the peer's IPv4 address
    udp_port: int  #: the peer's UDP port

    def __post_init__(self):
        peer_kind(self.kind)

    @property
    def spec(self) -> PeerKind:
        """How this kind is called where (:class:`PeerKind`)."""
        return PEER_KINDS[self.kind]

    def address(self) -> dict:
        """``{"port", "mac", "ip", "udp_port"}``: where the card sends the peer's frames."""
        return {"port": self.port, "mac": self.mac, "ip": self.ip, "udp_port": self.udp_port}

    def fields(self) -> dict:
        """The control socket's form (``route_add``/``client_add``, ``list --json``): the id under
        the kind's name (``"shard"`` or ``"client"``), then :meth:`address`."""
        return {self.kind: self.id, **self.address()}

    @classmethod
    def from_fields(cls, d: dict, kind: str | None = None) -> "Peer":
        """The peer of a control-socket dict (:meth:`fields`' form), MAC in lower case; ``kind``
        ``None``: the one of ``"shard"``/``"client"`` that ``d`` has as a key.

        Raises:
            KeyError: ``d`` lacks the id (or has neither id key) or a field.
        """
        if kind is None:
            kind = next((k for k in PEER_KINDS if k in d), None)
            if kind is None:
                raise KeyError("a peer needs a 'shard' or a 'client' id")
        return cls(kind, int(d[kind]), int(d["port"]), str(d["mac"]).lower(), str(d["ip"]), int(d["udp_port"]))


def peers_from_config(cfg: ClusterConfig, kinds: Iterable[str] = ("shard", "client")) -> list[Peer]:
    """The peer table the config implies: one entry per ``[[shards]]`` (their routes), then one per
    ``[[clients]]`` (of the ``kinds`` asked for).

    Raises:
        ConfigError: a shard or client without ``mac`` or ``card_port`` (names the field).
    """
    out = []
    for kind in kinds:
        k = peer_kind(kind)
        for i, e in enumerate(getattr(cfg, k.section)):
            if e.mac is None:
                raise ConfigError(f"{k.section}[{i}].mac", "required to program the card, which does not "
                                  f"resolve MACs by ARP; add mac = \"..\" to the {kind} with id {e.id} "
                                  "(`ip link show` in its namespace prints it)", cfg.path)
            if e.card_port is None:
                raise ConfigError(f"{k.section}[{i}].card_port", "required to program the card: the card "
                                  f"port the {kind} with id {e.id} is reached through", cfg.path)
            out.append(Peer(kind, e.id, e.card_port, e.mac, e.ip, e.port))
    return out


def count_peers(peers: Iterable[Peer]) -> dict:
    """``{"routes": #shards, "clients": #clients}`` of ``peers`` (what a target's ``load`` reports)."""
    kinds = [p.kind for p in peers]
    return {"routes": kinds.count("shard"), "clients": kinds.count("client")}


def check_peer_port(p: Peer, nb_ports: int) -> None:
    """Refuse a peer on a port the card (of ``nb_ports`` ports) does not have.

    Raises:
        UsageError: ``p.port`` is not in ``0..nb_ports-1`` (names ``--port``).
    """
    if not 0 <= int(p.port) < nb_ports:
        raise UsageError(f"--port {p.port}: the card has {nb_ports} port(s) (0..{nb_ports - 1})")


def resolve_peer(kind: str, id_: int, cfg: ClusterConfig | None, port: int | None, mac: str | None,
                 ip: str | None, udp_port: int | None) -> Peer:
    """The peer ``id_`` of ``kind`` (``"shard"`` or ``"client"``): the given fields first (``None`` =
    not given), then the config's ``[[shards]]``/``[[clients]]`` entry; without a config a shard's
    UDP port defaults to the protocol's (7878).

    Raises:
        UsageError: unknown shard/client in the config, a field neither argument nor config gives,
            a loopback IP, a card port the config's [card] does not have, or the IP or MAC of a
            card port itself.
    """
    k = peer_kind(kind)
    if cfg is not None:
        eps = getattr(cfg, k.section)
        ep = next((e for e in eps if e.id == id_), None)
        if ep is None:
            ids = ", ".join(str(e.id) for e in eps)
            raise UsageError(f"unknown {kind} {id_}: {cfg.path or 'the config'} has {k.section} {ids}; "
                             f"add a [[{k.section}]] entry with id = {id_} or pick one of those")
        port = ep.card_port if port is None else port
        mac = ep.mac if mac is None else mac
        ip = ep.ip if ip is None else ip
        udp_port = ep.port if udp_port is None else udp_port
    elif kind == "shard" and udp_port is None:
        udp_port = consts.UDP_PORT
    src = f" in {cfg.path or 'the config'}" if cfg is not None else " (and no --config)"
    if mac is None:
        raise UsageError(f"{kind} {id_} has no MAC{src}: give --mac (the card does not resolve MACs by ARP)")
    for opt, v in (("--port", port), ("--ip", ip), ("--udp-port", udp_port)):
        if v is None:
            raise UsageError(f"{kind} {id_} has no {opt[2:]}{src}: give {opt}")
    if ipaddress.IPv4Address(ip).is_loopback:
        raise UsageError(f"--ip {ip} is a loopback address, which the card cannot reach: give the {kind}'s own "
                         "address on its card port's segment")
    if cfg is not None and cfg.card is not None and cfg.card.ports:
        have = sorted(p.id for p in cfg.card.ports)
        if port not in have:
            raise UsageError(f"--port {port}: the card has no port {port} (card.ports in "
                             f"{cfg.path or 'the config'}: {', '.join(map(str, have))})")
        for p in cfg.card.ports:  # the config refuses these for its own entries (docs/config.md)
            if p.ip == ip:
                raise UsageError(f"--ip {ip} is the card's own address on port {p.id}: give the {kind}'s own "
                                 "address (the card would send the frames to itself)")
            if p.mac and p.mac == str(mac).lower():
                raise UsageError(f"--mac {mac} is the MAC of card port {p.id}: give the {kind}'s own MAC")
    return Peer(kind, id_, int(port), mac, ip, int(udp_port))


def format_peers(kind: str, peers: list[Peer]) -> str:
    """The peers of ``kind`` as fixed-width text (a header line, one line per entry)."""
    head = f"{kind.upper():>6}  {'PORT':>4}  {'MAC':<17}  {'IP':<15}  {'UDP':>5}"
    rows = [f"{e.id:>6}  {e.port:>4}  {e.mac:<17}  {e.ip:<15}  {e.udp_port:>5}" for e in peers]
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

    @property
    def log_path(self) -> Path:
        """The card's log: ``RUN_DIR/NAME.log``."""
        return self.run_dir / f"{self.instance}.log"

    # -- the peer table
    @abc.abstractmethod
    def peer_add(self, p: Peer) -> None:
        """Add or replace peer ``p`` (the route of shard ``p.id``, or client ``p.id``).

        Raises:
            UsageError: ``p.port`` is not one of the card's ports (exit 2).
            OperationalError: not loaded, or the card refused the entry (its table is full).
        """

    @abc.abstractmethod
    def peer_del(self, kind: str, id_: int) -> None:
        """Delete the peer ``id_`` of ``kind`` (``"shard"``: its route; ``"client"``).

        Raises:
            NoSuchEntryError: the card has no such entry (exit 2).
        """

    @abc.abstractmethod
    def peer_list(self, kind: str) -> list[Peer]:
        """The peers of ``kind`` installed on the card, by id."""

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
