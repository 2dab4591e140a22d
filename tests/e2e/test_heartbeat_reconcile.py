"""A heartbeat from a node that runs a job: the scheduler compares what the agent runs with
what the database says runs there (`reconcile_node_attempts`).

Found end-to-end on PostgreSQL: the query selected whole Job rows with DISTINCT, and
PostgreSQL has no equality operator for `json` columns (command, env, labels), so every
heartbeat of a node holding a job failed and rolled back its telemetry — no node ever
became schedulable. This is the minimal reproduction (runs on both backends).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from psycopg.errors import DeadlockDetected
from sqlalchemy import event, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

import workers.heartbeats
from app.auth.service import create_user
from app.cycle.reconcile import reconcile_node_attempts
from app.cycle.run import run_cycle
from app.cycle.settings import SchedulerSettings
from app.db import utcnow
from app.jobs import agent_reports
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.messaging import NullMessenger
from app.nodes.models import Node
from app.nodes.telemetry import TelemetryPolicy
from app.projects.models import Project
from app.wire import AttemptRef, Finished, Heartbeat, Started, StopJob
from tests.foundation.builders import ready_node
from workers.heartbeats import handle_heartbeat

pytestmark = pytest.mark.e2e


def _placed_job(factory: sessionmaker[Session]) -> tuple[int, int]:
    now = utcnow()
    with factory() as session:
        user, _ = create_user(
            session=session, name="u", projects=["p"], is_admin=False, ttl_days=0, actor="test"
        )
        project_id = session.scalar(select(Project.id).where(Project.name == "p"))
        node = ready_node("n1", gpus=2, now=now)
        session.add(node)
        # Two GPUs: two allocation rows, so the join yields the job twice.
        job = Job(
            name="j",
            user_id=user.id,
            project_id=project_id,
            command=["sleep", "60"],
            env={"A": "1"},
            labels={"team": "x"},
            gpus=2,
        )
        session.add(job)
        session.commit()
        job_id = job.id
    report = run_cycle(
        factory=factory,
        messenger=NullMessenger(),
        holder="test",
        now=utcnow(),
        settings=SchedulerSettings(stability_window_s=0, preemption=False),
    )
    assert report.placed == 1
    with factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.id, job.attempt


def _started_job(factory: sessionmaker[Session]) -> tuple[int, datetime]:
    """A placed job whose agent reported it started: RUNNING since the returned time."""
    job_id, attempt = _placed_job(factory)
    with factory() as session:
        agent_reports.job_started(
            session=session, report=Started(job_id=job_id, attempt=attempt, node="n1")
        )
        session.commit()
        job = session.get(Job, job_id)
        assert job is not None and job.started_at is not None
        return job_id, job.started_at


def test_heartbeat_of_a_node_running_a_job_reconciles(factory: sessionmaker[Session]) -> None:
    job_id, attempt = _placed_job(factory)
    now = utcnow() + timedelta(seconds=60)
    with factory() as session:
        repairs = reconcile_node_attempts(
            session=session,
            heartbeat=Heartbeat(node="n1", running=(AttemptRef(job_id=job_id, attempt=attempt),)),
            taken_at=now,
            grace_s=15,
        )
        session.commit()
    assert (repairs.stops, repairs.lost) == ([], [])
    # An orphan the agent still runs (an attempt not current here) is told to stop; nothing
    # is lost.
    with factory() as session:
        running = (
            AttemptRef(job_id=job_id, attempt=attempt),
            AttemptRef(job_id=job_id, attempt=attempt + 1),
        )
        repairs = reconcile_node_attempts(
            session=session,
            heartbeat=Heartbeat(node="n1", running=running),
            taken_at=now,
            grace_s=15,
        )
        session.commit()
    assert repairs.stops == [
        StopJob(node="n1", job_id=job_id, attempt=attempt + 1, reason="cancel")
    ]
    assert repairs.lost == []


def test_a_heartbeat_listing_a_running_attempt_reads_it_once(
    factory: sessionmaker[Session],
) -> None:
    """A heartbeat lists every attempt its node runs. Only a start not yet applied is
    applied from it: at 1,000 nodes, a locked read of every running job each heartbeat
    made heartbeats wait on the job reports' locks."""
    job_id, _ = _started_job(factory)
    statements: list[str] = []
    engine = factory.kw["bind"]

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        with factory() as session:
            repairs = reconcile_node_attempts(
                session=session,
                heartbeat=Heartbeat(node="n1", running=(AttemptRef(job_id=job_id, attempt=1),)),
                taken_at=utcnow(),
                grace_s=15,
            )
            session.commit()
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert (repairs.stops, repairs.lost) == ([], [])
    # The one read of the attempts active on the node; the job not read again, locked.
    assert len([s for s in statements if "job.id" in s]) == 1


