"""Trace record and replay: the client frames of K training batches as a pcap, replayed into the card.

How: docs/testbed.md, "Trace record and replay".
"""
from __future__ import annotations

import collections
import datetime
import hashlib
import json
import os
import re
import select
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from embnic.client_lib import codec, consts
from embnic.client_lib.config import load_config
from embnic.client_lib.consts import MsgType
from embnic.control.errors import USAGE, OperationalError, require_program

from embnic.testbed.training import report as R
from embnic.testbed.net import topology as T
from embnic.control import pcap as pcap_file
from embnic.control.netns import exec_argv

TRACE_FORMAT = "embnic-trace/1"


# --------------------------------------------------------------------------- capture
_ETH_P_ALL = 0x0003
_SOL_PACKET = 263
_PACKET_STATISTICS = 6
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_PACKET_OUTGOING = 4
_RCVBUF = 256 << 20


def udp_payload(frame: bytes) -> tuple[int, int, bytes] | None:
    """(UDP source port, destination port, payload) of an Ethernet/IPv4/UDP frame, else None."""
    if len(frame) < 42 or frame[12:14] != b"\x08\x00" or frame[23] != 17:
        return None
    ihl = (frame[14] & 0x0F) * 4
    u = 14 + ihl
    if len(frame) < u + 8:
        return None
    sport, dport, ulen = struct.unpack_from("!HHH", frame, u)
    return sport, dport, frame[u + 8:u + ulen] if ulen >= 8 else b""


class Capture:
    """Every frame on one interface (both directions) with kernel timestamps, read by a thread.

    Create it inside the interface's namespace (:func:`~embnic.testbed.net.topology.in_netns`);
    the socket stays there. ``frames`` holds ``(t_ns, outgoing, frame)`` for embnic frames
    (UDP to or from port ``udp_port``); ``on_frame`` (optional) is called with each.

    Raises:
        OSError: the interface does not exist here.
    """

    def __init__(self, ifname: str, udp_port: int = consts.UDP_PORT, on_frame: Callable | None = None):
        self.port = udp_port
        self.on_frame = on_frame
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), _RCVBUF)
        except PermissionError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
        self.sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        self.sock.bind((ifname, _ETH_P_ALL))
        self.sock.setblocking(False)
        self._stats()  # reset the kernel's counters
        self.frames: list[tuple[int, bool, bytes]] = []
        self.kernel_drops = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"capture-{ifname}", daemon=True)

    def _stats(self) -> tuple[int, int]:
        return struct.unpack("II", self.sock.getsockopt(_SOL_PACKET, _PACKET_STATISTICS, 8))

    def start(self) -> "Capture":
        self._thread.start()
        return self

    def _read_available(self) -> None:
        cms = socket.CMSG_SPACE(16)
        while True:
            try:
                data, anc, _flags, addr = self.sock.recvmsg(65536, cms)
            except (BlockingIOError, InterruptedError):
                return
            u = udp_payload(data)
            if u is None or (u[0] != self.port and u[1] != self.port):
                continue
            t_ns = time.time_ns()
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == _SO_TIMESTAMPNS and len(cdata) >= 16:
                    sec, nsec = struct.unpack_from("qq", cdata)
                    t_ns = sec * 1_000_000_000 + nsec
            rec = (t_ns, addr[2] == _PACKET_OUTGOING, data)
            self.frames.append(rec)
            if self.on_frame is not None:
                self.on_frame(rec)

    def _run(self) -> None:
        while not self._stop.is_set():
            r, _, _ = select.select([self.sock], [], [], 0.05)
            if r:
                self._read_available()

    def stop(self) -> list[tuple[int, bool, bytes]]:
        """Stop the reader, read what is left; returns ``frames``. ``kernel_drops`` counts frames
        the kernel dropped because the socket buffer was full. Idempotent."""
        if self._stop.is_set():
            return self.frames
        self._stop.set()
        self._thread.join()
        self._read_available()
        self.kernel_drops += self._stats()[1]
        self.sock.close()
        return self.frames


class TraceError(OperationalError):
    """A trace cannot be recorded or replayed (the message names the fix; exit 1)."""


class TraceUsageError(TraceError):
    """The request is wrong (a usage error: the CLI exits 2): the file given as a trace is no
    trace (not a classic pcap, or no embnic request in it), or a --client the config lacks."""

    category = USAGE


