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
from embnic.control.targets.dpdk.process import eal_argv
from embnic.control.errors import UsageError
from embnic.control.targets.dpdk.xdp import AF_XDP_MAX_FRAME, PMDS, VETH_XDP_MAX_MTU

from .procs import card_pipeline_name

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
    """Longest prefix length (≤ 30) whose subnet holds IPv4 ``a`` and ``b`` as host addresses
    (:func:`segment_prefix` of one host). Example: 10.77.0.1 and 10.77.0.2 → 30 (10.77.0.0/30)."""
    return segment_prefix(a, [b])


def segment_prefix(card_ip: str, hosts: list[str]) -> int:
    """Longest prefix length (≤ 30) whose subnet holds ``card_ip`` and every one of ``hosts`` as
    host addresses (a card port's L2 segment, or a link with one host).

    Raises:
        ValueError: an address twice, or no subnet holds them all as hosts.
    """
    addrs = [ipaddress.IPv4Address(a) for a in [card_ip, *hosts]]
    if len(set(addrs)) != len(addrs):
        raise ValueError(f"both ends of a link have address {card_ip}" if len(hosts) == 1 else
                         f"an address is given twice among {card_ip}, {', '.join(hosts)}")
    for plen in range(30, 0, -1):
        net = ipaddress.IPv4Network(f"{card_ip}/{plen}", strict=False)
        if all(a in net and a not in (net.network_address, net.broadcast_address) for a in addrs):
            return plen
    raise ValueError(f"{card_ip} and {', '.join(hosts)} fit in no common subnet")


DEFAULT_PMD = "af_packet"


class PmdError(UsageError):
    """A PMD the testbed cannot run, or one the config's MTU does not fit (a usage error, exit 2;
    ``option`` names the flag)."""

    def __init__(self, message: str, option: str = "--pmd"):
        super().__init__(message, param="pmd")
        self.option = option


def check_pmd(pmd: str, mtu: int) -> str:
    """Validate the card's PMD over the testbed's veths against the cluster MTU.

    ``af_packet`` takes any MTU (its ``framesz`` follows it: :func:`card_vdev`); ``af_xdp``
    needs the veth to take a native XDP program, which Linux allows only up to
    :data:`~embnic.control.targets.dpdk.xdp.VETH_XDP_MAX_MTU` (3506; the card's net_af_xdp ports, one 4 KiB page
    per frame, hold the same: :data:`~embnic.control.targets.dpdk.xdp.AF_XDP_MAX_MTU`).

    Raises:
        PmdError: unknown PMD, or ``af_xdp`` above that MTU (names both fixes).
    """
    if pmd not in PMDS:
        raise PmdError(f"--pmd {pmd!r}: the testbed runs the card on {' or '.join(PMDS)}")
    if pmd == "af_xdp" and mtu > VETH_XDP_MAX_MTU:
        raise PmdError(f"--pmd af_xdp with mtu = {mtu}: a veth takes the PMD's XDP program only up to MTU "
                       f"{VETH_XDP_MAX_MTU} (the kernel: \"Peer MTU is too large to set XDP\"; the card's "
                       f"net_af_xdp ports also receive at most {AF_XDP_MAX_FRAME}-byte frames, one page each): use --pmd af_packet, or mtu <= {VETH_XDP_MAX_MTU}")
    return pmd


