"""Job filter: a job scheduled "at" a time waits for its begin time.

Cheapest check of all (no cluster state), so it runs first.
"""

from __future__ import annotations

from app.scheduling.status import OK, Context, Status, unschedulable
from app.scheduling.types import JobView, ReasonKind


def check(job: JobView, ctx: Context) -> Status:
    if job.schedule_mode != "at" or job.begin_at is None or job.begin_at <= ctx.now:
        return OK
    # The time is data (the job's pending_until), formatted by each client in its style.
    return unschedulable(ReasonKind.BEGIN_TIME, "begin time not reached", job.begin_at)
