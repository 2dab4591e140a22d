from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, JSONType, UTCDateTime, utcnow


class BatchSchedule(Base):
    """A cron schedule that submits its job templates as its owner at every fire time."""

    __tablename__ = "batch_schedule"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("user_account.id", ondelete="CASCADE"))
    # The first template's project: who besides the owner may read the schedule.
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    cron: Mapped[str] = mapped_column(String(128))
    timezone: Mapped[str] = mapped_column(String(64))
    # JobCreate bodies (without schedule), each with its project resolved at creation.
    templates: Mapped[list[dict[str, Any]]] = mapped_column(JSONType)
    target: Mapped[str] = mapped_column(String(16), default="now")
    window: Mapped[str | None] = mapped_column(String(64))
    catch_up: Mapped[str] = mapped_column(String(8), default="once")
    # A fire time that comes while jobs of an earlier firing have not ended: allow (submit
    # anyway), forbid (skip it) or replace (cancel them first), as a CronJob's policy.
    concurrency: Mapped[str] = mapped_column(String(8), default="allow")
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    # Fire times at or before this instant never run: set at creation, on re-enable and
    # when the cron or zone changes, so a schedule never fires for its own past.
    active_from: Mapped[datetime] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class BatchFiring(Base):
    """One fire time of a schedule. The unique (schedule_id, fire_at) pair is the
    exactly-once guarantee: whoever inserts it first submits the jobs, in the same
    transaction; every other beat, worker or re-delivered task hits the constraint."""

    __tablename__ = "batch_firing"
    __table_args__ = (
        UniqueConstraint("schedule_id", "fire_at", name="uq_batch_firing_schedule_fire_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    schedule_id: Mapped[int] = mapped_column(ForeignKey("batch_schedule.id", ondelete="CASCADE"))
    fire_at: Mapped[datetime] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    skipped: Mapped[bool] = mapped_column(Boolean, default=False)
    job_ids: Mapped[list[int]] = mapped_column(JSONType, default=list)
    # Why a firing submitted nothing although it was due (e.g. owner left the project).
    error: Mapped[str | None] = mapped_column(String(512))
    # Who ran the batch by hand (`batch run`); null: its schedule fired it. A run by hand
    # is not a fire time: the schedule's own times ignore it.
    run_by: Mapped[str | None] = mapped_column(String(64))
