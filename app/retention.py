"""History past its retention (`GPUSCHED_RETENTION_DAYS`), as slurmdbd's PurgeJobAfter,
PurgeEventAfter and PurgeTXNAfter: jobs that ended before the cutoff (with their events,
allocations, notifications and logs), the audit trail, batch firings and notifications
recorded before it.

Off unless set. Deleting is a side effect of its own, run hourly by the scheduler worker
in small transactions, so a cycle never waits long behind it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, Result, delete, or_, select
from sqlalchemy.orm import Session, aliased, sessionmaker

from app.audit.models import AuditEvent
from app.batches.models import BatchFiring
from app.jobs.models import Job, JobEvent
from app.jobs.states import FINISHED
from app.nodes.models import Allocation
from app.notifications.models import Notification
from app.wire import job_log_dir

_CHUNK = 500  # jobs per transaction


@dataclass(frozen=True, slots=True)
class Purged:
    jobs: int
    audit_events: int
    firings: int


def purge_history(*, factory: sessionmaker[Session], before: datetime, log_dir: Path) -> Purged:
    """Delete the history that ended before `before`. A task of an array goes only with
    its whole array (once every task has ended before `before`): `--array ID` keeps
    meaning all of them."""
    task = aliased(Job)
    array_in_use = select(task.array_id).where(
        task.array_id.is_not(None), or_(task.status.not_in(FINISHED), task.finished_at >= before)
    )
    old = (
        select(Job.id)
        .where(Job.status.in_(FINISHED), Job.finished_at < before)
        .where(or_(Job.array_id.is_(None), Job.array_id.not_in(array_in_use)))
        .order_by(Job.id)
        .limit(_CHUNK)
    )
    jobs = 0
    while True:
        with factory.begin() as session:
            ids = list(session.scalars(old))
            if not ids:
                break
            session.execute(delete(JobEvent).where(JobEvent.job_id.in_(ids)))
            session.execute(delete(Allocation).where(Allocation.job_id.in_(ids)))
            session.execute(delete(Notification).where(Notification.job_id.in_(ids)))
            session.execute(delete(Job).where(Job.id.in_(ids)))
        for job_id in ids:  # after the commit: a log without its job is only disk
            shutil.rmtree(job_log_dir(log_dir, job_id), ignore_errors=True)
        jobs += len(ids)
    with factory.begin() as session:
        audit = _deleted(session.execute(delete(AuditEvent).where(AuditEvent.at < before)))
        firings = _deleted(
            session.execute(delete(BatchFiring).where(BatchFiring.created_at < before))
        )
        # Delivered (or given up) messages of jobs that are kept.
        session.execute(delete(Notification).where(Notification.created_at < before))
    return Purged(jobs=jobs, audit_events=audit, firings=firings)


def _deleted(result: Result[Any]) -> int:
    return cast(CursorResult[Any], result).rowcount  # a DELETE's result is a cursor's
