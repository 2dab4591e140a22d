from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from app.deps import CurrentUser

router = APIRouter(prefix="/api/v1", tags=["auth"])


class MeOut(BaseModel):
    name: str
    is_admin: bool
    projects: list[str]


@router.get("/me", response_model=MeOut)
def me(principal: CurrentUser) -> MeOut:
    """Who the token belongs to (the dashboard shows admin actions only to admins)."""
    return MeOut(
        name=principal.name, is_admin=principal.is_admin, projects=sorted(principal.projects)
    )
