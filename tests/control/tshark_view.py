"""tshark's view of embnic frames and the oracle it is compared with, for the tests of the
generated Wireshark dissector (tests/control/test_wireshark.py, test_wireshark_card.py): the real
tshark (Debian's ``tshark``) with the shipped plug-in loaded by ``-X lua_script:`` and two passes
(``-2``) (:func:`run_tshark`); every receiver's verdict from a header alone
(:func:`receiver_verdict`); what the plug-in knows at each frame of a capture (:class:`FirstPass`)
and the fields it must then show, by the Scapy layer and the codec (:func:`check_frame`).
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from embnic.client_lib import codec, consts, reassembly
from embnic.client_lib.consts import MsgType
from embnic.client_lib.protocol import Embnic, EmbnicDirEntry
from embnic.control import wireshark

import clientref

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / wireshark.SHIPPED_PATH
HEADER_NAMES = [n for n, _, _ in consts.HEADER_FIELDS]
DIR_FIELDS = [f"embnic.table.{n}" for n, _ in consts.DIR_ENTRY_FIELDS]
ENTRY_FIELDS = [f"embnic.entry.{n}" for n, _ in consts.SIZE_ENTRY_FIELDS]
BODY_FIELDS = (["embnic.key", "embnic.key.table", "embnic.row.table", "embnic.row.value", "embnic.gradient.table",
                "embnic.gradient.value", "embnic.partial", "embnic.undecoded", "embnic.held.fragment",
                "embnic.held.missing", "embnic.directory_in"] + DIR_FIELDS + ENTRY_FIELDS)
LINK_FIELDS = ["embnic.request_in", "embnic.response_in", "embnic.time", "embnic.drop_reason"]
GSO_FIELDS = ["embnic.gso_frame", "embnic.gso_size"]
EXPERT_FIELDS = ["_ws.expert.message", "_ws.expert.severity", "_ws.expert.group"]


def _tshark() -> str:
    exe = shutil.which("tshark")
    if exe is None:
        pytest.skip("tshark not installed: apt-get install tshark (scripts/apt-packages.txt; "
                    "scripts/install-deps.sh answers its debconf question)")
    return exe


def run_tshark(pcap: Path, home: Path, *extra: str) -> list[dict]:
    """Every frame of ``pcap`` dissected by tshark with the shipped plug-in, two passes: one
    dict per frame of the embnic fields, links, expert infos and ``frame.*`` fields asked."""
    fields = (["frame.number", "frame.time_epoch", "frame.protocols"] + [f"embnic.{n}" for n in HEADER_NAMES]
              + BODY_FIELDS + LINK_FIELDS + GSO_FIELDS + EXPERT_FIELDS)
    cmd = [_tshark(), "-n", "-r", str(pcap), "-X", f"lua_script:{SHIPPED}", "-2", "-T", "json", *extra]
    for f in fields:
        cmd += ["-e", f]
    # a HOME of its own: no personal plug-ins folder (a second copy of the plug-in) or prefs
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Lua" not in r.stderr and "lua" not in r.stderr, r.stderr[-2000:]
    return [x["_source"]["layers"] for x in json.loads(r.stdout)]


def receiver_verdict(payload: bytes) -> str | None:
    """The drop reason every receiver gives a UDP payload from its header alone (the codec's
    header checks, then the fragment's geometry: the client's ``fragment_size``), or None."""
    try:
        reassembly.fragment_size(codec.parse_header(payload))
    except codec.FrameError as e:
        return e.reason
    return None


def ints(layers: dict, field: str) -> list[int]:
    return [int(v, 0) for v in layers.get(field, [])]


def _f32(text: str) -> np.float32:
    return np.float32(float(text))


def _same_values(got: list[str], want: np.ndarray) -> bool:
    """tshark's value strings are the float32s of ``want`` (NaN: any NaN)."""
    want = np.asarray(want, dtype=np.float32).ravel()
    if len(got) != len(want):
        return False
    g = np.array([_f32(s) for s in got], dtype=np.float32)
    return bool(np.all((g == want) | (np.isnan(g) & np.isnan(want))))


def udp_payload(p) -> bytes | None:
    """The UDP payload of a Scapy packet, cut at the UDP length (no Ethernet padding)."""
    if UDP not in p:
        return None
    raw = bytes(p[UDP])
    return raw[8:max(8, min(len(raw), p[UDP].len or 0))]


