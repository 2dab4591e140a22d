from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from sqlalchemy.orm import Session

from app.api.deps import AdminUser, CurrentUser, SessionDep
from app.api.problems import problems
from app.batches.window_users import window_users
from app.db import utcnow
from app.jobs.never_in_window import settle_never_in_window
from app.paging import PageDep, cut
from app.windows import service
from app.windows.schemas import UpcomingWindow, WindowIn, WindowOut

router = APIRouter(prefix="/api/v1/windows", tags=["windows"])


@router.get("", response_model=list[WindowOut])
def list_windows(
    session: SessionDep, _: CurrentUser, page: PageDep, response: Response
) -> list[WindowOut]:
    """The off-peak windows by name, a page at a time (X-Total-Count: how many)."""
    return cut(response, page, service.list_windows(session=session))


@router.get("/upcoming", response_model=list[UpcomingWindow])
def upcoming_windows(
    session: SessionDep,
    _: CurrentUser,
    days: Annotated[float, Query(gt=0, le=31)] = 7,
) -> list[UpcomingWindow]:
    """Concrete openings in the next `days`, with local times carrying their UTC offset."""
    return service.upcoming_windows(session=session, now=utcnow(), days=days)


@router.post(
    "",
    response_model=WindowOut,
    status_code=status.HTTP_201_CREATED,
    responses=problems(409, s409="A window of that name exists"),
)
def create_window(body: WindowIn, session: SessionDep, admin: AdminUser) -> WindowOut:
    created = service.create_window(session=session, actor=admin.name, body=body)
    _judge_waiting_jobs(session, actor=admin.name)
    return created


@router.get("/{name}", response_model=WindowOut)
def get_window(name: str, session: SessionDep, _: CurrentUser) -> WindowOut:
    return service.get_window(session=session, name=name)


@router.put(
    "/{name}",
    response_model=WindowOut,
    responses=problems(409, s409="A window of the new name exists"),
)
def replace_window(name: str, body: WindowIn, session: SessionDep, admin: AdminUser) -> WindowOut:
    replaced = service.replace_window(
        session=session, actor=admin.name, name=name, body=body, users_of=window_users
    )
    _judge_waiting_jobs(session, actor=admin.name)
    return replaced


@router.delete(
    "/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problems(409, s409="Jobs or batches still name the window"),
)
def delete_window(name: str, session: SessionDep, admin: AdminUser) -> Response:
    service.delete_window(session=session, actor=admin.name, name=name, users_of=window_users)
    _judge_waiting_jobs(session, actor=admin.name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def _judge_waiting_jobs(session: Session, *, actor: str) -> None:
    """Waiting off-peak jobs that the changed windows leave no opening long enough for are
    marked at once (each cycle would, too: this is for the admin who looks right after)."""
    specs = service.window_specs(session=session)
    settle_never_in_window(session=session, specs=specs, now=utcnow(), actor=actor)
    session.commit()
