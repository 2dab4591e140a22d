"""Every status change goes through transition(); illegal ones never reach the database."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from app.auth.service import create_user
from app.jobs.lifecycle import IllegalTransition, schedule_placed, settle_interrupted, transition
from app.jobs.models import Job, JobEvent
from app.jobs.states import ALLOWED, FINISHED, JobStatus
from app.projects.models import Project


def _job(session, *, retries=0):
    user, _ = create_user(
        session=session, name="u", projects=["p"], is_admin=False, ttl_days=0, actor="test"
    )
    project_id = session.scalar(select(Project.id).where(Project.name == "p"))
    job = Job(name="j", user_id=user.id, project_id=project_id, command=["true"], retries=retries)
    session.add(job)
    session.flush()
    return job


def test_happy_path_records_every_change(db_session):
    job = _job(db_session)
    for target in (JobStatus.SCHEDULED, JobStatus.RUNNING, JobStatus.SUCCEEDED):
        transition(db_session, job=job, to=target, actor="test", reason=f"to {target}")
    db_session.flush()
    events = db_session.scalars(select(JobEvent).where(JobEvent.job_id == job.id)).all()
    assert [(e.from_status, e.to_status) for e in events] == [
        ("PENDING", "SCHEDULED"),
        ("SCHEDULED", "RUNNING"),
        ("RUNNING", "SUCCEEDED"),
    ]
    assert job.finished_at is not None and job.started_at is not None


def test_jobs_placed_by_statement_are_stored_as_transition_stores_them(db_session):
    # A cycle places hundreds of jobs at once by statement (schedule_placed), one by one
    # through the ORM before: the columns and events must be the same.
    one = _job(db_session)
    batch = Job(name="j", user_id=one.user_id, project_id=one.project_id, command=["true"])
    db_session.add(batch)
    for job in (one, batch):
        job.pending_reason, job.pending_message, job.queue_position = "priority", "behind 3", 4
        job.cpu_s, job.memory_peak_mb = 12.5, 900
    db_session.flush()
    one.attempt += 1
    transition(db_session, job=one, to=JobStatus.SCHEDULED, actor="scheduler", reason="placed")
    schedule_placed(db_session, [(batch, "placed")], actor="scheduler")
    db_session.commit()
    db_session.expire_all()
    columns = ("status", "attempt", "cpu_s", "memory_peak_mb", "pending_reason",
               "pending_message", "queue_position", "estimated_start_at")  # fmt: skip
    stored = [tuple(getattr(job, c) for c in columns) for job in (one, batch)]
    assert stored[0] == stored[1] == (JobStatus.SCHEDULED, 1, *[None] * 6)
    assert one.scheduled_at is not None and batch.scheduled_at is not None
    events = [
        (e.from_status, e.to_status, e.attempt, e.actor, e.reason)
        for job in (one, batch)
        for e in db_session.scalars(select(JobEvent).where(JobEvent.job_id == job.id))
    ]
    assert events == [(JobStatus.PENDING, JobStatus.SCHEDULED, 1, "scheduler", "placed")] * 2


def test_finished_job_cannot_restart(db_session):
    job = _job(db_session)
    for target in (JobStatus.SCHEDULED, JobStatus.RUNNING, JobStatus.SUCCEEDED):
        transition(db_session, job=job, to=target, actor="test")
    with pytest.raises(IllegalTransition, match="SUCCEEDED -> RUNNING"):
        transition(db_session, job=job, to=JobStatus.RUNNING, actor="test")
    assert job.status == JobStatus.SUCCEEDED


def test_a_lost_node_costs_the_job_no_retry(db_session):
    # Slurm requeues a batch job whose node failed: the node's failure, not the job's.
    job = _job(db_session, retries=0)
    for _ in range(3):
        transition(db_session, job=job, to=JobStatus.SCHEDULED, actor="t")
        transition(db_session, job=job, to=JobStatus.RUNNING, actor="t")
        transition(db_session, job=job, to=JobStatus.LOST, actor="t")
        settle_interrupted(db_session, job=job, actor="t")
        assert job.status == JobStatus.PENDING and job.failures == 0
    # A cancel that came meanwhile wins.
    transition(db_session, job=job, to=JobStatus.SCHEDULED, actor="t")
    transition(db_session, job=job, to=JobStatus.LOST, actor="t")
    job.cancel_requested_at = job.updated_at
    settle_interrupted(db_session, job=job, actor="t")
    assert job.status == JobStatus.CANCELLED


def test_preemption_costs_no_retry(db_session):
    job = _job(db_session, retries=0)
    transition(db_session, job=job, to=JobStatus.SCHEDULED, actor="t")
    transition(db_session, job=job, to=JobStatus.RUNNING, actor="t")
    transition(db_session, job=job, to=JobStatus.PREEMPTED, actor="t")
    settle_interrupted(db_session, job=job, actor="t")
    assert job.status == JobStatus.PENDING and job.failures == 0


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    targets=st.lists(st.sampled_from(list(JobStatus)), min_size=1, max_size=25),
    retries=st.integers(0, 3),
)
def test_random_event_sequences_never_store_an_illegal_state(db_session, targets, retries):
    nested = db_session.begin_nested()
    job = _job(db_session, retries=retries)
    history = [JobStatus.PENDING]
    for target in targets:
        before = JobStatus(job.status)
        try:
            transition(db_session, job=job, to=target, actor="prop")
        except IllegalTransition:
            assert job.status == before  # a refused change leaves the job as it was
            continue
        assert target in ALLOWED[before]
        history.append(target)
    db_session.flush()
    db_session.expire_all()
    stored = db_session.get(Job, job.id)
    events = db_session.scalars(
        select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.id)
    ).all()
    # The stored events replay exactly the accepted path, each step legal.
    assert [e.to_status for e in events] == history[1:]
    for event in events:
        assert event.to_status in ALLOWED[event.from_status]
    assert stored.status == history[-1]
    assert stored.failures <= stored.retries
    if stored.status in FINISHED:
        assert stored.finished_at is not None
    nested.rollback()
