"""Loading what the efficiency and usage reports need; the arithmetic is in efficiency.py."""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app.accounting.efficiency import Held, JobFacts, Reading, compute
from app.accounting.schemas import JobEfficiency, ProjectUsage, UsageReport
from app.auth.models import User
from app.auth.service import Principal
from app.db import utcnow
from app.errors import FieldError, Forbidden, NotFound
from app.jobs.models import Job
from app.jobs.queries import visible_job
from app.jobs.states import ACTIVE
from app.nodes.models import Allocation, Gpu, Node
from app.nodes.telemetry import job_series
from app.projects.models import Project
from app.windows.tariff import Tariff

#: A usage report computes every job's efficiency; beyond this, ask for a shorter period.
MAX_USAGE_JOBS = 5000
DEFAULT_PERIOD = timedelta(days=7)
TOP_WASTEFUL = 10


def _held(session: Session, job_id: int) -> list[Held]:
    rows = session.execute(
        select(Allocation, Node.name, Gpu.index, Gpu.model, Gpu.memory_total_mb)
        .join(Gpu, Gpu.id == Allocation.gpu_id)
        .join(Node, Node.id == Gpu.node_id)
        .where(Allocation.job_id == job_id)
        .order_by(Allocation.created_at)
    ).all()
    return [
        Held(
            node=node,
            gpu_index=index,
            model=model,
            memory_total_mb=memory,
            share_milli=alloc.share_milli,
            start=alloc.created_at,
            end=alloc.released_at,
        )
        for alloc, node, index, model, memory in rows
    ]


def _readings(
    session: Session, job_id: int, held: Sequence[Held], *, until: datetime
) -> list[Reading]:
    if not held:
        return []
    # job_series keeps exactly the samples of the job's GPUs taken while it held them.
    points = job_series(
        session=session, job_id=job_id, since=min(h.start for h in held), until=until
    )
    return [
        Reading(
            at=datetime.fromisoformat(p["at"]),
            node=p["node"],
            gpu_index=p["gpu_index"],
            util_pct=p["util_pct"],
            memory_used_mb=p["memory_used_mb"],
            power_w=p["power_w"],
            resolution_s=p["resolution_s"],
        )
        for p in points
    ]


def _facts(job: Job, *, user: str, project: str) -> JobFacts:
    return JobFacts(
        job_id=job.id,
        name=job.name,
        project=project,
        user=user,
        status=str(job.status),
        live=job.status in ACTIVE,
        gpus=job.gpus * job.nodes,
        gpu_memory_mb=job.gpu_memory_mb,
        started_at=job.started_at,
        finished_at=job.finished_at,
        cpu_s=job.cpu_s,
        memory_peak_mb=job.memory_peak_mb,
    )


def _efficiency(
    session: Session,
    job: Job,
    *,
    user: str,
    project: str,
    now: datetime,
    since: datetime | None = None,
    until: datetime | None = None,
    tariff: Tariff | None = None,
) -> JobEfficiency:
    end = now if until is None else min(until, now)
    held = _held(session, job.id)
    readings = _readings(session, job.id, held, until=end)
    return compute(
        _facts(job, user=user, project=project),
        held,
        readings,
        now=now,
        since=since,
        until=until,
        tariff=tariff,
    )


def job_efficiency(
    *,
    session: Session,
    principal: Principal,
    job_id: int,
    now: datetime | None = None,
    tariff: Tariff | None = None,
) -> JobEfficiency:
    """The job's whole life so far (same visibility as GET /api/v1/jobs/{id})."""
    job = visible_job(session=session, principal=principal, job_id=job_id)
    user = session.scalar(select(User.name).where(User.id == job.user_id)) or ""
    project = session.scalar(select(Project.name).where(Project.id == job.project_id)) or ""
    return _efficiency(session, job, user=user, project=project, now=now or utcnow(), tariff=tariff)


def _weighted_util(rows: Sequence[JobEfficiency]) -> float | None:
    measured = [r for r in rows if r.avg_util_pct is not None]
    weight = sum(r.gpu_hours for r in measured)
    if not measured:
        return None
    if weight <= 0:
        return sum(r.avg_util_pct or 0.0 for r in measured) / len(measured)
    return sum((r.avg_util_pct or 0.0) * r.gpu_hours for r in measured) / weight


