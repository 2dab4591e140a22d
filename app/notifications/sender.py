"""The sender: delivers the outbox's messages, run by the scheduler's beat."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.jobs.lifecycle import note
from app.jobs.models import Job
from app.notifications.hosts import host_allowed
from app.notifications.models import MAX_ATTEMPTS, Notification

log = logging.getLogger("gpusched.notifications")

NOTIFY_INTERVAL_S = 5.0  # how often the scheduler's beat sends what is due
_FIRST_RETRY_S = 30.0  # then doubled: 30 s, 1, 2 and 4 minutes
_CLAIM_S = 60.0  # how long a taken message is left alone by other senders
_BATCH = 50
TIMEOUT_S = 5.0


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
    if job is not None:
        host = urlsplit(message.url).hostname
        reason = f"{message.event} notification to {host} not delivered{why}"
        note(session, job=job, actor="scheduler", reason=reason)
