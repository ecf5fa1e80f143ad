"""The P4 program's source as data: constants, tables and included files of ``p4/`` (one
definition of each name: the drop reasons and their counter indices, the state map and ring
sizes), and what both P4 targets make of its registers. Nothing here needs p4c.

    >>> drop_reasons()[:3]
    ['too_short', 'bad_ether', 'bad_ip']
"""
from __future__ import annotations

import functools
import ipaddress
import re
from pathlib import Path

#: the P4 sources (the repository's p4/ folder)
P4_DIR = Path(__file__).resolve().parents[2] / "p4"
#: the top-level program of each architecture: v1model (BMv2), pna (p4c-dpdk, DPDK's SWX pipeline)
MAINS = {arch: P4_DIR / arch / "embnic.p4" for arch in ("v1model", "pna")}

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_CONST = re.compile(r"\bconst\s+(\w+(?:<\d+>)?)\s+(\w+)\s*=\s*(0x[0-9a-fA-F]+|\d+)\s*;")


class P4SourceError(ValueError):
    """The P4 source does not have what is looked for (a renamed header, a field of odd width)."""


def _source(name: str) -> str:
    path = P4_DIR / name
    try:
        return path.read_text()
    except OSError as e:
        raise P4SourceError(f"cannot read {path}: {e.strerror}") from None


def strip_comments(text: str) -> str:
    """``text`` without C-style comments (P4 uses ``/* */`` and ``//``)."""
    return _COMMENT.sub(" ", text)


@functools.lru_cache(maxsize=None)
def constants() -> dict[str, int]:
    """Every ``const TYPE NAME = NUMBER;`` of ``p4/types.p4`` as ``{NAME: value}``."""
    return {m.group(2): int(m.group(3), 0) for m in _CONST.finditer(strip_comments(_source("types.p4")))}


def drop_reasons() -> list[str]:
    """Drop reason names in counter-index order: ``drop_reasons[i + 1]`` counts ``names[i]``.

    From the ``DROP_*`` constants of ``p4/types.p4`` (``DROP_NONE`` = 0 is left out), lower
    case like the DPDK card's counter names.

    Raises:
        P4SourceError: the indices are not 1..N without gaps.
    """
    c = constants()
    reasons = sorted((v, k[5:].lower()) for k, v in c.items() if k.startswith("DROP_") and k != "DROP_NONE")
    if [v for v, _ in reasons] != list(range(1, len(reasons) + 1)):
        raise P4SourceError(f"DROP_* constants of p4/types.p4 are not 1..N: {reasons}")
    if c.get("NB_DROP_REASONS") != len(reasons) + 1:
        raise P4SourceError(f"NB_DROP_REASONS is {c.get('NB_DROP_REASONS')}, want {len(reasons) + 1}")
    return [n for _, n in reasons]


#: the card's sizes a P4 program has compiled in: config key -> (p4/types.p4 constant, what it counts)
COMPILED_SIZES = {"ring_size": ("RING_SLOTS", "header ring slots"), "state_size": ("STATE_SLOTS", "state-map slots")}


def card_sizes(card, target: str, path: str | None = None) -> dict[str, int]:
    """The ring and state-map sizes a P4 target runs with: the program's compiled ones
    (:data:`COMPILED_SIZES`), whatever the config's defaults say.

    Args:
        card: the config's :class:`embnic.client_lib.config.CardConfig` (its ``set_sizes`` says
            which keys the file sets itself).
        target: the target's name, for the message (``bmv2``, ``p4dpdk``).
        path: the config file, for the message.
    Returns:
        ``{"ring_size": RING_SLOTS, "state_size": STATE_SLOTS}``.
    Raises:
        UsageError: the config sets a size other than the compiled one (exit 2; names it and the fix).
    """
    from embnic.control.errors import UsageError

    c = constants()
    out = {key: c[const] for key, (const, _) in COMPILED_SIZES.items()}
    for key, (const, what) in COMPILED_SIZES.items():
        if key in getattr(card, "set_sizes", ()) and getattr(card, key) != out[key]:
            raise UsageError(f"card.{key} = {getattr(card, key)}{f' in {path}' if path else ''}: the {target} target "
                             f"runs the P4 program compiled with {out[key]} {what} (p4/types.p4 {const}); drop "
                             f"{key} from [card] or set it to {out[key]}")
    return out


