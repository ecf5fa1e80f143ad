"""What p4c makes of the project's own P4 program, committed under ``p4/build/`` with a manifest
(p4/README.md lists the files, the tools and why they are committed), reproducibly
(:func:`normalise`); ``make -C p4`` regenerates them with the tested p4c (:data:`TESTED_VERSION`).
The targets take their program from :func:`outputs`: the committed files while ``p4/`` is
unchanged, else the edited sources compiled into the cache by the tested compiler, or refused in
one line naming the fix.

    out = outputs("pna"); out.path("spec"), out.source   # (.../p4/build/pna/embnic.spec, 'committed')
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

from embnic.control.errors import MissingDependencyError, OperationalError
from embnic.control.targets import p4program as p4prog

P4_DIR = p4prog.P4_DIR
#: the committed outputs
BUILD_DIR = P4_DIR / "build"
MANIFEST = BUILD_DIR / "manifest.json"
#: the p4c release the committed outputs are compiled with and tested against (both compilers)
TESTED_VERSION = "1.2.4.8"
#: the command that regenerates the committed outputs
REGENERATE = "make -C p4"
#: where the docs say which P4 tools each target needs and where their install docs are
TOOLS_DOC = 'p4/README.md, "P4 tools"'


@dataclasses.dataclass(frozen=True)
class Arch:
    """One architecture's compile: the compiler on PATH, the top-level program (relative to
    ``p4/``), the options, and the outputs by role (file names in ``build/<arch>/``)."""

    compiler: str
    main: str
    files: dict[str, str]

    def command(self, out: str) -> list[str]:
        """The compiler's argv (compiler name first), paths relative to ``p4/``, writing into ``out``
        (a folder relative to ``p4/``)."""
        f = {role: f"{out}/{name}" for role, name in self.files.items()}
        if self.compiler == "p4c":
            return ["p4c", "--target", "bmv2", "--arch", "v1model", "-o", out, "--p4runtime-files", f["p4info"],
                    self.main]
        # LocalCopyPropagation off: it folds locals and metadata into later expressions, which
        # p4c-dpdk 1.2.4.8 then lowers wrongly where a value is used twice (p4/README.md)
        return ["p4c-dpdk", "--arch", "pna", "--excludeMidendPasses", "P4::LocalCopyPropagation", "-o", f["spec"],
                "--context", f["context"], "--bf-rt-schema", f["bfrt"], "--p4runtime-files", f["p4info"], self.main]


#: the architectures of the program (p4program.MAINS) and how each is compiled
ARCHS = {
    "v1model": Arch("p4c", "v1model/embnic.p4", {"json": "embnic.json", "p4info": "embnic.p4info.txtpb"}),
    "pna": Arch("p4c-dpdk", "pna/embnic.p4", {"spec": "embnic.spec", "context": "context.json", "bfrt": "bfrt.json",
                                              "p4info": "embnic.p4info.txtpb"}),
}
#: the target each architecture is run by (for messages)
TARGET_OF = {"v1model": "bmv2", "pna": "p4dpdk"}
#: fields of p4c-dpdk's JSON outputs that differ run to run (dropped by :func:`normalise`)
VOLATILE_KEYS = ("build_date", "compile_command")


class P4CompileError(OperationalError):
    """A compiler failed or warned, or the committed outputs do not match the sources (exit 1)."""


# --------------------------------------------------------------------------- sources
def program_files(p4_dir: Path = P4_DIR) -> list[Path]:
    """Every P4 file under ``p4_dir`` (``*.p4``, the committed outputs' folder left out), sorted
    by path: what the committed outputs are compiled from."""
    p4_dir = Path(p4_dir)
    return sorted(p for p in p4_dir.rglob("*.p4") if (p4_dir / "build") not in p.parents)


def sources_digest(p4_dir: Path = P4_DIR) -> str:
    """``sha256:<hex>`` of :func:`program_files` — each file's path relative to ``p4_dir`` and its
    bytes. The compilers' own includes are not in it: the compiler's version is recorded
    beside it in the manifest instead."""
    p4_dir = Path(p4_dir)
    h = hashlib.sha256()
    for path in program_files(p4_dir):
        h.update(str(path.relative_to(p4_dir)).encode() + b"\0" + path.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of one file's bytes."""
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


# --------------------------------------------------------------------------- compilers
#: the p4c release the committed outputs are compiled with, by the commit its binaries print
#: (``p4c-dpdk`` prints its backend's own "Version 0.1" and p4c's commit, not p4c's release)
TESTED_SHA = "32893b7e879db9e1c368d3568d41cb3d20c034d0"
_RELEASE = re.compile(r"\b(\d+\.\d+\.\d+(?:\.\d+)?)\b")
_SHA = re.compile(r"\bSHA:\s*([0-9a-fA-F]{7,40})\b")


def compiler_version(name: str) -> tuple[str, str] | None:
    """``(p4c release, version line)`` of compiler ``name`` on PATH, or None where it is not on
    PATH or prints nothing like a version. The release is :data:`TESTED_VERSION` where the
    printed commit is :data:`TESTED_SHA` (``p4c 1.2.4.8 (SHA: 32893b7e87 BUILD: Release)``;
    ``p4c-dpdk`` prints ``Version 0.1 (SHA: 32893b7e87 ...)``), else the release number the line
    carries, else ``unknown (SHA: …)``."""
    path = shutil.which(name)
    if path is None:
        return None
    try:
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln.strip() for ln in (r.stdout + r.stderr).splitlines() if "version" in ln.lower() or _SHA.search(ln)
             or _RELEASE.search(ln)]
    if not lines:
        return None
    line = lines[0]
    sha = _SHA.search(line)
    if sha and TESTED_SHA.startswith(sha.group(1).lower()):
        return TESTED_VERSION, line
    rel = _RELEASE.search(line)
    return (rel.group(1) if rel else f"unknown (SHA: {sha.group(1) if sha else '?'})"), line


