from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, UTCDateTime, utcnow


class Installation(Base):
    """This installation's id: one row, made by migration 0022. Agents name the fence
    around each job by it (installation + node + job + attempt), so two installations on
    one host, even with equal node names, never touch each other's jobs."""

    __tablename__ = "installation"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
