"""The declared testbed: nodes (namespaces) and links (veth pairs) derived from a cluster config.

Nothing here touches the system: :meth:`Topology.from_config` checks the config and names every
namespace, interface, MAC and address; :class:`~embnic.testbed.net.topology.Testbed` creates them.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
from pathlib import Path

from embnic.client_lib.config import ClusterConfig, ConfigError
from embnic.control.dpdk_proc import eal_argv

NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,7}$")
DEFAULT_NAME = "emb"


def check_name(name: str) -> str:
    """Validate a testbed name (the prefix of every namespace and interface).

    Raises:
        ValueError: not 1-8 letters/digits starting with a letter.
    """
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(f"testbed name {name!r}: use 1-8 letters or digits, starting with a letter "
                         "(it prefixes every namespace and interface, which Linux limits to 15 characters)")
    return name


def card_file_prefix(name: str) -> str:
    """The EAL ``--file-prefix`` of testbed ``name``'s card: ``embnic-tb-NAME`` (testbeds run side by side)."""
    return f"embnic-tb-{name}"


def derived_mac(kind: str, num: int) -> str:
    """Locally administered MAC of a testbed node when the config gives none.

    ``02:ee:KK:00:HH:LL`` with ``KK`` = 00 card port, 01 client, 02 shard and ``HHLL`` = the
    port/client/shard id (big-endian u16). Depends only on (kind, id).
    """
    k = {"card": 0, "client": 1, "shard": 2}[kind]
    return f"02:ee:{k:02x}:00:{num >> 8 & 0xFF:02x}:{num & 0xFF:02x}"


def link_prefix(a: str, b: str) -> int:
    """Longest prefix length (≤ 30) whose subnet holds IPv4 ``a`` and ``b`` as host addresses.

    Example: 10.77.0.1 and 10.77.0.2 → 30 (10.77.0.0/30).

    Raises:
        ValueError: the two are equal or no subnet holds both as hosts.
    """
    ia, ib = ipaddress.IPv4Address(a), ipaddress.IPv4Address(b)
    if ia == ib:
        raise ValueError(f"both ends of a link have address {a}")
    for plen in range(30, 0, -1):
        net = ipaddress.IPv4Network(f"{a}/{plen}", strict=False)
        if ib in net and not {ia, ib} & {net.network_address, net.broadcast_address}:
            return plen
    raise ValueError(f"{a} and {b} fit in no common subnet")


@dataclasses.dataclass(frozen=True)
class Node:
    """One namespace of the testbed: ``name`` is ``c<id>``, ``s<id>`` or ``card``."""

    name: str
    kind: str  #: "client", "shard" or "card"
    id: int | None
    netns: str


@dataclasses.dataclass(frozen=True)
class Link:
    """The veth pair between card port ``port`` and one client or shard.

    ``card_if``/``card_mac``/``card_ip``: the card's end (DPDK port ``port``); ``peer_*``: the
    client's or shard's end in namespace ``peer_ns``; ``prefix_len``: the link's subnet.
    """

    port: int
    card_if: str
    card_mac: str
    card_ip: str
    peer: str  #: node name, c<id> or s<id>
    peer_kind: str
    peer_id: int
    peer_ns: str
    peer_if: str
    peer_mac: str
    peer_ip: str
    peer_port: int  #: UDP port of the client/shard
    prefix_len: int


