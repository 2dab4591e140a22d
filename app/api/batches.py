from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from fastapi.exceptions import RequestValidationError

from app.api.deps import CurrentUser, MessengerDep, SessionDep, SettingsDep
from app.api.problems import problems
from app.batches import service
from app.batches.schemas import BatchIn, BatchOut, FiringOut
from app.db import utcnow
from app.jobs.limits import runtime_limits
from app.paging import PageDep, with_total

router = APIRouter(prefix="/api/v1/batches", tags=["batches"])
OTHERS = "The batch belongs to another user"


@contextmanager
def _template_errors() -> Iterator[None]:
    """Render a template's database check like a pydantic error, located in the template."""
    try:
        yield
    except service.TemplateFieldError as exc:
        error = {"loc": ("body", *exc.loc), "msg": exc.detail, "type": "value_error"}
        raise RequestValidationError([error]) from None


@router.get("", response_model=list[BatchOut])
def list_batches(
    session: SessionDep, principal: CurrentUser, page: PageDep, response: Response
) -> list[BatchOut]:
    """Your schedules and those of your projects (admins: all), with the next fire time,
    by name, a page at a time (X-Total-Count: how many)."""
    batches, total = service.list_batches(
        session=session, principal=principal, now=utcnow(), page=page
    )
    return with_total(response, total, batches)


@router.post(
    "",
    response_model=BatchOut,
    status_code=status.HTTP_201_CREATED,
    responses=problems(409, s409="A batch of that name exists"),
)
def create_batch(
    body: BatchIn, session: SessionDep, principal: CurrentUser, settings: SettingsDep
) -> BatchOut:
    """Create a schedule owned by you; its jobs are submitted as you."""
    with _template_errors():
        return service.create_batch(
            session=session,
            principal=principal,
            body=body,
            limits=runtime_limits(settings),
            now=utcnow(),
        )


@router.get("/{name}", response_model=BatchOut, responses=problems(403, s403=OTHERS))
def get_batch(name: str, session: SessionDep, principal: CurrentUser) -> BatchOut:
    return service.get_batch(session=session, principal=principal, name=name, now=utcnow())


@router.put(
    "/{name}",
    response_model=BatchOut,
    responses=problems(403, 409, s403=OTHERS, s409="A batch of the new name exists"),
)
def replace_batch(
    name: str, body: BatchIn, session: SessionDep, principal: CurrentUser, settings: SettingsDep
) -> BatchOut:
    """Replace a schedule; a changed cron or zone takes effect at the next check."""
    with _template_errors():
        return service.replace_batch(
            session=session,
            principal=principal,
            name=name,
            body=body,
            limits=runtime_limits(settings),
            now=utcnow(),
        )


@router.delete(
    "/{name}", status_code=status.HTTP_204_NO_CONTENT, responses=problems(403, s403=OTHERS)
)
def delete_batch(name: str, session: SessionDep, principal: CurrentUser) -> Response:
    service.delete_batch(session=session, principal=principal, name=name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{name}/enable", response_model=BatchOut, responses=problems(403, s403=OTHERS))
def enable_batch(name: str, session: SessionDep, principal: CurrentUser) -> BatchOut:
    """Idempotent; fire times while it was disabled never run."""
    return service.set_enabled(
        session=session, principal=principal, name=name, enabled=True, now=utcnow()
    )


@router.post("/{name}/disable", response_model=BatchOut, responses=problems(403, s403=OTHERS))
def disable_batch(name: str, session: SessionDep, principal: CurrentUser) -> BatchOut:
    return service.set_enabled(
        session=session, principal=principal, name=name, enabled=False, now=utcnow()
    )


@router.post(
    "/{name}/run",
    response_model=FiringOut,
    status_code=status.HTTP_201_CREATED,
    responses=problems(
        403,
        409,
        s403=OTHERS,
        s409="Its earlier jobs still run, or its jobs cannot be submitted now",
    ),
)
def run_batch(
    name: str,
    session: SessionDep,
    principal: CurrentUser,
    settings: SettingsDep,
    messenger: MessengerDep,
) -> FiringOut:
    """Submit the batch's jobs now, by hand, as `kubectl create job --from=cronjob/NAME`
    (also while it is disabled); its schedule's fire times stay as they were. Its
    `concurrency` applies as at a fire time: `forbid` is a 409 while jobs of an earlier
    firing have not ended, `replace` cancels them. Owner or admin only."""
    changed = service.run_batch(
        session=session,
        principal=principal,
        name=name,
        limits=runtime_limits(settings),
        now=utcnow(),
    )
    messenger.send(changed.after)
    return changed.value


@router.get("/{name}/firings", response_model=list[FiringOut], responses=problems(403, s403=OTHERS))
def list_firings(
    name: str,
    session: SessionDep,
    principal: CurrentUser,
    response: Response,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> list[FiringOut]:
    """Firing history, newest first: fire time, submitted job ids, skipped or error
    (X-Total-Count: how many it has)."""
    firings, total = service.list_firings(
        session=session, principal=principal, name=name, limit=limit
    )
    return with_total(response, total, firings)
