"""A waiting job's place in the queue and why (GET /api/v1/jobs/{id}/rank), as Slurm's
sprio: as the last full cycle ranked it (app/cycle/ranks.py), looked up, not computed
per request. A job that arrived since is ranked by the next full cycle, and says when."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.cycle import ranks
from app.errors import Conflict
from app.jobs.models import Job
from app.jobs.queries import get
from app.jobs.schemas import RankAhead, RankOut
from app.jobs.states import JobStatus
from app.scheduling.rank import AHEAD_TEXT, Rank
from app.scheduling.types import ReasonKind

# Waiting, but outside the ranking until something else happens: its dependencies end,
# its array's tasks end, its begin time comes or its off-peak window opens (or, for one
# no opening is long enough for, the window or the job changes).
NOT_RANKABLE = frozenset(
    {
        ReasonKind.DEPENDENCY.value,
        ReasonKind.ARRAY_LIMIT.value,
        ReasonKind.BEGIN_TIME.value,
        ReasonKind.WINDOW_CLOSED.value,
        ReasonKind.NEVER_IN_WINDOW.value,
    }
)


def rank(*, session: Session, principal: Principal, job_id: int, now: datetime) -> RankOut:
    get(session=session, principal=principal, job_id=job_id)  # 404 / 403
    job = session.get(Job, job_id)
    assert job is not None  # found just now
    if job.status != JobStatus.PENDING:
        raise Conflict(f"job {job_id} is {job.status}: only a waiting job has a place in the queue")
    if job.held_by is not None:
        raise Conflict(f"job {job_id} is held by {job.held_by}: it is ranked once released")
    stored = ranks.last(session)
    if stored is None:
        raise Conflict("the scheduler has not ranked the queue yet: is it running?")
    found = stored.find(job_id)
    waited_s = max(0.0, (now - job.created_at).total_seconds() - (job.ineligible_s or 0))
    if found is None:
        if _outside_the_ranking(job, now=now):
            raise Conflict(f"job {job_id} is not in the queue yet: {job.pending_message}")
        return _not_ranked_yet(job_id, stored=stored, waited_s=waited_s, now=now)
    message = Rank(
        position=found.position,
        waiting=found.waiting,
        ahead=found.ahead,
        expected_gpu_s=found.expected_gpu_s,
        expected_from=found.expected_from,
        waited_s=waited_s,
        starving=found.starving,
        las_queue=found.las_queue,
    ).message
    return RankOut(
        job_id=job_id,
        policy=stored.ranking["policy"],
        position=found.position,
        waiting=found.waiting,
        ahead=[RankAhead(rule=r, jobs=n, text=AHEAD_TEXT[r]) for r, n in found.ahead],
        expected_gpu_s=found.expected_gpu_s,
        expected_from=found.expected_from,
        waited_s=waited_s,
        starving=found.starving,
        las_queue=found.las_queue,
        message=message,
        ranked=True,
        ranked_at=stored.ranked_at,
        next_ranking_at=stored.next_at,
    )


def _outside_the_ranking(job: Job, *, now: datetime) -> bool:
    if not job.dependencies_met or job.pending_reason in NOT_RANKABLE:
        return True
    return job.schedule_mode == "at" and job.begin_at is not None and job.begin_at > now


def _not_ranked_yet(
    job_id: int, *, stored: ranks.StoredRanking, waited_s: float, now: datetime
) -> RankOut:
    """Submitted (or back in line) since the last full cycle: ranked by the next one."""
    when = stored.next_at
    if when is not None and when > now:
        due = f"the next full cycle ranks it, within {_seconds(when - now)}"
    else:
        due = "the scheduler's next full cycle ranks it"
        when = None
    return RankOut(
        job_id=job_id,
        policy=stored.ranking["policy"],
        position=None,
        waiting=stored.waiting,
        ahead=[],
        expected_gpu_s=None,
        expected_from=None,
        waited_s=waited_s,
        starving=False,
        message=f"not ranked yet: {due}",
        ranked=False,
        ranked_at=stored.ranked_at,
        next_ranking_at=when,
    )


def _seconds(span: timedelta) -> str:
    return f"{max(1, round(span.total_seconds()))} s"
