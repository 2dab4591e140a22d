"""What a job's state change queues: called by the one function that changes a job's
state (`lifecycle.transition`), in its transaction, so no message is lost whatever fails
after."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.auth.models import User
from app.jobs.models import Job
from app.jobs.states import FINISHED, JobStatus
from app.notifications.models import Notification
from app.projects.models import Project

# A job back in the queue from one of these was requeued (preempted, asked for, its node
# lost, or retried after a failure), as Slurm's REQUEUE mail.
_REQUEUED_FROM = frozenset({JobStatus.PREEMPTED, JobStatus.LOST, JobStatus.FAILED})


def event_for(
    job: Job,
    to: JobStatus,
    *,
    ends: bool,
    others: Sequence[JobStatus] | None = None,
    came_from: JobStatus | None = None,
) -> str | None:
    """Which of the job's `notify_on` events a change from `came_from` to `to` is, if any.
    `ends`: the change is the job's end (not a failure it is retried after, as Slurm's
    requeue is not END). A requeue is announced for each task of an array: each is its
    own interruption.

    `others`: the statuses of the other tasks of its array (None: not a task). An array
    is announced as a whole, as Slurm does without ARRAY_TASKS: when its first task
    starts, and when its last task ends (`fail`: if any task did not succeed)."""
    wanted = job.notify_on or ()
    if to is JobStatus.PENDING:
        # Not when it passes through PENDING on its way to CANCELLED (a cancel asked for
        # while it was being stopped).
        requeued = came_from in _REQUEUED_FROM and job.cancel_requested_at is None
        return "requeue" if "requeue" in wanted and requeued else None
    if to is JobStatus.RUNNING:
        first = others is None or not any(s is JobStatus.RUNNING or s in FINISHED for s in others)
        return "start" if "start" in wanted and first else None
    if not ends:
        return None
    if others is not None and any(s not in FINISHED for s in others):
        return None  # not the array's last task to end
    if "end" in wanted:
        return "end"
    failed = any(s is not JobStatus.SUCCEEDED for s in [to, *(others or ())])
    return "fail" if "fail" in wanted and failed else None


def queue_for(
    session: Session,
    *,
    job: Job,
    came_from: JobStatus | None,
    to: JobStatus,
    ends: bool,
    now: datetime,
) -> None:
    """Queue the message a change of `job` to `to` calls for, in the caller's transaction."""
    if job.notify_url is None:
        return
    others = None
    if job.array_id is not None:
        others = list(
            session.scalars(
                select(Job.status).where(Job.array_id == job.array_id, Job.id != job.id)
            )
        )
    event = event_for(job, to, ends=ends, others=others, came_from=came_from)
    if event is None:
        return
    user = session.scalar(select(User.name).where(User.id == job.user_id))
    project = session.scalar(select(Project.name).where(Project.id == job.project_id))
    tasks = None
    if others is not None and event != "requeue":
        tasks = Counter(str(s) for s in [to, *others])
    session.add(
        Notification(
            job_id=job.id,
            event=event,
            url=job.notify_url,
            body=_body(
                job,
                to,
                event,
                came_from=came_from,
                user=user or "?",
                project=project or "?",
                tasks=tasks,
            ),
            created_at=now,
            next_at=now,
            attempts=0,
        )
    )


def _body(
    job: Job,
    to: JobStatus,
    event: str,
    *,
    came_from: JobStatus | None,
    user: str,
    project: str,
    tasks: Counter[str] | None,
) -> dict[str, Any]:
    # "text" is what chat webhooks (Slack, Mattermost, Rocket.Chat) show; "job" is for code.
    what = f"job {job.id}" if tasks is None else f"array {job.array_id}"
    ended = event in ("end", "fail")
    if event == "start":
        text = f"{what} ({job.name}) of {user} started"
    elif event == "requeue":
        text = f"{what} ({job.name}) of {user} is back in the queue (attempt {job.attempt}: {came_from})"
    elif tasks is not None:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(tasks.items()))
        text = f"{what} ({job.name}) of {user} ended: {counts}"
    else:
        code = f", exit code {job.exit_code}" if job.exit_code is not None else ""
        text = f"{what} ({job.name}) of {user} ended: {to}{code}"
    body: dict[str, Any] = {
        "text": text,
        "event": event,
        "job": {
            "id": job.id,
            "name": job.name,
            "user": user,
            "project": project,
            "status": str(to),
            "exit_code": job.exit_code if event != "start" else None,
            "attempt": job.attempt,
            "started_at": _iso(job.started_at),
            "finished_at": _iso(job.finished_at) if ended else None,
        },
    }
    if tasks is not None:  # the task that started or ended last, and its array
        body["array"] = {"id": job.array_id, "tasks": dict(sorted(tasks.items()))}
    return body


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()
