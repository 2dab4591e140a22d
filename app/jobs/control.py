"""Controlling jobs that exist: cancel, requeue, hold and release, one job or a selection,
with the stops they leave to send after the commit."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from sqlalchemy import ColumnElement, inspect, select
from sqlalchemy.orm import Session

from app.auth.models import User
from app.auth.service import Principal
from app.db import utcnow
from app.errors import Conflict, FieldError, Forbidden, NotFound
from app.jobs.lifecycle import cancel_waiting, note, transition
from app.jobs.models import Job
from app.jobs.orders import AfterCommit, Changed, stop_orders
from app.jobs.queries import JobSelection, outs, visible_job
from app.jobs.schemas import (
    BulkOut,
    JobOut,
)
from app.jobs.states import ACTIVE, FINISHED, JobStatus
from app.nodes.models import Allocation, Node
from app.scheduling.types import ReasonKind
from app.wire import StopReason


def cancel(
    *, session: Session, principal: Principal, job_id: int, grace_s: int | None = None
) -> Changed[JobOut]:
    """Idempotent. A pending job ends at once; a scheduled or running one is stopped by its
    agent, which then reports CANCELLED (so its GPUs free up only when the process is gone);
    one already stopping is stopped again (a shorter grace cuts its own short). `grace_s`
    shortens the stop's grace period: noted on the job."""
    job = visible_job(session=session, principal=principal, job_id=job_id)
    # Lock the row: a cycle placing this job at the same moment must not be overwritten.
    session.refresh(job, with_for_update=True)
    if job.status in FINISHED and job.status is not JobStatus.CANCELLED:
        raise Conflict(f"job {job_id} already finished ({job.status}); nothing to cancel")
    cancel_locked(session, job=job, actor=principal.name, grace_s=grace_s)
    after = _stops(session, [job], reason="cancel", grace_s=grace_s)
    session.commit()
    return Changed(outs(session, [job], viewer=principal)[0], after)


def cancel_selected(
    *,
    session: Session,
    principal: Principal,
    selection: JobSelection,
    grace_s: int | None = None,
) -> Changed[BulkOut]:
    """Cancel every job the selection names that has not ended, in one transaction, as
    `scancel -u alice -t PENDING` or `scancel` of an array id. Returns how many and which
    (those placed are stopping), and the stops of those placed."""
    where = (Job.status.not_in(FINISHED),)
    ids = lock_selected(
        session, principal=principal, selection=selection, verb="cancel", where=where
    )
    waited = _cancel_waiting(session, ids, actor=principal.name)
    placed: dict[int, int] = {}
    stopping = 0
    for jobs in in_chunks(session, [i for i in ids if i not in waited]):
        for job in jobs:
            cancel_locked(session, job=job, actor=principal.name, grace_s=grace_s)
            if job.status in ACTIVE:
                placed[job.id] = job.attempt
            stopping += job.status is not JobStatus.CANCELLED
    after = AfterCommit.of(stop_orders(session, placed, reason="cancel", grace_s=grace_s))
    session.commit()
    return Changed(BulkOut.of(ids, stopping=stopping), after)


def _cancel_waiting(session: Session, ids: Sequence[int], *, actor: str) -> set[int]:
    """The waiting jobs among `ids` cancelled by statement (`lifecycle.cancel_waiting`), a
    chunk of ids at a time; the others are left to `cancel_locked`."""
    cancelled: set[int] = set()
    for start in range(0, len(ids), BULK_STATEMENT_IDS):
        chunk = ids[start : start + BULK_STATEMENT_IDS]
        cancelled.update(cancel_waiting(session, chunk, actor=actor, reason=CANCELLED_BY_USER))
    return cancelled


