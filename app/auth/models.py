from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.db import Base, UTCDateTime, utcnow


class User(Base):
    __tablename__ = "user_account"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    # The Unix account the user's jobs run as on the nodes (by default their name), as a
    # Slurm job runs as the user who submitted it.
    unix_user: Mapped[str] = mapped_column(String(64))
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Where a job of theirs that asks for notifications (notify_on) without a URL of its
    # own sends them, as Slurm mails the submitting user by default.
    notify_url: Mapped[str | None] = mapped_column(String(2048))
    # How many jobs (array tasks each) the user may have pending, as Slurm's MaxSubmitJobs
    # for a user association; None: the cluster's GPUSCHED_MAX_PENDING_JOBS_PER_USER.
    max_pending_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # How many jobs the user may run at once and how many GPUs they may use, as Slurm's
    # MaxJobs and MaxTRES=gres/gpu for a user association; None: no limit. Over one, a
    # job waits (pending reason running_limit); it is not refused.
    max_running_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)

    tokens: Mapped[list[ApiToken]] = relationship(back_populates="user")


class ApiToken(Base):
    """A bearer token. Only its SHA-256 is stored: tokens are 256-bit random, so a fast
    hash is enough (no dictionary to attack) and lookups stay one indexed read."""

    __tablename__ = "api_token"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("user_account.id", ondelete="CASCADE"))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    label: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    user: Mapped[User] = relationship(back_populates="tokens")