def _overlap(g0: int, n: int, esz: int, lo: int, hi: int) -> range:
    """Indices ``i`` of the elements ``[g0 + i*esz, g0 + (i+1)*esz)``, ``0 <= i < n``, that
    overlap body bytes ``[lo, hi)``."""
    if esz <= 0 or n <= 0:
        return range(0)
    first = max(0, (lo - g0) // esz)
    return range(first, max(first, min(n, -(-(hi - g0) // esz))))


class FirstPass:
    """What the plug-in knows at each valid frame of a capture, taken in capture order (the
    oracle of its first pass, from docs/protocol.md and the codec): the exchange a frame belongs
    to (by (client id, message id); a reply answers the open request Scapy's ``answers`` says;
    a request after its reply began opens a new one) and the directory of its message — every
    byte of it seen at or before this frame in frames of the same message (equal
    ``consts.MESSAGE_FIELDS``) — or, for a reply, of its request's message."""

    def __init__(self):
        self.open_tx: dict = {}
        self.msgs: dict = {}

    def frame(self, n: int, h: codec.Header, pkt, payload: bytes) -> dict:
        key = (h.client_id, h.msg_id)
        tx = self.open_tx.get(key)
        st = {"kind": "orphan", "tx": None, "msg": None}
        if h.msg_type in consts.REQUEST_TYPES:
            if tx is None or tx["reply"] is not None or tx["type"] != h.msg_type:
                tx = self.open_tx[key] = {"first": n, "type": h.msg_type, "reply": None, "pkt": pkt, "msg": None}
            st.update(kind="request", tx=tx)
            if h.msg_type in consts.DATA_REQUEST_TYPES:
                tx["msg"] = st["msg"] = self._collect(n, h, payload)
        elif tx is not None and pkt.answers(tx["pkt"]):
            tx["reply"] = tx["reply"] or n
            st.update(kind="reply", tx=tx, msg=tx["msg"])
        st["dir"] = st["msg"]["dir"] if st["msg"] else None
        return st

    def _collect(self, n: int, h: codec.Header, payload: bytes) -> dict:
        size = consts.DIR_ENTRY * h.num_tables
        m = self.msgs.setdefault(tuple(getattr(h, f) for f in consts.MESSAGE_FIELDS), {
            "h": h, "bytes": bytearray(size), "seen": [False] * size, "dir": None})
        if m["dir"] is None:
            frag = payload[consts.HDR_LEN:]
            for i in range(h.frag_offset, min(size, h.frag_offset + len(frag))):
                if not m["seen"][i]:
                    m["bytes"][i], m["seen"][i] = frag[i - h.frag_offset], True
            if all(m["seen"]):
                raw = bytes(m["bytes"])
                try:  # the request's directory against its header, as a host reads it
                    rb = codec.parse_request_body(h, raw + bytes(consts.KEY_SIZE * h.num_keys))
                    fault = None
                except codec.DirectoryError as e:
                    rb, fault = None, str(e)
                m["dir"] = {"frame": n, "raw": raw, "rb": rb, "fault": fault}
        return m


#: message types whose bodies are read with a directory (sections grouped per table)
TABLE_TYPES = {t for t, ss in consts.BODY_LAYOUT.items() if any(s.per_table for s in ss)}


def directory_for(h: codec.Header, st: dict):
    """(the RequestBody of the directory the frame is read with or None, fault or None)."""
    d = st["dir"]
    if d is None or h.msg_type not in TABLE_TYPES:
        return None, None
    if d["fault"]:
        return None, d["fault"]
    e = d["rb"].directory
    if (len(e), int(e["num_keys"].sum()), codec.value_len_of(e)) != (h.num_tables, h.num_keys, h.value_len):
        return None, "does not fit this reply"
    return d["rb"], None


def expected_body(h: codec.Header, payload: bytes, st: dict) -> dict:
    """The plug-in's body fields of one valid frame by the codec: this fragment's whole
    elements, its cut ones (``partial``, hex), the tables of the groups it shows, undecoded
    row bytes, the fragments an UPDATE_NACK holds (and misses)."""
    frag = payload[consts.HDR_LEN:]
    lo, hi = h.frag_offset, h.frag_offset + len(frag)
    body = bytearray(h.msg_len)
    body[lo:hi] = frag
    body = bytes(body)
    rb, fault = directory_for(h, st)
    want = collections.defaultdict(list)
    partial = []

    def run(item, g0, n, esz, value, table=None):
        if table is not None and _overlap(g0, n, esz, lo, hi):
            want[f"{item}.table"].append(table)
        for i in _overlap(g0, n, esz, lo, hi):
            a, b = g0 + i * esz, g0 + (i + 1) * esz
            if lo <= a and b <= hi:
                want[item].append(value(i))
            else:
                partial.append((max(a, lo), body[max(a, lo):min(b, hi)].hex()))

    def rows(item, g0, section_len):
        if rb is None:
            a, b = max(g0, lo), min(g0 + section_len, hi)
            if a < b:
                want["undecoded"].append(body[a:b].hex())
            return
        d = rb.directory
        for t in range(len(d)):
            vals = codec.table_values(body[g0:g0 + section_len], rb, t)
            run(item, g0 + int(rb.value_offsets[t]), int(d["num_keys"][t]), vals.itemsize * vals.shape[1],
                lambda i, v=vals: v[i], int(d["table_id"][t]))

    t, T, n = h.msg_type, h.num_tables, h.num_keys
    if t in consts.DATA_REQUEST_TYPES:
        entries = np.frombuffer(body, codec.DIR_DTYPE, count=T)
        run("table", 0, T, consts.DIR_ENTRY, lambda i: entries[i])
        base = consts.DIR_ENTRY * T
        keys = clientref.body_to_keys(body, n, base)
        if rb is None:
            run("key", base, n, consts.KEY_SIZE, lambda i: keys[i])
        else:
            ko, d = rb.key_offsets, rb.directory
            for j in range(T):
                run("key", base + consts.KEY_SIZE * int(ko[j]), int(d["num_keys"][j]), consts.KEY_SIZE,
                    lambda i, k0=int(ko[j]): keys[k0 + i], int(d["table_id"][j]))
        if t == MsgType.UPDATE_REQ:
            rows("gradient", base + consts.KEY_SIZE * n, h.value_len)
    elif t == MsgType.LOOKUP_REPLY:
        rows("row", 0, h.value_len)
    elif t == MsgType.SIZE_REQ:
        entries = codec.body_to_size_entries(body, n)
        run("entry", 0, n, consts.SIZE_ENTRY, lambda i: entries[i])
    elif t == MsgType.UPDATE_NACK and lo == 0 and hi >= consts.NACK_LEN:
        held = clientref.nack_held(body, consts.MAX_FRAGS)
        want["held.fragment"] = [int(i) for i in np.flatnonzero(held)]
        if st["msg"] is not None:
            fc = st["msg"]["h"].frag_count
            want["held.missing"] = [i for i in range(fc) if not held[i]]
    want["partial"] = [x for _, x in sorted(partial)]
    want["fault"] = fault
    want["directory_in"] = [st["dir"]["frame"]] if rb is not None else []
    return want


def check_frame(layers: dict, payload: bytes, st: dict) -> dict:
    """tshark's embnic fields of one valid frame equal the Scapy layer's header and directory
    entries and :func:`expected_body`; returns the expectation."""
    pkt = Embnic(payload)
    for name in HEADER_NAMES:
        assert ints(layers, f"embnic.{name}") == [int(getattr(pkt, name))], name
    scapy_dir = []
    layer = pkt.payload
    while isinstance(layer, EmbnicDirEntry):
        scapy_dir.append(layer)
        layer = layer.payload
    for name, _ in consts.DIR_ENTRY_FIELDS:
        got = ints(layers, f"embnic.table.{name}")
        assert got[:len(scapy_dir)] == [int(getattr(e, name)) for e in scapy_dir], name
    h = codec.parse_header(payload)
    want = expected_body(h, payload, st)
    for name, _ in consts.DIR_ENTRY_FIELDS:
        assert ints(layers, f"embnic.table.{name}") == [int(e[name]) for e in want["table"]], name
    assert ints(layers, "embnic.key") == [int(k) for k in want["key"]]
    for item in ("key", "row", "gradient"):
        assert ints(layers, f"embnic.{item}.table") == want[f"{item}.table"], item
    for item in ("row", "gradient"):
        got = layers.get(f"embnic.{item}.value", [])
        assert _same_values(got, np.concatenate([np.ravel(r) for r in want[item]]) if want[item] else np.zeros(0)), item
    for name, _ in consts.SIZE_ENTRY_FIELDS:
        assert ints(layers, f"embnic.entry.{name}") == [int(e[name]) for e in want["entry"]], name
    assert ints(layers, "embnic.held.fragment") == want["held.fragment"]
    assert ints(layers, "embnic.held.missing") == want["held.missing"]
    assert [s.replace(":", "") for s in layers.get("embnic.partial", [])] == want["partial"]
    assert [s.replace(":", "") for s in layers.get("embnic.undecoded", [])] == want["undecoded"]
    assert ints(layers, "embnic.directory_in") == want["directory_in"]
    warned = [m for m in layers.get("_ws.expert.message", []) if "directory" in m.lower()]
    assert len(warned) == (1 if want["fault"] else 0), (warned, want["fault"])
    assert "embnic.drop_reason" not in layers
    return want


def first_pass(pcap_frames: list[tuple[int, bytes]]) -> dict:
    """:class:`FirstPass` over ``(frame number, UDP payload)`` of the valid frames, in order:
    frame number -> its state."""
    fp, out = FirstPass(), {}
    for n, payload in pcap_frames:
        assert receiver_verdict(payload) is None, n
        h = codec.parse_header(payload)
        out[n] = fp.frame(n, h, Embnic(payload), payload)
    return out


def udp_frames(payloads: list[bytes], sport: int = 40000, dport: int = consts.UDP_PORT) -> list[bytes]:
    """Each UDP payload as one Ethernet/IPv4/UDP frame (10.0.0.1:``sport`` → 10.0.0.2:``dport``)."""
    return [bytes(Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=sport, dport=dport) / Raw(p))
            for p in payloads]
