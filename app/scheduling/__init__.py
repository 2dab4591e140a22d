"""Pure scheduling core: frozen snapshot in, Plan out.

No database, no Celery, no NVML, no clock: the caller passes `now`. The live
scheduler cycle, the trace simulator and the tests all call `plan_cycle`, so
any decision can be replayed from a stored snapshot.
"""

from __future__ import annotations

from datetime import datetime

from app.scheduling import planner
from app.scheduling.backfill import reservation, reserve
from app.scheduling.queue import KeptOrder, las_level, order_jobs
from app.scheduling.state import Request
from app.scheduling.status import Code, Context, Status
from app.scheduling.types import (
    QUEUE_POLICIES,
    GpuView,
    JobView,
    NodeGpus,
    NodeView,
    PendingReason,
    Placement,
    Plan,
    PolicySettings,
    Preemption,
    ProjectView,
    QueuePolicy,
    ReasonKind,
    RunningJobView,
    ScheduleMode,
    Snapshot,
    UserView,
    WindowInterval,
)
from app.scheduling.usage import decay_usage, predict_runtime


def plan_cycle(
    snapshot: Snapshot,
    *,
    now: datetime,
    settings: PolicySettings | None = None,
    seed: int = 0,
    memo: KeptOrder | None = None,
) -> Plan:
    """Decide placements, preemptions and pending reasons for one cycle.

    Deterministic: the same arguments always give the same Plan. `seed` only
    breaks exact ties between equally scored nodes (0 = snapshot order). `memo`, a
    `KeptOrder` the caller keeps from cycle to cycle, only makes the queue's order
    cheaper to work out: the plan is the same with or without it.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware (UTC)")
    ctx = Context(now=now, settings=settings or PolicySettings(), windows=snapshot.windows)
    return planner.plan(snapshot, ctx, seed, memo)


def estimate_start(
    snapshot: Snapshot,
    job: JobView,
    *,
    now: datetime,
    settings: PolicySettings | None = None,
) -> datetime | None:
    """Earliest time `job` could start if nothing else were placed (backfill's view).

    Uses running jobs' expected ends (start + estimate, else limit; unknown =
    never ends). Used by the backfill property test and by "when will it run?" UIs.
    """
    ctx = Context(now=now, settings=settings or PolicySettings(), windows=snapshot.windows)
    cs = planner.build(snapshot, ctx, 0)
    reserve(cs, job, Request.of(job))
    return cs.res_time if cs.res_job is not None else None


__all__ = [
    "QUEUE_POLICIES",
    "Code",
    "GpuView",
    "JobView",
    "KeptOrder",
    "NodeGpus",
    "NodeView",
    "PendingReason",
    "Placement",
    "Plan",
    "PolicySettings",
    "Preemption",
    "ProjectView",
    "QueuePolicy",
    "ReasonKind",
    "RunningJobView",
    "ScheduleMode",
    "Snapshot",
    "Status",
    "UserView",
    "WindowInterval",
    "decay_usage",
    "estimate_start",
    "las_level",
    "order_jobs",
    "plan_cycle",
    "predict_runtime",
    "reservation",
]
