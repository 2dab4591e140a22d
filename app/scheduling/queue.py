"""Queue order policies: which pending job is considered first.

Every policy returns all pending jobs in one total, deterministic order (ties
broken by submit time, then id), which also gives each job its queue position.
"""

from __future__ import annotations

import math
from bisect import insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from operator import attrgetter

from app.scheduling.types import JobView, PolicySettings, ProjectView, RunningJobView
from app.scheduling.usage import predict_runtime

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def submitted(job: JobView) -> datetime:
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
    in_priority_order: list[JobView],
    projects: Mapping[str, ProjectView],
    running: Iterable[RunningJobView],
    settings: PolicySettings,
) -> list[JobView]:
    """Interleave projects by (decayed usage + outstanding GPUs x horizon) / weight.

    Each job taken from a project charges it `gpus x horizon`, so a project with
    weight 2 gets about twice the queue slots of a weight-1 project with the
    same usage, and one big project's backlog cannot push everyone else back.
    Within a project: priority, then FIFO (`in_priority_order`: the queue so, as
    `by_priority` orders it).
    """
    charge = _initial_charge(projects, running, settings.fair_share_horizon_s)
    return _interleave(_by_project(in_priority_order), projects, settings, charge)


def _by_project(ordered: Iterable[JobView]) -> dict[str, list[JobView]]:
    """Each project's jobs, in `ordered`'s order."""
    queues: dict[str, list[JobView]] = {}
    queue: list[JobView] = []
    for job in ordered:
        if not queue or queue[-1].project != job.project:
            queue = queues.setdefault(job.project, [])
        queue.append(job)
    return queues


def _interleave(
    queues: Mapping[str, list[JobView]],
    projects: Mapping[str, ProjectView],
    settings: PolicySettings,
    charge: dict[str, float],
) -> list[JobView]:
    """Merge the projects' queues (project -> its jobs in order) by fair-share charge.

    `charge` (project -> GPU-seconds) is updated, so priority tiers share one account.
    """
    horizon = settings.fair_share_horizon_s
    if len(queues) == 1:
        only = next(iter(queues.values()))
        _charge(only, charge, horizon)  # keep the account right for later tiers
        return only
    # Taking a project's next job charges it; the project with the smallest charge/weight
    # goes next. Charges only grow, so that greedy merge equals one sort by the key each
    # job has when its turn comes. Equal keys (rare unless usage is equal) go by project
    # name, each project's in its own order: the ties' order, which the (stable) sort by
    # key keeps.
    ordered: list[JobView] = []
    keys: list[float] = []
    append = keys.append
    for name in sorted(queues):
        weight = _weight(name, projects)
        owed = charge.get(name, 0.0)
        queue = queues[name]
        for job in queue:
            append(owed / weight)
            owed += _cost(job, horizon)
        charge[name] = owed
        ordered.extend(queue)
    return _by_key(ordered, keys)


def _cost(job: JobView, horizon: float) -> float:
    """What running `job` for the fair-share horizon charges its project (GPU-seconds)."""
    return max(1, job.total_gpus) * horizon


def _charge(jobs: Iterable[JobView], charge: dict[str, float], horizon: float) -> None:
    for job in jobs:
        charge[job.project] = charge.get(job.project, 0.0) + _cost(job, horizon)


def _initial_charge(
    projects: Mapping[str, ProjectView], running: Iterable[RunningJobView], horizon: float
) -> dict[str, float]:
    charge = {name: p.usage_gpu_s for name, p in projects.items()}
    _charge([r.job for r in running], charge, horizon)
    return charge


def _weight(name: str, projects: Mapping[str, ProjectView]) -> float:
    """Fair-share weight; unknown projects count 1, a zero weight goes last (not /0)."""
    p = projects.get(name)
    if p is None:
        return 1.0
    return p.weight if p.weight > 0 else 1e-9


