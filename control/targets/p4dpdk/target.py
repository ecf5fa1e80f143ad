"""The ``p4dpdk`` target: the P4 program for PNA (p4/pna/) in DPDK's SWX pipeline, run by ``embnic-swx``
(p4/README.md "PNA on DPDK").

:meth:`P4DpdkTarget.load` builds the pipeline from the committed ``p4/build/pna``
(:func:`embnic.control.targets.p4dpdk.swx.build_pipeline`) and runs it as the ``dpdk`` target does
(:class:`~embnic.control.targets.dpdk.target.DpdkCard`, their base: process, state file, control
socket, ``unload``), on one lcore. Tables are written and read as the SWX control API's entry text by the
names p4c-dpdk gave them (:class:`embnic.control.targets.p4dpdk.swx.Names`); counters and the
state map are register arrays read by name (``reg_read``).

    t = P4DpdkTarget(load_config("examples/testbed.toml"), vdevs=["net_af_packet0,iface=veth-c0"], name="x")
    t.load(); print(t.counters()["drops"]); t.unload()
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Sequence

from embnic.client_lib.config import ClusterConfig, ConfigError
from embnic.control.targets.p4dpdk import swx as p4dpdk
from embnic.control.targets import p4program as p4prog
from embnic.control.targets.p4program import RING_FIELDS, STATE_REGISTERS, decode_state_map
from embnic.control.ctlsock import CtlClient
from embnic.control.targets.dpdk.process import DpdkProcess, eal_argv, unique_prefix
from embnic.control.errors import NoSuchEntryError, OperationalError
from embnic.control.runstate import require_root
from embnic.control.targets.base import Peer, check_peer_port, count_peers, peer_kind
from embnic.control.targets.dpdk.target import DpdkCard


def parse_table_dump(entries: Sequence[str]) -> list[dict]:
    """embnic-swx's ``table_dump`` (the entry texts as added: ``match V.. action NAME ARG V ..``) as
    ``[{key: [ints], action: NAME, params: {name: int}}]``."""
    out = []
    for line in entries:
        w = line.split()
        if not w or w[0] != "match" or "action" not in w:
            continue
        a = w.index("action")
        key = [int(x, 0) for x in w[1:a]]
        rest = w[a + 2:]
        params = {rest[i]: int(rest[i + 1], 0) for i in range(0, len(rest) - 1, 2)}
        out.append({"key": key, "action": w[a + 1], "params": params})
    return out


class SwxCard:
    """The P4 card in a running embnic-swx, by its P4 names: tables, counters, registers.

    Args:
        ctl: a client of embnic-swx's control socket (anything with ``call(cmd, **fields)``).
        names: the pipeline's names (:class:`embnic.control.targets.p4dpdk.swx.Names`).
    """

    def __init__(self, ctl, names: p4dpdk.Names):
        self.ctl = ctl
        self.names = names

    # ------------------------------------------------------------------ tables
    def add(self, table: str, key: Sequence[int], action: str, params: Sequence[int] = ()) -> None:
        self.ctl.call("table_add", table=self.names.table(table),
                      entry=p4dpdk.entry_line(self.names, table, key, action, params))

    def delete(self, table: str, key: Sequence[int]) -> None:
        self.ctl.call("table_delete", table=self.names.table(table), entry=p4dpdk.entry_line(self.names, table, key))

    def dump(self, table: str) -> list[dict]:
        """Entries of ``table``: ``[{key, action (P4 name), params: [ints in P4 order]}]``."""
        entries = self.ctl.call("table_dump", table=self.names.table(table))["entries"]
        by_target = {v: k for k, v in self.names.actions[table].items()}
        out = []
        for e in parse_table_dump(entries):
            act = by_target.get(e["action"], e["action"])
            order = self.names.action_params.get(table, {}).get(act, list(e["params"]))
            out.append({"key": e["key"], "action": act, "params": [e["params"].get(p, 0) for p in order]})
        return out

    def program(self, ports: Sequence[tuple[int, str, str]], peers: Sequence[Peer],
                state_timeout_us: int | None = None) -> None:
        """The card's port addresses (``(port, mac, ip)``), its peers (routes and clients) and timeout."""
        for port, mac, ip in ports:
            self.add("card_port_by_ingress", [port], "set_card_port", [p4prog.ip_int(ip), p4prog.mac_int(mac)])
            self.add("source_by_egress_port", [port], "rewrite_source", [p4prog.mac_int(mac), p4prog.ip_int(ip)])
        for p in peers:
            self.peer_add(p)
        if state_timeout_us is not None:
            self.ctl.call("reg_write", name=self.names.register("state_timeout_us"), index=0,
                          value=state_timeout_us)

    def peer_add(self, p: Peer) -> None:
        """Add or replace peer ``p``: its entry of ``route_by_shard`` or ``client_by_id`` and its
        ``sender_allowlist`` entry."""
        k = p.spec
        self.peer_del(p.kind, p.id)
        self.add(k.p4_table, [p.id], k.p4_action, p4prog.peer_params(p))
        self.add("sender_allowlist", [k.is_request, p.id, p4prog.ip_int(p.ip), p.udp_port], "allow_sender")

    def peer_del(self, kind: str, id_: int) -> bool:
        """Delete the peer ``id_`` of ``kind`` and its allowlist entries; False if it had no entry."""
        k = peer_kind(kind)
        found = any(e["key"] == [id_] for e in self.dump(k.p4_table))  # an exact-match key: one entry at most
        if found:
            self.delete(k.p4_table, [id_])
        for e in self.dump("sender_allowlist"):
            if e["key"][:2] == [k.is_request, id_]:
                self.delete("sender_allowlist", e["key"])
        return found

    def peers(self, kind: str) -> list[Peer]:
        """The peers of ``kind`` in the card's table, by id."""
        return p4prog.peers_of(kind, self.dump(peer_kind(kind).p4_table))

    # ------------------------------------------------------------------ registers and counters
    def reg(self, name: str, index: int = 0, count: int | None = None) -> list[int]:
        fields = {"name": self.names.register(name), "index": index}
        if count is not None:
            fields["count"] = count
        return self.ctl.call("reg_read", **fields)["values"]

    def counter(self, name: str, index: int = 0, count: int = 1, kind: str = "packets") -> list[int]:
        return self.ctl.call("reg_read", name=self.names.counter(name, kind), index=index, count=count)["values"]

    def counters(self, nb_ports: int, shards: Sequence[int] = ()) -> dict:
        """Counters in the DPDK card's ``counters`` shape (as :func:`embnic.control.targets.bmv2.runtime.read_counters`)."""
        sizes = {"rx_frames": nb_ports, "tx_frames": nb_ports, "drop_reasons": len(p4prog.drop_reasons()) + 1,
                 "frames_by_type": p4prog.constants()["NB_MSG_TYPES"],
                 "messages_completed": p4prog.constants()["NB_MSG_TYPES"]}
        @functools.cache  # each array of a sized counter read once
        def array(name: str, nbytes: bool) -> list[int]:
            return self.counter(name, 0, sizes[name], "bytes" if nbytes else "packets")

        def get(name: str, index: int, nbytes: bool = False) -> int:
            return array(name, nbytes)[index] if name in sizes else self.counter(name, index)[0]

        return p4prog.card_counters(get, nb_ports, shards)

    def state_map(self) -> list[dict]:
        return decode_state_map({r: self.reg(r) for r in STATE_REGISTERS})

    def ring(self, last: int) -> list[dict]:
        head = self.reg("ring_head", 0, 1)[0]
        return p4prog.ring_entries(head, {f"ring_{f}": self.reg(f"ring_{f}") for f in RING_FIELDS}, last)


