"""The one function that changes a job's status.

Every change is checked against ALLOWED and recorded as a job_event in the same
transaction, so the stored history always explains the stored state.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import cast

from prometheus_client import Histogram
from sqlalchemy import Table, exists, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from app.db import after_commit, insert_rows, utcnow
from app.jobs.models import Job, JobEvent
from app.jobs.outbox import queue_for
from app.jobs.states import ALLOWED, FINISHED, RETRYABLE, JobStatus
from app.scheduling.types import ReasonKind

WAIT_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 7 * 86400)
# Observed once per job, when it first starts, by the process that records the start
# (transition, after the commit): a counter-like histogram whose rate() is the wait of
# the jobs that started in the range, not a sliding window recomputed per scrape. The
# other metrics are in app/metrics.py, above the domains.
QUEUE_WAIT_SECONDS = Histogram(
    "gpusched_queue_wait_seconds",
    "Time a job waited in the queue before its first start (held or not yet eligible: not counted)",
    buckets=WAIT_BUCKETS,
)


class IllegalTransition(ValueError):
    def __init__(self, job_id: int, current: JobStatus, target: JobStatus, why: str = "") -> None:
        self.current = current
        self.target = target
        detail = f": {why}" if why else ""
        super().__init__(f"job {job_id}: {current} -> {target} is not allowed{detail}")


def retries_left(job: Job) -> int:
    return max(0, job.retries - job.failures)


def will_retry(job: Job) -> bool:
    """Whether a failed attempt puts the job back in the queue (not an end): retries
    left, and no cancel asked for."""
    return retries_left(job) > 0 and job.cancel_requested_at is None


def transition(
    session: Session, *, job: Job, to: JobStatus, actor: str, reason: str = ""
) -> JobEvent:
    current = JobStatus(job.status)
    if to not in ALLOWED[current]:
        raise IllegalTransition(job.id, current, to)
    if current in RETRYABLE and to is JobStatus.PENDING and retries_left(job) == 0:
        raise IllegalTransition(job.id, current, to, "no retries left")

    now = utcnow()
    if current in RETRYABLE and to is JobStatus.PENDING:
        job.failures += 1
    if to is JobStatus.PENDING:
        # Back in the queue: say why until the next cycle gives the real pending reason.
        job.pending_reason = ReasonKind.NEW.value
        job.pending_message = f"{reason}; waiting for the next scheduling cycle"
        job.preempt_requested_at = None
        job.exit_code = None
        job.started_at = None
        job.scheduled_at = None
        job.lost_until = None
    elif to is JobStatus.SCHEDULED:
        for key, value in _scheduled(now).items():
            setattr(job, key, value)
    elif to is JobStatus.RUNNING:
        job.started_at = now
        # A first attempt has no earlier start: no query for it (most starts).
        if job.attempt <= 1 or not _started_before(session, job):
            wait = queue_wait_s(job, started_at=now)
            after_commit(session, lambda: QUEUE_WAIT_SECONDS.observe(wait))
    elif to is JobStatus.PREEMPTED:
        job.last_preempted_at = now
    if to in FINISHED:
        job.finished_at = now
        job.queue_position = None
    job.status = to
    job.updated_at = now
    event = JobEvent(
        job_id=job.id,
        at=now,
        from_status=current,
        to_status=to,
        attempt=job.attempt,
        actor=actor,
        reason=reason,
    )
    session.add(event)
    ends = to in FINISHED and not (to is JobStatus.FAILED and will_retry(job))
    # In this transaction: never lost.
    queue_for(session, job=job, came_from=current, to=to, ends=ends, now=now)
    return event


def cancel_waiting(session: Session, ids: Sequence[int], *, actor: str, reason: str) -> list[int]:
    """`transition` to CANCELLED of the waiting jobs among `ids` (rows the caller holds
    locked) that no notification is due for, by statement: the same columns and event,
    for a bulk cancel of thousands (one by one, 20,000 took 6-7 s). Jobs with a
    `notify_url` are left to `transition`, which queues their message. Returns the jobs
    cancelled."""
    assert JobStatus.CANCELLED in ALLOWED[JobStatus.PENDING]
    rows = session.execute(
        select(Job.id, Job.attempt).where(
            Job.id.in_(ids), Job.status == JobStatus.PENDING, Job.notify_url.is_(None)
        )
    ).all()
    if not rows:
        return []
    now = utcnow()
    cancelled = [job_id for job_id, _ in rows]
    session.execute(
        update(Job)
        .where(Job.id.in_(cancelled))
        .values(status=JobStatus.CANCELLED, finished_at=now, updated_at=now, queue_position=None)
        .execution_options(synchronize_session=False)
    )
    insert_rows(
        session.connection(),
        cast(Table, JobEvent.__table__),
        [
            {
                "job_id": job_id,
                "at": now,
                "from_status": JobStatus.PENDING,
                "to_status": JobStatus.CANCELLED,
                "attempt": attempt,
                "actor": actor,
                "reason": reason,
            }
            for job_id, attempt in rows
        ],
    )
    return cancelled


def _scheduled(now: datetime) -> dict[str, object]:
    """What placing a job sets besides its status (`transition`, `schedule_placed`)."""
    return {
        "scheduled_at": now,
        # The new attempt's, as its nodes report them.
        "cpu_s": None,
        "memory_peak_mb": None,
        "pending_reason": None,
        "pending_message": None,
        "queue_position": None,
        "estimated_start_at": None,
    }


def schedule_placed(session: Session, placed: Sequence[tuple[Job, str]], *, actor: str) -> None:
    """`transition` to SCHEDULED, attempt one more, of waiting jobs the caller holds
    locked and loaded, each with its event's reason, by statement: the same columns and
    events. A cycle at 1,000 nodes places hundreds of jobs, and the unit of work's flush
    of their rows and events was most of its apply (bench/deep_queue.py). No message is
    queued: SCHEDULED is none of `notify_on`'s events (outbox.event_for)."""
    assert all(JobStatus.SCHEDULED in ALLOWED[JobStatus(job.status)] for job, _ in placed)
    if not placed:
        return
    now = utcnow()
    values = {**_scheduled(now), "status": JobStatus.SCHEDULED, "updated_at": now}
    session.flush()  # the jobs' own pending changes first, as the ORM would order them
    session.execute(
        update(Job)
        .where(Job.id.in_([job.id for job, _ in placed]))
        .values(attempt=Job.attempt + 1, **values)
        .execution_options(synchronize_session=False)
    )
    for job, _ in placed:  # the loaded jobs as now stored, not to be written again
        set_committed_value(job, "attempt", job.attempt + 1)
        for key, value in values.items():
            set_committed_value(job, key, value)
    insert_rows(
        session.connection(),
        cast(Table, JobEvent.__table__),
        [
            {
                "job_id": job.id,
                "at": now,
                "from_status": JobStatus.PENDING,
                "to_status": JobStatus.SCHEDULED,
                "attempt": job.attempt,
                "actor": actor,
                "reason": reason,
            }
            for job, reason in placed
        ],
    )


