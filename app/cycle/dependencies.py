"""Phase 0 of a cycle: settle the jobs waiting on their dependencies (depends_on, or
singleton: their user's other jobs of the same name).

A job whose dependencies have all ended as it asks (succeeded, for afterok) becomes
eligible: the snapshot takes it from now on, and the time it waited for them does not
count as waiting. A job one of whose dependencies ended otherwise is cancelled (it could
never start). The rest get their
reason brought up to date ("waiting for job 12 (train) and 1 more to succeed").
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.jobs.dependencies import (
    Dependency,
    judge,
    load_dependencies,
    load_namesakes,
    singleton_verdict,
)
from app.jobs.lifecycle import transition
from app.jobs.models import Job
from app.jobs.states import AFTER_START, SINGLETON, JobStatus
from app.scheduling.types import ReasonKind


def settle_dependencies(session: Session, *, now: datetime) -> frozenset[int]:
    """Flushes, does not commit. Returns the jobs that jobs still waiting with `after`
    wait for: when this cycle places one, the next cycle lets them in."""
    waiting = session.scalars(
        select(Job)
        .where(Job.status == JobStatus.PENDING, Job.dependencies_met.is_(False))
        .order_by(Job.id)
        .with_for_update()
    ).all()
    if not waiting:
        return frozenset()
    jobs = load_dependencies(session, (d for job in waiting for d in job.depends_on))
    singletons = [job for job in waiting if job.dependency_kind == SINGLETON]
    namesakes = (
        load_namesakes(
            session, users=(j.user_id for j in singletons), names=(j.name for j in singletons)
        )
        if singletons
        else {}
    )
    awaited_starts: set[int] = set()
    # In id order, and a job submitted with dependencies has a higher id than they do: a
    # chain whose first link breaks is cancelled to its end in this one pass. A job made
    # to wait for a later one (PATCH depends_on) is reached in the next cycle's pass.
    for job in waiting:
        if job.dependency_kind == SINGLETON:
            same = namesakes.get((job.user_id, job.name), [])
            verdict = singleton_verdict(job.id, job.name, same)
        else:
            verdict = judge(job.depends_on, jobs, job.dependency_kind)
        if verdict.broken:
            transition(
                session,
                job=job,
                to=JobStatus.CANCELLED,
                actor="scheduler",
                reason=f"dependency never satisfied: {verdict.message}",
            )
            jobs[job.id] = Dependency(job.id, job.name, JobStatus.CANCELLED, now)
        elif verdict.met:
            eligible_at = max(verdict.met_at or now, job.created_at)
            job.dependencies_met = True
            _ineligible_until(job, eligible_at)
            # A new arrival for the next quick cycle, which ranks it.
            job.pending_reason = ReasonKind.NEW.value
            job.pending_message = "dependencies met; waiting for the next scheduling cycle"
        else:
            if job.dependency_kind == AFTER_START:
                awaited_starts.update(job.depends_on)
            if job.pending_message != verdict.message:
                job.pending_reason, job.pending_message = (
                    ReasonKind.DEPENDENCY.value,
                    verdict.message,
                )
    session.flush()
    return frozenset(awaited_starts)


def _ineligible_until(job: Job, eligible_at: datetime) -> None:
    """The job could not run before `eligible_at`: that time is not time waited. A hold
    that overlapped it is counted once (from `eligible_at` on, if still held)."""
    job.ineligible_s = max(job.ineligible_s, int((eligible_at - job.created_at).total_seconds()))
    if job.held_at is not None and job.held_at < eligible_at:
        job.held_at = eligible_at
