"""Storing off-peak windows and turning them into concrete intervals."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Row, Table, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.audit.service import changes, record
from app.errors import Conflict, FieldError, NotFound
from app.text import readable_span
from app.windows.calendar import UpcomingWindow, WindowSpec, longest_opening_s, upcoming
from app.windows.models import Window
from app.windows.schemas import WindowIn, WindowOut


def _out(row: Window | Row[Any]) -> WindowOut:
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
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"a window named {body.name!r} already exists") from None
    return _out(row)


def replace_window(
    *, session: Session, actor: str, name: str, body: WindowIn, users_of: UsersOf
) -> WindowOut:
    row = _row(session, name)
    if body.name != name:
        _refuse_if_in_use(session, users_of, name, "renamed")
    if changed := changes(_settings(_out(row)), _settings(body)):
        record(session=session, actor=actor, action="window.replace", target=name, info=changed)
    _fill(row, body)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"a window named {body.name!r} already exists") from None
    return _out(row)


def delete_window(*, session: Session, actor: str, name: str, users_of: UsersOf) -> None:
    row = _row(session, name)
    only = session.scalar(select(func.count()).select_from(Window)) == 1
    _refuse_if_in_use(session, users_of, name, "deleted", only=only)
    info = _settings(_out(row))
    record(session=session, actor=actor, action="window.delete", target=name, info=info)
    session.delete(row)
    session.commit()


@dataclass(frozen=True)
class WindowUsers:
    """What uses a window: pending jobs (their ids, at most 11) and batches (their names),
    each with the window it names (None: none, so it uses the only window)."""

    jobs: Sequence[tuple[int, str | None]] = ()
    batches: Sequence[tuple[str, str | None]] = ()


# Who uses window `name` (with `only`, also the off-peak work that names no window). The
# domains above answer it (app/batches/window_users.py): windows know no jobs or batches.
UsersOf = Callable[[Session, str, bool], WindowUsers]


def _refuse_if_in_use(
    session: Session, users_of: UsersOf, name: str, action: str, *, only: bool = False
) -> None:
    """Pending jobs and batches bound to a window would wait forever without it ("no
    opening scheduled"), as Slurm refuses to delete a reservation that jobs use. The
    `only` window is also used by every off-peak job and batch that names no window."""
    users = users_of(session, name, only)
    jobs = [row[0] for row in users.jobs]
    batches = [row[0] for row in users.batches]
    if not jobs and not batches:
        return
    users_text, hints = [], []
    if jobs:
        ids = ", ".join(str(i) for i in jobs[:10]) + (", ..." if len(jobs) > 10 else "")
        users_text.append(f"pending job{'s' if len(jobs) > 1 else ''} {ids}")
        hints.append("let the jobs start or cancel them")
    if batches:
        users_text.append(f"batch{'es' if len(batches) > 1 else ''} {', '.join(batches)}")
        hints.append("delete the batches or give them another window")
    verb = "uses" if len(jobs) + len(batches) == 1 else "use"
    unnamed = any(row[1] is None for row in (*users.jobs, *users.batches))
    only_note = (
        " (the only window, so off-peak work that names none waits for it)" if unnamed else ""
    )
    raise Conflict(
        f"window {name!r} cannot be {action}: {' and '.join(users_text)} {verb} it{only_note};"
        f" first {', and '.join(hints)}"
    )


# Every cycle reads the windows: their columns through Core, the statement built once (an
# ORM select of the entities cost the scheduler 2 % of its CPU in a drain, with no window).
_WINDOWS = cast(Table, Window.__table__)
_WINDOW_ROWS = select(*_WINDOWS.c).order_by(_WINDOWS.c.name)


def window_specs(*, session: Session) -> list[WindowSpec]:
    return [_out(row).to_spec() for row in session.execute(_WINDOW_ROWS)]


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
