"""Reading jobs as a caller may see them: one job, its script, history and notifications,
the filtered list and the pending queue in order; and the one conversion of a job row to
what the API returns (`outs`, `to_out`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Select, and_, or_, select
from sqlalchemy.orm import Session

from app.auth.models import User
from app.auth.service import Principal
from app.errors import Forbidden, NotFound
from app.jobs import ranking
from app.jobs.estimates import TIMED_REASONS, estimate_note
from app.jobs.models import Job, JobEvent
from app.jobs.schemas import (
    AllocationOut,
    ArrayOut,
    JobEventOut,
    JobOut,
    JobPage,
    PendingPage,
    ScheduleSpec,
)
from app.jobs.states import ACTIVE, JobStatus
from app.nodes.models import Allocation, Gpu, Node
from app.notifications.deliveries import NotificationOut, deliveries
from app.paging import Page, count
from app.projects.models import Project
from app.scheduling.types import ReasonKind

MAX_PAGE = 500
_Select = TypeVar("_Select", bound=Select[*tuple[Any, ...]])


def get(*, session: Session, principal: Principal, job_id: int) -> JobOut:
    job = visible_job(session=session, principal=principal, job_id=job_id)
    return outs(session, [job], viewer=principal)[0]


def visible_job(*, session: Session, principal: Principal, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    if not principal.can_see_project(job.project_id):
        raise Forbidden(f"job {job_id} belongs to a project you are not a member of")
    return job


def script(*, session: Session, principal: Principal, job_id: int) -> str:
    """The script a job runs: its text at submission (Slurm's `scontrol write batch_script`)."""
    job = visible_job(session=session, principal=principal, job_id=job_id)
    if job.script is None:
        raise NotFound(
            f"job {job_id} has no script copy: it runs its command as it is when it starts"
        )
    return job.script


def events(
    *, session: Session, principal: Principal, job_id: int, page: Page = Page()
) -> tuple[list[JobEventOut], int]:
    """A page of the job's events, oldest first, and how many it has."""
    job = visible_job(session=session, principal=principal, job_id=job_id)
    query = select(JobEvent).where(JobEvent.job_id == job.id)
    rows = session.scalars(page.of(query.order_by(JobEvent.id)))
    return [
        JobEventOut(
            id=e.id,
            at=e.at,
            from_status=e.from_status,
            to_status=e.to_status,
            attempt=e.attempt,
            actor=e.actor,
            reason=e.reason,
        )
        for e in rows
    ], count(session, query)


def notifications(
    *, session: Session, principal: Principal, job_id: int, page: Page = Page()
) -> tuple[list[NotificationOut], int]:
    job = visible_job(session=session, principal=principal, job_id=job_id)
    return deliveries(session=session, job_id=job.id, page=page)


@dataclass(frozen=True, slots=True)
class JobSelection:
    """Which jobs a listing or a bulk cancel means (as squeue's and scancel's filters):
    every filter given must hold. Only jobs of the caller's projects are ever selected."""

    statuses: tuple[JobStatus, ...] = ()
    project: str | None = None
    user: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    array: int | None = None
    name: str | None = None

    def narrows(self) -> bool:
        given = (self.project, self.user, self.array, self.name)
        return bool(self.statuses or self.labels) or any(v is not None for v in given)

    def where(self, query: _Select, principal: Principal) -> _Select:
        if not principal.is_admin:
            query = query.where(Job.project_id.in_(principal.project_ids or {-1}))
        if self.statuses:
            query = query.where(Job.status.in_(self.statuses))
        if self.project is not None:
            query = query.where(
                Job.project_id.in_(select(Project.id).where(Project.name == self.project))
            )
        if self.user is not None:
            query = query.where(Job.user_id.in_(select(User.id).where(User.name == self.user)))
        for key, value in self.labels:
            query = query.where(Job.labels[key].as_string() == value)
        if self.array is not None:
            query = query.where(Job.array_id == self.array)
        if self.name is not None:
            query = query.where(Job.name == self.name)
        return query


def list_jobs(
    *,
    session: Session,
    principal: Principal,
    selection: JobSelection = JobSelection(),
    cursor: int | None = None,
    limit: int = 50,
) -> JobPage:
    """Newest first. The cursor is the last id seen: new jobs get higher ids, so paging
    backwards never skips or repeats a job however many are submitted meanwhile."""
    query = selection.where(select(Job).order_by(Job.id.desc()).limit(limit + 1), principal)
    if cursor is not None:
        query = query.where(Job.id < cursor)
    jobs = list(session.scalars(query))
    more = len(jobs) > limit
    jobs = jobs[:limit]
    return JobPage(
        items=outs(session, jobs, viewer=principal), next_cursor=str(jobs[-1].id) if more else None
    )


# Waiting jobs that cannot run yet whatever the GPUs do: held, waiting for their
# dependencies, their array's limit, their begin time or their off-peak window (the gate's
# reason carries no position; the core's "does not fit before the close" has one).
_LATER_REASONS = (
    ReasonKind.DEPENDENCY.value,
    ReasonKind.ARRAY_LIMIT.value,
    ReasonKind.BEGIN_TIME.value,
    ReasonKind.NEVER_IN_WINDOW.value,
)


NOT_YET_ELIGIBLE = or_(
    Job.held_by.is_not(None),
    Job.dependencies_met.is_(False),
    Job.pending_reason.in_(_LATER_REASONS),
    and_(Job.pending_reason == "window_closed", Job.queue_position.is_(None)),
)


# Its complement, without NOT over nullable columns (NOT NULL is not true).
ELIGIBLE_NOW = and_(
    Job.held_by.is_(None),
    Job.dependencies_met.is_(True),
    or_(Job.pending_reason.is_(None), Job.pending_reason.not_in(_LATER_REASONS)),
    or_(Job.pending_reason.is_distinct_from("window_closed"), Job.queue_position.is_not(None)),
)


def pending_in_order(
    *,
    session: Session,
    principal: Principal,
    filters: JobSelection = JobSelection(),
    offset: int = 0,
    limit: int = 50,
    eligible: bool | None = None,
) -> PendingPage:
    """Waiting jobs in the order the last full cycle would serve them (its stored
    ranking), then those no full cycle ranked yet (by id), held jobs last. `filters'`
    statuses are not used: these are the pending jobs. `eligible`: only those that may run
    now (True) or only those that cannot yet (False: held, dependencies, begin time,
    window, array limit), as Slurm lists them apart.

    Not sorted by the database: the order is the ranking's, one row (keeping a sort key
    per job in step with it cost a full cycle thousands of writes whenever fair share
    shifted the order, bench/deep_queue.py). A page among the ranked jobs is found by
    walking the ranking from its head and keeping the jobs the selection holds; past
    them, the selected jobs' ids are read and sorted."""
    selection = replace(filters, statuses=(JobStatus.PENDING,)).where(select(Job.id), principal)
    if eligible is not None:
        selection = selection.where(ELIGIBLE_NOW if eligible else NOT_YET_ELIGIBLE)
    stored = ranking.last(session)
    head = None
    if stored is not None and offset + limit <= _WALK_MOST:
        head = _ranked_head(session, selection, stored, offset + limit)
    if head is None:
        head = _sorted_ids(session, selection, stored)
    page = head[offset : offset + limit]
    found = {j.id: j for j in session.scalars(select(Job).where(Job.id.in_(page)))} if page else {}
    jobs = [found[i] for i in page if i in found]  # one that left meanwhile is not shown
    return PendingPage(total=count(session, selection), items=outs(session, jobs, viewer=principal))


# Ids per read when walking the ranking: the first read is about a page's worth. Pages
# deeper than _WALK_MOST are found by sorting: the walk's reads would cost more.
_FIRST_READ, _MOST_READ, _WALK_MOST = 128, 500, 2000


def _ranked_head(
    session: Session,
    selection: Select[*tuple[Any, ...]],
    stored: ranking.StoredRanking,
    wanted: int,
) -> list[int] | None:
    """The first `wanted` jobs of `selection` in the ranking's order, read by id in
    growing batches from the ranking's head; None when the ranked jobs run out first (the
    page reaches the jobs not ranked yet) or when too few of them are selected for the
    walk to be the cheaper way (a narrow filter)."""
    in_line = selection.where(Job.held_by.is_(None), Job.queue_position.is_not(None))
    ids, gone = stored.ids, frozenset(stored.gone)
    found: list[int] = []
    start, batch = 0, _FIRST_READ
    while len(found) < wanted:
        if start >= len(ids) or start > 4 * wanted + 2 * _MOST_READ:
            return None
        part = [ids[i] for i in range(start, min(start + batch, len(ids))) if i not in gone]
        still = set(session.scalars(in_line.where(Job.id.in_(part)))) if part else set()
        found.extend(i for i in part if i in still)
        start, batch = start + batch, min(2 * batch, _MOST_READ)
    return found


def _sorted_ids(
    session: Session, selection: Select[*tuple[Any, ...]], stored: ranking.StoredRanking | None
) -> list[int]:
    """Every job of `selection` in order: ranked ones by the ranking, then the others by
    id (a job whose key was cleared since, by a begin time or a closed window, among
    them), held ones last."""
    rows = session.execute(
        selection.with_only_columns(Job.id, Job.held_by.is_not(None), Job.queue_position.is_(None))
    ).all()
    index = {} if stored is None else stored.index
    unranked = len(index)
    ordered = sorted(
        rows, key=lambda row: (row[1], unranked if row[2] else index.get(row[0], unranked), row[0])
    )
    return [row[0] for row in ordered]


def outs(session: Session, jobs: Sequence[Job], *, viewer: Principal) -> list[JobOut]:
    """The jobs as `viewer` may read them (see to_out)."""
    if not jobs:
        return []
    user_names = dict(
        session.execute(
            select(User.id, User.name).where(User.id.in_({j.user_id for j in jobs}))
        ).all()
    )
    project_names = dict(
        session.execute(
            select(Project.id, Project.name).where(Project.id.in_({j.project_id for j in jobs}))
        ).all()
    )
    active_ids = [j.id for j in jobs if j.status in ACTIVE]
    allocations: dict[int, list[AllocationOut]] = {}
    last: dict[int, list[AllocationOut]] = {}
    if active_ids:
        for job_id, _, allocation in _allocation_rows(
            session, active_ids, Allocation.released_at.is_(None)
        ):
            allocations.setdefault(job_id, []).append(allocation)
    # Where the others ran last: their current attempt's allocations, released.
    attempts = {j.id: j.attempt for j in jobs if j.status not in ACTIVE and j.attempt}
    if attempts:
        for job_id, attempt, allocation in _allocation_rows(
            session, list(attempts), Allocation.released_at.is_not(None)
        ):
            if attempt == attempts[job_id]:
                last.setdefault(job_id, []).append(allocation)
    # Their places in the queue: from the last full cycle's ranking (app/jobs/ranking.py).
    in_line = [
        j.id
        for j in jobs
        if j.status == JobStatus.PENDING and j.held_by is None and j.queue_position is not None
    ]
    stored = ranking.last(session) if in_line else None
    places = {} if stored is None else stored.positions(in_line)
    return [
        to_out(
            j,
            user=user_names[j.user_id],
            position=places.get(j.id),
            project=project_names[j.project_id],
            allocations=allocations.get(j.id, []),
            last_allocations=last.get(j.id, []),
            env_readable=viewer.is_admin or j.user_id == viewer.user_id,
        )
        for j in jobs
    ]


def _allocation_rows(
    session: Session, job_ids: list[int], released: ColumnElement[bool]
) -> Iterator[tuple[int, int, AllocationOut]]:
    rows = session.execute(
        select(
            Allocation.job_id,
            Allocation.attempt,
            Node.name,
            Gpu.index,
            Allocation.share_milli,
            Allocation.rank,
        )
        .join(Node, Node.id == Allocation.node_id)
        .outerjoin(Gpu, Gpu.id == Allocation.gpu_id)
        .where(Allocation.job_id.in_(job_ids), released)
        .order_by(Allocation.rank, Gpu.index)
    )
    for job_id, attempt, node, index, share, rank in rows:
        yield (
            job_id,
            attempt,
            AllocationOut(node=node, gpu_index=index, share=share / 1000, rank=rank),
        )


def to_out(
    job: Job,
    *,
    user: str,
    project: str,
    allocations: list[AllocationOut],
    last_allocations: list[AllocationOut] | None = None,
    env_readable: bool = True,
    position: int | None = None,
) -> JobOut:
    """`env_readable`: the viewer may read the job's environment's values (its owner, an
    admin); `--export ALL` copies the submitter's, cloud keys and all, so the other members
    of its project see the variables' names only. `position`: its place in the queue, as
    the last full cycle's ranking gives it (see `outs`)."""
    # Only a waiting job has a reason to wait: a job cancelled while pending (or in the
    # moment a cycle still ranked it) must not say "waiting for 4 GPUs". A held job's
    # stored reason is the last cycle's (or one a cycle wrote as it was held): not shown.
    waiting = job.status == JobStatus.PENDING
    held = waiting and job.held_by is not None
    reason, message, start, note = None, None, None, None
    if not waiting or held or job.queue_position is None:
        position = None  # only a job in line has a place; no key: no full cycle ranked it
    if held:
        reason = ReasonKind.HELD.value
        message = f"held by {job.held_by}: gpusched release {job.id} lets it be scheduled"
        note = "no estimate: held jobs are not in line"
    elif waiting:
        reason, message = job.pending_reason, job.pending_message
        start = job.estimated_start_at
        note = estimate_note(reason=reason, message=message, position=position, start=start)
    return JobOut(
        id=job.id,
        name=job.name,
        user=user,
        project=project,
        status=job.status,
        command=job.command,
        script_bytes=None if job.script is None else len(job.script.encode()),
        workdir=job.workdir,
        env=job.env if env_readable else dict.fromkeys(job.env),
        gpus=job.gpus,
        gpu_memory_mb=job.gpu_memory_mb,
        gpu_share=None if job.gpu_share_milli == 1000 else job.gpu_share_milli / 1000,
        gpu_model=job.gpu_model,
        nodes=job.nodes,
        priority=job.priority,
        max_runtime_s=job.max_runtime_s,
        estimated_runtime_s=job.estimated_runtime_s,
        grace_s=job.grace_s,
        retries=job.retries,
        failures=job.failures,
        preemptible=job.preemptible,
        schedule=ScheduleSpec.model_construct(
            mode=job.schedule_mode,  # type: ignore[arg-type]  # validated at submission
            at=job.begin_at,
            window=job.window,
        ),
        labels=job.labels,
        attempt=job.attempt,
        pending_reason=None if reason is None else ReasonKind(reason),
        pending_message=message,
        pending_until=start if reason in TIMED_REASONS else None,
        queue_position=position,
        estimated_start_at=start,
        estimate_note=note,
        # A running job has a holder only when requeued with hold: it comes back held.
        held_by=job.held_by if held or job.status in ACTIVE else None,
        only_nodes=job.only_nodes,
        exclude_nodes=job.exclude_nodes or [],
        notify_url=job.notify_url,
        notify_on=job.notify_on or [],
        depends_on=job.depends_on,
        dependency=job.dependency_kind,
        array=None
        if job.array_id is None
        else ArrayOut(
            id=job.array_id,
            index=job.array_index or 0,
            tasks=job.array_size or 1,
            max_running=job.array_max_running,
        ),
        exit_code=job.exit_code,
        cancel_requested=job.cancel_requested_at is not None,
        requeue_requested=job.preempt_requested_at is not None,
        allocations=allocations,
        last_allocations=last_allocations or [],
        created_at=job.created_at,
        scheduled_at=job.scheduled_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )
