"""Each project's queue (what waits, what runs, the GPUs asked for and held) and its
settings (quota, weight, longest time limit): read and changed with the jobs they count."""

from __future__ import annotations

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from app.audit.service import changes, record
from app.auth.service import TOKEN_CACHE, Principal
from app.errors import NotFound
from app.jobs.models import Job
from app.jobs.states import ACTIVE, JobStatus
from app.nodes.models import Allocation
from app.projects.models import Project
from app.projects.schemas import ProjectUpdate, QueueOut


def queues(*, session: Session, principal: Principal) -> list[QueueOut]:
    """Per project: what waits (and how much of it is held), what runs, GPUs asked for by
    the waiting jobs, GPUs in use."""
    projects = select(Project).order_by(Project.name)
    if not principal.is_admin:
        projects = projects.where(Project.id.in_(principal.project_ids or {-1}))
    return _queue_rows(session, list(session.scalars(projects)))


def update_project(*, session: Session, actor: str, name: str, change: ProjectUpdate) -> QueueOut:
    """Set a project's guaranteed GPUs, fair-share weight and longest time limit. The next
    cycle plans with them: jobs beyond a lowered quota count as borrowed, so preemptible
    ones may be reclaimed. A time limit applies to jobs submitted or changed from now on."""
    project = session.scalar(select(Project).where(Project.name == name))
    if project is None:
        known = ", ".join(session.scalars(select(Project.name).order_by(Project.name))) or "none"
        raise NotFound(f"no project named {name!r}; projects: {known}")
    after = change.changes()
    before = {field: getattr(project, field) for field in after}
    for field, value in after.items():
        setattr(project, field, value)
    # Principals carry their projects' limits: this process at once, others within the
    # token cache time.
    TOKEN_CACHE.clear()
    if changed := changes(before, after):
        record(session=session, actor=actor, action="project.update", target=name, info=changed)
    session.commit()
    return _queue_rows(session, [project])[0]


def _queue_rows(session: Session, rows: list[Project]) -> list[QueueOut]:
    ids = [p.id for p in rows]
    pending = JobStatus.PENDING
    counts = {
        pid: (pend or 0, run or 0, req or 0, held or 0)
        for pid, pend, run, req, held in session.execute(
            select(
                Job.project_id,
                func.sum(case((Job.status == pending, 1), else_=0)),
                func.sum(case((Job.status.in_(ACTIVE), 1), else_=0)),
                func.sum(case((Job.status == pending, Job.gpus * Job.nodes), else_=0)),
                func.sum(case(((Job.status == pending) & Job.held_by.is_not(None), 1), else_=0)),
            )
            .where(Job.project_id.in_(ids), Job.status.in_([pending, *ACTIVE]))
            .group_by(Job.project_id)
        )
    }
    in_use = dict(
        session.execute(
            select(Job.project_id, func.sum(Allocation.share_milli))
            .join(Allocation, Allocation.job_id == Job.id)
            .where(
                Job.project_id.in_(ids),
                Allocation.released_at.is_(None),
                Allocation.gpu_id.is_not(None),
            )
            .group_by(Job.project_id)
        ).all()
    )
    # Shares are of every project, also those the caller cannot see (as sshare's).
    weights, used = session.execute(
        select(func.sum(Project.weight), func.sum(Project.usage_gpu_s))
    ).one()
    none = (0, 0, 0, 0)
    return [
        QueueOut(
            project=p.name,
            pending=counts.get(p.id, none)[0],
            held=counts.get(p.id, none)[3],
            running=counts.get(p.id, none)[1],
            gpus_requested=counts.get(p.id, none)[2],
            gpus_in_use=(in_use.get(p.id) or 0) / 1000,
            gpu_quota=p.gpu_quota,
            weight=p.weight,
            fair_share=p.weight / weights,
            usage_gpu_hours=p.usage_gpu_s / 3600,
            usage_share=p.usage_gpu_s / used if used else None,
            usage_at=p.usage_at,
            max_runtime_s=p.max_runtime_s,
            max_priority=p.max_priority,
            max_pending_jobs=p.max_pending_jobs,
            max_running_jobs=p.max_running_jobs,
            max_gpus=p.max_gpus,
        )
        for p in rows
    ]