def default(
    by_deadline: list[JobView],
    projects: Mapping[str, ProjectView],
    running: Iterable[RunningJobView],
    settings: PolicySettings,
    now: datetime,
) -> list[JobView]:
    """Priority tiers; inside a tier, Tiresias' discretised 2D-LAS queues (least attained
    GPU-time first), fair share between projects inside each queue, and inside each
    project a deadline that blends arrival order with short-first (`deadline`).

    Why each part (measured in docs/scheduling.md): least attained service needs no
    runtime and is what wins where jobs may be preempted (a newcomer goes ahead of what
    has already run a while, and preemption makes room for it); where they may not,
    every pending job is in the first queue and the deadline's short-first half is
    what cuts the average. Ages count relative to a job's own size, never as one
    absolute wait: a job preempted back to the queue is promoted to the first queue
    once it has waited `promote_after_service` x the service it got (Tiresias'
    PROMOTE_KNOB), and inside a queue a later job goes ahead only while its deadline is
    earlier, so no job's wait grows without bound and an overloaded cluster does not
    collapse into FIFO. An optional absolute guard (`starvation_after_s` > 0, off by
    default) still puts jobs pending that long first, in submit order.

    `by_deadline`: the queue in deadline order (`by_deadlines`). It is a total order, so
    each group below, kept in it, is in its own deadline order.
    """
    tiers: dict[int, list[JobView]] = {}
    tier: list[JobView] = []
    for j in by_deadline:
        # Most neighbours share a tier: a dict lookup only where the tier changes.
        if not tier or tier[-1].priority != j.priority:
            tier = tiers.setdefault(j.priority, [])
        tier.append(j)
    horizon = settings.fair_share_horizon_s
    charge = _initial_charge(projects, running, horizon)
    limit = settings.starvation_after_s
    # A limit beyond the epoch's age can never be reached (and would overflow the date).
    guard = 0 < limit < (now - _EPOCH).total_seconds()
    starved_since = now - timedelta(seconds=limit) if guard else now
    order: list[JobView] = []
    for prio in sorted(tiers, reverse=True):
        tier = tiers[prio]
        if guard:
            starving = [j for j in tier if submitted(j) <= starved_since]
            if starving:
                _charge(starving, charge, horizon)
                order.extend(fifo(starving))
                tier = [j for j in tier if submitted(j) > starved_since]
        queues: dict[int, list[JobView]] = {}
        queue: list[JobView] = []
        queued_at = -1  # `queue`'s level
        for j in tier:
            level = queue_level(j, now, settings)
            if level != queued_at:
                queue = queues.setdefault(level, [])
                queued_at = level
            queue.append(j)
        for level in sorted(queues):
            order.extend(_interleave(_by_project(queues[level]), projects, settings, charge))
    return order


def queue_level(job: JobView, now: datetime, settings: PolicySettings) -> int:
    """The default policy's LAS queue for a pending job: by attained GPU-time
    (`las_level`), but the first queue once it has waited `promote_after_service` x the
    run time it got since it last ran (Tiresias' promotion: relative to its service,
    so a long job preempted once waits long before it is promoted, a short one not)."""
    if job.attained_gpu_s <= 0:
        return 0
    level = las_level(job.attained_gpu_s, settings)
    knob = settings.promote_after_service
    if level and knob > 0:
        service_s = job.attained_gpu_s / max(1, job.total_gpus)
        since = job.last_preempted_at or job.submitted_at or _EPOCH
        if _seconds(now - since) >= knob * service_s:
            return 0
    return level


def deadline(job: JobView, predicted: float | None, settings: PolicySettings) -> float:
    """Seconds since the epoch by which the default policy wants `job` started: its
    submit time plus `short_first_factor` x its expected remaining GPU-time.

    A job submitted later goes ahead only while it is expected to be shorter by more
    than the time between the two submissions over the factor: a fresh 1-GPU 1 h job goes
    before an 8-GPU 10 h job (80 GPU-h) until that job has waited 79 GPU-h x the factor:
    20 h with 0.25; with the default 1000, about 9 years, so short-first in practice (the
    bound is real but long; docs/scheduling.md). A later arrival's deadline is never before its own submit time, so once
    the clock passes a job's deadline nothing submitted from then on goes ahead of it.
    """
    size = expected_gpu_s(job, predicted, settings) - job.attained_gpu_s
    return _seconds(submitted(job) - _EPOCH) + settings.short_first_factor * max(0.0, size)


