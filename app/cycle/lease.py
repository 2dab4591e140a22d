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


def released_on_commit(session: Session, *, token: int, now: datetime) -> bool:
    """Inside the apply transaction: whether our token is still current; if it is, the
    lease row stays locked until the commit (a concurrent takeover waits for it) and is
    released by it. One statement, where a locking read and, after the commit, a
    transaction of its own to release the lease were three round trips of every cycle.
    If the transaction rolls back, the lease stays held: `release` it then."""
    returned = session.scalar(
        update(SchedulerLease)
        .where(SchedulerLease.name == LEASE, SchedulerLease.token == token)
        .values(expires_at=now)
        .returning(SchedulerLease.token)
        .execution_options(synchronize_session=False)
    )
    return returned is not None


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
