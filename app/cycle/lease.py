"""The cycle lease: one scheduling cycle at a time, with a fencing token."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.cycle.models import SchedulerLease

LEASE = "cycle"


def acquire(
    session: Session,
    *,
    holder: str,
    now: datetime,
    ttl_s: float,
    ranking: dict[str, Any] | None = None,
) -> int | None:
    """Take the lease if free, expired or already ours; returns the fencing token.
    `ranking`: the queue policy the holder ranks with, stored with it (same statement)."""
    expires = now + timedelta(seconds=ttl_s)
    # One statement: the update says which token it gave.
    token = session.scalar(
        update(SchedulerLease)
        .where(
            SchedulerLease.name == LEASE,
            or_(SchedulerLease.expires_at <= now, SchedulerLease.holder == holder),
        )
        .values(holder=holder, token=SchedulerLease.token + 1, expires_at=expires, ranking=ranking)
        .returning(SchedulerLease.token)
        .execution_options(synchronize_session=False)
    )
    if token is None:
        if session.get(SchedulerLease, LEASE) is not None:
            session.rollback()
            return None
        try:
            with session.begin_nested():
                session.add(
                    SchedulerLease(
                        name=LEASE, holder=holder, token=1, expires_at=expires, ranking=ranking
                    )
                )
        except IntegrityError:
            session.rollback()
            return None
        token = 1
    session.commit()
    return token


def still_held(session: Session, *, token: int) -> bool:
    """Inside the apply transaction: lock the lease row and check our token is current.
    Touching the row makes a concurrent takeover wait for (or conflict with) our commit."""
    row = session.scalar(
        select(SchedulerLease).where(SchedulerLease.name == LEASE).with_for_update()
    )
    return row is not None and row.token == token


def release(session: Session, *, holder: str, token: int, now: datetime) -> None:
    session.rollback()  # whatever the cycle left open (after an error) must not block this
    session.execute(
        update(SchedulerLease)
        .where(SchedulerLease.name == LEASE, SchedulerLease.token == token)
        .values(expires_at=now)
    )
    session.commit()


def ranking(session: Session) -> dict[str, Any] | None:
    """The queue policy the cycle last ranked with; None before any cycle ran."""
    return session.scalar(select(SchedulerLease.ranking).where(SchedulerLease.name == LEASE))
