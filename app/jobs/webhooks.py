"""The sender: delivers the outbox's messages (app/jobs/outbox.py) to their webhooks, run by
the scheduler's beat; one given up is noted on its job."""

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
from app.notifications.hosts import Refused, delivery_address, host_allowed
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
    and the job's history says so. Its owner reads "delivery failed"; the server's log
    says why."""
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
        failure = _deliver(url, body, allowed_hosts)
        with factory.begin() as session:
            message = session.get(Notification, message_id)
            if message is not None:  # else its job was deleted meanwhile (retention)
                _record(session, message, failure, now=now, report=report)
    return report


# What a user reads of a failed delivery: the reason (refused, connection refused, a
# timeout, HTTP 401) would tell them what answers inside the network. The server's log
# has it.
DELIVERY_FAILED = "delivery failed"


@dataclass(frozen=True, slots=True)
class _Failure:
    detail: str  # for the server's log
    shown: str = DELIVERY_FAILED  # for the job's owner
    hopeless: bool = False  # no retry: it would fail the same way


def _deliver(url: str, body: dict[str, Any], allowed: frozenset[str]) -> _Failure | None:
    """None when delivered, else why not. The host is resolved and checked now, and the
    message sent to the address checked (see hosts.py); a redirect is not followed."""
    if not host_allowed(url, allowed):
        why = "host no longer allowed (GPUSCHED_NOTIFY_HOSTS)"
        return _Failure(why, shown=why, hopeless=True)
    try:
        address = delivery_address(url, allowed)
    except Refused as exc:
        return _Failure(str(exc))
    target = httpx.URL(url)
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    try:
        # trust_env=False: an HTTP(S)_PROXY in the environment would resolve the name
        # again, and the check would be for nothing.
        with httpx.Client(timeout=TIMEOUT_S, follow_redirects=False, trust_env=False) as client:
            response = client.post(
                target.copy_with(host=str(address)),
                json=body,
                headers={"Host": target.netloc.decode("ascii")},
                extensions=extensions,  # TLS: the certificate is checked for the name
            )
    except httpx.HTTPError as exc:
        return _Failure(f"no answer from {address}: {exc}")
    status = response.status_code
    return None if 200 <= status < 300 else _Failure(f"HTTP {status} from {address}")


def _record(
    session: Session,
    message: Notification,
    failure: _Failure | None,
    *,
    now: datetime,
    report: SendReport,
) -> None:
    message.attempts += 1
    if failure is None:
        message.sent_at, message.error = now, None
        report.sent += 1
        return
    host = urlsplit(message.url).hostname
    log.warning(
        "job %s: %s notification to %s, try %d: %s",
        message.job_id,
        message.event,
        host,
        message.attempts,
        failure.detail,
    )
    message.error = failure.shown
    if failure.hopeless or message.attempts >= MAX_ATTEMPTS:
        tries = "" if failure.hopeless else f" after {message.attempts} tries"
        message.attempts = MAX_ATTEMPTS  # taken no more
        report.given_up += 1
        _note_given_up(session, message, f"{tries}: {failure.shown}")
        log.warning("job %s: %s notification given up", message.job_id, message.event)
        return
    message.next_at = now + timedelta(seconds=_FIRST_RETRY_S * 2 ** (message.attempts - 1))
    report.failed += 1


def _note_given_up(session: Session, message: Notification, why: str) -> None:
    job = session.get(Job, message.job_id)
    if job is not None:
        host = urlsplit(message.url).hostname
        reason = f"{message.event} notification to {host} not delivered{why}"
        note(session, job=job, actor="scheduler", reason=reason)
