"""Fault-injection fixtures: each test gets its own stack (API, scheduler, agents, private
Redis) against a fresh PostgreSQL database, breaks one part of it, and checks that no job
was lost or run twice and that no GPU was held twice. A table of what each test injected
and what it found is printed at the end of the run.

The suite needs PostgreSQL (GPUSCHED_TEST_PG_URL, as the rest of the suite); it is
skipped when that server cannot be reached.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.faults.support import FAULT_ENV
from tests.support.servers import PrivatePostgres, pg_url
from tests.support.stack import Stack


@dataclass
class FaultRow:
    fault: str
    submitted: int
    lost: int
    duplicated: int
    recover_s: float | None
    note: str = ""


ROWS: list[FaultRow] = []


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    if not ROWS:
        return
    tr = terminalreporter
    tr.section("fault injection summary")
    header = f"{'fault injected':<46} {'jobs':>5} {'lost':>5} {'dup':>5} {'recover s':>10}  note"
    tr.write_line(header)
    tr.write_line("-" * len(header))
    for r in ROWS:
        rec = "-" if r.recover_s is None else f"{r.recover_s:.1f}"
        tr.write_line(
            f"{r.fault:<46} {r.submitted:>5} {r.lost:>5} {r.duplicated:>5} {rec:>10}  {r.note}"
        )


@pytest.fixture(scope="session")
def fault_table() -> list[FaultRow]:
    return ROWS


@pytest.fixture
def record(fault_table: list[FaultRow]) -> Callable[..., FaultRow]:
    def add(fault: str, submitted: int, lost: int, duplicated: int, recover_s: float | None,
            note: str = "") -> FaultRow:  # fmt: skip
        row = FaultRow(fault, submitted, lost, duplicated, recover_s, note)
        fault_table.append(row)
        return row

    return add


def _pg_reachable() -> str | None:
    from sqlalchemy import create_engine, text

    try:
        engine = create_engine(pg_url(), connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        return f"PostgreSQL at GPUSCHED_TEST_PG_URL unreachable: {type(exc).__name__}"
    return None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for stack in getattr(item, "_fault_stacks", []):
            report.sections.append(("stack processes (tails)", stack.tails(60)))


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    """A PostgreSQL server of this test's own, which it may stop and start."""
    pg = PrivatePostgres()
    try:
        yield pg.start()
    finally:
        pg.cleanup()


@pytest.fixture
def make_stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """Start a stack for this test (stopped at its end): make_stack(agents=..., env=...)."""
    started: list[Stack] = []
    request.node._fault_stacks = started  # type: ignore[attr-defined]

    def make(
        agents: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        cls: type[Stack] = Stack,
        **kwargs: Any,
    ) -> Stack:
        if cls is Stack:
            why = _pg_reachable()
            if why:
                pytest.skip(why)
            kwargs.setdefault("db", os.environ.get("GPUSCHED_FAULTS_DB", "postgresql"))
        stack = cls(
            tmp_path / f"stack{len(started)}",
            agents=agents or {"n1": "sim:4:H100-80GB", "n2": "sim:4:H100-80GB"},
            env={**FAULT_ENV, **(env or {})},
            **kwargs,
        )
        started.append(stack)
        stack.start(timeout=90)
        return stack

    yield make
    for stack in started:
        stack.stop()
