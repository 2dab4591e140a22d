"""A job's notifications as its owner reads them: each message and how its delivery went
(as a webhook's "recent deliveries" page), so a hook that never fired can be told apart
from one that failed."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.notifications.models import MAX_ATTEMPTS, Notification
from app.paging import Page, count

DeliveryState = Literal["queued", "retrying", "delivered", "given_up"]


class NotificationOut(BaseModel):
    id: int
    event: str = Field(description="start | end | fail | requeue")
    url: str
    state: DeliveryState
    attempts: int
    created_at: datetime
    sent_at: datetime | None = Field(description="when it was delivered")
    next_at: datetime | None = Field(
        description="when it is tried (again); null once delivered or given up"
    )
    error: str | None = Field(description="why the last try failed")


def delivery_state(*, sent: bool, attempts: int) -> DeliveryState:
    if sent:
        return "delivered"
    if attempts >= MAX_ATTEMPTS:
        return "given_up"
    return "retrying" if attempts else "queued"


def deliveries(
    *, session: Session, job_id: int, page: Page = Page()
) -> tuple[list[NotificationOut], int]:
    """A page of the job's messages, oldest first, and how many it has."""
    query = select(Notification).where(Notification.job_id == job_id)
    messages = session.scalars(page.of(query.order_by(Notification.id)))
    out = []
    for m in messages:
        state = delivery_state(sent=m.sent_at is not None, attempts=m.attempts)
        out.append(
            NotificationOut(
                id=m.id,
                event=m.event,
                url=m.url,
                state=state,
                attempts=m.attempts,
                created_at=m.created_at,
                sent_at=m.sent_at,
                next_at=m.next_at if state in ("queued", "retrying") else None,
                error=m.error,
            )
        )
    return out, count(session, query)
