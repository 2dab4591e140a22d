"""Why a waiting job is where it is in the queue, as Slurm's `sprio`: for each job ahead of
it, the first rule of the queue policy that puts that job first, counted per rule.

The pending reason says why a job cannot start now; this says why others are served
before it. Pure: the same order (`queue.order_jobs`) the cycle ranks by, explained.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.scheduling.queue import expected_gpu_s, las_level, queue_level, submitted
from app.scheduling.types import JobView, PolicySettings
from app.scheduling.usage import predict_runtime

# Why a job is ahead, in the order the rules apply; each with how a person reads it.
AHEAD_RULES: tuple[tuple[str, str], ...] = (
    ("priority", "a higher priority"),
    ("starving", "waited past the starvation guard (served first, oldest first)"),
    ("fair_share", "another project's fair-share turn"),
    ("shorter", "a smaller expected GPU-time"),
    ("less_service", "an earlier LAS queue: less GPU-time received so far, or promoted"),
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
    # default and las: its LAS queue (0: the first, least GPU-time received); else None
    las_queue: int | None = None

    @property
    def message(self) -> str:
        place = f"{self.position} of {self.waiting} waiting"
        queue = "" if self.las_queue is None else f"LAS queue {self.las_queue}"
        if not self.ahead:
            return f"{place}: first in line" + (f" ({queue})" if queue else "")
        parts = [f"{n} by {AHEAD_TEXT[rule]}" for rule, n in self.ahead]
        text = f"{place}; ahead of it: " + "; ".join(parts)
        return text + (f"; it is in {queue} (0: least GPU-time received)" if queue else "")


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
        las_queue=_las_queue(job, settings, now),
    )


def _las_queue(job: JobView, settings: PolicySettings, now: datetime) -> int | None:
    """The LAS queue the policy puts a waiting job in (the default's counts promotion)."""
    if settings.queue_policy == "default":
        return queue_level(job, now, settings)
    if settings.queue_policy == "las":
        return las_level(job.attained_gpu_s, settings)
    return None


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
    # default: priority tiers; in a tier, starving jobs first (FIFO), then the LAS
    # queues, in each fair share between projects, and each project's jobs short first.
    if other.priority != job.priority:
        return "priority"
    if _starving(other, settings, now):
        return "starving" if not _starving(job, settings, now) else "earlier"
    if queue_level(other, now, settings) < queue_level(job, now, settings):
        return "less_service"
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


@dataclass(frozen=True, slots=True)
class RankKeys:
    """What a full cycle ranks each job of its queue by (`rank_keys`): enough to count the
    jobs ahead of any one of them by rule (`ahead_of`) without their views. Jobs alike (an
    array's tasks, a sweep: the same size, priority, project and LAS queue) share a class:
    `of[i]` is the class of the job at position i + 1, and the other lists are per class,
    which keeps the stored ranking small (20,000 jobs of a few shapes: one short number
    each). Projects and runtime sources are numbered (their names in `projects` and
    `sources`)."""

    of: list[int]
    expected_gpu_s: list[float]
    expected_from: list[int]  # index into sources
    sources: list[str]
    priority: list[int]
    project: list[int]  # index into projects
    projects: list[str]
    starving: frozenset[int]  # the positions - 1 of the jobs past the starvation guard
    las_queue: list[int] | None = None  # default and las: each class's LAS queue


class RankClasses:
    """The classes of the jobs a full cycle ranked, kept for the next one (`rank_keys`'s
    `kept`): a job whose view and LAS queue are as they were keeps its class, without its
    key being built and looked up again (at 20,000 waiting that was most of ranking them,
    bench/deep_queue.py). A class is what its jobs are alike in, so its keys are worked
    out anew each time from one of its jobs, with that cycle's settings and runtime
    history, and the ranks are the same as without it."""

    def __init__(self) -> None:
        self.of_job: dict[int, tuple[JobView, int, int]] = {}  # id -> (view, LAS queue, class)
        self.classes: dict[tuple[object, ...], int] = {}  # what its jobs are alike in -> class
        self.example: list[JobView] = []  # one job of each class
        self.level: list[int] = []  # each class's LAS queue


def rank_keys(
    order: Sequence[JobView],
    *,
    settings: PolicySettings,
    history: Mapping[tuple[str, str], tuple[float, ...]],
    now: datetime,
    kept: RankClasses | None = None,
) -> RankKeys:
    """The keys of every job of `order`, in one pass. The counts per job are left to
    `ahead_of`, when someone asks: counting them for 20,000 jobs was most of what
    ranking a full cycle's queue cost, and almost all of it was never read. Classes are
    numbered in order of first appearance, whatever `kept` remembers."""
    if kept is None:
        kept = RankClasses()
    limit = settings.starvation_after_s
    starved_before = now - timedelta(seconds=limit) if limit > 0 else None
    policy = settings.queue_policy
    of_job, classes, example, levels = kept.of_job, kept.classes, kept.example, kept.level
    of: list[int] = []
    starving: list[int] = []
    number = [-1] * len(example)  # kept class -> its number in this ranking
    used: list[int] = []  # kept classes by number
    for i, job in enumerate(order):
        level = (
            queue_level(job, now, settings)
            if policy == "default"
            else las_level(job.attained_gpu_s, settings)
            if policy == "las"
            else 0
        )
        hit = of_job.get(job.id)
        if hit is not None and hit[0] is job and hit[1] == level:
            known = hit[2]
        else:
            alike = (
                job.user,
                job.name,
                job.estimated_runtime_s,
                job.max_runtime_s,
                job.total_gpus,
                job.priority,
                job.project,
                level,
            )
            found = classes.get(alike)
            if found is None:
                found = classes[alike] = len(example)
                example.append(job)
                levels.append(level)
                number.append(-1)
            known = found
            of_job[job.id] = (job, level, known)
        n = number[known]
        if n < 0:
            n = number[known] = len(used)
            used.append(known)
        of.append(n)
        if starved_before is not None and submitted(job) <= starved_before:
            starving.append(i)
    sizes: list[float] = []
    sources_of: list[int] = []
    priorities: list[int] = []
    project_of: list[int] = []
    queues: list[int] = []
    sources: dict[str, int] = {}
    projects: dict[str, int] = {}
    for c in used:
        job = example[c]
        predicted = predict_runtime(history, job)
        sizes.append(expected_gpu_s(job, predicted, settings))
        sources_of.append(sources.setdefault(_expected_from(job, predicted), len(sources)))
        priorities.append(job.priority)
        project_of.append(projects.setdefault(job.project, len(projects)))
        queues.append(levels[c])
    if len(of_job) > 2 * len(order) + 1000 or len(example) > 2 * len(used) + 100:
        # Mostly jobs gone from the queue: start again next time.
        kept.of_job, kept.classes, kept.example, kept.level = {}, {}, [], []
    return RankKeys(
        of=of,
        expected_gpu_s=sizes,
        expected_from=sources_of,
        sources=list(sources),
        priority=priorities,
        project=project_of,
        projects=list(projects),
        starving=frozenset(starving),
        las_queue=queues if policy in ("default", "las") else None,
    )


def ahead_of(
    keys: RankKeys, index: int, policy: str, *, gone: frozenset[int] = frozenset()
) -> tuple[tuple[str, int], ...]:
    """The jobs ahead of the job at `index` of a ranked queue, counted by the first rule
    of `policy` that puts each first (as `_why_ahead`), in AHEAD_RULES order and without
    rules that count none; `gone`: the indexes of jobs that left the queue since it was
    ranked, no longer ahead. One pass over the jobs ahead, when a job's rank is asked."""
    counts = dict.fromkeys(COUNTED, 0)
    ahead = [j for j in range(index) if j not in gone] if gone else range(index)
    of = keys.of
    mine = of[index]
    size = keys.expected_gpu_s
    queues = keys.las_queue
    if policy == "las" and queues is not None:
        counts["less_service"] = sum(1 for j in ahead if queues[of[j]] < queues[mine])
    elif policy == "sjf":
        counts["shorter"] = sum(1 for j in ahead if size[of[j]] < size[mine])
    elif policy in ("priority", "fair-share"):
        priority, project = keys.priority, keys.project
        by_project = policy == "fair-share"
        for j in ahead:
            other = of[j]
            if by_project and project[other] != project[mine]:
                counts["fair_share"] += 1
            elif priority[other] > priority[mine]:
                counts["priority"] += 1
    elif policy == "default":
        _count_default(keys, index, ahead, counts)
    counts["earlier"] = len(ahead) - sum(counts.values())
    return tuple((rule, counts[rule]) for rule, _ in AHEAD_RULES if counts.get(rule))


def _count_default(
    keys: RankKeys, index: int, ahead: Iterable[int], counts: dict[str, int]
) -> None:
    """`_why_ahead` of the default policy: other tiers by priority; in the tier, starving
    jobs (earlier when it starves too), jobs of an earlier LAS queue by less service,
    other projects in its queue by fair share, its own project by size."""
    of, priority, project, size = keys.of, keys.priority, keys.project, keys.expected_gpu_s
    queues = keys.las_queue or [0] * len(priority)
    starving = keys.starving
    mine = of[index]
    tier, level, own, own_size = priority[mine], queues[mine], project[mine], size[mine]
    is_starving = index in starving
    for j in ahead:
        other = of[j]
        if priority[other] != tier:
            counts["priority"] += 1
        elif j in starving:
            if not is_starving:
                counts["starving"] += 1
        elif queues[other] < level:
            counts["less_service"] += 1
        elif project[other] != own:
            counts["fair_share"] += 1
        elif size[other] < own_size:
            counts["shorter"] += 1


def rank_all(
    order: Sequence[JobView],
    *,
    settings: PolicySettings,
    history: Mapping[tuple[str, str], tuple[float, ...]],
    now: datetime,
) -> list[Rank]:
    """`rank_of` of every job of `order`, in order, from its keys (`rank_keys`,
    `ahead_of`): what a full cycle stores and the API answers from."""
    keys = rank_keys(order, settings=settings, history=history, now=now)
    return [
        Rank(
            position=i + 1,
            waiting=len(order),
            ahead=ahead_of(keys, i, settings.queue_policy),
            expected_gpu_s=keys.expected_gpu_s[keys.of[i]],
            expected_from=keys.sources[keys.expected_from[keys.of[i]]],
            waited_s=max(0.0, (now - submitted(job)).total_seconds()),
            starving=i in keys.starving,
            las_queue=None if keys.las_queue is None else keys.las_queue[keys.of[i]],
        )
        for i, job in enumerate(order)
    ]


# The rules counted per job (the jobs ahead by none of them are "earlier").
COUNTED = ("priority", "starving", "fair_share", "shorter", "less_service")
