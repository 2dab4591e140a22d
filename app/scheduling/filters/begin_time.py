"""Job filter: a job scheduled "at" a time waits for its begin time.

Cheapest check of all (no cluster state), so it runs first.
"""

from __future__ import annotations

from app.scheduling.status import OK, Context, Status, unschedulable
from app.scheduling.types import JobView, ReasonKind


def check(job: JobView, ctx: Context) -> Status:
    if job.schedule_mode != "at" or job.begin_at is None or job.begin_at <= ctx.now:
        return OK
    return unschedulable(
        ReasonKind.BEGIN_TIME,
        f"begin time not reached, starts at {job.begin_at.isoformat(timespec='seconds')}",
        job.begin_at,
    )