def compiler_status(arch: str) -> tuple[str, str | None]:
    """Whether ``arch``'s compiler can regenerate the committed outputs: ``("tested", line)`` —
    :data:`TESTED_VERSION` on PATH; ``("other", line)`` — another version on PATH;
    ``("absent", None)``.

    Raises:
        KeyError: an unknown architecture.
    """
    v = compiler_version(ARCHS[arch].compiler)
    if v is None:
        return "absent", None
    return ("tested" if v[0] == TESTED_VERSION else "other"), v[1]


def missing_compiler_message(arch: str, why: str) -> str:
    """One line: ``why``, which compiler of which version is needed, and where the docs are."""
    return (f"{why}: that needs {ARCHS[arch].compiler} {TESTED_VERSION} on PATH (p4c's {'DPDK' if arch == 'pna' else 'BMv2'} "
            f"backend; {TOOLS_DOC})")


# --------------------------------------------------------------------------- compile
def run_tool(cmd: Sequence[str], what: str, timeout: float, *, cwd: Path | None = None,
             shown: Sequence[str] | None = None, error: type[Exception] = P4CompileError) -> str:
    """Run ``cmd`` (a compiler, a build step); returns its output (stdout + stderr, stripped).

    Raises:
        error: it ran longer than ``timeout`` s, or failed (its exit code and the output's end),
            naming ``what`` and the command (``shown``, default ``cmd``).
    """
    line = " ".join(shown or cmd)
    try:
        r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise error(f"{what} took more than {timeout:.0f} s: {line}") from None
    out = (r.stdout + r.stderr).strip()
    if r.returncode != 0:
        raise error(f"{what} failed (exit {r.returncode}): {line}\n{out[-4000:]}")
    return out


def make_restorable(json_path: Path) -> int:
    """Pad a BMv2 JSON with trailing spaces until its MD5 has no whitespace byte, so that
    ``--restore-state`` can read a saved state (p4/README.md). Returns how many spaces were added.

    Raises:
        P4CompileError: no padding up to 4096 spaces works (never seen).
    """
    data = Path(json_path).read_bytes().rstrip(b" ")
    for pad in range(4096):
        if not any(b in b"\t\n\v\f\r " for b in hashlib.md5(data + b" " * pad).digest()):
            Path(json_path).write_bytes(data + b" " * pad)
            return pad
    raise P4CompileError(f"no padding of {json_path} gives an MD5 without whitespace bytes")


