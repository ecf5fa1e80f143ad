"""The cluster config: one TOML file every command reads (see ``docs/config.md``).

Example: ``examples/cluster.toml``. :func:`load_config` parses and validates it and raises
:class:`ConfigError` naming the offending field (``tables[2].dim: must be 1..4096``).
"""
from __future__ import annotations

import codecs
import dataclasses
import difflib
import ipaddress
import itertools
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
    runs = [[x for _, x in run] for _, run in itertools.groupby(enumerate(xs), lambda ix: ix[1] - ix[0])]
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}..{r[-1]}" for r in runs)


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


#: largest finite float32: rows, gradients and optimizer state are float32 on the shards
FLOAT32_MAX = 3.4028234663852886e38
_REQUIRED = dataclasses.MISSING


class _Section:
    """One table of the config being checked (a section, or one entry of an array of tables):
    each reader returns one of its fields checked (``default`` when absent; a None default is not
    checked) or raises :class:`ConfigError` naming the field.

    Args:
        d: its values as TOML parsed them; ``field`` its dotted path (``"tables[2]"``); ``known``
            its keys; ``path`` the config file; ``kind`` what "must be a table" adds (``" [card]"``).

    Raises:
        ConfigError: ``d`` is not a table, or has a key not in ``known`` (naming the closest known
            key and listing them all).
    """

    def __init__(self, d, field: str, known, path, kind: str = ""):
        if not isinstance(d, dict):
            raise ConfigError(field, f"must be a table{kind}", path)
        self.d, self.w, self.path = d, field + ".", path
        for key in d:
            if key not in known:
                raise self.error(key, f"unknown field{did_you_mean(key, known)}; known: {', '.join(known)}")

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.w + key, message, self.path)

    def get(self, key: str, typ: type, default: Any = _REQUIRED):
        """A value of type ``typ`` (an int where a float is asked for is taken as one)."""
        if key not in self.d:
            if default is _REQUIRED:
                raise self.error(key, "missing (required)")
            return default
        v = self.d[key]
        if typ is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if typ is int and isinstance(v, bool) or not isinstance(v, typ):
            raise self.error(key, f"must be {typ.__name__}, got {type(v).__name__} {v!r}")
        return v

    def int_in(self, key: str, lims: tuple[int, int], default: Any = _REQUIRED) -> int | None:
        """An int in ``lims`` (inclusive)."""
        v = self.get(key, int, default)
        if v is not None and not lims[0] <= v <= lims[1]:
            raise self.error(key, f"must be {lims[0]}..{lims[1]}, got {v}")
        return v

    def choice(self, key: str, choices: tuple[str, ...], default: str | None) -> str | None:
        """One of the strings ``choices``."""
        v = self.get(key, str, default)
        if v is not None and v not in choices:
            raise self.error(key, f"must be one of {', '.join(choices)}, got {v!r}")
        return v

    def finite(self, key: str, default: float, *, zero_ok: bool = False) -> float:
        """A float that fits float32: ``0 < v <= FLOAT32_MAX`` (``0 <= v`` with ``zero_ok``)."""
        v = self.get(key, float, default)
        if not (math.isfinite(v) and (0 <= v if zero_ok else 0 < v) and v <= FLOAT32_MAX):
            lo = ">= 0" if zero_ok else "> 0"
            raise self.error(key, f"must be a finite number {lo} (at most {FLOAT32_MAX:.4g}, float32), got {v}")
        return v

    def ip(self, key: str) -> str:
        """A node's own IPv4 address (required; :func:`host_ipv4_problem`)."""
        v = self.get(key, str)
        try:
            addr = ipaddress.IPv4Address(v)
        except ValueError:
            raise self.error(key, f"{v!r} is not an IPv4 address (write e.g. 10.0.0.2)") from None
        problem = host_ipv4_problem(addr)
        if problem:
            raise self.error(key, f"{problem}: give the node's own unicast IPv4 address, e.g. 10.0.0.2")
        return v

    def mac(self, key: str) -> str | None:
        """A node's own (unicast) MAC address in lower case, or None."""
        v = self.get(key, str, None)
        if v is not None and not _MAC_RE.match(v):
            raise self.error(key, f"{v!r} is not a MAC address (write e.g. 02:00:00:00:00:01)")
        if v is not None and is_multicast_mac(v):
            raise self.error(key, f"{v} is a multicast/broadcast MAC (low bit of the first octet set): "
                             "give the node's own unicast MAC, e.g. 02:00:00:00:00:01")
        return v.lower() if v else v


