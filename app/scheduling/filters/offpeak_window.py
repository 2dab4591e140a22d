"""Job filter: an off-peak job runs only inside an open off-peak window.

It starts only if its runtime (estimate, else limit) ends before the window
closes, or if it is preemptible (it can be stopped when peak hours return) and the
window stays open longer than its grace period (it is stopped that long before the
close: started later, it would be stopped at once, again and again).
A runtime that is not known at all is given the benefit of the doubt: the
window's close is enforced by the caller's `max_runtime_s`, if any.
Costs one pass over the (few) window intervals, no cluster state.
"""

from __future__ import annotations

from app.scheduling.status import OK, Context, Status, unschedulable
from app.scheduling.types import JobView, ReasonKind


def check(job: JobView, ctx: Context) -> Status:
    if job.schedule_mode != "offpeak":
        return OK
    now = ctx.now
    windows = [w for w in ctx.windows if job.window is None or w.name == job.window]
    runtime = job.estimated_runtime_s if job.estimated_runtime_s is not None else job.max_runtime_s
    upcoming = sorted(w.opens_at for w in windows if w.opens_at > now)
    # Messages name no time: the next opening is the reason's time (the job's
    # pending_until), which each client formats in its own style.
    nxt = "; waits for the next opening" if upcoming else "; no later opening scheduled"
    for w in windows:
        if w.opens_at <= now < w.closes_at:
            left = (w.closes_at - now).total_seconds()
            if job.preemptible:
                if left > job.grace_s:
                    return OK
                return unschedulable(
                    ReasonKind.WINDOW_CLOSED,
                    f"the off-peak window closes within the job's {job.grace_s}s grace period{nxt}",
                    upcoming[0] if upcoming else None,
                )
            if runtime is None or left >= runtime:
                return OK
            return unschedulable(
                ReasonKind.WINDOW_CLOSED,
                f"runtime {runtime}s does not fit before the off-peak window closes{nxt}",
                upcoming[0] if upcoming else None,
            )
    if upcoming:
        return unschedulable(
            ReasonKind.WINDOW_CLOSED,
            "off-peak window closed",
            upcoming[0],
        )
    return unschedulable(ReasonKind.WINDOW_CLOSED, "off-peak window closed, no opening scheduled")
