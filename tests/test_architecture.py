"""The import rules of docs/architecture.md, checked on every module's source (AST, no import).

1. ``embnic.client_lib`` imports nothing of ``embnic.control`` or ``embnic.testbed``;
2. the control library (``control/`` but ``cli.py`` and ``commands/``) imports neither click
   nor ``embnic.testbed`` nor the CLI modules;
3. ``embnic.testbed`` imports neither the CLI nor click, and starts processes as library
   modules (``python -m embnic.testbed...``), never through the CLI (``python -m embnic``);
4. the disk tier's binding (``rocksdict``, the optional extra ``embnic[disk]``) is imported by
   ``testbed/server/diskstore.py`` alone.

Run alone: python3 -m pytest -q tests/test_architecture.py
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"client_lib": "embnic.client_lib", "control": "embnic.control", "testbed": "embnic.testbed"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = [PACKAGES[rel.parts[0]], *rel.parts[1:-1]]
    if rel.stem != "__init__":
        parts.append(rel.stem)
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved), at any depth."""
    mod = _module_name(path)
    pkg = mod if path.stem == "__init__" else mod.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                out.add(node.args[0].value)
    return out


def _files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _is_cli(path: Path) -> bool:
    return path == ROOT / "control" / "cli.py" or (ROOT / "control" / "commands") in path.parents


def _hits(imports: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(i for i in imports if any(i == b or i.startswith(b + ".") for b in banned))


CLI_MODULES = ("embnic.control.cli", "embnic.control.commands")


@pytest.mark.parametrize("path", _files("client_lib"), ids=lambda p: str(p.relative_to(ROOT)))
def test_client_lib_imports_nothing_of_control_or_testbed(path):
    assert _hits(_imports(path), ("embnic.control", "embnic.testbed")) == []


@pytest.mark.parametrize("path", [p for p in _files("control") if not _is_cli(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_control_library_knows_neither_click_nor_the_testbed(path):
    assert _hits(_imports(path), ("click", "embnic.testbed") + CLI_MODULES) == []


@pytest.mark.parametrize("path", _files("testbed"), ids=lambda p: str(p.relative_to(ROOT)))
def test_testbed_never_imports_the_cli(path):
    assert _hits(_imports(path), ("click",) + CLI_MODULES) == []


@pytest.mark.parametrize("path", _files("testbed"), ids=lambda p: str(p.relative_to(ROOT)))
def test_testbed_starts_library_modules_never_the_cli(path):
    """No ``[..., "-m", "embnic", ...]``: a process the testbed starts is ``python -m embnic.testbed...``."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.List, ast.Tuple)):
            vals = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            for a, b in zip(vals, vals[1:]):
                if a == "-m" and isinstance(b, str) and not b.startswith("embnic.testbed"):
                    bad.append(f"line {node.lineno}: -m {b}")
    assert bad == []


@pytest.mark.parametrize("path", [p for f in PACKAGES for p in _files(f) if p != ROOT / "testbed/server/diskstore.py"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_disk_tier_imports_rocksdict(path):
    assert _hits(_imports(path), ("rocksdict",)) == []


def test_the_rules_see_real_imports():
    """The checker is not vacuous: it finds known imports (and would find a forbidden one)."""
    assert "click" in _imports(ROOT / "control" / "cli.py")
    assert "embnic.control.errors" in _imports(ROOT / "control" / "targets" / "base.py")
    assert "embnic.testbed.net.procs" in _imports(ROOT / "testbed" / "net" / "topology.py")  # relative import
    assert _is_cli(ROOT / "control" / "commands" / "options.py") and not _is_cli(ROOT / "control" / "targets" / "base.py")
    assert _hits({"embnic.control.commands.options"}, CLI_MODULES) == ["embnic.control.commands.options"]
    assert _hits({"embnic.control.targets.base"}, CLI_MODULES) == []
    assert _hits({"click.testing"}, ("click",)) == ["click.testing"]
    assert "rocksdict" in _imports(ROOT / "testbed" / "server" / "diskstore.py")
