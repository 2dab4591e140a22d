"""How agents' reports change jobs. Every report names (job_id, attempt); a report for
any attempt other than the job's current one is ignored (fencing), so a slow or restarted
agent can never overwrite a newer attempt."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from app.jobs.allocations import release
from app.jobs.lifecycle import note, settle_interrupted, transition, will_retry
from app.jobs.models import Allocation, Job
from app.jobs.orders import NOTHING, AfterCommit, placed_on, stop_orders
from app.jobs.states import ACTIVE, JobStatus
from app.nodes.models import Node
from app.wire import Finished, RefusalReason, Started

log = logging.getLogger("gpusched.reports")

RESULTS = {
    "SUCCEEDED": JobStatus.SUCCEEDED,
    "FAILED": JobStatus.FAILED,
    "TIMED_OUT": JobStatus.TIMED_OUT,
    "CANCELLED": JobStatus.CANCELLED,
    "PREEMPTED": JobStatus.PREEMPTED,
    "LOST": JobStatus.LOST,
}


@dataclass(frozen=True, slots=True)
class Applied:
    accepted: bool
    why: str
    # Set when the report is not believed (counted as a refused message), not merely late.
    refused: RefusalReason | None = None
    # A cycle when GPUs were freed; stop_job for the other nodes of a gang that ended here.
    after: AfterCommit = NOTHING


def _current(
    session: Session, report: Started | Finished
) -> tuple[Job | None, str, RefusalReason | None]:
    """The job whose current attempt the report is about, locked; else why not (and, for
    an attempt its node never held, the refusal)."""
    job, why = _current_attempt(session, report.job_id, report.attempt)
    if job is not None and not placed_on(
        session, job_id=job.id, attempt=job.attempt, node=report.node
    ):
        return (
            None,
            f"job {job.id} attempt {job.attempt} is not placed on {report.node}",
            ("not_placed_here"),
        )
    return job, why, None


def _current_attempt(session: Session, job_id: int, attempt: int) -> tuple[Job | None, str]:
    # populate_existing: the caller may hold this job from an unlocked read (the heartbeat
    # reconciliation does); the locked row, not that copy, decides what the report changes.
    job = session.scalar(
        select(Job)
        .where(Job.id == job_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    if job is None:
        return None, f"job {job_id} does not exist"
    if job.attempt != attempt:
        return None, f"stale report for attempt {attempt}; job {job_id} is on attempt {job.attempt}"
    if job.status not in ACTIVE:
        return None, f"job {job_id} attempt {attempt} is already {job.status}"
    return job, ""


def job_started(*, session: Session, report: Started) -> Applied:
    job, why, refused = _current(session, report)
    if job is None:
        return Applied(False, why, refused)
    if job.status is JobStatus.SCHEDULED:
        transition(
            session,
            job=job,
            to=JobStatus.RUNNING,
            actor=f"agent:{report.node}",
            reason=f"started as pid {report.pid}",
        )
    return Applied(True, "")


def job_finished(*, session: Session, report: Finished) -> Applied:
    """Record how an attempt ended, release its GPUs, and requeue it when that is due."""
    job, why, refused = _current(session, report)
    if job is None:
        return Applied(False, why, refused)
    actor = f"agent:{report.node}"
    result = RESULTS[report.result]
    message = report.message
    if job.status is JobStatus.SCHEDULED and result is not JobStatus.LOST:
        # Keep the history whole: an agent reports a job that ends at once by its end
        # alone (with the pid), and a finish report can overtake a start report.
        pid = report.pid
        started = f"started as pid {pid}" if pid is not None else "start not yet reported"
        transition(session, job=job, to=JobStatus.RUNNING, actor=actor, reason=started)
    if result is JobStatus.SUCCEEDED and job.nodes > 1:
        # A gang succeeds when its last node does, as a Slurm step ends with its last task:
        # the first rank may still be saving a checkpoint. A failure ends it at once.
        node = report.node
        released, left = _release_node(session, job=job, node=node)
        if left:
            if not released:
                return Applied(False, f"job {job.id} attempt {job.attempt}: {node} already ended")
            reason = f"its part on {node} ended ({message or 'exit 0'}); {left} node(s) to go"
            note(session, job=job, actor=actor, reason=reason)
            return Applied(True, "", after=AfterCommit(cycle=True))
    # A gang that ends here by itself (a node failed, timed out, lost its process) may still
    # run on its other nodes, whose ranks would wait on this one: stop them now, not at
    # their next heartbeat. A cancel or a preemption was sent to every node already.
    stops = []
    if job.nodes > 1 and result in (JobStatus.FAILED, JobStatus.TIMED_OUT, JobStatus.LOST):
        placed = stop_orders(session, {job.id: job.attempt}, reason="cancel")
        stops = [stop for stop in placed if stop.node != report.node]
    job.exit_code = report.exit_code
    release(session, job_id=job.id, attempt=job.attempt)
    if result is JobStatus.PREEMPTED and job.preempt_requested_at is None:
        # Nobody asked for this stop (no preemption, no requeue): its agent is shutting
        # down (systemctl stop, Ctrl-C) and requeues what it ran. Say so, not "preempt".
        stopped = "requeued as its node's agent stopped"
        message = f"{stopped} ({message})" if message else stopped
    transition(session, job=job, to=result, actor=actor, reason=message)
    if result is JobStatus.FAILED and will_retry(job):
        transition(
            session,
            job=job,
            to=JobStatus.PENDING,
            actor="scheduler",
            reason=f"retry {job.failures + 1} of {job.retries} after: {message}",
        )
    elif result in (JobStatus.PREEMPTED, JobStatus.LOST):
        settle_interrupted(session, job=job, actor="scheduler")
    return Applied(True, "", after=AfterCommit.of(stops, cycle=True))


def _release_node(session: Session, *, job: Job, node: str) -> tuple[int, int]:
    """Release a gang's GPUs on one node; returns how many were released and on how many
    other nodes it still holds some."""
    node_id = session.scalar(select(Node.id).where(Node.name == node))
    released = (
        0  # an unknown node holds none of it (and node_id=None would release every node)
        if node_id is None
        else release(session, job_id=job.id, attempt=job.attempt, node_id=node_id)
    )
    left = session.scalar(
        select(func.count(distinct(Allocation.node_id))).where(
            Allocation.job_id == job.id,
            Allocation.attempt == job.attempt,
            Allocation.released_at.is_(None),
        )
    )
    return released, left or 0


def mark_lost(*, session: Session, job: Job, reason: str) -> None:
    """The node holding this attempt is gone: release, and requeue while retries remain.
    An attempt that never started there ran nothing: back to the queue without spending a
    retry (as Slurm requeues a job whose node fails at launch), unless it was cancelled."""
    release(session, job_id=job.id, attempt=job.attempt)
    if job.status == JobStatus.SCHEDULED:
        cancelled = job.cancel_requested_at is not None
        transition(
            session,
            job=job,
            to=JobStatus.CANCELLED if cancelled else JobStatus.PENDING,
            actor="scheduler",
            reason=f"{reason} before it started"
            + ("" if cancelled else ": back in the queue, no retry spent"),
        )
        return
    transition(session, job=job, to=JobStatus.LOST, actor="scheduler", reason=reason)
    settle_interrupted(session, job=job, actor="scheduler")