@dataclasses.dataclass(frozen=True)
class Topology:
    """The declared testbed: namespaces and links derived from a cluster config.

    Build with :meth:`from_config`; nothing is created until :meth:`Testbed.up`.
    """

    name: str
    cfg: ClusterConfig
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]  #: in card port order

    @classmethod
    def from_config(cls, cfg: ClusterConfig, name: str = DEFAULT_NAME) -> "Topology":
        """Declare the testbed of ``cfg`` under ``name``.

        Raises:
            ValueError: bad ``name``.
            ConfigError: no enabled ``[card]``, card port ids not ``0..n-1``, a client/shard
                without a card port of its own, or addresses that cannot form a link (names the field).
        """
        check_name(name)
        where = cfg.path
        if cfg.card is None or not cfg.card.enabled:
            raise ConfigError("card", "the testbed needs a [card] section with enabled = true and its ports "
                              "(see examples/testbed.toml)", where)
        ids = sorted(p.id for p in cfg.card.ports)
        if ids != list(range(len(ids))):
            raise ConfigError("card.ports", f"port ids must be 0..{len(ids) - 1} (card port i is DPDK port i, "
                              f"the i-th --vdev), got {ids}", where)
        nodes = [Node("card", "card", None, f"{name}-card")]
        links: list[Link] = []
        used: dict[int, str] = {}
        for kind, key, eps in (("client", "clients", cfg.clients), ("shard", "shards", cfg.shards)):
            for i, e in enumerate(eps):
                node = f"{kind[0]}{e.id}"
                field = f"{key}[{i}]"
                if e.card_port is None:
                    raise ConfigError(f"{field}.card_port", "required: the card port this "
                                      f"{kind} hangs off", where)
                if e.card_port in used:
                    raise ConfigError(f"{field}.card_port", f"card port {e.card_port} is already the link of "
                                      f"{used[e.card_port]}; in the testbed every client and shard needs "
                                      "a card port of its own", where)
                used[e.card_port] = node
                cp = cfg.card.port(e.card_port)
                try:
                    plen = link_prefix(cp.ip, e.ip)
                except ValueError as err:
                    raise ConfigError(f"{field}.ip", f"{err} (card port {cp.id} has {cp.ip}); give each "
                                      "link its own small subnet, e.g. 10.77.<port>.1 and .2", where) from None
                ns = f"{name}-{node}"
                nodes.append(Node(node, kind, e.id, ns))
                links.append(Link(
                    port=cp.id, card_if=f"{name}p{cp.id}", card_mac=cp.mac or derived_mac("card", cp.id),
                    card_ip=cp.ip, peer=node, peer_kind=kind, peer_id=e.id, peer_ns=ns,
                    peer_if=f"{name}{node}", peer_mac=e.mac or derived_mac(kind, e.id), peer_ip=e.ip,
                    peer_port=e.port, prefix_len=plen))
        for p in cfg.card.ports:
            if p.id not in used:
                raise ConfigError(f"card.ports[{cfg.card.ports.index(p)}]", f"card port {p.id} has no client "
                                  "or shard (set card_port on one, or remove the port)", where)
        for link in links:
            for ifname in (link.card_if, link.peer_if):
                if len(ifname) > 15:
                    raise ConfigError("clients/shards.id", f"interface name {ifname!r} is longer than 15 "
                                      "characters: use a shorter testbed name or smaller ids", where)
        links.sort(key=lambda lk: lk.port)
        return cls(name, cfg, tuple(nodes), tuple(links))

    # -- lookups
    @property
    def card_ns(self) -> str:
        return f"{self.name}-card"

    def node(self, name: str) -> Node:
        """The node called ``name`` (``card``, ``c<id>``, ``s<id>``)."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r} in testbed {self.name!r} (nodes: {', '.join(n.name for n in self.nodes)})")

    def link(self, peer: str) -> Link:
        """The link of node ``peer`` (``c<id>`` or ``s<id>``)."""
        for lk in self.links:
            if lk.peer == peer:
                return lk
        raise KeyError(f"no link for {peer!r}")

    def client_ns(self, client_id: int) -> str:
        """Namespace of client ``client_id``."""
        return self.node(f"c{client_id}").netns

    def shard_ns(self, shard_id: int) -> str:
        """Namespace of shard ``shard_id``."""
        return self.node(f"s{shard_id}").netns

    def vdevs(self) -> list[str]:
        """``--vdev`` specs of the card, one per card port in port order:
        ``net_af_packet<i>,iface=<name>p<i>,framecnt=4096``.

        ``framecnt=4096`` (8 MB of PACKET_MMAP ring per port instead of the PMD's 512 frames):
        with the default a top-speed replay of a 10-batch trace overflowed the RX ring and lost
        531 of 3079 frames before the card saw them; with 4096 it lost none.

        Above MTU 1500 the PMD's frames must hold a whole frame of the MTU (it truncates
        anything longer): ``framesz`` = the card's mbuf buffer for ``--mtu`` (MTU + 18 + 128
        rounded up to 1 KiB; the PMD refuses a frame larger than an mbuf), 4 frames a block, and
        as many frames as keep the ring near 8 MB."""
        mtu = self.cfg.mtu
        if mtu <= 1500:
            return [f"net_af_packet{lk.port},iface={lk.card_if},framecnt=4096" for lk in self.links]
        framesz = -(-(mtu + 18 + 128) // 1024) * 1024
        framecnt = max(512, (8 << 20) // framesz // 4 * 4)
        return [f"net_af_packet{lk.port},iface={lk.card_if},framesz={framesz},blocksz={4 * framesz},"
                f"framecnt={framecnt}" for lk in self.links]

    def eal_args(self) -> list[str]:
        """EAL arguments of the card (before the ``--vdev``s): ``[card].lcores``, no hugepages,
        no PCI, 256 MB, and a file prefix unique to this testbed so testbeds run side by side."""
        return eal_argv(self.cfg.card.lcores, card_file_prefix(self.name))

    def effective_raw(self, rdir: Path, target: str = "dpdk") -> dict:
        """The user's config dict with every MAC filled in and a ``[control]`` section for the card
        (name ``card``, control socket, log and state file in ``rdir``, netns, vdevs)."""
        raw = json.loads(json.dumps(self.cfg.raw))  # deep copy
        by_port = {lk.port: lk for lk in self.links}
        for key in ("clients", "shards"):
            for e in raw.get(key, []):
                lk = by_port[e["card_port"]]
                e["mac"] = lk.peer_mac
        for p in raw["card"]["ports"]:
            p["mac"] = by_port[p["id"]].card_mac
            p.setdefault("name", by_port[p["id"]].card_if)
        ctl = dict(raw.get("control", {}))
        ctl.update({"name": "card", "ctl": str(rdir / "card.sock"), "netns": self.card_ns,
                    "vdevs": self.vdevs(), "target": target, "eal_args": self.eal_args()})
        if "binary" in ctl and self.cfg.path and not os.path.isabs(ctl["binary"]):
            ctl["binary"] = str((Path(self.cfg.path).parent / ctl["binary"]).resolve())
        raw["control"] = ctl
        return raw

    def diagram(self) -> str:
        """A text picture of the declared wiring (one line per link)."""
        lines = [f"testbed {self.name}: card in netns {self.card_ns}"]
        for lk in self.links:
            lines.append(f"  card port {lk.port} {lk.card_if} {lk.card_ip:<15} {lk.card_mac}  <==veth==>  "
                         f"{lk.peer_kind} {lk.peer_id} {lk.peer_if} {lk.peer_ip}/{lk.prefix_len} "
                         f"{lk.peer_mac} (netns {lk.peer_ns})")
        return "\n".join(lines)
