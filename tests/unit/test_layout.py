"""The package's rooms follow the data flow, and imports only point down.

core (exceptions, faults, timeparse, timeaxis) < spark (runs inside Spark; examples are jobs on it) < hooks
(Airflow hooks) < job (kappa.yaml, catalogs, the checkpoint layout) < engine (how Spark is started and driven)
< backfill (the backfill's steps) < report (the HTML report) < operators < dag (the DAG factory) < cli, demo.
Every ``import``/``from … import`` counts, at module level or inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[2] / "airflow_provider_kappa"
NAME = PACKAGE.name

#: room -> rank; a module may import modules of its own room or of a lower rank
RANKS = {
    "core": 0,
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
    if len(parts) == 1 or parts[1] in ("exceptions", "faults", "timeparse", "timeaxis"):
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


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
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


GRAPH = {m: imports_of(m, p, modules()) for m, p in modules().items()}


def test_the_rooms_exist() -> None:
    assert {room(m) for m in GRAPH} == set(RANKS), sorted({room(m) for m in GRAPH})


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down(module: str) -> None:
    upward = sorted(
        dep
        for dep in GRAPH[module]
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
        for w in GRAPH[v]:
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

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert cycles == []