def _stops(
    session: Session, jobs: Sequence[Job], *, reason: StopReason, grace_s: int | None = None
) -> AfterCommit:
    """stop_job to every node of the placed ones among `jobs`, after the commit."""
    placed = {job.id: job.attempt for job in jobs if job.status in ACTIVE}
    return AfterCommit.of(stop_orders(session, placed, reason=reason, grace_s=grace_s))


def lock_selected(
    session: Session,
    *,
    principal: Principal,
    selection: JobSelection,
    verb: str,
    where: Sequence[ColumnElement[bool]],
) -> list[int]:
    """The ids of a bulk action's jobs, their rows locked in id order (as a cycle's apply
    locks them). A selection of every job is refused: a forgotten filter must not act on
    the whole queue."""
    if not selection.narrows():
        raise FieldError(
            "status",
            f"select the jobs to {verb} with status, project, user, label, array or name",
            location="query",
        )
    query = selection.where(select(Job.id), principal).where(*where)
    return list(session.scalars(query.order_by(Job.id).with_for_update(of=Job)))


# How many jobs a bulk action holds as objects at once.
BULK_CHUNK = 500
# How many jobs one statement of a bulk action names: 5,000 left the API process 8 MB
# larger after a bulk cancel of 20,000 than 1,000 did, and was no faster.
BULK_STATEMENT_IDS = 1000
CANCELLED_BY_USER = "cancelled by user"


def in_chunks(session: Session, ids: Sequence[int]) -> Iterator[list[Job]]:
    """The jobs of `ids` (locked by the caller), a chunk at a time: what the caller changes
    in one is written (flushed, in the caller's transaction) before the next is loaded,
    and the session lets go of the objects. Loading 20,000 jobs and their events at once
    left the API process 80 MB larger for good (bench/deep_queue.py)."""
    before = set(session.identity_map.keys())
    for start in range(0, len(ids), BULK_CHUNK):
        jobs = list(
            session.scalars(
                select(Job).where(Job.id.in_(ids[start : start + BULK_CHUNK])).order_by(Job.id)
            )
        )
        yield jobs
        session.flush()
        # The chunk's jobs and what acting on them added (events, notifications).
        for obj in list(session.identity_map.values()):
            if inspect(obj).key not in before:
                session.expunge(obj)


def cancel_locked(
    session: Session, *, job: Job, actor: str, grace_s: int | None = None, why: str | None = None
) -> None:
    """Cancel a job whose row the caller holds locked (a cycle may be placing it); a
    finished one is left alone. A placed one is only asked to stop: the caller sends
    its `stop_orders` after its commit. `why` is noted when it is not the user's cancel."""
    status = JobStatus(job.status)
    if status in (JobStatus.PENDING, JobStatus.PREEMPTED, JobStatus.LOST):
        if status is not JobStatus.PENDING:
            transition(session, job=job, to=JobStatus.PENDING, actor=actor, reason="")
        reason = CANCELLED_BY_USER if why is None else f"cancelled: {why}"
        transition(session, job=job, to=JobStatus.CANCELLED, actor=actor, reason=reason)
    elif status in ACTIVE:
        shorter = {None: "", 0: " (SIGKILL now)"}.get(grace_s, f" (grace at most {grace_s}s)")
        if grace_s is not None:
            earlier = job.cancel_grace_s
            job.cancel_grace_s = grace_s if earlier is None else min(earlier, grace_s)
        if job.cancel_requested_at is None:
            job.cancel_requested_at = utcnow()
            cause = "" if why is None else f" ({why})"
            reason = f"cancel requested{cause}; stopping the process{shorter}"
            note(session, job=job, actor=actor, reason=reason)
        elif shorter:
            note(session, job=job, actor=actor, reason=f"cancel again{shorter}")


