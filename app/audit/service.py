"""Recording administrative changes and reading them back (newest first)."""

from __future__ import annotations

import getpass
import os
import socket
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.audit.models import AuditEvent
from app.audit.schemas import AuditEventOut, AuditPage


def record(
    *, session: Session, actor: str, action: str, target: str, info: dict[str, Any] | None = None
) -> None:
    """Add the record to the caller's transaction: it commits or rolls back with the change."""
    session.add(AuditEvent(actor=actor, action=action, target=target, info=info or {}))


def local_actor(command: str) -> str:
    """Who made a change outside the API (admin commands, the first start): the OS user and
    host that ran `command`, since no API user is involved."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name, e.g. a container user without passwd entry
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()} ({command})"[:128]


def changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """{"field": {"from": old, "to": new}} for every field of `after` whose value differs."""
    return {k: {"from": before.get(k), "to": v} for k, v in after.items() if before.get(k) != v}


def list_events(
    *,
    session: Session,
    limit: int,
    before: int | None = None,
    target: str | None = None,
    action: str | None = None,
) -> AuditPage:
    query = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit + 1)
    if before is not None:
        query = query.where(AuditEvent.id < before)
    if target is not None:
        query = query.where(AuditEvent.target == target)
    if action is not None:
        query = query.where(AuditEvent.action == action)
    rows = list(session.scalars(query))
    more = len(rows) > limit
    rows = rows[:limit]
    return AuditPage(
        items=[AuditEventOut.model_validate(r) for r in rows],
        next_before=rows[-1].id if more else None,
    )
