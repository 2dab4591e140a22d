from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, JSONType, UTCDateTime, utcnow


class AuditEvent(Base):
    """One administrative change, as Slurm's `sacctmgr list transactions`: when, who, what
    and on which object. Written in the transaction of the change itself, so a change
    without its record (or a record of a change rolled back) cannot exist."""

    __tablename__ = "audit_event"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # An API user's name, or "os-user@host (gpusched admin)" for the database-side CLI.
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(32))  # e.g. project.update, node.drain
    target: Mapped[str] = mapped_column(String(128))  # the project, node, window or user name
    # What changed: {"field": {"from": old, "to": new}} for updates, the settings otherwise.
    info: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
