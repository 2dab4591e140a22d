"""Efficiency of one job and usage per project: thin routes over reports.service."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import Response

from app.accounting import service
from app.accounting.schemas import JobEfficiency, UsageReport
from app.api.deps import CurrentUser, SessionDep
from app.api.problems import NOT_A_MEMBER, problems
from app.errors import FieldError
from app.timeutil import query_time

router = APIRouter(prefix="/api/v1", tags=["reports"])

JobId = Annotated[int, Path(ge=1, le=2**31 - 1)]


@router.get(
    "/jobs/{job_id}/efficiency",
    response_model=JobEfficiency,
    responses=problems(403, s403=NOT_A_MEMBER),
)
def job_efficiency(
    job_id: JobId, request: Request, session: SessionDep, principal: CurrentUser
) -> JobEfficiency:
    """How well the job used its GPUs (like Slurm's seff): GPU-hours, utilisation, memory,
    energy and flags with advice; live figures while it runs."""
    return service.job_efficiency(
        session=session, principal=principal, job_id=job_id, tariff=request.app.state.tariff
    )


@router.get(
    "/reports/usage",
    response_model=UsageReport,
    responses={
        200: {"content": {"text/csv": {}}, "description": "JSON, or CSV: one row per job"},
        **problems(
            403,
            404,
            s403="You are not a member of the project asked for",
            s404="No project of the name asked for",
        ),
    },
)
def usage_report(
    request: Request,
    session: SessionDep,
    principal: CurrentUser,
    project: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
    since: Annotated[datetime | None, Query(description="default: until - 7 days")] = None,
    until: Annotated[datetime | None, Query(description="default: now")] = None,
    format_: Annotated[Literal["json", "csv"] | None, Query(alias="format")] = None,
    accept: Annotated[str | None, Header()] = None,
) -> UsageReport | Response:
    """GPU-hours, jobs by state, average utilisation, energy and the most wasteful jobs of a
    project (or of every project you can see) over a period.  ``?format=csv`` or
    ``Accept: text/csv`` gives one row per job with the efficiency columns."""
    start, end = query_time(since, "since"), query_time(until, "until")
    if start is not None and end is not None and start >= end:
        raise FieldError("since", "must be before until", location="query")
    try:
        report, jobs = service.usage(
            session=session,
            principal=principal,
            project=project,
            since=start,
            until=end,
            tariff=request.app.state.tariff,
        )
    except FieldError as exc:  # the service's fields are this route's query parameters
        raise FieldError(exc.field, exc.message, location="query") from None
    wants_csv = format_ == "csv" or (format_ is None and "text/csv" in (accept or ""))
    if wants_csv:
        label = re.sub(r"[^A-Za-z0-9_.-]", "_", project or "all")
        name = f"usage-{label}-{report.since:%Y%m%d}-{report.until:%Y%m%d}.csv"
        return Response(
            service.usage_csv(jobs),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
    return report
