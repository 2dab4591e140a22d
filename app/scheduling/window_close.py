"""When an off-peak window closes, its preemptible off-peak jobs make way for peak work.

Pure: running jobs and window intervals in, victims out. A job is stopped only if the
window it may run in (the one it names, else any) is closed now and that window asks
for it (`preempt_on_close`); non-preemptible off-peak jobs run on to completion. A job
with a grace period of its own is stopped that much before the close, so that it writes
its checkpoint inside the window and its GPUs are free for peak work at the close.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from app.scheduling.types import Preemption, RunningJobView, WindowInterval

WINDOW_CLOSED_REASON = "off-peak window closed"


def window_close_preemptions(
    running: Iterable[RunningJobView],
    windows: Iterable[WindowInterval],
    *,
    now: datetime,
    preempt_on_close: frozenset[str],
) -> tuple[Preemption, ...]:
    intervals = tuple(windows)
    victims = []
    for run in running:
        job = run.job
        allowed = _windows_stopping(run, intervals)
        if not allowed:
            continue
        # The job must be gone by the close: it is stopped once its grace would reach it.
        gone_by = now + timedelta(seconds=job.grace_s)
        if any(w.opens_at <= now and gone_by < w.closes_at for w in allowed):
            continue
        # Only windows that were open during this run and want their jobs stopped count.
        closed = [
            w
            for w in allowed
            if w.name in preempt_on_close and run.started_at < w.closes_at <= gone_by
        ]
        if closed:
            closes_at = min(w.closes_at for w in closed)
            reason = WINDOW_CLOSED_REASON
            if closes_at > now:
                left = int((closes_at - now).total_seconds())
                reason = (
                    f"off-peak window closes in {left}s: stopped now so that its "
                    f"{job.grace_s}s grace period ends by then"
                )
            victims.append(Preemption(victim_job_id=job.id, for_job_id=0, reason=reason))
    return tuple(victims)


def next_window_stop(
    running: Iterable[RunningJobView],
    windows: Iterable[WindowInterval],
    *,
    now: datetime,
    preempt_on_close: frozenset[str],
) -> datetime | None:
    """When `window_close_preemptions` will next stop a job if nothing else changes: the
    latest close among the windows open now that the job may run in, less its grace. The
    live scheduler cycles then instead of at its next beat, so the grace ends by the close."""
    intervals = tuple(windows)
    soonest: datetime | None = None
    for run in running:
        open_now = [w for w in _windows_stopping(run, intervals) if w.opens_at <= now < w.closes_at]
        if not any(w.name in preempt_on_close for w in open_now):
            continue
        at = max(w.closes_at for w in open_now) - timedelta(seconds=run.job.grace_s)
        if at > now and (soonest is None or at < soonest):
            soonest = at
    return soonest


def _windows_stopping(
    run: RunningJobView, intervals: tuple[WindowInterval, ...]
) -> list[WindowInterval]:
    """The windows a running job may run in, if their close may stop it: none unless it
    is a preemptible off-peak job (a job that is not preemptible runs on to completion)."""
    job = run.job
    if job.schedule_mode != "offpeak" or not job.preemptible:
        return []
    return [w for w in intervals if job.window is None or w.name == job.window]
