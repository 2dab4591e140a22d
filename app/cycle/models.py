from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, JSONType, UTCDateTime
from app.jobs.ranking import QueueRanking

__all__ = ["QueueRanking", "SchedulerLease"]


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
