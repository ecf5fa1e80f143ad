"""The package's C libraries ship with it (issue #35): the build compiles them (setup.py), a wheel
carries them and runs without a checkout or DPDK, a library built from other sources or for another
protocol version is refused in one line, and a build without a C compiler fails in one line."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from embnic.client_lib import clib, consts

REPO = Path(__file__).resolve().parents[1]


def _lib_copy(tmp_path: Path, lib: clib.NativeLib) -> clib.NativeLib:
    """The library with its sources and the protocol headers copied under tmp_path (the built file too)."""
    pkg = tmp_path / "pkg"
    for rel in lib.sources:
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib.package_dir / rel, pkg / rel)
    shutil.copytree(lib.include_dir, tmp_path / "include")
    copy = dataclasses.replace(lib, package_dir=pkg, include_dir=tmp_path / "include")
    shutil.copy2(lib.path, copy.path)
    return copy


@pytest.mark.parametrize("lib", [clib.CLIENT, clib.SHARD], ids=["client", "shard"])
def test_library_built_from_other_sources_is_refused(tmp_path, monkeypatch, lib):
    """Built from the sources beside it: loads; a source (or a protocol header) edited since: refused, one
    line naming the rebuild command."""
    monkeypatch.delenv(lib.env, raising=False)
    copy = _lib_copy(tmp_path, lib)
    clib.load(copy, consts.VERSION)
    with open(copy.package_dir / copy.sources[0], "a") as f:
        f.write("/* edited */\n")
    with pytest.raises(clib.NativeLibraryError) as e:
        clib.load(copy, consts.VERSION)
    assert "built from other sources" in str(e.value) and clib.REBUILD in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "include" / "embnic_proto.h").write_text((lib.include_dir / "embnic_proto.h").read_text())
    (copy.package_dir / copy.sources[0]).write_text((lib.package_dir / lib.sources[0]).read_text())
    clib.load(copy, consts.VERSION)
    with open(tmp_path / "include" / "embnic_proto.h", "a") as f:
        f.write("/* edited */\n")
    with pytest.raises(clib.NativeLibraryError, match="built from other sources"):
        clib.load(copy, consts.VERSION)


def test_missing_library_names_the_rebuild(tmp_path, monkeypatch):
    monkeypatch.setenv(clib.CLIENT.env, str(tmp_path / "nothing.so"))
    with pytest.raises(clib.NativeLibraryError, match=r"is not built: run pip install -e \."):
        clib.load(clib.CLIENT, consts.VERSION)


@pytest.fixture(scope="module")
def v3_build(tmp_path_factory) -> Path:
    """Both libraries built for protocol version 3 into a directory of their own."""
    out = tmp_path_factory.mktemp("v3")
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(out / "lib"),
                    "--build-temp", str(out / "tmp")], cwd=REPO, check=True, capture_output=True,
                   env=dict(os.environ, EMBNIC_PROTO_VERSION="3"))
    return out / "lib"


@pytest.mark.parametrize("lib", [clib.CLIENT, clib.SHARD], ids=["client", "shard"])
def test_other_protocol_version_is_refused(v3_build, monkeypatch, lib):
    built = next(v3_build.rglob(lib.stem + "*.so"))
    monkeypatch.setenv(lib.env, str(built))
    with pytest.raises(clib.NativeLibraryError) as e:
        clib.load(lib, consts.VERSION)
    msg = str(e.value)
    assert f"protocol version 3, this package {consts.VERSION}" in msg and clib.REBUILD in msg and "\n" not in msg


def test_no_c_compiler_fails_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
                        "--build-temp", str(tmp_path / "tmp")], cwd=REPO, capture_output=True, text=True,
                       env=dict(os.environ, CC="embnic-no-such-cc"))
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if "embnic:" in ln]
    assert lines == ["embnic: building the package's C libraries needs a C compiler (embnic-no-such-cc not "
                     "found): apt-get install gcc (Debian), then pip install again"], r.stderr


@pytest.mark.slow
def test_wheel_carries_the_libraries_and_runs_without_a_checkout(tmp_path):
    """`pip wheel .` builds both libraries into the wheel (no DPDK linked); installed into a bare
    directory, the client's round and the shard's path load from it, outside any checkout."""
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(REPO)], check=True, capture_output=True)
    whl = next(wheels.glob("embnic-*.whl"))
    names = zipfile.ZipFile(whl).namelist()
    for lib in (clib.CLIENT, clib.SHARD):
        pkg = "embnic/" + lib.package_dir.relative_to(REPO).as_posix()
        assert any(n.startswith(pkg + "/" + lib.stem) and n.endswith(".so") for n in names), (pkg, names)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(whl)],
                   check=True, capture_output=True)
    for so in site.rglob("*.so"):
        ldd = subprocess.run(["ldd", str(so)], capture_output=True, text=True).stdout
        assert "librte" not in ldd, ldd
    # -S: no site-packages processing, so the editable install of the checkout is not on the path;
    # numpy from where it is installed
    probe = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
             "from embnic.client_lib import clib, consts, native\n"
             "assert native.load() is not None and clib.load(clib.SHARD, consts.VERSION) is not None\n"
             "print(clib.CLIENT.path); print([s['detail'] for s in clib.status(consts.VERSION)])\n")
    env = {k: v for k, v in os.environ.items() if k not in (clib.CLIENT.env, clib.SHARD.env)}
    r = subprocess.run([sys.executable, "-S", "-c", probe, str(site), str(Path(np.__file__).parents[1])],
                       cwd=tmp_path, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(str(site))
    assert "built with the installed package" in r.stdout


@pytest.mark.slow
def test_sdist_carries_the_sources(tmp_path):
    """The sdist has what the build compiles: both libraries' sources and the protocol headers."""
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path)], cwd=REPO, check=True,
                   capture_output=True)
    names = tarfile.open(next(tmp_path.glob("embnic-*.tar.gz"))).getnames()
    want = ["setup.py", "include/embnic_proto.h", "include/embnic_parse.h"]
    want += [str(f.relative_to(REPO.resolve())) for lib in (clib.CLIENT, clib.SHARD) for f in lib.source_files()]
    for w in want:
        assert any(n.endswith("/" + w) for n in names), (w, names)


def test_inspect_names_the_libraries(monkeypatch, tmp_path):
    """`embnic inspect` on a host without a card binary (a training host) still says which C libraries
    run here and whether they load."""
    from click.testing import CliRunner

    from embnic.cli.main import cli
    from embnic.control.targets.dpdk import target as dpdk_target

    monkeypatch.delenv("EMBNIC_DP", raising=False)
    monkeypatch.setattr(dpdk_target, "REPO_BINARY", tmp_path / "embnic-dp")
    monkeypatch.setenv("PATH", str(tmp_path))
    r = CliRunner().invoke(cli, ["inspect"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("binary:") and "no embnic-dp binary" in lines[0]
    assert [ln.split(":")[0] for ln in lines[1:]] == ["client lib", "shard lib"]
    d = json.loads(CliRunner().invoke(cli, ["inspect", "--json"]).output)
    assert [x["name"] for x in d["libraries"]] == ["client", "shard"]
    assert {x["path"] for x in d["libraries"]} == {str(clib.CLIENT.path), str(clib.SHARD.path)}
