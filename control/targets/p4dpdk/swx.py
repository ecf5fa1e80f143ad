"""The P4 card for PNA on DPDK's SWX pipeline: build the pipeline, run ``embnic-swx``, talk to it.

:func:`build_pipeline`: p4c-dpdk's committed spec, the load-time rewrites, ``embnic-swx --codegen``
and ``gcc`` (p4/README.md "PNA on DPDK"), cached by everything it reads. p4c-dpdk renames what it
compiles (``rx_frames`` -> ``rx_frames_0_packets``/``_bytes`` register arrays,
``EmbnicIngress.card_port_by_ingress`` -> ``card_port_by_ingress_0``): :class:`Names` reads them
from its context JSON, by the program's own control-plane names.

    pipe = build_pipeline()
    Names.load(pipe.context).table("route_by_shard")
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

from embnic.control.targets import p4compiled
from embnic.control.targets.dpdk.process import remove_runtime_dir, unique_prefix
from embnic.control.errors import MissingDependencyError, OperationalError

REPO_ROOT = Path(__file__).resolve().parents[3]
#: where ``make -C dataplane`` puts the SWX host
SWX_BINARY = REPO_ROOT / "dataplane" / "build" / "embnic-swx"
#: the pipeline headers libdpdk-dev lacks (scripts/dpdk-pipeline-headers.sh puts them in headers_dir())
INTERNAL_HEADERS = ("rte_swx_pipeline_internal.h", "rte_swx_pipeline_spec.h")


class P4DpdkError(OperationalError):
    """Building or running the PNA pipeline failed; the message says what and where."""


# --------------------------------------------------------------------------- tools
def dpdk_version() -> str | None:
    """The installed ``libdpdk-dev`` package version (``22.11.11-0+deb12u1``), or None."""
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libdpdk-dev"], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() or None


def headers_dir() -> Path:
    """Where the pipeline headers libdpdk-dev lacks are: ``$EMBNIC_DPDK_PIPELINE_INCLUDE``, else
    ``/var/cache/embnic/dpdk-<installed version>/lib/pipeline`` (the script's default)."""
    env = os.environ.get("EMBNIC_DPDK_PIPELINE_INCLUDE")
    if env:
        return Path(env)
    return Path(f"/var/cache/embnic/dpdk-{dpdk_version() or 'unknown'}/lib/pipeline")


def missing() -> str | None:
    """One line naming what the p4dpdk target lacks to run the compiled program and how to get
    it, or None when nothing is missing. p4c-dpdk is not among them: the target runs the
    committed spec (:mod:`embnic.control.targets.p4compiled`)."""
    inc = headers_dir()
    if not all((inc / h).is_file() for h in INTERNAL_HEADERS):
        return (f"DPDK's pipeline headers {', '.join(INTERNAL_HEADERS)} not in {inc}: run "
                f"scripts/dpdk-pipeline-headers.sh (scripts/install-deps.sh runs it)")
    if not SWX_BINARY.is_file():
        return f"{SWX_BINARY} not built: run make -C dataplane"
    return None


def require() -> None:
    """Raise :class:`MissingDependencyError` (one line) when :func:`missing` names something."""
    why = missing()
    if why:
        raise MissingDependencyError(f"the p4dpdk target needs {why}", dependency=why.split()[0])


# --------------------------------------------------------------------------- build
@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A built pipeline: the library embnic-swx loads, the spec and context JSON it came from."""

    lib: Path
    spec: Path
    context: Path
    digest: str
    #: worth saying once at load (p4compiled.Outputs.note), or None
    note: str | None = None


def cache_dir() -> Path:
    """Compiled pipelines, kept between loads: :func:`p4compiled.cache_dir` ``/p4dpdk/<digest[:16]>``."""
    return p4compiled.cache_dir("p4dpdk")


def _ident(path: str | None) -> str:
    if not path:
        return "-"
    st = os.stat(path)
    return f"{os.path.realpath(path)}:{st.st_mtime_ns}"


def pipeline_digest(program: p4compiled.Outputs) -> str:
    """SHA-256 (hex) of everything :func:`build_pipeline` reads: the compiled program's files
    (``program.digest``), the embnic-swx binary, this module (its rewrites of the spec), the C
    compiler, and the DPDK version and pipeline headers — what the machine has, not which p4c
    (if any) is installed."""
    hdr = headers_dir()
    parts = [program.digest, _ident(str(SWX_BINARY)) if SWX_BINARY.exists() else "-",
             hashlib.sha256(Path(__file__).read_bytes()).hexdigest(), _ident(shutil.which("gcc")),
             dpdk_version() or "-"] + [(hdr / h).read_text(errors="replace") if (hdr / h).is_file() else "-"
                                       for h in INTERNAL_HEADERS]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


_run = functools.partial(p4compiled.run_tool, error=P4DpdkError)


def build_pipeline(out_dir: Path | None = None) -> Pipeline:
    """The PNA program as a pipeline library for embnic-swx: the compiled spec
    (:func:`embnic.control.targets.p4compiled.outputs`) → the load-time rewrites → codegen →
    ``gcc -shared``.

    Reused when ``out_dir`` (default: ``cache_dir()/<digest[:16]>``) already holds a build of
    the same digest (:func:`pipeline_digest`); built in a temporary folder beside it and renamed
    into place, so concurrent builds never see half a pipeline.

    Raises:
        MissingDependencyError: the DPDK pipeline headers or embnic-swx missing; the P4 sources
            were edited and p4c-dpdk 1.2.4.8 is not on PATH (one line each).
        P4DpdkError: a step failed (its command and output in the message).
        P4CompileError: the committed outputs are damaged, or compiling edited sources failed.
    """
    require()
    program = p4compiled.outputs("pna")
    digest = pipeline_digest(program)
    out_dir = Path(out_dir) if out_dir else cache_dir() / digest[:16]
    pipe = Pipeline(out_dir / "embnic.so", out_dir / "embnic.spec", out_dir / "context.json", digest, program.note)
    stamp = out_dir / "embnic.sha256"
    if pipe.lib.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return pipe
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=out_dir.parent))
    try:
        shutil.copyfile(program.path("spec"), tmp / "embnic.p4c-dpdk.spec")
        shutil.copyfile(program.path("context"), tmp / "context.json")
        # DPDK 22.11 addresses 256 bytes of metadata: p4c-dpdk's temporaries go to scratch headers
        text, moved = relocate_metadata((tmp / "embnic.p4c-dpdk.spec").read_text())
        text, moved["regadd_immediates"] = split_regadd_immediates(text)
        spec = tmp / "embnic.spec"
        spec.write_text(text)
        (tmp / "relocation.json").write_text(json.dumps(moved) + "\n")
        code = tmp / "embnic.c"
        prefix = unique_prefix("swxgen")
        try:
            _run([str(SWX_BINARY), "-l", "0", "--no-huge", "--no-pci", "-m", "64", "--no-telemetry",
                  "--file-prefix", prefix, "--log-level", "lib.eal:error", "--", "--codegen", str(spec), str(code)],
                 "rte_swx_pipeline_codegen (embnic-swx --codegen)", 300)
        finally:
            remove_runtime_dir(prefix)
        cflags = _run(["pkg-config", "--cflags", "libdpdk"], "pkg-config libdpdk", 60).split()
        _run(["gcc", "-shared", "-fPIC", "-O2", "-w", f"-I{headers_dir()}", *cflags,
              "-DALLOW_EXPERIMENTAL_API", str(code), "-o", str(tmp / "embnic.so")], "gcc (the pipeline library)",
             900)
        (tmp / "embnic.sha256").write_text(digest + "\n")
        out_dir.mkdir(parents=True, exist_ok=True)
        for f in sorted(tmp.iterdir()):
            os.replace(f, out_dir / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return pipe


# --------------------------------------------------------------------------- regadd with two immediates
#: the metadata field :func:`split_regadd_immediates` adds (the increment, moved out of the instruction)
REGADD_SOURCE = "embnic_regadd_src"
_REGADD_RII = re.compile(r"^(\s*(?:\w+ :\s*)?)regadd (\S+) (0x[0-9A-Fa-f]+|\d+) (0x[0-9A-Fa-f]+|\d+)[ \t]*$", re.M)


def split_regadd_immediates(spec: str) -> tuple[str, int]:
    """The spec with every ``regadd ARRAY INDEX VALUE`` whose index and value are both
    immediates rewritten as ``mov m.embnic_regadd_src VALUE`` + ``regadd ARRAY INDEX
    m.embnic_regadd_src`` (the field added to the metadata struct): DPDK 22.11 translates that
    form (``INSTR_REGADD_RII``) without its register array, so it adds to the first array the
    spec declares (p4/README.md "PNA on DPDK").

    Returns:
        ``(spec, number of instructions rewritten)``.
    Raises:
        P4DpdkError: the spec has no metadata struct.
    """
    m = re.search(r"^metadata instanceof (\w+)\s*$", spec, re.M)
    if not m:
        raise P4DpdkError("the pipeline spec has no metadata struct (not p4c-dpdk's output?)")
    spec, n = _REGADD_RII.subn(lambda x: f"{x.group(1)}mov m.{REGADD_SOURCE} {x.group(4)}\n"
                                         f"\tregadd {x.group(2)} {x.group(3)} m.{REGADD_SOURCE}", spec)
    if n:   # the field goes last: a hash destination must stay first (relocate_metadata)
        body = re.search(r"^struct %s \{\n(.*?)^\}" % re.escape(m.group(1)), spec, re.S | re.M)
        if not body:
            raise P4DpdkError("the pipeline spec has no metadata struct (not p4c-dpdk's output?)")
        spec = spec[:body.end(1)] + f"\tbit<64> {REGADD_SOURCE}\n" + spec[body.end(1):]
    return spec, n


# --------------------------------------------------------------------------- metadata relocation
#: bytes of one struct an SWX instruction can address: DPDK 22.11's ``struct instr_operand`` keeps
#: a field's byte offset in a ``uint8_t`` (rte_swx_pipeline_internal.h) and nothing checks it
STRUCT_ADDRESSABLE = 256
#: how full a scratch header is packed (below STRUCT_ADDRESSABLE)
SCRATCH_BYTES = 248
_STRUCT = re.compile(r"^struct (\w+) \{\n(.*?)^\}", re.S | re.M)
_FIELD = re.compile(r"^\s*bit<(\d+)> (\w+)\s*$", re.M)


def relocate_metadata(spec: str) -> tuple[str, dict]:
    """The spec with the metadata fields no table, hash or port instruction needs moved into
    scratch headers (never extracted, never emitted), so that every struct an instruction
    addresses stays within :data:`STRUCT_ADDRESSABLE` bytes.

    Why (p4/README.md "PNA on DPDK"): p4c-dpdk 1.2.4.8 makes every temporary a metadata field,
    and DPDK 22.11 addresses a field by a one-byte offset into its struct, unchecked. Header
    fields are addressed the same way, per header, so each scratch header holds up to
    :data:`SCRATCH_BYTES` bytes of fields.

    Kept in metadata: the program's own ``local_metadata_*`` and the architecture's ``pna_*``
    fields, ``table_entry_index`` (``entryid``), table and learner keys, and the operands of
    ``rx``, ``tx`` and ``hash`` (its source is a range of consecutive metadata fields); a
    ``hash`` destination goes first (22.11 truncates its offset in bits to 8 bits).

    Returns:
        ``(spec, {"metadata_bytes", "moved_fields", "scratch_headers"})``.
    Raises:
        P4DpdkError: the spec has no metadata struct, or what must stay exceeds the limit.
    """
    m = re.search(r"^metadata instanceof (\w+)\s*$", spec, re.M)
    structs = {n: body for n, body in _STRUCT.findall(spec)}
    if not m or m.group(1) not in structs:
        raise P4DpdkError("the pipeline spec has no metadata struct (not p4c-dpdk's output?)")
    mname = m.group(1)
    fields = [(int(w), n) for w, n in _FIELD.findall(structs[mname])]
    order = {n: i for i, (_, n) in enumerate(fields)}
    keep = {n for _, n in fields if n.startswith(("local_metadata_", "pna_")) or n == "table_entry_index"}
    for block in re.findall(r"^\s*key \{\n(.*?)^\s*\}", spec, re.S | re.M):
        keep |= set(re.findall(r"\bm\.(\w+)", block))
    for line in re.findall(r"^\s*(?:\w+ :\s*)?(?:rx|tx|hash|entryid|learn|mirror|recircid)\b.*$", spec, re.M):
        names = re.findall(r"\bm\.(\w+)", line)
        keep |= set(names)
        if line.strip().split(":")[-1].split()[0] == "hash" and len(names) >= 3:
            lo, hi = order[names[1]], order[names[2]]   # the source range, first to last field
            keep |= {n for _, n in fields[lo:hi + 1]}
    # hash destinations first: DPDK 22.11's hash instruction keeps its destination's offset as
    # (uint8_t)(offset in bits) / 8 (rte_swx_pipeline.c, instr_hash_translate), so it must lie in
    # the first 32 bytes of the metadata (further on, the hash lands in another field)
    hash_dst = {names[0] for line in re.findall(r"^\s*(?:\w+ :\s*)?hash\b.*$", spec, re.M)
                if (names := re.findall(r"\bm\.(\w+)", line))}
    kept = [(w, n) for w, n in fields if n in hash_dst] + [(w, n) for w, n in fields if n in keep - hash_dst]
    kept_bytes = sum(w // 8 for w, _ in kept)
    if kept_bytes >= STRUCT_ADDRESSABLE:
        raise P4DpdkError(f"the pipeline's metadata that must stay metadata is {kept_bytes} bytes; DPDK's SWX "
                          f"pipeline addresses {STRUCT_ADDRESSABLE}")
    moved = [(w, n) for w, n in fields if n not in keep]
    headers: list[list[tuple[int, str]]] = []
    size = SCRATCH_BYTES
    for w, n in moved:
        if size + w // 8 > SCRATCH_BYTES:
            headers.append([])
            size = 0
        headers[-1].append((w, n))
        size += w // 8
    # short names: the spec's tokens are at most 63 characters (RTE_SWX_NAME_SIZE)
    short = {n: f"v{i}" for i, (_, n) in enumerate(moved)}
    where = {n: f"h.scratch{k}.{short[n]}" for k, hs in enumerate(headers) for _, n in hs}
    meta_text = "struct %s {\n%s}" % (mname, "".join(f"\tbit<{w}> {n}\n" for w, n in kept))
    spec = spec.replace(f"struct {mname} {{\n{structs[mname]}}}", meta_text, 1)
    decl = "".join("struct scratch%d_t {\n%s}\nheader scratch%d instanceof scratch%d_t\n\n" %
                   (k, "".join(f"\tbit<{w}> {short[n]}\n" for w, n in hs), k, k) for k, hs in enumerate(headers))
    spec = spec.replace(m.group(0), m.group(0) + "\n\n" + decl.rstrip("\n"), 1)
    spec = re.sub(r"\bm\.(\w+)", lambda x: where.get(x.group(1), x.group(0)), spec)
    return spec, {"metadata_bytes": kept_bytes, "moved_fields": len(moved), "scratch_headers": len(headers)}


# --------------------------------------------------------------------------- names
@dataclasses.dataclass
class Names:
    """The pipeline's names of the program's tables, actions, registers and counters, from
    p4c-dpdk's context JSON, looked up by the program's control-plane names (``@name(".x")``).
    """

    tables: dict[str, str]
    actions: dict[str, dict[str, str]]  #: table -> {action: target name}
    action_params: dict[str, dict[str, list[str]]]  #: table -> {action: [parameter names, P4 order]}
    registers: dict[str, str]
    counters: dict[str, tuple[str, str]]  #: counter -> (type, target name)

    @classmethod
    def load(cls, context: Path) -> "Names":
        """Read ``context.json``.

        Raises:
            P4DpdkError: it is not p4c-dpdk's context JSON.
        """
        try:
            ctx = json.loads(Path(context).read_text())
            tables, actions, params = {}, {}, {}
            for t in ctx["tables"]:
                short = _short(t["name"])
                tables[short] = t["target_name"]
                # the spec names an action by the last part of its target name (PnaMainControl._x -> _x)
                actions[short] = {_short(a["name"]): _short(a["target_name"]) for a in t.get("actions", [])}
                params[short] = {_short(a["name"]): [p["name"] for p in a.get("p4_parameters", [])]
                                 for a in t.get("actions", [])}
            registers, counters = {}, {}
            for e in ctx.get("externs", []):
                if e["type"] == "Register":
                    registers[_short(e["name"])] = e["target_name"]
                elif e["type"] in ("Counter", "DirectCounter"):
                    counters[_short(e["name"])] = (e["attributes"].get("type", ""), e["target_name"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise P4DpdkError(f"{context}: not a p4c-dpdk context JSON ({e})") from None
        return cls(tables, actions, params, registers, counters)

    def table(self, name: str) -> str:
        try:
            return self.tables[name]
        except KeyError:
            raise P4DpdkError(f"the pipeline has no table {name} (its tables: {', '.join(sorted(self.tables))})") from None

    def action(self, table: str, name: str) -> str:
        try:
            return self.actions[table][name]
        except KeyError:
            raise P4DpdkError(f"table {table} of the pipeline has no action {name}") from None

    def params(self, table: str, action: str) -> list[str]:
        """Parameter names of ``table``'s ``action``, in the P4 order."""
        self.action(table, action)
        return self.action_params[table][action]

    def register(self, name: str) -> str:
        try:
            return self.registers[name]
        except KeyError:
            raise P4DpdkError(f"the pipeline has no register {name}") from None

    def counter(self, name: str, kind: str = "packets") -> str:
        """The register array holding counter ``name``'s ``kind`` (``packets`` or ``bytes``): a
        packets-and-bytes counter is two arrays, ``TARGET_packets`` and ``TARGET_bytes``; a
        packets (or bytes) counter one, named ``TARGET``."""
        try:
            typ, target = self.counters[name]
        except KeyError:
            raise P4DpdkError(f"the pipeline has no counter {name}") from None
        return f"{target}_{kind}" if typ == "packets_and_bytes" else target


def _short(name: str) -> str:
    """``EmbnicIngress.route_by_shard`` / ``.route_by_shard`` -> ``route_by_shard``."""
    return name.rsplit(".", 1)[-1]


@functools.lru_cache(maxsize=None)
def names_of(context: str) -> Names:
    """:meth:`Names.load`, once per context file."""
    return Names.load(Path(context))


def entry_line(names: Names, table: str, key: Sequence[int], action: str = "", params: Sequence[int] = ()) -> str:
    """The SWX control API's text of a table entry, ``match 0x.. [0x..] action NAME ARG 0x.. ...``,
    with the pipeline's names of ``table``'s ``action`` and its parameters in the P4 order
    (from the context JSON); only the match part when ``action`` is empty (a delete)."""
    words = ["match", *(hex(int(k)) for k in key)]
    if action:
        words += ["action", names.action(table, action)]
        words += [f"{p} {hex(int(v))}" for p, v in zip(names.params(table, action), params)]
    return " ".join(words)
