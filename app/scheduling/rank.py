"""Why a waiting job is where it is in the queue, as Slurm's `sprio`: for each job ahead of
it, the first rule of the queue policy that puts that job first, counted per rule.

The pending reason says why a job cannot start now; this says why others are served
before it. Pure: the same order (`queue.order_jobs`) the cycle ranks by, explained.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from app.scheduling.queue import expected_gpu_s, las_level, submitted
from app.scheduling.types import JobView, PolicySettings
from app.scheduling.usage import predict_runtime

# Why a job is ahead, in the order the rules apply; each with how a person reads it.
AHEAD_RULES: tuple[tuple[str, str], ...] = (
    ("priority", "a higher priority"),
    ("starving", "waited past the starvation guard (served first, oldest first)"),
    ("fair_share", "another project's fair-share turn"),
    ("shorter", "a smaller expected GPU-time"),
    ("less_service", "less GPU-time received so far (las)"),
    ("earlier", "submitted earlier (waited longer)"),
)
AHEAD_TEXT = dict(AHEAD_RULES)


@dataclass(frozen=True, slots=True)
class Rank:
    position: int  # 1 = next to be considered
    waiting: int  # jobs in the queue, this one included
    ahead: tuple[tuple[str, int], ...]  # (rule, how many jobs), in AHEAD_RULES order
    expected_gpu_s: float  # the size short-first order ranks by (before the default's aging)
    expected_from: str  # where its runtime comes from
    waited_s: float
    starving: bool  # default policy: waited past the starvation guard

    @property
    def message(self) -> str:
        place = f"{self.position} of {self.waiting} waiting"
        if not self.ahead:
            return f"{place}: first in line"
        parts = [f"{n} by {AHEAD_TEXT[rule]}" for rule, n in self.ahead]
        return f"{place}; ahead of it: " + "; ".join(parts)


def rank_of(
    order: Sequence[JobView],
    job_id: int,
    *,
    settings: PolicySettings,
    history: Mapping[tuple[str, str], tuple[float, ...]],
    now: datetime,
) -> Rank | None:
    """Where `job_id` is in `order` (the queue policy's order) and why; None if absent."""
    index = next((i for i, j in enumerate(order) if j.id == job_id), None)
    if index is None:
        return None
    job = order[index]
    size = _size(job, settings, history)  # once: every job ahead is compared with it
    counts = Counter(
        [
            _why_ahead(other, job, size=size, settings=settings, history=history, now=now)
            for other in order[:index]
        ]
    )
    waited = max(0.0, (now - submitted(job)).total_seconds())
    return Rank(
        position=index + 1,
        waiting=len(order),
        ahead=tuple((rule, counts[rule]) for rule, _ in AHEAD_RULES if counts[rule]),
        expected_gpu_s=size,
        expected_from=_expected_from(job, predict_runtime(history, job)),
        waited_s=waited,
        starving=_starving(job, settings, now),
    )


def _expected_from(job: JobView, predicted: float | None) -> str:
    if job.estimated_runtime_s is not None:
        return "its estimated runtime"
    if predicted is not None:
        return f"the median runtime of {job.user}'s earlier jobs named {job.name}"
    if job.max_runtime_s is not None:
        return "its time limit"
    return "the cluster's default runtime"


def _starving(job: JobView, settings: PolicySettings, now: datetime) -> bool:
    limit = settings.starvation_after_s
    return limit > 0 and (now - submitted(job)).total_seconds() >= limit


def _size(
    job: JobView, settings: PolicySettings, history: Mapping[tuple[str, str], tuple[float, ...]]
) -> float:
    """Its expected GPU-time, as short-first order sizes it. The default policy also
    shrinks it as a job waits: a job ahead by that alone counts as submitted earlier,
    which is what the aging stands for."""
    return expected_gpu_s(job, predict_runtime(history, job), settings)


def _why_ahead(
    other: JobView,
    job: JobView,
    *,
    size: float,
    settings: PolicySettings,
    history: Mapping[tuple[str, str], tuple[float, ...]],
    now: datetime,
) -> str:
    """The first rule of the policy by which `other` goes before `job` (it does); `size`
    is `job`'s expected GPU-time."""
    policy = settings.queue_policy
    if policy == "fifo":
        return "earlier"
    if policy == "las":
        level = las_level(other.attained_gpu_s, settings) < las_level(job.attained_gpu_s, settings)
        return "less_service" if level else "earlier"
    if policy == "sjf":
        return _by_size(other, size, settings, history)
    if policy == "priority" or (policy == "fair-share" and other.project == job.project):
        return "priority" if other.priority > job.priority else "earlier"
    if policy == "fair-share":
        return "fair_share"
    # default: priority tiers; in a tier, starving jobs first (FIFO), then fair share
    # between projects, and each project's jobs short first.
    if other.priority != job.priority:
        return "priority"
    if _starving(other, settings, now):
        return "starving" if not _starving(job, settings, now) else "earlier"
    if other.project != job.project:
        return "fair_share"
    return _by_size(other, size, settings, history)


def _by_size(
    other: JobView,
    size: float,
    settings: PolicySettings,
    history: Mapping[tuple[str, str], tuple[float, ...]],
) -> str:
    return "shorter" if _size(other, settings, history) < size else "earlier"
