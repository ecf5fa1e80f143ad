"""The cluster config: one TOML file every command reads (see ``docs/config.md``).

Example: ``examples/cluster.toml``. :func:`load_config` parses and validates it and raises
:class:`ConfigError` naming the offending field (``tables[2].dim: must be 1..4096``).
"""
from __future__ import annotations

import codecs
import dataclasses
import difflib
import ipaddress
import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from . import consts

_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
_CORELIST_RE = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
SHARDING_POLICIES = ("hash", "table")
OPTIMIZERS = ("sgd", "adagrad")
#: highest lcore id + 1 DPDK accepts in ``-l`` (RTE_MAX_LCORE of the default build)
MAX_LCORE = 128

#: the known keys of every section (anything else is an error naming the closest known key)
SECTIONS = ("cluster", "tables", "shards", "clients", "card", "control")
CLUSTER_KEYS = ("name", "udp_port", "mtu", "sharding", "seed", "timeout_ms", "retries")
TABLE_KEYS = ("id", "name", "rows", "dim", "dtype", "optimizer", "lr", "eps", "init_scale", "shard",
              "expected_rows", "store", "cache_rows")
ENDPOINT_KEYS = ("id", "ip", "port", "mac", "card_port")
#: a shard's keys: an endpoint's, plus the defaults of its disk tier (docs/config.md, docs/server.md)
SHARD_KEYS = ENDPOINT_KEYS + ("store", "cache_rows", "store_dir", "block_cache_mb")
#: where a shard keeps a table's rows: its in-memory arena (the default) or the disk tier
#: (RocksDB behind a cache of hot rows; the optional extra ``embnic[disk]``, docs/server.md)
STORES = ("memory", "disk")
DEFAULT_CACHE_ROWS = 1 << 20  #: hot rows a disk table keeps in memory unless told (cache_rows)
DEFAULT_BLOCK_CACHE_MB = 64  #: RocksDB block cache of a shard's disk tables, MiB (block_cache_mb)
CACHE_ROWS_LIMITS = (1, 1 << 40)
BLOCK_CACHE_MB_LIMITS = (1, 1 << 20)
CARD_KEYS = ("enabled", "ports", "ring_size", "state_size", "state_timeout_ms", "lcores", "state_lcores", "pci")
#: the card's sizes: the DPDK card's are settings; a P4 program's are compiled in (p4/types.p4)
SIZE_KEYS = ("ring_size", "state_size")
#: Bounds of the [card] fields, inclusive — the card's own option bounds (dataplane/include/
#: embnic_limits.h, and EMBNIC_MAX_PORTS in embnic_dp.h for port ids); tests/dataplane/test_limits.py
#: checks they agree and that embnic-dp accepts each limit and refuses one past it. ring_size is
#: also a power of two.
CARD_LIMITS = {
    "ring_size": (64, 1 << 24),
    "state_size": (64, 1 << 24),
    "state_timeout_ms": (1, 86_400_000),
    "state_lcores": (1, 16),
    "port_id": (0, 7),
}
#: [cluster] mtu (IPv4 bytes): every node's; the card gets it as --mtu when above 1500, and its own
#: --mtu bounds (68..EMBNIC_MAX_MTU) hold this range (tests/dataplane/test_limits.py)
MTU_LIMITS = (576, 9000)
CARD_PORT_KEYS = ("id", "ip", "mac", "name")


class ConfigError(ValueError):
    """A config field is missing or invalid; ``field`` is its dotted path (``""`` for the file as a
    whole: unreadable, not TOML)."""

    def __init__(self, field: str, message: str, path: str | os.PathLike | None = None):
        self.field = field
        self.message = message
        self.path = str(path) if path else None
        where = f"{self.path}: " if self.path else ""
        super().__init__(f"{where}{field}: {message}" if field else f"{where}{message}")