def by_deadlines(
    jobs: Iterable[JobView],
    history: Mapping[tuple[str, str], tuple[float, ...]],
    settings: PolicySettings,
) -> list[JobView]:
    """`jobs` by `deadline`, ties in submit order."""
    predicted: dict[tuple[str, str], float | None] = {}  # one median per user + name
    ordered = fifo(jobs)  # the ties' order: the sort by deadline keeps it
    keys: list[float] = []
    append = keys.append
    for j in ordered:
        guess: float | None = None
        if j.estimated_runtime_s is None:  # else no prediction is asked for
            key = (j.user, j.name)
            if key not in predicted:
                predicted[key] = predict_runtime(history, j)
            guess = predicted[key]
        append(deadline(j, guess, settings))
    return _by_key(ordered, keys)


def expected_runtime(job: JobView, predicted: float | None, settings: PolicySettings) -> float:
    """Runtime used for short-first order: estimate, else the history prediction
    (`predict_runtime`), else limit, else default."""
    if job.estimated_runtime_s is not None:
        return float(job.estimated_runtime_s)
    if predicted is not None:
        return predicted
    if job.max_runtime_s is not None:
        return float(job.max_runtime_s)
    return settings.default_runtime_s


def expected_gpu_s(job: JobView, predicted: float | None, settings: PolicySettings) -> float:
    """A job's size for short-first order: expected runtime x GPUs."""
    return expected_runtime(job, predicted, settings) * max(1, job.total_gpus)


def sjf(
    jobs: Iterable[JobView],
    history: Mapping[tuple[str, str], tuple[float, ...]],
    settings: PolicySettings,
) -> list[JobView]:
    """Shortest expected GPU-time (runtime x GPUs) first, as in Helios' QSSF.

    Counting GPUs keeps a short 64-GPU job from jumping a queue of long 1-GPU
    jobs that together need less of the cluster.
    """
    predicted: dict[tuple[str, str], float | None] = {}  # one median per user + name
    ordered = fifo(jobs)  # the ties' order: the sort by size keeps it
    sizes: list[float] = []
    for j in ordered:
        key = (j.user, j.name)
        if j.estimated_runtime_s is None and key not in predicted:
            predicted[key] = predict_runtime(history, j)
        sizes.append(expected_gpu_s(j, predicted.get(key), settings))
    return _by_key(ordered, sizes)


def _by_key(jobs: list[JobView], keys: list[float]) -> list[JobView]:
    """`jobs` by ascending `keys` (one float per job), equal keys in `jobs`' order: the
    sort is stable, so a caller passes `jobs` in the order its ties should have. A sort
    of indexes on the plain float key: much cheaper than sorting tuples of the key and
    the tie-breaks."""
    return [jobs[i] for i in sorted(range(len(jobs)), key=keys.__getitem__)]


def _seconds(span: timedelta) -> float:
    """`span.total_seconds()`, to the same float (whole microseconds, one correctly
    rounded division) for spans under 2**53 µs (285 years), without its method call:
    compiled, several times cheaper, and `sjf` needs it for every pending job."""
    # In floats: every step is exact below 2**53, and the division correctly rounded, as
    # the integer one is; compiled integer products this large take the slow path.
    return ((span.days * 86_400.0 + span.seconds) * 1e6 + span.microseconds) / 1e6


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


def las_victim(run: RunningJobView, now: datetime, settings: PolicySettings) -> bool:
    """Whether stopping `run` for a job of an earlier LAS queue pays for the preemption's
    cost (`settings.preemption_cost_s` of work it must redo), under the default policy.

    It must have run `preempt_after_cost` x the cost since it started (so no job loses
    more to preemptions than a fixed part of its run), and it must not be expected to
    end within `preempt_remaining_cost` x the cost (`time_left`).
    """
    cost = settings.preemption_cost_s
    if _seconds(now - run.started_at) < settings.preempt_after_cost * cost:
        return False
    bar = settings.preempt_remaining_cost * cost
    return bar <= 0 or time_left(run.job, now, run.started_at, run.share) >= bar


