"""The committed outputs of the P4 program (p4/build/, embnic.control.targets.p4compiled): they are the
sources' on every machine, compile afresh to the same bytes where the tested p4c is installed, and the
targets run them with the compiled sizes.
Run alone: python3 -m pytest -q tests/p4/test_p4_compiled.py
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from embnic.client_lib.config import load_config
from embnic.control.errors import MissingDependencyError, UsageError
from embnic.control.targets import p4compiled
from embnic.control.targets import p4program as p4prog

REPO = Path(__file__).resolve().parents[2]


def test_committed_outputs_are_the_sources():
    """On every machine: a change under p4/ without regenerating p4/build fails here, naming the fix."""
    problems = p4compiled.stale()
    assert not problems, (f"{'; '.join(problems)}: run `{p4compiled.REGENERATE}` with p4c and p4c-dpdk "
                          f"{p4compiled.TESTED_VERSION} on PATH ({p4compiled.TOOLS_DOC}) and commit p4/build")


def test_manifest_records_compiler_version_and_command():
    man = p4compiled.manifest()
    assert man["regenerate"] == "make -C p4" and man["sources"]["digest"].startswith("sha256:")
    assert set(man["outputs"]) == set(p4compiled.ARCHS)
    for arch, entry in man["outputs"].items():
        a = p4compiled.ARCHS[arch]
        assert entry["compiler"] == a.compiler and entry["compiler_version"] == p4compiled.TESTED_VERSION
        assert entry["command"] == " ".join(a.command(f"build/{arch}"))
        assert not any(w.startswith("/") for w in entry["command"].split()), "paths relative to p4/"
        assert sorted(entry["files"]) == sorted(a.files.values())
    # what differs run to run is not there
    for name in ("context", "bfrt"):
        text = p4compiled.outputs("pna").path(name).read_text()
        assert not any(f'"{k}"' in text for k in p4compiled.VOLATILE_KEYS), name


def test_stale_names_an_edited_source_and_an_edited_output(tmp_path):
    p4 = tmp_path / "p4"
    shutil.copytree(p4compiled.P4_DIR, p4)
    assert p4compiled.stale(p4) == []
    (p4 / "types.p4").write_text((p4 / "types.p4").read_text() + "\n// edited\n")
    (p4 / "extra.p4").write_text("// new\n")
    (p4 / "build" / "pna" / "embnic.spec").write_text("edited\n")
    problems = p4compiled.stale(p4)
    assert any("P4 sources" in p and "added extra.p4" in p for p in problems), problems
    assert "p4/build/pna/embnic.spec is not what the manifest records (edited by hand?)" in problems
    r = subprocess.run([sys.executable, "-m", "embnic.control.targets.p4compiled", "--check"], capture_output=True,
                       text=True, cwd=REPO)
    assert r.returncode == 0 and r.stderr == "", r.stderr   # the repository's own p4/ is consistent


@pytest.mark.parametrize("arch", sorted(p4compiled.ARCHS))
def test_fresh_compile_is_byte_identical(arch, tmp_path):
    """Where the tested compiler is on PATH, compiling p4/ again gives the committed bytes."""
    status, line = p4compiled.compiler_status(arch)
    compiler = p4compiled.ARCHS[arch].compiler
    if status == "absent":
        pytest.skip(f"{compiler} not on PATH: the fresh-compile check needs p4c {p4compiled.TESTED_VERSION} "
                    f"({p4compiled.TOOLS_DOC})")
    if status == "other":
        pytest.skip(f"{compiler} on PATH is {line!r}, not the tested {p4compiled.TESTED_VERSION}: the targets use "
                    "the committed outputs")
    entry = p4compiled.compile_arch(arch, tmp_path)
    committed = p4compiled.manifest()["outputs"][arch]
    assert {k: entry[k] for k in ("compiler", "compiler_version", "command")} == \
        {k: committed[k] for k in ("compiler", "compiler_version", "command")}
    for name in p4compiled.ARCHS[arch].files.values():
        assert (tmp_path / name).read_bytes() == (p4compiled.BUILD_DIR / arch / name).read_bytes(), name


def _fake_compiler(d: Path, name: str, version: str) -> None:
    d.mkdir(exist_ok=True)
    (d / name).write_text(f"#!/bin/sh\necho '{name} {version} (SHA: 0000000 BUILD: Release)'\n")
    (d / name).chmod(0o755)


def test_targets_take_the_committed_outputs_whatever_is_installed(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    for arch in p4compiled.ARCHS:
        out = p4compiled.outputs(arch)
        assert (out.source, out.dir, out.note) == ("committed", p4compiled.BUILD_DIR / arch, None)
    # another version on PATH: still the committed outputs, and a note that says so
    _fake_compiler(tmp_path / "bin", "p4c-dpdk", "1.2.3.9")
    out = p4compiled.outputs("pna")
    assert out.source == "committed" and "1.2.3.9" in out.note and "not the tested 1.2.4.8" in out.note
    assert p4compiled.compiler_status("pna") == ("other", "p4c-dpdk 1.2.3.9 (SHA: 0000000 BUILD: Release)")
    # the pipeline cache is keyed on the compiled program, not on which p4c is installed
    from embnic.control.targets.p4dpdk import swx as p4dpdk

    with_fake = p4dpdk.pipeline_digest(p4compiled.outputs("pna"))
    (tmp_path / "bin" / "p4c-dpdk").unlink()
    assert p4dpdk.pipeline_digest(p4compiled.outputs("pna")) == with_fake


def test_edited_sources_without_the_tested_compiler_are_refused_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setattr(p4compiled, "sources_digest", lambda p4_dir=None: "sha256:edited")
    for arch, tool in (("pna", "p4c-dpdk"), ("v1model", "p4c")):
        with pytest.raises(MissingDependencyError) as e:
            p4compiled.outputs(arch)
        msg = str(e.value)
        assert "\n" not in msg and f"{tool} 1.2.4.8" in msg and "make -C p4" in msg and p4compiled.TOOLS_DOC in msg
        assert e.value.dependency == tool
    _fake_compiler(tmp_path / "bin", "p4c-dpdk", "1.2.3.9")
    with pytest.raises(MissingDependencyError, match="1.2.3.9"):
        p4compiled.outputs("pna")
    with pytest.raises(MissingDependencyError, match="regenerating p4/build/pna"):
        p4compiled.regenerate(["pna"])


def test_normalise_drops_what_differs_run_to_run(tmp_path):
    ctx = {"program_name": "embnic", "build_date": "Wed Dec  2 04:00:00 2026", "compile_command": "/x/p4c-dpdk ...",
           "tables": [{"name": "t", "build_date": "x"}]}
    for name in ("context.json", "bfrt.json"):
        (tmp_path / name).write_text(json.dumps(ctx))
    p4compiled.normalise("pna", tmp_path)
    assert json.loads((tmp_path / "context.json").read_text()) == {"program_name": "embnic", "tables": [{"name": "t"}]}
    (tmp_path / "embnic.json").write_text('{"a": 1}')
    p4compiled.normalise("v1model", tmp_path)
    data = (tmp_path / "embnic.json").read_bytes()
    assert json.loads(data) == {"a": 1}
    import hashlib

    assert not any(b in b"\t\n\v\f\r " for b in hashlib.md5(data).digest())


# --------------------------------------------------------------------------- compiled sizes
def _config_text(extra: str = "") -> str:
    """examples/testbed.toml with ``extra`` lines added to its [card] section."""
    text = (REPO / "examples" / "testbed.toml").read_text()
    assert "\n[card]\n" in text
    return text.replace("\n[card]\n", f"\n[card]\n{extra}\n", 1)


def _cfg(tmp_path, extra: str = ""):
    p = tmp_path / "c.toml"
    p.write_text(_config_text(extra))
    return load_config(str(p))


def test_p4_targets_take_the_compiled_sizes(tmp_path):
    c = p4prog.constants()
    want = {"ring_size": c["RING_SLOTS"], "state_size": c["STATE_SLOTS"]}
    cfg = _cfg(tmp_path)
    assert cfg.card.set_sizes == frozenset() and cfg.card.state_size == 65536   # the dpdk card's default
    assert p4prog.card_sizes(cfg.card, "bmv2", cfg.path) == want
    cfg = _cfg(tmp_path, f"ring_size = {want['ring_size']}\nstate_size = {want['state_size']}")
    assert p4prog.card_sizes(cfg.card, "p4dpdk", cfg.path) == want


@pytest.mark.parametrize("key,const", [("ring_size", "RING_SLOTS"), ("state_size", "STATE_SLOTS")])
def test_p4_targets_refuse_another_size_in_one_line(tmp_path, key, const):
    cfg = _cfg(tmp_path, f"{key} = 65536")
    n = p4prog.constants()[const]
    with pytest.raises(UsageError) as e:
        p4prog.card_sizes(cfg.card, "p4dpdk", cfg.path)
    msg = str(e.value)
    assert "\n" not in msg and e.value.exit_code == 2
    assert f"card.{key} = 65536 in {cfg.path}" in msg and f"compiled with {n}" in msg and f"set it to {n}" in msg


@pytest.mark.parametrize("target", ["bmv2", "p4dpdk"])
def test_cli_load_refuses_another_size_before_starting(tmp_path, target):
    (tmp_path / "c.toml").write_text(_config_text("state_size = 65536"))
    r = subprocess.run([sys.executable, "-m", "embnic", "pipeline", "load", "--target", target, "-c",
                        str(tmp_path / "c.toml"), *[a for i in range(4) for a in ("--vdev", f"net_af_packet{i},iface=nonexistent{i}")],
                        "--name", "sizecheck"], capture_output=True, text=True,
                       timeout=120, env={"PATH": "/usr/bin:/bin", "EMBNIC_RUN_DIR": str(tmp_path / "run")})
    assert r.returncode == 2, r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "card.state_size = 65536" in err[0] and "compiled with 4096" in err[0], r.stderr


def test_examples_work_on_every_target():
    """The shipped configs set no size a P4 target would refuse."""
    for path in sorted((REPO / "examples").glob("*.toml")):
        cfg = load_config(str(path))
        if cfg.card is not None and cfg.card.enabled and "plan-" not in path.name:
            for target in ("bmv2", "p4dpdk"):
                p4prog.card_sizes(cfg.card, target, str(path))
