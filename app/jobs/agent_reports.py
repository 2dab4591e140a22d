"""How agents' reports change jobs. Every report names (job_id, attempt); a report for
any attempt other than the job's current one is ignored (fencing), so a slow or restarted
agent can never overwrite a newer attempt."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from app.db import utcnow
from app.jobs.allocations import release, release_attempts
from app.jobs.lifecycle import note, settle_interrupted, transition, will_retry
from app.jobs.models import Job
from app.jobs.orders import NOTHING, AfterCommit, placed_on, stop_orders
from app.jobs.states import ACTIVE, JobStatus
from app.nodes.models import Allocation, Node
from app.wire import Finished, RefusalReason, Started, StopJob

log = logging.getLogger("gpusched.reports")

# An agent's watchdog SIGKILLs what is left of an attempt at the end of its grace period
# and gives it this long to die (workers/agent/runner.py _KILL_WAIT_S).
WATCHDOG_KILL_S = 5.0
# For a node whose agent did not say (an agent from before it did).
DEFAULT_GRACE_S = 30.0
DEFAULT_INTERVAL_S = 5.0
# The result an agent reports for a run it refused because the owner's Unix account
# cannot be used on its node: no attempt ran; the job waits for another node.
REFUSED = "REFUSED"

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


@dataclass(frozen=True, slots=True)
class LockedJobs:
    """The jobs a run of reports names, locked by one statement, and each (job, attempt,
    node) whose node holds or held GPUs of that attempt: what `_current` reads, once for
    the run instead of once for each report. `to_release`: the attempts (job id ->
    attempt) that ended, whose GPUs the caller frees together (`release_ended`)."""

    jobs: Mapping[int, Job]
    placed: frozenset[tuple[int, int, str]]
    to_release: dict[int, int] = field(default_factory=dict)

    def holds(self, report: Started | Finished) -> bool:
        """Whether the reporting node holds (or held) GPUs of the report's attempt."""
        return (report.job_id, report.attempt, report.node) in self.placed

    def release_ended(self, session: Session) -> None:
        """Free the GPUs of the attempts that ended so far, together."""
        release_attempts(session, self.to_release)
        self.to_release.clear()


