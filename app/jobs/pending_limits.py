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
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, case, func, null, select, true
from sqlalchemy.orm import Session

from app.auth.models import User
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

    def pending(
        self, session: Session, *, user_id: int, project_id: int, project: bool
    ) -> tuple[int, int | None]:
        """The user's pending jobs now, and the project's if `project`."""
        key = (user_id, project_id)
        with self._lock:
            kept = self._kept.get(key)
        if (
            kept is None
            or time.monotonic() - kept.at >= self.ttl_s
            or (project and kept.project is None)
        ):
            counted = _count(session, user_id=user_id, project_id=project_id, project=project)
            with self._lock:
                # Only the pairs that submitted within `ttl_s` are kept.
                self._kept = {k: c for k, c in self._kept.items() if counted.at - c.at < self.ttl_s}
                self._kept[key] = counted
            return counted.user, counted.project
        # Only the primary key bounds this read: jobs submitted since, not the whole queue.
        pending = and_(Job.status == JobStatus.PENDING, Job.id > kept.up_to_id)
        user, project = session.execute(
            select(
                func.sum(case((and_(pending, Job.user_id == user_id), 1), else_=0)),
                func.sum(case((and_(pending, Job.project_id == project_id), 1), else_=0)),
            ).where(Job.id > kept.up_to_id)
        ).one()
        in_project = None if kept.project is None else kept.project + (project or 0)
        return kept.user + (user or 0), in_project


def _count(session: Session, *, user_id: int, project_id: int, project: bool) -> _Counted:
    """In one statement, so that the counts and the highest id are of one moment; the
    project's only if `project` (a project's queue may be long, and most have no limit)."""

    def pending(whose: ColumnElement[bool]) -> ColumnElement[int]:
        return (
            select(func.count())
            .select_from(Job)
            .where(Job.status == JobStatus.PENDING, whose)
            .scalar_subquery()
        )

    user, in_project, up_to_id = session.execute(
        select(
            pending(Job.user_id == user_id),
            pending(Job.project_id == project_id) if project else null(),
            select(func.max(Job.id)).scalar_subquery(),
        )
    ).one()
    return _Counted(time.monotonic(), user, in_project, up_to_id or 0)


def check_pending_limits(
    *,
    session: Session,
    user_id: int,
    project_id: int,
    adding: int,
    user_default: int,
    counts: PendingCounts | None = None,
) -> None:
    """A 429 unless `adding` more pending jobs keep the user and the project within
    their limits (the user's own, else `user_default`; the project's, if it has one).
    `counts`: the API process's kept counts (see PendingCounts); else counted whole."""
    user, user_limit, project, project_limit = session.execute(
        select(User.name, User.max_pending_jobs, Project.name, Project.max_pending_jobs)
        .join_from(User, Project, true())  # one row of each, in one round trip
        .where(User.id == user_id, Project.id == project_id)
    ).one()
    limited = project_limit is not None
    if counts is None:
        counted = _count(session, user_id=user_id, project_id=project_id, project=limited)
        user_pending, project_pending = counted.user, counted.project
    else:
        user_pending, project_pending = counts.pending(
            session, user_id=user_id, project_id=project_id, project=limited
        )
    checks = (
        (f"user {user}", user_default if user_limit is None else user_limit, user_pending,
         f"gpusched admin limits {user} --max-pending N"),
        (f"project {project}", project_limit, project_pending,
         f"gpusched quota {project} --max-pending N"),
    )  # fmt: skip
    for what, limit, pending, who_raises in checks:
        if limit is None or pending is None:
            continue  # the project has no limit of its own
        if pending + adding > limit:
            jobs = "job" if adding == 1 else f"{adding} jobs"
            raise TooMany(
                f"{what} may have at most {limit:,} jobs pending and has {pending:,}: this "
                f"submission of {jobs} would pass that; wait for some to start, cancel "
                f"some, or ask an admin to raise it ({who_raises})"
            )
