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


def check_pending_limits(
    *, session: Session, user_id: int, project_id: int, adding: int, user_default: int
) -> None:
    """A 429 unless `adding` more pending jobs keep the user and the project within
    their limits (the user's own, else `user_default`; the project's, if it has one)."""
    user, user_limit = session.execute(
        select(User.name, User.max_pending_jobs).where(User.id == user_id)
    ).one()
    project, project_limit = session.execute(
        select(Project.name, Project.max_pending_jobs).where(Project.id == project_id)
    ).one()
    checks = (
        (f"user {user}", user_default if user_limit is None else user_limit,
         Job.user_id == user_id, f"gpusched admin limits {user} --max-pending N"),
        (f"project {project}", project_limit,
         Job.project_id == project_id, f"gpusched quota {project} --max-pending N"),
    )  # fmt: skip
    for what, limit, whose, who_raises in checks:
        if limit is None:
            continue  # the project has no limit of its own
        pending = _pending(session, whose)
        if pending + adding > limit:
            jobs = "job" if adding == 1 else f"{adding} jobs"
            raise TooMany(
                f"{what} may have at most {limit:,} jobs pending and has {pending:,}: this "
                f"submission of {jobs} would pass that; wait for some to start, cancel "
                f"some, or ask an admin to raise it ({who_raises})"
            )
