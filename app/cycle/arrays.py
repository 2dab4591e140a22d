"""Phase 0 of a cycle, second step: job arrays' throttles (max_running, Slurm's %N).

An array that allows N tasks at once lets only so many of its eligible pending tasks into
the queue as it has free slots (N minus its tasks holding GPUs), lowest index first. The
others keep the reason `array_limit`, which the snapshot leaves out, so no plan can
place more than N: the limit holds without the pure core knowing about arrays.
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.cycle.eligibility import ELIGIBLE
from app.jobs.arrays import admit, throttle_message
from app.jobs.models import Job
from app.jobs.states import ACTIVE, JobStatus
from app.scheduling.types import ReasonKind


def settle_array_limits(session: Session) -> None:
    """Flushes, does not commit."""
    # The throttled arrays first, by index (ix_job_pending_array_limit): the cycle runs
    # this every time, and most of a deep queue is no throttled array's.
    arrays = session.scalars(
        select(Job.array_id)
        .distinct()
        .where(Job.status == JobStatus.PENDING, Job.array_max_running.is_not(None))
    ).all()
    if not arrays:
        return
    waiting = session.scalars(
        select(Job)
        .where(*ELIGIBLE, Job.array_max_running.is_not(None), Job.array_id.in_(arrays))
        .order_by(Job.id)
        .with_for_update()
    ).all()
    if not waiting:
        return
    by_array: dict[int, list[Job]] = defaultdict(list)
    for job in waiting:
        by_array[job.array_id or job.id].append(job)
    active = dict(
        session.execute(
            select(Job.array_id, func.count())
            .where(Job.array_id.in_(by_array), Job.status.in_(ACTIVE))
            .group_by(Job.array_id)
        ).all()
    )
    for array_id, tasks in by_array.items():
        limit = tasks[0].array_max_running
        admitted, throttled = admit(
            max_running=limit, active=active.get(array_id, 0), waiting=[job.id for job in tasks]
        )
        let_in, keep_out = set(admitted), set(throttled)
        message = throttle_message(array_id=array_id, max_running=limit or 0)
        for job in tasks:
            if job.id in let_in and job.pending_reason == ReasonKind.ARRAY_LIMIT.value:
                # A new arrival for this cycle's snapshot, which ranks it.
                job.pending_reason = ReasonKind.NEW.value
                job.pending_message = "its array has a free slot; waiting for the next cycle"
            elif job.id in keep_out and job.pending_reason != ReasonKind.ARRAY_LIMIT.value:
                job.pending_reason, job.pending_message = ReasonKind.ARRAY_LIMIT.value, message
                job.queue_position = job.estimated_start_at = None
    session.flush()
