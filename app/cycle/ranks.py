"""What a full cycle ranked, kept for GET /api/v1/jobs/{id}/rank (issue 42 point 3).

The full cycle has the queue in its policy's order already; it stores, in one row, what
each job is ranked by (`rank_keys`): the jobs in order and each one's class packed as
numbers (20,000 jobs: 160 kB), and per class its keys as JSON.
The API counts why one job's predecessors go first from that, in one pass over them when
the job's rank is asked (`ahead_of`), instead of reading and ranking the whole queue per
request, as it did (0.6 s at 20,000 waiting); the cycle no longer counts them for every
job, which was most of what storing the ranks cost. The same row gives each waiting job
its queue position and sorts the Queue page (app/jobs/ranking.py reads it; the API keeps
the decoded row until a full cycle writes new ranks).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from app.jobs.ranking import (
    FORMAT,
    ROW,
    QueueRanking,
    StoredRank,
    StoredRanking,
    last,
    pack,
)
from app.scheduling import JobView
from app.scheduling.queue import submitted
from app.scheduling.rank import RankClasses, RankKeys, rank_keys
from app.scheduling.types import PolicySettings

__all__ = ["ROW", "LastStored", "RankedBy", "StoredRank", "StoredRanking", "last", "store"]

_ID_OF = attrgetter("id")  # a view's job id, mapped over the whole order at C speed


@dataclass(frozen=True, slots=True)
class RankedBy:
    """How the full cycle ranks: its order's settings, as stored on the lease (the
    `ranking` dict), and when the scheduler means to rank again."""

    policy: PolicySettings
    ranking: dict[str, Any]
    next_at: datetime | None = None


def encode(keys: RankKeys) -> dict[str, Any]:
    """Per class, what its jobs are ranked by, from which the API counts the jobs ahead of
    one when asked (app/jobs/ranking.py); the jobs in queue order (position = index + 1)
    and each one's class are packed beside it (`pack`)."""
    encoded: dict[str, Any] = {
        "format": FORMAT,
        "size": keys.expected_gpu_s,
        "from": keys.expected_from,
        "sources": keys.sources,
        "priority": keys.priority,
        "project": keys.project,
        "projects": keys.projects,
        "starving": sorted(keys.starving),
    }
    if keys.las_queue is not None:
        encoded["las_queue"] = keys.las_queue  # default and las: each class's LAS queue
    return encoded


@dataclass
class LastStored:
    """What this process stored last, for the next full cycle: when nothing its ranks
    are made of changed (the same views in the same order, the same policy and runtime
    history, no job started starving since), the stored ranks are still right, and only
    their time is written, not 20,000 jobs' ranks computed and encoded again (most of
    what storing them cost, bench/deep_queue.py). When they are not, the jobs' classes are
    kept (`RankClasses`)."""

    ranked_at: datetime | None = None
    order: tuple[JobView, ...] = ()
    policy: PolicySettings | None = None
    history: Mapping[tuple[str, str], tuple[float, ...]] | None = None
    classes: RankClasses = field(default_factory=RankClasses)

    def still_right(
        self,
        order: Sequence[JobView],
        policy: PolicySettings,
        history: Mapping[tuple[str, str], tuple[float, ...]],
        now: datetime,
    ) -> bool:
        if (
            self.ranked_at is None
            or policy != self.policy
            # The snapshot reuses a view while its job is unchanged (ViewCache): the tuples'
            # comparison finds them the same by identity, and costs next to nothing.
            or tuple(order) != self.order
            or history != self.history
        ):
            return False
        limit = policy.starvation_after_s
        if limit <= 0:
            return True
        # A job starts starving at submitted + limit: did any do so since?
        before = self.ranked_at - timedelta(seconds=limit)
        after = now - timedelta(seconds=limit)
        return not any(before < submitted(job) <= after for job in order)


def store(
    session: Session,
    *,
    order: Sequence[JobView],
    ranked_by: RankedBy,
    history: Mapping[tuple[str, str], tuple[float, ...]],
    now: datetime,
    last: LastStored | None = None,
) -> None:
    """Rank `order` (the waiting jobs, in the policy's order) and replace the stored row,
    unless a later cycle's is there already. Executes, does not commit. With `last`
    (this process's previous store, updated here), ranks still right are not computed
    again: the row gets this cycle's time."""
    if last is not None and last.still_right(order, ranked_by.policy, history, now):
        touched = session.execute(
            update(QueueRanking)
            # Only the row this process stored: another scheduler's may differ.
            .where(QueueRanking.name == ROW, QueueRanking.ranked_at == last.ranked_at)
            .values(
                ranked_at=now, next_at=ranked_by.next_at, ranking=ranked_by.ranking, departed=None
            )
            .execution_options(synchronize_session=False)
        )
        if touched.rowcount:  # type: ignore[attr-defined]
            last.ranked_at = now
            return
    keys = rank_keys(
        order,
        settings=ranked_by.policy,
        history=history,
        now=now,
        kept=None if last is None else last.classes,
    )
    values: dict[str, Any] = {
        "ranked_at": now,
        "next_at": ranked_by.next_at,
        "ranking": ranked_by.ranking,
        "ranks": encode(keys),
        "packed": pack(list(map(_ID_OF, order)), keys.of),
        "ranks_id": uuid.uuid4().hex,
        "departed": None,
    }
    # By statement, not through the ORM: loading the row would decode the old ranks.
    replaced = session.execute(
        update(QueueRanking)
        .where(QueueRanking.name == ROW, QueueRanking.ranked_at <= now)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if not replaced.rowcount:  # type: ignore[attr-defined]
        stored_at = session.scalar(select(QueueRanking.ranked_at).where(QueueRanking.name == ROW))
        if stored_at is not None:  # a later cycle's are kept
            return
        session.execute(insert(QueueRanking).values(name=ROW, **values))
    if last is not None:
        last.ranked_at, last.order = now, tuple(order)
        last.policy, last.history = ranked_by.policy, history
