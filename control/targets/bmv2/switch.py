"""Running the P4 card on BMv2: compile ``p4/``, run ``simple_switch`` in its own netns, talk to it.

``simple_switch``'s Thrift server listens on every address of its network namespace, so it
always runs in a namespace of its own (:class:`embnic.control.netns.Netns`) whose only address
is loopback (IPv6 is disabled on every other interface moved there, so no link-local address
appears either): the runtime CLI reaches it from inside the namespace, nothing outside this host can. The card's
ports are veths moved into that namespace, or pcap files (``--use-files``).

    json_path = compile_program(Path("build/p4"))
    with Netns.create("embnic-bmv2-1", ipv6=True) as ns:  # embnic.control.netns
        sw = SimpleSwitch(json_path, ns, ports={0: "/tmp/c/p0"}, use_files=True, log=Path("sw.log"))
        sw.start(); sw.wait_ready()
        sw.cli(["table_dump route_by_shard"])
        sw.stop()

Table entries and reading counters/registers back: :mod:`embnic.control.targets.bmv2.runtime`; frames
through pcap files: :mod:`embnic.control.targets.bmv2.pcap_files`. Tools (``p4c``, ``simple_switch``,
``simple_switch_CLI``) are found on PATH; a missing one is a :class:`ToolMissingError` naming it
and how to get it.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from embnic.control.targets import p4program as p4prog
from embnic.control.netns import Netns

#: how to get each tool when it is missing (none is in Debian's or PyPI's archives)
TOOL_HINTS = {
    "p4c": "build p4lang/p4c (v1.2.4.x, bmv2 backend) and install it on PATH",
    "simple_switch": "build p4lang/behavioral-model (1.15.x, with Thrift) and install it on PATH",
    "simple_switch_CLI": "it comes with p4lang/behavioral-model (needs the Python package thrift)",
    "simple_switch_grpc": "build p4lang/PI and p4lang/behavioral-model with PI: make p4tools PREFIX=DIR "
                          "(p4/README.md, \"Compile and run\"), then put DIR/bin on PATH",
}
#: the bmv2 target's control channels: ``p4runtime`` (simple_switch_grpc: tables over P4Runtime,
#: registers/counters/queues over Thrift) and ``thrift`` (simple_switch: everything over Thrift)
CHANNELS = ("p4runtime", "thrift")
#: the switch binary of each channel
CHANNEL_SWITCH = {"p4runtime": "simple_switch_grpc", "thrift": "simple_switch"}
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


def choose_channel(requested: str | None = None) -> str:
    """The control channel to use: ``requested``, else ``$EMBNIC_BMV2_CHANNEL``, else ``auto``;
    ``auto`` is ``p4runtime`` where ``simple_switch_grpc`` is on PATH, else ``thrift``.

    Raises:
        ValueError: not one of ``auto``, ``p4runtime``, ``thrift`` (names the source).
    """
    src = "channel"
    if requested is None:
        requested, src = os.environ.get("EMBNIC_BMV2_CHANNEL") or "auto", "EMBNIC_BMV2_CHANNEL"
    if requested not in ("auto", *CHANNELS):
        raise ValueError(f"{src}: {requested!r} is not one of auto, p4runtime, thrift")
    if requested == "auto":
        return "p4runtime" if shutil.which(CHANNEL_SWITCH["p4runtime"]) else "thrift"
    return requested


def tool_prefix(name: str) -> Path | None:
    """The install prefix of tool ``name`` on PATH (``PREFIX/bin/name``, symlinks resolved)."""
    path = shutil.which(name)
    return Path(path).resolve().parent.parent if path else None


def build_info(name: str = "simple_switch") -> dict | None:
    """What is known of how tool ``name`` was built: ``{"prefix", "file", "text", "fast"}`` from
    ``PREFIX/BUILDINFO`` (written by ``make p4tools``) or ``PREFIX/BUILD-INFO``; ``fast`` is True
    when it says BMv2 was built with the logging macros and the event logger compiled out,
    False when it says otherwise, None when it does not say. None when the tool is not on PATH.
    """
    prefix = tool_prefix(name)
    if prefix is None:
        return None
    for fname in ("BUILDINFO", "BUILD-INFO"):
        f = prefix / fname
        if f.is_file():
            text = f.read_text(errors="replace")
            fast = None
            m = re.search(r"^part bmv2 .*fast=(\d)", text, re.M)
            if m:
                fast = m.group(1) == "1"
            elif "behavioral-model" in text:
                fast = "ENABLE_LOGGING_MACROS=OFF" in text or "--disable-logging-macros" in text
            return {"prefix": str(prefix), "file": str(f), "text": text.strip(), "fast": fast}
    return {"prefix": str(prefix), "file": None, "text": None, "fast": None}


def tool_versions() -> dict[str, str]:
    """``{"p4c": "1.2.4.8 (SHA: ...)", "simple_switch": "1.15.5-..."}`` of the tools on PATH
    (``simple_switch_grpc`` too where it is)."""
    out = {}
    for name in ("p4c", "simple_switch", "simple_switch_grpc"):
        try:
            r = subprocess.run([find_tool(name), "--version"], capture_output=True, text=True, timeout=30)
        except (ToolMissingError, OSError, subprocess.TimeoutExpired):
            continue
        out[name] = (r.stdout or r.stderr).strip().splitlines()[-1] if (r.stdout or r.stderr).strip() else ""
    return out


# --------------------------------------------------------------------------- compile
def sources_digest(main: Path | None = None) -> str:
    """SHA-256 (hex) of everything a compile of ``main`` (default: the v1model program) reads:
    every file it includes, the project's and p4c's own (``v1model.p4``), and which p4c
    binary (path and modification time) — :func:`embnic.control.targets.p4program.sources_digest`."""
    p4c = shutil.which("p4c")
    inc = p4prog.compiler_include_dir(p4c) if p4c else None
    ident = f"{os.path.realpath(p4c)}:{os.stat(p4c).st_mtime_ns}" if p4c else "no p4c"
    return p4prog.sources_digest(main or p4prog.MAIN, [inc] if inc else [], extra=ident)


def cache_dir() -> Path:
    """Where compiled programs are kept between loads: ``$EMBNIC_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/embnic``, else ``~/.cache/embnic``; programs go in ``p4/<digest>``."""
    env = os.environ.get("EMBNIC_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "embnic"


#: what the compile writes besides the JSON, part of the cache key: a build of older code (no
#: P4Info) is never taken for one of this code
COMPILE_OUTPUTS = ("json", "p4info.txtpb")


def build_digest(main: Path | None = None) -> str:
    """SHA-256 (hex) of the sources (:func:`sources_digest`) and of what the compile writes
    (:data:`COMPILE_OUTPUTS`): the compile cache's key."""
    src = sources_digest(main)
    return hashlib.sha256((src + "\0" + ",".join(COMPILE_OUTPUTS)).encode()).hexdigest()


