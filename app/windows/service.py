"""Storing off-peak windows and turning them into concrete intervals."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.audit.service import changes, record
from app.batches.models import BatchSchedule
from app.db import utcnow
from app.errors import Conflict, FieldError, NotFound
from app.jobs.lifecycle import note
from app.jobs.limits import readable_span
from app.jobs.models import Job
from app.jobs.states import ARRAY_LIMIT, NEW_IN_QUEUE, JobStatus
from app.scheduling.types import ReasonKind
from app.windows.calendar import UpcomingWindow, WindowSpec, longest_opening_s, upcoming
from app.windows.models import Window
from app.windows.schemas import WindowIn, WindowOut


def _out(row: Window) -> WindowOut:
    return WindowOut.model_validate(
        {
            "id": row.id,
            "name": row.name,
            "timezone": row.timezone,
            "cron": row.cron,
            "duration_s": row.duration_s,
            "daily": row.daily,
            "capacity_outside_fraction": row.capacity_outside_fraction,
            "preempt_on_close": row.preempt_on_close,
        }
    )


def _fill(row: Window, body: WindowIn) -> None:
    row.name = body.name
    row.timezone = body.timezone
    row.cron = body.cron
    row.duration_s = body.duration_s
    row.daily = [r.model_dump() for r in body.daily] if body.daily else None
    row.capacity_outside_fraction = body.capacity_outside_fraction
    row.preempt_on_close = body.preempt_on_close


def list_windows(*, session: Session) -> list[WindowOut]:
    return [_out(w) for w in session.scalars(select(Window).order_by(Window.name))]


def _row(session: Session, name: str) -> Window:
    row = session.scalar(select(Window).where(Window.name == name))
    if row is None:
        raise NotFound(f"no off-peak window named {name!r}")
    return row


def get_window(*, session: Session, name: str) -> WindowOut:
    return _out(_row(session, name))


def _settings(window: WindowIn) -> dict[str, Any]:
    """What the audit trail keeps of a window: its fields, without the row id."""
    return window.model_dump(mode="json", exclude={"id"})


def create_window(*, session: Session, actor: str, body: WindowIn) -> WindowOut:
    row = Window()
    _fill(row, body)
    session.add(row)
    info = _settings(body)
    record(session=session, actor=actor, action="window.create", target=body.name, info=info)
    try:
        session.flush()
        settle_never_in_window(
            session=session, specs=window_specs(session=session), now=utcnow(), actor=actor
        )
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"a window named {body.name!r} already exists") from None
    return _out(row)


def replace_window(*, session: Session, actor: str, name: str, body: WindowIn) -> WindowOut:
    row = _row(session, name)
    if body.name != name:
        _refuse_if_in_use(session, name, "renamed")
    if changed := changes(_settings(_out(row)), _settings(body)):
        record(session=session, actor=actor, action="window.replace", target=name, info=changed)
    _fill(row, body)
    try:
        session.flush()
        settle_never_in_window(
            session=session, specs=window_specs(session=session), now=utcnow(), actor=actor
        )
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"a window named {body.name!r} already exists") from None
    return _out(row)


def delete_window(*, session: Session, actor: str, name: str) -> None:
    row = _row(session, name)
    only = session.scalar(select(func.count()).select_from(Window)) == 1
    _refuse_if_in_use(session, name, "deleted", only=only)
    info = _settings(_out(row))
    record(session=session, actor=actor, action="window.delete", target=name, info=info)
    session.delete(row)
    session.flush()
    settle_never_in_window(
        session=session, specs=window_specs(session=session), now=utcnow(), actor=actor
    )
    session.commit()


def _refuse_if_in_use(session: Session, name: str, action: str, *, only: bool = False) -> None:
    """Pending jobs and batches bound to a window would wait forever without it ("no
    opening scheduled"), as Slurm refuses to delete a reservation that jobs use. The
    `only` window is also used by every off-peak job and batch that names no window."""
    job_uses = Job.window == name
    batch_uses = BatchSchedule.window == name
    if only:
        job_uses = or_(job_uses, and_(Job.window.is_(None), Job.schedule_mode == "offpeak"))
        batch_uses = or_(
            batch_uses, and_(BatchSchedule.window.is_(None), BatchSchedule.target == "offpeak")
        )
    job_rows = session.execute(
        select(Job.id, Job.window)
        .where(job_uses, Job.status == JobStatus.PENDING)
        .order_by(Job.id)
        .limit(11)
    ).all()
    batch_rows = session.execute(
        select(BatchSchedule.name, BatchSchedule.window)
        .where(batch_uses)
        .order_by(BatchSchedule.name)
    ).all()
    jobs = [row[0] for row in job_rows]
    batches = [row[0] for row in batch_rows]
    if not jobs and not batches:
        return
    users, hints = [], []
    if jobs:
        ids = ", ".join(str(i) for i in jobs[:10]) + (", ..." if len(jobs) > 10 else "")
        users.append(f"pending job{'s' if len(jobs) > 1 else ''} {ids}")
        hints.append("let the jobs start or cancel them")
    if batches:
        users.append(f"batch{'es' if len(batches) > 1 else ''} {', '.join(batches)}")
        hints.append("delete the batches or give them another window")
    verb = "uses" if len(jobs) + len(batches) == 1 else "use"
    unnamed = any(row[1] is None for row in (*job_rows, *batch_rows))
    only_note = (
        " (the only window, so off-peak work that names none waits for it)" if unnamed else ""
    )
    raise Conflict(
        f"window {name!r} cannot be {action}: {' and '.join(users)} {verb} it{only_note};"
        f" first {', and '.join(hints)}"
    )


def window_specs(*, session: Session) -> list[WindowSpec]:
    return [_out(w).to_spec() for w in session.scalars(select(Window).order_by(Window.name))]


def upcoming_windows(*, session: Session, now: datetime, days: float) -> list[UpcomingWindow]:
    return upcoming(window_specs(session=session), now=now, days=days)


def require_window(*, session: Session, name: str | None, field: str | tuple[str, ...]) -> None:
    """For off-peak work: refuse a window nobody defined (or, with no `name`, a cluster
    without any window). A job waiting for it would wait forever ("no opening scheduled").
    The message lists the windows that exist."""
    if name is None:
        if session.scalar(select(Window.id).limit(1)) is None:
            raise FieldError(
                field,
                "no off-peak window is defined, so off-peak work would never start: an admin "
                "creates one first (gpusched window create), or run it now",
            )
        return
    if session.scalar(select(Window.id).where(Window.name == name)):
        return
    defined = session.scalars(select(Window.name).order_by(Window.name)).all()
    raise FieldError(
        field, f"no off-peak window named {name!r}; defined: {', '.join(defined) or 'none'}"
    )


def require_long_enough_opening(
    *,
    session: Session,
    name: str | None,
    runtime_s: int | None,
    preemptible: bool,
    field: str,
    now: datetime,
) -> None:
    """A non-preemptible off-peak job starts only if it ends before its window closes
    (calendar.fits_in_window, with its estimate, else its time limit): one longer than every
    opening of the windows it may use would wait for ever, so it is refused, naming the
    longest. Call after require_window (the window exists)."""
    if preemptible or runtime_s is None:
        return
    specs = [spec for spec in window_specs(session=session) if name in (None, spec.name)]
    longest, window = max(((longest_opening_s(s, now=now), s.name) for s in specs), default=(0, ""))
    if runtime_s <= longest:
        return
    raise FieldError(
        field,
        f"{readable_span(runtime_s)} is longer than the longest opening of off-peak window "
        f"{window!r}, {readable_span(int(longest))}: a job that is not preemptible must end "
        "before its window closes, so it would never start; shorten it, make it preemptible "
        "(stopped at the close, resumed at the next opening), or run it now",
    )


NEVER_IN_WINDOW = ReasonKind.NEVER_IN_WINDOW.value


def settle_never_in_window(
    *, session: Session, specs: list[WindowSpec], now: datetime, actor: str = "scheduler"
) -> None:
    """After a window change, an off-peak job that is not preemptible and lasts (estimate,
    else time limit) longer than every opening of its window(s) can never start, as at
    submission (require_long_enough_opening). It is not cancelled: it keeps waiting, as
    Slurm leaves such a job pending with a reason, with the typed reason NEVER_IN_WINDOW
    naming the longest opening and its runtime, and an event in its history; no cycle
    considers it (app/cycle/eligibility.py) until a window or the job changes (a change
    puts it back in line; a wider window here). Run by the window service on every change
    and by each scheduling cycle (a job released from a hold, or whose dependencies ended,
    is judged again). Executes, does not commit."""
    runtime = func.coalesce(Job.estimated_runtime_s, Job.max_runtime_s)
    judged = (
        Job.status == JobStatus.PENDING,
        Job.schedule_mode == "offpeak",
        Job.preemptible.is_(False),
        Job.held_by.is_(None),
        Job.dependencies_met.is_(True),
        Job.pending_reason.is_distinct_from(ARRAY_LIMIT),
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
                pending_reason=NEW_IN_QUEUE,
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
            job.pending_message = message[:512]
            job.queue_position = None
            job.estimated_start_at = None
            note(session, job=job, actor=actor, reason=message[:512])


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
        " its window closes; shorten it or make it preemptible (gpusched update), or cancel"
        " it"
    )
