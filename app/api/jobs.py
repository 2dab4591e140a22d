from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Annotated

from fastapi import (
    APIRouter,
    Depends,
    Header,
    HTTPException,
    Path,
    Query,
    Request,
    Response,
    status,
)
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from app.api.deps import (
    CurrentUser,
    InventoryDep,
    MessengerDep,
    PendingCountsDep,
    SessionDep,
    SettingsDep,
)
from app.api.problems import NOT_A_MEMBER, problems
from app.cycle.job_rank import rank
from app.db import utcnow
from app.errors import FieldError
from app.jobs import control, queries, submission, updates
from app.jobs.limits import runtime_limits
from app.jobs.logs import MAX_TAIL_LINES, follow, read_tail, resolve_attempt
from app.jobs.schemas import (
    ArrayUpdate,
    BulkOut,
    JobCreate,
    JobEventOut,
    JobOut,
    JobPage,
    JobUpdate,
    RankOut,
)
from app.jobs.states import ACTIVE, JobStatus
from app.nodes.telemetry import job_series
from app.notifications.deliveries import NotificationOut
from app.paging import PageDep, with_total
from app.wire import SetTimeLimit, attempt_log_path

JobId = Annotated[int, Path(ge=1, le=2**31 - 1)]
GraceQuery = Annotated[
    int | None,
    Query(
        ge=0,
        le=86400,
        description="stop it with this grace period if sooner than its own; 0: SIGKILL "
        "now (a job stuck in its grace period can be cancelled again with it)",
    ),
]

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobOut,
    responses={
        200: {"model": JobOut, "description": "Replay: the job this Idempotency-Key created"},
        **problems(
            403,
            409,
            429,
            s403="A priority above what the project allows",
            s409="The Idempotency-Key was used with a different body",
            s429="Too many failed token checks, or a limit of pending jobs reached",
        ),
    },
)
def submit_job(
    spec: JobCreate,
    session: SessionDep,
    principal: CurrentUser,
    response: Response,
    messenger: MessengerDep,
    settings: SettingsDep,
    inventory: InventoryDep,
    pending_counts: PendingCountsDep,
    idempotency_key: Annotated[str | None, Header(max_length=128)] = None,
) -> JobOut:
    """Queue a job. Repeating a request with the same Idempotency-Key and body returns the
    first job (200) instead of creating a second one. A job without max_runtime_s gets the
    cluster's default time limit, if one is set."""
    submitted = submission.submit(
        session=session,
        principal=principal,
        spec=spec,
        limits=runtime_limits(settings),
        idempotency_key=idempotency_key,
        inventory=inventory,
        pending_counts=pending_counts,
    )
    if not submitted.created:
        response.status_code = status.HTTP_200_OK
    messenger.send(submitted.after)
    response.headers["Location"] = f"/api/v1/jobs/{submitted.job.id}"
    return submitted.job


def _parse_labels(values: list[str]) -> list[tuple[str, str]]:
    parsed = []
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise FieldError("label", f"{value!r}: expected key=value", location="query")
        parsed.append((key, val))
    return parsed