def _total(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _project_usage(name: str, rows: Sequence[JobEfficiency]) -> ProjectUsage:
    return ProjectUsage(
        project=name,
        jobs=len(rows),
        by_state=dict(sorted(Counter(r.status for r in rows).items())),
        gpu_hours=sum(r.gpu_hours for r in rows),
        avg_util_pct=_weighted_util(rows),
        energy_wh=sum(r.energy_wh for r in rows),
        cost=_total(r.cost for r in rows),
        cost_at_peak=_total(r.cost_at_peak for r in rows),
        wasted_gpu_hours=sum(r.wasted_gpu_hours for r in rows),
    )


def usage(
    *,
    session: Session,
    principal: Principal,
    project: str | None,
    since: datetime | None,
    until: datetime | None,
    now: datetime | None = None,
    tariff: Tariff | None = None,
) -> tuple[UsageReport, list[JobEfficiency]]:
    """Jobs alive in [since, until] (created before its end, not finished before its start),
    each measured over the part of its run inside the period; plus every job's row."""
    now = now or utcnow()
    until = min(until or now, now)
    since = since or until - DEFAULT_PERIOD
    if since >= until:
        raise FieldError("since", "must be before until (and before now)")
    query = (
        select(Job, User.name, Project.name)
        .join(User, User.id == Job.user_id)
        .join(Project, Project.id == Job.project_id)
    )
    if project is not None:
        project_row = session.scalar(select(Project).where(Project.name == project))
        if project_row is None:
            raise NotFound(f"no project named {project!r}")
        if not principal.can_see_project(project_row.id):
            raise Forbidden(f"you are not a member of project {project!r}")
        query = query.where(Job.project_id == project_row.id)
    elif not principal.is_admin:
        query = query.where(Job.project_id.in_(principal.project_ids or {-1}))
    query = query.where(
        Job.created_at < until, or_(Job.finished_at.is_(None), Job.finished_at >= since)
    ).order_by(Job.id)
    rows = session.execute(query.limit(MAX_USAGE_JOBS + 1)).all()
    if len(rows) > MAX_USAGE_JOBS:
        raise FieldError(
            "since", f"more than {MAX_USAGE_JOBS} jobs in the period: ask for a shorter one"
        )
    jobs = [
        _efficiency(
            session, job, user=user, project=proj, now=now, since=since, until=until, tariff=tariff
        )
        for job, user, proj in rows
    ]
    by_project: dict[str, list[JobEfficiency]] = {}
    for row in jobs:
        by_project.setdefault(row.project, []).append(row)
    total = _project_usage(project or "", jobs)
    wasteful = sorted(
        (r for r in jobs if r.wasted_gpu_hours > 0), key=lambda r: (-r.wasted_gpu_hours, r.job_id)
    )
    report = UsageReport(
        since=since,
        until=until,
        project=project,
        jobs=total.jobs,
        by_state=total.by_state,
        gpu_hours=total.gpu_hours,
        avg_util_pct=total.avg_util_pct,
        energy_wh=total.energy_wh,
        cost=total.cost,
        cost_at_peak=total.cost_at_peak,
        wasted_gpu_hours=total.wasted_gpu_hours,
        projects=[_project_usage(name, rows) for name, rows in sorted(by_project.items())],
        top_wasteful=wasteful[:TOP_WASTEFUL],
    )
    return report, jobs


CSV_COLUMNS = (
    "job_id",
    "name",
    "project",
    "user",
    "status",
    "gpus",
    "started_at",
    "finished_at",
    "gpu_hours",
    "avg_util_pct",
    "peak_util_pct",
    "peak_memory_mb",
    "memory_requested_mb",
    "memory_used_pct",
    "energy_wh",
    "idle_gpus",
    "wasted_gpu_hours",
    "samples",
    "flags",
)


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, datetime):
        return value.isoformat()
    text = str(value)
    # A spreadsheet runs a cell that starts with one of these as a formula: job names are
    # user input, so they are quoted (OWASP "CSV injection").
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def usage_csv(jobs: Sequence[JobEfficiency]) -> str:
    """One row per job with the efficiency columns; flags as space-separated codes."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for job in jobs:
        values = job.model_dump()
        values["flags"] = " ".join(f.code for f in job.flags)
        values["started_at"] = job.started_at
        values["finished_at"] = job.finished_at
        writer.writerow([_cell(values[c]) for c in CSV_COLUMNS])
    return out.getvalue()
