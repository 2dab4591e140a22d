"""The one module that writes allocations.

Placing and releasing happen inside the caller's transaction; the database refuses any
double allocation on its own (partial unique index for whole GPUs, and the check
constraint on gpu.allocated_milli for shares), so even two racing schedulers cannot hand
out one GPU twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.db import utcnow
from app.jobs.models import Allocation, Job
from app.nodes.models import Gpu


@dataclass(frozen=True, slots=True)
class GpuClaim:
    node_id: int
    gpu_id: int | None  # None: a CPU-only job holds a slot on the node, no GPU
    share_milli: int
    rank: int


def allocate(session: Session, *, job: Job, claims: Sequence[GpuClaim]) -> None:
    """Record the claims for the job's current attempt and count them on each GPU.

    The UPDATE of allocated_milli takes the row lock, so concurrent writers serialise on
    the GPU row and the check constraint sees the true sum.
    """
    for claim in claims:
        session.add(
            Allocation(
                job_id=job.id,
                attempt=job.attempt,
                node_id=claim.node_id,
                gpu_id=claim.gpu_id,
                share_milli=claim.share_milli,
                rank=claim.rank,
            )
        )
        if claim.gpu_id is not None:
            session.execute(
                update(Gpu)
                .where(Gpu.id == claim.gpu_id)
                .values(allocated_milli=Gpu.allocated_milli + claim.share_milli)
            )
    session.flush()


def release(session: Session, *, job_id: int, attempt: int | None = None) -> int:
    """Release the job's active allocations (of one attempt, or all); returns how many."""
    query = select(Allocation).where(Allocation.job_id == job_id, Allocation.released_at.is_(None))
    if attempt is not None:
        query = query.where(Allocation.attempt == attempt)
    rows = list(session.scalars(query.with_for_update()))
    now = utcnow()
    for row in rows:
        row.released_at = now
        if row.gpu_id is not None:
            session.execute(
                update(Gpu)
                .where(Gpu.id == row.gpu_id)
                .values(allocated_milli=Gpu.allocated_milli - row.share_milli)
            )
    session.flush()
    return len(rows)


def active_allocations(session: Session, *, job_id: int) -> list[Allocation]:
    return list(
        session.scalars(
            select(Allocation)
            .where(Allocation.job_id == job_id, Allocation.released_at.is_(None))
            .order_by(Allocation.rank, Allocation.id)
        )
    )
