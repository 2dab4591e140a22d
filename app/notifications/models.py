from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, JSONType, UTCDateTime, utcnow

MAX_ATTEMPTS = 5  # tries of one message before it is given up


class Notification(Base):
    """One webhook message about a job, until it is delivered or given up on."""

    __tablename__ = "notification"
    __table_args__ = (Index("ix_notification_due", "sent_at", "next_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"), index=True)
    event: Mapped[str] = mapped_column(String(8))  # start | end | fail
    url: Mapped[str] = mapped_column(String(2048))
    body: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # When to try (next); a sender that takes it moves this on first, so no other sender
    # takes it meanwhile, and a crash between the two only delays it.
    next_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The last failure; with sent_at null and attempts at the limit: given up.
    error: Mapped[str | None] = mapped_column(String(512))
