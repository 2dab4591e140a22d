"""A fast job's "started" and "finished" reports are handled at the same time by two of the
scheduler's worker threads (seen end-to-end: duplicate SCHEDULED -> RUNNING events on
SQLite). Both handlers lock the job row (`SELECT ... FOR UPDATE`) so that the second one
sees what the first wrote. This test replays that interleaving directly on the database.

On PostgreSQL the lock holds and the history stays whole. On SQLite `FOR UPDATE` is a
no-op and pysqlite opens the transaction only at the first write, so the second handler
works from a stale row: the job gets two SCHEDULED -> RUNNING events and, depending on
the commit order, its status is overwritten (lost update). See the report for the fix
proposed in app/db.py (BEGIN IMMEDIATE for SQLite write transactions).
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.auth.service import create_user
from app.cycle.run import run_cycle
from app.cycle.settings import SchedulerSettings
from app.db import utcnow
from app.jobs import agent_reports
from app.jobs.models import Job, JobEvent
from app.messaging import NullMessenger
from app.nodes.models import Allocation
from app.projects.models import Project
from app.wire import Finished, Started
from tests.foundation.builders import ready_node

pytestmark = pytest.mark.e2e


def _scheduled_job(factory: sessionmaker[Session]) -> tuple[int, int]:
    """One job placed by a real cycle: SCHEDULED, attempt 1, holding GPU 0 of node n1."""
    now = utcnow()
    with factory() as session:
        user, _ = create_user(
            session=session, name="u", projects=["p"], is_admin=False, ttl_days=0, actor="test"
        )
        project_id = session.scalar(select(Project.id).where(Project.name == "p"))
        node = ready_node("n1", gpus=1, now=now)
        session.add(node)
        job = Job(
            name="fast", user_id=user.id, project_id=project_id, command="exit 3", gpus=1, retries=1
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
        assert job is not None and job.status == "SCHEDULED"
        return job_id, job.attempt


def test_concurrent_started_and_finished_reports_keep_history_whole(
    factory: sessionmaker[Session],
) -> None:
    job_id, attempt = _scheduled_job(factory)
    base = Started(node="n1", job_id=job_id, attempt=attempt)
    read_done = threading.Event()
    may_commit = threading.Event()
    finished_done = threading.Event()
    errors: list[BaseException] = []

    def started() -> None:  # the first handler: reads (and locks) the job, then commits
        try:
            with factory() as session:
                applied = agent_reports.job_started(session=session, report=replace(base, pid=1))
                assert applied.accepted
                read_done.set()
                may_commit.wait(10)
                session.commit()
        except BaseException as exc:
            errors.append(exc)
            read_done.set()

    def finished() -> None:  # the second handler, in another thread, meanwhile
        try:
            with factory() as session:
                end = Finished(
                    node="n1",
                    job_id=job_id,
                    attempt=attempt,
                    result="FAILED",
                    exit_code=3,
                    message="exit code 3",
                )
                agent_reports.job_finished(session=session, report=end)
                session.commit()
        except BaseException as exc:
            errors.append(exc)
        finally:
            finished_done.set()

    first = threading.Thread(target=started)
    first.start()
    assert read_done.wait(10)
    second = threading.Thread(target=finished)
    second.start()
    # PostgreSQL: the second handler waits for the first one's row lock (this times out).
    # SQLite: nothing stops it, it commits first.
    finished_done.wait(1.0)
    may_commit.set()
    first.join(10)
    second.join(10)
    assert not errors, errors

    with factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        steps = [
            (e.attempt, e.from_status, e.to_status)
            for e in session.scalars(
                select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
            )
        ]
        active = session.scalars(
            select(Allocation).where(Allocation.job_id == job_id, Allocation.released_at.is_(None))
        ).all()
        status = job.status
    expected = [
        (1, "PENDING", "SCHEDULED"),
        (1, "SCHEDULED", "RUNNING"),
        (1, "RUNNING", "FAILED"),
        (1, "FAILED", "PENDING"),
    ]
    # Requeued for its retry, its GPU released, one event per change.
    assert (status, steps, len(active)) == ("PENDING", expected, 0)


def test_a_report_applied_from_a_stale_copy_of_the_job_changes_nothing(
    factory: sessionmaker[Session],
) -> None:
    """The heartbeat reconciliation reads the node's jobs without a lock, then applies a
    "started" for each one the agent runs. On PostgreSQL the direct "started" report can
    commit between that read and the locked read in `job_started`; the session then holds
    a stale SCHEDULED copy. (Seen end-to-end with two schedulers: RUNNING twice for one
    attempt.) Here the stale copy is kept across a commit, which the session allows."""
    job_id, attempt = _scheduled_job(factory)
    base = Started(node="n1", job_id=job_id, attempt=attempt)
    with factory() as heartbeat:
        stale = heartbeat.get(Job, job_id)
        assert stale is not None and stale.status == "SCHEDULED"
        heartbeat.commit()  # expire_on_commit=False: the copy stays as it was
        with factory() as direct:
            assert agent_reports.job_started(session=direct, report=replace(base, pid=7)).accepted
            direct.commit()
        agent_reports.job_started(session=heartbeat, report=base)
        heartbeat.commit()
    with factory() as session:
        running = session.scalars(
            select(JobEvent.reason).where(
                JobEvent.job_id == job_id, JobEvent.to_status == "RUNNING"
            )
        ).all()
    assert running == ["started as pid 7"]


def test_a_finish_report_alone_records_the_start_with_its_pid(
    factory: sessionmaker[Session],
) -> None:
    """An agent reports a job that ended at once by its end alone, with the pid."""
    job_id, attempt = _scheduled_job(factory)
    end = Finished(
        node="n1",
        job_id=job_id,
        attempt=attempt,
        pid=42,
        result="SUCCEEDED",
        exit_code=0,
        message="exit code 0",
    )
    with factory.begin() as session:
        applied = agent_reports.job_finished(session=session, report=end)
        assert applied.accepted
    with factory() as session:
        steps = [
            (e.from_status, e.to_status, e.reason)
            for e in session.scalars(
                select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
            )
        ][1:]
    assert steps == [
        ("SCHEDULED", "RUNNING", "started as pid 42"),
        ("RUNNING", "SUCCEEDED", "exit code 0"),
    ]
