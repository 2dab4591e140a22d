from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import AdminUser, SessionDep
from app.audit import service
from app.audit.schemas import AuditPage

router = APIRouter(prefix="/api/v1", tags=["audit"])


@router.get("/audit", response_model=AuditPage)
def list_audit_events(
    session: SessionDep,
    _: AdminUser,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    before: Annotated[
        int | None, Query(ge=1, le=2**31 - 1, description="next_before of a newer page")
    ] = None,
    target: Annotated[str | None, Query(max_length=128)] = None,
    action: Annotated[str | None, Query(max_length=32)] = None,
) -> AuditPage:
    """Administrative changes, newest first: quotas and weights, project membership, user
    creation and token revocation, node drains, off-peak windows. Admins only."""
    return service.list_events(
        session=session, limit=limit, before=before, target=target, action=action
    )
