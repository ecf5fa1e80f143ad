"""The P4 card's runtime state on BMv2: table entries in (:class:`CardProgram`, over P4Runtime by
:func:`program_p4runtime` or as runtime-CLI lines), counters and registers out, in the DPDK card's
shapes (:func:`read_counters`, :func:`read_state_map`, :func:`read_ring`).

    sw.cli(card_program([CardPortAddr(0, mac, ip)], peers).cli_commands())
    print(read_counters(sw, nb_ports=2)["drops"])
"""
from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Iterable

from embnic.control.targets import p4program as p4prog
from embnic.control.targets.p4program import RING_FIELDS, STATE_REGISTERS, decode_state_map
from embnic.control.targets.bmv2.switch import EGRESS_QUEUE_DEPTH, Bmv2Error, SimpleSwitch
from embnic.control.targets.bmv2.p4runtime import TableEntry
from embnic.control.targets.base import Peer


# --------------------------------------------------------------------------- table entries
@dataclasses.dataclass(frozen=True)
class CardPortAddr:
    """The card's own address on one of its ports."""

    port: int
    mac: str
    ip: str


def peer_entries(p: Peer) -> list[TableEntry]:
    """Peer ``p``'s entry of its table (``route_by_shard``: shard → server; ``client_by_id``) and its
    allowlist entry (replies from the shard, requests from the client)."""
    k = p.spec
    return [TableEntry(k.p4_table, (p.id,), k.p4_action, p4prog.peer_params(p)),
            TableEntry("sender_allowlist", (k.is_request, p.id, p4prog.ip_int(p.ip), p.udp_port), "allow_sender")]


@dataclasses.dataclass(frozen=True)
class CardProgram:
    """Everything that programs the card before it takes a frame: its port addresses, its peers
    (routes and clients, each with its allowlist entry) and the state map timeout (µs; None: left
    as is).

    :meth:`entries` are the table entries, written over P4Runtime or as runtime-CLI lines
    (:meth:`cli_commands`); :meth:`register_commands` the register writes, over Thrift on both
    channels.
    """

    card_ports: tuple[CardPortAddr, ...]
    peers: tuple[Peer, ...] = ()
    state_timeout_us: int | None = None

    def entries(self) -> list[TableEntry]:
        """Table entries: per card port ``card_port_by_ingress`` and ``source_by_egress_port``,
        then each peer's, in order (:func:`peer_entries`)."""
        out = []
        for p in self.card_ports:
            mac, ip = p4prog.mac_int(p.mac), p4prog.ip_int(p.ip)
            out.append(TableEntry("card_port_by_ingress", (p.port,), "set_card_port", (ip, mac)))
            out.append(TableEntry("source_by_egress_port", (p.port,), "rewrite_source", (mac, ip)))
        for p in self.peers:
            out += peer_entries(p)
        return out

    def register_commands(self) -> list[str]:
        """Runtime-CLI register writes (``state_timeout_us``)."""
        if self.state_timeout_us is None:
            return []
        return [f"register_write state_timeout_us 0 {int(self.state_timeout_us)}"]

    def cli_commands(self) -> list[str]:
        """The whole program as runtime-CLI lines (the Thrift channel): entries, then registers."""
        return [e.cli_add() for e in self.entries()] + self.register_commands()


def card_program(card_ports: Iterable[CardPortAddr], peers: Iterable[Peer] = (), *,
                 state_timeout_us: int | None = None) -> CardProgram:
    """:class:`CardProgram` of these addresses and peers (routes and clients)."""
    return CardProgram(tuple(card_ports), tuple(peers), state_timeout_us)


# --------------------------------------------------------------------------- P4Runtime
def program_p4runtime(sw: SimpleSwitch, json_path: Path, program: CardProgram, *, timeout: float = 60.0) -> dict:
    """Program a ``simple_switch_grpc`` started without a program, the P4Runtime way.

    Arbitration (one election id), ``SetForwardingPipelineConfig`` of the P4Info beside
    ``json_path`` (:func:`embnic.control.targets.bmv2.switch.p4info_path`) and the JSON, one ``Write`` of every
    table entry, then every table read back and compared with what was written; then the
    register writes and the egress queue depth over Thrift (P4Runtime has no register writes on
    BMv2, PI#376). Ports are the caller's to add afterwards (:meth:`SimpleSwitch.port_add`), so no
    frame meets an empty table.

    Returns:
        ``{"entries": n, "tables": {table: n}, "seconds": s}``.
    Raises:
        Bmv2Error: no P4Info beside the JSON, a call failed, or a table read back differs from
            what was written (names the table).
        MissingDependencyError: finsy/grpcio not installed.
    """
    from embnic.control.targets.bmv2.switch import p4info_path
    from embnic.control.targets.bmv2.p4runtime import P4InfoIndex, P4RuntimeError

    t0 = time.monotonic()
    entries = program.entries()
    info = p4info_path(json_path)
    if not info.exists():
        raise Bmv2Error(f"no P4Info {info} beside {json_path}: compile with p4c --p4runtime-files {info}, or use "
                        "the Thrift channel (EMBNIC_BMV2_CHANNEL=thrift)")
    try:
        index = P4InfoIndex.load(info)
        with sw.p4runtime(timeout=timeout) as c:
            c.wait_ready(timeout)
            c.become_primary()
            c.set_pipeline(index, Path(json_path).read_bytes())
            c.write(inserts=entries)
            by_table: dict[str, list[TableEntry]] = {t: [] for t in index.tables}
            for e in entries:
                by_table[e.table].append(e)
            for table, want in by_table.items():
                got = c.read_table(table)
                if sorted(got, key=_entry_key) != sorted(want, key=_entry_key):
                    raise Bmv2Error(f"P4Runtime read of {table} gave {len(got)} entries that differ from the "
                                    f"{len(want)} written: {sorted(set(got) ^ set(want), key=_entry_key)[:4]}")
    except P4RuntimeError as e:
        raise Bmv2Error(str(e)) from None
    sw.cli(program.register_commands() + [f"set_queue_depth {EGRESS_QUEUE_DEPTH}"])
    return {"entries": len(entries), "tables": {t: len(v) for t, v in by_table.items()},
            "seconds": round(time.monotonic() - t0, 3)}


