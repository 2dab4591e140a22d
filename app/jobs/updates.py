"""Changing a job's request after submission (one job or a selection): the same checks as
submission for what changed, the time limit of a placed job, its dependencies, and an
array's running limit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.auth.models import User
from app.auth.service import Principal
from app.db import utcnow
from app.errors import Conflict, FieldError, Forbidden
from app.jobs.control import back_in_line, in_chunks, lock_selected
from app.jobs.dependencies import (
    load_namesakes,
    singleton_wait,
)
from app.jobs.lifecycle import note
from app.jobs.limits import ProjectTimeLimit, RuntimeLimits
from app.jobs.models import Job
from app.jobs.orders import AfterCommit, Changed, time_limit_orders
from app.jobs.queries import JobSelection, outs, visible_job
from app.jobs.schemas import (
    BulkOut,
    JobCreate,
    JobOut,
    JobUpdate,
)
from app.jobs.states import ACTIVE, SINGLETON, JobStatus
from app.jobs.submission import (
    check_can_ever_fit,
    check_priority_grant,
    check_singleton,
    default_notify_url,
    dependencies_left,
    refuse_if_never_in_window,
    with_array_tasks,
)
from app.projects.models import Project
from app.scheduling.types import ReasonKind


def update(
    *,
    session: Session,
    principal: Principal,
    job_id: int,
    changes: JobUpdate,
    limits: RuntimeLimits,
) -> Changed[JobOut]:
    """Change a pending job's request, as `scontrol update`: checked as a submission is
    (ranges, time limits, whether it could ever fit). It keeps its submit time, so its
    age; the next cycle ranks it anew. Cancel and resubmit would lose both. A placed
    job's new time limit goes to its agents after the commit."""
    job = visible_job(session=session, principal=principal, job_id=job_id)
    session.refresh(job, with_for_update=True)  # a cycle placing it now must not race
    if job.status in ACTIVE:
        _change_placed_limit(session, principal=principal, job=job, changes=changes, limits=limits)
        after = AfterCommit.of(time_limit_orders(session, job=job))
    elif job.status is JobStatus.PENDING:
        _update_locked(session, principal=principal, job=job, changes=changes, limits=limits)
        after = AfterCommit(cycle=True)
    else:
        raise Conflict(f"job {job_id} is {job.status}: it can no longer be changed")
    session.commit()
    return Changed(outs(session, [job], viewer=principal)[0], after)


def update_selected(
    *,
    session: Session,
    principal: Principal,
    selection: JobSelection,
    changes: JobUpdate,
    limits: RuntimeLimits,
) -> Changed[BulkOut]:
    """Change every pending job the selection names, in one transaction, as `scontrol
    update` of an array id changes all its pending tasks. All or nothing: a change refused
    for one job changes none, and the error names that job. Returns how many and which."""
    where = (Job.status == JobStatus.PENDING,)
    ids = lock_selected(
        session, principal=principal, selection=selection, verb="change", where=where
    )
    for jobs in in_chunks(session, ids):
        for job in jobs:
            try:
                _update_locked(
                    session, principal=principal, job=job, changes=changes, limits=limits
                )
            except FieldError as exc:
                raise FieldError(
                    exc.field, f"job {job.id}: {exc.message}", location=exc.location
                ) from None
    session.commit()
    return Changed(BulkOut.of(ids), AfterCommit(cycle=bool(ids)))


