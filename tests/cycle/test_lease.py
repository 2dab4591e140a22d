"""The cycle lease is released when a cycle ends, after its plan is applied or after an
error, so that the next cycle of any scheduler process may start at once; while it is
held, another scheduler's cycle does not run."""

from __future__ import annotations

import pytest
from sqlalchemy import event

import app.cycle.run as run_module
from app.cycle import lease
from app.cycle.run import run_cycle
from app.db import utcnow
from app.messaging import NullMessenger
from tests.cycle.jobs_api import SETTINGS, add_node, get_job, submit


def _other_scheduler_may_cycle(api, now) -> bool:
    with api.factory() as session:
        return lease.acquire(session, holder="other", now=now, ttl_s=30) is not None


def test_a_cycle_releases_the_lease_when_it_ends(api) -> None:
    add_node(api, gpus=1)
    job = submit(api, gpus=1)
    now = utcnow()
    report = run_cycle(
        factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="a", now=now
    )
    assert report.ran and report.placed == 1
    assert get_job(api, job["id"])["status"] == "SCHEDULED"
    assert _other_scheduler_may_cycle(api, now)


def test_a_cycle_that_fails_releases_the_lease(api, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(**_: object) -> None:
        raise RuntimeError("snapshot failed")

    monkeypatch.setattr(run_module, "read_snapshot", broken)
    now = utcnow()
    with pytest.raises(RuntimeError, match="snapshot failed"):
        run_cycle(
            factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="a", now=now
        )
    assert _other_scheduler_may_cycle(api, now)


def test_a_held_lease_keeps_another_scheduler_out(api) -> None:
    now = utcnow()
    with api.factory() as session:
        assert lease.acquire(session, holder="a", now=now, ttl_s=30) == 1
    assert not _other_scheduler_may_cycle(api, now)
    report = run_cycle(
        factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="b", now=now
    )
    assert not report.ran


def test_the_holder_renews_the_lease_in_one_statement(api) -> None:
    # The token comes back with the update (RETURNING), not from a second read.
    now = utcnow()
    engine = api.factory.kw["bind"]
    with api.factory() as session:
        assert lease.acquire(session, holder="a", now=now, ttl_s=30) == 1
        statements: list[str] = []
        listener = event.listens_for(engine, "before_cursor_execute")(
            lambda _c, _cur, statement, *_: statements.append(statement)
        )  # SQLite's driver also sends BEGIN IMMEDIATE: transaction control, not counted
        try:
            assert lease.acquire(session, holder="a", now=now, ttl_s=30) == 2
        finally:
            event.remove(engine, "before_cursor_execute", listener)
    sql = [s for s in statements if not s.lstrip().upper().startswith("BEGIN")]
    assert len(sql) == 1 and sql[0].lstrip().upper().startswith("UPDATE")
