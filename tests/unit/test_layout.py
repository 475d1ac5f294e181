"""The package's rooms follow the data flow, and imports only point down.

core (exceptions, faults, timeparse, timeaxis), compat (adapters over dependencies' private APIs) < spark
(runs inside Spark; examples are jobs on it) < hooks (Airflow hooks) < job (kappa.yaml, catalogs, the
checkpoint layout) < engine (how Spark is started and driven) < backfill (the backfill's steps) < report
(the HTML report) < operators < dag (the DAG factory) < cli, demo.
Every ``import``/``from … import`` counts, at module level or inside a function.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest
from paths import PACKAGE

NAME = PACKAGE.name

#: room -> rank; a module may import modules of its own room or of a lower rank
RANKS = {
    "core": 0,
    "compat": 0,
    "spark": 1,
    "examples": 1,
    "hooks": 2,
    "job": 3,
    "engine": 4,
    "backfill": 5,
    "report": 6,
    "operators": 7,
    "dag": 8,
    "cli": 9,
    "demo": 9,
}


def room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("exceptions", "faults", "redact", "timeparse", "timeaxis"):
        return "core"
    return parts[1]


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


@cache
def parsed(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for all the tests here (none changes it)."""
    return ast.parse(path.read_text())


@cache
def walked(path: Path) -> tuple[ast.AST, ...]:
    """Every node of a module's syntax tree (``ast.walk`` once for all the tests here)."""
    return tuple(ast.walk(parsed(path)))


