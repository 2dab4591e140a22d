"""Queue order policies: which pending job is considered first.

Every policy returns all pending jobs in one total, deterministic order (ties
broken by submit time, then id), which also gives each job its queue position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from operator import attrgetter

from app.scheduling.types import JobView, PolicySettings, ProjectView, RunningJobView
from app.scheduling.usage import predict_runtime

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _submitted(job: JobView) -> datetime:
    return job.submitted_at or _EPOCH


_ID = attrgetter("id")
_SUBMITTED = attrgetter("submitted_at")
_PRIORITY = attrgetter("priority")


def fifo(jobs: Iterable[JobView]) -> list[JobView]:
    """First come, first served."""
    ordered = list(jobs)
    if all(j.submitted_at is not None for j in ordered):
        # Same order as the general key below, in two stable passes with one-attribute
        # keys (no key tuples; the id pass is linear when jobs come in id order).
        ordered.sort(key=_ID)
        ordered.sort(key=_SUBMITTED)
        return ordered
    return sorted(ordered, key=lambda j: (j.submitted_at or _EPOCH, j.id))


def by_priority(jobs: Iterable[JobView]) -> list[JobView]:
    """Higher priority first, FIFO within a priority."""
    ordered = fifo(jobs)
    # Stable (reverse=True keeps equal keys in place): FIFO within each priority.
    ordered.sort(key=_PRIORITY, reverse=True)
    return ordered


def fair_share(
    jobs: Iterable[JobView],
    projects: Mapping[str, ProjectView],
    running: Iterable[RunningJobView],
    settings: PolicySettings,
    charge: dict[str, float] | None = None,
) -> list[JobView]:
    """Interleave projects by (decayed usage + outstanding GPUs x horizon) / weight.

    Each job taken from a project charges it `gpus x horizon`, so a project with
    weight 2 gets about twice the queue slots of a weight-1 project with the
    same usage, and one big project's backlog cannot push everyone else back.
    Within a project: priority, then FIFO. `charge` (project -> GPU-seconds)
    carries across calls so priority tiers share one account.
    """
    horizon = settings.fair_share_horizon_s
    if charge is None:
        charge = _initial_charge(projects, running, horizon)
    ordered = by_priority(jobs)
    if len({j.project for j in ordered}) <= 1:
        for job in ordered:  # keep the account right for later tiers
            charge[job.project] = charge.get(job.project, 0.0) + max(1, job.total_gpus) * horizon
        return ordered
    # Taking a project's next job charges it; the project with the smallest charge/weight
    # goes next. Charges only grow, so that greedy merge equals one sort by the key each
    # job has when its turn comes (ties by project name, then the project's own order).
    weight: dict[str, float] = {}
    for name in {j.project for j in ordered}:
        weight[name] = _weight(name, projects)
        charge.setdefault(name, 0.0)
    keyed: list[tuple[float, str, int, JobView]] = []
    append = keyed.append
    for k, job in enumerate(ordered):
        name = job.project
        # k (position in priority order) breaks ties like the project's own queue order
        append((charge[name] / weight[name], name, k, job))
        gpus = job.gpus * job.nodes if job.nodes > 1 else job.gpus
        charge[name] += (gpus if gpus > 1 else 1) * horizon
    # Plain tuple order: k is unique, so the job itself is never compared.
    keyed.sort()
    return [t[3] for t in keyed]


def _initial_charge(
    projects: Mapping[str, ProjectView], running: Iterable[RunningJobView], horizon: float
) -> dict[str, float]:
    charge = {name: p.usage_gpu_s for name, p in projects.items()}
    for r in running:
        charge[r.job.project] = charge.get(r.job.project, 0.0) + r.job.total_gpus * horizon
    return charge


def _weight(name: str, projects: Mapping[str, ProjectView]) -> float:
    """Fair-share weight; unknown projects count 1, a zero weight goes last (not /0)."""
    p = projects.get(name)
    if p is None:
        return 1.0
    return p.weight if p.weight > 0 else 1e-9


def default(
    jobs: Iterable[JobView],
    projects: Mapping[str, ProjectView],
    running: Iterable[RunningJobView],
    settings: PolicySettings,
) -> list[JobView]:
    """Priority tiers; fair share between projects inside a tier."""
    tiers: dict[int, list[JobView]] = {}
    for j in jobs:
        tiers.setdefault(j.priority, []).append(j)
    charge = _initial_charge(projects, running, settings.fair_share_horizon_s)
    order: list[JobView] = []
    for prio in sorted(tiers, reverse=True):
        order.extend(fair_share(tiers[prio], projects, (), settings, charge))
    return order


def expected_runtime(
    job: JobView,
    history: Mapping[tuple[str, str], tuple[float, ...]],
    settings: PolicySettings,
) -> float:
    """Runtime used for SJF order: estimate, else history median, else limit, else default."""
    if job.estimated_runtime_s is not None:
        return float(job.estimated_runtime_s)
    predicted = predict_runtime(history, job)
    if predicted is not None:
        return predicted
    if job.max_runtime_s is not None:
        return float(job.max_runtime_s)
    return settings.default_runtime_s


def sjf(
    jobs: Iterable[JobView],
    history: Mapping[tuple[str, str], tuple[float, ...]],
    settings: PolicySettings,
) -> list[JobView]:
    """Shortest expected GPU-time (runtime x GPUs) first, as in Helios' QSSF.

    Counting GPUs keeps a short 64-GPU job from jumping a queue of long 1-GPU
    jobs that together need less of the cluster.
    """
    return sorted(
        jobs,
        key=lambda j: (
            expected_runtime(j, history, settings) * max(1, j.total_gpus),
            _submitted(j),
            j.id,
        ),
    )


def las_level(attained_gpu_s: float, settings: PolicySettings) -> int:
    """Tiresias discretised LAS queue: 0 until the first threshold, then 1, ..."""
    level = 0
    for t in settings.las_thresholds_gpu_s:
        if attained_gpu_s >= t:
            level += 1
    return level


def attained(job: JobView, now: datetime, started_at: datetime | None, share: float) -> float:
    """Attained GPU-seconds: before the current run plus the current run so far."""
    extra = 0.0
    if started_at is not None:
        extra = max(0.0, (now - started_at).total_seconds()) * job.total_gpus * min(1.0, share)
    return job.attained_gpu_s + extra


def las(jobs: Iterable[JobView], settings: PolicySettings) -> list[JobView]:
    """Least attained service (Tiresias 2D-LAS): lower queue first, FIFO inside."""
    return sorted(jobs, key=lambda j: (las_level(j.attained_gpu_s, settings), _submitted(j), j.id))


def order_jobs(
    jobs: Iterable[JobView],
    *,
    settings: PolicySettings,
    projects: Mapping[str, ProjectView],
    running: Iterable[RunningJobView],
    history: Mapping[tuple[str, str], tuple[float, ...]],
) -> list[JobView]:
    policy = settings.queue_policy
    table: dict[str, Callable[[], list[JobView]]] = {
        "fifo": lambda: fifo(jobs),
        "priority": lambda: by_priority(jobs),
        "fair-share": lambda: fair_share(jobs, projects, running, settings),
        "sjf": lambda: sjf(jobs, history, settings),
        "las": lambda: las(jobs, settings),
        "default": lambda: default(jobs, projects, running, settings),
    }
    if policy not in table:
        raise ValueError(f"unknown queue policy {policy!r}")
    return table[policy]()