def cached_build_dir(main: Path | None = None) -> Path:
    """The build directory of the program's current sources: ``cache_dir()/p4/<digest[:16]>``
    (a change to any file the compile reads, or to what a build writes, gives a new one, so a
    stale JSON or one without its P4Info is never taken)."""
    return cache_dir() / "p4" / build_digest(main)[:16]


def p4info_path(json_path: Path) -> Path:
    """The P4Info :func:`compile_program` writes beside ``json_path`` (``NAME.p4info.txtpb``,
    P4Runtime's text format)."""
    json_path = Path(json_path)
    return json_path.with_name(json_path.stem + ".p4info.txtpb")


def compile_program(out_dir: Path, main: Path | None = None, *, timeout: float = 600) -> Path:
    """Compile the program with ``p4c --target bmv2 --arch v1model --p4runtime-files``; returns
    the JSON's path, with the P4Info beside it (:func:`p4info_path`).

    Both are reused when ``out_dir`` holds them compiled from the same sources (a digest file
    beside them says which: :func:`build_digest`). Warnings count as failures: the program
    compiles clean. p4c writes into a temporary directory beside ``out_dir`` and the files are
    renamed into place (P4Info first, then the JSON, then the digest), so processes compiling
    into one ``out_dir`` at once never read a partial file.

    Raises:
        ToolMissingError: no p4c on PATH.
        Bmv2Error: p4c failed or warned (its output in the message).
    """
    main = main or p4prog.MAIN
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / (main.stem + ".json")
    info = p4info_path(json_path)
    stamp = out_dir / (main.stem + ".sha256")
    digest = build_digest(main)
    if json_path.exists() and info.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return json_path
    p4c = find_tool("p4c")
    tmp = Path(tempfile.mkdtemp(prefix=".p4c-", dir=out_dir))
    try:
        cmd = [p4c, "--target", "bmv2", "--arch", "v1model", "-o", str(tmp),
               "--p4runtime-files", str(tmp / info.name), str(main)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Bmv2Error(f"p4c took more than {timeout:.0f} s: {' '.join(cmd)}") from None
        msg = (r.stdout + r.stderr).strip()
        built = tmp / json_path.name
        if r.returncode != 0 or not built.exists() or not (tmp / info.name).exists():
            raise Bmv2Error(f"p4c failed (exit {r.returncode}): {' '.join(cmd)}\n{msg}")
        if msg:
            raise Bmv2Error(f"p4c warned (the program must compile clean): {' '.join(cmd)}\n{msg}")
        make_restorable(built)
        (tmp / stamp.name).write_text(digest + "\n")
        os.replace(tmp / info.name, info)
        os.replace(built, json_path)
        os.replace(tmp / stamp.name, stamp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
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
    """One ``simple_switch`` (or ``simple_switch_grpc``) process in ``netns``, its ports and its
    runtime CLI.

    ``ports`` maps a port number to an interface name inside the namespace, or, with
    ``use_files``, to a path prefix ``P`` (frames are read from ``P_in.pcap``, written to
    ``P_out.pcap``). ``restore_state`` loads table entries saved by :meth:`save_state` before
    any frame is read (the Thrift channel's way to program tables first).

    With ``grpc_addr`` (e.g. ``unix:/run/embnic/NAME.p4rt``) the switch is ``simple_switch_grpc``
    serving P4Runtime there (:meth:`p4runtime`) besides Thrift; ``json_path`` None starts it with
    no program (``--no-p4``): the pipeline comes over P4Runtime, and the switch forwards nothing
    before. Ports can be added to a running switch with :meth:`port_add`.
    """

    def __init__(self, json_path: Path | None, netns: Netns, ports: Mapping[int, str], *, log: Path,
                 use_files: bool = False, files_wait_s: int = 0, restore_state: Path | None = None,
                 thrift_port: int = DEFAULT_THRIFT_PORT, grpc_addr: str | None = None, device_id: int = 0):
        if json_path is None and grpc_addr is None:
            raise ValueError("a switch without a program (json_path None) needs grpc_addr: the pipeline comes "
                             "over P4Runtime")
        self.json_path = Path(json_path) if json_path is not None else None
        self.netns = netns
        self.ports = dict(ports)
        self.log = Path(log)
        self.use_files = use_files
        self.files_wait_s = int(files_wait_s)
        self.restore_state = restore_state
        self.thrift_port = thrift_port
        self.grpc_addr = grpc_addr
        self.device_id = int(device_id)
        self.proc: subprocess.Popen | None = None

    @property
    def binary(self) -> str:
        """``simple_switch_grpc`` with ``grpc_addr``, else ``simple_switch``."""
        return CHANNEL_SWITCH["p4runtime" if self.grpc_addr else "thrift"]

    def command(self) -> list[str]:
        """The switch's command line (without ``ip netns exec``)."""
        cmd = [find_tool(self.binary), "--device-id", str(self.device_id), "--thrift-port", str(self.thrift_port),
               "--log-file", str(self.log), "--log-level", "info", "--log-flush"]
        if self.use_files:
            cmd += ["--use-files", str(self.files_wait_s)]
        if self.restore_state is not None:
            cmd += ["--restore-state", str(self.restore_state)]
        for num, name in sorted(self.ports.items()):
            cmd += ["-i", f"{num}@{name}"]
        cmd += [str(self.json_path)] if self.json_path is not None else ["--no-p4"]
        if self.grpc_addr:
            cmd += ["--", "--grpc-server-addr", self.grpc_addr]
        return cmd

    def cli_tool(self) -> str:
        """The runtime CLI: the ``simple_switch_CLI`` installed beside the switch binary, else the
        one on PATH."""
        sibling = Path(find_tool(self.binary)).resolve().parent / "simple_switch_CLI"
        return str(sibling) if sibling.exists() else find_tool("simple_switch_CLI")

    def p4runtime(self, timeout: float = 30.0):
        """A :class:`embnic.control.targets.bmv2.p4runtime.P4RuntimeClient` on this switch's ``grpc_addr``
        (reachable from the host: a unix socket is a file, not in the namespace).

        Raises:
            Bmv2Error: the switch serves no P4Runtime (no ``grpc_addr``).
            MissingDependencyError: finsy/grpcio not installed.
        """
        if not self.grpc_addr:
            raise Bmv2Error("this switch runs without P4Runtime (simple_switch, Thrift only)")
        from embnic.control.targets.bmv2.p4runtime import P4RuntimeClient

        return P4RuntimeClient(self.grpc_addr, self.device_id, timeout=timeout)

    def port_add(self, ports: Mapping[int, str]) -> None:
        """Add interface ports to the running switch (``port_add IFACE NUM`` over Thrift).

        Raises:
            Bmv2Error: the CLI refused a port (an interface missing from the namespace).
        """
        self.cli([f"port_add {name} {num}" for num, name in sorted(ports.items())])
        self.ports.update(ports)

    @property
    def log_file(self) -> Path:
        """Where BMv2 writes its log (it appends ``.txt`` to ``--log-file``)."""
        return self.log.with_name(self.log.name + ".txt")

    def start(self) -> int:
        """Start the switch; returns its pid (of ``ip netns exec``, which execs simple_switch)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log_file.unlink(missing_ok=True)  # wait_ready reads it: no line of an earlier run
        out = open(self.log.with_name(self.log.name + ".out"), "wb")
        self.proc = subprocess.Popen(self.netns.exec_argv(self.command()),
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        return self.proc.pid

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the Thrift server is up (its log says so) and, with ``grpc_addr``, the
        P4Runtime server too (simple_switch_grpc starts it first; a ``unix:`` socket must exist).

        Raises:
            Bmv2Error: the switch exited or was not ready in ``timeout`` s (its output quoted).
        """
        deadline = time.monotonic() + timeout
        sock = Path(self.grpc_addr[5:]) if self.grpc_addr and self.grpc_addr.startswith("unix:") else None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise Bmv2Error(f"{self.binary} exited with {self.proc.returncode}: {self.output_tail()}")
            try:
                if ("Thrift server was started" in self.log_file.read_text(errors="replace")
                        and (sock is None or sock.exists())):
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise Bmv2Error(f"{self.binary} not ready after {timeout:.0f} s: {self.output_tail()}")

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
        cmd = self.netns.exec_argv([self.cli_tool(), "--thrift-port", str(self.thrift_port)])
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

        cli = Path(self.cli_tool()).read_text(errors="replace")
        extra = re.findall(r'sys\.path\.append\("([^"]+)"\)', cli)
        r = subprocess.run(self.netns.exec_argv([sys.executable, "-c", _SAVE_STATE_PY, str(self.thrift_port),
                                                 str(path), *extra]), capture_output=True, text=True, timeout=timeout)
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


def pid_alive(pid: int) -> bool:
    """True if process ``pid`` exists (signal 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