@cache
def imports_in_functions(path: Path) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """The imports of a module that sit inside a function (a nested one's included), in line order."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[tuple[ast.AST, bool]] = [(parsed(path), False)]
    while todo:
        node, inside = todo.pop()
        if inside and isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        inside = inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        todo.extend((child, inside) for child in ast.iter_child_nodes(node))
    return tuple(sorted(found, key=lambda n: (n.lineno, n.col_offset)))


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in walked(path):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != NAME:
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                out.add(full if full in known else target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == NAME)
    return {m for m in out if m in known and m != module}


@cache
def graph() -> dict[str, set[str]]:
    """module -> the package modules it imports; built on first use, not at collection (every
    pytest-xdist worker collects this file, only one runs a given test)."""
    known = modules()
    return {m: imports_of(m, p, known) for m, p in known.items()}


def test_the_rooms_exist() -> None:
    assert {room(m) for m in graph()} == set(RANKS), sorted({room(m) for m in graph()})


@pytest.mark.parametrize("module", sorted(modules()))
def test_imports_point_down(module: str) -> None:
    upward = sorted(
        dep
        for dep in graph()[module]
        if RANKS[room(dep)] > RANKS[room(module)]
        or (
            room(dep) != room(module) and RANKS[room(dep)] == RANKS[room(module)] and not _allowed_sideways(module, dep)
        )
    )
    assert not upward, f"{module} ({room(module)}) imports a higher or sibling room: {upward}"


def _allowed_sideways(module: str, dep: str) -> bool:
    # `kappa demo` is the demo's entry; the example jobs run on spark/
    return (module == f"{NAME}.cli.demo" and room(dep) == "demo") or (
        room(module) == "examples" and room(dep) == "spark"
    )


def test_no_import_cycle() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph()[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph()):
        if v not in index:
            visit(v)
    assert cycles == []


# --------------------------------------------------------------------------- sizes

#: The limits docs/architecture.md states: a folder of the package (a room) holds at most this share
#: of its lines, a module at most MODULE_LINES lines, a function at most FUNCTION_LINES (docstring included).
ROOM_SHARE = 0.25
MODULE_LINES = 600
FUNCTION_LINES = 80


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_room_holds_more_than_a_quarter_of_the_package() -> None:
    sizes: dict[str, int] = {}
    for path in PACKAGE.rglob("*.py"):
        folder = str(path.parent.relative_to(PACKAGE)) if path.parent != PACKAGE else "core"
        sizes[folder] = sizes.get(folder, 0) + _lines(path)
    total = sum(sizes.values())
    over = {room: f"{n / total:.1%}" for room, n in sizes.items() if n > ROOM_SHARE * total}
    assert not over, f"rooms over {ROOM_SHARE:.0%} of the package's {total} lines: {over}"


def test_no_module_over_the_limit() -> None:
    over = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := _lines(p)) > MODULE_LINES}
    assert not over, f"modules over {MODULE_LINES} lines: {over}"


def test_no_function_over_the_limit() -> None:
    over = {}
    for path in PACKAGE.rglob("*.py"):
        for node in walked(path):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    over[f"{path.relative_to(PACKAGE)}:{node.name}"] = length
    assert not over, f"functions over {FUNCTION_LINES} lines: {over}"


# --------------------------------------------------------------------------- function-level imports

#: Libraries a process may have to stay without (DAG parsing, the CLI's parser, Airflow workers, Spark's
#: Python workers): an import of them, or of a module of the package that loads them when imported, may
#: sit inside a function. Any other import goes at the top of its module.
HEAVY = {
    "pyspark",
    "pyiceberg",
    "pyarrow",
    "numpy",
    "pandas",
    "airflow",
    "py4j",
    "kafka",
    "structlog",
    "fsspec",
    "openlineage",
}


def _module_level_imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module ``module`` imports when it is imported: its top-level imports, a ``try`` block's
    included, not those under ``if TYPE_CHECKING:``."""
    out: set[str] = set()
    tree = parsed(path)
    for node in tree.body:
        nodes = ast.walk(node) if isinstance(node, ast.Try) else [node]
        for n in nodes:
            if isinstance(n, ast.Import):
                out.update(a.name for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                out.update(_targets(module, path, n, known))
    return out


def _targets(module: str, path: Path, node: ast.ImportFrom, known: dict[str, Path]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return {f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names}


def _loads_heavy(target: str, known: dict[str, Path], seen: dict[str, bool]) -> bool:
    top = target.split(".")[0]
    if top != NAME:
        return top in HEAVY
    if target not in known:
        return False
    if target not in seen:
        seen[target] = False  # an import cycle: no heavy import through it
        seen[target] = any(_loads_heavy(t, known, seen) for t in _module_level_imports(target, known[target], known))
    return seen[target]


def _optional(module: str, target: str) -> bool:
    """The demo is the ``[demo]`` extra: outside its room (``kappa demo``'s verb) it is imported only
    when it runs, so the CLI's parser and Airflow workers never load it (tests/unit/test_imports.py)."""
    return room(target) == "demo" and room(module) != "demo"


#: Modules that import light libraries inside functions on purpose: the warm daemon's stub (``--run``) starts
#: once per Python process Spark starts and imports only what it needs, the zygote's modules in the zygote
#: (tests/unit/test_warm_python.py holds it).
LEAN_START = {f"{NAME}.spark.warm_daemon"}


def test_imports_inside_functions_only_keep_heavy_libraries_out() -> None:
    known = modules()
    seen: dict[str, bool] = {}
    needless = []
    for module, path in sorted(known.items()):
        if module in LEAN_START:
            continue
        for node in imports_in_functions(path):
            if isinstance(node, ast.Import):
                targets = {a.name for a in node.names}
            else:
                targets = _targets(module, path, node, known)
            light = sorted(t for t in targets if not _loads_heavy(t, known, seen) and not _optional(module, t))
            if light:
                needless.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {light}")
    assert not needless, "imports inside a function that load no heavy library (move them up):\n" + "\n".join(needless)


@pytest.mark.parametrize("verb", ["run", "land"])
def test_the_live_verbs_never_reach_the_backfill(verb: str) -> None:
    """``kappa run`` and ``kappa land`` need the job and the engines, never the backfill's room."""
    seen, todo = set(), [f"{NAME}.cli.{verb}"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph()[module])
    assert not sorted(m for m in seen if room(m) in ("backfill", "report", "operators", "dag"))
