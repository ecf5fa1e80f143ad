"""The import rules of docs/architecture.md, checked on every module's source (AST, no import).

1. the layers, bottom to top: ``client_lib/`` (``embnic.client_lib``) ← ``control/`` (the control
   library, ``embnic.control``) ← ``testbed/`` (``embnic.testbed``) ← ``cli/`` (``embnic.cli``; and
   ``embnic/__main__.py``, the ``python -m embnic`` entry). Every import of an embnic module goes
   to the same or a lower layer, judged twice: the importing file's layer by its folder, the
   imported module's by its dotted name and by the folder that name lives in (pyproject's
   ``package-dir``, which must map each layer's package to the layer's own folder);
2. nothing outside ``cli/`` imports click;
3. ``embnic.testbed`` starts processes as library modules (``python -m embnic.testbed...``), never
   through the CLI (``python -m embnic``);
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
# folder -> package, bottom layer first (rule 1)
PACKAGES = {"client_lib": "embnic.client_lib", "control": "embnic.control", "testbed": "embnic.testbed",
            "cli": "embnic.cli"}
LAYERS = tuple(PACKAGES)
TOP = len(LAYERS) - 1
# the files of the ``embnic`` folder: the namespace's own ``__init__`` (imported before anything
# else, so it may import no embnic module) and ``python -m embnic``, the CLI's second entry
ROOT_FILES = {"__init__.py": -1, "__main__.py": TOP}


def _module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root)
    if rel.parts[0] == "embnic":
        return "embnic" if rel.stem == "__init__" else f"embnic.{rel.stem}"
    parts = [PACKAGES[rel.parts[0]], *rel.parts[1:-1]]
    if rel.stem != "__init__":
        parts.append(rel.stem)
    return ".".join(parts)


def _imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved), at any depth."""
    mod = _module_name(path, root)
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


def _files(folder: str, root: Path = ROOT) -> list[Path]:
    return sorted((root / folder).rglob("*.py"))


def _all_files(root: Path = ROOT) -> list[Path]:
    return [p for f in LAYERS for p in _files(f, root)] + [root / "embnic" / n for n in ROOT_FILES
                                                           if (root / "embnic" / n).exists()]


