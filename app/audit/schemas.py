from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class AuditEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    at: datetime
    actor: str
    action: str
    target: str
    info: dict[str, Any]


class AuditPage(BaseModel):
    items: list[AuditEventOut]
    # Pass as `before` for the next (older) page; null on the last page.
    next_before: int | None
