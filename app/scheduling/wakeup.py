"""When a plan would change by the clock alone: the live scheduler's next wake-up.

A job waiting for its begin time, or for an off-peak window to open, says in its pending
reason when that time comes (`estimated_start`). Nothing else happens then: no job
finishes, nobody submits. Without a cycle at that instant the job would wait for the
next beat, up to `GPUSCHED_SCHEDULER_INTERVAL_S` more; Slurm's begin-time jobs wait for
its next scheduling pass in the same way (0.8 s tuned, 56 s default on our machine).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from app.scheduling.types import PendingReason, ReasonKind

# Reasons that end at a known time with nothing but the clock moving.
CLOCK_GATED = frozenset({ReasonKind.BEGIN_TIME, ReasonKind.WINDOW_CLOSED})


def next_wakeup(pending: Iterable[PendingReason], *, now: datetime) -> datetime | None:
    """The earliest time after `now` at which a waiting job's clock-gated reason ends."""
    soonest: datetime | None = None
    for reason in pending:
        at = reason.estimated_start
        if (
            at is not None
            and reason.kind in CLOCK_GATED
            and at > now
            and (soonest is None or at < soonest)
        ):
            soonest = at
    return soonest
