"""How many jobs a user, and a project, may have pending: Slurm's MaxSubmitJobs (per user)
and GrpSubmitJobs (per account). Over the limit a submission is refused whole (429), with
the limit and the count; an array counts as its tasks.

Checked when jobs are made, not atomically with other submissions: two at once may pass
the limit by the size of one of them, as they would in Slurm between two RPCs.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from app.auth.models import User
from app.errors import TooMany
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.projects.models import Project


def _pending(session: Session, *where: ColumnElement[bool]) -> int:
    query = select(func.count()).select_from(Job).where(Job.status == JobStatus.PENDING, *where)
    return session.scalar(query) or 0


def _over(what: str, *, limit: int, pending: int, adding: int, who_raises: str) -> TooMany:
    jobs = "job" if adding == 1 else f"{adding} jobs"
    return TooMany(
        f"{what} may have at most {limit:,} jobs pending and has {pending:,}: this "
        f"submission of {jobs} would pass that; wait for some to start, cancel some, or "
        f"ask an admin to raise it ({who_raises})"
    )


def check_pending_limits(
    *, session: Session, user_id: int, project_id: int, adding: int, user_default: int
) -> None:
    """A 429 unless `adding` more pending jobs keep the user and the project within
    their limits (the user's own, else `user_default`; the project's, if it has one)."""
    name, own_limit = session.execute(
        select(User.name, User.max_pending_jobs).where(User.id == user_id)
    ).one()
    limit = own_limit if own_limit is not None else user_default
    pending = _pending(session, Job.user_id == user_id)
    if pending + adding > limit:
        raise _over(
            f"user {name}",
            limit=limit,
            pending=pending,
            adding=adding,
            who_raises=f"gpusched admin limits {name} --max-pending N",
        )
    project, project_limit = session.execute(
        select(Project.name, Project.max_pending_jobs).where(Project.id == project_id)
    ).one()
    if project_limit is None:
        return
    pending = _pending(session, Job.project_id == project_id)
    if pending + adding > project_limit:
        raise _over(
            f"project {project}",
            limit=project_limit,
            pending=pending,
            adding=adding,
            who_raises=f"gpusched quota {project} --max-pending N",
        )
