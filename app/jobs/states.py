"""Job states and the legal transitions between them (pure; no database)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


class JobStatus(StrEnum):
    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"
    PREEMPTED = "PREEMPTED"
    LOST = "LOST"


S = JobStatus

# PREEMPTED and LOST are way stations: the job goes back to PENDING without spending a
# retry (a preemption is the scheduler's choice, a lost node the node's failure, as Slurm
# requeues a batch job on node failure), unless a cancel came meanwhile. FAILED may go
# back to PENDING for a retry.
ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    S.PENDING: frozenset({S.SCHEDULED, S.CANCELLED}),
    # SCHEDULED -> PENDING: the dispatch could not be delivered and the allocation was undone.
    S.SCHEDULED: frozenset({S.RUNNING, S.PENDING, S.CANCELLED, S.LOST, S.PREEMPTED, S.FAILED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT, S.PREEMPTED, S.LOST}),
    S.PREEMPTED: frozenset({S.PENDING, S.FAILED}),
    # LOST -> SUCCEEDED: its node was only late, and reports that the attempt succeeded
    # before the requeue ran it again (app/jobs/agent_reports.py late_success).
    S.LOST: frozenset({S.PENDING, S.FAILED, S.SUCCEEDED}),
    S.FAILED: frozenset({S.PENDING}),
    S.SUCCEEDED: frozenset(),
    S.CANCELLED: frozenset(),
    S.TIMED_OUT: frozenset(),
}

ACTIVE = frozenset({S.SCHEDULED, S.RUNNING})
FINISHED = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT})
# A job in these states may come back to PENDING; "retries" bounds how often it does.
RETRYABLE = frozenset({S.FAILED})

# How the jobs a job depends on must end (sbatch --dependency): succeed, end in any way,
# or end without success; or only start (after); or singleton: one job of a user's of the
# same name at a time (app/jobs/dependencies.py).
DependencyKind = Literal["afterok", "afterany", "afternotok", "after", "singleton"]
SINGLETON = "singleton"
# Waits for its dependencies to start (be placed), not to end: a monitor or an evaluator
# beside a training run.
AFTER_START = "after"