class P4DpdkTarget(DpdkCard):
    """The embnic pipeline as the P4 program for PNA in DPDK's SWX pipeline (embnic-swx).

    Takes the ``dpdk`` target's options (vdevs, EAL arguments, netns, control socket); the lcore
    list's first lcore runs everything. ``lib``: a built pipeline library instead of building one.
    """

    name = "p4dpdk"
    OPTIONS = DpdkCard.OPTIONS | {"lib"}
    ONE_LCORE = True

    def __init__(self, config: ClusterConfig | None = None, *args: Any, lib: str | os.PathLike | None = None,
                 **kw: Any):
        kw.setdefault("check_build", False)  # embnic-swx carries no embnic build-info section
        super().__init__(config, *args, **kw)
        self.lib = Path(lib) if lib else None

    def swx(self) -> SwxCard:
        """The loaded card by P4 names (the context JSON the state file names)."""
        st = self.state() or {}
        if st.get("target") != self.name or not st.get("context"):
            raise OperationalError(f"no p4dpdk pipeline {self.instance!r} loaded: run `embnic pipeline load "
                                   "--target p4dpdk --config FILE`" +
                                   (f" --name {self.instance}" if self.instance != "embnic" else ""))
        return SwxCard(self.ctl(), p4dpdk.names_of(st["context"]))

    # ------------------------------------------------------------------ lifecycle
    def load(self, program: bool = True) -> dict:
        """Build the pipeline, start embnic-swx, program it, resume (module doc).

        Returns:
            the state file's contents plus ``routes``/``clients`` counts, ``info`` and ``warnings``
            (where the compiled program says something once: :attr:`p4dpdk.Pipeline.note`).
        Raises:
            MissingDependencyError: DPDK's pipeline headers or embnic-swx missing, or the P4 sources
                edited and no p4c-dpdk 1.2.4.8 on PATH (one line).
            UsageError: the config sets ``ring_size``/``state_size`` other than the compiled ones.
            ConfigError / NeedsRootError / OperationalError: as the dpdk target.
        """
        peers = self.check_config(program)
        p4prog.card_sizes(self.config.card, self.name, self.config.path)
        p4dpdk.require()
        require_root("loading the p4dpdk target (embnic-swx and its DPDK EAL)")
        self.claim()
        pipe = p4dpdk.build_pipeline() if self.lib is None else None
        lib = pipe.lib if pipe else self.lib
        context = pipe.context if pipe else self.lib.with_name("context.json")
        app = ["--pipeline", str(lib), "--ctl", self.start_ctl_path]
        if self.start_paused:
            app.append("--paused")

        def program_card(info: dict) -> None:
            for i, p in enumerate(self.config.card.ports):
                if p.mac is None:
                    raise ConfigError(f"card.ports[{i}].mac", "required by the p4dpdk target (the pipeline "
                                      "writes the card's MAC into every frame it sends): add mac = \"02:..\"",
                                      self.config.path)
            self.swx().program([(p.id, p.mac, p.ip) for p in self.config.card.ports], peers,
                               state_timeout_us=self.config.card.state_timeout_ms * 1000)

        state, info = self.run(p4dpdk.SWX_BINARY, "embnic-swx", app + self.card_args,
                                    {"lib": str(lib), "context": str(context)}, program_card)
        note = pipe.note if pipe else None
        return {**state, **count_peers(peers), "info": info, "warnings": [note] if note else []}

    # ------------------------------------------------------------------ tables
    def peer_add(self, p: Peer) -> None:
        check_peer_port(p, self._nb_ports())
        self.swx().peer_add(p)

    def peer_del(self, kind: str, id_: int) -> None:
        if not self.swx().peer_del(kind, id_):
            raise NoSuchEntryError(peer_kind(kind).noun, id_)

    def peer_list(self, kind: str) -> list[Peer]:
        return self.swx().peers(kind)

    # ------------------------------------------------------------------ observation
    def _nb_ports(self) -> int:
        return len(self.info().get("ports", []))

    def counters(self) -> dict:
        """Counters in the dpdk target's shape (the P4 card's: ``ports``, ``types``, ``drops``, ``arp``,
        ``completed``, ``shards`` of the routed shards, ``ring``, ``state``), plus ``host``: the
        embnic-swx host's per-port counters and the pipeline's port statistics."""
        card = self.swx()
        shards = [e.id for e in card.peers("shard")]
        c = card.counters(self._nb_ports(), shards)
        c.update(p4prog.ring_state_counters(card.reg("ring_head", 0, 1)[0], self.state_summary()))
        host = self.ctl().call("counters")
        c["host"] = {"ports": host["ports"], "pipeline_dropped": host["pipeline_dropped"]}
        return c

    def state_summary(self) -> dict:
        card = self.swx()
        full = card.counter("drop_reasons", p4prog.constants()["DROP_STATE_FULL"])[0]
        return p4prog.summarize_state(card.state_map(), full, card.counter("state_expired")[0])

    def state_dump(self, limit: int = 1000) -> list[dict]:
        """Live entries in the dpdk target's keys (timestamps: ns since embnic-swx started)."""
        return p4prog.dump_state(self.swx().state_map()[:limit])

    def ring(self, last: int) -> list[dict]:
        return [{**e, "in_ring": False} for e in self.swx().ring(last)]

    def info(self) -> dict:
        st = self.state() or {}
        return {**self.call("info"), "target": self.name, "lib": st.get("lib"),
                "context": st.get("context"), "state_size": p4prog.constants()["STATE_SLOTS"],
                "ring_size": p4prog.constants()["RING_SLOTS"]}

    def reset_counters(self) -> None:
        """Zero the P4 card's counters (the register arrays p4c-dpdk made of them)."""
        card = self.swx()
        for name in p4prog.COUNTERS:
            kind, _ = card.names.counters[name]
            for k in ("packets", "bytes") if kind == "packets_and_bytes" else ("packets",):
                self.ctl().call("reg_clear", name=card.names.counter(name, k))


