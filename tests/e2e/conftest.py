"""End-to-end fixtures: the real system (API, scheduler, agents, private Redis) as separate
processes on loopback, started once per test module.

A module configures its stack with module-level variables:

    STACK_AGENTS = {"n1": "sim:4:H100-80GB"}       # short node name -> --gpus spec
    STACK_ENV = {"GPUSCHED_SCHEDULER_HEARTBEAT_TIMEOUT_S": "3"}
    STACK_REPORTS_WORKER = True                     # reports in their own process, as `up`
    STACK_REPORTS_ENV = [{}, {}]                    # ... or in replicas, each with these

A port is written FREE_PORT (tests.support.stack): the stack picks it as it starts, and
is started anew if another server took it first; tests read it back from the stack
(`env_overrides`, `reports_env`).

The database is chosen like the rest of the suite (GPUSCHED_TEST_DB=sqlite|postgresql);
each stack gets a fresh SQLite file or a fresh PostgreSQL database. When a test fails, the
tail of every process's output is added to its report.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.support.stack import Stack

BACKEND = os.environ.get("GPUSCHED_TEST_DB", "sqlite")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        stack = getattr(item, "funcargs", {}).get("stack")
        if isinstance(stack, Stack):
            report.sections.append(("stack processes (tails)", stack.tails(60)))


@pytest.fixture(scope="module")
def _module_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    agents = getattr(request.module, "STACK_AGENTS", {"n1": "sim:4:H100-80GB"})
    env = getattr(request.module, "STACK_ENV", {})
    reports_worker = getattr(request.module, "STACK_REPORTS_WORKER", False)
    reports_env = getattr(request.module, "STACK_REPORTS_ENV", ({},))
    for tries in range(1, 4):
        root: Path = tmp_path_factory.mktemp("e2e")
        stack = Stack(
            root,
            db=BACKEND,
            agents=agents,
            env=env,
            reports_worker=reports_worker,
            reports_env=reports_env,
        )
        stack.start(timeout=90)
        lost = stack.picked_port_lost()
        if lost is None:
            break
        stack.stop()  # a metrics port it picked was taken meanwhile: pick others
        if tries == 3:
            raise RuntimeError(f"metrics ports taken three times over; the last: {lost}")
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def stack(_module_stack: Stack) -> Stack:
    """The module's running stack; each test must leave no job running on it."""
    _module_stack.api("GET", "/healthz")
    return _module_stack


@pytest.fixture
def work(_module_stack: Stack, request: pytest.FixtureRequest) -> Path:
    """A directory the jobs of one test write into (pid files, markers)."""
    path = _module_stack.root / "work" / request.node.name
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def factory(session_factory: sessionmaker[Session]) -> sessionmaker[Session]:
    """A clean, migrated database of the suite's backend, for tests that drive the
    scheduler's functions directly (no processes)."""
    return session_factory
