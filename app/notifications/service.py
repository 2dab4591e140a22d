"""What a job's state change queues, and the sender that delivers the queue."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.auth.models import User
from app.jobs.models import Job, JobEvent
from app.jobs.states import FINISHED, JobStatus
from app.notifications.hosts import host_allowed
from app.notifications.models import Notification
from app.projects.models import Project

log = logging.getLogger("gpusched.notifications")

NOTIFY_INTERVAL_S = 5.0  # how often the scheduler's beat sends what is due
MAX_ATTEMPTS = 5
_FIRST_RETRY_S = 30.0  # then doubled: 30 s, 1, 2 and 4 minutes
_CLAIM_S = 60.0  # how long a taken message is left alone by other senders
_BATCH = 50
TIMEOUT_S = 5.0


def event_for(job: Job, to: JobStatus, others: Sequence[JobStatus] | None = None) -> str | None:
    """Which of the job's `notify_on` events a change to `to` is, if any. A failure the
    job is retried after is not its end (as Slurm's requeue is not END).

    `others`: the statuses of the other tasks of its array (None: not a task). An array
    is announced as a whole, as Slurm does without ARRAY_TASKS: when its first task
    starts, and when its last task ends (`fail`: if any task did not succeed)."""
    wanted = job.notify_on or ()
    if to is JobStatus.RUNNING:
        first = others is None or not any(s is JobStatus.RUNNING or s in FINISHED for s in others)
        return "start" if "start" in wanted and first else None
    if to not in FINISHED:
        return None
    if to is JobStatus.FAILED and job.failures < job.retries and job.cancel_requested_at is None:
        return None  # a retry follows (lifecycle.retries_left)
    if others is not None and any(s not in FINISHED for s in others):
        return None  # not the array's last task to end
    if "end" in wanted:
        return "end"
    ended = [to, *(others or ())]
    failed = any(s is not JobStatus.SUCCEEDED for s in ended)
    return "fail" if "fail" in wanted and failed else None


def queue_for(session: Session, *, job: Job, to: JobStatus, now: datetime) -> None:
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
    event = event_for(job, to, others)
    if event is None:
        return
    user = session.scalar(select(User.name).where(User.id == job.user_id))
    project = session.scalar(select(Project.name).where(Project.id == job.project_id))
    tasks = None if others is None else Counter(str(s) for s in [to, *others])
    session.add(
        Notification(
            job_id=job.id,
            event=event,
            url=job.notify_url,
            body=_body(job, to, event, user=user or "?", project=project or "?", tasks=tasks),
            created_at=now,
            next_at=now,
            attempts=0,
        )
    )


def _body(
    job: Job, to: JobStatus, event: str, *, user: str, project: str, tasks: Counter[str] | None
) -> dict[str, Any]:
    # "text" is what chat webhooks (Slack, Mattermost, Rocket.Chat) show; "job" is for code.
    what = f"job {job.id}" if tasks is None else f"array {job.array_id}"
    if event == "start":
        text = f"{what} ({job.name}) of {user} started"
    elif tasks is not None:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(tasks.items()))
        text = f"{what} ({job.name}) of {user} ended: {counts}"
    else:
        code = f", exit code {job.exit_code}" if job.exit_code is not None else ""
        text = f"{what} ({job.name}) of {user} ended: {to}{code}"
    times = {
        "started_at": job.started_at,
        "finished_at": job.finished_at if event != "start" else None,
    }
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
            **{k: v.isoformat() if v is not None else None for k, v in times.items()},
        },
    }
    if tasks is not None:  # the task that started or ended last, and its array
        body["array"] = {"id": job.array_id, "tasks": dict(sorted(tasks.items()))}
    return body


# --------------------------------------------------------------------------- sending


@dataclass
class SendReport:
    sent: int = 0
    failed: int = 0  # tried and to be retried
    given_up: int = 0


def send_due(
    *,
    factory: sessionmaker[Session],
    now: datetime,
    allowed_hosts: frozenset[str],
) -> SendReport:
    """Deliver the messages that are due: take them (a short transaction), POST each
    outside any transaction, then record how each went. A 2xx answer delivers it; any
    other answer or none is retried with backoff, and after MAX_ATTEMPTS it is given up
    and the job's history says so."""
    with factory.begin() as session:
        due = list(
            session.scalars(
                select(Notification)
                .where(Notification.sent_at.is_(None), Notification.attempts < MAX_ATTEMPTS)
                .where(Notification.next_at <= now)
                .order_by(Notification.id)
                .limit(_BATCH)
                .with_for_update(skip_locked=True)
            )
        )
        for claimed in due:
            claimed.next_at = now + timedelta(seconds=_CLAIM_S)
        taken = [(m.id, m.url, m.body) for m in due]
    report = SendReport()
    for message_id, url, body in taken:
        error = _deliver(url, body, allowed_hosts)
        with factory.begin() as session:
            message = session.get(Notification, message_id)
            if message is not None:  # else its job was deleted meanwhile (retention)
                _record(session, message, error, now=now, report=report)
    return report


def _deliver(url: str, body: dict[str, Any], allowed: frozenset[str]) -> str | None:
    """None when delivered, else why not."""
    if not host_allowed(url, allowed):
        return f"host {urlsplit(url).hostname} is no longer allowed (GPUSCHED_NOTIFY_HOSTS)"
    try:
        response = httpx.post(url, json=body, timeout=TIMEOUT_S, follow_redirects=False)
    except httpx.HTTPError as exc:
        return f"no answer: {exc}"
    status = response.status_code
    return None if 200 <= status < 300 else f"HTTP {status}"


def _record(
    session: Session, message: Notification, error: str | None, *, now: datetime, report: SendReport
) -> None:
    message.attempts += 1
    if error is None:
        message.sent_at, message.error = now, None
        report.sent += 1
        return
    message.error = error[:512]
    hopeless = error.startswith("host ")  # not a passing failure: no retry
    if hopeless or message.attempts >= MAX_ATTEMPTS:
        why = f": {error}" if hopeless else f" after {message.attempts} tries: {error}"
        message.attempts = MAX_ATTEMPTS  # taken no more
        report.given_up += 1
        _note_given_up(session, message, why)
        log.warning("job %s: %s notification given up: %s", message.job_id, message.event, error)
        return
    message.next_at = now + timedelta(seconds=_FIRST_RETRY_S * 2 ** (message.attempts - 1))
    report.failed += 1


def _note_given_up(session: Session, message: Notification, why: str) -> None:
    job = session.get(Job, message.job_id)
    if job is None:
        return
    host = urlsplit(message.url).hostname
    session.add(
        JobEvent(
            job_id=job.id,
            from_status=job.status,
            to_status=job.status,
            attempt=job.attempt,
            actor="scheduler",
            reason=f"{message.event} notification to {host} not delivered{why}",
        )
    )
