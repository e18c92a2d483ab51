"""The package's layers, read from its own imports: every import runs down (or stays in its
own package), and no file imports itself back through others (docs/ARCHITECTURE.md,
"Where each thing lives")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "lambda_src"

# From the floor up. A package may import its own modules and anything on a lower floor;
# packages on one floor know nothing of each other.
FLOORS = [
    {"ebb.ports", "ebb.catalogue", "ebb.native"},
    {"ebb.spec", "ebb.sparse"},
    {"ebb.cost", "ebb.stores", "ebb.autotune", "ebb.models"},
    {"ebb.data"},
    {"ebb.engine", "ebb.predict"},
    {"ebb.local", "ebb.aws", "ebb.deployed", "ebb.flags"},
    {"ebb.tune", "ebb.predict.cli", "ebb.plan"},
    {"ebb.cli"},
]
# The zip functions (validate, on_failure) import these; they must not need numpy or torch.
LIGHT = {"ebb.ports", "ebb.catalogue", "ebb.spec", "ebb.engine.state", "ebb.engine.checkpoint", "ebb.engine.errors"}
HEAVY = ("numpy", "torch", "scipy", "redis", "matplotlib", "rich")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / "ebb").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _at_import(tree: ast.Module) -> list[ast.stmt]:
    """The statements that run when the module is imported: the top level, with what sits
    under its ``try`` and ``if`` blocks (but not ``if TYPE_CHECKING:``), not function bodies."""
    out, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
    return out


def _imports(name: str, path: Path, at_import: bool = False) -> list[tuple[str, int]]:
    """What ``name`` imports, with the line: anywhere in it, or with ``at_import`` only what
    runs when it is imported. ``from ebb.a.b import c`` is ``ebb.a.b.c`` if that is a
    module, else ``ebb.a.b``."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in _at_import(tree) if at_import else ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: up from this package
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append((full if full in MODULES else base, node.lineno))
    return found


def _unit(module: str) -> str:
    """The floor plan's unit a module belongs to: its package, or itself at the top (the
    longest unit that holds it: ``ebb.predict.cli`` sits above ``ebb.predict``)."""
    units = [u for floor in FLOORS for u in floor if module == u or module.startswith(u + ".")]
    if not units:
        raise AssertionError(f"{module} is on no floor: add it to FLOORS")
    return max(units, key=len)


def _floor(unit: str) -> int:
    return next(i for i, floor in enumerate(FLOORS) if unit in floor)


def test_every_import_runs_down():
    upward = []
    for name, path in MODULES.items():
        if name == "ebb":
            continue
        mine = _unit(name)
        for target, line in _imports(name, path):
            if not target.startswith("ebb.") or target not in MODULES:
                continue
            theirs = _unit(target)
            if theirs != mine and _floor(theirs) >= _floor(mine):
                upward.append(
                    f"{path.relative_to(ROOT)}:{line}: {mine} (floor {_floor(mine)}) imports {target} "
                    f"(floor {_floor(theirs)})"
                )
    assert upward == [], "\n".join(upward)


def test_no_module_imports_itself_back():
    graph = {name: {t for t, _ in _imports(name, path) if t in MODULES and t != name} for name, path in MODULES.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert circles == []


def test_the_light_floor_needs_no_numpy_or_torch():
    """What the zip functions import reaches no heavy package, through any import."""
    light = [name for name in MODULES if any(name == u or name.startswith(u + ".") for u in LIGHT)]
    seen, todo = set(light), list(light)
    while todo:
        name = todo.pop()
        for target, line in _imports(name, MODULES[name], at_import=True):
            assert target.split(".")[0] not in HEAVY, f"{MODULES[name].relative_to(ROOT)}:{line} imports {target}"
            if target in MODULES and target not in seen:
                seen.add(target)
                todo.append(target)