class SwxProcess:
    """embnic-swx on given vdevs, started paused, for the tests and the benchmark (the target's
    :meth:`P4DpdkTarget.load` is for a cluster config): start, program, resume, wait, stop.

        with SwxProcess(pipe, ["net_pcap0,rx_pcap=in.pcap,tx_pcap=out.pcap"], workdir) as sw:
            sw.card.program([(0, "02:cc:00:00:00:00", "10.1.0.1")], peers)
            sw.resume()

    Args:
        pipe: the built pipeline (:func:`embnic.control.targets.p4dpdk.swx.build_pipeline`).
        vdevs: one per card port, in port order.
        workdir: where its control socket and log go.
        lcore: the one lcore it runs on.
    """

    def __init__(self, pipe: p4dpdk.Pipeline, vdevs: Sequence[str], workdir: Path, *, lcore: int = 0,
                 burst: int | None = None, netns: str | None = None, mbufs: int | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sock = str(self.workdir / "swx.sock")
        app = ["--pipeline", str(pipe.lib), "--ctl", self.sock, "--paused"]
        if burst:
            app += ["--burst", str(burst)]
        if mbufs:
            app += ["--mbufs", str(mbufs)]
        self.proc = DpdkProcess(p4dpdk.SWX_BINARY, eal_argv(str(lcore), unique_prefix("swx"), vdevs), app,
                                netns=netns, log=self.workdir / "swx.log", name="embnic-swx")
        self.ctl = CtlClient(self.sock, timeout=30.0)
        self.card = SwxCard(self.ctl, p4dpdk.names_of(str(pipe.context)))

    def start(self, timeout: float = 30.0) -> "SwxProcess":
        self.proc.start()
        self.proc.wait_answer(self.sock, timeout)
        return self

    def resume(self) -> None:
        self.ctl.call("resume")

    def host_counters(self) -> dict:
        return self.ctl.call("counters")

    def stop(self) -> dict:
        return self.proc.stop()

    def __enter__(self) -> "SwxProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
