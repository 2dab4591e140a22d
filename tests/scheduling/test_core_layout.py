"""The planner's rooms hold their shape: the core imports only the standard library and
itself, no module grows past 600 lines, and the memory and share rules are written in
their filters only (every other room calls `gpu_memory.fits` / `gpu_share.fits`)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "app" / "scheduling"
MODULES = sorted(CORE.rglob("*.py"))


def _name(p: Path) -> str:
    return p.relative_to(CORE).as_posix()


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_imports_only_the_standard_library_and_the_core(path: Path) -> None:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or name.startswith("app.scheduling"), (
                f"{_name(path)} imports {name}"
            )


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_over_600_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= 600


def _compares_to(attr: str, path: Path) -> list[int]:
    """Lines comparing a name or field called `attr` (a request's `memory_mb`, say) with
    something other than a constant or another `attr` (comparing two requests is not
    the rule)."""

    def named(node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == attr) or (
            isinstance(node, ast.Name) and node.id == attr
        )

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        others = [s for s in sides if not named(s) and not isinstance(s, ast.Constant)]
        if any(named(s) for s in sides) and others:
            found.append(node.lineno)
    return found


@pytest.mark.parametrize(
    ("attr", "home"), [("memory_mb", "gpu_memory.py"), ("milli", "gpu_share.py")]
)
def test_each_fit_rule_is_written_once(attr: str, home: str) -> None:
    where = {
        _name(p): lines for p in MODULES if p.name != home and (lines := _compares_to(attr, p))
    }
    assert where == {}
    assert _compares_to(attr, CORE / "filters" / home)  # and it is there