#: slot_state values (p4/types.p4 STATE_*), named as docs/control-socket.md names them
STATE_NAMES = {0: "free", 1: "receiving", 2: "forwarded", 3: "replying"}
#: the state map's registers (p4/state_map.p4, both architectures), each STATE_SLOTS cells
STATE_REGISTERS = ("slot_state", "slot_key", "slot_request_info", "slot_shard", "slot_msg_len", "slot_num_keys",
                   "slot_value_len", "slot_frags_in", "slot_frags_out", "slot_frames_in", "slot_frames_out",
                   "slot_bytes_in", "slot_bytes_out", "slot_first_us", "slot_last_us")

#: the header ring's per-field registers (p4/header_ring.p4), in the order of a ring entry
RING_FIELDS = ("msg_type", "flags", "msg_id", "client_id", "shard_id", "num_tables", "table_id", "num_keys",
               "value_len", "msg_len", "frag_index", "frag_count", "frag_len", "ingress_port", "time_us")


def ring_entries(head: int, regs: dict[str, list[int]], last: int) -> list[dict]:
    """The ``last`` most recent headers of the header ring, newest first, from ``ring_head`` (``head``:
    headers ever logged) and the ring's registers (``{"ring_" + field: cells}``, :data:`RING_FIELDS`).

    Raises:
        ValueError: ``last`` < 0.
    """
    if last < 0:
        raise ValueError(f"last must be >= 0, got {last}")
    size = constants()["RING_SLOTS"]
    return [{f: regs[f"ring_{f}"][(head - k) % size] for f in RING_FIELDS}
            for k in range(1, min(last, head, size) + 1)]


def decode_state_map(regs: dict[str, list[int]]) -> list[dict]:
    """Live entries of the state map from its registers (:data:`STATE_REGISTERS`, each a list of
    STATE_SLOTS cells, however the target read them): ``[{slot, client_id, msg_id, state,
    msg_type, shard_id, num_tables, num_keys, value_len, frag_count, msg_len, frags_in, frags_out,
    frames_in, frames_out, bytes_in, bytes_out, first_us, last_us}]`` by slot, free slots left
    out. ``slot_key`` is ``client_id << 32 | msg_id``, ``slot_request_info`` is ``msg_type << 32 |
    num_tables << 16 | frag_count`` (p4/state_map.p4).

    Raises:
        KeyError: a register of :data:`STATE_REGISTERS` missing from ``regs``.
    """
    # the registers that hold one field each, named as the register
    packed = ("slot_state", "slot_key", "slot_request_info", "slot_shard")
    plain = [r[len("slot_"):] for r in STATE_REGISTERS if r not in packed]
    out = []
    for s, st in enumerate(regs["slot_state"]):
        if st == 0:
            continue
        key, req = regs["slot_key"][s], regs["slot_request_info"][s]
        out.append({"slot": s, "client_id": key >> 32, "msg_id": key & 0xFFFFFFFF,
                    "state": STATE_NAMES.get(st, str(st)), "msg_type": req >> 32, "shard_id": regs["slot_shard"][s],
                    "num_tables": (req >> 16) & 0xFFFF, "frag_count": req & 0xFFFF,
                    **{f: regs[f"slot_{f}"][s] for f in plain}})
    return out


def summarize_state(entries: list[dict], overflow: int, expired: int) -> dict:
    """A P4 card's ``state_summary`` in the dpdk target's shape (``entries``, ``capacity``,
    ``overflow``, ``expired``, ``by_state``) from its live entries (:func:`decode_state_map`)."""
    by = {"receiving": 0, "forwarded": 0, "replying": 0}
    for e in entries:
        by[e["state"]] = by.get(e["state"], 0) + 1
    return {"entries": len(entries), "capacity": constants()["STATE_SLOTS"], "overflow": overflow,
            "expired": expired, "by_state": by}


def ring_state_counters(logged: int, summary: dict) -> dict:
    """A P4 card's ``counters`` ``ring`` (of ``logged`` headers ever logged) and ``state`` (from
    :func:`summarize_state`'s ``summary``), in the dpdk target's shape."""
    size = constants()["RING_SLOTS"]
    return {"ring": {"size": size, "count": min(logged, size), "logged": logged},
            "state": {k: summary[k] for k in ("entries", "capacity", "overflow", "expired")}}