def _entry_key(e: TableEntry) -> tuple:
    return (e.table, e.key, e.action, e.params)


# --------------------------------------------------------------------------- reading back
_COUNTER = re.compile(r"(\w+)\[(\d+)\]=\s*\((\d+) bytes, (\d+) packets\)")
_REGISTER = re.compile(r"(\w+)=\s*((?:\d+,\s*)*\d+)")


def parse_counters(text: str) -> dict[str, dict[int, tuple[int, int]]]:
    """``counter_read`` output as ``{name: {index: (packets, bytes)}}``."""
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for m in _COUNTER.finditer(text):
        out.setdefault(m.group(1), {})[int(m.group(2))] = (int(m.group(4)), int(m.group(3)))
    return out


def parse_registers(text: str) -> dict[str, list[int]]:
    """``register_read NAME`` (whole arrays) output as ``{name: [values]}``."""
    return {m.group(1): [int(v) for v in m.group(2).split(",")] for m in _REGISTER.finditer(text)}


def read_counters(sw: SimpleSwitch, nb_ports: int, shards: Iterable[int] = ()) -> dict:
    """Counters of the card in the DPDK card's ``counters`` shape (:func:`p4program.card_counters`),
    read in one runtime-CLI call."""
    shards = list(shards)
    from embnic.client_lib.consts import MsgType

    cmds = [f"counter_read rx_frames {p}" for p in range(nb_ports)]
    cmds += [f"counter_read tx_frames {p}" for p in range(nb_ports)]
    cmds += [f"counter_read drop_reasons {i + 1}" for i in range(len(p4prog.drop_reasons()))]
    cmds += [f"counter_read frames_by_type {t.value}" for t in MsgType]
    cmds += [f"counter_read messages_completed {t.value}" for t in MsgType]
    cmds += [f"counter_read completed_by_shard {s}" for s in shards]
    cmds += ["counter_read arp_replies 0", "counter_read state_expired 0"]
    c = parse_counters(sw.cli(cmds))

    def get(name: str, i: int, nbytes: bool = False) -> int:
        try:
            return c[name][i][1 if nbytes else 0]
        except KeyError:
            raise Bmv2Error(f"counter {name}[{i}] missing from simple_switch_CLI output") from None

    return p4prog.card_counters(get, nb_ports, shards)


def read_state_map(sw: SimpleSwitch) -> list[dict]:
    """Live entries of the state map: ``[{slot, client_id, msg_id, state, msg_type, shard_id,
    num_tables, num_keys, value_len, frag_count, msg_len, frags_in, frags_out, frames_in,
    frames_out, bytes_in, bytes_out, first_us, last_us}]`` by slot
    (:func:`p4program.decode_state_map`): the request's header fields the card keeps (protocol
    v2: ``value_len`` is the length its LOOKUP_REPLY must have). Expired entries a frame has not
    touched yet are included (BMv2 has no timer); ``last_us`` says how old they are.

    Raises:
        Bmv2Error: a register missing from the CLI's output (another program loaded).
    """
    regs = parse_registers(sw.cli([f"register_read {r}" for r in STATE_REGISTERS]))
    missing = [r for r in STATE_REGISTERS if r not in regs]
    if missing:
        raise Bmv2Error(f"registers {missing} missing from simple_switch_CLI output")
    return decode_state_map(regs)


def read_ring(sw: SimpleSwitch, last: int) -> list[dict]:
    """The ``last`` most recent accepted headers of the header ring, newest first
    (:func:`p4program.ring_entries`; ValueError: ``last`` < 0)."""
    regs = parse_registers(sw.cli(["register_read ring_head"] + [f"register_read ring_{f}" for f in RING_FIELDS]))
    if "ring_head" not in regs:
        raise Bmv2Error("register ring_head missing from simple_switch_CLI output")
    return p4prog.ring_entries(regs["ring_head"][0], regs, last)
