"""The orders agents get about jobs (run, stop, time limit), built from database rows, and
`AfterCommit`: what a service's transaction leaves to be done once it has committed.

Building an order is pure reading. Services and the live loop return an AfterCommit;
the caller commits (or the service did), then hands it to `Messenger.send`, the one
function that sends.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.auth.models import User
from app.jobs.models import Job
from app.jobs.states import ACTIVE, JobStatus
from app.nodes.models import Allocation, Gpu, Node
from app.wire import Order, RunJob, SetTimeLimit, StopJob, StopReason

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class AfterCommit:
    """What must happen once a transaction has committed: orders to agents, and whether
    a scheduling cycle is wanted (GPUs freed, a job queued or changed)."""

    orders: tuple[Order, ...] = ()
    cycle: bool = False

    @classmethod
    def of(cls, orders: Iterable[Order] = (), *, cycle: bool = False) -> AfterCommit:
        return cls(orders=tuple(orders), cycle=cycle)

    def __add__(self, other: AfterCommit) -> AfterCommit:
        return AfterCommit(orders=self.orders + other.orders, cycle=self.cycle or other.cycle)

    def __bool__(self) -> bool:
        return bool(self.orders) or self.cycle

    def of_type(self, kind: type[T]) -> list[T]:
        return [order for order in self.orders if isinstance(order, kind)]


NOTHING = AfterCommit()


@dataclass(frozen=True, slots=True)
class Changed(Generic[T]):
    """A service's result, and what its caller sends after the commit."""

    value: T
    after: AfterCommit = NOTHING


def master_port(job_id: int, attempt: int) -> int:
    """A port every rank of a gang derives alike, spread to avoid clashes between jobs."""
    return 20000 + (job_id * 31 + attempt) % 20000


def run_orders(session: Session, *, jobs: Sequence[Job]) -> list[RunJob]:
    """run_job for every node of each job's current attempt, from its allocations and its
    owner's account (one query for all)."""
    if not jobs:
        return []
    attempts = {job.id: job.attempt for job in jobs}
    rows = session.execute(
        select(
            Allocation.job_id,
            Allocation.attempt,
            Node.name,
            Node.hostname,
            Gpu.index,
            Allocation.share_milli,
            Allocation.rank,
            # Each job runs as its owner's Unix account (as they map it now).
            User.unix_user,
        )
        .join(Node, Node.id == Allocation.node_id)
        .outerjoin(Gpu, Gpu.id == Allocation.gpu_id)
        .join(Job, Job.id == Allocation.job_id)
        .join(User, User.id == Job.user_id)
        .where(Allocation.job_id.in_(attempts), Allocation.released_at.is_(None))
        .order_by(Allocation.job_id, Allocation.rank, Gpu.index)
    ).all()
    per_job: dict[int, list[tuple[str, str | None, int | None, int, int]]] = {}
    accounts: dict[int, str] = {}
    for job_id, attempt, node, hostname, index, share, rank, unix_user in rows:
        if attempt == attempts[job_id]:
            per_job.setdefault(job_id, []).append((node, hostname, index, share, rank))
            accounts[job_id] = unix_user
    return [
        order
        for job in jobs
        if job.id in per_job
        for order in _run_orders(job, per_job[job.id], accounts[job.id])
    ]


def _run_orders(
    job: Job, rows: list[tuple[str, str | None, int | None, int, int]], unix_user: str
) -> list[RunJob]:
    ranks: dict[int, tuple[str, str, list[int]]] = {}
    share_milli = 1000
    for node, hostname, index, share, rank in rows:
        entry = ranks.setdefault(rank, (node, hostname or "127.0.0.1", []))
        if index is not None:
            entry[2].append(index)
        share_milli = share
    nodes = [ranks[r] for r in sorted(ranks)]
    per_node = len(nodes[0][2])
    command = job.command if isinstance(job.command, str) else tuple(job.command)
    return [
        RunJob(
            node=node,
            job_id=job.id,
            attempt=job.attempt,
            command=command,
            script=job.script,
            workdir=job.workdir,
            env=dict(job.env or {}),
            gpu_indices=tuple(gpus),
            share=share_milli / 1000,
            gpu_memory_mb=job.gpu_memory_mb,
            max_runtime_s=job.max_runtime_s,
            grace_s=job.grace_s,
            master_addr=nodes[0][1],
            master_port=master_port(job.id, job.attempt),
            world_size=per_node * len(nodes) if per_node else len(nodes),
            node_rank=rank,
            nproc_per_node=per_node or 1,
            unix_user=unix_user,
        )
        for rank, (node, _host, gpus) in enumerate(nodes)
    ]


def stop_orders(
    session: Session,
    attempts: Mapping[int, int],
    *,
    reason: StopReason,
    grace_s: int | None = None,
) -> list[StopJob]:
    """stop_job for every node holding each attempt (job id -> attempt), a few thousand
    jobs per query: a bulk cancel of a running array reads their nodes in one go.
    `grace_s` shortens the job's own grace period (0: SIGKILL now)."""
    return [
        StopJob(node=node, job_id=job_id, attempt=attempt, reason=reason, grace_s=grace_s)
        for job_id, attempt, node in _placed_nodes(session, attempts)
    ]


def time_limit_orders(session: Session, *, job: Job) -> list[SetTimeLimit]:
    """set_time_limit for every node of a placed job's current attempt: its new limit."""
    return [
        SetTimeLimit(node=node, job_id=job.id, attempt=job.attempt, max_runtime_s=job.max_runtime_s)
        for _, _, node in _placed_nodes(session, {job.id: job.attempt})
    ]


# Jobs per query: a bulk cancel of an array may name tens of thousands.
_STOP_CHUNK = 5000


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


def released_gates(session: Session) -> list[RunJob]:
    """Jobs placed behind preemptions whose victims have all exited: clear the gate and
    return their run_job orders (the caller commits, then sends)."""
    gated = []
    for job in session.scalars(
        select(Job).where(Job.status == JobStatus.SCHEDULED, Job.dispatch_after.is_not(None))
    ):
        # [victim, the attempt being stopped] each (a bare id: written before attempts
        # were kept). A victim back in line and placed again is on a later attempt: the
        # one stopped has ended, though the job is active again.
        stopping: dict[int, int | None] = {}
        for victim in job.dispatch_after or []:
            if isinstance(victim, list):
                stopping[victim[0]] = victim[1]
            else:
                stopping[victim] = None
        still_running = any(
            status in ACTIVE and stopping[victim] in (None, attempt)
            for victim, status, attempt in session.execute(
                select(Job.id, Job.status, Job.attempt).where(Job.id.in_(stopping))
            )
        )
        if not still_running:
            job.dispatch_after = None
            gated.append(job)
    return run_orders(session, jobs=gated)


def placed_on(session: Session, *, job_id: int, attempt: int, node: str) -> bool:
    """Whether `node` holds (or held) GPUs of this attempt: a node reports only on those."""
    return (
        session.scalar(
            select(Allocation.id)
            .join(Node, Node.id == Allocation.node_id)
            .where(Allocation.job_id == job_id, Allocation.attempt == attempt, Node.name == node)
            .limit(1)
        )
        is not None
    )