def _parse_cursor(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    if not cursor.isdigit() or int(cursor) > 2**31:
        raise FieldError("cursor", "not a cursor returned by this endpoint", location="query")
    return int(cursor)


def job_filters(
    project: str | None = None,
    user: str | None = None,
    label: Annotated[list[str], Query(description="key=value, repeatable")] = [],  # noqa: B006
    array: Annotated[
        int | None, Query(ge=1, le=2**31 - 1, description="the tasks of this job array")
    ] = None,
    name: Annotated[
        str | None, Query(min_length=1, max_length=200, description="jobs of this name")
    ] = None,
) -> queries.JobSelection:
    """The filters of every job listing but status (the queue holds pending jobs only)."""
    return queries.JobSelection(
        project=project, user=user, labels=tuple(_parse_labels(label)), array=array, name=name
    )


FiltersDep = Annotated[queries.JobSelection, Depends(job_filters)]


def job_selection(
    filters: FiltersDep,
    status_: Annotated[list[JobStatus], Query(alias="status")] = [],  # noqa: B006
) -> queries.JobSelection:
    return replace(filters, statuses=tuple(status_))


SelectionDep = Annotated[queries.JobSelection, Depends(job_selection)]


@router.get("", response_model=JobPage)
def list_jobs(
    session: SessionDep,
    principal: CurrentUser,
    selection: SelectionDep,
    cursor: Annotated[str | None, Query(max_length=20)] = None,
    limit: Annotated[int, Query(ge=1, le=queries.MAX_PAGE)] = 50,
) -> JobPage:
    return queries.list_jobs(
        session=session,
        principal=principal,
        selection=selection,
        cursor=_parse_cursor(cursor),
        limit=limit,
    )


@router.post("/cancel", response_model=BulkOut)
def cancel_jobs(
    session: SessionDep,
    principal: CurrentUser,
    messenger: MessengerDep,
    selection: SelectionDep,
    grace_s: GraceQuery = None,
) -> BulkOut:
    """Cancel every job the filters select that has not ended, in one request, as
    `scancel -u alice -t PENDING` or `scancel` of an array id (`?array=12`): pending jobs
    end at once, running ones are stopped as by a cancel of each. At least one filter is
    required. Returns how many jobs were acted on and their ids (count 0: nothing
    matched), how many of them are stopping."""
    cancelled = control.cancel_selected(
        session=session, principal=principal, selection=selection, grace_s=grace_s
    )
    messenger.send(cancelled.after)
    return cancelled.value


@router.post("/hold", response_model=BulkOut)
def hold_jobs(session: SessionDep, principal: CurrentUser, selection: SelectionDep) -> BulkOut:
    """Hold every pending job the filters select, in one request, as `scontrol hold` of an
    array id (`?array=12`). At least one filter is required. Returns how many and their
    ids (count 0: nothing pending matched)."""
    return control.hold_selected(session=session, principal=principal, selection=selection)


@router.post(
    "/release",
    response_model=BulkOut,
    responses=problems(403, s403="A selected job was held by an admin"),
)
def release_jobs(
    session: SessionDep, principal: CurrentUser, messenger: MessengerDep, selection: SelectionDep
) -> BulkOut:
    """Release every held job the filters select, in one request. A hold placed by an
    admin only an admin releases: if the selection holds one, nothing is released (403).
    Returns how many were released and their ids."""
    released = control.release_selected(session=session, principal=principal, selection=selection)
    messenger.send(released.after)
    return released.value


@router.get("/{job_id}", response_model=JobOut, responses=problems(403, s403=NOT_A_MEMBER))
def get_job(job_id: JobId, session: SessionDep, principal: CurrentUser) -> JobOut:
    return queries.get(session=session, principal=principal, job_id=job_id)


@router.get(
    "/{job_id}/script",
    response_class=PlainTextResponse,
    responses={
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "description": "The script, as submitted",
        },
        **problems(
            403,
            404,
            s403=NOT_A_MEMBER,
            s404="No such job, or one that runs its command, not a script copy",
        ),
    },
)
def get_job_script(job_id: JobId, session: SessionDep, principal: CurrentUser) -> PlainTextResponse:
    """The script the job runs: its text when it was submitted (`script`), as Slurm's
    `scontrol write batch_script`."""
    return PlainTextResponse(queries.script(session=session, principal=principal, job_id=job_id))


@router.get(
    "/{job_id}/events", response_model=list[JobEventOut], responses=problems(403, s403=NOT_A_MEMBER)
)
def get_job_events(
    job_id: JobId, session: SessionDep, principal: CurrentUser, page: PageDep, response: Response
) -> list[JobEventOut]:
    """The job's history, oldest first, a page at a time (X-Total-Count: how many)."""
    events, total = queries.events(session=session, principal=principal, job_id=job_id, page=page)
    return with_total(response, total, events)


@router.get(
    "/{job_id}/rank",
    response_model=RankOut,
    responses=problems(
        403,
        409,
        s403=NOT_A_MEMBER,
        s409="The job is not waiting, is held, or the queue is not ranked yet",
    ),
)
def get_job_rank(job_id: JobId, session: SessionDep, principal: CurrentUser) -> RankOut:
    """Where a waiting job is in the queue and why, as Slurm's sprio: the jobs ahead of it
    counted by the rule of the queue policy that puts each first (a higher priority,
    another project's fair-share turn, a smaller expected GPU-time, ...), as the last full
    cycle ranked them. A job that arrived since: `ranked` false and when it will be. A 409
    for a job outside the ranking (placed, ended, held, waiting for its dependencies or
    its begin time)."""
    return rank(session=session, principal=principal, job_id=job_id, now=utcnow())


@router.get(
    "/{job_id}/notifications",
    response_model=list[NotificationOut],
    responses=problems(403, s403=NOT_A_MEMBER),
)
def get_job_notifications(
    job_id: JobId, session: SessionDep, principal: CurrentUser, page: PageDep, response: Response
) -> list[NotificationOut]:
    """The job's webhook messages and how each delivery went (queued, retrying with the
    last error and when it is tried again, delivered, or given up), oldest first, a page
    at a time (X-Total-Count: how many)."""
    messages, total = queries.notifications(
        session=session, principal=principal, job_id=job_id, page=page
    )
    return with_total(response, total, messages)


