from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, Float, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, UTCDateTime, utcnow


class Project(Base):
    """A team: the unit of quota (guaranteed GPUs) and fair share (weight)."""

    __tablename__ = "project"
    __table_args__ = (
        CheckConstraint("gpu_quota >= 0", name="quota_not_negative"),
        CheckConstraint("weight > 0", name="weight_positive"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    gpu_quota: Mapped[int] = mapped_column(Integer, default=0)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    # The longest time limit its jobs may have (a Slurm QOS's MaxWall); None: the cluster's.
    max_runtime_s: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The highest priority its users may give their jobs (0: only lower it, as Slurm's
    # nice); an admin sets it, and admins give any priority.
    max_priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # How many jobs the project's users may have pending together (Slurm's GrpSubmitJobs
    # on an account); None: no limit of the project's own.
    max_pending_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # How many jobs its users may run at once together and how many GPUs they may use
    # (Slurm's GrpJobs and GrpTRES=gres/gpu); None: no limit of the project's own.
    max_running_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Fair-share usage as the scheduler's last full cycle ranked by it: GPU-seconds, each
    # decayed by how long ago it was used (GPUSCHED_SCHEDULER_FAIR_SHARE_HALF_LIFE_S).
    usage_gpu_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    usage_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ProjectMember(Base):
    __tablename__ = "project_member"

    user_id: Mapped[int] = mapped_column(
        ForeignKey("user_account.id", ondelete="CASCADE"), primary_key=True
    )
    project_id: Mapped[int] = mapped_column(
        ForeignKey("project.id", ondelete="CASCADE"), primary_key=True
    )
