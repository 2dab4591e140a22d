"""Datetimes from users: aware, and within years every backend and every conversion can
hold (a date near year 1 or 9999 overflows when converted to UTC or shifted by a period)."""

from __future__ import annotations

from datetime import UTC, datetime

MIN_YEAR = 1970
MAX_YEAR = 9000


def checked_utc(value: datetime) -> datetime:
    """`value` in UTC; ValueError with a reason when it is naive or out of range."""
    if value.tzinfo is None:
        raise ValueError("needs a UTC offset, e.g. 2026-11-23T02:00:00+01:00")
    if not MIN_YEAR <= value.year <= MAX_YEAR:
        raise ValueError(f"must be between the years {MIN_YEAR} and {MAX_YEAR}")
    return value.astimezone(UTC)


def query_time(value: datetime | None, field: str) -> datetime | None:
    """A time from a query string: without an offset it is UTC, as everywhere in the API."""
    from app.errors import FieldError

    if value is None:
        return None
    try:
        return checked_utc(value if value.tzinfo else value.replace(tzinfo=UTC))
    except ValueError as exc:
        raise FieldError(field, str(exc), location="query") from None