def queue_wait_s(job: Job, *, started_at: datetime) -> float:
    """How long the job waited to start while it could have: from submission, less the
    time it was held or waiting on its dependencies, and not before its begin time."""
    eligible = job.created_at + timedelta(seconds=job.ineligible_s)
    if job.begin_at is not None:
        eligible = max(eligible, job.begin_at)
    return max(0.0, (started_at - eligible).total_seconds())


def _started_before(session: Session, job: Job) -> bool:
    # Once per job: a requeued or retried job's later starts are not a new wait.
    return bool(
        session.scalar(
            select(
                exists().where(JobEvent.job_id == job.id, JobEvent.to_status == JobStatus.RUNNING)
            )
        )
    )


def note(session: Session, *, job: Job, actor: str, reason: str) -> None:
    """An event that changes no state (hold, release, a cancel still under way, a
    notification given up on), so `gpusched show` tells who did it."""
    status = JobStatus(job.status)
    session.add(
        JobEvent(
            job_id=job.id,
            from_status=status,
            to_status=status,
            attempt=job.attempt,
            actor=actor,
            reason=reason,
        )
    )


def settle_interrupted(session: Session, *, job: Job, actor: str) -> None:
    """After PREEMPTED or LOST: back to the queue, without spending a retry; but
    CANCELLED if a cancel was asked for meanwhile.

    A preemption is the scheduler's choice (a requeue its owner's), a lost node the node's
    failure (Slurm requeues a batch job on node failure): neither is the job's fault.
    """
    if job.cancel_requested_at is not None:
        # Cancelled while it was being stopped for another reason (preempted, requeued,
        # its node lost): the cancel wins; it must not come back.
        transition(session, job=job, to=JobStatus.PENDING, actor=actor, reason="")
        transition(
            session,
            job=job,
            to=JobStatus.CANCELLED,
            actor=actor,
            reason="cancelled by user while it was being stopped",
        )
        return
    # Why it was stopped (preempted for job N, requeued by its owner, its node lost) is the
    # event before.
    transition(
        session, job=job, to=JobStatus.PENDING, actor=actor, reason="requeued: no retry spent"
    )
