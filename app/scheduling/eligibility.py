"""Phase 3, before placement: may this job be placed at all, and where not.

The job filters (begin time, off-peak window, with the off-peak budget), the
can-never-fit verdict per job shape, the quota check without borrowing, the running
limits of its user and project, and the nodes
a job may not use: those going into maintenance before its time limit ends and those
its own node choice leaves out. Each answer is cached per cycle in the `CycleState`.
"""

from __future__ import annotations

from datetime import timedelta

from app.scheduling import filters as F
from app.scheduling.cycle_state import CycleState, quota_of
from app.scheduling.filters import node_choice, running_limit
from app.scheduling.filters import quota as project_quota
from app.scheduling.filters.running_limit import NO_LIMITS, Limits
from app.scheduling.state import HardwareClass, Request, hardware_classes
from app.scheduling.status import OK, Code, Status
from app.scheduling.types import JobView, ReasonKind, RunningJobView, Snapshot


def hardware(cs: CycleState) -> tuple[HardwareClass, ...]:
    """The cluster's hardware classes, worked out on first use."""
    if cs.hardware_cache is None:
        cs.hardware_cache = hardware_classes(cs.snap.nodes)
    return cs.hardware_cache


def job_filters(cs: CycleState, job: JobView) -> Status | None:
    if job.schedule_mode == "now":
        return None  # both job filters only concern "at" and "offpeak" jobs
    for jf in F.JOB_FILTERS:
        st = jf(job, cs.ctx)
        if not st.ok:
            if (
                st.kind is ReasonKind.WINDOW_CLOSED
                and job.preemptible
                and offpeak_budget_ok(cs, job)
            ):
                continue
            return st
    return None


def offpeak_budget_ok(cs: CycleState, job: JobView) -> bool:
    frac = cs.settings.offpeak_outside_fraction
    if frac <= 0:
        return False
    budget = int(frac * cs.total_gpus * 1000)
    need = Request.of(job).milli * job.total_gpus
    return cs.offpeak_running_milli + need <= budget


def never(cs: CycleState, req: Request) -> Status:
    """The first NEVER_FILTERS failure of a job shape, or OK (cached per shape)."""
    st = cs.never_cache.get(req)
    if st is None:
        st = OK if req.gpus == 0 else _first_failure(req, hardware(cs))
        cs.never_cache[req] = st
    return st


def _first_failure(req: Request, hardware: tuple[HardwareClass, ...]) -> Status:
    for nf in F.NEVER_FILTERS:
        st = nf(req, hardware)
        if st.code is Code.UNRESOLVABLE:
            return st
    return OK


def quota_block(cs: CycleState, job: JobView, req: Request) -> str | None:
    if cs.settings.borrowing:
        return None
    quota = quota_of(cs, job.project)
    used = cs.used_milli.get(job.project, 0)
    if project_quota.fits(req, job, used, quota):
        return None
    return (
        f"project {job.project} would exceed its quota of {quota // 1000} GPUs "
        f"(using {used / 1000:g}, borrowing disabled)"
    )


def running_limits(snapshot: Snapshot) -> tuple[dict[str, Limits], dict[str, Limits]]:
    """The users' and the projects' running limits, only of those that have some."""
    users = {
        u.name: (u.max_running_jobs, u.max_gpus)
        for u in snapshot.users
        if (u.max_running_jobs, u.max_gpus) != NO_LIMITS
    }
    projects = {
        p.name: (p.max_running_jobs, p.max_gpus)
        for p in snapshot.projects
        if (p.max_running_jobs, p.max_gpus) != NO_LIMITS
    }
    return users, projects


def count_running(
    running: tuple[RunningJobView, ...],
) -> tuple[dict[str, int], dict[str, int], dict[str, int], dict[str, int]]:
    """Per user and per project: running jobs and the GPUs they hold (thousandths)."""
    user_jobs: dict[str, int] = {}
    user_milli: dict[str, int] = {}
    project_jobs: dict[str, int] = {}
    project_milli: dict[str, int] = {}
    for r in running:
        user, project, held = r.job.user, r.job.project, r.held_milli
        user_jobs[user] = user_jobs.get(user, 0) + 1
        user_milli[user] = user_milli.get(user, 0) + held
        project_jobs[project] = project_jobs.get(project, 0) + 1
        project_milli[project] = project_milli.get(project, 0) + held
    return user_jobs, user_milli, project_jobs, project_milli


def count_placed(cs: CycleState, job: JobView, need_milli: int) -> None:
    """A job placed this cycle counts against its user's and its project's limits."""
    user, project = job.user, job.project
    cs.user_jobs[user] = cs.user_jobs.get(user, 0) + 1
    cs.user_milli[user] = cs.user_milli.get(user, 0) + need_milli
    cs.project_jobs[project] = cs.project_jobs.get(project, 0) + 1
    cs.project_milli[project] = cs.project_milli.get(project, 0) + need_milli


def limit_block(cs: CycleState, job: JobView, req: Request) -> str | None:
    """Why the job's user or project may not run one more job like it now (the user's
    limit first, as Slurm checks the user association before the account's); None if
    both may."""
    need = req.milli * job.total_gpus
    user, project = job.user, job.project
    limits = cs.user_limits.get(user)
    if limits is not None:
        why = running_limit.block(
            f"user {user}", limits, cs.user_jobs.get(user, 0), cs.user_milli.get(user, 0), need
        )
        if why is not None:
            return why
    limits = cs.project_limits.get(project)
    if limits is not None:
        return running_limit.block(
            f"project {project}",
            limits,
            cs.project_jobs.get(project, 0),
            cs.project_milli.get(project, 0),
            need,
        )
    return None


def maintenance_barred(cs: CycleState, job: JobView) -> frozenset[str]:
    """The nodes whose maintenance begins before this job's time limit (with its grace
    period) would end, or all of them if it has none: as Slurm, by the limit, which
    the agent enforces, not the estimate."""
    limit = job.max_runtime_s
    barred = cs.barred_by_limit.get(limit)
    if barred is None:
        end = None if limit is None else cs.now + timedelta(seconds=limit)
        barred = cs.barred_by_limit[limit] = frozenset(
            [name for name, at in cs.maintenance if end is None or end > at]
        )
    return barred


def chosen_barred(cs: CycleState, job: JobView) -> frozenset[str]:
    """The nodes the job's own choice leaves out (only_nodes, exclude_nodes)."""
    key = (job.only_nodes, job.exclude_nodes)
    barred = cs.barred_by_choice.get(key)
    if barred is None:
        names = [n.name for n in cs.nodes]
        barred = cs.barred_by_choice[key] = node_choice.barred(job, names)
    return barred