def did_you_mean(word: str, known) -> str:
    """``" (did you mean 'udp_port'?)"`` for the closest of ``known`` (difflib), else ``""``."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_keys(d: dict, known, where: str, path=None) -> None:
    """Raise :class:`ConfigError` naming the first key of ``d`` not in ``known``.

    ``where`` is the dotted prefix of the field (``"cluster."``, ``"tables[0]."``); the message
    suggests the closest known key and lists them all.
    """
    for key in d:
        if key not in known:
            raise ConfigError(f"{where}{key}", f"unknown field{did_you_mean(key, known)}; known: "
                              f"{', '.join(known)}", path)


def parse_lcores(v: str) -> list[int]:
    """The lcore ids of a DPDK core list (EAL ``-l``): ``"0"``, ``"0,1"``, ``"0-3,6"``.

    Returns:
        sorted, de-duplicated lcore ids (each ``0 <= id < MAX_LCORE``).
    Raises:
        ValueError: not ``c1[-c2][,c3[-c4]...]`` with ``c1 <= c2``, or an id >= ``MAX_LCORE``.
    """
    s = v.replace(" ", "") if isinstance(v, str) else ""
    if not _CORELIST_RE.match(s):
        raise ValueError(f"{v!r} is not a DPDK core list (write e.g. \"0\", \"0,1\" or \"0-3\")")
    out: set[int] = set()
    for part in s.split(","):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if a > b:
            raise ValueError(f"{v!r}: range {part} goes backwards (write {b}-{a})")
        if b >= MAX_LCORE:
            raise ValueError(f"{v!r}: lcore {b} is out of range (DPDK takes 0..{MAX_LCORE - 1})")
        out.update(range(a, b + 1))
    return sorted(out)


def is_multicast_mac(mac: str) -> bool:
    """True for a group (multicast or broadcast) MAC: the low bit of the first octet is set."""
    return bool(int(mac[:2], 16) & 1)


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """One ``[[tables]]`` entry. ``rows`` is optional: None means any uint64 id (0..2^64-1) is
    a row of its own (a collision-free dynamic table); an int bounds the ids to ``< rows``."""

    id: int
    name: str
    rows: int | None
    dim: int
    dtype: str = "fp32"
    optimizer: str = "adagrad"
    lr: float = 0.05
    eps: float = 1e-8
    init_scale: float = 0.01
    shard: int | None = None  #: placement under the "table" policy
    #: rows the table is expected to grow to (``embnic plan`` sizes shards by it; ``rows`` where unset)
    expected_rows: int | None = None
    #: ``"memory"``, ``"disk"``, or None: the shard's default (``[[shards]] store``), else memory
    store: str | None = None
    #: hot rows a disk table caches in memory (None: the shard's ``cache_rows``, else the default)
    cache_rows: int | None = None

    @property
    def wire_dtype(self) -> consts.DType:
        return consts.DTYPE_BY_NAME[self.dtype]


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A client or shard: id, IPv4 address, UDP port, optional MAC, card port it hangs off."""

    id: int
    ip: str
    port: int
    mac: str | None = None
    card_port: int | None = None
    #: shards only: the default ``store`` and ``cache_rows`` of tables that do not say, where the
    #: disk tables' stores live (None: under ``--checkpoint-dir``, else a scratch directory) and
    #: RocksDB's block cache for all of them, MiB (docs/server.md, "Disk tier")
    store: str | None = None
    cache_rows: int | None = None
    store_dir: str | None = None
    block_cache_mb: int | None = None


@dataclasses.dataclass(frozen=True)
class CardPort:
    id: int
    ip: str
    mac: str | None = None
    name: str | None = None


@dataclasses.dataclass(frozen=True)
class CardConfig:
    enabled: bool
    ports: tuple[CardPort, ...]
    ring_size: int = 4096
    state_size: int = 65536
    state_timeout_ms: int = 5000
    lcores: str = "0,1"
    #: lcores sharing the message state map, each owning the messages of one partition by a
    #: hash of (client id, message id); at most as many as ``lcores`` names (docs/config.md)
    state_lcores: int = 1
    #: PCI addresses (``0000:3b:00.0``) of the NIC ports the card runs on, DPDK ports 0.. in this
    #: order (before any vdev); empty: vdevs only (docs/deploy.md)
    pci: tuple[str, ...] = ()
    #: the keys of :data:`SIZE_KEYS` the config file sets itself (the rest are defaults): a P4
    #: target, whose sizes are compiled in, refuses a set value other than its own
    set_sizes: frozenset[str] = dataclasses.field(default=frozenset(), compare=False)

    def port(self, port_id: int) -> CardPort:
        for p in self.ports:
            if p.id == port_id:
                return p
        raise KeyError(port_id)


