"""The import rules of docs/architecture.md, checked on every module's source (AST, no import).

1. ``embnic.client_lib`` imports nothing of ``embnic.control`` or ``embnic.testbed``;
2. the control library (``control/`` but ``cli.py`` and ``commands/``) imports neither click
   nor ``embnic.testbed`` nor the CLI modules;
3. ``embnic.testbed`` imports neither the CLI nor click, and starts processes as library
   modules (``python -m embnic.testbed...``), never through the CLI (``python -m embnic``);
4. the disk tier's binding (``rocksdict``, the optional extra ``embnic[disk]``) is imported by
   ``testbed/server/diskstore.py`` alone;
5. no import cycle inside any package of embnic: the modules' imports — module-level and
   in-function ones, ``if TYPE_CHECKING:`` blocks excepted — form no circle.

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


CLI_MODULES = ("embnic.cli.main", "embnic.cli.commands")


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


def _module_imports(tree: ast.AST, mod: str, is_pkg: bool, modules: set[str]) -> set[str]:
    """The embnic modules (of ``modules``) that module ``mod`` imports, at any depth of its
    ``tree`` (functions included) but inside ``if TYPE_CHECKING:`` (never run). ``from P import
    x`` is an import of module ``P.x`` when there is one, else of ``P``."""
    pkg = mod if is_pkg else mod.rsplit(".", 1)[0]
    out: set[str] = set()
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                name = a.name
                while name and name not in modules:  # ``import a.b.c``: the deepest module named
                    name = name.rpartition(".")[0]
                if name:
                    out.add(name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = ".".join(base[:len(base) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for a in node.names:
                full = f"{base}.{a.name}"
                out.add(full if full in modules else base)
        todo.extend(ast.iter_child_nodes(node))
    out.discard(mod)
    return out & modules


def import_graph(root: Path = ROOT, packages: dict[str, str] = PACKAGES) -> dict[str, set[str]]:
    """``{module: the embnic modules it imports}`` for every module under ``root``'s ``packages``
    (folder -> package name), read from the source (:func:`_module_imports`)."""
    files = {}
    for folder, name in packages.items():
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root / folder)
            parts = [name, *rel.parts[:-1]] + ([] if rel.stem == "__init__" else [rel.stem])
            files[".".join(parts)] = path
    modules = set(files)
    return {m: _module_imports(ast.parse(p.read_text(), str(p)), m, p.stem == "__init__", modules)
            for m, p in files.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle of ``graph``: each strongly connected component of more than one
    module, as one closed path through it (``[a, b, ..., a]``: a imports b, ...). Tarjan's
    algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(comp)
    cycles = []
    for comp in comps:  # a closed path: breadth-first from the first module back to itself
        start = min(comp)
        prev: dict[str, str] = {}
        frontier = [start]
        while start not in prev:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & comp):
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [start]
        while len(path) == 1 or path[-1] != start:
            path.append(prev[path[-1]])
        cycles.append(path[::-1])
    return sorted(cycles)


def test_no_import_cycle_in_any_package():
    """Rule 5: every cycle is reported as its modules, ``a -> b -> ... -> a``."""
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_sees_in_function_imports_and_skips_type_checking(tmp_path):
    """The cycle check is not vacuous: a circle closed by an in-function import (relative or
    absolute, ``import a.b``) is found; one closed only under ``if TYPE_CHECKING:`` is not."""
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("def g():\n    import x.a\n")
    (pkg / "sub" / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from ..e import E\nelse:\n    E = None\n")
    (pkg / "e.py").write_text("from .sub import d\n")
    graph = import_graph(tmp_path, {"p": "x"})
    assert graph["x.b"] == {"x.c"} and graph["x.c"] == {"x.a"} and graph["x.sub.d"] == set()
    assert import_cycles(graph) == [["x.a", "x.b", "x.c", "x.a"]]
    assert import_cycles({"m": {"n"}, "n": {"m"}, "o": {"m"}}) == [["m", "n", "m"]]
    g = import_graph()
    assert "embnic.testbed.server.stores" in g["embnic.testbed.server.durability"]
    assert "embnic.testbed.server.canswer" in g["embnic.testbed.server.engine"]  # from . import canswer


def test_the_rules_see_real_imports():
    """The checker is not vacuous: it finds known imports (and would find a forbidden one)."""
    assert "click" in _imports(ROOT / "control" / "cli.py")
    assert "embnic.control.errors" in _imports(ROOT / "control" / "targets" / "base.py")
    assert "embnic.testbed.net.procs" in _imports(ROOT / "testbed" / "net" / "topology.py")  # relative import
    assert _is_cli(ROOT / "control" / "commands" / "options.py") and not _is_cli(ROOT / "control" / "targets" / "base.py")
    assert _hits({"embnic.cli.commands.options"}, CLI_MODULES) == ["embnic.cli.commands.options"]
    assert _hits({"embnic.control.targets.base"}, CLI_MODULES) == []
    assert _hits({"click.testing"}, ("click",)) == ["click.testing"]
    assert "rocksdict" in _imports(ROOT / "testbed" / "server" / "diskstore.py")
