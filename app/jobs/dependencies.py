"""Job dependencies, as sbatch --dependency=afterok, afterany, afternotok, after or
singleton.

A job with `depends_on` starts only once every job it names has ended as its kind asks:
succeeded (afterok, the default), ended in any way (afterany: a cleanup or notification
step), or ended without success (afternotok: a fallback). Once one of them has ended
otherwise, it never will: the job is cancelled, as Slurm does with kill_invalid_depend,
rather than left pending for ever. With `after`, it waits only for them to start (be
placed on GPUs) or end, as Slurm's `after:ID`: a monitor or an evaluator beside a run.

A singleton job names no jobs: it waits while another job of its user with its name is
placed, or one submitted before it as a singleton has not ended, so that such jobs run one
at a time in submit order (a cron line that must not overlap its previous run).

The rules (`judge`, `singleton_wait`) are pure; `load_dependencies` and `load_namesakes`
are the reads that feed them, shared by submission (app/jobs/submission.py) and the cycle
(app/cycle/dependencies.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.jobs.models import Job
from app.jobs.states import ACTIVE, AFTER_START, FINISHED, SINGLETON, JobStatus

# How a job waiting on another says what it waits for.
_WAITS_FOR: dict[str, str] = {
    "afterok": "succeed",
    "afterany": "end",
    "afternotok": "fail",
    AFTER_START: "start",
}


@dataclass(frozen=True, slots=True)
class Dependency:
    """The job another waits for, as it stands now."""

    id: int
    name: str
    status: JobStatus
    finished_at: datetime | None
    placed_at: datetime | None = None  # when its current attempt got its GPUs


@dataclass(frozen=True, slots=True)
class Verdict:
    met: bool
    # Some dependency ended without success (or is gone): the job can never start.
    broken: bool
    # All met: when the last one succeeded, or ended or started as the kind asks (the job
    # is eligible from then on).
    met_at: datetime | None
    message: str


def judge(
    depends_on: Sequence[int], jobs: Mapping[int, Dependency], kind: str = "afterok"
) -> Verdict:
    """Where a job with these dependencies of this kind stands, given the jobs they name.

    A FAILED dependency has ended: a failure with retries left goes back to PENDING in the
    same transaction, so a stored FAILED has none left."""
    waiting: list[Dependency] = []
    met_at: datetime | None = None
    for job_id in depends_on:
        job = jobs.get(job_id)
        if job is None:
            return _broken(f"job {job_id} it depends on no longer exists")
        if kind == AFTER_START and job.status in ACTIVE:
            at = job.placed_at
        elif job.status not in FINISHED:
            waiting.append(job)
            continue
        elif satisfies(kind, job.status):
            # `after` was met when the job started, or, if it never did, when it ended.
            at = (job.placed_at or job.finished_at) if kind == AFTER_START else job.finished_at
        else:
            return _broken(f"job {job.id} ({job.name}) it depends on ended {job.status}")
        if at is not None and (met_at is None or at > met_at):
            met_at = at
    if not waiting:
        return Verdict(met=True, broken=False, met_at=met_at, message="")
    first = waiting[0]
    more = f" and {len(waiting) - 1} more" if len(waiting) > 1 else ""
    message = f"waiting for job {first.id} ({first.name}){more} to {_WAITS_FOR[kind]}"
    return Verdict(met=False, broken=False, met_at=None, message=message)


def satisfies(kind: str, ended: JobStatus) -> bool:
    """Whether a dependency that ended this way lets a job of this kind start."""
    if kind in ("afterany", AFTER_START):
        return True
    return (ended is JobStatus.SUCCEEDED) == (kind == "afterok")


def _broken(message: str) -> Verdict:
    return Verdict(met=False, broken=True, met_at=None, message=message)


# Ids per query: jobs waiting on whole arrays can name tens of thousands, more than a
# statement may bind (SQLite 32,766, PostgreSQL 65,535).
_LOAD_CHUNK = 5000


def load_dependencies(session: Session, ids: Iterable[int]) -> dict[int, Dependency]:
    wanted = sorted(set(ids))
    loaded: dict[int, Dependency] = {}
    for start in range(0, len(wanted), _LOAD_CHUNK):
        chunk = wanted[start : start + _LOAD_CHUNK]
        for row in session.execute(
            select(
                Job.id, Job.name, Job.array_index, Job.status, Job.finished_at, Job.scheduled_at
            ).where(Job.id.in_(chunk))
        ):
            # An array's tasks share a name: "waiting for job 14 (sweep[2])" says which.
            name = row.name if row.array_index is None else f"{row.name}[{row.array_index}]"
            loaded[row.id] = Dependency(
                row.id, name, JobStatus(row.status), row.finished_at, row.scheduled_at
            )
    return loaded


@dataclass(frozen=True, slots=True)
class Namesake:
    """A job that has not ended, of some user and name a singleton job has."""

    id: int
    status: JobStatus
    singleton: bool


def singleton_wait(job_id: int | None, name: str, namesakes: Sequence[Namesake]) -> str | None:
    """Why the singleton job `job_id` (None: not submitted yet, so after all of them) must
    wait, or None when it may be queued: none of its namesakes is placed, and none
    submitted before it as a singleton has not ended."""
    for other in namesakes:
        if other.id == job_id:
            continue
        earlier_singleton = other.singleton and (job_id is None or other.id < job_id)
        if other.status in ACTIVE or earlier_singleton:
            return f"waiting for job {other.id} ({name}) to end: one job named {name!r} at a time"
    return None


def singleton_verdict(job_id: int, name: str, namesakes: Sequence[Namesake]) -> Verdict:
    """singleton_wait as a cycle's verdict on a waiting singleton: it never breaks, and
    it is met (from now: the time it waited counts) once nothing holds it back."""
    wait = singleton_wait(job_id, name, namesakes)
    return Verdict(met=wait is None, broken=False, met_at=None, message=wait or "")


def load_namesakes(
    session: Session, *, users: Iterable[int], names: Iterable[str]
) -> dict[tuple[int, str], list[Namesake]]:
    """The jobs that have not ended of these users with these names, by (user, name), in
    id order."""
    found: dict[tuple[int, str], list[Namesake]] = {}
    rows = session.execute(
        select(Job.id, Job.user_id, Job.name, Job.status, Job.dependency_kind)
        .where(
            Job.status.in_([status for status in JobStatus if status not in FINISHED]),
            Job.user_id.in_(set(users)),
            Job.name.in_(set(names)),
        )
        .order_by(Job.id)
    )
    for row in rows:
        namesake = Namesake(row.id, JobStatus(row.status), row.dependency_kind == SINGLETON)
        found.setdefault((row.user_id, row.name), []).append(namesake)
    return found