def id_ranges(ids) -> str:
    """Integers ``ids`` (any iterable) as sorted runs: ``[0, 1, 2, 3, 7, 9, 10]`` → ``"0..3, 7, 9..10"``."""
    xs = sorted(set(int(i) for i in ids))
    runs, k = [], 0
    while k < len(xs):
        e = k
        while e + 1 < len(xs) and xs[e + 1] == xs[e] + 1:
            e += 1
        runs.append(str(xs[k]) if e == k else f"{xs[k]}..{xs[e]}")
        k = e + 1
    return ", ".join(runs)


def _by_id(items, ident: int, what: str):
    """The element of ``items`` whose ``id`` is ``ident``.

    Raises:
        KeyError: none (``no {what} with id {ident}``).
    """
    for x in items:
        if x.id == ident:
            return x
    raise KeyError(f"no {what} with id {ident}")


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """A parsed, validated cluster config. ``path`` is where it came from (or None)."""

    name: str
    udp_port: int
    mtu: int
    sharding: str
    seed: int
    timeout_ms: int
    retries: int
    tables: tuple[TableConfig, ...]
    shards: tuple[Endpoint, ...]
    clients: tuple[Endpoint, ...]
    card: CardConfig | None
    path: str | None = None
    raw: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def table_ids_text(self) -> str:
        """The config's table ids for an error message, runs of consecutive ids as ranges
        (``"0..25"``, ``"0..3, 7, 9..12"``) so a config of many tables stays one short line."""
        return id_ranges(t.id for t in self.tables)

    def table(self, table_id: int) -> TableConfig:
        """The table of id ``table_id``. Raises KeyError: no such table."""
        return _by_id(self.tables, table_id, "table")

    def shard(self, shard_id: int) -> Endpoint:
        """The shard of id ``shard_id``. Raises KeyError: no such shard."""
        return _by_id(self.shards, shard_id, "shard")

    def store_of(self, table_id: int, shard_id: int) -> tuple[str, int | None]:
        """(store, cache_rows) of table ``table_id`` on shard ``shard_id``: the table's own
        ``store``/``cache_rows``, else the shard's, else ``"memory"`` / :data:`DEFAULT_CACHE_ROWS`
        (``cache_rows`` is None for a memory table).

        Raises:
            KeyError: unknown table or shard.
        """
        t, s = self.table(table_id), self.shard(shard_id)
        store = t.store or s.store or "memory"
        if store == "memory":
            return store, None
        return store, t.cache_rows or s.cache_rows or DEFAULT_CACHE_ROWS

    def client(self, client_id: int) -> Endpoint:
        """The client of id ``client_id``. Raises KeyError: no such client."""
        return _by_id(self.clients, client_id, "client")

    def request_destination(self, client_id: int, shard_id: int) -> tuple[str, int]:
        """(IPv4, UDP port) a client sends a request for ``shard_id`` to.

        Through the card when ``[card] enabled`` (the card's address on the client's port),
        else straight to the shard.
        """
        if self.card is not None and self.card.enabled:
            c = self.client(client_id)
            if c.card_port is None:
                raise ConfigError(f"clients[id={client_id}].card_port", "required when the card is enabled")
            return self.card.port(c.card_port).ip, self.udp_port
        s = self.shard(shard_id)
        return s.ip, s.port


def _get(d: dict, key: str, where: str, typ, default: Any = dataclasses.MISSING, path=None):
    if key not in d:
        if default is dataclasses.MISSING:
            raise ConfigError(f"{where}{key}", "missing (required)", path)
        return default
    v = d[key]
    if typ is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if typ is int and isinstance(v, bool) or not isinstance(v, typ):
        tname = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise ConfigError(f"{where}{key}", f"must be {tname}, got {type(v).__name__} {v!r}", path)
    return v


def host_ipv4_problem(addr: ipaddress.IPv4Address) -> str | None:
    """Why ``addr`` cannot be a node's own address (a client, shard or card port), or None.

    A node's address is the source of its frames and the destination the card rewrites to, so it
    must be one host's unicast address: not 0.0.0.0 (unspecified, RFC 1122 3.2.1.3), not
    multicast (224.0.0.0/4, RFC 5771) and not the limited broadcast 255.255.255.255.
    """
    if addr.is_unspecified:
        return f"{addr} is the unspecified address"
    if addr.is_multicast:
        return f"{addr} is a multicast address"
    if addr == ipaddress.IPv4Address("255.255.255.255"):
        return f"{addr} is the broadcast address"
    return None


