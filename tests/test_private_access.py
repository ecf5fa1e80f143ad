"""No module reads the private (``_name``) attributes of another module's embnic objects (issue #35:
composed, not reached into). An AST scan of every production module: ``x._name`` (or ``from m import
_name``) where ``_name`` is not defined in the module itself but is one of another embnic module's
private names (a ``self._name`` it assigns, a ``_name`` method, class attribute or module global)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the production packages' folders (tests/, docs/, contrib/ are not production)
PACKAGES = ("embnic", "client_lib", "control", "testbed", "cli")


def _modules() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(), str(p)) for d in PACKAGES for p in sorted((REPO / d).rglob("*.py"))}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, classes, globals, class attributes and the
    ``self._x`` / ``cls._x`` its methods assign."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(n.name):
            out.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and _private(n.id):
            out.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and _private(n.attr):
            out.add(n.attr)
        elif isinstance(n, ast.alias) and _private(n.asname or ""):
            out.add(n.asname)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and _private(n.target.id):
            out.add(n.target.id)
    return out


def test_no_module_reads_another_modules_private_names():
    mods = _modules()
    defined = {p: _defined(t) for p, t in mods.items()}
    bad = []
    for p, tree in mods.items():
        elsewhere = set().union(*(d for q, d in defined.items() if q != p))
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and _private(n.attr) and n.attr not in defined[p] and n.attr in elsewhere:
                bad.append(f"{p.relative_to(REPO)}:{n.lineno} reads .{n.attr}")
            elif isinstance(n, ast.ImportFrom) and (n.level > 0 or (n.module or "").startswith("embnic")):
                bad += [f"{p.relative_to(REPO)}:{n.lineno} imports {a.name} from {'.' * n.level}{n.module or ''}"
                        for a in n.names if _private(a.name)]
    assert not bad, "private names read across modules (give them a public name or pass them in):\n" + "\n".join(bad)