def dump_state(entries: list[dict]) -> list[dict]:
    """Live entries (:func:`decode_state_map`) in the dpdk target's ``state_dump`` keys: ``client``,
    ``msg_id``, ``type``, ``state``, ``shard``, the request's ``num_tables``, ``num_keys``,
    ``value_len``, ``msg_len``, ``frag_count``, fragments, frames and body bytes each way,
    ``first_ns``/``last_ns`` (ns since the card started) and the register ``slot``."""
    from embnic.client_lib.consts import MsgType

    return [{"client": e["client_id"], "msg_id": e["msg_id"],
             "type": MsgType(e["msg_type"]).name if e["msg_type"] in MsgType._value2member_map_ else e["msg_type"],
             "state": e["state"], "shard": e["shard_id"], "num_tables": e["num_tables"], "num_keys": e["num_keys"],
             "value_len": e["value_len"], "msg_len": e["msg_len"], "frag_count": e["frag_count"],
             "frags_in": e["frags_in"], "frags_out": e["frags_out"], "frames_in": e["frames_in"],
             "bytes_in": e["bytes_in"], "frames_out": e["frames_out"], "bytes_out": e["bytes_out"],
             "first_ns": e["first_us"] * 1000, "last_ns": e["last_us"] * 1000, "slot": e["slot"]} for e in entries]


def mac_int(mac: str) -> int:
    """``"02:00:00:00:00:01"`` → the 48-bit value the P4 tables take."""
    return int(mac.replace(":", ""), 16)


def ip_int(ip: str) -> int:
    """``"10.0.0.1"`` → the 32-bit value the P4 tables take."""
    return int(ipaddress.IPv4Address(ip))


def peer_params(p) -> tuple[int, int, int, int]:
    """The action parameters of peer ``p``'s entry in its P4 table (``forward_to_server`` /
    ``forward_to_client``): port, MAC, IPv4 and UDP port as ints."""
    return p.port, mac_int(p.mac), ip_int(p.ip), p.udp_port


def peers_of(kind: str, entries: list[dict]) -> list:
    """The :class:`~embnic.control.targets.base.Peer` of ``kind`` each entry (``{key, params}``, :func:`peer_params`)
    of its P4 table holds, by id."""
    from embnic.control.targets.base import Peer

    return sorted((Peer(kind, e["key"][0], e["params"][0], e["params"][1].to_bytes(6, "big").hex(":"),
                        str(ipaddress.IPv4Address(e["params"][2])), e["params"][3]) for e in entries),
                  key=lambda x: x.id)


#: the P4 card's counters (p4/ingress.p4, p4/state_map.p4), all zeroed by a counter reset
COUNTERS = ("rx_frames", "tx_frames", "drop_reasons", "frames_by_type", "messages_completed", "completed_by_shard",
            "arp_replies", "state_expired")


def card_counters(get, nb_ports: int, shards=()) -> dict:
    """A P4 card's counters in the DPDK card's ``counters`` shape (docs/control-socket.md):
    ``ports``, ``types``, ``drops`` (every reason), ``arp``, ``completed`` (by reply type: every
    type of ``consts.REPLY_TYPES``), ``shards`` (``[{shard, completed}]`` of ``shards``) and
    ``state`` (``expired``); ``get(name, index, nbytes=False)`` reads one cell of a counter."""
    from embnic.client_lib.consts import REPLY_TYPES, MsgType

    return {
        "ports": [{"port": p, "rx_frames": get("rx_frames", p), "rx_bytes": get("rx_frames", p, True),
                   "tx_frames": get("tx_frames", p), "tx_bytes": get("tx_frames", p, True)} for p in range(nb_ports)],
        "types": {t.name: get("frames_by_type", t.value) for t in MsgType},
        "drops": {r: get("drop_reasons", i + 1) for i, r in enumerate(drop_reasons())},
        "arp": {"replies": get("arp_replies", 0)},
        "completed": {t.name: get("messages_completed", t.value) for t in sorted(REPLY_TYPES)},
        "shards": [{"shard": s, "completed": get("completed_by_shard", s)} for s in shards],
        "state": {"expired": get("state_expired", 0)},
    }
