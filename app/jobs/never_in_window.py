"""Off-peak jobs that no opening of their window is long enough for, once the windows
changed: marked with the typed reason NEVER_IN_WINDOW, and put back in line when a
window is long enough again (issue 36)."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from app.jobs.lifecycle import note
from app.jobs.models import PENDING_MESSAGE_CHARS, Job
from app.jobs.states import JobStatus
from app.scheduling.types import ReasonKind
from app.text import readable_span
from app.windows.calendar import WindowSpec, longest_opening_s

NEVER_IN_WINDOW = ReasonKind.NEVER_IN_WINDOW.value


def settle_never_in_window(
    *, session: Session, specs: list[WindowSpec], now: datetime, actor: str = "scheduler"
) -> None:
    """After a window change, an off-peak job that is not preemptible and lasts (estimate,
    else time limit) longer than every opening of its window(s) can never start, as at
    submission (app/windows/service.py require_long_enough_opening). It is not cancelled: it keeps waiting, as
    Slurm leaves such a job pending with a reason, with the typed reason NEVER_IN_WINDOW
    naming the longest opening and its runtime, and an event in its history; no cycle
    considers it (app/cycle/eligibility.py) until a window or the job changes (a change
    puts it back in line; a wider window here). Run after every window change (the
    windows API) and by each scheduling cycle (a job released from a hold, or whose dependencies ended,
    is judged again). Executes, does not commit."""
    runtime = func.coalesce(Job.estimated_runtime_s, Job.max_runtime_s)
    judged = (
        Job.status == JobStatus.PENDING,
        Job.schedule_mode == "offpeak",
        Job.preemptible.is_(False),
        Job.held_by.is_(None),
        Job.dependencies_met.is_(True),
        Job.pending_reason.is_distinct_from(ReasonKind.ARRAY_LIMIT.value),
    )
    windows = session.scalars(select(Job.window).distinct().where(*judged)).all()
    if not windows:
        return
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    longest = {spec.name: (_longest_opening_s(spec, day), spec.name) for spec in specs}
    for window in windows:
        if window is None and longest:
            longest_s, name = max(longest.values())
        elif window in longest:
            longest_s, name = longest[window]
        else:  # no window to judge by (deleting one in use is refused)
            continue
        same = Job.window.is_(None) if window is None else Job.window == window
        session.execute(
            update(Job)
            .where(
                *judged,
                same,
                Job.pending_reason == NEVER_IN_WINDOW,
                or_(runtime.is_(None), runtime <= longest_s),
            )
            .values(
                pending_reason=ReasonKind.NEW.value,
                pending_message=(
                    "an opening of its off-peak window is long enough again; waiting for the "
                    "next scheduling cycle"
                ),
                queue_position=None,
                estimated_start_at=None,
            )
            .execution_options(synchronize_session=False)
        )
        impossible = select(Job).where(
            *judged, same, runtime > longest_s, Job.pending_reason.is_distinct_from(NEVER_IN_WINDOW)
        )
        for job in session.scalars(impossible).all():
            message = _never_in_window_message(job, window=window, name=name, longest_s=longest_s)
            job.pending_reason = NEVER_IN_WINDOW
            job.pending_message = message[:PENDING_MESSAGE_CHARS]
            job.queue_position = None
            job.estimated_start_at = None
            note(session, job=job, actor=actor, reason=message[:PENDING_MESSAGE_CHARS])


@lru_cache(maxsize=128)
def _longest_opening_s(spec: WindowSpec, day: datetime) -> float:
    """longest_opening_s from the start of `day` (UTC): a daily window's year of openings
    takes about 17 ms to walk, too long for every cycle; the answer moves once a day."""
    return longest_opening_s(spec, now=day)


def _never_in_window_message(job: Job, *, window: str | None, name: str, longest_s: float) -> str:
    if job.estimated_runtime_s:
        what, runtime_s = "runtime estimate", job.estimated_runtime_s
    else:
        what, runtime_s = "time limit", job.max_runtime_s or 0
    which = f"off-peak window {name!r}" if window is not None else "any off-peak window"
    longest = f"the longest, {name!r}'s," if window is None else "its longest"
    return (
        f"never starts: no opening of {which} is long enough since the windows changed:"
        f" {longest} is {readable_span(int(longest_s))}, the job's {what}"
        f" {readable_span(runtime_s)}, and a job that is not preemptible must end before"
        " its window closes; shorten it (gpusched update --estimated-runtime or"
        " --max-runtime), or cancel it and submit it preemptible"
    )