def _check_ip(v: str, field: str, path) -> str:
    try:
        addr = ipaddress.IPv4Address(v)
    except ValueError:
        raise ConfigError(field, f"{v!r} is not an IPv4 address (write e.g. 10.0.0.2)", path) from None
    problem = host_ipv4_problem(addr)
    if problem:
        raise ConfigError(field, f"{problem}: give the node's own unicast IPv4 address, e.g. 10.0.0.2", path)
    return v


def _check_mac(v: str | None, field: str, path) -> str | None:
    if v is not None and not _MAC_RE.match(v):
        raise ConfigError(field, f"{v!r} is not a MAC address (write e.g. 02:00:00:00:00:01)", path)
    if v is not None and is_multicast_mac(v):
        raise ConfigError(field, f"{v} is a multicast/broadcast MAC (low bit of the first octet set): "
                          "give the node's own unicast MAC, e.g. 02:00:00:00:00:01", path)
    return v.lower() if v else v


def _int_in(d: dict, key: str, w: str, lims: tuple[int, int], path, default: Any = dataclasses.MISSING) -> int | None:
    """``d[key]``, an int in ``lims`` (inclusive); ``default`` when absent (a None default is not checked)."""
    v = _get(d, key, w, int, default, path)
    if v is not None and not lims[0] <= v <= lims[1]:
        raise ConfigError(w + key, f"must be {lims[0]}..{lims[1]}, got {v}", path)
    return v


#: largest finite float32: rows, gradients and optimizer state are float32 on the shards
FLOAT32_MAX = 3.4028234663852886e38


def _check_float(v: float, field: str, path, *, zero_ok: bool = False) -> float:
    """``v`` (a parsed TOML float) must be finite and fit float32: ``0 < v <= FLOAT32_MAX``
    (``0 <= v`` with ``zero_ok``); else :class:`ConfigError` naming ``field``."""
    if not (math.isfinite(v) and (0 <= v if zero_ok else 0 < v) and v <= FLOAT32_MAX):
        lo = ">= 0" if zero_ok else "> 0"
        raise ConfigError(field, f"must be a finite number {lo} (at most {FLOAT32_MAX:.4g}, float32), got {v}", path)
    return v


def _store(d: dict, w: str, path) -> str | None:
    """``store`` of a table or shard: None (unset) or one of :data:`STORES`."""
    v = _get(d, "store", w, str, None, path)
    if v is not None and v not in STORES:
        raise ConfigError(w + "store", f"must be one of {', '.join(STORES)}, got {v!r}", path)
    return v


def _shard_store(e: dict, w: str, path) -> dict:
    """The disk-tier keys of a ``[[shards]]`` entry (``store``, ``cache_rows``, ``store_dir``,
    ``block_cache_mb``), validated."""
    sd = _get(e, "store_dir", w, str, None, path)
    if sd is not None and not sd.strip():
        raise ConfigError(w + "store_dir", "must not be empty (a directory for the shard's disk tables)", path)
    if sd is not None and path is not None and not os.path.isabs(sd):
        sd = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), sd))  # from the config's folder
    return {"store": _store(e, w, path), "cache_rows": _int_in(e, "cache_rows", w, CACHE_ROWS_LIMITS, path, None),
            "store_dir": sd, "block_cache_mb": _int_in(e, "block_cache_mb", w, BLOCK_CACHE_MB_LIMITS, path, None)}