def lock_reported(*, session: Session, job_ids: Iterable[int]) -> LockedJobs:
    """Lock the jobs that a run of reports names, in id order (two transactions that lock
    some of the same jobs then never wait for each other crosswise). populate_existing:
    the locked rows, not a copy read earlier in the session, decide."""
    ids = sorted(set(job_ids))
    jobs = session.scalars(
        select(Job)
        .where(Job.id.in_(ids))
        .order_by(Job.id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    placed = session.execute(
        select(Allocation.job_id, Allocation.attempt, Node.name)
        .join(Node, Node.id == Allocation.node_id)
        .where(Allocation.job_id.in_(ids))
    )
    return LockedJobs(
        jobs={job.id: job for job in jobs},
        placed=frozenset((job_id, attempt, node) for job_id, attempt, node in placed),
    )


def _current(
    session: Session, report: Started | Finished, locked: LockedJobs | None
) -> tuple[Job | None, str, RefusalReason | None]:
    """The job whose current attempt the report is about, locked; else why not (and, for
    an attempt its node never held, the refusal). From `locked` when given."""
    if locked is not None:
        job = locked.jobs.get(report.job_id)
        if job is None:
            return None, f"job {report.job_id} does not exist", None
        return _current_attempt(job, report, placed=locked.holds(report))
    placed_here = (
        select(Allocation.id)
        .join(Node, Node.id == Allocation.node_id)
        .where(
            Allocation.job_id == report.job_id,
            Allocation.attempt == report.attempt,
            Node.name == report.node,
        )
        .exists()
    )
    # One statement: the job locked, and whether the reporting node holds (or held) GPUs of
    # this attempt. populate_existing: the caller may hold this job from an unlocked read
    # (the heartbeat reconciliation does); the locked row, not that copy, decides.
    row = session.execute(
        select(Job, placed_here)
        .where(Job.id == report.job_id)
        .with_for_update(of=Job)
        .execution_options(populate_existing=True)
    ).first()
    if row is None:
        return None, f"job {report.job_id} does not exist", None
    job, placed = row
    return _current_attempt(job, report, placed=placed)


def _current_attempt(
    job: Job, report: Started | Finished, *, placed: bool
) -> tuple[Job | None, str, RefusalReason | None]:
    if job.attempt != report.attempt:
        stale = f"stale report for attempt {report.attempt}; job {job.id} is on attempt"
        return None, f"{stale} {job.attempt}", None
    if job.status not in ACTIVE:
        return None, f"job {job.id} attempt {job.attempt} is already {job.status}", None
    if not placed:
        return (
            None,
            f"job {job.id} attempt {job.attempt} is not placed on {report.node}",
            ("not_placed_here"),
        )
    return job, "", None


def job_started(*, session: Session, report: Started, locked: LockedJobs | None = None) -> Applied:
    job, why, refused = _current(session, report, locked)
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


def job_finished(
    *, session: Session, report: Finished, locked: LockedJobs | None = None
) -> Applied:
    """Record how an attempt ended, release its GPUs, and requeue it when that is due.
    `locked`: the jobs of a run of reports, locked and read by `lock_reported`."""
    job, why, refused = _current(session, report, locked)
    if job is None:
        return _late_success(session, report, locked) or Applied(False, why, refused)
    if report.result == REFUSED:
        return _refused(session, job=job, report=report)
    actor = f"agent:{report.node}"
    result = RESULTS[report.result]
    message = report.message
    _add_usage(job, report)
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
    if locked is not None:
        # Nothing else in the run reads this attempt's allocations once it has ended.
        locked.to_release[job.id] = job.attempt
    else:
        # The job's changes go in one UPDATE with its end: releasing (Core statements on
        # the allocations and GPUs) needs none of them flushed first.
        with session.no_autoflush:
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


def _late_success(session: Session, report: Finished, locked: LockedJobs | None) -> Applied | None:
    """The success of an attempt that was declared lost while its node was only late (a
    heartbeat dropped, a report queue behind), reported by the node that held it before
    the requeue ran it again: the job is done, not run twice. Only a success, and only on
    one node: a failure or a gang's part leaves the requeue as it was."""
    if RESULTS.get(report.result) is not JobStatus.SUCCEEDED:
        return None
    if locked is not None:
        job = locked.jobs.get(report.job_id)
        placed = locked.holds(report)
    else:
        job = session.scalar(
            select(Job)
            .where(Job.id == report.job_id)
            .with_for_update()
            .execution_options(populate_existing=True)
        )
        placed = job is not None and placed_on(
            session, job_id=job.id, attempt=job.attempt, node=report.node
        )
    if (
        job is None
        or job.status is not JobStatus.LOST
        or job.attempt != report.attempt
        or job.nodes > 1
        or not placed
    ):
        return None
    _add_usage(job, report)
    job.exit_code = report.exit_code
    job.lost_until = None
    transition(
        session,
        job=job,
        to=JobStatus.SUCCEEDED,
        actor=f"agent:{report.node}",
        reason=f"its node reported the attempt's success after it was declared lost "
        f"({report.message or 'exit 0'})",
    )
    return Applied(True, "", after=AfterCommit(cycle=True))


def _add_usage(job: Job, report: Finished) -> None:
    """The attempt's CPU time (summed over its nodes) and peak memory (its biggest node's),
    as the node's fence measured them."""
    if report.cpu_s is not None:
        job.cpu_s = (job.cpu_s or 0.0) + report.cpu_s
    if report.memory_peak_mb is not None:
        job.memory_peak_mb = max(job.memory_peak_mb or 0, report.memory_peak_mb)


def _refused(session: Session, *, job: Job, report: Finished) -> Applied:
    """A node refused to run the attempt: its owner's Unix account cannot be used there.
    Nothing ran, so no retry is spent; the node is marked as lacking the account at once
    (its heartbeats keep saying so until it has it), so the next cycle places the job on
    another node, or says why it waits."""
    node = session.scalar(select(Node).where(Node.name == report.node).with_for_update())
    if node is not None and report.account:
        node.unusable_accounts = {
            **(node.unusable_accounts or {}),
            report.account: report.account_reason or "unusable",
        }
    stops: list[StopJob] = []
    if job.nodes > 1:
        placed = stop_orders(session, {job.id: job.attempt}, reason="cancel")
        stops = [stop for stop in placed if stop.node != report.node]
    release(session, job_id=job.id, attempt=job.attempt)
    actor = f"agent:{report.node}"
    message = report.message or f"refused by node {report.node}"
    if job.cancel_requested_at is not None:
        transition(session, job=job, to=JobStatus.CANCELLED, actor=actor, reason=message)
    elif job.status is JobStatus.RUNNING:  # a gang that started on its other nodes
        transition(session, job=job, to=JobStatus.PREEMPTED, actor=actor, reason=message)
        settle_interrupted(session, job=job, actor="scheduler")
    else:
        transition(session, job=job, to=JobStatus.PENDING, actor=actor, reason=message)
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


def dead_by(job: Job, node: Node, *, since: datetime | None = None) -> datetime:
    """When an attempt on a node whose agent died (at the latest one heartbeat period
    after `since`, its last heartbeat by default) has surely ended: its watchdog gives it
    its grace period, then SIGKILL."""
    grace = job.grace_s if job.grace_s is not None else node.grace_s
    seconds = (
        (node.interval_s or DEFAULT_INTERVAL_S)
        + (DEFAULT_GRACE_S if grace is None else grace)
        + WATCHDOG_KILL_S
    )
    start = since or node.last_heartbeat_at or utcnow()
    return start + timedelta(seconds=seconds)


def mark_lost(
    *, session: Session, job: Job, reason: str, ended_by: datetime, now: datetime
) -> None:
    """The node holding this attempt is gone: release its GPUs and put the job back in the
    queue without spending a retry (the node's failure, not the job's: Slurm requeues a
    batch job on node failure), unless it was cancelled. Its processes may still be
    ending there (its watchdog gives them their grace period) until `ended_by`: it stays
    LOST until then (app/cycle/reconcile.py requeues it), so that two attempts of a job
    never run at once."""
    release(session, job_id=job.id, attempt=job.attempt)
    started = job.status is JobStatus.RUNNING
    # The scheduler knows only that no start was reported: the agent may have started it
    # just before it died (it then ran as an orphan, ended by the watchdog).
    where = reason if started else f"{reason} before its start was reported"
    if job.cancel_requested_at is not None and not started:
        transition(session, job=job, to=JobStatus.CANCELLED, actor="scheduler", reason=where)
        return
    if ended_by <= now:
        if started:
            transition(session, job=job, to=JobStatus.LOST, actor="scheduler", reason=reason)
            settle_interrupted(session, job=job, actor="scheduler")
        else:
            transition(
                session,
                job=job,
                to=JobStatus.PENDING,
                actor="scheduler",
                reason=f"{where}: back in the queue, no retry spent",
            )
        return
    job.lost_until = ended_by
    transition(
        session,
        job=job,
        to=JobStatus.LOST,
        actor="scheduler",
        reason=f"{where}: back in the queue at {ended_by:%H:%M:%S} UTC, no retry spent, once its "
        "node's watchdog has surely ended it (its grace period)",
    )


def requeue_lost(session: Session, *, job: Job) -> None:
    """A LOST attempt whose processes are surely gone: back to the queue (or CANCELLED)."""
    job.lost_until = None
    settle_interrupted(session, job=job, actor="scheduler")