def requeue(*, session: Session, principal: Principal, job_id: int, hold: bool) -> Changed[JobOut]:
    """Stop a placed or running job and put it back in the queue, as `scontrol requeue`:
    its agent stops it as a preemption (SIGTERM, its grace period to checkpoint, SIGKILL;
    one not started yet never starts), which costs no retry, and it waits again with its
    age kept. With `hold` it comes back held (`scontrol requeuehold`): change it
    (`gpusched update`), then release it. The caller sends the stop. Idempotent."""
    job = visible_job(session=session, principal=principal, job_id=job_id)
    session.refresh(job, with_for_update=True)  # a finish report now must not race
    if job.status not in ACTIVE:
        raise Conflict(
            f"job {job_id} is {job.status}: only a placed or running job can be requeued"
        )
    if job.cancel_requested_at is not None:
        raise Conflict(f"job {job_id} is being cancelled: it will not come back")
    _ask_requeue(session, job=job, actor=principal.name, hold=hold)
    after = _stops(session, [job], reason="requeue")
    session.commit()
    return Changed(outs(session, [job], viewer=principal)[0], after)


def requeue_node_jobs(
    *, session: Session, principal: Principal, node: str
) -> Changed[list[JobOut]]:
    """Requeue every job placed or running on `node`, for an admin (the router checks)
    moving work off a node to service it, after draining it: each is stopped with its
    grace period and comes back to the queue. Jobs being cancelled are left to end. The
    caller sends the stops."""
    if session.scalar(select(Node.id).where(Node.name == node)) is None:
        raise NotFound(f"no node {node!r}")
    jobs = session.scalars(
        select(Job)
        .where(
            Job.status.in_(ACTIVE),
            Job.cancel_requested_at.is_(None),
            Job.id.in_(
                select(Allocation.job_id)
                .join(Node, Node.id == Allocation.node_id)
                .where(Node.name == node, Allocation.released_at.is_(None))
            ),
        )
        .order_by(Job.id)
        .with_for_update()
    ).all()
    for job in jobs:
        _ask_requeue(session, job=job, actor=principal.name, hold=False, why=f"node {node}")
    after = _stops(session, jobs, reason="requeue")
    session.commit()
    return Changed(outs(session, list(jobs), viewer=principal), after)


def _ask_requeue(
    session: Session, *, job: Job, actor: str, hold: bool, why: str | None = None
) -> None:
    """Mark a placed or running job to be stopped and requeued (once), noting who asked
    and why."""
    now = utcnow()
    if hold and job.held_by is None:
        job.held_by, job.held_at = actor, now
        note(session, job=job, actor=actor, reason=f"held by {actor}")
    if job.preempt_requested_at is None:
        job.preempt_requested_at = now
        cause = f" ({why})" if why else ""
        reason = f"requeue requested by {actor}{cause}; stopping the process"
        note(session, job=job, actor=actor, reason=reason)


def hold(*, session: Session, principal: Principal, job_id: int) -> JobOut:
    """Keep a pending job out of scheduling until it is released, as `scontrol hold`: it
    stays pending, but no cycle ranks or places it, and the time held does not count as
    waiting (else holding a job for a day would put it first as starving). Idempotent."""
    job = visible_job(session=session, principal=principal, job_id=job_id)
    session.refresh(job, with_for_update=True)  # a cycle placing it now must not race
    if job.status is not JobStatus.PENDING:
        raise Conflict(f"job {job_id} is {job.status}: only a pending job can be held")
    _hold_one(session, job=job, actor=principal.name)
    session.commit()
    return outs(session, [job], viewer=principal)[0]


def hold_selected(*, session: Session, principal: Principal, selection: JobSelection) -> BulkOut:
    """Hold every pending job the selection names, in one transaction, as `scontrol hold`
    of an array id. Jobs not pending are not selected. Returns how many and which."""
    where = (Job.status == JobStatus.PENDING,)
    ids = lock_selected(session, principal=principal, selection=selection, verb="hold", where=where)
    for jobs in in_chunks(session, ids):
        for job in jobs:
            _hold_one(session, job=job, actor=principal.name)
    session.commit()
    return BulkOut.of(ids)