def card_vdev(pmd: str, port: int, ifname: str, mtu: int) -> str:
    """The ``--vdev`` spec of card port ``port`` on interface ``ifname`` with PMD ``pmd``.

    ``af_packet``: ``net_af_packet<i>,iface=<if>,qdisc_bypass=0,framecnt=4096`` —
    ``framecnt=4096`` (8 MB of PACKET_MMAP ring per port instead of the PMD's 512 frames):
    with the default a top-speed replay of a 10-batch trace overflowed the RX ring and lost
    531 of 3079 frames before the card saw them; with 4096 it lost none. ``qdisc_bypass=0``:
    DPDK 22.11's default (1) sends around the interface's qdisc, so ``testbed netem --backend
    tc`` on the card's end would impair nothing the card sends (measured: a ``pfifo`` root
    qdisc counted none of 50 forwarded frames; with ``qdisc_bypass=0`` all 50). Above MTU 1500
    the PMD's frames must hold a whole frame of the MTU (it truncates anything longer):
    ``framesz`` = the card's mbuf buffer for ``--mtu`` (MTU + 18 + 128 rounded up to 1 KiB; the
    PMD refuses a frame larger than an mbuf), 4 frames a block, and as many frames as keep the
    ring near 8 MB.

    ``af_xdp``: ``net_af_xdp<i>,iface=<if>`` — queue 0 (a veth has one), libxdp's default
    program, copy mode (veth has no zero-copy), the PMD's busy polling (``busy_budget`` 64).
    """
    if pmd == "af_xdp":
        return f"net_af_xdp{port},iface={ifname}"
    if mtu <= 1500:
        return f"net_af_packet{port},iface={ifname},qdisc_bypass=0,framecnt=4096"
    framesz = -(-(mtu + 18 + 128) // 1024) * 1024
    framecnt = max(512, (8 << 20) // framesz // 4 * 4)
    return (f"net_af_packet{port},iface={ifname},qdisc_bypass=0,framesz={framesz},blocksz={4 * framesz},"
            f"framecnt={framecnt}")


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
    prefix_len: int
    members: tuple[str, ...] = ()  #: every node of this host (``c1``, ``c3``): they share its netns
    bridge: str | None = None  #: the card port's bridge ``card_if`` is a port of (several hosts), else None
    port_if: str | None = None  #: with a bridge: the card's DPDK interface, else ``card_if`` itself


@dataclasses.dataclass(frozen=True)
class Topology:
    """The declared testbed: namespaces and links derived from a cluster config.

    Build with :meth:`from_config`; nothing is created until :meth:`Testbed.up`.
    """

    name: str
    cfg: ClusterConfig
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]  #: in card port order
    pmd: str = DEFAULT_PMD  #: the card's PMD on its veth ends: "af_packet" or "af_xdp" (:func:`card_vdev`)

    @classmethod
    def from_config(cls, cfg: ClusterConfig, name: str = DEFAULT_NAME, pmd: str = DEFAULT_PMD) -> "Topology":
        """Declare the testbed of ``cfg`` under ``name``, its card on PMD ``pmd``.

        Raises:
            ValueError: bad ``name``.
            PmdError: unknown ``pmd``, or ``af_xdp`` with an MTU a veth's XDP cannot take (:func:`check_pmd`).
            ConfigError: no enabled ``[card]``, card port ids not ``0..n-1``, a client/shard
                without a card port of its own, or addresses that cannot form a link (names the field).
        """
        check_name(name)
        check_pmd(pmd, cfg.mtu)
        where = cfg.path
        if cfg.card is None or not cfg.card.enabled:
            raise ConfigError("card", "the testbed needs a [card] section with enabled = true and its ports "
                              "(see examples/testbed.toml)", where)
        ids = sorted(p.id for p in cfg.card.ports)
        if ids != list(range(len(ids))):
            raise ConfigError("card.ports", f"port ids must be 0..{len(ids) - 1} (card port i is DPDK port i, "
                              f"the i-th --vdev), got {ids}", where)
        nodes = [Node("card", "card", None, f"{name}-card")]
        # a host is the nodes of one ip (one namespace, MAC and card port; config.py checks they agree)
        hosts: dict[str, dict] = {}
        for kind, key, eps in (("client", "clients", cfg.clients), ("shard", "shards", cfg.shards)):
            for i, e in enumerate(eps):
                node = f"{kind[0]}{e.id}"
                field = f"{key}[{i}]"
                if e.card_port is None:
                    raise ConfigError(f"{field}.card_port", "required: the card port this "
                                      f"{kind} hangs off", where)
                h = hosts.setdefault(e.ip, {"kind": kind, "node": node, "ep": e, "field": field, "members": [],
                                            "ns": f"{name}-{node}"})
                if h["kind"] != kind:
                    raise ConfigError(f"{field}.ip", f"{e.ip} is the host of {h['field']} (a {h['kind']}); in "
                                      "the testbed a host holds clients or shards, not both", where)
                h["members"].append(node)
                nodes.append(Node(node, kind, e.id, h["ns"]))
        links: list[Link] = []
        for p in sorted(cfg.card.ports, key=lambda p: p.id):
            on_port = [h for h in hosts.values() if h["ep"].card_port == p.id]
            if not on_port:
                raise ConfigError(f"card.ports[{cfg.card.ports.index(p)}]", f"card port {p.id} has no client "
                                  "or shard (set card_port on one, or remove the port)", where)
            try:
                plen = segment_prefix(p.ip, [h["ep"].ip for h in on_port])
            except ValueError as err:
                raise ConfigError(f"{on_port[-1]['field']}.ip", f"{err} (card port {p.id} has {p.ip}); give "
                                  "each card port's segment its own small subnet, e.g. 10.77.<port>.1 and "
                                  ".2, .3, ...", where) from None
            # names fit Linux's 15 characters: NAME has at most 8 (check_name), ids at most 5 digits (config.py)
            port_if = f"{name}p{p.id}"
            bridge = f"{name}b{p.id}" if len(on_port) > 1 else None
            for h in on_port:
                e, node = h["ep"], h["node"]
                links.append(Link(
                    port=p.id, card_if=f"{name}{node}x" if bridge else port_if,
                    card_mac=p.mac or derived_mac("card", p.id), card_ip=p.ip, peer=node, peer_kind=h["kind"],
                    peer_id=e.id, peer_ns=h["ns"], peer_if=f"{name}{node}",
                    peer_mac=e.mac or derived_mac(h["kind"], e.id), peer_ip=e.ip,
                    prefix_len=plen, members=tuple(h["members"]), bridge=bridge, port_if=port_if))
        return cls(name, cfg, tuple(nodes), tuple(links), pmd)

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
        """The link of node ``peer`` (``c<id>`` or ``s<id>``): its host's veth to the card port."""
        for lk in self.links:
            if lk.peer == peer or peer in lk.members:
                return lk
        raise KeyError(f"no link for {peer!r}")

    def client_ns(self, client_id: int) -> str:
        """Namespace of client ``client_id``."""
        return self.node(f"c{client_id}").netns

    def shard_ns(self, shard_id: int) -> str:
        """Namespace of shard ``shard_id``."""
        return self.node(f"s{shard_id}").netns

    def vdevs(self) -> list[str]:
        """``--vdev`` specs of the card, one per card port in port order, on :attr:`pmd`:
        ``net_af_packet<i>,iface=<name>p<i>,qdisc_bypass=0,framecnt=4096`` or
        ``net_af_xdp<i>,iface=<name>p<i>`` (:func:`card_vdev` says why each devarg)."""
        port_ifs = {lk.port: lk.port_if or lk.card_if for lk in self.links}  # the card's DPDK interfaces
        return [card_vdev(self.pmd, p, ifname, self.cfg.mtu) for p, ifname in sorted(port_ifs.items())]

    def effective_raw(self, rdir: Path, target: str = "dpdk") -> dict:
        """The user's config dict with every MAC filled in and a ``[control]`` section for the card
        (name ``NAME-card`` (:func:`card_pipeline_name`), control socket ``rdir/card.sock``, netns,
        vdevs, EAL arguments: ``[card].lcores``, no hugepages, no PCI, 256 MB, and a file prefix
        unique to this testbed so testbeds run side by side). ``testbed up`` runs its own card under the name ``card`` with its state and log in
        ``rdir``; the config's name is the one ``embnic pipeline load -c`` this config runs under
        (state ``RUN_DIR/NAME-card.json``), unique per testbed."""
        raw = json.loads(json.dumps(self.cfg.raw))  # deep copy
        by_port = {lk.port: lk for lk in self.links}
        by_ip = {lk.peer_ip: lk for lk in self.links}
        for key in ("clients", "shards"):
            for e in raw.get(key, []):
                e["mac"] = by_ip[e["ip"]].peer_mac
        for e, sh in zip(raw.get("shards", []), self.cfg.shards):
            if e.get("store_dir") is not None:
                e["store_dir"] = sh.store_dir  # absolute (from the user's config folder): the copy lives elsewhere
        for p in raw["card"]["ports"]:
            p["mac"] = by_port[p["id"]].card_mac
            p.setdefault("name", by_port[p["id"]].port_if or by_port[p["id"]].card_if)
        ctl = dict(raw.get("control", {}))
        ctl.update({"name": card_pipeline_name(self.name), "ctl": str(rdir / "card.sock"), "netns": self.card_ns,
                    "vdevs": self.vdevs(), "target": target,
                    "eal_args": eal_argv(self.cfg.card.lcores, card_file_prefix(self.name))})
        if "binary" in ctl and self.cfg.path and not os.path.isabs(ctl["binary"]):
            ctl["binary"] = str((Path(self.cfg.path).parent / ctl["binary"]).resolve())
        raw["control"] = ctl
        return raw

    def diagram(self) -> str:
        """A text picture of the declared wiring (one line per link)."""
        lines = [f"testbed {self.name}: card in netns {self.card_ns} (net_{self.pmd})"]
        for lk in self.links:
            who = f"{lk.peer_kind} {lk.peer_id}" if len(lk.members) <= 1 else \
                f"{lk.peer_kind}s {','.join(m[1:] for m in lk.members)}"
            via = f" bridge {lk.bridge} {lk.card_if}" if lk.bridge else ""
            lines.append(f"  card port {lk.port} {lk.port_if or lk.card_if} {lk.card_ip:<15} {lk.card_mac}{via}"
                         f"  <==veth==>  {who} {lk.peer_if} {lk.peer_ip}/{lk.prefix_len} "
                         f"{lk.peer_mac} (netns {lk.peer_ns})")
        return "\n".join(lines)
