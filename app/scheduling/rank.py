"""Why a waiting job is where it is in the queue, as Slurm's `sprio`: for each job ahead of
it, the first rule of the queue policy that puts that job first, counted per rule.

The pending reason says why a job cannot start now; this says why others are served
before it. Pure: the same order (`queue.order_jobs`) the cycle ranks by, explained.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
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
class RankColumns:
    """`rank_of` of every job in a queue, column by column (index i: position i + 1)."""

    ahead: dict[str, list[int]]  # per rule of AHEAD_RULES, the jobs ahead by it
    expected_gpu_s: list[float]
    expected_from: list[str]
    starving: list[bool]
    las_queue: list[int] | None = None  # default and las: each job's LAS queue

    def rank(self, index: int, waited_s: float) -> Rank:
        return Rank(
            position=index + 1,
            waiting=len(self.expected_gpu_s),
            ahead=tuple(
                (rule, self.ahead[rule][index])
                for rule, _ in AHEAD_RULES
                if self.ahead[rule][index]
            ),
            expected_gpu_s=self.expected_gpu_s[index],
            expected_from=self.expected_from[index],
            waited_s=waited_s,
            starving=self.starving[index],
            las_queue=None if self.las_queue is None else self.las_queue[index],
        )


def rank_columns(
    order: Sequence[JobView],
    *,
    settings: PolicySettings,
    history: Mapping[tuple[str, str], tuple[float, ...]],
    now: datetime,
) -> RankColumns:
    """`rank_of` for every job of `order` at once, as a full cycle stores them for
    GET /jobs/{id}/rank: the same counts, by prefix counts per group (a sorted list of
    the values seen so far where a rule compares sizes, levels or priorities), so 20,000
    jobs cost one pass and a bisection each, not 20,000 passes over the jobs ahead."""
    limit = settings.starvation_after_s
    starved_before = now - timedelta(seconds=limit) if limit > 0 else None
    count: _DefaultCounts | _OneRuleCounts
    if settings.queue_policy == "default":
        count = _DefaultCounts(settings, now)
    else:
        count = _OneRuleCounts(settings.queue_policy, settings)
    sizes: list[float] = []
    sources: list[str] = []
    starving_flags: list[bool] = []
    queues: list[int] | None = [] if settings.queue_policy in ("default", "las") else None
    # Jobs of one shape (an array's tasks, a sweep) share their size and its source.
    shapes: dict[tuple[object, ...], tuple[float, str]] = {}
    for job in order:
        shape = (job.user, job.name, job.estimated_runtime_s, job.max_runtime_s, job.total_gpus)
        known = shapes.get(shape)
        if known is None:
            predicted = predict_runtime(history, job)
            known = shapes[shape] = (
                expected_gpu_s(job, predicted, settings),
                _expected_from(job, predicted),
            )
        sizes.append(known[0])
        sources.append(known[1])
        starving_flags.append(starved_before is not None and submitted(job) <= starved_before)
        if queues is not None:
            level = _las_queue(job, settings, now)
            queues.append(0 if level is None else level)
    # Every value the counts compare is known now: each group's counter is sized by them.
    count.prepare([count.value(job, size) for job, size in zip(order, sizes, strict=True)])
    counts = [
        count(job, size, starving)
        for job, size, starving in zip(order, sizes, starving_flags, strict=True)
    ]
    # Transposed once: columns of counts, and the jobs ahead by none of the rules.
    columns = [list(column) for column in zip(*counts, strict=True)] or [[] for _ in COUNTED]
    ahead = dict(zip(COUNTED, columns, strict=True))
    ahead["earlier"] = [i - sum(counted) for i, counted in enumerate(counts)]
    return RankColumns(
        {rule: ahead[rule] for rule, _ in AHEAD_RULES}, sizes, sources, starving_flags, queues
    )


def rank_all(
    order: Sequence[JobView],
    *,
    settings: PolicySettings,
    history: Mapping[tuple[str, str], tuple[float, ...]],
    now: datetime,
) -> list[Rank]:
    """`rank_of` of every job of `order`, in order (`rank_columns`, one Rank each)."""
    columns = rank_columns(order, settings=settings, history=history, now=now)
    return [
        columns.rank(i, max(0.0, (now - submitted(job)).total_seconds()))
        for i, job in enumerate(order)
    ]


# The rules counted per job (the jobs ahead by none of them are "earlier").
COUNTED = ("priority", "starving", "fair_share", "shorter", "less_service")
_NONE = (0, 0, 0, 0, 0)


class _Smaller:
    """How many of the values counted so far in a group are smaller than a value: a
    Fenwick tree per group over the values' places among all of them (known up front),
    kept sparse (a dict: a group holds few of them). A sorted list per group, kept by
    insort, moved every larger value on each insertion: quadratic, most of ranking
    20,000 jobs of distinct sizes (bench/rank.py)."""

    def __init__(self, values: Sequence[float]) -> None:
        self.place = {value: i for i, value in enumerate(sorted(set(values)), start=1)}
        self.span = len(self.place)
        self.trees: dict[object, dict[int, int]] = {}
        self.counted: dict[object, int] = {}

    def smaller(self, group: object, value: float) -> int:
        tree = self.trees.get(group)
        if tree is None:
            return 0
        total = 0
        i = self.place[value] - 1
        while i > 0:
            total += tree.get(i, 0)
            i -= i & -i
        return total

    def add(self, group: object, value: float) -> None:
        tree = self.trees.get(group)
        if tree is None:
            tree = self.trees[group] = {}
        i = self.place[value]
        span = self.span
        while i <= span:
            tree[i] = tree.get(i, 0) + 1
            i += i & -i
        self.counted[group] = self.counted.get(group, 0) + 1

    def size(self, group: object) -> int:
        return self.counted.get(group, 0)


class _OneRuleCounts:
    """fifo, las, sjf, priority, fair-share: the jobs ahead by the policy's one rule
    (fair-share: its project's, by priority; the others' by fair share); the rest are
    earlier."""

    def __init__(self, policy: str, settings: PolicySettings) -> None:
        self.policy = policy
        self.settings = settings
        self.seen = _Smaller(())  # per group: the values so far (`prepare`)
        self.index = 0

    def value(self, job: JobView, size: float) -> float:
        """What the policy compares: a smaller value goes first."""
        policy = self.policy
        if policy == "las":
            return float(las_level(job.attained_gpu_s, self.settings))
        if policy == "sjf":
            return size
        if policy == "fifo":
            return 0.0
        return float(-job.priority)  # priority, fair-share: a higher priority is smaller

    def prepare(self, values: Sequence[float]) -> None:
        self.seen = _Smaller(values)

    def __call__(self, job: JobView, size: float, starving: bool) -> tuple[int, int, int, int, int]:
        """(priority, starving, fair_share, shorter, less_service), as COUNTED."""
        policy = self.policy
        index = self.index
        self.index += 1
        if policy == "fifo":
            return _NONE
        group = job.project if policy == "fair-share" else ""
        value = self.value(job, size)
        seen = self.seen
        below = seen.smaller(group, value)
        other_projects = index - seen.size(group) if policy == "fair-share" else 0
        seen.add(group, value)
        if policy == "las":
            return (0, 0, 0, 0, below)
        if policy == "sjf":
            return (0, 0, 0, below, 0)
        return (below, 0, other_projects, 0, 0)


class _DefaultCounts:
    """`_why_ahead` of the default policy, counted: other tiers by priority; in the
    tier, starving jobs (earlier when it starves too), jobs of an earlier LAS queue by
    less service, other projects in its queue by fair share, its own project by size."""

    def __init__(self, settings: PolicySettings, now: datetime) -> None:
        self.settings = settings
        self.now = now
        self.index = 0
        self.tier: dict[int, int] = {}
        self.starving: dict[int, int] = {}
        self.calm: dict[tuple[int, int], int] = {}  # not starving, per tier and queue
        # Not starving, per tier, queue and project: their sizes (`prepare`).
        self.own = _Smaller(())

    def value(self, job: JobView, size: float) -> float:
        return size

    def prepare(self, values: Sequence[float]) -> None:
        self.own = _Smaller(values)

    def __call__(self, job: JobView, size: float, starving: bool) -> tuple[int, int, int, int, int]:
        """(priority, starving, fair_share, shorter, less_service), as COUNTED."""
        tier = job.priority
        index = self.index
        self.index += 1
        in_tier = self.tier.get(tier, 0)
        self.tier[tier] = in_tier + 1
        starving_ahead = self.starving.get(tier, 0)
        level = 0 if starving else queue_level(job, self.now, self.settings)
        calm = self.calm
        earlier_queues = sum(n for (t, q), n in calm.items() if t == tier and q < level)
        calm_ahead = calm.get((tier, level), 0)
        own = self.own
        group = (tier, level, job.project)
        counted = (
            index - in_tier,
            0 if starving else starving_ahead,  # a starving job: those are earlier
            calm_ahead - own.size(group),
            own.smaller(group, size),
            earlier_queues,
        )
        if starving:
            self.starving[tier] = starving_ahead + 1
        else:
            calm[(tier, level)] = calm_ahead + 1
            own.add(group, size)
        return counted