def _endpoints(raw: dict, key: str, path, default_port: int) -> tuple[Endpoint, ...]:
    items = raw.get(key)
    if not isinstance(items, list) or not items:
        raise ConfigError(key, f"at least one [[{key}]] entry is required", path)
    out, seen, addrs = [], set(), {}
    for i, e in enumerate(items):
        w = f"{key}[{i}]."
        if not isinstance(e, dict):
            raise ConfigError(f"{key}[{i}]", "must be a table", path)
        check_keys(e, SHARD_KEYS if key == "shards" else ENDPOINT_KEYS, w, path)
        eid = _int_in(e, "id", w, (0, 0xFFFF), path)
        if eid in seen:
            raise ConfigError(w + "id", f"duplicate id {eid}", path)
        seen.add(eid)
        ip = _check_ip(_get(e, "ip", w, str, path=path), w + "ip", path)
        port = _int_in(e, "port", w, (1, 65535), path, default_port)
        if (ip, port) in addrs:
            j, other = addrs[(ip, port)]
            raise ConfigError(w + "port", f"{ip}:{port} is already the address of {key}[{j}] (id {other}); "
                              f"every {key[:-1]} needs an ip:port of its own", path)
        addrs[(ip, port)] = (i, eid)
        mac = _check_mac(_get(e, "mac", w, str, None, path), w + "mac", path)
        cp = _get(e, "card_port", w, int, None, path)
        out.append(Endpoint(eid, ip, port, mac, cp, **(_shard_store(e, w, path) if key == "shards" else {})))
    return tuple(out)


def _check_hosts(shards, clients, ports, path) -> None:
    """Nodes with one IPv4 are one host: the same MAC and card port, distinct UDP ports.

    Several client ids (and shards) may share a host (e.g. the workers torchrun starts in one
    namespace); they tell apart by UDP port (distinct per kind, checked by ``_endpoints``), and
    the card's tables are keyed by id. A card port's own address is no node's.

    Raises:
        ConfigError: two nodes of one IPv4 with different ``mac`` or ``card_port``, or a node at
            a card port's address (names the later field).
    """
    port_ips = {p.ip: p.id for p in ports}
    hosts: dict[str, tuple[str, Endpoint]] = {}
    for key, items in (("shards", shards), ("clients", clients)):
        for i, e in enumerate(items):
            w = f"{key}[{i}]"
            if e.ip in port_ips:
                raise ConfigError(f"{w}.ip", f"{e.ip} is the address of card port {port_ips[e.ip]}; "
                                  "give the node an address of its own on that port's segment", path)
            if e.ip not in hosts:
                hosts[e.ip] = (f"{w} (id {e.id})", e)
                continue
            first, f = hosts[e.ip]
            for attr in ("mac", "card_port"):
                if getattr(e, attr) != getattr(f, attr):
                    raise ConfigError(f"{w}.{attr}", f"{getattr(e, attr)} differs from {getattr(f, attr)} of "
                                      f"{first}, which has the same ip {e.ip}: nodes of one host share its "
                                      "MAC and card port (give another ip for another host)", path)


def _check_unique_macs(shards, clients, ports, path) -> None:
    """No MAC on two hosts across shards, clients and card ports (the card's tables name peers by
    MAC); nodes sharing an IPv4 (one host, see :func:`_check_hosts`) share its MAC."""
    owner: dict[str, tuple[str, str | None]] = {}
    for key, items in (("card.ports", ports), ("shards", shards), ("clients", clients)):
        for i, e in enumerate(items):
            if e.mac is None:
                continue
            host = e.ip if key != "card.ports" else None
            if e.mac in owner and (host is None or owner[e.mac][1] != host):
                raise ConfigError(f"{key}[{i}].mac", f"{e.mac} is already the MAC of {owner[e.mac][0]}; "
                                  "every host (IPv4) and card port needs a MAC of its own", path)
            owner.setdefault(e.mac, (f"{key}[{i}] (id {e.id})", host))


def _rows(t: dict, w: str, path) -> int | None:
    """``tables[i].rows``: absent means unbounded ids (None); else 1..2^63-1 (TOML's int range)."""
    return _int_in(t, "rows", w, (1, 2**63 - 1), path, None)


_BDF = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-1][0-9a-fA-F])\.([0-7])$")


def normalize_bdf(bdf: str) -> str:
    """A PCI address as sysfs names it: ``3b:00.0`` → ``0000:3b:00.0`` (domain added, lower case).

    Raises:
        ValueError: not ``[DDDD:]BB:DD.F`` (hex; device 00..1f, function 0..7).
    """
    m = _BDF.match(str(bdf).strip())
    if not m:
        raise ValueError(f"{bdf!r} is not a PCI address like 0000:3b:00.0 (`lspci -D` or "
                         "`dpdk-devbind.py --status-dev net` lists them)")
    dom, bus, dev, fn = m.groups()
    return f"{(dom or '0000').lower()}:{bus.lower()}:{dev.lower()}.{fn}"