def _hold_one(session: Session, *, job: Job, actor: str) -> None:
    if job.held_by is None:
        job.held_by, job.held_at = actor, utcnow()
        note(session, job=job, actor=actor, reason=f"held by {actor}")


def release(*, session: Session, principal: Principal, job_id: int) -> Changed[JobOut]:
    """Let a held job be scheduled again (`scontrol release`). A hold an admin placed is
    released only by an admin, as Slurm's admin hold. Idempotent."""
    job = visible_job(session=session, principal=principal, job_id=job_id)
    session.refresh(job, with_for_update=True)
    if job.held_by is not None:
        if _held_by_admin(session, principal=principal, jobs=[job]):
            raise Forbidden(
                f"job {job_id} was held by admin {job.held_by!r}; only an admin releases it"
            )
        _release_one(session, job=job, actor=principal.name)
    session.commit()
    return Changed(outs(session, [job], viewer=principal)[0], AfterCommit(cycle=True))


def release_selected(
    *, session: Session, principal: Principal, selection: JobSelection
) -> Changed[BulkOut]:
    """Release every held job the selection names, in one transaction (`scontrol release`
    of an array id). If an admin held any of them and the caller is not one, none is
    released: the 403 names them. Returns how many and which were released."""
    where = (Job.status == JobStatus.PENDING, Job.held_by.is_not(None))
    ids = lock_selected(
        session, principal=principal, selection=selection, verb="release", where=where
    )
    if refused := _held_by_admin_ids(session, principal=principal, ids=ids):
        listed = ", ".join(map(str, refused))
        raise Forbidden(
            f"jobs {listed} were held by an admin; only an admin releases them (nothing was "
            "released: leave them out of the selection)"
        )
    for jobs in in_chunks(session, ids):
        for job in jobs:
            _release_one(session, job=job, actor=principal.name)
    session.commit()
    return Changed(BulkOut.of(ids), AfterCommit(cycle=bool(ids)))


def _held_by_admin(session: Session, *, principal: Principal, jobs: list[Job]) -> list[Job]:
    """The jobs among `jobs` that an admin other than the caller holds, which only an
    admin may release (none when the caller is one)."""
    holders = {job.held_by for job in jobs} - {None, principal.name}
    if principal.is_admin or not holders:
        return []
    admins = set(session.scalars(select(User.name).where(User.name.in_(holders), User.is_admin)))
    return [job for job in jobs if job.held_by in admins]


def _held_by_admin_ids(session: Session, *, principal: Principal, ids: list[int]) -> list[int]:
    """`_held_by_admin` for a bulk release's jobs, by their ids (in id order)."""
    if principal.is_admin or not ids:
        return []
    refused: list[int] = []
    for start in range(0, len(ids), BULK_CHUNK):
        refused.extend(
            session.scalars(
                select(Job.id)
                .join(User, User.name == Job.held_by)
                .where(
                    Job.id.in_(ids[start : start + BULK_CHUNK]),
                    User.is_admin,
                    Job.held_by != principal.name,
                )
                .order_by(Job.id)
            )
        )
    return refused


def _release_one(session: Session, *, job: Job, actor: str) -> None:
    """Release a held job whose row the caller holds locked."""
    if job.held_at is not None:
        job.ineligible_s += max(0, int((utcnow() - job.held_at).total_seconds()))
    job.held_by = job.held_at = None
    back_in_line(job, why="released")
    note(session, job=job, actor=actor, reason=f"released by {actor}")


def back_in_line(job: Job, *, why: str) -> None:
    """Ranked anew, as a new arrival (the next quick cycle looks for NEW); a job still
    waiting on its dependencies keeps that reason, which stays true."""
    if job.dependencies_met:
        job.pending_reason = ReasonKind.NEW.value
        job.pending_message = f"{why}; waiting for the next scheduling cycle"
    job.queue_position = job.estimated_start_at = None
