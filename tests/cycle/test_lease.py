"""The cycle lease is released when a cycle ends, after its plan is applied or after an
error, so that the next cycle of any scheduler process may start at once; while it is
held, another scheduler's cycle does not run."""

from __future__ import annotations

import pytest
from sqlalchemy import event

import app.cycle.run as run_module
from app.cycle.run import run_cycle
from app.db import utcnow
from app.messaging import NullMessenger
from tests.cycle.jobs_api import SETTINGS, add_node, get_job, lease_taken, submit
from tests.support.statements import statements_sent


def _other_scheduler_may_cycle(api, now) -> bool:
    with api.factory() as session:
        return lease_taken(session, holder="other", now=now, ttl_s=30) is not None


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
        assert lease_taken(session, holder="a", now=now, ttl_s=30) == 1
    assert not _other_scheduler_may_cycle(api, now)
    report = run_cycle(
        factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="b", now=now
    )
    assert not report.ran


def test_the_holder_renews_the_lease_in_one_statement(api) -> None:
    # The token comes back with the update (RETURNING), not from a second read.
    now = utcnow()
    with api.factory() as session:
        assert lease_taken(session, holder="a", now=now, ttl_s=30) == 1
        with statements_sent(api.factory) as sent:
            assert lease_taken(session, holder="a", now=now, ttl_s=30) == 2
    # SQLite's driver also sends BEGIN IMMEDIATE: transaction control, not counted
    sql = [s.statement for s in sent if not s.statement.lstrip().upper().startswith("BEGIN")]
    assert len(sql) == 1 and sql[0].lstrip().upper().startswith("UPDATE")


def test_the_plans_commit_releases_the_lease(api) -> None:
    # Taken in one statement, checked and let go in one more inside the plan's own
    # transaction: a locking read and a release of its own were two more round trips and
    # a commit in each cycle.
    add_node(api, gpus=1)
    now = utcnow()
    cycle = dict(factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="a")
    assert run_cycle(**cycle, now=now).ran  # the first makes the lease's row
    job = submit(api, gpus=1)
    with statements_sent(api.factory) as sent:
        report = run_cycle(**cycle, now=now)
    assert report.ran and report.placed == 1
    assert get_job(api, job["id"])["status"] == "SCHEDULED"
    on_the_lease = [s.statement for s in sent if "scheduler_lease" in s.statement]
    assert len(on_the_lease) == 2, "\n".join(on_the_lease)
    assert _other_scheduler_may_cycle(api, now)


def test_the_lease_is_taken_in_the_settle_phases_transaction(api) -> None:
    # A commit of its own was one more round trip (and, on a durable server, one more WAL
    # flush) in every cycle: the lease and phase 0's writes now commit together, the plan
    # (releasing the lease) once more, and a full cycle's ranks once more.
    add_node(api, gpus=1)
    now = utcnow()
    cycle = dict(factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="a")
    assert run_cycle(**cycle, now=now).ran  # the first makes the lease's row
    job = submit(api, gpus=1)
    engine = api.factory.kw["bind"]
    commits: list[object] = []
    count = commits.append  # one bound method, to remove the listener by
    event.listen(engine, "commit", count)
    try:
        report = run_cycle(**cycle, now=now)
    finally:
        event.remove(engine, "commit", count)
    assert report.ran and report.placed == 1
    assert get_job(api, job["id"])["status"] == "SCHEDULED"
    assert len(commits) == 3


def test_a_plan_that_fails_to_commit_releases_the_lease(
    api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rolled back, the plan's transaction takes its release of the lease with it.
    import app.cycle.apply as apply_module

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("usage not stored")

    monkeypatch.setattr(apply_module, "_store_usage", broken)
    add_node(api, gpus=1)
    submit(api, gpus=1)
    now = utcnow()
    with pytest.raises(RuntimeError, match="usage not stored"):
        run_cycle(
            factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="a", now=now
        )
    assert _other_scheduler_may_cycle(api, now)