# --------------------------------------------------------------------------- pcap I/O
def read_pcap(path: str | os.PathLike) -> list[tuple[float, bytes]]:
    """``(timestamp s, frame bytes)`` of every packet in a pcap (:func:`~embnic.control.pcap.read_pcap`).

    Raises:
        TraceError: unreadable.
        TraceUsageError: not a classic pcap file (exit 2).
    """
    try:
        return pcap_file.read_pcap(path)
    except OSError as e:
        raise TraceError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise TraceUsageError(f"{e}: give a trace recorded by `embnic trace record`") from None


def parse_requests(frames: list[tuple[float, bytes]]) -> tuple[dict, dict, int]:
    """Group the embnic request frames of a trace.

    Returns:
        (requests ``{(client_id, msg_id): {"type", "shard", "tables", "frags", "frag_count",
        "keys"}}``, frames per client ``{client_id: [(ts, frame), ...]}``, #frames that are
        not embnic requests).
    """
    reqs: dict = {}
    per_client: dict = collections.defaultdict(list)
    other = 0
    for ts, f in frames:
        u = udp_payload(f)
        if u is None or u[1] != consts.UDP_PORT:
            other += 1
            continue
        try:
            h = codec.parse_header(u[2], expect="request")
        except codec.FrameError:
            other += 1
            continue
        key = (h.client_id, h.msg_id)
        r = reqs.setdefault(key, {"type": h.msg_type, "shard": h.shard_id, "tables": h.num_tables, "frags": set(),
                                  "frag_count": h.frag_count, "keys": h.num_keys})
        r["frags"].add(h.frag_index)
        per_client[h.client_id].append((ts, f))
    return reqs, dict(per_client), other


def check_version(pcap: Path, frames: list[tuple[float, bytes]], sidecar: dict | None) -> None:
    """Refuse a trace of another protocol version than this embnic's (:data:`consts.VERSION`):
    its card and shards drop every such frame as ``bad_version``, so replaying it would measure
    nothing. Read from the sidecar's ``protocol_version`` or, without one, the first embnic frame.

    Raises:
        TraceUsageError: naming the version and how to get a trace of this one.
    """
    ver = (sidecar or {}).get("protocol_version")
    if ver is None:  # the first embnic frame's
        ver = next((u[2][2] for _, f in frames if (u := udp_payload(f)) is not None and u[1] == consts.UDP_PORT
                    and len(u[2]) >= 3 and u[2][:2] == b"EM"), None)
    if ver is not None and ver != consts.VERSION:
        raise TraceUsageError(f"{pcap} holds embnic protocol version {ver} frames; this embnic speaks version "
                              f"{consts.VERSION} (docs/protocol.md) and its card drops them as bad_version: "
                              "record the trace again with `embnic trace record`")


# --------------------------------------------------------------------------- config check
class ConfigMismatch(TraceError):
    """The trace was recorded with another config (a usage error: the CLI exits 2)."""

    category = USAGE


def config_digest(cfg) -> str:
    """sha256 of the config's content that shapes the traffic: every section except
    ``[control]`` (deployment details), as canonical JSON — comments and formatting do not count."""
    raw = {k: v for k, v in cfg.raw.items() if k != "control"}
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()


