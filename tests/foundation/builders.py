"""Rows for API tests, written straight to the database (nodes normally come from agents)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from app.auth.models import User
from app.auth.service import create_user
from app.db import utcnow
from app.jobs.lifecycle import transition
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.nodes.models import Gpu, Node, NodeState
from app.projects.models import Project
from app.scheduling.types import ReasonKind


def ready_node(name: str, *, gpus: int, now: datetime, idle_since: datetime | None = None) -> Node:
    """An unsaved READY node whose GPUs report fresh, idle telemetry: a cycle may place on
    it at once (with a zero stability window, or `idle_since` far enough back)."""
    node = Node(name=name, hostname="127.0.0.1", state=NodeState.READY, last_heartbeat_at=now)
    node.gpus = [
        Gpu(
            index=i,
            uuid=f"GPU-{name}-{i}",
            model="H100-80GB",
            memory_total_mb=81559,
            memory_used_mb=0,
            sampled_at=now,
            util_pct=0.0,
            idle_since=idle_since or now,
        )
        for i in range(gpus)
    ]
    return node


def add_node(
    factory: sessionmaker[Session],
    name: str,
    *,
    gpus: int = 8,
    model: str = "H100-80GB",
    memory_mb: int = 81559,
    state: NodeState = NodeState.READY,
) -> None:
    with factory() as session:
        node = Node(name=name, hostname=name, state=state, last_heartbeat_at=utcnow())
        node.gpus = [
            Gpu(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_total_mb=memory_mb)
            for i in range(gpus)
        ]
        session.add(node)
        session.commit()


def move_job(factory: sessionmaker[Session], job_id: int, *path: JobStatus) -> None:
    with factory() as session:
        job = session.get_one(Job, job_id)
        for status in path:
            transition(session, job=job, to=status, actor="test")
        session.commit()


def add_user(
    factory: sessionmaker[Session], name: str, projects: list[str], *, admin: bool = False
) -> str:
    """A user in `projects` (created when missing), committed; returns its token. Recorded
    in the audit trail with actor "test", which audit tests leave out."""
    with factory() as session:
        _, token = create_user(
            session=session, name=name, projects=projects, is_admin=admin, ttl_days=0, actor="test"
        )
        session.commit()
    return token


def insert_jobs(
    factory: sessionmaker[Session], *, user: str, project: str, count: int, **columns: Any
) -> list[int]:
    """`count` pending jobs of `user` in `project` as a submission leaves them (NEW),
    written in one bulk INSERT: a deep queue in seconds, where the API would take minutes.
    `columns`: the same for every job (schedule_mode="at", begin_at=..., gpu_model=...).
    Returns their ids, in order."""
    with factory.begin() as session:
        user_id = session.scalar(select(User.id).where(User.name == user))
        project_id = session.scalar(select(Project.id).where(Project.name == project))
        before = session.scalar(select(func.max(Job.id))) or 0
        session.execute(
            insert(Job),
            [
                {
                    "name": f"task-{i}",
                    "user_id": user_id,
                    "project_id": project_id,
                    "command": ["train"],
                    "status": JobStatus.PENDING,
                    "pending_reason": ReasonKind.NEW.value,
                    "pending_message": "submitted; waiting for the next scheduling cycle",
                    **columns,
                }
                for i in range(count)
            ],
        )
        return list(session.scalars(select(Job.id).where(Job.id > before).order_by(Job.id)))