def _pci_list(v: list, field: str, path) -> tuple[str, ...]:
    """``card.pci``: a list of distinct PCI addresses, normalised (:func:`normalize_bdf`)."""
    out = []
    for i, a in enumerate(v):
        if not isinstance(a, str):
            raise ConfigError(f"{field}[{i}]", f"must be a PCI address string like \"0000:3b:00.0\", got {a!r}", path)
        try:
            b = normalize_bdf(a)
        except ValueError as e:
            raise ConfigError(f"{field}[{i}]", str(e), path) from None
        if b in out:
            raise ConfigError(f"{field}[{i}]", f"{b} is listed twice", path)
        out.append(b)
    return tuple(out)


def _expected_rows(t: dict, w: str, path) -> int | None:
    """``tables[i].expected_rows``: optional, 1..2^63-1 and at most ``rows`` where both are set."""
    v = _int_in(t, "expected_rows", w, (1, 2**63 - 1), path, None)
    rows = t.get("rows")
    if v is not None and isinstance(rows, int) and v > rows:
        raise ConfigError(w + "expected_rows", f"{v} is more than the table's rows ({rows}): lower it or drop rows",
                          path)
    return v


def _cluster(raw: dict, path) -> dict:
    """The ``[cluster]`` section's settings, checked: ``{name, udp_port, mtu, sharding, seed,
    timeout_ms, retries}`` (:class:`ClusterConfig`'s fields of the same names).

    Raises:
        ConfigError: naming the first invalid field.
    """
    cl = raw.get("cluster", {})
    if not isinstance(cl, dict):
        raise ConfigError("cluster", "must be a table [cluster]", path)
    w = "cluster."
    check_keys(cl, CLUSTER_KEYS, w, path)
    out = {"name": _get(cl, "name", w, str, "embnic", path),
           "udp_port": _int_in(cl, "udp_port", w, (1, 65535), path, consts.UDP_PORT),
           "mtu": _int_in(cl, "mtu", w, MTU_LIMITS, path, consts.DEFAULT_MTU)}
    sharding = _get(cl, "sharding", w, str, "hash", path)
    if sharding not in SHARDING_POLICIES:
        raise ConfigError(w + "sharding", f"must be one of {', '.join(SHARDING_POLICIES)}, got {sharding!r}", path)
    out["sharding"] = sharding
    out["seed"] = _int_in(cl, "seed", w, (0, 2**63 - 1), path, 0)
    out["timeout_ms"] = _int_in(cl, "timeout_ms", w, (1, 600_000), path, 200)
    out["retries"] = _int_in(cl, "retries", w, (1, 1000), path, 5)
    return out


def _table(t, i: int, seen: set, names: dict, path) -> TableConfig:
    """``[[tables]]`` entry ``i``, checked; ``seen`` (table ids) and ``names`` (name → entry) of
    the entries before it are updated.

    Raises:
        ConfigError: naming the first invalid field.
    """
    w = f"tables[{i}]."
    if not isinstance(t, dict):
        raise ConfigError(f"tables[{i}]", "must be a table", path)
    check_keys(t, TABLE_KEYS, w, path)
    tid = _int_in(t, "id", w, (0, 0xFFFF), path)
    if tid in seen:
        raise ConfigError(w + "id", f"duplicate table id {tid}", path)
    seen.add(tid)
    dtype = _get(t, "dtype", w, str, "fp32", path)
    if dtype not in consts.DTYPE_BY_NAME:
        raise ConfigError(w + "dtype", f"must be fp32 or fp16, got {dtype!r}", path)
    opt = _get(t, "optimizer", w, str, "adagrad", path)
    if opt not in OPTIMIZERS:
        raise ConfigError(w + "optimizer", f"must be one of {', '.join(OPTIMIZERS)}, got {opt!r}", path)
    lr = _check_float(_get(t, "lr", w, float, 0.05, path), w + "lr", path)
    tname = _get(t, "name", w, str, f"t{tid}", path)
    if not tname:
        raise ConfigError(w + "name", "must not be empty", path)
    if tname in names:
        raise ConfigError(w + "name", f"duplicate table name {tname!r} (also tables[{names[tname]}]); every table "
                          "needs a name of its own (names key the tables in TorchRec and `embnic tables export`)",
                          path)
    names[tname] = i
    store, cache_rows = _store(t, w, path), _int_in(t, "cache_rows", w, CACHE_ROWS_LIMITS, path, None)
    if store == "memory" and cache_rows is not None:
        raise ConfigError(w + "cache_rows", 'is the cache of a store = "disk" table: set store = "disk" or drop '
                          "cache_rows", path)
    return TableConfig(
        id=tid,
        name=tname,
        rows=_rows(t, w, path),
        dim=_int_in(t, "dim", w, (1, 4096), path),
        dtype=dtype,
        optimizer=opt,
        lr=lr,
        eps=_check_float(_get(t, "eps", w, float, 1e-8, path), w + "eps", path),
        init_scale=_check_float(_get(t, "init_scale", w, float, 0.01, path), w + "init_scale", path,
                                zero_ok=True),
        shard=_get(t, "shard", w, int, None, path),
        expected_rows=_expected_rows(t, w, path),
        store=store,
        cache_rows=cache_rows,
    )


def _check_placement(tables: list[TableConfig], shards: tuple[Endpoint, ...], path) -> None:
    """Each table's ``shard`` names a shard, and ``cache_rows`` (of a table or a shard) is set
    only where a table is kept on disk.

    Raises:
        ConfigError: naming the first invalid field.
    """
    shard_ids = {s.id for s in shards}
    for i, t in enumerate(tables):
        if t.shard is not None and t.shard not in shard_ids:
            raise ConfigError(f"tables[{i}].shard", f"no shard with id {t.shard} (shards: {sorted(shard_ids)})", path)
        # cache_rows without a store key takes the store of the shards that hold the table: refused
        # where none keeps it on disk (it would be ignored, as with store = "memory")
        holders = [s for s in shards if t.shard is None or s.id == t.shard]
        if t.cache_rows is not None and t.store is None and not any(s.store == "disk" for s in holders):
            raise ConfigError(f"tables[{i}].cache_rows", f'is the cache of a store = "disk" table, and table {t.id} '
                              'has no store key and its shards keep tables in memory: set store = "disk" (on the '
                              "table or its shards) or drop cache_rows", path)
    for i, s in enumerate(shards):
        if s.cache_rows is not None and s.store != "disk" and not any(t.store == "disk" for t in tables):
            raise ConfigError(f"shards[{i}].cache_rows", f'is the cache of the store = "disk" tables, and shard {s.id} '
                              'keeps every table in memory: set store = "disk" (on the shard or a table) or drop '
                              "cache_rows", path)


def _card_ports(c: dict, w: str, path) -> list[CardPort]:
    """``[[card.ports]]``, checked (ids unique).

    Raises:
        ConfigError: naming the first invalid field.
    """
    ports, pseen = [], set()
    for i, p in enumerate(_get(c, "ports", w, list, [], path)):
        pw = f"card.ports[{i}]."
        if not isinstance(p, dict):
            raise ConfigError(f"card.ports[{i}]", "must be a table", path)
        check_keys(p, CARD_PORT_KEYS, pw, path)
        pid = _int_in(p, "id", pw, CARD_LIMITS["port_id"], path)
        if pid in pseen:
            raise ConfigError(pw + "id", f"duplicate card port {pid}", path)
        pseen.add(pid)
        ports.append(CardPort(pid, _check_ip(_get(p, "ip", pw, str, path=path), pw + "ip", path),
                              _check_mac(_get(p, "mac", pw, str, None, path), pw + "mac", path),
                              _get(p, "name", pw, str, None, path)))
    return ports


