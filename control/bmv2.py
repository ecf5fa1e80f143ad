"""Running the P4 card on BMv2: compile ``p4/``, run ``simple_switch`` in its own netns, talk to it.

``simple_switch``'s Thrift server listens on every address of its network namespace, so it
always runs in a namespace of its own (:class:`Netns`) whose only address is loopback (IPv6 is
disabled on every other interface moved there, so no link-local address appears either): the
runtime CLI reaches it through ``ip netns exec``, nothing outside this host can. The card's
ports are veths moved into that namespace, or pcap files (``--use-files``).

    json_path = compile_program(Path("build/p4"))
    with Netns.create("embnic-bmv2-1") as ns:
        sw = SimpleSwitch(json_path, ns, ports={0: "/tmp/c/p0"}, use_files=True, log=Path("sw.log"))
        sw.start(); sw.wait_ready()
        sw.cli(table_commands(card_ports, routes, clients))
        print(read_counters(sw))
        sw.stop()

Tools (``p4c``, ``simple_switch``, ``simple_switch_CLI``) are found on PATH; a missing one is a
:class:`ToolMissingError` naming it and how to get it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
import zlib
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from embnic.control import p4prog
from embnic.control.pcap import write_pcap

#: how to get each tool when it is missing (none is in Debian's or PyPI's archives)
TOOL_HINTS = {
    "p4c": "build p4lang/p4c (v1.2.4.x, bmv2 backend) and install it on PATH",
    "simple_switch": "build p4lang/behavioral-model (1.15.x, with Thrift) and install it on PATH",
    "simple_switch_CLI": "it comes with p4lang/behavioral-model (needs the Python package thrift)",
}
DEFAULT_THRIFT_PORT = 9090
#: frames per egress queue (BMv2's default of 64 drops, uncounted, under any burst)
EGRESS_QUEUE_DEPTH = 16384


class Bmv2Error(RuntimeError):
    """Something about running the program on BMv2 failed; the message says what and where."""


class ToolMissingError(Bmv2Error):
    """A tool the BMv2 target needs is not on PATH (message: which one, how to get it)."""


def find_tool(name: str) -> str:
    """Absolute path of ``name`` on PATH.

    Raises:
        ToolMissingError: not found; the message names the tool and how to get it.
    """
    path = shutil.which(name)
    if path is None:
        raise ToolMissingError(f"{name} not found on PATH: {TOOL_HINTS.get(name, 'install it')}")
    return path


def missing_tools(names: Sequence[str] = ("p4c", "simple_switch", "simple_switch_CLI")) -> list[str]:
    """The tools of ``names`` that are not on PATH (empty when all are there)."""
    return [n for n in names if shutil.which(n) is None]


def tool_versions() -> dict[str, str]:
    """``{"p4c": "1.2.4.8 (SHA: ...)", "simple_switch": "1.15.5-..."}`` of the tools on PATH."""
    out = {}
    for name in ("p4c", "simple_switch"):
        try:
            r = subprocess.run([find_tool(name), "--version"], capture_output=True, text=True, timeout=30)
        except (ToolMissingError, OSError, subprocess.TimeoutExpired):
            continue
        out[name] = (r.stdout or r.stderr).strip().splitlines()[-1] if (r.stdout or r.stderr).strip() else ""
    return out


# --------------------------------------------------------------------------- compile
def sources_digest(p4_dir: Path | None = None) -> str:
    """SHA-256 of every ``*.p4`` of the program (names and contents), hex."""
    h = hashlib.sha256()
    for path in sorted((p4_dir or p4prog.P4_DIR).glob("*.p4")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def compile_program(out_dir: Path, main: Path | None = None, *, timeout: float = 600) -> Path:
    """Compile the program with ``p4c --target bmv2 --arch v1model``; returns the JSON's path.

    The JSON is reused when ``out_dir`` holds one compiled from the same sources (a digest file
    beside it says which). Warnings count as failures: the program compiles clean.

    Raises:
        ToolMissingError: no p4c on PATH.
        Bmv2Error: p4c failed or warned (its output in the message).
    """
    main = main or p4prog.MAIN
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / (main.stem + ".json")
    stamp = out_dir / (main.stem + ".sha256")
    digest = sources_digest(main.parent)
    if json_path.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return json_path
    cmd = [find_tool("p4c"), "--target", "bmv2", "--arch", "v1model", "-o", str(out_dir), str(main)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Bmv2Error(f"p4c took more than {timeout:.0f} s: {' '.join(cmd)}") from None
    msg = (r.stdout + r.stderr).strip()
    if r.returncode != 0 or not json_path.exists():
        raise Bmv2Error(f"p4c failed (exit {r.returncode}): {' '.join(cmd)}\n{msg}")
    if msg:
        raise Bmv2Error(f"p4c warned (the program must compile clean): {' '.join(cmd)}\n{msg}")
    make_restorable(json_path)
    stamp.write_text(digest + "\n")
    return json_path


def make_restorable(json_path: Path) -> int:
    """Pad the JSON with trailing spaces so that ``--restore-state`` can read a saved state.

    BMv2 writes the MD5 of the JSON into a saved state as 16 raw bytes and reads it back with
    ``operator>>``, which stops at whitespace: an MD5 containing a whitespace byte (0x09-0x0d,
    0x20; about 1 JSON in 3) never matches and the switch refuses the state. Trailing spaces
    change the MD5, not the JSON. Returns how many spaces were added.
    """
    data = Path(json_path).read_bytes().rstrip(b" ")
    for pad in range(4096):
        if not any(b in b"\t\n\v\f\r " for b in hashlib.md5(data + b" " * pad).digest()):
            Path(json_path).write_bytes(data + b" " * pad)
            return pad
    raise Bmv2Error(f"no padding of {json_path} gives an MD5 without whitespace bytes")


# --------------------------------------------------------------------------- state map slot
def state_slot(client_id, msg_id, slots: int | None = None):
    """State map slot of (client_id, msg_id): ``crc32(be16 client_id ++ be32 msg_id) % slots``.

    The slot ``StateMap`` (p4/state_map.p4) writes. Scalars or numpy arrays of equal shape
    (``uint16``/``uint32``-valued ints); returns an int, or an int64 array of the same shape.

    Example: ``state_slot(1, 1001)`` is ``zlib.crc32(bytes([0, 1, 0, 0, 3, 0xE9])) % 4096``.
    """
    import numpy as np

    slots = slots or p4prog.constants()["STATE_SLOTS"]
    c = np.asarray(client_id, dtype=np.int64)
    m = np.asarray(msg_id, dtype=np.int64)
    if c.shape != m.shape:
        raise ValueError(f"client_id shape {c.shape} != msg_id shape {m.shape}")
    if ((c < 0) | (c > 0xFFFF)).any() or ((m < 0) | (m > 0xFFFFFFFF)).any():
        raise ValueError("client_id must fit 16 bits and msg_id 32 bits")
    flat = np.empty((c.size, 6), dtype=np.uint8)
    flat[:, 0:2] = c.reshape(-1, 1).astype(">u2").view(np.uint8).reshape(-1, 2)
    flat[:, 2:6] = m.reshape(-1, 1).astype(">u4").view(np.uint8).reshape(-1, 4)
    # zlib.crc32 has no vector form; 6 bytes per message, control-path only
    out = np.fromiter((zlib.crc32(row.tobytes()) % slots for row in flat), dtype=np.int64, count=c.size)
    return int(out[0]) if c.ndim == 0 else out.reshape(c.shape)


# --------------------------------------------------------------------------- netns
@dataclasses.dataclass
class Netns:
    """A network namespace made for one switch: loopback up, nothing else addressed."""

    name: str

    @classmethod
    def create(cls, name: str) -> "Netns":
        """Create ``name`` (it must not exist) and bring its loopback up.

        Raises:
            Bmv2Error: ``ip netns add`` failed (exists already, or not root).
        """
        r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
        if r.returncode != 0:
            raise Bmv2Error(f"ip netns add {name}: {r.stderr.strip()}")
        ns = cls(name)
        ns.run(["ip", "link", "set", "lo", "up"])
        return ns

    def run(self, cmd: Sequence[str], **kw) -> subprocess.CompletedProcess:
        """Run ``cmd`` inside the namespace (``ip netns exec``); raises Bmv2Error on failure."""
        r = subprocess.run(["ip", "netns", "exec", self.name, *cmd], capture_output=True, text=True, **kw)
        if r.returncode != 0:
            raise Bmv2Error(f"in netns {self.name}: {' '.join(cmd)}: {(r.stderr or r.stdout).strip()}")
        return r

    def take_interface(self, ifname: str) -> None:
        """Move ``ifname`` into the namespace, IPv6 off (no link-local address), and bring it up."""
        subprocess.run(["ip", "link", "set", ifname, "netns", self.name], check=True, capture_output=True)
        self.run(["sysctl", "-qw", f"net.ipv6.conf.{ifname}.disable_ipv6=1"])
        self.run(["ip", "link", "set", ifname, "up"])

    def addresses(self) -> list[str]:
        """Every IPv4/IPv6 address in the namespace (``ip -o addr``), as ``"ifname addr/len"``."""
        out = self.run(["ip", "-o", "addr", "show"]).stdout
        return [f"{f[1]} {f[3]}" for f in (ln.split() for ln in out.splitlines()) if len(f) > 3]

    def delete(self) -> None:
        """Delete the namespace (its veth ends go with it)."""
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    def __enter__(self) -> "Netns":
        return self

    def __exit__(self, *exc) -> None:
        self.delete()


# --------------------------------------------------------------------------- the switch
#: bm_serialize_state through Thrift, keeping the binary state as bytes (argv: port, path, sys.path extras)
_SAVE_STATE_PY = """
import sys
sys.path.extend(sys.argv[3:])
from bm_runtime.standard import Standard
from thrift.protocol import TBinaryProtocol, TMultiplexedProtocol
from thrift.transport import TSocket, TTransport
transport = TTransport.TBufferedTransport(TSocket.TSocket("127.0.0.1", int(sys.argv[1])))
proto = TBinaryProtocol.TBinaryProtocol(transport)
proto.readString = proto.readBinary
client = Standard.Client(TMultiplexedProtocol.TMultiplexedProtocol(proto, "standard"))
transport.open()
state = client.bm_serialize_state()
open(sys.argv[2], "wb").write(state if isinstance(state, bytes) else state.encode("latin-1"))
transport.close()
"""

class SimpleSwitch:
    """One ``simple_switch`` process in ``netns``, its ports and its runtime CLI.

    ``ports`` maps a port number to an interface name inside the namespace, or, with
    ``use_files``, to a path prefix ``P`` (frames are read from ``P_in.pcap``, written to
    ``P_out.pcap``). ``restore_state`` loads table entries saved by :meth:`save_state` before
    any frame is read.
    """

    def __init__(self, json_path: Path, netns: Netns, ports: Mapping[int, str], *, log: Path,
                 use_files: bool = False, files_wait_s: int = 0, restore_state: Path | None = None,
                 thrift_port: int = DEFAULT_THRIFT_PORT):
        self.json_path = Path(json_path)
        self.netns = netns
        self.ports = dict(ports)
        self.log = Path(log)
        self.use_files = use_files
        self.files_wait_s = int(files_wait_s)
        self.restore_state = restore_state
        self.thrift_port = thrift_port
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        """The simple_switch command line (without ``ip netns exec``)."""
        cmd = [find_tool("simple_switch"), "--thrift-port", str(self.thrift_port),
               "--log-file", str(self.log), "--log-level", "info", "--log-flush"]
        if self.use_files:
            cmd += ["--use-files", str(self.files_wait_s)]
        if self.restore_state is not None:
            cmd += ["--restore-state", str(self.restore_state)]
        for num, name in sorted(self.ports.items()):
            cmd += ["-i", f"{num}@{name}"]
        return cmd + [str(self.json_path)]

    @property
    def log_file(self) -> Path:
        """Where BMv2 writes its log (it appends ``.txt`` to ``--log-file``)."""
        return self.log.with_name(self.log.name + ".txt")

    def start(self) -> int:
        """Start the switch; returns its pid (of ``ip netns exec``, which execs simple_switch)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log_file.unlink(missing_ok=True)  # wait_ready reads it: no line of an earlier run
        out = open(self.log.with_name(self.log.name + ".out"), "wb")
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.netns.name, *self.command()],
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        return self.proc.pid

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the Thrift server is up (its log says so).

        Raises:
            Bmv2Error: the switch exited or was not ready in ``timeout`` s (its output quoted).
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise Bmv2Error(f"simple_switch exited with {self.proc.returncode}: {self.output_tail()}")
            try:
                if "Thrift server was started" in self.log_file.read_text(errors="replace"):
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise Bmv2Error(f"simple_switch not ready after {timeout:.0f} s: {self.output_tail()}")

    def output_tail(self, n: int = 2000) -> str:
        """The end of the switch's stdout/stderr and log (for error messages)."""
        text = ""
        for p in (self.log.with_name(self.log.name + ".out"), self.log_file):
            try:
                text += p.read_text(errors="replace")[-n:]
            except OSError:
                pass
        return text.strip() or "(no output)"

    def cli(self, commands: Iterable[str], *, timeout: float = 120.0) -> str:
        """Run runtime-CLI commands (one per line) in one ``simple_switch_CLI``; returns its output.

        Raises:
            Bmv2Error: the CLI failed, or a command was refused (``Error:``/``Invalid`` in its
                output), with the offending lines.
        """
        text = "\n".join(commands) + "\n"
        cmd = ["ip", "netns", "exec", self.netns.name, find_tool("simple_switch_CLI"),
               "--thrift-port", str(self.thrift_port)]
        try:
            r = subprocess.run(cmd, input=text, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Bmv2Error(f"simple_switch_CLI took more than {timeout:.0f} s") from None
        out = r.stdout
        bad = [ln for ln in (out + r.stderr).splitlines()
               if re.search(r"\bError\b|Invalid|Traceback|Could not connect", ln)]
        if r.returncode != 0 or bad:
            raise Bmv2Error(f"simple_switch_CLI: {' | '.join(bad) or r.stderr.strip() or 'exit ' + str(r.returncode)}")
        return out

    def save_state(self, path: Path, timeout: float = 120.0) -> None:
        """Write the switch's state (table entries, registers) to ``path``, for ``--restore-state``.

        The runtime CLI's ``serialize_state`` decodes the (binary) state as UTF-8 and fails, so
        this calls the same Thrift method with the bytes kept as bytes, from inside the namespace.

        Raises:
            Bmv2Error: the call failed (its error output in the message).
        """
        import sys

        cli = Path(find_tool("simple_switch_CLI")).read_text(errors="replace")
        extra = re.findall(r'sys\.path\.append\("([^"]+)"\)', cli)
        r = subprocess.run(["ip", "netns", "exec", self.netns.name, sys.executable, "-c", _SAVE_STATE_PY,
                            str(self.thrift_port), str(path), *extra], capture_output=True, text=True,
                           timeout=timeout)
        if r.returncode != 0 or not Path(path).exists():
            raise Bmv2Error(f"saving the switch state failed: {(r.stderr or r.stdout).strip()[-600:]}")

    def stop(self, timeout: float = 10.0) -> int | None:
        """Stop the switch (SIGTERM, then SIGKILL after ``timeout`` s); returns its exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# --------------------------------------------------------------------------- table entries
@dataclasses.dataclass(frozen=True)
class CardPortAddr:
    """The card's own address on one of its ports."""

    port: int
    mac: str
    ip: str


@dataclasses.dataclass(frozen=True)
class PeerEntry:
    """A route (id = shard) or client (id = client): card port, MAC, IPv4, UDP port."""

    id: int
    port: int
    mac: str
    ip: str
    udp_port: int


def table_commands(card_ports: Iterable[CardPortAddr], routes: Iterable[PeerEntry],
                   clients: Iterable[PeerEntry], *, state_timeout_us: int | None = None) -> list[str]:
    """Runtime-CLI lines that program the card: port addresses, routes, clients, allowlist.

    Each route adds ``route_by_shard`` and its server's ``sender_allowlist`` entry (replies from
    it); each client ``client_by_id`` and its ``sender_allowlist`` entry (requests from it).
    """
    out = []
    for p in card_ports:
        out.append(f"table_add card_port_by_ingress set_card_port {p.port} => {p.ip} {p.mac}")
        out.append(f"table_add source_by_egress_port rewrite_source {p.port} => {p.mac} {p.ip}")
    for r in routes:
        out += route_add_commands(r)
    for c in clients:
        out += client_add_commands(c)
    if state_timeout_us is not None:
        out.append(f"register_write state_timeout_us 0 {int(state_timeout_us)}")
    return out


def route_add_commands(r: PeerEntry) -> list[str]:
    """CLI lines adding route ``r`` (shard → server) and its allowlist entry."""
    return [f"table_add route_by_shard forward_to_server {r.id} => {r.port} {r.mac} {r.ip} {r.udp_port}",
            f"table_add sender_allowlist allow_sender 0 {r.id} {r.ip} {r.udp_port} =>"]


def client_add_commands(c: PeerEntry) -> list[str]:
    """CLI lines adding client ``c`` and its allowlist entry."""
    return [f"table_add client_by_id forward_to_client {c.id} => {c.port} {c.mac} {c.ip} {c.udp_port}",
            f"table_add sender_allowlist allow_sender 1 {c.id} {c.ip} {c.udp_port} =>"]


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
    """Counters of the card in the DPDK card's ``counters`` shape (docs/control-socket.md).

    ``{"ports": [{port, rx_frames, rx_bytes, tx_frames, tx_bytes}], "types": {LOOKUP_REQ: n,
    ...}, "drops": {reason: n} (every reason), "arp": {"replies": n}, "completed":
    {LOOKUP_REPLY: n, UPDATE_ACK: n, ERROR: n} (messages whose whole reply passed, by reply
    type), "shards": [{"shard": id, "completed": n}] for ``shards``, "state": {"expired": n}}``.
    """
    shards = list(shards)
    from embnic.client_lib.consts import MsgType

    reply_types = (MsgType.LOOKUP_REPLY, MsgType.UPDATE_ACK, MsgType.ERROR)

    reasons = p4prog.drop_reasons()
    cmds = [f"counter_read rx_frames {p}" for p in range(nb_ports)]
    cmds += [f"counter_read tx_frames {p}" for p in range(nb_ports)]
    cmds += [f"counter_read drop_reasons {i + 1}" for i in range(len(reasons))]
    cmds += [f"counter_read frames_by_type {t.value}" for t in MsgType]
    cmds += [f"counter_read messages_completed {t.value}" for t in MsgType]
    cmds += [f"counter_read completed_by_shard {s}" for s in shards]
    cmds += ["counter_read arp_replies 0", "counter_read state_expired 0"]
    c = parse_counters(sw.cli(cmds))

    def get(name: str, i: int, k: int = 0) -> int:
        try:
            return c[name][i][k]
        except KeyError:
            raise Bmv2Error(f"counter {name}[{i}] missing from simple_switch_CLI output") from None

    return {
        "ports": [{"port": p, "rx_frames": get("rx_frames", p), "rx_bytes": get("rx_frames", p, 1),
                   "tx_frames": get("tx_frames", p), "tx_bytes": get("tx_frames", p, 1)}
                  for p in range(nb_ports)],
        "types": {t.name: get("frames_by_type", t.value) for t in MsgType},
        "drops": {r: get("drop_reasons", i + 1) for i, r in enumerate(reasons)},
        "arp": {"replies": get("arp_replies", 0)},
        "completed": {t.name: get("messages_completed", t.value) for t in reply_types},
        "shards": [{"shard": s, "completed": get("completed_by_shard", s)} for s in shards],
        "state": {"expired": get("state_expired", 0)},
    }


#: the state map's registers, in the order :func:`read_state` reads them
STATE_REGISTERS = ("slot_state", "slot_key", "slot_request_info", "slot_shard", "slot_msg_len", "slot_frames_in", "slot_frames_out", "slot_bytes_in", "slot_bytes_out",
                   "slot_first_us", "slot_last_us")
#: slot_state values (p4/types.p4 STATE_*), named as docs/control-socket.md names them
STATE_NAMES = {0: "free", 1: "receiving", 2: "forwarded", 3: "replying"}


def read_state_map(sw: SimpleSwitch) -> list[dict]:
    """Live entries of the state map: ``[{slot, client_id, msg_id, state, msg_type, shard_id,
    table_id, frag_count, msg_len, frames_in, frames_out, bytes_in, bytes_out, first_us,
    last_us}]``, by slot. Expired entries a frame has not touched yet are included (BMv2 has no
    timer); ``last_us`` says how old they are."""
    regs = parse_registers(sw.cli([f"register_read {r}" for r in STATE_REGISTERS]))
    missing = [r for r in STATE_REGISTERS if r not in regs]
    if missing:
        raise Bmv2Error(f"registers {missing} missing from simple_switch_CLI output")
    out = []
    for s, st in enumerate(regs["slot_state"]):
        if st == 0:
            continue
        key, req = regs["slot_key"][s], regs["slot_request_info"][s]
        out.append({
            "slot": s, "client_id": key >> 32, "msg_id": key & 0xFFFFFFFF,
            "state": STATE_NAMES.get(st, str(st)),
            "msg_type": req >> 40, "shard_id": regs["slot_shard"][s], "table_id": (req >> 24) & 0xFFFF,
            "frag_count": (req >> 8) & 0xFFFF, "msg_len": regs["slot_msg_len"][s],
            "frames_in": regs["slot_frames_in"][s], "frames_out": regs["slot_frames_out"][s],
            "bytes_in": regs["slot_bytes_in"][s], "bytes_out": regs["slot_bytes_out"][s],
            "first_us": regs["slot_first_us"][s], "last_us": regs["slot_last_us"][s],
        })
    return out


#: the header ring's per-field registers (p4/header_ring.p4), in the order of a ring entry
RING_FIELDS = ("msg_type", "flags", "msg_id", "client_id", "table_id", "shard_id", "num_keys",
               "msg_len", "frag_index", "frag_count", "frag_len", "ingress_port", "time_us")


def read_ring(sw: SimpleSwitch, last: int) -> list[dict]:
    """The ``last`` most recent accepted headers of the header ring, newest first."""
    if last < 0:
        raise ValueError(f"last must be >= 0, got {last}")
    size = p4prog.constants()["RING_SLOTS"]
    regs = parse_registers(sw.cli(["register_read ring_head"] + [f"register_read ring_{f}" for f in RING_FIELDS]))
    head = regs.get("ring_head", [None])[0]
    if head is None:
        raise Bmv2Error("register ring_head missing from simple_switch_CLI output")
    n = min(last, head, size)
    out = []
    for k in range(1, n + 1):
        i = (head - k) % size
        out.append({f: regs[f"ring_{f}"][i] for f in RING_FIELDS})
    return out


def pid_alive(pid: int) -> bool:
    """True if process ``pid`` exists (signal 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --------------------------------------------------------------------------- pcap runs
def write_pcap_ordered(path: Path, frames: Sequence[tuple[int, bytes]]) -> None:
    """Classic pcap of ``frames`` = ``[(global position, frame bytes)]``; the timestamp of each
    frame is its position in microseconds (after 1 s), so BMv2's reader (which takes the earliest
    frame of all its input files first) feeds every port's frames in one global order."""
    write_pcap(path, [d for _, d in frames], times=[1 + pos / 1e6 for pos, _ in frames])


