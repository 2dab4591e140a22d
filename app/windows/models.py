from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, Float, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, JSONType, UTCDateTime, utcnow


class Window(Base):
    """A named off-peak window: cron start + duration, or daily ranges, in a time zone."""

    __tablename__ = "offpeak_window"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    timezone: Mapped[str] = mapped_column(String(64))
    cron: Mapped[str | None] = mapped_column(String(128))
    duration_s: Mapped[int | None] = mapped_column(Integer)
    daily: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType)
    capacity_outside_fraction: Mapped[float] = mapped_column(Float, default=0.0)
    preempt_on_close: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