def _update_locked(
    session: Session, *, principal: Principal, job: Job, changes: JobUpdate, limits: RuntimeLimits
) -> None:
    """Apply `changes` to a pending job whose row the caller holds locked, checked as a
    submission is; notes what changed in its history. Does not commit."""
    sent = changes.model_dump(exclude_unset=True)
    if "notify_on" in sent and "notify_url" not in sent and job.notify_url is None:
        # As at submission: notifications asked for without a URL go to its owner's default.
        owner_default = session.scalar(select(User.notify_url).where(User.id == job.user_id))
        sent["notify_url"] = default_notify_url(owner_default, whose="its owner's")
    current = {name: getattr(job, name) for name in _REQUEST_FIELDS}
    spec = _changed_spec(session, job=job, current=current, sent=sent, limits=limits)
    if spec.priority != job.priority:
        check_priority_grant(
            session,
            principal=principal,
            project_id=job.project_id,
            asked=spec.priority,
            current=job.priority,
        )
    check_can_ever_fit(session=session, spec=spec)
    runtime_changed = (spec.estimated_runtime_s, spec.max_runtime_s) != (
        job.estimated_runtime_s,
        job.max_runtime_s,
    )
    if job.schedule_mode == "offpeak" and runtime_changed:
        # Only a new runtime is judged against the windows: an edit of anything else is
        # taken even while no window holds the job (it keeps waiting with its reason).
        refuse_if_never_in_window(
            session, spec=spec, window=job.window, preemptible=job.preemptible
        )
    rewired = None
    if "depends_on" in sent or "dependency" in sent:  # checked (and may refuse) first
        rewired = _rewire_dependencies(session=session, principal=principal, job=job, spec=spec)
    changed = {f: getattr(spec, f) for f in current if getattr(spec, f) != current[f]}
    for name, value in changed.items():
        setattr(job, name, value)
    what = [f"{f} {current[f]} -> {v}" for f, v in changed.items()] + ([rewired] if rewired else [])
    if what:
        job.updated_at = utcnow()
        back_in_line(job, why="changed")
        reason = f"updated by {principal.name}: {', '.join(what)}"
        note(session, job=job, actor=principal.name, reason=reason)


def _changed_spec(
    session: Session,
    *,
    job: Job,
    current: dict[str, Any],
    sent: dict[str, Any],
    limits: RuntimeLimits,
) -> JobCreate:
    """The job's request with `sent` merged in, checked as a submission is: ranges, then
    the cluster's and its project's limits (a time limit left out gets the default). What
    the change leaves as it was is not judged again by limits lowered since."""
    share = None if job.gpu_share_milli == 1000 else job.gpu_share_milli / 1000
    try:
        spec = JobCreate.model_validate(
            {"command": job.command, "gpu_share": share, "gpu_model": job.gpu_model}
            | {"depends_on": job.depends_on, "dependency": job.dependency_kind}
            | current
            | sent
        )
    except ValidationError as exc:
        # The merged request is what is checked; its error names the field sent.
        error = exc.errors()[0]
        where = tuple(str(part) for part in error["loc"]) or (next(iter(sent)),)
        raise FieldError(where, error["msg"].removeprefix("Value error, ")) from None
    project_name, max_s = session.execute(
        select(Project.name, Project.max_runtime_s).where(Project.id == job.project_id)
    ).one()
    project_limit = None if max_s is None else ProjectTimeLimit(project_name, max_s)
    kept = [name for name, value in current.items() if getattr(spec, name) == value]
    return limits.apply(spec, project=project_limit, kept=kept)


def _change_placed_limit(
    session: Session, *, principal: Principal, job: Job, changes: JobUpdate, limits: RuntimeLimits
) -> None:
    """`scontrol update TimeLimit=` on a placed job: its owner may shorten the limit, only
    an admin extend it (as Slurm). Checked as a submission is, and never below the time
    it has run. Its agents are told after the commit (time_limit_orders)."""
    sent = changes.model_dump(exclude_unset=True)
    if set(sent) != {"max_runtime_s"}:
        raise Conflict(
            f"job {job.id} is {job.status}: only its time limit (max_runtime_s) can be "
            "changed once it is placed"
        )
    current = {name: getattr(job, name) for name in _REQUEST_FIELDS}
    old = job.max_runtime_s
    new = _changed_spec(session, job=job, current=current, sent=sent, limits=limits).max_runtime_s
    extends = old is not None and (new is None or new > old)
    if extends and not principal.is_admin:
        raise Forbidden(
            f"job {job.id} is {job.status}: only an admin extends its time limit "
            "(you may shorten it)"
        )
    ran_s = 0 if job.started_at is None else (utcnow() - job.started_at).total_seconds()
    if new is not None and new <= ran_s:
        raise FieldError(
            "max_runtime_s",
            f"job {job.id} has run for {int(ran_s)}s: a time limit of {new}s would end it "
            "at once (cancel it instead)",
        )
    if new != old:
        job.max_runtime_s = new
        job.updated_at = utcnow()
        reason = f"updated by {principal.name}: max_runtime_s {old} -> {new}"
        note(session, job=job, actor=principal.name, reason=reason)


