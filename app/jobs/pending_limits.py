"""How many jobs a user, and a project, may have pending: Slurm's MaxSubmitJobs (per user)
and GrpSubmitJobs (per account). Over the limit a submission is refused whole (429), with
the limit and the count; an array counts as its tasks.

Checked when jobs are made, not atomically with other submissions: two at once may pass
the limit by the size of one of them, as they would in Slurm between two RPCs.

Counting a user's pending jobs goes row by row, and a user with thousands queued made
each of their submissions count them all: with 3,000 pending, about a fifth of a
submission's time (issue 35). An API process keeps each count (`PendingCounts`) with the
highest job id it had seen, and in between counts only the pending jobs submitted since,
by any process, read by primary key. It counts whole again every `ttl_s`: a job put back
in line since (requeued, preempted) has an older id, and is counted then, as is one whose
submission was still being committed at the count (a lower id than one committed first),
within the allowance above for submissions at the same moment.

Most submissions read nothing at all. The check runs after the submission's jobs are
flushed, so their first id is known: every job counted since the kept count has an id
between the two, so the kept count plus that many is a bound, and while the bound leaves
room no read is needed. Only near a limit is the exact count read. The limits themselves
come with the caller's principal, cached as its memberships are (`token_cache_s`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, case, func, null, select
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.errors import TooMany
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.projects.models import Project


@dataclass(frozen=True, slots=True)
class _Counted:
    at: float  # time.monotonic()
    user: int
    project: int | None  # None: not counted (the project had no limit)
    up_to_id: int  # the highest job id when counted


class PendingCounts:
    """Per API process: each (user, project)'s pending jobs as last counted whole, for
    `ttl_s` seconds; a submission meanwhile adds the pending jobs with a higher id."""

    def __init__(self, ttl_s: float = 2.0) -> None:
        self.ttl_s = ttl_s
        self._kept: dict[tuple[int, int], _Counted] = {}
        self._lock = threading.Lock()

    def _fresh(self, key: tuple[int, int], project: bool) -> _Counted | None:
        with self._lock:
            kept = self._kept.get(key)
        if kept is None or time.monotonic() - kept.at >= self.ttl_s:
            return None
        if project and kept.project is None:
            return None
        return kept

    def at_most(
        self, *, user_id: int, project_id: int, project: bool, below_id: int
    ) -> tuple[int, int | None] | None:
        """Without a read, a bound on the user's (and, if `project`, the project's) pending
        jobs with an id below `below_id`: the kept count plus every id since, whoever's it
        is. None when no count is kept."""
        kept = self._fresh((user_id, project_id), project)
        if kept is None:
            return None
        since = max(0, below_id - 1 - kept.up_to_id)
        return kept.user + since, None if kept.project is None else kept.project + since

    def pending(
        self, session: Session, *, user_id: int, project_id: int, project: bool, below_id: int
    ) -> tuple[int, int | None]:
        """The user's pending jobs with an id below `below_id` (the submission's own are
        not counted), and the project's if `project`."""
        key = (user_id, project_id)
        kept = self._fresh(key, project)
        if kept is None:
            counted = _count(
                session, user_id=user_id, project_id=project_id, project=project, below_id=below_id
            )
            with self._lock:
                # Only the pairs that submitted within `ttl_s` are kept.
                self._kept = {k: c for k, c in self._kept.items() if counted.at - c.at < self.ttl_s}
                self._kept[key] = counted
            return counted.user, counted.project
        # Only the primary key bounds this read: jobs submitted since, not the whole queue.
        since = and_(Job.id > kept.up_to_id, Job.id < below_id)
        pending = and_(Job.status == JobStatus.PENDING, since)
        user, in_project = session.execute(
            select(
                func.sum(case((and_(pending, Job.user_id == user_id), 1), else_=0)),
                func.sum(case((and_(pending, Job.project_id == project_id), 1), else_=0)),
            ).where(since)
        ).one()
        total = None if kept.project is None else kept.project + (in_project or 0)
        return kept.user + (user or 0), total


def _count(
    session: Session, *, user_id: int, project_id: int, project: bool, below_id: int
) -> _Counted:
    """In one statement, so that the counts and the highest id are of one moment; the
    project's only if `project` (a project's queue may be long, and most have no limit).
    Only ids below `below_id`: the jobs being submitted are already in the session."""

    def pending(whose: ColumnElement[bool]) -> ColumnElement[int]:
        return (
            select(func.count())
            .select_from(Job)
            .where(Job.status == JobStatus.PENDING, Job.id < below_id, whose)
            .scalar_subquery()
        )

    user, in_project, up_to_id = session.execute(
        select(
            pending(Job.user_id == user_id),
            pending(Job.project_id == project_id) if project else null(),
            select(func.max(Job.id)).where(Job.id < below_id).scalar_subquery(),
        )
    ).one()
    return _Counted(time.monotonic(), user, in_project, up_to_id or 0)


def check_pending_limits(
    *,
    session: Session,
    principal: Principal,
    project_id: int,
    project_name: str,
    first_id: int,
    adding: int,
    user_default: int,
    counts: PendingCounts | None = None,
) -> None:
    """A 429 unless the `adding` pending jobs just flushed, from id `first_id` on, keep the
    user and the project within their limits (the user's own, else `user_default`; the
    project's, if it has one). The limits come with the principal (for a project the
    caller is not a member of, an admin's, from a read). `counts`: the API process's kept
    counts (see PendingCounts), which usually answer with no read at all: while even
    every job submitted since the last count would leave room, nothing is counted;
    without `counts`, counted whole."""
    user_limit = user_default if principal.max_pending_jobs is None else principal.max_pending_jobs
    if project_id in principal.project_ids:
        project_limit = principal.project_max_pending.get(project_id)
    else:
        project_limit = session.scalar(
            select(Project.max_pending_jobs).where(Project.id == project_id)
        )
    limited = project_limit is not None
    checks = (
        (f"user {principal.name}", user_limit,
         f"gpusched admin limits {principal.name} --max-pending N"),
        (f"project {project_name}", project_limit,
         f"gpusched quota {project_name} --max-pending N"),
    )  # fmt: skip

    def refusal(counted: tuple[int, int | None]) -> str | None:
        for (what, limit, who_raises), pending in zip(checks, counted, strict=True):
            if limit is None or pending is None:
                continue  # the project has no limit of its own
            if pending + adding > limit:
                jobs = "job" if adding == 1 else f"{adding} jobs"
                return (
                    f"{what} may have at most {limit:,} jobs pending and has {pending:,}: this "
                    f"submission of {jobs} would pass that; wait for some to start, cancel "
                    f"some, or ask an admin to raise it ({who_raises})"
                )
        return None

    user_id = principal.user_id
    if counts is not None:
        bound = counts.at_most(
            user_id=user_id, project_id=project_id, project=limited, below_id=first_id
        )
        if bound is not None and refusal(bound) is None:
            return
        counted = counts.pending(
            session, user_id=user_id, project_id=project_id, project=limited, below_id=first_id
        )
    else:
        whole = _count(
            session, user_id=user_id, project_id=project_id, project=limited, below_id=first_id
        )
        counted = whole.user, whole.project
    if (refused := refusal(counted)) is not None:
        raise TooMany(refused)