def _card(c, shards: tuple[Endpoint, ...], clients: tuple[Endpoint, ...], path) -> CardConfig:
    """The ``[card]`` section, checked; when the card is enabled, every shard and client names
    one of its ports.

    Raises:
        ConfigError: naming the first invalid field.
    """
    w = "card."
    if not isinstance(c, dict):
        raise ConfigError("card", "must be a table [card]", path)
    check_keys(c, CARD_KEYS, w, path)
    ports = _card_ports(c, w, path)
    enabled = _get(c, "enabled", w, bool, True, path)
    ring = _int_in(c, "ring_size", w, CARD_LIMITS["ring_size"], path, 4096)
    if ring & (ring - 1):
        raise ConfigError(w + "ring_size", f"must be a power of two, got {ring}", path)
    card = CardConfig(
        enabled=enabled, ports=tuple(ports), ring_size=ring,
        state_size=_int_in(c, "state_size", w, CARD_LIMITS["state_size"], path, 65536),
        state_timeout_ms=_int_in(c, "state_timeout_ms", w, CARD_LIMITS["state_timeout_ms"], path, 5000),
        lcores=_get(c, "lcores", w, str, "0,1", path),
        state_lcores=_int_in(c, "state_lcores", w, CARD_LIMITS["state_lcores"], path, 1),
        pci=_pci_list(_get(c, "pci", w, list, [], path), w + "pci", path),
        set_sizes=frozenset(k for k in SIZE_KEYS if k in c),
    )
    try:
        n_lcores = len(parse_lcores(card.lcores))
    except ValueError as e:
        raise ConfigError(w + "lcores", str(e), path) from None
    if card.state_lcores > n_lcores:
        raise ConfigError(w + "state_lcores", f"{card.state_lcores} state lcores need at least as many lcores, "
                          f"but lcores = {card.lcores!r} names {n_lcores}", path)
    if enabled:
        if not ports:
            raise ConfigError("card.ports", "at least one port is required when the card is enabled", path)
        pids = {p.id for p in ports}
        for kind, eps in (("shards", shards), ("clients", clients)):
            for i, e in enumerate(eps):
                if e.card_port is None:
                    raise ConfigError(f"{kind}[{i}].card_port", "required when [card] is enabled", path)
                if e.card_port not in pids:
                    raise ConfigError(f"{kind}[{i}].card_port",
                                      f"no card port {e.card_port} (ports: {sorted(pids)})", path)
    return card


def parse_config(raw: dict, path: str | os.PathLike | None = None) -> ClusterConfig:
    """Validate a config already parsed from TOML into a dict.

    Raises:
        ConfigError: naming the first invalid field.
    """
    for sec in raw:
        if sec not in SECTIONS:
            raise ConfigError(sec, f"unknown section{did_you_mean(sec, SECTIONS)}; known: "
                              f"{', '.join(SECTIONS)}", path)
    cl = _cluster(raw, path)
    tabs = raw.get("tables")
    if not isinstance(tabs, list) or not tabs:
        raise ConfigError("tables", "at least one [[tables]] entry is required", path)
    seen, names = set(), {}
    tables = [_table(t, i, seen, names, path) for i, t in enumerate(tabs)]
    shards = _endpoints(raw, "shards", path, cl["udp_port"])
    clients = _endpoints(raw, "clients", path, 40000)
    _check_placement(tables, shards, path)
    card = _card(raw["card"], shards, clients, path) if "card" in raw else None
    card_ports = card.ports if card is not None else ()
    _check_hosts(shards, clients, card_ports, path)
    _check_unique_macs(shards, clients, card_ports, path)
    return ClusterConfig(cl["name"], cl["udp_port"], cl["mtu"], cl["sharding"], cl["seed"], cl["timeout_ms"],
                         cl["retries"], tuple(tables), shards, clients, card, str(path) if path else None, raw)


def load_config(path: str | os.PathLike) -> ClusterConfig:
    """Read and validate a cluster config file (TOML, UTF-8; a leading UTF-8 byte-order mark is skipped).

    Raises:
        ConfigError: file missing, not TOML (UTF-16 text is named as such), or a field invalid
            (the message names it).
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError("", f"cannot read config: {e.strerror}", p) from None
    if data.startswith(codecs.BOM_UTF8):  # as editors on Windows save UTF-8: TOML is UTF-8, the mark says so
        data = data[len(codecs.BOM_UTF8):]
    elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise ConfigError("", "not valid TOML: the file is UTF-16 text (it starts with a UTF-16 byte-order mark); "
                          f"TOML is UTF-8: save it as UTF-8 (iconv -f UTF-16 -t UTF-8 {p} > utf8.toml)", p)
    try:
        raw = tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError("", f"not valid TOML: {e}", p) from None
    return parse_config(raw, p)
