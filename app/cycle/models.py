from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, JSONType, UTCDateTime


class SchedulerLease(Base):
    """Who may run the scheduling cycle. The token grows on every takeover; apply writes
    only while its token is still current, so a paused scheduler that lost the lease can
    never commit a stale plan (fencing), on PostgreSQL and SQLite alike."""

    __tablename__ = "scheduler_lease"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    token: Mapped[int] = mapped_column(Integer)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # The queue policy its holder ranks with (SchedulerSettings.ranking()): the API
    # explains a job's place in the queue by the same rules (GET /jobs/{id}/rank).
    ranking: Mapped[dict[str, Any] | None] = mapped_column(JSONType)


class QueueRanking(Base):
    """What the last full cycle ranked (one row): each waiting job's place and why, as
    `rank_all` counted them, so GET /jobs/{id}/rank answers without ranking the queue
    again. `ranks` is columnar (see app/cycle/ranks.py); `next_at`: when the scheduler
    means to rank again, for the jobs that arrived since."""

    __tablename__ = "queue_ranking"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    ranked_at: Mapped[datetime] = mapped_column(UTCDateTime)
    next_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ranking: Mapped[dict[str, Any]] = mapped_column(JSONType)
    ranks: Mapped[dict[str, Any]] = mapped_column(JSONType)