# What PATCH changes by copying a field onto the column of its name; the dependency
# fields are checked and set by _rewire_dependencies.
_REQUEST_FIELDS = tuple(f for f in JobUpdate.model_fields if f not in ("depends_on", "dependency"))


def _rewire_dependencies(
    *, session: Session, principal: Principal, job: Job, spec: JobCreate
) -> str | None:
    """Make a pending job wait for other jobs, or none, as `scontrol update Dependency=`:
    checked as at submission, and refused where it would close a loop (two jobs waiting
    for each other forever). Sets its wait and returns what changed, or None."""
    if spec.dependency == SINGLETON and job.array_id is not None:
        raise FieldError("dependency", "singleton does not apply to a task of an array")
    check_singleton(spec)
    ids = with_array_tasks(session=session, ids=spec.depends_on)
    before = _dependency_text(job.depends_on, job.dependency_kind)
    after = _dependency_text(ids, spec.dependency)
    if after == before:
        return None
    if job.id in ids:
        raise FieldError("depends_on", f"job {job.id} cannot wait for itself")
    waiting = _waiting_for(session=session, ids=ids, job_id=job.id)
    if waiting is not None:
        raise FieldError(
            "depends_on",
            f"job {waiting} waits for job {job.id}: they would wait for each other forever",
        )
    if spec.dependency == SINGLETON:
        name = spec.name or job.name
        namesakes = load_namesakes(session, users=[job.user_id], names=[name])
        waits_for = singleton_wait(job.id, name, namesakes.get((job.user_id, name), []))
    else:
        waits_for = dependencies_left(
            session=session, principal=principal, ids=ids, kind=spec.dependency
        )
    job.depends_on, job.dependency_kind = ids, spec.dependency
    job.dependencies_met = waits_for is None
    if waits_for is not None:
        job.pending_reason, job.pending_message = ReasonKind.DEPENDENCY.value, waits_for
    return f"dependency {before} -> {after}"


def _dependency_text(ids: Sequence[int], kind: str) -> str:
    """As sbatch writes it: afterok:12:13, singleton, or none."""
    if kind == SINGLETON:
        return SINGLETON
    return ":".join([kind, *map(str, ids)]) if ids else "none"


def _waiting_for(*, session: Session, ids: list[int], job_id: int) -> int | None:
    """The first of `ids` that waits for job `job_id`, directly or through other waiting
    jobs; None if none does. Only pending jobs whose dependencies are not met wait."""
    root = {i: i for i in ids}  # a job reached -> which of `ids` it was reached from
    frontier, seen = list(ids), set(ids)
    while frontier:
        rows = session.execute(
            select(Job.id, Job.depends_on).where(
                Job.id.in_(frontier),
                Job.status == JobStatus.PENDING,
                Job.dependencies_met.is_(False),
            )
        ).all()
        frontier = []
        for waiting, depends_on in rows:
            for other in depends_on:
                if other == job_id:
                    return root[waiting]
                if other not in seen:
                    seen.add(other)
                    root[other] = root[waiting]
                    frontier.append(other)
    return None


def change_array_limit(
    *, session: Session, principal: Principal, job_id: int, max_running: int | None
) -> Changed[JobOut]:
    """Let an array run more (or fewer) tasks at once, whatever state its tasks are in:
    `job_id` is any of them. Tasks held back by the old limit are let back in line, and
    the next cycle admits as many as the new one allows; running tasks are not stopped."""
    job = visible_job(session=session, principal=principal, job_id=job_id)
    if job.array_id is None:
        raise Conflict(f"job {job_id} is not a task of a job array")
    tasks = session.scalars(
        select(Job).where(Job.array_id == job.array_id).order_by(Job.id).with_for_update()
    ).all()
    old = tasks[0].array_max_running
    if old != max_running:
        for task in tasks:
            task.array_max_running = max_running
            if (
                task.status is JobStatus.PENDING
                and task.pending_reason == ReasonKind.ARRAY_LIMIT.value
            ):
                back_in_line(task, why="its array's limit changed")
        limits = " -> ".join("none" if n is None else str(n) for n in (old, max_running))
        note(
            session,
            job=tasks[0],
            actor=principal.name,
            reason=f"array limit changed by {principal.name}: {limits} at once",
        )
    session.commit()
    return Changed(outs(session, [job], viewer=principal)[0], AfterCommit(cycle=True))
