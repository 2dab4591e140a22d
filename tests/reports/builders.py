"""Rows for report tests, written straight to the database: nodes, a job that held some GPUs
over a known window, and the telemetry those GPUs sent meanwhile."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.auth.models import User
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.nodes.models import Allocation, Gpu, GpuSample, Node, NodeState
from app.projects.models import Project

Value = float | Callable[[int, int], float | None] | None  # constant, or f(gpu_position, i)


def add_gpus(
    factory: sessionmaker[Session],
    node: str,
    *,
    gpus: int = 4,
    model: str = "H100-80GB",
    memory_mb: int = 81559,
    at: datetime | None = None,
) -> list[int]:
    """A READY node with ``gpus`` GPUs; returns their ids in index order."""
    with factory() as session:
        row = Node(name=node, hostname=node, state=NodeState.READY, last_heartbeat_at=at)
        row.gpus = [
            Gpu(index=i, uuid=f"GPU-{node}-{i}", model=model, memory_total_mb=memory_mb)
            for i in range(gpus)
        ]
        session.add(row)
        session.commit()
        return [g.id for g in row.gpus]


@dataclass
class Run:
    """A job that held ``gpu_ids`` from ``start`` to ``end`` (None: still holds them)."""

    job_id: int
    gpu_ids: list[int]
    start: datetime
    end: datetime | None


def add_run(
    factory: sessionmaker[Session],
    *,
    gpu_ids: Sequence[int],
    start: datetime,
    end: datetime | None,
    user: str = "alice",
    project: str = "ml",
    status: JobStatus = JobStatus.SUCCEEDED,
    name: str = "train",
    gpu_memory_mb: int | None = None,
    share_milli: int = 1000,
) -> Run:
    with factory() as session:
        user_id = session.scalar(select(User.id).where(User.name == user))
        project_id = session.scalar(select(Project.id).where(Project.name == project))
        assert user_id is not None and project_id is not None
        job = Job(
            name=name,
            user_id=user_id,
            project_id=project_id,
            command=["python", "train.py"],
            env={},
            labels={},
            gpus=len(gpu_ids),
            gpu_memory_mb=gpu_memory_mb,
            gpu_share_milli=share_milli,
            nodes=1,
            status=status,
            attempt=1,
            created_at=start - timedelta(minutes=1),
            updated_at=end or start,
            scheduled_at=start,
            started_at=start,
            finished_at=end if status not in (JobStatus.RUNNING, JobStatus.SCHEDULED) else None,
        )
        session.add(job)
        session.flush()
        for rank, gpu_id in enumerate(gpu_ids):
            node_id = session.scalar(select(Gpu.node_id).where(Gpu.id == gpu_id))
            assert node_id is not None
            session.add(
                Allocation(
                    job_id=job.id,
                    attempt=1,
                    node_id=node_id,
                    gpu_id=gpu_id,
                    share_milli=share_milli,
                    rank=rank,
                    created_at=start,
                    released_at=end,
                )
            )
        session.commit()
        return Run(job.id, list(gpu_ids), start, end)


def _value(value: Value, position: int, i: int) -> float | None:
    return value(position, i) if callable(value) else value


def add_samples(
    factory: sessionmaker[Session],
    run: Run,
    *,
    count: int,
    step_s: int = 60,
    util: Value = 90.0,
    memory_mb: Value = 60_000,
    power_w: Value = 300.0,
    offset_s: int = 0,
) -> None:
    """``count`` samples per GPU of the run, ``step_s`` apart from ``start + offset_s``."""
    with factory() as session:
        for position, gpu_id in enumerate(run.gpu_ids):
            for i in range(count):
                memory = _value(memory_mb, position, i)
                session.add(
                    GpuSample(
                        gpu_id=gpu_id,
                        at=run.start + timedelta(seconds=offset_s + i * step_s),
                        resolution_s=step_s,
                        util_pct=_value(util, position, i),
                        memory_used_mb=None if memory is None else int(memory),
                        temperature_c=60.0,
                        power_w=_value(power_w, position, i),
                        job_ids=[run.job_id],
                    )
                )
        session.commit()