@router.post(
    "/{job_id}/cancel",
    response_model=JobOut,
    responses=problems(403, 409, s403=NOT_A_MEMBER, s409="The job already finished"),
)
def cancel_job(
    job_id: JobId,
    session: SessionDep,
    principal: CurrentUser,
    messenger: MessengerDep,
    grace_s: GraceQuery = None,
) -> JobOut:
    """Idempotent: cancelling a cancelled job returns it unchanged. A scheduled or running
    job is stopped by its agent (SIGTERM, its grace period, SIGKILL) and then CANCELLED."""
    cancelled = control.cancel(session=session, principal=principal, job_id=job_id, grace_s=grace_s)
    messenger.send(cancelled.after)
    return cancelled.value


@router.post(
    "/{job_id}/requeue",
    response_model=JobOut,
    responses=problems(
        403, 409, s403=NOT_A_MEMBER, s409="The job cannot come back (finished or being cancelled)"
    ),
)
def requeue_job(
    job_id: JobId,
    session: SessionDep,
    principal: CurrentUser,
    messenger: MessengerDep,
    hold: Annotated[
        bool, Query(description="come back held (scontrol requeuehold): change it, release it")
    ] = False,
) -> JobOut:
    """Stop a placed or running job (SIGTERM, its grace period, SIGKILL; one not started
    yet never starts) and put it back in the queue, as `scontrol requeue`; it costs no
    retry and keeps its age. A job that is neither, or is being cancelled, is a 409.
    Idempotent."""
    requeued = control.requeue(session=session, principal=principal, job_id=job_id, hold=hold)
    messenger.send(requeued.after)
    return requeued.value


@router.post(
    "/{job_id}/hold",
    response_model=JobOut,
    responses=problems(403, 409, s403=NOT_A_MEMBER, s409="Only a pending job can be held"),
)
def hold_job(job_id: JobId, session: SessionDep, principal: CurrentUser) -> JobOut:
    """Keep a pending job from being scheduled until it is released (as `scontrol hold`).
    Idempotent; a job that is not pending is a 409."""
    return control.hold(session=session, principal=principal, job_id=job_id)


@router.post(
    "/{job_id}/release",
    response_model=JobOut,
    responses=problems(403, s403="Not a member of the job's project, or held by an admin"),
)
def release_job(
    job_id: JobId, session: SessionDep, principal: CurrentUser, messenger: MessengerDep
) -> JobOut:
    """Let a held job be scheduled again; a hold placed by an admin only an admin releases.
    Idempotent."""
    released = control.release(session=session, principal=principal, job_id=job_id)
    messenger.send(released.after)
    return released.value


@router.patch(
    "",
    response_model=BulkOut,
    responses=problems(403, s403="A priority above what the project allows"),
)
def update_jobs(
    changes: JobUpdate,
    session: SessionDep,
    principal: CurrentUser,
    messenger: MessengerDep,
    settings: SettingsDep,
    selection: SelectionDep,
) -> BulkOut:
    """Change every pending job the filters select, in one request, as `scontrol update` of
    an array id (`?array=12`) changes all its pending tasks. All or nothing: a change
    refused for one job is a 422 naming it, and changes none. At least one filter is
    required. Returns how many were changed and their ids (count 0: nothing pending
    matched)."""
    updated = updates.update_selected(
        session=session,
        principal=principal,
        selection=selection,
        changes=changes,
        limits=runtime_limits(settings),
    )
    messenger.send(updated.after)
    return updated.value


@router.patch(
    "/{job_id}",
    response_model=JobOut,
    responses=problems(
        403,
        409,
        503,
        s403="Not a member of the job's project, or a priority or time limit only an admin may set",
        s409="The job can no longer be changed (finished, or placed: only its time limit)",
        s503="Database or message broker unavailable; send the same change again",
    ),
)
def update_job(
    job_id: JobId,
    changes: JobUpdate,
    session: SessionDep,
    principal: CurrentUser,
    messenger: MessengerDep,
    settings: SettingsDep,
) -> JobOut:
    """Change a pending job's name, GPUs, GPU memory, nodes, priority, time limits or
    dependencies, as `scontrol update`; it keeps its submit time. A dependency loop is a
    422 on depends_on. A placed (scheduled or running) job takes only `max_runtime_s`, as
    `scontrol update TimeLimit=`: its owner may shorten it, only an admin extend it, and
    its agents are told at once. A job that has ended is a 409."""
    updated = updates.update(
        session=session,
        principal=principal,
        job_id=job_id,
        changes=changes,
        limits=runtime_limits(settings),
    )
    unsent = messenger.send(updated.after)
    if any(isinstance(order, SetTimeLimit) for order in unsent):
        # Stored, but the agent would still end it at the old limit (and reconciliation
        # does not re-send time limits).
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"job {job_id}'s new time limit is stored, but its node could not be told "
            "(message broker unreachable): send the same change again",
        )
    return updated.value


