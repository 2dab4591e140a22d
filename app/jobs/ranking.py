"""What the last full cycle ranked, as the API reads it: each waiting job's place in the
queue (JobOut.queue_position) and why (GET /api/v1/jobs/{id}/rank).

A job's place is its index in the stored ranking, not a column of its own: when the job
at the head starts, every job behind it moves up one place, and a column per job cost a
cycle 20,000 writes (bench/deep_queue.py). The ranking is one row (app/cycle/ranks.py
writes it); the ranked jobs a later cycle placed are listed in `departed`, and a place
counts only the ranked jobs still ahead, as do the jobs ahead of it by each rule
(`ahead_of`, counted when a job's rank is asked). The decoded row is kept per process
until the scheduler rewrites the ranks (`ranks_id`): a page of the queue reads two small
columns.
"""

from __future__ import annotations

import sys
import threading
from array import array
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import LargeBinary, String, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from app.db import Base, JSONType, UTCDateTime
from app.scheduling.rank import RankKeys, ahead_of

ROW = "queue"
# The layout of `ranks` and `packed`: a row stored in another (by an older scheduler) is
# not read, and the next full cycle replaces it.
FORMAT = 4


class QueueRanking(Base):
    """What the last full cycle ranked (one row): each waiting job's place and what it is
    ranked by (`rank_keys`), so GET /jobs/{id}/rank answers without reading and ranking
    the queue again. `ranks` is columnar (see app/cycle/ranks.py); `next_at`: when the
    scheduler means to rank again, for the jobs that arrived since; `departed`: the ranked jobs
    placed since (the jobs behind them moved up); `ranks_id`: names this `ranks` (a
    full cycle that finds them still right moves `ranked_at` only)."""

    __tablename__ = "queue_ranking"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    ranked_at: Mapped[datetime] = mapped_column(UTCDateTime)
    next_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ranking: Mapped[dict[str, Any]] = mapped_column(JSONType)
    ranks: Mapped[dict[str, Any]] = mapped_column(JSONType)
    # The ranked jobs' ids in order, then each one's class (`RankKeys.of`): `pack`.
    packed: Mapped[bytes | None] = mapped_column(LargeBinary)
    departed: Mapped[list[int] | None] = mapped_column(JSONType)
    ranks_id: Mapped[str | None] = mapped_column(String(32))


@dataclass(frozen=True, slots=True)
class StoredRank:
    position: int
    waiting: int
    ahead: tuple[tuple[str, int], ...]
    expected_gpu_s: float
    expected_from: str
    starving: bool
    las_queue: int | None = None


@dataclass(frozen=True, slots=True)
class StoredRanking:
    ranked_at: datetime
    next_at: datetime | None
    ranking: dict[str, Any]
    keys: RankKeys
    ids: list[int]  # in the ranking's order
    index: dict[int, int]
    ranks_id: str | None = None
    # The indexes of the ranked jobs placed since, sorted.
    gone: tuple[int, ...] = ()

    @property
    def waiting(self) -> int:
        return len(self.index) - len(self.gone)

    def position(self, job_id: int) -> int | None:
        """The job's place among the ranked jobs still in line (1 is the next), or None
        when this ranking does not hold it (or it was placed since)."""
        i = self.index.get(job_id)
        if i is None:
            return None
        before = bisect_left(self.gone, i)
        if before < len(self.gone) and self.gone[before] == i:
            return None
        return i + 1 - before

    def positions(self, job_ids: Iterable[int]) -> dict[int, int]:
        found = {job_id: self.position(job_id) for job_id in job_ids}
        return {job_id: place for job_id, place in found.items() if place is not None}

    def find(self, job_id: int) -> StoredRank | None:
        position = self.position(job_id)
        if position is None:
            return None
        i = self.index[job_id]
        keys = self.keys
        alike = keys.of[i]
        return StoredRank(
            position=position,
            waiting=self.waiting,
            # Counted now, without the jobs placed since the ranking.
            ahead=ahead_of(keys, i, self.ranking["policy"], gone=frozenset(self.gone)),
            expected_gpu_s=keys.expected_gpu_s[alike],
            expected_from=keys.sources[keys.expected_from[alike]],
            starving=i in keys.starving,
            las_queue=None if keys.las_queue is None else keys.las_queue[alike],
        )


def pack(ids: list[int], of: list[int]) -> bytes:
    """Ids and classes as little-endian 32-bit integers, ids first."""
    packed = array("i", ids)
    packed.extend(of)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack(packed: bytes) -> tuple[list[int], list[int]]:
    numbers = array("i")
    numbers.frombytes(packed)
    if sys.byteorder == "big":
        numbers.byteswap()
    half = len(numbers) // 2
    return numbers[:half].tolist(), numbers[half:].tolist()


def _decoded(ranks: dict[str, Any], of: list[int]) -> RankKeys | None:
    if ranks.get("format") != FORMAT:
        return None
    return RankKeys(
        of=of,
        expected_gpu_s=ranks["size"],
        expected_from=ranks["from"],
        sources=ranks["sources"],
        priority=ranks["priority"],
        project=ranks["project"],
        projects=ranks["projects"],
        starving=frozenset(ranks["starving"]),
        las_queue=ranks.get("las_queue"),
    )


_cached: list[StoredRanking] = []
_lock = threading.Lock()


def last(session: Session) -> StoredRanking | None:
    """The last full cycle's ranking; its ranks decoded once per `ranks_id` in this process
    (a request reads the row's small columns while it is current)."""
    head = session.execute(
        select(
            QueueRanking.ranked_at,
            QueueRanking.next_at,
            QueueRanking.ranking,
            QueueRanking.ranks_id,
            QueueRanking.departed,
        ).where(QueueRanking.name == ROW)
    ).first()
    if head is None:
        return None
    ranked_at, next_at, ranking, ranks_id, departed = head
    ranks_id = ranks_id or ranked_at.isoformat()
    with _lock:
        decoded = _cached[0] if _cached and _cached[0].ranks_id == ranks_id else None
    if decoded is None:
        stored = session.execute(
            select(QueueRanking.ranks, QueueRanking.packed).where(QueueRanking.name == ROW)
        ).first()
        if stored is None or stored.ranks is None or stored.packed is None:
            return None
        ids, of = unpack(stored.packed)
        keys = _decoded(stored.ranks, of)
        if keys is None:
            return None
        decoded = StoredRanking(
            ranked_at=ranked_at,
            next_at=next_at,
            ranking=ranking,
            keys=keys,
            ids=ids,
            index={job_id: i for i, job_id in enumerate(ids)},
            ranks_id=ranks_id,
        )
        with _lock:
            _cached[:] = [decoded]
    index = decoded.index
    gone = tuple(sorted({index[i] for i in departed or () if i in index}))
    if (ranked_at, next_at, ranking, gone) == (
        decoded.ranked_at,
        decoded.next_at,
        decoded.ranking,
        decoded.gone,
    ):
        return decoded
    return replace(decoded, ranked_at=ranked_at, next_at=next_at, ranking=ranking, gone=gone)