def _shard_store(s: _Section) -> dict:
    """The disk-tier keys of a ``[[shards]]`` entry (``store``, ``cache_rows``, ``store_dir``,
    ``block_cache_mb``), validated."""
    sd = s.get("store_dir", str, None)
    if sd is not None and not sd.strip():
        raise s.error("store_dir", "must not be empty (a directory for the shard's disk tables)")
    if sd is not None and s.path is not None and not os.path.isabs(sd):
        sd = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(s.path)), sd))  # from the config's folder
    return {"store": s.choice("store", STORES, None), "cache_rows": s.int_in("cache_rows", CACHE_ROWS_LIMITS, None),
            "store_dir": sd, "block_cache_mb": s.int_in("block_cache_mb", BLOCK_CACHE_MB_LIMITS, None)}


def _endpoints(raw: dict, key: str, path, default_port: int) -> tuple[Endpoint, ...]:
    items = raw.get(key)
    if not isinstance(items, list) or not items:
        raise ConfigError(key, f"at least one [[{key}]] entry is required", path)
    out, seen, addrs = [], set(), {}
    for i, e in enumerate(items):
        s = _Section(e, f"{key}[{i}]", SHARD_KEYS if key == "shards" else ENDPOINT_KEYS, path)
        eid = s.int_in("id", (0, 0xFFFF))
        if eid in seen:
            raise s.error("id", f"duplicate id {eid}")
        seen.add(eid)
        ip, port = s.ip("ip"), s.int_in("port", (1, 65535), default_port)
        if (ip, port) in addrs:
            j, other = addrs[(ip, port)]
            raise s.error("port", f"{ip}:{port} is already the address of {key}[{j}] (id {other}); "
                          f"every {key[:-1]} needs an ip:port of its own")
        addrs[(ip, port)] = (i, eid)
        mac, cp = s.mac("mac"), s.get("card_port", int, None)
        out.append(Endpoint(eid, ip, port, mac, cp, **(_shard_store(s) if key == "shards" else {})))
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


def _pci_list(s: _Section) -> tuple[str, ...]:
    """``card.pci``: a list of distinct PCI addresses, normalised (:func:`normalize_bdf`)."""
    out = []
    for i, a in enumerate(s.get("pci", list, [])):
        if not isinstance(a, str):
            raise s.error(f"pci[{i}]", f"must be a PCI address string like \"0000:3b:00.0\", got {a!r}")
        try:
            b = normalize_bdf(a)
        except ValueError as e:
            raise s.error(f"pci[{i}]", str(e)) from None
        if b in out:
            raise s.error(f"pci[{i}]", f"{b} is listed twice")
        out.append(b)
    return tuple(out)


def _cluster(raw: dict, path) -> dict:
    """The ``[cluster]`` section's settings, checked: :class:`ClusterConfig`'s fields of the same
    names (``name``, ``udp_port``, ``mtu``, ``sharding``, ``seed``, ``timeout_ms``, ``retries``).

    Raises:
        ConfigError: naming the first invalid field.
    """
    s = _Section(raw.get("cluster", {}), "cluster", CLUSTER_KEYS, path, " [cluster]")
    return {"name": s.get("name", str, "embnic"), "udp_port": s.int_in("udp_port", (1, 65535), consts.UDP_PORT),
            "mtu": s.int_in("mtu", MTU_LIMITS, consts.DEFAULT_MTU),
            "sharding": s.choice("sharding", SHARDING_POLICIES, "hash"), "seed": s.int_in("seed", (0, 2**63 - 1), 0),
            "timeout_ms": s.int_in("timeout_ms", (1, 600_000), 200), "retries": s.int_in("retries", (1, 1000), 5)}