def time_left(job: JobView, now: datetime, started_at: datetime | None, share: float) -> float:
    """Expected seconds of run time `job` has left: its estimate (else its limit) less the
    time it has been served, counting earlier runs (and the current one, started at
    `started_at`). Infinite for a job with neither, or one that has outrun its estimate
    (least attained service's premise: one that has run long is likely to run longer)."""
    expected = job.estimated_runtime_s if job.estimated_runtime_s is not None else job.max_runtime_s
    if expected is None:
        return math.inf
    width = job.total_gpus * min(1.0, share)
    served = job.attained_gpu_s / width if width > 0 else 0.0
    if started_at is not None:
        served += max(0.0, _seconds(now - started_at))
    left = expected - served
    return left if left > 0 else math.inf


def las(jobs: Iterable[JobView], settings: PolicySettings) -> list[JobView]:
    """Least attained service (Tiresias 2D-LAS): lower queue first, FIFO inside."""
    return sorted(jobs, key=lambda j: (las_level(j.attained_gpu_s, settings), submitted(j), j.id))


_History = Mapping[tuple[str, str], tuple[float, ...]]
# A policy's sort key of a job, from its view, its predicted runtime and the settings;
# ties go by submit time, then id.
_Key = Callable[[JobView, float | None, PolicySettings], float]


def _submit_order(job: JobView, predicted: float | None, settings: PolicySettings) -> float:
    return 0.0


def _priority_key(job: JobView, predicted: float | None, settings: PolicySettings) -> float:
    return -float(job.priority)


def _las_key(job: JobView, predicted: float | None, settings: PolicySettings) -> float:
    return float(las_level(job.attained_gpu_s, settings))


# Per policy: the key of its one-key order (`_SORTS`), and whether it asks the runtime
# history (for a job without an estimate).
_KEYS: dict[str, tuple[_Key, bool]] = {
    "fifo": (_submit_order, False),
    "priority": (_priority_key, False),
    "fair-share": (_priority_key, False),
    "sjf": (expected_gpu_s, True),
    "las": (_las_key, False),
    "default": (deadline, True),
}


class _Entry:
    """A job's place in a `KeptOrder`: its key, submit time and id (unique)."""

    def __init__(self, key: float, view: JobView, guess: float | None, stamp: int) -> None:
        self.key = key
        self.guess = guess  # the predicted runtime `key` was worked out with
        self.submitted = submitted(view)
        self.id = view.id
        self.view = view
        self.stamp = stamp  # the last cycle that had this view in its queue
        self.at = 0  # its index in that cycle's `jobs`


def _entry_key(entry: _Entry) -> tuple[float, datetime, int]:
    return entry.key, entry.submitted, entry.id