def normalise(arch: str, out_dir: Path) -> None:
    """Make one compile's outputs in ``out_dir`` the same bytes run after run: p4c-dpdk's JSON
    outputs lose :data:`VOLATILE_KEYS` (at any depth) and are rewritten with a 2-space indent;
    the BMv2 JSON is padded by :func:`make_restorable`."""
    out_dir = Path(out_dir)
    if arch == "v1model":
        make_restorable(out_dir / ARCHS[arch].files["json"])
        return

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in VOLATILE_KEYS}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    for role in ("context", "bfrt"):
        path = out_dir / ARCHS[arch].files[role]
        path.write_text(json.dumps(strip(json.loads(path.read_text())), indent=2) + "\n")


def compile_arch(arch: str, out_dir: Path, p4_dir: Path = P4_DIR, timeout: float = 900) -> dict:
    """Compile ``arch`` from the P4 files of ``p4_dir`` into ``out_dir`` exactly as the committed
    outputs are made: in a temporary copy of the sources, paths relative to it, then
    :func:`normalise`. Warnings count as failures (the program compiles clean).

    Returns:
        the manifest entry: ``{"compiler", "compiler_version", "compiler_version_line",
        "command", "files": {name: sha256}}`` (command: the exact argv joined, run in ``p4/``).
    Raises:
        KeyError: an unknown architecture.
        MissingDependencyError: the compiler is not on PATH.
        P4CompileError: the compiler failed, warned or wrote no output.
    """
    a = ARCHS[arch]
    ver = compiler_version(a.compiler)
    if ver is None:
        raise MissingDependencyError(missing_compiler_message(arch, f"compiling p4/{a.main}"), dependency=a.compiler)
    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="embnic-p4c-") as tmp:
        root = Path(tmp) / "p4"
        for src in program_files(Path(p4_dir)):
            (root / src.relative_to(p4_dir)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, root / src.relative_to(p4_dir))
        rel_out = f"build/{arch}"
        (root / rel_out).mkdir(parents=True)
        argv = a.command(rel_out)
        msg = run_tool([shutil.which(a.compiler), *argv[1:]], a.compiler, timeout, cwd=root, shown=argv)
        if msg:
            raise P4CompileError(f"{a.compiler} warned (the program must compile clean): {' '.join(argv)}\n{msg}")
        missing = [n for n in a.files.values() if not (root / rel_out / n).is_file()]
        if missing:
            raise P4CompileError(f"{a.compiler} wrote no {', '.join(missing)}: {' '.join(argv)}")
        normalise(arch, root / rel_out)
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in a.files.values():
            shutil.copyfile(root / rel_out / name, out_dir / name)
    return {"compiler": a.compiler, "compiler_version": ver[0], "compiler_version_line": ver[1],
            "command": " ".join(argv), "files": {n: file_digest(out_dir / n) for n in sorted(a.files.values())}}