def _table(t, i: int, seen: set, names: dict, path) -> TableConfig:
    """``[[tables]]`` entry ``i``, checked; ``seen`` (table ids) and ``names`` (name → entry) of
    the entries before it are updated.

    Raises:
        ConfigError: naming the first invalid field.
    """
    s = _Section(t, f"tables[{i}]", TABLE_KEYS, path)
    tid = s.int_in("id", (0, 0xFFFF))
    if tid in seen:
        raise s.error("id", f"duplicate table id {tid}")
    seen.add(tid)
    dtype = s.get("dtype", str, "fp32")
    if dtype not in consts.DTYPE_BY_NAME:
        raise s.error("dtype", f"must be fp32 or fp16, got {dtype!r}")
    opt, lr = s.choice("optimizer", OPTIMIZERS, "adagrad"), s.finite("lr", 0.05)
    tname = s.get("name", str, f"t{tid}")
    if not tname:
        raise s.error("name", "must not be empty")
    if tname in names:
        raise s.error("name", f"duplicate table name {tname!r} (also tables[{names[tname]}]); every table needs a "
                      "name of its own (names key the tables in TorchRec and `embnic tables export`)")
    names[tname] = i
    store, cache_rows = s.choice("store", STORES, None), s.int_in("cache_rows", CACHE_ROWS_LIMITS, None)
    if store == "memory" and cache_rows is not None:
        raise s.error("cache_rows", 'is the cache of a store = "disk" table: set store = "disk" or drop cache_rows')
    rows = s.int_in("rows", (1, 2**63 - 1), None)  # absent: unbounded ids; 2^63-1: TOML's int range
    dim = s.int_in("dim", (1, 4096))
    eps, init_scale = s.finite("eps", 1e-8), s.finite("init_scale", 0.01, zero_ok=True)
    shard, expected = s.get("shard", int, None), s.int_in("expected_rows", (1, 2**63 - 1), None)
    if expected is not None and rows is not None and expected > rows:
        raise s.error("expected_rows", f"{expected} is more than the table's rows ({rows}): lower it or drop rows")
    return TableConfig(id=tid, name=tname, rows=rows, dim=dim, dtype=dtype, optimizer=opt, lr=lr, eps=eps,
                       init_scale=init_scale, shard=shard, expected_rows=expected, store=store, cache_rows=cache_rows)


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


def _card_ports(c: _Section) -> list[CardPort]:
    """``[[card.ports]]``, checked (ids unique).

    Raises:
        ConfigError: naming the first invalid field.
    """
    ports, pseen = [], set()
    for i, p in enumerate(c.get("ports", list, [])):
        s = _Section(p, f"card.ports[{i}]", CARD_PORT_KEYS, c.path)
        pid = s.int_in("id", CARD_LIMITS["port_id"])
        if pid in pseen:
            raise s.error("id", f"duplicate card port {pid}")
        pseen.add(pid)
        ports.append(CardPort(pid, s.ip("ip"), s.mac("mac"), s.get("name", str, None)))
    return ports


def _card(c, shards: tuple[Endpoint, ...], clients: tuple[Endpoint, ...], path) -> CardConfig:
    """The ``[card]`` section, checked; when the card is enabled, every shard and client names
    one of its ports.

    Raises:
        ConfigError: naming the first invalid field.
    """
    s = _Section(c, "card", CARD_KEYS, path, " [card]")
    ports = _card_ports(s)
    enabled = s.get("enabled", bool, True)
    ring = s.int_in("ring_size", CARD_LIMITS["ring_size"], 4096)
    if ring & (ring - 1):
        raise s.error("ring_size", f"must be a power of two, got {ring}")
    card = CardConfig(
        enabled=enabled, ports=tuple(ports), ring_size=ring,
        state_size=s.int_in("state_size", CARD_LIMITS["state_size"], 65536),
        state_timeout_ms=s.int_in("state_timeout_ms", CARD_LIMITS["state_timeout_ms"], 5000),
        lcores=s.get("lcores", str, "0,1"), state_lcores=s.int_in("state_lcores", CARD_LIMITS["state_lcores"], 1),
        pci=_pci_list(s), set_sizes=frozenset(k for k in SIZE_KEYS if k in c))
    try:
        n_lcores = len(parse_lcores(card.lcores))
    except ValueError as e:
        raise s.error("lcores", str(e)) from None
    if card.state_lcores > n_lcores:
        raise s.error("state_lcores", f"{card.state_lcores} state lcores need at least as many lcores, "
                      f"but lcores = {card.lcores!r} names {n_lcores}")
    if enabled:
        if not ports:
            raise s.error("ports", "at least one port is required when the card is enabled")
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
    return ClusterConfig(**cl, tables=tuple(tables), shards=shards, clients=clients, card=card,
                         path=str(path) if path else None, raw=raw)


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
