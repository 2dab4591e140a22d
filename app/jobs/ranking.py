"""A waiting job's place in the queue and why (GET /api/v1/jobs/{id}/rank), as Slurm's
sprio: computed on demand from the database, with the queue policy the cycle stored on
its lease, through the core's own order (`order_jobs`) and its explanation (`rank_of`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.cycle import lease
from app.cycle.settings import ranked_by
from app.cycle.snapshot import ClockGates, read_snapshot
from app.errors import Conflict
from app.jobs.schemas import RankAhead, RankOut
from app.jobs.service import get
from app.jobs.states import JobStatus
from app.scheduling.queue import order_jobs
from app.scheduling.rank import AHEAD_TEXT, rank_of


def rank(*, session: Session, principal: Principal, job_id: int, now: datetime) -> RankOut:
    job = get(session=session, principal=principal, job_id=job_id)
    if job.status != JobStatus.PENDING:
        raise Conflict(f"job {job_id} is {job.status}: only a waiting job has a place in the queue")
    if job.held_by is not None:
        raise Conflict(f"job {job_id} is held by {job.held_by}: it is ranked once released")
    stored = lease.ranking(session)
    if stored is None:
        raise Conflict("the scheduler has not ranked the queue yet: is it running?")
    policy, half_life_s = ranked_by(stored)
    # Ranked among the jobs the cycle ranks: a job whose begin time is ahead is not yet.
    snapshot = read_snapshot(
        session=session, now=now, half_life_s=half_life_s, gates=ClockGates(now=now)
    ).snapshot
    session.rollback()  # end the read transaction
    order = order_jobs(
        snapshot.pending,
        settings=policy,
        projects={p.name: p for p in snapshot.projects},
        running=snapshot.running,
        history=snapshot.runtime_history,
        now=now,
    )
    found = rank_of(order, job_id, settings=policy, history=snapshot.runtime_history, now=now)
    if found is None:  # waits for its dependencies, its array's limit or its begin time
        raise Conflict(f"job {job_id} is not in the queue yet: {job.pending_message}")
    return RankOut(
        job_id=job_id,
        policy=policy.queue_policy,
        position=found.position,
        waiting=found.waiting,
        ahead=[RankAhead(rule=r, jobs=n, text=AHEAD_TEXT[r]) for r, n in found.ahead],
        expected_gpu_s=found.expected_gpu_s,
        expected_from=found.expected_from,
        waited_s=found.waited_s,
        starving=found.starving,
        message=found.message,
    )
