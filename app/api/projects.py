from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from app.api.deps import AdminUser, CurrentUser, SessionDep
from app.api.jobs import FiltersDep
from app.jobs import project_queues, queries
from app.jobs.schemas import PendingPage
from app.paging import PageDep, cut
from app.projects.schemas import ProjectUpdate, QueueOut

router = APIRouter(prefix="/api/v1", tags=["queues"])


@router.get("/queues", response_model=list[QueueOut])
def list_queues(
    session: SessionDep, principal: CurrentUser, page: PageDep, response: Response
) -> list[QueueOut]:
    """Per project you see, by name, a page at a time (X-Total-Count: how many)."""
    return cut(response, page, project_queues.queues(session=session, principal=principal))


@router.patch("/projects/{name}", response_model=QueueOut)
def update_project(
    name: str, body: ProjectUpdate, session: SessionDep, admin: AdminUser
) -> QueueOut:
    """Set a project's guaranteed GPUs (quota), fair-share weight, longest job time limit
    (`max_runtime_s`, null: the cluster's) and the highest priority its users may give
    their jobs (`max_priority`); only the fields sent change, each audited. Returns its
    queue row."""
    return project_queues.update_project(session=session, actor=admin.name, name=name, change=body)


@router.get("/queue", response_model=PendingPage)
def pending_queue(
    session: SessionDep,
    principal: CurrentUser,
    filters: FiltersDep,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    eligible: Annotated[
        bool | None,
        Query(
            description="true: only jobs that may run now; false: only those that cannot "
            "yet (held, dependencies, begin time, off-peak window, array limit); none: all"
        ),
    ] = None,
) -> PendingPage:
    """Pending jobs in scheduling order, with position, reason and estimated start; the
    filters (`project`, `user`, `name`, `label`, `array`) as in GET /jobs, as squeue's."""
    return queries.pending_in_order(
        session=session,
        principal=principal,
        filters=filters,
        offset=offset,
        limit=limit,
        eligible=eligible,
    )
