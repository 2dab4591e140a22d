"""No import cycle between the packages of `app` (and `workers`): the layers contract in
pyproject.toml orders them, but lets the modules of one `a : b` layer import each other;
this checks that no chain of imports, direct or not, leads from a package back to itself.
A package here is `app.X` (a subpackage or a top-level module)."""

from __future__ import annotations

from collections import defaultdict

import grimp


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _package_graph() -> dict[str, set[str]]:
    graph = grimp.build_graph("app", "workers")
    edges: dict[str, set[str]] = defaultdict(set)
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            source, target = _package(module), _package(imported)
            if source != target:
                edges[source].add(target)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one package (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(set(edges) | {t for targets in edges.values() for t in targets}):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_one() -> None:
    edges = {"app.a": {"app.b"}, "app.b": {"app.c"}, "app.c": {"app.a"}, "app.d": {"app.a"}}
    assert _cycles(edges) == [["app.a", "app.b", "app.c"]]


def test_no_package_imports_itself_back() -> None:
    edges = _package_graph()
    assert "app.jobs" in edges  # the graph was built
    cycles = _cycles(edges)
    detail = {
        " -> ".join(cycle): {p: sorted(edges[p] & set(cycle)) for p in cycle} for cycle in cycles
    }
    assert not cycles, f"package cycles (each package: what it imports in its cycle): {detail}"