class KeptOrder:
    """The queue in its policy's one-key order (`_SORTS`: submit time for `fifo`, the
    deadline for the default policy, ...), kept between cycles by whoever plans them
    (the simulator, the live scheduler's full cycles) and handed to `plan_cycle`.

    A job's key depends on its view and the settings, and on the runtime history only
    when the job has no estimate. So a view seen by the last cycle keeps its place (the
    views are immutable, and the snapshot reuses a view while its job is unchanged);
    only the jobs new to the queue, those whose view changed (requeued with more service,
    say) and those whose prediction moved are computed again and inserted. What left
    the queue is dropped in one pass. The order is exactly the sort's (a total order, so
    it cannot depend on what was kept: tests/scheduling/test_kept_order.py) and costs
    two linear passes plus the inserts, where the sort from scratch computed every key
    and sorted the whole queue two or three times (issue 35 point 3).
    """

    def __init__(self) -> None:
        self._settings: PolicySettings | None = None
        self._entries: list[_Entry] = []  # ascending
        self._entry_of: dict[int, _Entry] = {}  # job id -> its entry in `_entries`
        self._given: list[_Entry] = []  # the last cycle's `jobs`' entries, in its order
        self._stamp = 0

    def __len__(self) -> int:
        """How many jobs it keeps in order: the last cycle's queue."""
        return len(self._entries)

    def order(
        self, jobs: Iterable[JobView], history: _History, settings: PolicySettings
    ) -> list[JobView]:
        if settings is not self._settings and settings != self._settings:
            self._settings, self._entries, self._entry_of, self._given = settings, [], {}, []
        key_of, asks_history = _KEYS[settings.queue_policy]
        self._stamp += 1
        stamp = self._stamp
        entry_of = self._entry_of
        predicted: dict[tuple[str, str], float | None] = {}  # one median per user + name
        fresh: list[_Entry] = []
        # Queues come mostly in the same order as last time, less what left, plus what
        # came: walk last cycle's jobs alongside, and look a job up by its id only where
        # the two part (much cheaper than a lookup per job).
        given = self._given
        walk = 0
        now_given: list[_Entry] = []
        for j in jobs:
            old: _Entry | None = None
            if walk < len(given) and given[walk].view is j:
                old = given[walk]
                walk += 1
            else:
                old = entry_of.get(j.id)
                if old is not None:
                    if old.view is j and old.stamp == stamp - 1:
                        walk = old.at + 1
                    else:
                        old = None  # its job changed (or its id came twice): a new entry
            guess: float | None = None
            if asks_history and j.estimated_runtime_s is None:
                name = (j.user, j.name)
                if name not in predicted:
                    predicted[name] = predict_runtime(history, j)
                guess = predicted[name]
                if old is not None and old.guess != guess:
                    old = None  # its prediction moved
            if old is None:
                old = entry_of[j.id] = _Entry(key_of(j, guess, settings), j, guess, stamp)
                fresh.append(old)
            old.stamp = stamp
            old.at = len(now_given)
            now_given.append(old)
        self._given = now_given
        entries: list[_Entry] = []
        for e in self._entries:
            if e.stamp == stamp:
                entries.append(e)
            elif entry_of.get(e.id) is e:  # its job left the queue
                del entry_of[e.id]
        if len(fresh) * 8 > len(entries):
            entries.extend(fresh)
            entries.sort(key=_entry_key)
        else:
            for e in fresh:
                insort(entries, e, key=_entry_key)
        self._entries = entries
        return [e.view for e in entries]


def order_jobs(
    jobs: Sequence[JobView],
    *,
    settings: PolicySettings,
    projects: Mapping[str, ProjectView],
    running: Iterable[RunningJobView],
    history: Mapping[tuple[str, str], tuple[float, ...]],
    now: datetime,
    memo: KeptOrder | None = None,
) -> list[JobView]:
    """`jobs` in `settings.queue_policy`'s order. `memo`, kept by the caller between
    cycles, gives the same order cheaper (`KeptOrder`)."""
    policy = settings.queue_policy
    if policy not in _KEYS:
        raise ValueError(f"unknown queue policy {policy!r}")
    if memo is not None:
        ordered = memo.order(jobs, history, settings)
    else:
        ordered = _SORTS[policy](jobs, history, settings)
    if policy == "fair-share":
        return fair_share(ordered, projects, running, settings)
    if policy == "default":
        return default(ordered, projects, running, settings, now)
    return ordered


# Each policy's order by one key per job (ties by submit time, then id), from scratch.
# The fair-share and default policies interleave projects in this order.
_SORTS: dict[str, Callable[[Sequence[JobView], _History, PolicySettings], list[JobView]]] = {
    "fifo": lambda jobs, history, settings: fifo(jobs),
    "priority": lambda jobs, history, settings: by_priority(jobs),
    "fair-share": lambda jobs, history, settings: by_priority(jobs),
    "sjf": sjf,
    "las": lambda jobs, history, settings: las(jobs, settings),
    "default": by_deadlines,
}
