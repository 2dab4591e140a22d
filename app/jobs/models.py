from __future__ import annotations

from datetime import datetime

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
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.db import Base, JSONType, NullableJSON, UTCDateTime, utcnow
from app.jobs.states import JobStatus

STATUS_TYPE = Enum(JobStatus, native_enum=False, length=16)


# A pending reason's message is cut to this many characters (the column's size).
PENDING_MESSAGE_CHARS = 512


class Job(Base):
    __tablename__ = "job"
    __table_args__ = (
        UniqueConstraint("user_id", "idempotency_key", name="uq_job_user_idempotency_key"),
        CheckConstraint("gpus >= 0", name="gpus_not_negative"),
        CheckConstraint("gpu_share_milli > 0 AND gpu_share_milli <= 1000", name="share_range"),
        CheckConstraint("nodes >= 1", name="nodes_positive"),
        Index("ix_job_status_id", "status", "id"),
        Index("ix_job_project_id", "project_id", "id"),
        Index("ix_job_array_id", "array_id"),
        Index("ix_job_batch_id", "batch_id"),
        # Each submission counts its user's pending jobs (max_pending_jobs).
        Index("ix_job_user_status", "user_id", "status"),
        # A deep queue is read by range, not row by row (app/cycle/eligibility.py): the
        # jobs that may run now by schedule mode and begin time; the new arrivals, and the
        # jobs waiting for their begin time, by reason; the throttled arrays' tasks.
        Index("ix_job_pending_mode", "status", "schedule_mode", "begin_at"),
        Index("ix_job_pending_reason", "status", "pending_reason", "schedule_mode", "begin_at"),
        Index("ix_job_pending_array_limit", "status", "array_max_running"),
        # The jobs changed since a full cycle last read (app/cycle/snapshot.py).
        Index("ix_job_changed_in", "changed_in"),
        # Jobs waiting on their dependencies, few among many (app/cycle/dependencies.py);
        # partial, so that no query of eligible jobs mistakes it for theirs.
        Index(
            "ix_job_waiting_dependencies",
            "status",
            sqlite_where=text("dependencies_met IS 0"),
            postgresql_where=text("dependencies_met IS false"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    user_id: Mapped[int] = mapped_column(ForeignKey("user_account.id"))
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id"))
    command: Mapped[list[str] | str] = mapped_column(JSONType)
    # The program's text at submission (sbatch's copy of its script); null: run argv[0].
    script: Mapped[str | None] = mapped_column(Text)
    workdir: Mapped[str | None] = mapped_column(String(1024))
    env: Mapped[dict[str, str]] = mapped_column(JSONType, default=dict)
    gpus: Mapped[int] = mapped_column(Integer, default=1)
    gpu_memory_mb: Mapped[int | None] = mapped_column(Integer)
    gpu_share_milli: Mapped[int] = mapped_column(Integer, default=1000)
    gpu_model: Mapped[str | None] = mapped_column(String(96))
    nodes: Mapped[int] = mapped_column(Integer, default=1)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    max_runtime_s: Mapped[int | None] = mapped_column(Integer)
    estimated_runtime_s: Mapped[int | None] = mapped_column(Integer)
    # Seconds from SIGTERM to SIGKILL when the job is stopped (cancel, preemption, time
    # limit, window close), to write a checkpoint; null: the agent's GPUSCHED_AGENT_GRACE_S.
    grace_s: Mapped[int | None] = mapped_column(Integer)
    retries: Mapped[int] = mapped_column(Integer, default=0)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    preemptible: Mapped[bool] = mapped_column(Boolean, default=False)
    schedule_mode: Mapped[str] = mapped_column(String(16), default="now")
    begin_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    window: Mapped[str | None] = mapped_column(String(64))
    labels: Mapped[dict[str, str]] = mapped_column(JSONType, default=dict)
    # The user's choice of nodes (node names): only these, any of them (null: any node),
    # and never those, as sbatch --exclude.
    only_nodes: Mapped[list[str] | None] = mapped_column(NullableJSON)
    exclude_nodes: Mapped[list[str]] = mapped_column(JSONType, default=list)
    # Where to POST a message when the job starts, ends or fails (notify_on), as sbatch
    # --mail-type; app/notifications queues it with the state change.
    notify_url: Mapped[str | None] = mapped_column(String(2048))
    notify_on: Mapped[list[str]] = mapped_column(JSONType, default=list)

    status: Mapped[JobStatus] = mapped_column(STATUS_TYPE, default=JobStatus.PENDING)
    # Incremented each time the job is placed; agents' reports carry it (fencing).
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    pending_reason: Mapped[str | None] = mapped_column(String(32))
    pending_message: Mapped[str | None] = mapped_column(String(PENDING_MESSAGE_CHARS))
    # Not the place shown (that is the job's index in the last full cycle's ranking,
    # app/jobs/ranking.py, which also sorts the Queue page): set, to the job's place then,
    # when a full cycle first ranks it, and not kept up to date (app/cycle/apply.py);
    # NULL: no full cycle ranked it.
    queue_position: Mapped[int | None] = mapped_column(Integer)
    estimated_start_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    # What the current attempt's processes used on its nodes (their fence's CPU time, the
    # peak memory of the biggest node's), for seff; None: not measured.
    cpu_s: Mapped[float | None] = mapped_column(Float)
    memory_peak_mb: Mapped[int | None] = mapped_column(Integer)
    # A LOST attempt goes back to the queue at this time, when its node's watchdog has
    # surely ended its processes (its grace period): never two attempts at once.
    lost_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Who held this pending job (gpusched hold), and since when: no cycle considers it
    # until released.
    held_by: Mapped[str | None] = mapped_column(String(64))
    held_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Jobs that must end before this one may start, how (dependency_kind: afterok,
    # afterany, afternotok, as sbatch --dependency), and whether they all have: no cycle
    # considers the job until then.
    depends_on: Mapped[list[int]] = mapped_column(JSONType, default=list)
    dependency_kind: Mapped[str] = mapped_column(String(16), default="afterok")
    dependencies_met: Mapped[bool] = mapped_column(Boolean, default=True)
    # A task of a job array (sbatch --array, app/jobs/arrays.py): the array's id (its first
    # task's job id), this task's index, how many tasks it has, and how many may hold GPUs
    # at once (null: no limit). The same on every task; null on a job of its own.
    array_id: Mapped[int | None] = mapped_column(Integer)
    array_index: Mapped[int | None] = mapped_column(Integer)
    array_size: Mapped[int | None] = mapped_column(Integer)
    array_max_running: Mapped[int | None] = mapped_column(Integer)
    # The cron batch whose firing submitted the job (its concurrency policy asks which of
    # its jobs have not ended); null for a job submitted otherwise.
    batch_id: Mapped[int | None] = mapped_column(
        ForeignKey("batch_schedule.id", ondelete="SET NULL")
    )
    # Seconds this pending job could not run (held, or waiting on its dependencies). They
    # do not count as waiting (queue order, aging, starvation), as Slurm accrues a job's
    # age only while it is eligible.
    ineligible_s: Mapped[int] = mapped_column(Integer, default=0)
    # A change-stamp: every UPDATE of the row adds one (a database trigger, migration
    # 0028, whoever writes). A full cycle re-reads only the waiting jobs whose stamp moved
    # since it read them (app/cycle/snapshot.py, ViewCache). Nothing in the app sets it,
    # except the cycle's bulk reason writes, which add the one themselves.
    row_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Where the row last changed in write order (migration 0030, set by the database: the
    # writing transaction's id on PostgreSQL, on insert and update; on SQLite a counter, on
    # update, new rows being found by id): a full cycle asks for the jobs changed since
    # its last read by this, not for every stamp.
    changed_in: Mapped[int] = mapped_column(BigInteger, server_default=FetchedValue())
    # Set by a cancel of a scheduled/running job; the agent stops the process and then
    # reports CANCELLED, so the GPUs are released only once the process is gone.
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The shortest grace period a cancel asked for (`cancel --grace`; 0: SIGKILL now), so
    # that reconciliation re-sends a stop lost with Redis as the user asked for it.
    cancel_grace_s: Mapped[int | None] = mapped_column(Integer)
    # Set when a plan names the job as a preemption victim; cleared when it requeues.
    preempt_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_preempted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Jobs preempted to make room for this one, as [job id, attempt stopped]: its GPUs are
    # already its own, but run_job is sent only when all those attempts have exited.
    dispatch_after: Mapped[list[list[int]] | None] = mapped_column(NullableJSON)

    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    scheduled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    idempotency_key: Mapped[str | None] = mapped_column(String(128))
    request_hash: Mapped[str | None] = mapped_column(String(64))

    events: Mapped[list[JobEvent]] = relationship(
        back_populates="job", order_by="JobEvent.id", cascade="all, delete-orphan"
    )


class JobEvent(Base):
    """Every state change: when, from what, to what, who did it and why."""

    __tablename__ = "job_event"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    from_status: Mapped[JobStatus | None] = mapped_column(STATUS_TYPE)
    to_status: Mapped[JobStatus] = mapped_column(STATUS_TYPE)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    actor: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text, default="")

    job: Mapped[Job] = relationship(back_populates="events")


class JobChange(Base):
    """SQLite's write counter for `Job.changed_in` (migration 0030), one row; PostgreSQL
    stamps changes with transaction ids and leaves it at 0. Only ever moves up: a database
    copied or emptied keeps it (tests/support/servers.py)."""

    __tablename__ = "job_change"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    n: Mapped[int] = mapped_column(BigInteger)