def _hits(imports: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(i for i in imports if any(i == b or i.startswith(b + ".") for b in banned))


def _package_dirs() -> dict[str, str]:
    """pyproject's ``[tool.setuptools.package-dir]``: package -> folder."""
    tomllib = pytest.importorskip("tomllib")
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


def _layer_of_path(path: Path, root: Path = ROOT) -> int:
    """The layer (index in :data:`LAYERS`) of a source file, by the folder it is in."""
    rel = path.relative_to(root)
    if rel.parts[0] == "embnic":
        return ROOT_FILES[rel.name]
    return LAYERS.index(rel.parts[0])


def _layer_of_name(name: str, package_dirs: dict[str, str] | None = None) -> int | None:
    """The layer of an imported dotted name: by the package prefix, and (``package_dirs`` given)
    the higher of that and the layer of the folder the name's package lives in; ``None`` for
    a name outside embnic's layers."""
    layer = next((i for i, f in enumerate(LAYERS) if _hits({name}, (PACKAGES[f],))), None)
    if name == "embnic.__main__":
        layer = TOP
    if layer is None or not package_dirs:
        return layer
    pkg = max((p for p in package_dirs if _hits({name}, (p,))), key=len, default=None)
    if pkg is not None:
        folder = Path(package_dirs[pkg]).parts[0]
        layer = max(layer, LAYERS.index(folder) if folder in LAYERS else TOP)
    return layer


def layer_violations(path: Path, root: Path = ROOT, package_dirs: dict[str, str] | None = None) -> list[str]:
    """The embnic imports of ``path`` that go to a higher layer, and any click import outside ``cli/``
    (rules 1 and 2), as ``"<imported name> (layer <n>)"``."""
    mine = _layer_of_path(path, root)
    bad = []
    for name in sorted(_imports(path, root)):
        layer = _layer_of_name(name, package_dirs)
        if layer is not None and layer > mine:
            bad.append(f"{name} (layer {LAYERS[layer]})")
        if mine != TOP and _hits({name}, ("click",)):
            bad.append(name)
    return bad


def test_each_layers_package_lives_in_the_layers_folder():
    """By folder as by package: pyproject maps ``embnic.<layer>[.x]`` to ``<layer>/[x]`` and nothing else."""
    dirs = _package_dirs()
    for pkg, folder in dirs.items():
        if pkg == "embnic":
            assert folder == "embnic"
            continue
        top = Path(folder).parts[0]
        assert top in LAYERS, f"{pkg} lives in {folder}, outside the layers' folders"
        assert _hits({pkg}, (PACKAGES[top],)), f"{pkg} lives in {folder}, the folder of {PACKAGES[top]}"
        assert folder == "/".join([top, *pkg.split(".")[2:]]), f"{pkg} lives in {folder}"
    assert set(PACKAGES.values()) <= set(dirs)


@pytest.mark.parametrize("path", _all_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_to_the_same_or_a_lower_layer(path):
    assert layer_violations(path, ROOT, _package_dirs()) == []


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
    assert "click" in _imports(ROOT / "cli" / "main.py")
    assert "embnic.control.errors" in _imports(ROOT / "control" / "targets" / "base.py")
    assert "embnic.testbed.net.procs" in _imports(ROOT / "testbed" / "net" / "topology.py")  # relative import
    assert "embnic.cli.commands.options" in _imports(ROOT / "cli" / "commands" / "peers.py")
    assert "embnic.cli.main" in _imports(ROOT / "embnic" / "__main__.py")
    assert _layer_of_path(ROOT / "cli" / "commands" / "options.py") == TOP
    assert _layer_of_path(ROOT / "control" / "targets" / "base.py") == LAYERS.index("control")
    assert _layer_of_name("embnic.cli.commands.options") == TOP
    assert _layer_of_name("embnic.control.targets.base") == LAYERS.index("control")
    assert _layer_of_name("numpy") is None and _layer_of_name("embnic") is None
    assert _hits({"click.testing"}, ("click",)) == ["click.testing"]
    assert "rocksdict" in _imports(ROOT / "testbed" / "server" / "diskstore.py")


def test_a_control_file_importing_the_cli_or_the_testbed_fails(tmp_path):
    """Rules 1 and 2 on a made-up tree: a control/ file that imports embnic.cli, embnic.testbed or
    click is caught, by name and by the folder the name lives in; the same imports from cli/ are fine."""
    for folder in LAYERS:
        (tmp_path / folder).mkdir()
    (tmp_path / "embnic").mkdir()
    bad = tmp_path / "control" / "bad.py"
    bad.write_text("import click\nfrom embnic.cli.main import cli\n\n\ndef f():\n"
                   "    from embnic.testbed.net import topology\n    from ..cli import main\n")
    assert layer_violations(bad, tmp_path) == [
        "click", "embnic.cli (layer cli)", "embnic.cli.main (layer cli)", "embnic.cli.main.cli (layer cli)",
        "embnic.testbed.net (layer testbed)", "embnic.testbed.net.topology (layer testbed)"]
    ok = tmp_path / "cli" / "ok.py"
    ok.write_text(bad.read_text().replace("..cli", "."))
    assert layer_violations(ok, tmp_path) == []
    up = tmp_path / "testbed" / "up.py"
    up.write_text("from embnic.cli.commands import options\nfrom embnic.control import netns\n")
    assert layer_violations(up, tmp_path) == [
        "embnic.cli.commands (layer cli)", "embnic.cli.commands.options (layer cli)"]
    # by folder: a package named under control but living in cli/ is the CLI's
    sneaky = tmp_path / "control" / "sneaky.py"
    sneaky.write_text("from embnic.control.ui import menu\n")
    assert layer_violations(sneaky, tmp_path) == []
    assert layer_violations(sneaky, tmp_path, {"embnic.control.ui": "cli/ui"}) == [
        "embnic.control.ui (layer cli)", "embnic.control.ui.menu (layer cli)"]
    init = tmp_path / "embnic" / "__init__.py"
    init.write_text("from embnic.client_lib import consts\n")
    assert layer_violations(init, tmp_path) == [
        "embnic.client_lib (layer client_lib)", "embnic.client_lib.consts (layer client_lib)"]
