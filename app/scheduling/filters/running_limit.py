"""Job x owner filter: the job keeps its user and its project within their running limits.

Slurm's association limits: MaxJobs and MaxTRES=gres/gpu per user, GrpJobs and
GrpTRES=gres/gpu per account (our project). A job over a limit waits, saying which
limit and the count; it is not refused, and it neither takes a backfill reservation
nor preempts (its own limit holds it back, not the cluster). GPUs are counted as the
quota counts them, in thousandths (a shared job holds its share on each of its GPUs).

Counts are what runs at the snapshot plus what this cycle has placed
(`CycleState.limit_jobs`, `limit_milli`, kept by placement.commit). A job preempted in
the cycle still counts until it has exited: the limit errs on the side of holding back.

`fits` is the one test; `block` words the reason for the planner and the explanation.
"""

from __future__ import annotations

Limits = tuple[int | None, int | None]  # (max running jobs, max GPUs); None: no limit

NO_LIMITS: Limits = (None, None)


def fits(limits: Limits, jobs: int, milli: int, need_milli: int) -> bool:
    """Whether one more job holding `need_milli` stays within `limits`, on top of `jobs`
    running jobs holding `milli`."""
    max_jobs, max_gpus = limits
    return (max_jobs is None or jobs + 1 <= max_jobs) and (
        max_gpus is None or milli + need_milli <= max_gpus * 1000
    )


def block(what: str, limits: Limits, jobs: int, milli: int, need_milli: int) -> str | None:
    """Why one more job of `what` ("user alice", "project ml") may not run now, naming
    the limit and the count; None if it fits."""
    if fits(limits, jobs, milli, need_milli):
        return None
    max_jobs, max_gpus = limits
    if max_jobs is not None and jobs + 1 > max_jobs:
        return (
            f"{what} may run {max_jobs} job{'' if max_jobs == 1 else 's'} at once "
            f"({jobs} running; a limit an admin set)"
        )
    need = need_milli / 1000
    return (
        f"{what} may use {max_gpus} GPU{'' if max_gpus == 1 else 's'} at once "
        f"({milli / 1000:g} in use, this job needs {need:g}; a limit an admin set)"
    )
