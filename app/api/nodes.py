from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, Query, Response

from app.api.deps import AdminUser, CurrentUser, InventoryDep, MessengerDep, SessionDep
from app.api.problems import problems
from app.db import utcnow
from app.errors import FieldError
from app.jobs import control
from app.jobs.schemas import JobOut
from app.nodes import service, telemetry
from app.nodes.schemas import DrainRequest, NodeOut
from app.paging import PageDep, cut
from app.timeutil import query_time

router = APIRouter(prefix="/api/v1/nodes", tags=["nodes"])


@router.get("", response_model=list[NodeOut])
def list_nodes(
    session: SessionDep, _: CurrentUser, page: PageDep, response: Response
) -> list[NodeOut]:
    """The nodes by name, a page at a time (X-Total-Count: how many)."""
    return cut(response, page, service.list_nodes(session=session))


@router.get("/{name}", response_model=NodeOut)
def get_node(name: str, session: SessionDep, _: CurrentUser) -> NodeOut:
    """The node with each GPU's latest telemetry and processes (foreign ones flagged)."""
    return service.get_node(session=session, name=name)


@router.post(
    "/{name}/drain",
    response_model=NodeOut,
    responses=problems(409, s409="A maintenance planned on a node drained now"),
)
def drain_node(
    name: str, session: SessionDep, principal: AdminUser, body: DrainRequest | None = None
) -> NodeOut:
    """Take no new jobs on the node (admin); running ones finish. With `at`, later:
    maintenance, before which only jobs whose time limit ends by then start there."""
    body = body or DrainRequest()
    return service.drain(
        session=session,
        principal=principal,
        name=name,
        reason=body.reason,
        at=body.at,
        now=utcnow(),
    )


@router.post("/{name}/requeue", response_model=list[JobOut])
def requeue_node_jobs(
    name: str, session: SessionDep, principal: AdminUser, messenger: MessengerDep
) -> list[JobOut]:
    """Requeue every job running on the node (admin), to service it once drained: each
    gets SIGTERM and its grace period to checkpoint, and goes back to the queue with its
    age, costing no retry (as `scontrol requeue` of each). Returns the jobs."""
    requeued = control.requeue_node_jobs(session=session, principal=principal, node=name)
    messenger.send(requeued.after)
    return requeued.value


@router.post("/{name}/undrain", response_model=NodeOut)
def undrain_node(name: str, session: SessionDep, principal: AdminUser) -> NodeOut:
    return service.undrain(session=session, principal=principal, name=name)


@router.delete(
    "/{name}",
    response_model=NodeOut,
    responses=problems(409, s409="The node is not drained, or jobs still hold its GPUs"),
)
def remove_node(
    name: str, session: SessionDep, principal: AdminUser, inventory: InventoryDep
) -> NodeOut:
    """Remove a decommissioned node (admin): it leaves the lists, the metrics and
    scheduling; jobs that ran there keep their history. 409 while its agent heartbeats or
    a job holds its GPUs. Its agent registering again brings it back."""
    removed = service.remove(session=session, principal=principal, name=name, now=utcnow())
    # This process refuses at once what only that node fitted (others within the cache's time).
    inventory.refresh(session)
    return removed


utilization_router = APIRouter(prefix="/api/v1", tags=["nodes"])


@utilization_router.get("/utilization")
def utilization(
    session: SessionDep,
    _: CurrentUser,
    node: str | None = None,
    since: datetime | None = Query(default=None, description="ISO time; default 1 hour ago"),
    step: int = Query(default=60, ge=1, le=86400, description="bucket width in seconds"),
) -> dict[str, Any]:
    """GPU utilisation, memory and power over time, per bucket, for the cluster or a node."""
    now = utcnow()
    start = query_time(since, "since") or now - timedelta(hours=1)
    try:
        points = telemetry.utilization_series(
            session=session, node=node, since=start, until=now, step_s=step
        )
    except FieldError as exc:  # the series' fields are this route's query parameters
        raise FieldError(exc.field, exc.message, location="query") from None
    return {"node": node, "since": start, "step": step, "points": points}


@utilization_router.get("/utilization/gpus")
def gpu_utilization(
    session: SessionDep,
    _: CurrentUser,
    node: str | None = None,
    since: datetime | None = Query(default=None, description="ISO time; default 1 hour ago"),
    step: int = Query(default=60, ge=1, le=86400, description="bucket width in seconds"),
) -> dict[str, Any]:
    """Each GPU's utilisation over time (a heatmap's rows): `gpus[].util_pct[i]` is its
    mean in the bucket starting `since + i * step` (null: no sample), `gpus[].job_ids[i]`
    the jobs it ran then. Removed nodes are left out."""
    now = utcnow()
    start = query_time(since, "since") or now - timedelta(hours=1)
    try:
        gpus = telemetry.gpu_series(session=session, node=node, since=start, until=now, step_s=step)
    except FieldError as exc:  # the series' fields are this route's query parameters
        raise FieldError(exc.field, exc.message, location="query") from None
    return {"node": node, "since": start, "until": now, "step": step, "gpus": gpus}