@router.patch(
    "/{job_id}/array",
    response_model=JobOut,
    responses=problems(403, 409, s403=NOT_A_MEMBER, s409="The job is not a task of a job array"),
)
def change_array_limit(
    job_id: JobId,
    change: ArrayUpdate,
    session: SessionDep,
    principal: CurrentUser,
    messenger: MessengerDep,
) -> JobOut:
    """Change how many tasks of the job array that job `job_id` belongs to may run at once
    (`max_running`; null: no limit), as `scontrol update ArrayTaskThrottle`. Running
    tasks are not stopped. A job of its own is a 409."""
    changed = updates.change_array_limit(
        session=session, principal=principal, job_id=job_id, max_running=change.max_running
    )
    messenger.send(changed.after)
    return changed.value


@router.get(
    "/{job_id}/logs",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "The log"},
        **problems(403, 404, s403=NOT_A_MEMBER, s404="No such job, or no such attempt of it"),
    },
)
def get_job_logs(
    job_id: JobId,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    principal: CurrentUser,
    tail: Annotated[int | None, Query(ge=1, le=MAX_TAIL_LINES)] = None,
    offset: Annotated[
        int | None, Query(ge=0, le=2**62, description="start at this byte of the log")
    ] = None,
    attempt: Annotated[int | None, Query(ge=1, le=10_000)] = None,
    node_rank: Annotated[
        int,
        Query(ge=0, le=10_000, description="which node of a multi-node job (0: the first)"),
    ] = 0,
    follow_: Annotated[bool, Query(alias="follow")] = False,
) -> Response:
    """The attempt's stdout and stderr (latest attempt by default; of a multi-node job, the
    first node's unless `node_rank` names another). `tail=N` keeps the last N lines;
    `offset=B` starts at byte B (a follower that lost its connection resumes there);
    `follow=true` streams new output until the attempt ends. `X-Log-Offset` is the byte
    of the log the body starts at; `X-Nodes` how many nodes have a log."""
    if tail is not None and offset is not None:
        raise FieldError("offset", "give tail or offset, not both", location="query")
    job = queries.get(session=session, principal=principal, job_id=job_id)
    if node_rank >= job.nodes:
        raise FieldError(
            "node_rank",
            f"job {job_id} runs on {job.nodes} node(s): node_rank 0 to {job.nodes - 1}",
            location="query",
        )
    if job.attempt == 0:
        return PlainTextResponse("", headers={"X-Job-Status": job.status})
    chosen = resolve_attempt(job_id=job_id, current_attempt=job.attempt, attempt=attempt)
    log_dir = settings.log_dir.resolve()
    path = attempt_log_path(log_dir, job_id, chosen, node_rank)
    data, read_up_to = read_tail(path, log_dir, tail, offset=offset or 0)
    headers = {
        "X-Job-Status": job.status,
        "X-Attempt": str(chosen),
        "X-Log-Offset": str(read_up_to - len(data)),
        "X-Nodes": str(job.nodes),
    }
    if not follow_:
        return PlainTextResponse(data.decode(errors="replace"), headers=headers)
    factory = request.app.state.read_session_factory
    # The stream may last hours: end this request's transaction now (on SQLite it pins a
    # snapshot) and check the job's state with short sessions of its own.
    session.rollback()

    async def attempt_running() -> bool:
        def check() -> bool:
            with factory() as fresh:
                current = queries.get(session=fresh, principal=principal, job_id=job_id)
            return current.attempt == chosen and current.status in ACTIVE

        return await run_in_threadpool(check)

    async def stream() -> AsyncIterator[bytes]:
        # Bytes as the log has them, so a follower can count where it got to.
        yield data
        async for chunk in follow(
            path, log_dir, start_offset=read_up_to, still_running=attempt_running
        ):
            yield chunk

    return StreamingResponse(stream(), media_type="text/plain", headers=headers)


@router.get("/{job_id}/telemetry", responses=problems(403, s403=NOT_A_MEMBER))
def get_job_telemetry(
    job_id: JobId, session: SessionDep, principal: CurrentUser
) -> dict[str, object]:
    """Readings of the job's GPUs over its run: one point per GPU and sample."""
    job = queries.get(session=session, principal=principal, job_id=job_id)
    since = job.created_at
    until = job.finished_at or utcnow()
    points = job_series(session=session, job_id=job_id, since=since, until=until)
    return {"job_id": job_id, "points": points}