def test_a_heartbeat_taken_before_an_end_does_not_stop_the_ended_attempt(
    factory: sessionmaker[Session],
) -> None:
    """Handled behind the attempt's finished report, a heartbeat taken while it ran lists
    it as running: no orphan (it was stopped again, with a warning on `up`'s console)."""
    job_id, started_at = _started_job(factory)
    with factory() as session:
        assert agent_reports.job_finished(
            session=session,
            report=Finished(node="n1", job_id=job_id, attempt=1, result="SUCCEEDED"),
        ).accepted
        session.commit()
    listed = Heartbeat(node="n1", running=(AttemptRef(job_id=job_id, attempt=1),))

    def stops(taken_at: datetime) -> list[StopJob]:
        with factory() as session:
            repairs = reconcile_node_attempts(
                session=session, heartbeat=listed, taken_at=taken_at, grace_s=15
            )
            session.commit()
        return repairs.stops

    assert stops(started_at + timedelta(milliseconds=1)) == []
    # Taken after the end and still running it: an orphan, stopped.
    assert stops(utcnow() + timedelta(seconds=5)) == [
        StopJob(node="n1", job_id=job_id, attempt=1, reason="cancel")
    ]


def test_a_heartbeat_taken_before_a_start_does_not_lose_it(
    factory: sessionmaker[Session],
) -> None:
    """Handled late (redelivered, or queued behind a backlog), a heartbeat taken before
    the attempt started does not list it; that is no evidence the process vanished."""
    job_id, started_at = _started_job(factory)

    def heartbeat(taken_at: datetime) -> list[int]:
        with factory() as session:
            repairs = reconcile_node_attempts(
                session=session, heartbeat=Heartbeat(node="n1"), taken_at=taken_at, grace_s=15
            )
            session.commit()
        return repairs.lost

    assert heartbeat(started_at - timedelta(seconds=1)) == []
    # Taken well after the start and it does not list the attempt: the process is gone.
    assert heartbeat(started_at + timedelta(seconds=60)) == [job_id]


def test_the_scheduler_judges_a_late_heartbeat_by_when_it_was_taken(
    factory: sessionmaker[Session],
) -> None:
    job_id, started_at = _started_job(factory)
    heartbeat = Heartbeat(node="n1", taken_at=(started_at - timedelta(seconds=1)).timestamp())

    with factory() as session:
        repairs = handle_heartbeat(
            session=session,
            heartbeat=heartbeat,
            telemetry=TelemetryPolicy(),
            grace_s=15,
            now=started_at + timedelta(seconds=60),  # handled a minute late
        )

    assert repairs is not None and repairs.lost == []
    with factory() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.status is JobStatus.RUNNING


def test_a_heartbeat_that_loses_a_deadlock_is_stored_on_its_second_try(
    factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under load, PostgreSQL picked the heartbeat as a deadlock's victim (a cycle's apply
    # held the same rows); dropped, its node looked silent and its jobs ran twice.
    job_id, started_at = _started_job(factory)
    real_ingest = workers.heartbeats.ingest_heartbeats
    calls = []

    def first_one_deadlocks(**kwargs: Any) -> dict[str, int]:
        calls.extend(heartbeat.node for heartbeat in kwargs["heartbeats"])
        ids = real_ingest(**kwargs)  # its writes are rolled back with the deadlock
        if len(calls) == 1:
            raise OperationalError("UPDATE gpu", {}, DeadlockDetected("deadlock detected"))
        return ids

    monkeypatch.setattr(workers.heartbeats, "ingest_heartbeats", first_one_deadlocks)
    received = started_at + timedelta(seconds=5)
    with factory() as session:
        repairs = handle_heartbeat(
            session=session,
            heartbeat=Heartbeat(node="n1", running=(AttemptRef(job_id=job_id, attempt=1),)),
            telemetry=TelemetryPolicy(),
            grace_s=15,
            now=received,
        )

    assert calls == ["n1", "n1"]
    assert repairs is not None and repairs.lost == []
    with factory() as session:
        node = session.scalar(select(Node).where(Node.name == "n1"))
        assert node is not None and node.last_heartbeat_at is not None
        assert node.last_heartbeat_at.replace(tzinfo=None) == received.replace(tzinfo=None)
