"""docs/estimator.md quotes the code's formulas verbatim; the arithmetic modules stay pure."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from app.estimator import FORMULAS, EstimateRequest, estimate

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "estimator.md"


@pytest.mark.parametrize("key", sorted(FORMULAS))
def test_formula_text_is_in_docs(key: str) -> None:
    assert FORMULAS[key] in DOCS.read_text(encoding="utf-8"), key


def test_response_formulas_come_from_the_documented_set() -> None:
    docs = DOCS.read_text(encoding="utf-8")
    for fields in (
        {"parameters": 10**9},
        {"parameters": 10**9, "optimizer": "adafactor", "checkpointing": True},
        {"parameters": 10**9, "checkpointing": True, "sequence_parallel": True},
    ):
        r = estimate(EstimateRequest(**fields), gpu_models={})
        for text in r.formulas.values():
            # Each response formula is one documented formula or several joined by "; ".
            rest = text
            for piece in sorted(FORMULAS.values(), key=len, reverse=True):
                if piece in rest:
                    assert piece in docs
                    rest = rest.replace(piece, "")
            assert rest.replace(";", "").strip() == "", text


_PURE = {"__future__", "collections.abc", "dataclasses", "typing", "app.estimator.schemas"}


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("shape.py", _PURE),
        ("memory.py", _PURE | {"math", "app.estimator.shape"}),
        ("advice.py", _PURE | {"itertools", "pydantic", "app.estimator.memory"}),
        (
            "response.py",
            _PURE | {"math", "app.estimator.advice", "app.estimator.memory", "app.estimator.shape"},
        ),
        ("schemas.py", {"__future__", "typing", "pydantic", "app.request_body"}),
    ],
)
def test_module_is_pure(module: str, allowed: set[str]) -> None:
    tree = ast.parse((ROOT / "app" / "estimator" / module).read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert imported <= allowed, imported - allowed
