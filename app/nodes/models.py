from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Enum,
    FetchedValue,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.db import Base, JSONType, NullableJSON, UTCDateTime, utcnow


class NodeState(StrEnum):
    READY = "READY"
    NOT_READY = "NOT_READY"


class Node(Base):
    __tablename__ = "node"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    hostname: Mapped[str] = mapped_column(String(255), default="")
    labels: Mapped[dict[str, str]] = mapped_column(JSONType, default=dict)
    agent_version: Mapped[str] = mapped_column(String(32), default="")
    gpu_backend: Mapped[str] = mapped_column(String(32), default="")
    state: Mapped[NodeState] = mapped_column(
        Enum(NodeState, native_enum=False, length=16), default=NodeState.NOT_READY
    )
    drained: Mapped[bool] = mapped_column(Boolean, default=False)
    drain_reason: Mapped[str] = mapped_column(String(255), default="")
    # A drain that begins later (gpusched drain --at): until then the node takes only jobs
    # whose time limit ends by then (app/scheduling/eligibility.py), from then on none.
    maintenance_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    health_message: Mapped[str] = mapped_column(String(255), default="")
    # How its agent fences each job: "cgroup v2", "cgroup v1" or "subreaper only".
    isolation: Mapped[str] = mapped_column(String(32), default="")
    # Single-user: every job there runs as this account (its agent is not root); None:
    # each job runs as its owner's.
    jobs_run_as: Mapped[str | None] = mapped_column(String(64))
    # Owners' Unix accounts it cannot run jobs as (account -> why, from its agent): their
    # jobs are placed elsewhere, and wait with that reason if nowhere else will do.
    unusable_accounts: Mapped[dict[str, str] | None] = mapped_column(NullableJSON, default=dict)
    # The grace period its agent gives jobs that ask for none: how long its watchdog may
    # take to end a lost attempt (app/jobs/agent_reports.py).
    grace_s: Mapped[float | None] = mapped_column(Float)
    # Its agent's heartbeat period: it died at most this long after its last heartbeat.
    interval_s: Mapped[float | None] = mapped_column(Float)
    # When its agent last registered (started).
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Removed by an admin (decommissioned): the row stays, since allocations of finished
    # jobs refer to it, but the node leaves every view and the scheduler's snapshot. Its
    # agent registering or heartbeating again brings it back.
    removed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    gpus: Mapped[list[Gpu]] = relationship(
        back_populates="node", order_by="Gpu.index", cascade="all, delete-orphan"
    )


class Gpu(Base):
    """A GPU and its latest telemetry; the time series lives in gpu_sample."""

    __tablename__ = "gpu"
    __table_args__ = (
        UniqueConstraint("node_id", "index", name="uq_gpu_node_index"),
        # The allocation writer adds and subtracts shares here in the same transaction as
        # the allocation rows, so the database itself refuses to hand out more than 1 GPU.
        CheckConstraint(
            "allocated_milli >= 0 AND allocated_milli <= 1000", name="allocated_within_one"
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("node.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(String(96), unique=True)
    model: Mapped[str] = mapped_column(String(96))
    memory_total_mb: Mapped[int] = mapped_column(Integer)
    nvlink_peers: Mapped[list[int]] = mapped_column(JSONType, default=list)
    allocated_milli: Mapped[int] = mapped_column(Integer, default=0)
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    health_message: Mapped[str] = mapped_column(String(255), default="")
    # The deciding readings its agent could not take ("processes: why"): not empty, the
    # GPU is unknown, and unknown is not free (nothing is placed on it).
    unknown_readings: Mapped[list[str] | None] = mapped_column(NullableJSON, default=list)
    # MIG mode is on: sliced, so never handed out as a whole GPU.
    mig_enabled: Mapped[bool] = mapped_column(Boolean, default=False)
    # Latest reading (None until the first sample arrives).
    sampled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    util_pct: Mapped[float | None] = mapped_column(Float)
    memory_util_pct: Mapped[float | None] = mapped_column(Float)
    memory_used_mb: Mapped[int | None] = mapped_column(Integer)
    temperature_c: Mapped[float | None] = mapped_column(Float)
    power_w: Mapped[float | None] = mapped_column(Float)
    processes: Mapped[list[dict[str, Any]]] = mapped_column(JSONType, default=list)
    foreign_util_pct: Mapped[float] = mapped_column(Float, default=0.0)
    foreign_memory_mb: Mapped[int] = mapped_column(Integer, default=0)
    # Since when foreign load has been above / below the threshold without interruption:
    # the scheduler trusts neither a GPU that just went idle nor one that just got busy.
    foreign_since: Mapped[datetime | None] = mapped_column(UTCDateTime)
    idle_since: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Where the row last changed in write order (migration 0032, set by the database: on
    # PostgreSQL the writing transaction's id, on insert and update; 0 on SQLite): a cycle
    # reads only the GPUs changed since its last read (app/cycle/snapshot.py).
    changed_in: Mapped[int] = mapped_column(BigInteger, server_default=FetchedValue())

    node: Mapped[Node] = relationship(back_populates="gpus")


class GpuSample(Base):
    """Telemetry time series for charts. Raw rows (resolution_s = agent interval) are kept
    for a short period, then folded into 60 s averages (see app/nodes/telemetry.py)."""

    __tablename__ = "gpu_sample"
    __table_args__ = (
        Index("ix_gpu_sample_gpu_at", "gpu_id", "at"),
        Index("ix_gpu_sample_at", "at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpu.id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    resolution_s: Mapped[int] = mapped_column(Integer)
    util_pct: Mapped[float | None] = mapped_column(Float)
    memory_used_mb: Mapped[int | None] = mapped_column(Integer)
    temperature_c: Mapped[float | None] = mapped_column(Float)
    power_w: Mapped[float | None] = mapped_column(Float)
    job_ids: Mapped[list[int]] = mapped_column(JSONType, default=list)


class ClusterSecret(Base):
    """The installation's secret, from which every node's key is derived (one row). The
    control plane reads it from here; agents never see it, only their own key."""

    __tablename__ = "cluster_secret"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    secret_hex: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Allocation(Base):
    """The GPUs (or, for a CPU-only job, the node) one attempt of a job holds.

    An allocation is active until released_at is set. A partial unique index makes two
    active whole-GPU allocations of one GPU impossible; shared allocations are bounded
    by gpu.allocated_milli's check constraint.
    """

    __tablename__ = "allocation"
    __table_args__ = (
        Index(
            "uq_allocation_active_whole_gpu",
            "gpu_id",
            unique=True,
            postgresql_where=text("released_at IS NULL AND share_milli = 1000"),
            sqlite_where=text("released_at IS NULL AND share_milli = 1000"),
        ),
        Index("ix_allocation_job_attempt", "job_id", "attempt"),
        Index("ix_allocation_changed_in", "changed_in"),
        Index("ix_allocation_released_at", "released_at"),
        CheckConstraint("share_milli > 0 AND share_milli <= 1000", name="share_range"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    node_id: Mapped[int] = mapped_column(ForeignKey("node.id"))
    gpu_id: Mapped[int | None] = mapped_column(ForeignKey("gpu.id"))
    share_milli: Mapped[int] = mapped_column(Integer, default=1000)
    rank: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    released_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Where the row last changed, as `Gpu.changed_in` (migration 0033): a cycle reads only
    # the allocations placed or released since its last read (app/cycle/snapshot.py).
    changed_in: Mapped[int] = mapped_column(BigInteger, server_default=FetchedValue())
