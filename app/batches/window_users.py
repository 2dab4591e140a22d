"""Who uses an off-peak window: its pending jobs and its batches. A window in use is not
renamed or deleted (app/windows/service.py asks this, through the API, as windows sit
below the jobs and batches that name them)."""

from __future__ import annotations

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from app.batches.models import BatchSchedule
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.windows.service import WindowUsers


def window_users(session: Session, name: str, only: bool) -> WindowUsers:
    """The pending jobs (the first 11 by id) and the batches that name window `name`; with
    `only` (it is the only window), also those off-peak that name none."""
    job_uses = Job.window == name
    batch_uses = BatchSchedule.window == name
    if only:
        job_uses = or_(job_uses, and_(Job.window.is_(None), Job.schedule_mode == "offpeak"))
        batch_uses = or_(
            batch_uses, and_(BatchSchedule.window.is_(None), BatchSchedule.target == "offpeak")
        )
    jobs = session.execute(
        select(Job.id, Job.window)
        .where(job_uses, Job.status == JobStatus.PENDING)
        .order_by(Job.id)
        .limit(11)
    ).all()
    batches = session.execute(
        select(BatchSchedule.name, BatchSchedule.window)
        .where(batch_uses)
        .order_by(BatchSchedule.name)
    ).all()
    return WindowUsers(
        jobs=[(job_id, window) for job_id, window in jobs],
        batches=[(batch, window) for batch, window in batches],
    )
