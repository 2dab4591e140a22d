"""Rows for API tests, written straight to the database (nodes normally come from agents)."""

from __future__ import annotations

from sqlalchemy import select

from app.db import utcnow
from app.jobs.lifecycle import transition
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.nodes.models import Gpu, Node, NodeState


def add_node(
    factory, name: str, *, gpus: int = 8, model: str = "H100-80GB", memory_mb: int = 81559
):
    with factory() as session:
        node = Node(name=name, hostname=name, state=NodeState.READY, last_heartbeat_at=utcnow())
        node.gpus = [
            Gpu(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_total_mb=memory_mb)
            for i in range(gpus)
        ]
        session.add(node)
        session.commit()


def move_job(factory, job_id: int, *path: JobStatus) -> None:
    with factory() as session:
        job = session.scalar(select(Job).where(Job.id == job_id))
        for status in path:
            transition(session, job=job, to=status, actor="test")
        session.commit()