def read_sidecar(pcap: str | os.PathLike) -> dict | None:
    """The sidecar ``T.json`` of trace ``T.pcap`` (None if there is none or it is unreadable)."""
    try:
        return json.loads(Path(pcap).with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None


def truncation_warning(pcap: str | os.PathLike, n_frames: int, sidecar: dict | None,
                       tail_bytes: int = 0) -> str | None:
    """A warning when trace ``pcap`` is cut short: it holds fewer frames (``n_frames``) than its
    sidecar says were recorded, or it ends in ``tail_bytes`` bytes that form no whole record
    (:func:`embnic.control.pcap.partial_tail`; the pcap reader leaves them out). None otherwise."""
    want = (sidecar or {}).get("frames")
    fix = "only those are replayed (record it again with `embnic trace record`)"
    if isinstance(want, int) and n_frames < want:
        return (f"warning: {Path(pcap).name} holds {n_frames} frames but its sidecar says {want} were recorded: "
                f"the file is cut short; {fix}")
    if tail_bytes:
        return (f"warning: {Path(pcap).name} ends in {tail_bytes} bytes that form no whole frame record: "
                f"the file is cut short after {n_frames} frames; {fix}")
    return None


def check_config(sidecar: dict | None, config: str | os.PathLike, cfg) -> dict:
    """Compare the config a trace was recorded with (its sidecar) with ``config``.

    Uses the sidecar's ``config_digest`` (:func:`config_digest`) when it has one, else its
    ``config_sha256`` (sha256 of the file's bytes, older traces).

    Returns:
        ``{"recorded_with", "match": bool or None (no sidecar or no hash), "compared": "digest" |
        "file_sha256" | None}``.
    """
    sidecar = sidecar or {}
    rec = sidecar.get("config")
    if sidecar.get("config_digest"):
        return {"recorded_with": rec, "match": sidecar["config_digest"] == config_digest(cfg), "compared": "digest"}
    if sidecar.get("config_sha256"):
        mine = hashlib.sha256(Path(config).read_bytes()).hexdigest()
        return {"recorded_with": rec, "match": sidecar["config_sha256"] == mine, "compared": "file_sha256"}
    return {"recorded_with": rec, "match": None, "compared": None}


# --------------------------------------------------------------------------- record
def record(config: str | os.PathLike, out: str | os.PathLike, *, batches: int, data: str | os.PathLike | None = None,
           batch_size: int = 256, clients: list[int] | None = None, name: str = "embrec",
           rdir: Path | None = None, progress: bool | None = None, log: Callable[[str], None] = print) -> dict:
    """Record the client frames of ``batches`` training batches per client to ``out`` (pcap) and
    the sidecar ``out`` with suffix ``.json`` (docs/testbed.md, "Trace record and replay").

    Returns:
        the sidecar dict.

    Raises:
        NeedsRoot, TestbedError: as :meth:`Testbed.up`.
        TraceUsageError: a client id not in the config (exit 2).
        TraceError: training failed, the capture lost frames.
    """
    from embnic.client_lib.client import EmbeddingClient, EmbnicError

    from embnic.testbed.training.train import load_training_data, train

    T.require_net_admin("trace record (it brings the namespace testbed up)")
    cfg = load_config(config)
    ids = [c.id for c in cfg.clients]
    clients = list(clients) if clients else ids
    bad = [c for c in clients if c not in ids]
    if bad:
        raise TraceUsageError(f"--client {bad[0]}: no client {bad[0]} in {config} (clients: {', '.join(map(str, ids))})")
    topo = T.Topology.from_config(cfg, name)
    tr, _ = load_training_data(cfg, data)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tb = T.Testbed(topo, rdir)
    tb.up(owner="trace record")
    caps: dict[int, Capture] = {}
    stats = {}
    t0 = time.monotonic()
    try:
        for cid in clients:
            with T.in_netns(topo.client_ns(cid)):
                caps[cid] = Capture(topo.link(f"c{cid}").peer_if, cfg.udp_port).start()
        with R.Progress(batches * len(clients), "record", enabled=progress) as bar:
            for j, cid in enumerate(clients):
                with T.in_netns(topo.client_ns(cid)):
                    client = EmbeddingClient(tb.cfg, cid)
                with client:
                    start = (j * batches * batch_size) % len(tr.labels)
                    try:
                        train(tb.cfg, tr[start:], steps=batches, batch_size=batch_size, backend=client,
                              progress=lambda i, loss, cid=cid: bar.update(1, client=cid, loss=f"{loss:.4f}"))
                    except EmbnicError as e:
                        raise TraceError(f"client {cid} failed while recording: {e} ({tb.why_no_answer()})") from None
                stats[cid] = client.stats.as_dict()
        time.sleep(0.05)
    finally:
        for cap in caps.values():
            cap.stop()
        tb.down()
    duration = time.monotonic() - t0
    drops = {cid: cap.kernel_drops for cid, cap in caps.items()}
    if any(drops.values()):
        raise TraceError(f"the capture lost frames ({drops}); record fewer --batches")
    frames = sorted((t, f) for cid in clients for (t, outgoing, f) in caps[cid].frames if outgoing)
    reqs, per_client, other = parse_requests(frames)
    frames = [(t, f) for t, f in frames if (u := udp_payload(f)) is not None and u[1] == cfg.udp_port]
    pcap_file.write_pcap(out, [f for _, f in frames], times=[t / 1e9 for t, _ in frames])
    by_type = collections.Counter(MsgType(r["type"]).name for r in reqs.values())
    sidecar = {
        "format": TRACE_FORMAT,
        "pcap": out.name,
        "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": str(Path(config).resolve()),
        "config_sha256": hashlib.sha256(Path(config).read_bytes()).hexdigest(),
        "config_digest": config_digest(cfg),
        "data": str(data or "shipped Criteo sample (testbed/training/data)"),
        "batches": batches,
        "batch_size": batch_size,
        "clients": clients,
        "protocol_version": consts.VERSION,
        "udp_port": cfg.udp_port,
        "mtu": cfg.mtu,
        "frames": len(frames),
        "bytes": sum(len(f) for _, f in frames),
        "messages": len(reqs),
        "messages_by_type": dict(by_type),
        "by_client": {str(c): {"frames": len(per_client.get(c, [])),
                               "messages": sum(1 for (cc, _) in reqs if cc == c)} for c in clients},
        "retransmits": sum(s.get("retransmits", 0) for s in stats.values()),
        "incomplete_messages": sum(1 for r in reqs.values() if len(r["frags"]) < r["frag_count"]),
        "duration_s": round(frames[-1][0] / 1e9 - frames[0][0] / 1e9, 3) if frames else 0.0,
        "wall_s": round(duration, 2),
        "client_stats": {str(c): s for c, s in stats.items()},
        "testbed": name,
    }
    R.write_json(out.with_suffix(".json"), sidecar)
    log(f"recorded {len(frames)} frames ({len(reqs)} request messages: "
        + ", ".join(f"{k} {v}" for k, v in sorted(by_type.items()))
        + f") from client(s) {', '.join(map(str, clients))} to {out} (+ {out.with_suffix('.json').name})")
    return sidecar


# --------------------------------------------------------------------------- replay
_REPLY_FOR = {MsgType.LOOKUP_REQ: (MsgType.LOOKUP_REPLY, MsgType.ERROR),
              MsgType.UPDATE_REQ: (MsgType.UPDATE_ACK, MsgType.ERROR)}


class _ReplyTracker:
    """Per-client reply reassembly and matching against the trace's requests (thread-safe enough:
    one capture thread per client feeds one tracker)."""

    def __init__(self, cid: int, reqs: dict):
        from embnic.client_lib.reassembly import Reassembler

        self.cid = cid
        self.reqs = {k: v for k, v in reqs.items() if k[0] == cid}
        self.reasm = Reassembler(max_pending=1 << 16, timeout_s=30.0, expect="reply")
        self.first_sent: dict[int, int] = {}
        self.done: dict[int, tuple[int, int, int]] = {}  # msg_id -> (t_ns, reply type, status)
        self.sent_t: list[int] = []
        self.sent_frames = self.reply_frames = self.unexpected = self.mismatched = 0

    def feed(self, rec) -> None:
        t_ns, outgoing, frame = rec
        u = udp_payload(frame)
        if u is None:
            return
        if outgoing:
            try:
                h = codec.parse_header(u[2], expect="request")
            except codec.FrameError:
                return
            self.sent_frames += 1
            self.sent_t.append(t_ns)
            self.first_sent.setdefault(h.msg_id, t_ns)
            return
        self.reply_frames += 1
        try:
            msg = self.reasm.feed(u[2])
        except Exception:  # noqa: BLE001 - counted by the reassembler's drops
            return
        if msg is None:
            return
        h = msg.header
        r = self.reqs.get((h.client_id, h.msg_id))
        if r is None or h.client_id != self.cid:
            self.unexpected += 1
            return
        if h.msg_type not in _REPLY_FOR[MsgType(r["type"])]:
            self.mismatched += 1
            return
        self.done.setdefault(h.msg_id, (t_ns, h.msg_type, h.status))


def _tcpreplay_argv(ns: str, ifname: str, pcap: Path, pps: float | None, topspeed: bool) -> list[str]:
    speed = ["--topspeed"] if topspeed else [f"--pps={pps:g}"] if pps else []
    return exec_argv(ns, ["tcpreplay", "--intf1", ifname, "--preload-pcap", *speed, str(pcap)])


#: what tcpreplay's summary says: (pattern, the fields its groups give, their types)
_TCPREPLAY_FIGURES = ((r"Actual:\s+(\d+) packets \((\d+) bytes\) sent in ([\d.]+) seconds",
                       ("packets", "bytes", "seconds"), (int, int, float)),
                      (r"Rated:.*?([\d.]+) pps", ("pps",), (float,)), (r"Failed packets:\s+(\d+)", ("failed",), (int,)))


def _parse_tcpreplay(text: str) -> dict:
    out = {}
    for pattern, names, types in _TCPREPLAY_FIGURES:
        if m := re.search(pattern, text):
            out.update((n, t(g)) for n, t, g in zip(names, types, m.groups()))
    return out


def replay(pcap: str | os.PathLike, config: str | os.PathLike, *, rate: float | None = None,
           topspeed: bool = False, out: str | os.PathLike = "out/replay", name: str = "embrpl",
           rdir: Path | None = None, progress: bool | None = None, wait_s: float = 5.0, force: bool = False,
           log: Callable[[str], None] = print, target: str = "dpdk") -> dict:
    """Replay a recorded trace into the card of a fresh testbed and measure (docs/testbed.md).

    Args:
        rate: total frames/s over all clients (split evenly; None: the recorded timing).
        topspeed: as fast as tcpreplay can.
        wait_s: how long to wait for missing replies after the last frame was sent.
        force: replay even if the trace's sidecar says it was recorded with another config.
        target: the card: ``dpdk`` (embnic-dp) or ``bmv2`` (the P4 program on simple_switch).

    Returns:
        the report, also ``OUT/report.json`` (its fields: docs/testbed.md, "Trace record and replay").

    Raises:
        NeedsRoot, TestbedError: as :meth:`Testbed.up`.
        ConfigMismatch: the sidecar says the trace was recorded with another config (unless
            ``force``); checked before the testbed comes up.
        TraceUsageError: the file is not a pcap, or holds no embnic request (exit 2).
        ConfigMismatch: also when the trace has frames of a client the config lacks.
        TraceError: unreadable pcap, tcpreplay failing.
        MissingDependencyError: tcpreplay is not installed.
    """
    T.require_net_admin("replay (it brings the namespace testbed up)")
    require_program("tcpreplay", "apt-get install tcpreplay")
    pcap = Path(pcap)
    frames, reqs, per_client, other, cfg, cc = _load_trace(pcap, config, force, log)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    topo = T.Topology.from_config(cfg, name)
    clients = sorted(per_client)
    split = _split_per_client(out / "replay-pcaps", per_client)
    total = len(reqs)
    trackers = {cid: _ReplyTracker(cid, reqs) for cid in clients}
    tb = T.Testbed(topo, rdir, target=target)
    tb.up(owner="replay")
    caps: dict[int, Capture] = {}
    sinks = []
    try:
        for cid in clients:
            me = tb.cfg.client(cid)
            with T.in_netns(topo.client_ns(cid)):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # swallows replies (no ICMP back)
                caps[cid] = Capture(topo.link(f"c{cid}").peer_if, cfg.udp_port, on_frame=trackers[cid].feed)
            s.bind((me.ip, me.port))
            sinks.append(s)
        tb.target.reset_counters()
        for cap in caps.values():
            cap.start()
        log(f"replaying {len(frames) - other} frames ({total} request messages) of {pcap.name} from client(s) "
            f"{', '.join(map(str, clients))} with tcpreplay "
            + ("at top speed" if topspeed else f"at {rate:g} frames/s" if rate else "at the recorded timing"))
        pps = (rate / len(clients)) if rate else None
        procs = {cid: subprocess.Popen(_tcpreplay_argv(topo.client_ns(cid), topo.link(f"c{cid}").peer_if,
                                                       split[cid], pps, topspeed),
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for cid in clients}
        _wait_replies(procs, trackers, total, wait_s, progress)
        tcpr = _tcpreplay_results(procs)
        time.sleep(0.05)
        for cap in caps.values():
            cap.stop()
        dead = tb.dead_nodes()
        card_dead = any(d["role"] == "card" for d in dead)
        counters, state_summary = ({}, None) if card_dead else (tb.target.counters(), tb.target.state_summary())
    finally:
        for cap in caps.values():
            cap.stop()
        for s in sinks:
            s.close()
        tb.down()

    capture_drops = {str(cid): cap.kernel_drops for cid, cap in caps.items()}
    ports = {cid: cfg.client(cid).card_port for cid in clients}
    rep = replay_report(pcap, read_sidecar(pcap), reqs, trackers, counters, state_summary, tcpr, rate, topspeed,
                         other, out, ports, capture_drops, target=target)
    rep["shards"] = {str(s.id): shard_counters_from_log(tb.log_path(f"s{s.id}")) for s in cfg.shards}
    rep["config_check"] = cc
    rep["dead_nodes"] = dead
    R.write_json(out / "report.json", rep)
    for line in replay_summary(rep):
        log(line)
    return rep


def _load_trace(pcap: Path, config, force: bool, log: Callable[[str], None]) -> tuple:
    """Read the trace and check it against ``config`` before any testbed comes up: (frames, the
    request messages, frames per client, frames that are not requests, the config, the config
    check of the report). Raises as :func:`replay` says."""
    frames, sidecar = read_pcap(pcap), read_sidecar(pcap)
    check_version(pcap, frames, sidecar)
    reqs, per_client, other = parse_requests(frames)
    if not reqs:
        raise TraceUsageError(f"{pcap} holds no embnic request frames (UDP to port {consts.UDP_PORT}); "
                         "record one with `embnic trace record`")
    cfg = load_config(config)
    if (warn := truncation_warning(pcap, len(frames), sidecar, pcap_file.partial_tail(pcap))):
        log(warn)
    cc = check_config(sidecar, config, cfg)
    cc["forced"] = False
    if cc["match"] is False:
        what = f"{pcap} was recorded with config {cc['recorded_with']}, whose content differs from {config}"
        if not force:
            raise ConfigMismatch(f"{what}: replay it with `-c {cc['recorded_with']}` (the card and shards of "
                                 "another config answer with errors or not at all), or pass --force to replay anyway")
        cc["forced"] = True
        log(f"warning: {what}; replaying anyway (--force)")
    elif cc["match"] is None:
        log(f"note: no config hash for {pcap.name} ({pcap.with_suffix('.json').name} missing or without one); the "
            "config is not checked")
    ids = {c.id for c in cfg.clients}
    missing_clients = sorted(set(per_client) - ids)
    if missing_clients:
        raise ConfigMismatch(f"the trace has frames of client {missing_clients[0]}, which {config} does not have "
                         f"(clients: {', '.join(map(str, sorted(ids)))}); replay with the config it was recorded with")
    return frames, reqs, per_client, other, cfg, cc


def _split_per_client(split_dir: Path, per_client: dict) -> dict[int, Path]:
    """One pcap per client (``split_dir/client<id>.pcap``, the recorded times kept): client -> its path."""
    split_dir.mkdir(exist_ok=True)
    split = {cid: split_dir / f"client{cid}.pcap" for cid in sorted(per_client)}
    for cid, p in split.items():
        pcap_file.write_pcap(p, [f for _, f in per_client[cid]], times=[t for t, _ in per_client[cid]])
    return split


def _wait_replies(procs: dict, trackers: dict, total: int, wait_s: float, progress: bool | None) -> None:
    """Until every one of ``total`` requests has its reply, or ``wait_s`` after the last tcpreplay
    of ``procs`` exited (a progress bar of the replies meanwhile)."""
    t_start = time.monotonic()
    deadline = None
    with R.Progress(total, "replay: replies", unit="msg", enabled=progress) as bar:
        while True:
            done = sum(len(t.done) for t in trackers.values())
            sent = sum(t.sent_frames for t in trackers.values())
            el = max(time.monotonic() - t_start, 1e-9)
            bar.set(done, frames_s=f"{sent / el:.0f}")
            if deadline is None and all(p.poll() is not None for p in procs.values()):
                deadline = time.monotonic() + wait_s
            if done >= total or (deadline is not None and time.monotonic() > deadline):
                break
            time.sleep(0.05)


def _tcpreplay_results(procs: dict) -> dict:
    """Client -> tcpreplay's exit status and figures.

    Raises:
        TraceError: a tcpreplay failed (its last line named).
    """
    tcpr = {}
    for cid, p in procs.items():
        text = p.communicate()[0]
        tcpr[cid] = {"exit": p.returncode, **_parse_tcpreplay(text)}
        if p.returncode != 0:
            raise TraceError(f"tcpreplay for client {cid} failed (exit {p.returncode}): "
                             f"{text.strip().splitlines()[-1] if text.strip() else ''}")
    return tcpr


# --------------------------------------------------------------------------- the replay's report
def shard_counters_from_log(path: str | os.PathLike) -> dict | None:
    """The counters a shard server logged when it stopped (the last ``stopped; counters {...}``
    line of its log; :meth:`~embnic.testbed.server.ShardServer.counters`), or None if it did
    not log them (killed, or the log is gone)."""
    mark = " stopped; counters "
    try:
        last = [ln for ln in Path(path).read_text(errors="replace").splitlines() if mark in ln][-1:]
        return json.loads(last[0].split(mark, 1)[1]) if last else None
    except (OSError, ValueError):
        return None


def replay_report(pcap, sidecar: dict | None, reqs, trackers, counters, state_summary, tcpr, rate, topspeed, other,
                   out: Path, ports: dict | None = None, capture_drops: dict | None = None,
                   target: str = "dpdk") -> dict:
    """The replay's report (fields: docs/testbed.md, "Trace record and replay"): every request's
    outcome, latencies, drops by hop, the card's counters; written to ``out/report.json`` with its plots."""
    lat, missing = {"LOOKUP_REQ": [], "UPDATE_REQ": []}, []
    reply_types, statuses, reasm_drops = (collections.Counter() for _ in range(3))
    requests_per_client = {str(cid): len(t.reqs) for cid, t in trackers.items()}
    replies_per_client = {str(cid): len(t.done) for cid, t in trackers.items()}
    sent_t = sorted(x for t in trackers.values() for x in t.sent_t)
    for t in trackers.values():
        reasm_drops.update(getattr(t.reasm, "drops", {}) or {})
        for (c, mid), r in t.reqs.items():
            d = t.done.get(mid)
            if d is None:
                missing.append({"client": c, "msg_id": mid, "type": MsgType(r["type"]).name, "shard": r["shard"]})
                continue
            reply_types[MsgType(d[1]).name] += 1
            if d[1] == MsgType.ERROR:
                try:
                    statuses[consts.Status(d[2]).name] += 1
                except ValueError:
                    statuses[str(d[2])] += 1
            if mid in t.first_sent:
                lat[MsgType(r["type"]).name].append((d[0] - t.first_sent[mid]) / 1e3)
    span = (sent_t[-1] - sent_t[0]) / 1e9 if len(sent_t) > 1 else 0.0
    replied = sum(replies_per_client.values())
    failed = sum(statuses.values())
    completed = replied - failed
    rep = {
        "target": target,
        "pcap": str(pcap.resolve()),
        "sidecar": sidecar,
        "replayer": "tcpreplay",
        "rate_pps": rate,
        "topspeed": topspeed,
        "frames_in_trace": sum(len(r["frags"]) for r in reqs.values()),
        "frames_sent": len(sent_t),
        "duration_s": round(span, 4),
        "frames_per_s": round(len(sent_t) / span, 1) if span > 0 else None,
        "requests": len(reqs),
        "messages_replied": replied,
        "messages_completed": completed,
        "messages_failed": failed,
        "all_replied": replied == len(reqs),
        "all_completed": completed == len(reqs),
        "requests_per_client": requests_per_client,
        "replies_per_client": replies_per_client,
        "reply_types": dict(reply_types),
        "error_statuses": dict(statuses),
        "drops": {"card": counters.get("drops", {}), "client_reassembly": dict(reasm_drops),
                  "no_reply": len(missing), "unexpected_replies": sum(t.unexpected for t in trackers.values()),
                  "mismatched_replies": sum(t.mismatched for t in trackers.values()),
                  "non_embnic_frames_in_trace": other},
        "frames_lost": _hop_losses(trackers, counters, ports or {}),
        "capture_drops": capture_drops or {},
        "missing": missing[:100],
        "lookup_latency_us": R.percentiles(lat["LOOKUP_REQ"]),
        "update_latency_us": R.percentiles(lat["UPDATE_REQ"]),
        "card": {**R.card_summary(counters, state_summary), "state": state_summary},
        "tcpreplay": {str(k): v for k, v in tcpr.items()},
    }
    rep["plots"] = {
        "latency_cdf": str(R.plot_cdf(out / "replay_latency_cdf.png",
                                      {"lookup": lat["LOOKUP_REQ"], "update": lat["UPDATE_REQ"]},
                                      "replayed requests: latency to the complete reply",
                                      "latency (µs, first request frame → last reply frame)")),
        "replies": str(R.plot_grouped_bars(out / "replay_replies.png",
                                           {"requests replayed": {f"client {c}": n for c, n in requests_per_client.items()},
                                            "replies received": {f"client {c}": n for c, n in replies_per_client.items()}},
                                           "requests replayed vs replies received, per client", "messages")),
    }
    R.write_json(out / "report.json", rep)
    return rep


def _hop_losses(trackers: dict, counters: dict, ports: dict) -> dict:
    """Frames lost per hop and client, from the client-side capture and the card's port counters:
    ``client_to_card`` = frames the client sent − frames the card received on its port (e.g. the
    af_packet RX ring overflowed), ``card_to_client`` = frames the card sent on that port − reply
    frames the client saw."""
    by_port = {int(p["port"]): p for p in counters.get("ports", []) or []}
    out = {"client_to_card": {}, "card_to_client": {}}
    for cid, t in trackers.items():
        p = by_port.get(ports.get(cid, -1))
        if p is None:
            continue
        out["client_to_card"][str(cid)] = max(0, t.sent_frames - int(p.get("rx_frames", 0)))
        out["card_to_client"][str(cid)] = max(0, int(p.get("tx_frames", 0)) - t.reply_frames)
    return out


def _per_client(d: dict) -> str:
    nz = {k: v for k, v in d.items() if v}
    return ", ".join(f"client {k}: {v}" for k, v in sorted(nz.items())) or "none"


def replay_summary(rep: dict) -> list[str]:
    """The short summary printed after a replay."""
    lk, up = rep["lookup_latency_us"], rep["update_latency_us"]
    rows = [
        ("frames", f"{rep['frames_sent']} sent in {rep['duration_s']:.3f} s"
                   + (f" = {rep['frames_per_s']:.0f} frames/s" if rep["frames_per_s"] else "")),
        ("messages", f"{rep['messages_completed']}/{rep['requests']} completed"
                     + (" (every request got its reply)" if rep["all_completed"] else
                        f" ({rep['messages_failed']} answered ERROR: {R.fmt_drops(rep['error_statuses'])}; "
                        f"{rep['requests'] - rep['messages_replied']} unanswered)")),
        ("replies per client", ", ".join(f"client {c}: {n}/{rep['requests_per_client'][c]}"
                                         for c, n in rep["replies_per_client"].items())),
        ("lookup latency", f"p50 {lk['p50']} µs, p99 {lk['p99']} µs (n={lk['n']})"),
        ("update latency", f"p50 {up['p50']} µs, p99 {up['p99']} µs (n={up['n']})"),
        ("card drops", R.fmt_drops(rep["drops"]["card"])),
        ("other drops", f"no reply {rep['drops']['no_reply']}, reassembly "
                        f"{R.fmt_drops(rep['drops']['client_reassembly'])}"),
        ("frames lost", "client→card " + _per_client(rep["frames_lost"]["client_to_card"])
                        + "; card→client " + _per_client(rep["frames_lost"]["card_to_client"])
                        + " (capture vs the card's port counters)"),
        ("report", str(Path(rep["plots"]["latency_cdf"]).parent / "report.json")),
    ]
    if rep.get("shards"):
        errs = {f"shard {sid} {st}": n for sid, c in rep["shards"].items() if c
                for st, n in (c.get("errors") or {}).items() if n}
        rows.insert(-1, ("shard errors", R.fmt_drops(errs)))
    if rep.get("dead_nodes"):
        rows.insert(2, ("dead nodes", T.describe_dead(rep["dead_nodes"])))
    return ["replay summary:"] + R.table_lines(rows)
