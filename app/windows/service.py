"""Storing off-peak windows and turning them into concrete intervals."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.errors import Conflict, FieldError, NotFound
from app.windows.calendar import UpcomingWindow, WindowSpec, upcoming
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


def create_window(*, session: Session, body: WindowIn) -> WindowOut:
    row = Window()
    _fill(row, body)
    session.add(row)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"a window named {body.name!r} already exists") from None
    return _out(row)


def replace_window(*, session: Session, name: str, body: WindowIn) -> WindowOut:
    row = _row(session, name)
    _fill(row, body)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"a window named {body.name!r} already exists") from None
    return _out(row)


def delete_window(*, session: Session, name: str) -> None:
    session.delete(_row(session, name))
    session.commit()


def window_specs(*, session: Session) -> list[WindowSpec]:
    return [_out(w).to_spec() for w in session.scalars(select(Window).order_by(Window.name))]


def upcoming_windows(*, session: Session, now: datetime, days: float) -> list[UpcomingWindow]:
    return upcoming(window_specs(session=session), now=now, days=days)


def require_window(*, session: Session, name: str | None, field: str | tuple[str, ...]) -> None:
    """Refuse a reference to a window nobody defined: a job bound to it would wait forever
    ("no opening scheduled"). The message lists the windows that exist."""
    if name is None or session.scalar(select(Window.id).where(Window.name == name)):
        return
    defined = session.scalars(select(Window.name).order_by(Window.name)).all()
    raise FieldError(
        field, f"no off-peak window named {name!r}; defined: {', '.join(defined) or 'none'}"
    )
