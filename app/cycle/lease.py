"""The cycle lease: one scheduling cycle at a time, with a fencing token."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, bindparam, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.cycle.models import SchedulerLease

LEASE = "cycle"


# A cycle runs these each time: built once, through Core on the table. Built anew per
# cycle through the ORM's bulk-update path (synchronize_session=False still goes there),
# taking and letting go cost 4.0-4.7 ms of CPU with their commits on a slow 2-core host,
# 2.2-2.4 ms so; in a drain's profile they had been a tenth of the scheduler's CPU.
_lease = cast(Table, SchedulerLease.__table__)
_TAKE = (
    update(_lease)
    .where(
        _lease.c.name == LEASE,
        or_(_lease.c.expires_at <= bindparam("now"), _lease.c.holder == bindparam("taker")),
    )
    .values(
        holder=bindparam("taker"),
        token=_lease.c.token + 1,
        expires_at=bindparam("until", type_=_lease.c.expires_at.type),
        ranking=bindparam("rules", type_=_lease.c.ranking.type),
    )
    .returning(_lease.c.token)
)
# Ends the lease of `held` (the token it was taken with), if it is still that token's.
_LET_GO = (
    update(_lease)
    .where(_lease.c.name == LEASE, _lease.c.token == bindparam("held"))
    .values(expires_at=bindparam("until", type_=_lease.c.expires_at.type))
)
_LET_GO_RETURNING = _LET_GO.returning(_lease.c.token)


def take(
    session: Session,
    *,
    holder: str,
    now: datetime,
    ttl_s: float,
    ranking: dict[str, Any] | None = None,
) -> int | None:
    """Take the lease if free, expired or already ours, in the session's transaction (the
    caller commits: a cycle with its settle phase, so that one commit serves both); returns
    the fencing token, or None (the transaction rolled back) when another holds it.
    `ranking`: the queue policy the holder ranks with, stored with it (same statement)."""
    expires = now + timedelta(seconds=ttl_s)
    # One statement: the update says which token it gave.
    token: int | None = session.execute(
        _TAKE, {"now": now, "taker": holder, "until": expires, "rules": ranking}
    ).scalar()
    if token is not None:
        return token
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
    return 1


def released_on_commit(session: Session, *, token: int, now: datetime) -> bool:
    """Inside the apply transaction: whether our token is still current; if it is, the
    lease row stays locked until the commit (a concurrent takeover waits for it) and is
    released by it. One statement, where a locking read and, after the commit, a
    transaction of its own to release the lease were three round trips of every cycle.
    If the transaction rolls back, the lease stays held: `release` it then."""
    returned = session.execute(_LET_GO_RETURNING, {"held": token, "until": now}).scalar()
    return returned is not None


def release(session: Session, *, holder: str, token: int, now: datetime) -> None:
    session.rollback()  # whatever the cycle left open (after an error) must not block this
    session.execute(_LET_GO, {"held": token, "until": now})
    session.commit()


def ranking(session: Session) -> dict[str, Any] | None:
    """The queue policy the cycle last ranked with; None before any cycle ran."""
    return session.scalar(select(SchedulerLease.ranking).where(SchedulerLease.name == LEASE))
