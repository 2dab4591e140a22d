"""The installation's id: one row of its database (migration 0022)."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.installation.models import Installation


def installation_id(*, session: Session) -> str:
    """The id (made by the migration; made here for a database that lost its row)."""
    found = session.scalar(select(Installation.id).order_by(Installation.created_at).limit(1))
    if found is None:
        found = uuid.uuid4().hex
        session.add(Installation(id=found))
        session.flush()
    return found