def _compile_into(arch: str, dest: Path, p4_dir: Path = P4_DIR) -> dict:
    """:func:`compile_arch` into a folder beside ``dest``, then renamed to ``dest`` (replacing it
    whole): a concurrent reader never sees half of it. Returns the manifest entry."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{arch}-", dir=dest.parent))
    try:
        entry = compile_arch(arch, tmp, p4_dir)
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 is no folder's mode in a checkout
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


def regenerate(archs: Sequence[str] = tuple(ARCHS), p4_dir: Path = P4_DIR) -> dict:
    """Compile every architecture of ``archs`` with the tested compilers into ``p4_dir/build/``
    and write its manifest (what ``make -C p4`` runs). All compilers are checked before anything
    is written; each folder is replaced whole.

    Returns:
        the manifest written.
    Raises:
        MissingDependencyError: a compiler is absent or not :data:`TESTED_VERSION` (names it).
        P4CompileError: a compile failed or warned.
    """
    p4_dir = Path(p4_dir)
    for arch in archs:
        status, line = compiler_status(arch)
        if status != "tested":
            why = ("not on PATH" if status == "absent" else f"on PATH is {line!r}, not {TESTED_VERSION}")
            raise MissingDependencyError(missing_compiler_message(arch, f"{ARCHS[arch].compiler} {why}; regenerating "
                                                                        f"p4/build/{arch}"),
                                         dependency=ARCHS[arch].compiler)
    build = p4_dir / "build"
    man_path = build / "manifest.json"
    man = json.loads(man_path.read_text()) if man_path.is_file() else {}
    outputs = dict(man.get("outputs", {}))
    for arch in archs:
        outputs[arch] = _compile_into(arch, build / arch, p4_dir)
    man = {"sources": {"digest": sources_digest(p4_dir),
                       "files": [str(p.relative_to(p4_dir)) for p in program_files(p4_dir)]},
           "regenerate": REGENERATE, "cwd": "p4", "outputs": {a: outputs[a] for a in sorted(outputs)}}
    man_path.write_text(json.dumps(man, indent=2) + "\n")
    return man


# --------------------------------------------------------------------------- the committed outputs
def manifest(build_dir: Path = BUILD_DIR) -> dict:
    """The committed manifest (``p4/build/manifest.json``).

    Raises:
        P4CompileError: missing or not JSON (names the regenerate command).
    """
    path = Path(build_dir) / "manifest.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise P4CompileError(f"{path}: {getattr(e, 'strerror', None) or e}: the committed P4 outputs are "
                             f"incomplete; restore them from git or run {REGENERATE}") from None


def stale(p4_dir: Path = P4_DIR) -> list[str]:
    """What makes the committed outputs not those of the sources under ``p4_dir``, one line each
    (empty when they are): the sources' digest differs from the manifest's, an output is missing
    or not the bytes the manifest names."""
    p4_dir = Path(p4_dir)
    try:
        man = manifest(p4_dir / "build")
    except P4CompileError as e:
        return [str(e)]
    out = []
    if man.get("sources", {}).get("digest") != sources_digest(p4_dir):
        was, now = set(man.get("sources", {}).get("files", [])), {str(p.relative_to(p4_dir)) for p in program_files(p4_dir)}
        detail = "; ".join(x for x in (f"added {', '.join(sorted(now - was))}" if now - was else "",
                                       f"removed {', '.join(sorted(was - now))}" if was - now else "") if x)
        out.append(f"the P4 sources under {p4_dir} changed since p4/build was compiled{' (' + detail + ')' if detail else ''}")
    for arch in ARCHS:
        entry = man.get("outputs", {}).get(arch)
        if entry is None:
            out.append(f"p4/build/manifest.json has no outputs for {arch}")
            continue
        for name, digest in entry.get("files", {}).items():
            path = p4_dir / "build" / arch / name
            if not path.is_file():
                out.append(f"p4/build/{arch}/{name} is missing")
            elif file_digest(path) != digest:
                out.append(f"p4/build/{arch}/{name} is not what the manifest records (edited by hand?)")
    return out


@dataclasses.dataclass(frozen=True)
class Outputs:
    """One architecture's compiled program as a target uses it: the folder, where it came from
    (``"committed"`` or ``"compiled"``: the sources changed and the tested compiler compiled them
    into the cache), its digest (``sha256:`` of its files, for the targets' caches) and what is
    worth saying once (``note``, or None)."""

    arch: str
    dir: Path
    source: str
    digest: str
    note: str | None = None

    def path(self, role: str) -> Path:
        """The output of ``role`` (``json``, ``p4info``, ``spec``, ``context``, ``bfrt``)."""
        return self.dir / ARCHS[self.arch].files[role]


def cache_dir(sub: str = "p4c") -> Path:
    """Where builds are kept between loads: ``$EMBNIC_CACHE_DIR`` (else ``$XDG_CACHE_HOME/embnic``,
    else ``~/.cache/embnic``) ``/SUB``; ``p4c``: programs compiled from edited sources."""
    env = os.environ.get("EMBNIC_CACHE_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "embnic"
    return base / sub


def _digest_of(files: dict[str, str]) -> str:
    """One digest of a compiled program from its files' (``{name: "sha256:..."}``, as the manifest
    records them): the targets' cache key."""
    return "sha256:" + hashlib.sha256("".join(f"{n}\0{files[n]}\0" for n in sorted(files)).encode()).hexdigest()