def read_pcap_frames(path: Path) -> list[bytes]:
    """Frames of a classic little-endian pcap file (what BMv2 writes); [] for a missing file."""
    import struct

    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    out, off = [], 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack_from("<IIII", data, off)
        if off + 16 + incl > len(data):
            break  # a record being written
        out.append(data[off + 16:off + 16 + incl])
        off += 16 + incl
    return out


@dataclasses.dataclass
class PcapRun:
    """What :func:`run_pcap_files` saw: output frames per port, counters, state map entries."""

    outputs: dict[int, list[bytes]]
    counters: dict
    state: list[dict]
    program_s: float  #: seconds to program the tables (first switch)
    run_s: float  #: seconds from the second switch's start to the last output


def run_pcap_files(json_path: Path, frames: Sequence[tuple[int, bytes]], commands: Sequence[str],
                   workdir: Path, *, nb_ports: int, shards: Sequence[int] = (), expect_out: int | None = None,
                   netns_name: str | None = None, timeout: float = 300.0) -> PcapRun:
    """Feed ``frames`` (``[(ingress port, bytes)]``, in order) through ``simple_switch``.

    Table entries first, without a race with the frames: a first switch (no ports) is
    programmed with ``commands`` and its state saved; a second one restores that state and
    only then reads ``workdir/p<N>_in.pcap`` (``--use-files``), in the frames' global order.
    Waits until every frame was received (``rx_frames``), every frame ingress accepted
    (``frames_by_type`` + ``arp_replies``: one output each) was counted at egress
    (``tx_frames``, at least ``expect_out`` if given) and is in the output files, then reads
    counters and the state map and stops the switch. Both switches run in a fresh netns (lo only).

    Raises:
        Bmv2Error: a switch failed, the CLI refused a command, or the frames did not all pass
            within ``timeout`` s (the counters so far in the message).
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    by_port: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(nb_ports)}
    for pos, (port, data) in enumerate(frames):
        by_port[port].append((pos, data))
    for p, fr in by_port.items():
        write_pcap_ordered(workdir / f"p{p}_in.pcap", fr)
        (workdir / f"p{p}_out.pcap").unlink(missing_ok=True)
    ns = Netns.create(netns_name or f"embnic-bmv2-{os.getpid()}")
    try:
        t0 = time.monotonic()
        prog = SimpleSwitch(json_path, ns, {}, log=workdir / "program.log")
        prog.start()
        try:
            prog.wait_ready()
            prog.cli(commands)
            prog.save_state(workdir / "state.bmv2")
        finally:
            prog.stop()
        program_s = time.monotonic() - t0
        # BMv2 drops at a full egress queue (64 frames by default) and reads pcap files as fast as
        # it can: the queues are made deep while the reader still waits (--use-files WAIT); if
        # that took longer than the wait, the run is repeated with a longer one
        for wait in (3, 10, 30):
            t1 = time.monotonic()
            for p in range(nb_ports):
                (workdir / f"p{p}_out.pcap").unlink(missing_ok=True)
            sw = SimpleSwitch(json_path, ns, {p: str(workdir / f"p{p}") for p in range(nb_ports)},
                              log=workdir / "run.log", use_files=True, files_wait_s=wait,
                              restore_state=workdir / "state.bmv2")
            sw.start()
            try:
                sw.wait_ready()
                sw.cli([f"set_queue_depth {EGRESS_QUEUE_DEPTH}"])
            except BaseException:
                sw.stop()
                raise
            if time.monotonic() - t1 < wait - 0.2:
                break
            sw.stop()
        else:
            raise Bmv2Error(f"simple_switch took more than {wait} s to start and take its queue depth; log: {sw.log_file}")
        try:
            deadline = time.monotonic() + timeout
            while True:
                c = read_counters(sw, nb_ports, shards)
                rx = sum(p["rx_frames"] for p in c["ports"])
                tx = sum(p["tx_frames"] for p in c["ports"])
                written = sum(len(read_pcap_frames(workdir / f"p{p}_out.pcap")) for p in range(nb_ports))
                # done: every frame received, every frame ingress accepted (forwarded or an ARP
                # reply: one output each) counted at egress, and all of those in the output files
                accepted = sum(c["types"].values()) + c["arp"]["replies"]
                if rx == len(frames) and written == tx == accepted and (expect_out is None or tx >= expect_out):
                    break
                if time.monotonic() > deadline:
                    raise Bmv2Error(f"after {timeout:.0f} s simple_switch received {rx} of {len(frames)} "
                                    f"frames, accepted {accepted}, counted {tx} at egress and wrote {written} "
                                    f"(want {expect_out}); log: {sw.log_file}")
                time.sleep(0.2)
            run_s = time.monotonic() - t1
            state = read_state_map(sw)
        finally:
            sw.stop()
    finally:
        ns.delete()
    outputs = {p: read_pcap_frames(workdir / f"p{p}_out.pcap") for p in range(nb_ports)}
    return PcapRun(outputs, c, state, program_s, run_s)
