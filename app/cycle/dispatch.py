"""The messages a cycle (or reconciliation) sends to agents, built from database rows.
Building is pure reading; sending happens in the caller after commit."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.auth.models import User
from app.jobs.models import Allocation, Job
from app.jobs.states import ACTIVE, JobStatus
from app.nodes.models import Gpu, Node


@dataclass(frozen=True, slots=True)
class Dispatch:
    """One run_job or stop_job message for one node."""

    node: str
    payload: dict[str, Any]


def master_port(job_id: int, attempt: int) -> int:
    """A port every rank of a gang derives alike, spread to avoid clashes between jobs."""
    return 20000 + (job_id * 31 + attempt) % 20000


def run_messages(session: Session, *, job: Job) -> list[Dispatch]:
    """run_job for every node of the job's current attempt, from its allocations."""
    return run_messages_for(session, jobs=[job])


def run_messages_for(session: Session, *, jobs: Sequence[Job]) -> list[Dispatch]:
    """`run_messages` of several jobs, read in one query."""
    if not jobs:
        return []
    attempts = {job.id: job.attempt for job in jobs}
    # Each job runs as its owner's Unix account (as they map it now).
    accounts = dict(
        session.execute(
            select(Job.id, User.unix_user)
            .join(User, User.id == Job.user_id)
            .where(Job.id.in_(attempts))
        ).all()
    )
    rows = session.execute(
        select(
            Allocation.job_id,
            Allocation.attempt,
            Node.name,
            Node.hostname,
            Gpu.index,
            Allocation.share_milli,
            Allocation.rank,
        )
        .join(Node, Node.id == Allocation.node_id)
        .outerjoin(Gpu, Gpu.id == Allocation.gpu_id)
        .where(Allocation.job_id.in_(attempts), Allocation.released_at.is_(None))
        .order_by(Allocation.job_id, Allocation.rank, Gpu.index)
    ).all()
    per_job: dict[int, list[tuple[str, str | None, int | None, int, int]]] = {}
    for job_id, attempt, node, hostname, index, share, rank in rows:
        if attempt == attempts[job_id]:
            per_job.setdefault(job_id, []).append((node, hostname, index, share, rank))
    return [
        d for job in jobs for d in _run_messages(job, per_job.get(job.id, []), accounts[job.id])
    ]


def _run_messages(
    job: Job, rows: list[tuple[str, str | None, int | None, int, int]], unix_user: str
) -> list[Dispatch]:
    if not rows:
        return []
    ranks: dict[int, tuple[str, str, list[int]]] = {}
    share_milli = 1000
    for node, hostname, index, share, rank in rows:
        entry = ranks.setdefault(rank, (node, hostname or "127.0.0.1", []))
        if index is not None:
            entry[2].append(index)
        share_milli = share
    nodes = [ranks[r] for r in sorted(ranks)]
    per_node = len(nodes[0][2])
    return [
        Dispatch(
            node=node,
            payload={
                "job_id": job.id,
                "attempt": job.attempt,
                "node": node,
                "command": job.command,
                "script": job.script,
                "workdir": job.workdir,
                "env": job.env,
                "gpu_indices": gpus,
                "share": share_milli / 1000,
                "gpu_memory_mb": job.gpu_memory_mb,
                "max_runtime_s": job.max_runtime_s,
                "grace_s": job.grace_s,
                "master_addr": nodes[0][1],
                "master_port": master_port(job.id, job.attempt),
                "world_size": per_node * len(nodes) if per_node else len(nodes),
                "node_rank": rank,
                "nproc_per_node": per_node or 1,
                # The owner's Unix account, which a root agent runs the job as.
                "unix_user": unix_user,
            },
        )
        for rank, (node, _host, gpus) in enumerate(nodes)
    ]


def stop_messages(
    session: Session, *, job_id: int, attempt: int, reason: str, grace_s: int | None = None
) -> list[Dispatch]:
    """stop_job for every node that holds the attempt; `grace_s` shortens the job's own
    grace period (0: SIGKILL now)."""
    return stop_messages_many(session, {job_id: attempt}, reason=reason, grace_s=grace_s)


# Jobs per query: a bulk cancel of an array may name tens of thousands.
_STOP_CHUNK = 5000


def stop_messages_many(
    session: Session, attempts: Mapping[int, int], *, reason: str, grace_s: int | None = None
) -> list[Dispatch]:
    """stop_messages for many jobs (job id -> attempt), one query per few thousand:
    a bulk cancel of a running array reads each job's nodes in one go, not one by one."""
    out: list[Dispatch] = []
    for job_id, attempt, node in _placed_nodes(session, attempts):
        payload: dict[str, Any] = {"job_id": job_id, "attempt": attempt, "reason": reason}
        if grace_s is not None:
            payload["grace_s"] = grace_s
        out.append(Dispatch(node=node, payload=payload))
    return out


def time_limit_messages(session: Session, *, job: Job) -> list[Dispatch]:
    """set_time_limit for every node of a placed job's current attempt: its new limit."""
    payload = {"job_id": job.id, "attempt": job.attempt, "max_runtime_s": job.max_runtime_s}
    return [
        Dispatch(node=node, payload=payload)
        for _, _, node in _placed_nodes(session, {job.id: job.attempt})
    ]


def _placed_nodes(session: Session, attempts: Mapping[int, int]) -> Iterator[tuple[int, int, str]]:
    """(job id, attempt, node) for each node holding an allocation of the attempts given."""
    ids = sorted(attempts)
    for start in range(0, len(ids), _STOP_CHUNK):
        rows = session.execute(
            select(Allocation.job_id, Allocation.attempt, Node.name)
            .join(Node, Allocation.node_id == Node.id)
            .where(
                Allocation.job_id.in_(ids[start : start + _STOP_CHUNK]),
                Allocation.released_at.is_(None),
            )
            .distinct()
            .order_by(Allocation.job_id, Node.name)
        )
        for job_id, attempt, node in rows:
            if attempts[job_id] == attempt:  # not an older attempt's rows
                yield job_id, attempt, node


def released_gates(session: Session) -> list[Dispatch]:
    """Jobs placed behind preemptions whose victims have all exited: clear the gate and
    return their run_job messages (the caller commits, then sends)."""
    dispatches = []
    for job in session.scalars(
        select(Job).where(Job.status == JobStatus.SCHEDULED, Job.dispatch_after.is_not(None))
    ):
        victims = job.dispatch_after or []
        still_running = session.scalar(
            select(Job.id).where(Job.id.in_(victims), Job.status.in_(ACTIVE)).limit(1)
        )
        if still_running is None:
            job.dispatch_after = None
            dispatches.extend(run_messages(session, job=job))
    return dispatches