def outputs(arch: str) -> Outputs:
    """The compiled program a target runs for ``arch`` (module docstring): the committed one
    while ``p4/`` is unchanged, whatever compiler is installed (a note says so where another
    version is on PATH); else, with the tested compiler on PATH, the edited sources compiled
    into :func:`cache_dir` (a note asks for ``make -C p4``).

    Raises:
        KeyError: an unknown architecture.
        MissingDependencyError: the sources changed and the tested compiler is not on PATH.
        P4CompileError: the committed files are not the manifest's; the compile failed or warned.
    """
    a = ARCHS[arch]
    problems = stale()
    src_changed = [p for p in problems if p.startswith("the P4 sources")]
    if problems and not src_changed:
        raise P4CompileError(f"{problems[0]}: restore p4/build from git or run {REGENERATE}")
    if not src_changed:
        d = BUILD_DIR / arch
        status, line = compiler_status(arch) if shutil.which(a.compiler) else ("absent", None)
        note = (f"{a.compiler} on PATH is {line!r}, not the tested {TESTED_VERSION}: the {TARGET_OF[arch]} target "
                f"uses the committed p4/build/{arch}" if status == "other" else None)
        # stale() has just checked each file against the manifest's digest: that digest stands for it
        return Outputs(arch, d, "committed", _digest_of(manifest()["outputs"][arch]["files"]), note)
    status, line = compiler_status(arch)
    if status != "tested":
        why = "is not on PATH" if status == "absent" else f"on PATH is {line!r}"
        raise MissingDependencyError(missing_compiler_message(
            arch, f"{src_changed[0]} and {a.compiler} {TESTED_VERSION} {why}; restore p4/ from git, or compile it "
                  f"with {REGENERATE}"), dependency=a.compiler)
    key = hashlib.sha256(f"{sources_digest()}\0{line}\0{arch}".encode()).hexdigest()[:16]
    d = cache_dir() / arch / key
    if not all((d / n).is_file() for n in a.files.values()):
        _compile_into(arch, d)
    return Outputs(arch, d, "compiled", _digest_of({n: file_digest(d / n) for n in a.files.values()}),
                   f"p4/ differs from its committed outputs: {a.compiler} compiled it into {d}; "
                   f"run {REGENERATE} and commit p4/build")


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m embnic.control.targets.p4compiled [--check] [--p4-dir DIR]``: regenerate
    ``DIR/build`` (default: the installed package's ``p4/``; ``make -C p4`` passes its own folder,
    so a second checkout checks its own sources whatever the editable install points to) or, with
    ``--check``, list what is stale; exit 0 on success, 1 on a stale or failed build, 2 where a
    tested compiler is missing or the arguments are wrong."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python3 -m embnic.control.targets.p4compiled",
                                 description="Regenerate or check p4/build, what p4c makes of p4/.")
    ap.add_argument("--check", action="store_true", help="only say whether p4/build is the sources' (no compiler)")
    ap.add_argument("--p4-dir", type=Path, default=P4_DIR, help="the p4/ folder (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.check:
        problems = stale(args.p4_dir)
        for p in problems:
            print(f"embnic: {p}", file=sys.stderr)
        if problems:
            print(f"embnic: run {REGENERATE} (needs p4c and p4c-dpdk {TESTED_VERSION} on PATH; {TOOLS_DOC})",
                  file=sys.stderr)
            return 1
        print(f"{args.p4_dir}/build is up to date with the P4 sources under {args.p4_dir}")
        return 0
    try:
        man = regenerate(p4_dir=args.p4_dir)
    except (MissingDependencyError, P4CompileError) as e:
        print(f"embnic: {e}", file=sys.stderr)
        return e.exit_code
    for arch, entry in man["outputs"].items():
        print(f"p4/build/{arch}: {entry['compiler']} {entry['compiler_version']}: {', '.join(entry['files'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
