"""Discrete-event trace simulator driven by the real `plan_cycle`.

Events are job arrivals and job completions, and off-peak window openings and
closings; the scheduler is asked for a plan at each distinct event time (never
on a fixed tick), and its plan is applied exactly: placements start jobs,
preemptions stop them (they resume later with their remaining work, as from a
checkpoint, and keep their attained service). Every preemption costs the stopped
job `preemption_cost_s` more seconds of work, the same under every policy: the
restart plus the work done since its last checkpoint, which is lost. Only the jobs
whose trace row is `preemptible` are ever offered to the scheduler as preemptible.

Fragmentation (GPU sharing) follows the measure of Weng et al., "Beware of
Fragmentation" (USENIX ATC '23): the free part of a GPU is a fragment for a job
that cannot use it, and a node's fragmentation is the free capacity weighted by
the share of the target workload that cannot use it. Here the target workload is
the run's own job mix, and only partly allocated GPUs count (the fragmentation
that sharing creates; a whole free GPU is usable by every job of one GPU): at
any instant, fragmented GPUs = the sum over GPUs with 0 < allocated < 1 of
free x (share of the run's jobs asking more than `free` of one GPU). A job of
whole GPUs asks a whole GPU of each, so with only such jobs this is exactly the
free capacity of partly used GPUs. `fragmentation` is its time average over the
makespan, as a share of all GPUs.

Off-peak windows are handled as in the live cycle (`app/cycle/run.py`): the
strictest window's `capacity_outside_fraction` bounds off-peak jobs outside
every window, and when a window closes `window_close_preemptions` stops its
preemptible off-peak jobs, which wait in the queue for the next opening. Window
specs are turned into intervals on a real calendar (`epoch` is a real instant),
so zones and daylight-saving changes apply.

What the scheduler is told about a job (the honest part): GPU count and share,
user, job name and VC. Not its duration. `estimated_runtime_s` is the median
of the durations of the same user's finished jobs with the same name
(`predict_runtime`), or unknown when there is no history yet. SJF orders by
that prediction and backfill reserves by it. With `exact_runtimes` the scheduler
is told each job's true duration instead: a clairvoyant reference that shows
what perfect runtime estimates would gain, not something a live cluster has.

Simulated GPUs are healthy, have no foreign load, and report continuously, so
the telemetry-age and stability checks are switched off (not simulated).
"""

from __future__ import annotations

import gc
import heapq
import math
import statistics
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from app.scheduling import (
    GpuView,
    JobView,
    KeptOrder,
    NodeGpus,
    NodeView,
    Placement,
    PolicySettings,
    ProjectView,
    RunningJobView,
    Snapshot,
    WindowInterval,
    decay_usage,
    plan_cycle,
    predict_runtime,
)
from app.scheduling.filters import enough_gpus, gpu_share
from app.scheduling.window_close import window_close_preemptions
from app.simulator.bounds import BoundJob, avg_jct_bound, makespan_bound
from app.simulator.energy import DEFAULT_GPU_WATTS, GpuRun, energy_use
from app.simulator.trace import TraceJob
from app.windows.calendar import WindowSpec, window_rules
from app.windows.tariff import Tariff
from app.windows.timeline import WindowTimeline

SIM_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
# A restart from a checkpoint plus the work since it, as charged for each preemption.
DEFAULT_PREEMPTION_COST_S = 300.0
FAIR_SHARE_HALF_LIFE_S = 7 * 86400.0
_HISTORY_KEEP = 50  # recent runs per (user, job name) kept for the runtime median

# Event kinds, in the order they are handled at one instant (all before the plan).
_END, _ARRIVAL, _WINDOW_EDGE, _REPLAN = 0, 1, 2, 3
# Policies whose plans never preempt in a replay: they preempt only for quotas, and a
# replay has none. Every other policy (las; default and priority, which preempt for
# priority today and may for more) is asked at each arrival while a job is preemptible.
_NEVER_PREEMPT = frozenset({"fifo", "sjf", "fair-share"})


class BoundRow(NamedTuple):
    """A lower bound as a result row: what no schedule of the run's jobs can beat."""

    avg_jct_s: float
    avg_queue_s: float  # avg JCT bound - mean duration
    makespan_s: float
    utilization: float  # the most a schedule reaching the makespan bound could have


@dataclass(slots=True)
class SimResult:
    policy: str
    jobs: int
    skipped: int
    avg_jct_s: float
    p50_jct_s: float
    p99_jct_s: float
    avg_queue_s: float  # time waiting: JCT minus the time the job ran (restarts included)
    makespan_s: float
    utilization: float  # the trace's own work (GPU-seconds) over GPUs x makespan
    preemptions: int
    per_vc: dict[str, float]
    lower_bounds: dict[str, float]
    # True when the scheduler was told true durations (`simulate(exact_runtimes=True)`).
    exact_runtimes: bool = False
    offpeak_jobs: int = 0
    # Of `preemptions`, those made because an off-peak window closed.
    window_preemptions: int = 0
    # Work each preemption added to its job, and the GPU-hours all preemptions cost
    # (seconds x the job's GPUs; a share of a GPU counts its fraction). That GPU time is
    # spent (energy counts it) but is not the trace's work, so `utilization` leaves it out.
    preemption_cost_s: float = 0.0
    preemption_lost_gpu_h: float = 0.0
    preemptible_jobs: int = 0
    # Time-averaged share of all GPUs left as fragments on partly used GPUs (module doc).
    fragmentation: float = 0.0
    # Run time x GPU-equivalents x watts; cost (None without a tariff) at the prices in
    # force while the GPUs ran, and the same energy at the tariff's highest price.
    energy_wh: float = 0.0
    cost: float | None = None
    cost_at_peak: float | None = None
    # Ids of the trace's jobs that can never fit the cluster (in `to_json`, skipped_jobs).
    skipped_ids: list[str] = field(default_factory=list, repr=False)
    # Not part of to_json: per-job JCTs (for CDF charts).
    jcts: list[float] = field(default_factory=list, repr=False)
    # Not part of to_json either: every stretch a job ran, in the order they ended.
    runs: list[GpuRun] = field(default_factory=list, repr=False)
    cycles: int = 0

    @property
    def jct_over_bound(self) -> float:
        """Average JCT over the bound that counts arrivals (what no schedule beats)."""
        bound = self.lower_bounds["avg_jct_s_with_arrivals"]
        return self.avg_jct_s / bound if bound > 0 else 1.0

    def bound_rows(self) -> tuple[BoundRow, BoundRow]:
        """The plain lower bounds, then those that also count arrivals."""
        lb = self.lower_bounds
        work_s = self.utilization * self.makespan_s  # GPU-seconds / GPUs
        rows = []
        for jct, makespan in (
            (lb["avg_jct_s"], lb["makespan_s"]),
            (lb["avg_jct_s_with_arrivals"], lb["makespan_s_with_arrivals"]),
        ):
            util = min(1.0, work_s / makespan) if makespan > 0 else 0.0
            rows.append(BoundRow(jct, jct - lb["avg_jct_s"], makespan, util))
        return rows[0], rows[1]

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "jobs": self.jobs,
            "skipped": self.skipped,
            "skipped_jobs": list(self.skipped_ids),
            "avg_jct_s": self.avg_jct_s,
            "p50_jct_s": self.p50_jct_s,
            "p99_jct_s": self.p99_jct_s,
            "avg_queue_s": self.avg_queue_s,
            "makespan_s": self.makespan_s,
            "utilization": self.utilization,
            "preemptions": self.preemptions,
            "preemption_cost_s": self.preemption_cost_s,
            "preemption_lost_gpu_h": self.preemption_lost_gpu_h,
            "preemptible_jobs": self.preemptible_jobs,
            "fragmentation": self.fragmentation,
            "per_vc": dict(self.per_vc),
            "lower_bounds": dict(self.lower_bounds),
            "exact_runtimes": self.exact_runtimes,
            "offpeak_jobs": self.offpeak_jobs,
            "window_preemptions": self.window_preemptions,
            "energy_wh": self.energy_wh,
            "cost": self.cost,
            "cost_at_peak": self.cost_at_peak,
        }


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def shape_for(gpu_num: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, gpus per node) for a trace job: one node if it fits, else a gang.

    A 12-GPU job on 8-GPU nodes becomes 2 nodes x 6 GPUs; a job whose count does
    not split evenly rounds up per node (a 20-GPU job takes 3 x 7).
    """
    if gpu_num <= gpus_per_node:
        return 1, gpu_num
    nodes = math.ceil(gpu_num / gpus_per_node)
    return nodes, math.ceil(gpu_num / nodes)


@dataclass(slots=True)
class _Job:
    trace: TraceJob
    view: JobView
    arrival: float
    remaining: float
    first_start: float | None = None
    started: float | None = None
    version: int = 0
    end: float | None = None
    preempted: int = 0


class _Gpus:
    """What is allocated on every simulated GPU (in 1/1000 of a GPU), the node views the
    scheduler is shown, and the fragmentation that the allocation leaves (module doc)."""

    def __init__(self, nodes: int, gpus_per_node: int, *, epoch: datetime, job_milli: list[int]):
        self.names = [f"n{i:04d}" for i in range(nodes)]
        self.milli: dict[str, list[int]] = {n: [0] * gpus_per_node for n in self.names}
        self._epoch = epoch
        self._views: dict[str, NodeView] = {}
        # Every GPU's view by (node, index, allocated), built once: most allocations recur.
        self._gpu_views: dict[tuple[str, int, int], GpuView] = {}
        # asking_more[f]: how many of the run's jobs ask more than f of one GPU.
        asking_more = [0] * 1001
        for m in job_milli:
            asking_more[m - 1] += 1
        for f in range(999, -1, -1):
            asking_more[f] += asking_more[f + 1]
        self._asking_more = asking_more
        self._jobs = max(1, len(job_milli))
        # Fragmented GPUs x 1000 x jobs, kept as an exact integer.
        self._fragment = 0

    @property
    def fragmented_gpus(self) -> float:
        return self._fragment / (1000 * self._jobs)

    def _fragment_of(self, allocated: int) -> int:
        if 0 < allocated < 1000:
            free = 1000 - allocated
            return free * self._asking_more[free]
        return 0

    def add(self, node_gpus: NodeGpus, milli: int) -> None:
        """Allocate `milli` of each GPU of `node_gpus` (release it when negative)."""
        for name, idxs in node_gpus:
            row = self.milli[name]
            for i in idxs:
                before = row[i]
                after = row[i] = before + milli
                if not 0 <= after <= 1000:
                    raise AssertionError(f"GPU {name}:{i} allocated {after} / 1000")
                self._fragment += self._fragment_of(after) - self._fragment_of(before)
            self._views.pop(name, None)

    def room(self) -> tuple[int, int]:
        """The most thousandths free on one GPU, and the most wholly free GPUs on one
        node: no job asking for more can be placed."""
        most_milli = most_whole = 0
        for row in self.milli.values():
            most_milli = max(most_milli, 1000 - min(row))
            most_whole = max(most_whole, row.count(0))
        return most_milli, most_whole

    def views(self) -> tuple[NodeView, ...]:
        return tuple(self._view(name) for name in self.names)

    def _view(self, name: str) -> NodeView:
        nv = self._views.get(name)
        if nv is None:
            nv = self._views[name] = NodeView(
                name=name,
                heartbeat_at=self._epoch,
                gpus=tuple(self._gpu_view(name, i, m) for i, m in enumerate(self.milli[name])),
            )
        return nv

    def _gpu_view(self, name: str, index: int, allocated: int) -> GpuView:
        key = (name, index, allocated)
        gv = self._gpu_views.get(key)
        if gv is None:
            peers = range(len(self.milli[name]))
            gv = self._gpu_views[key] = GpuView(
                index=index,
                uuid=f"{name}-{index}",
                model="sim",
                memory_total_mb=81920,
                memory_used_mb=0,
                util_pct=0.0,
                telemetry_at=self._epoch,
                idle_since=self._epoch - timedelta(days=1),
                temperature_c=40.0,
                allocated_milli=allocated,
                nvlink_peers=tuple(p for p in peers if p != index),
            )
        return gv


class _Waiting:
    """How many waiting jobs ask for each share of one GPU and for each count of whole
    GPUs per node (a few dozen shapes), kept as jobs come and go: whether any could fit
    what is free is then a few comparisons, not a walk of the queue."""

    def __init__(self) -> None:
        self.shares: dict[int, int] = {}
        self.whole: dict[int, int] = {}
        self.gpuless = 0

    def add(self, view: JobView, count: int = 1) -> None:
        if view.gpus <= 0:
            self.gpuless += count
            return
        # As the planner tells a shared job from a whole-GPU one (planner._first_fit).
        shared = view.gpu_share is not None and view.gpu_share < 1.0
        shapes, key = (self.shares, view.share_milli) if shared else (self.whole, view.gpus)
        left = shapes.get(key, 0) + count
        if left:
            shapes[key] = left
        else:
            del shapes[key]

    def remove(self, view: JobView) -> None:
        self.add(view, -1)

    def could_fit(self, room: tuple[int, int]) -> bool:
        """Whether any waiting job could fit `room` (_Gpus.room), ignoring all else: the
        planner's own test for stopping its walk, so when none could, a plan places
        nothing."""
        most_milli, most_whole = room
        return (
            self.gpuless > 0
            or bool(self.shares and gpu_share.fits(min(self.shares), most_milli))
            or bool(self.whole and enough_gpus.fits(min(self.whole), most_whole))
        )


def _milli(share: float) -> int:
    return 1000 if share >= 1 else round(share * 1000)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection during a plan, as in the live cycle
    (`app.cycle.run.gc_paused`): a plan allocates many short-lived objects beside a
    large heap (the trace, thousands of queued jobs), and the collector's full passes
    over that heap took 12 % of a replay of the Alibaba trace (3.4 of 28.6 CPU-s)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def simulate(
    trace_jobs: Iterable[TraceJob],
    *,
    nodes: int,
    gpus_per_node: int,
    policy: str,
    time_scale: float = 1.0,
    seed: int = 0,
    windows: Sequence[WindowInterval] | None = None,
    settings: PolicySettings | None = None,
    window_specs: Sequence[WindowSpec] | None = None,
    tariff: Tariff | None = None,
    gpu_watts: float = DEFAULT_GPU_WATTS,
    epoch: datetime = SIM_EPOCH,
    exact_runtimes: bool = False,
    preemption_cost_s: float = DEFAULT_PREEMPTION_COST_S,
) -> SimResult:
    """Replay a trace on `nodes` x `gpus_per_node` GPUs under a queue policy.

    Arrival times are divided by `time_scale` (2.0 = arrivals twice as dense);
    durations are not scaled. Jobs that could never fit the cluster are skipped
    (their ids in `SimResult.skipped_ids`). Time 0 of the trace is `epoch`
    (timezone-aware).

    `exact_runtimes` tells the scheduler each job's true duration, in place of the
    prediction from finished jobs (a clairvoyant reference, see the module doc).
    Each preemption adds `preemption_cost_s` seconds to the stopped job's work.

    Trace jobs marked `offpeak` wait for a window of `window_specs` (turned into
    intervals along the simulated calendar) or of the fixed `windows` intervals;
    only spec windows carry `preempt_on_close` and `capacity_outside_fraction`.
    """
    if time_scale <= 0:
        raise ValueError("time_scale must be positive")
    if not 0 <= preemption_cost_s < math.inf:
        raise ValueError("preemption cost must be a finite number of seconds >= 0")
    if epoch.tzinfo is None or epoch.utcoffset() is None:
        raise ValueError("epoch must be timezone-aware")
    epoch = epoch.astimezone(UTC)
    specs = tuple(window_specs or ())
    base = settings or PolicySettings()
    rules = window_rules(specs)  # as the live cycle applies them
    if rules.outside_fraction is not None:
        base = replace(base, offpeak_outside_fraction=rules.outside_fraction)
    preempt_on_close = rules.preempt_on_close
    settings = replace(
        base,
        queue_policy=policy,  # type: ignore[arg-type]
        # The policy knows what a preemption costs here (the default weighs it).
        preemption_cost_s=preemption_cost_s,
        telemetry_max_age_s=math.inf,
        stability_window_s=0.0,
        explain=False,
    )

    jobs: dict[int, _Job] = {}
    skipped: list[str] = []
    events: list[tuple[float, int, int, int]] = []  # (time, kind, job, version)
    vcs: set[str] = set()
    offpeak_jobs = 0
    for n, tj in enumerate(trace_jobs):
        n_nodes, per_node = shape_for(tj.gpu_num, gpus_per_node)
        if n_nodes > nodes or tj.gpu_num < 0:
            skipped.append(tj.job_id)
            continue
        arrival = tj.submit_time / time_scale
        share = tj.gpu_milli / 1000 if tj.gpu_num == 1 and tj.gpu_milli < 1000 else None
        view = JobView(
            id=n,
            name=tj.jobname,
            user=tj.user,
            project=tj.vc,
            gpus=per_node,
            gpu_share=share,
            nodes=n_nodes,
            submitted_at=epoch + timedelta(seconds=arrival),
            preemptible=tj.preemptible,
            schedule_mode="offpeak" if tj.offpeak else "now",
        )
        offpeak_jobs += tj.offpeak
        jobs[n] = _Job(tj, view, arrival, tj.duration)
        vcs.add(tj.vc)
        heapq.heappush(events, (arrival, _ARRIVAL, n, 0))
    timeline = WindowTimeline(specs, epoch=epoch, extra=windows or ())
    if offpeak_jobs and timeline.empty:
        raise ValueError("off-peak jobs need at least one window")
    windowed = not timeline.empty  # else no window edges, and each cycle sees no windows

    gpus = _Gpus(
        nodes, gpus_per_node, epoch=epoch, job_milli=[j.view.share_milli for j in jobs.values()]
    )
    history: dict[tuple[str, str], tuple[float, ...]] = {}
    usage: dict[str, float] = dict.fromkeys(vcs, 0.0)
    # GPUs (in 1/1000) each VC's running jobs hold, for its fair-share usage between events.
    holding: dict[str, int] = dict.fromkeys(vcs, 0)
    pending: dict[int, JobView] = {}
    waiting = _Waiting()  # the shapes of `pending`
    running: dict[int, RunningJobView] = {}
    preemptions = 0
    window_preemptions = 0
    lost_gpu_s = 0.0
    fragment_gpu_s = 0.0
    cycles = 0
    last_t = 0.0
    arrivals_left = len(jobs)
    gpu_runs: list[GpuRun] = []
    memo = KeptOrder()  # the queue's deadline order, kept from cycle to cycle

    def gpu_use(rv: RunningJobView) -> float:
        return rv.job.total_gpus * min(1.0, rv.share)

    def stop(jid: int, t: float) -> RunningJobView:
        rv = running.pop(jid)
        job = jobs[jid]
        assert job.started is not None
        gpu_runs.append(GpuRun(job.trace.job_id, job.started, t, gpu_use(rv)))
        holding[rv.job.project] -= rv.job.total_gpus * _milli(rv.share)
        gpus.add(rv.placement, -_milli(rv.share))
        return rv

    while events:
        if not arrivals_left and not pending and not running:
            break  # only window edges left: nothing more to schedule
        # Edges first: on the first call they may precede the first job event.
        if windowed:
            for edge in timeline.extend(epoch + timedelta(seconds=events[0][0])):
                heapq.heappush(events, ((edge - epoch).total_seconds(), _WINDOW_EDGE, -1, 0))
        t = events[0][0]
        # Fair-share usage: decay, then add what ran since the last event.
        dt = t - last_t
        if dt > 0:
            for vc, held in holding.items():
                usage[vc] = decay_usage(usage[vc], dt, FAIR_SHARE_HALF_LIFE_S) + held / 1000 * dt
            fragment_gpu_s += gpus.fragmented_gpus * dt
        last_t = t
        window_edge = False
        while events and events[0][0] == t:
            _, kind, jid, version = heapq.heappop(events)
            if kind in (_WINDOW_EDGE, _REPLAN):
                window_edge = True
                continue
            job = jobs[jid]
            if kind == _ARRIVAL:
                arrivals_left -= 1
                view = job.view
                pred = job.trace.duration if exact_runtimes else predict_runtime(history, view)
                if pred is not None:
                    view = replace(view, estimated_runtime_s=max(1, round(pred)))
                pending[jid] = view
                waiting.add(view)
                continue
            if version != job.version or jid not in running:
                continue  # completion of a run that was preempted
            stop(jid, t)
            job.end = t
            job.remaining = 0.0
            hkey = (job.trace.user, job.trace.jobname)
            history[hkey] = (*history.get(hkey, ())[-(_HISTORY_KEEP - 1) :], job.trace.duration)
        if (
            not window_edge
            and (
                not settings.preemption
                or settings.queue_policy in _NEVER_PREEMPT
                or not any(rv.job.preemptible for rv in running.values())
            )
            and not waiting.could_fit(gpus.room())
        ):
            # No waiting job could fit what is free, and nothing may be preempted: a plan
            # now would place nothing (on a shared cluster, arrivals and ends that free
            # too small a share are most events).
            continue
        if not pending and not (window_edge and running):
            continue
        now = epoch + timedelta(seconds=t)
        snapshot = Snapshot(
            nodes=gpus.views(),
            pending=tuple(pending.values()),
            running=tuple(running.values()),
            projects=tuple(ProjectView(name=vc, usage_gpu_s=usage[vc]) for vc in sorted(vcs)),
            windows=timeline.around(now) if windowed else (),
            runtime_history=history,
        )
        victims: list[int] = []
        placements: tuple[Placement, ...] = ()
        if pending:
            with _gc_paused():
                plan = plan_cycle(snapshot, now=now, settings=settings, seed=seed, memo=memo)
            cycles += 1
            placements = plan.placements
            victims = [p.victim_job_id for p in plan.preemptions]
        closing: list[int] = []
        if window_edge and preempt_on_close:
            # The same rule as the live cycle, applied after its plan, as there.
            closing = [
                p.victim_job_id
                for p in window_close_preemptions(
                    snapshot.running, snapshot.windows, now=now, preempt_on_close=preempt_on_close
                )
                if p.victim_job_id not in victims
            ]
        for victim in (*victims, *closing):
            job = jobs[victim]
            assert job.started is not None
            ran = t - job.started
            # It resumes from its last checkpoint: what it did is kept, less the cost.
            job.remaining = max(0.0, job.remaining - ran) + preemption_cost_s
            job.preempted += 1
            job.version += 1
            rv = stop(victim, t)
            lost_gpu_s += preemption_cost_s * gpu_use(rv)
            job.started = None
            requeued = pending[rv.job.id] = replace(
                rv.job,
                attempt=rv.job.attempt + 1,
                last_preempted_at=now,
                attained_gpu_s=rv.job.attained_gpu_s + ran * gpu_use(rv),
            )
            waiting.add(requeued)
            preemptions += 1
        window_preemptions += len(closing)
        if closing:
            # The GPUs they held are free now; plan again at once rather than leave
            # them idle until the next arrival or completion.
            heapq.heappush(events, (t, _REPLAN, -1, 0))
        for pl in placements:
            view = pending.pop(pl.job_id)
            waiting.remove(view)
            job = jobs[pl.job_id]
            rv = RunningJobView(
                job=view,
                placement=pl.node_gpus,
                started_at=now,
                share=pl.share,
                started_via_preemption=bool(pl.after_preemption_of),
            )
            running[pl.job_id] = rv
            gpus.add(pl.node_gpus, _milli(pl.share))
            holding[view.project] += view.total_gpus * _milli(pl.share)
            job.started = t
            if job.first_start is None:
                job.first_start = t
            heapq.heappush(events, (t + job.remaining, _END, pl.job_id, job.version))

    if pending or running:
        raise RuntimeError(
            f"simulation stalled with {len(pending)} pending, {len(running)} running"
        )
    total_gpus = nodes * gpus_per_node
    result = _result(policy, jobs, skipped, preemptions, total_gpus, cycles, preemption_cost_s)
    used = energy_use(gpu_runs, epoch=epoch, gpu_watts=gpu_watts, tariff=tariff)
    result.exact_runtimes = exact_runtimes
    result.offpeak_jobs = offpeak_jobs
    result.window_preemptions = window_preemptions
    result.preemption_cost_s = preemption_cost_s
    result.preemption_lost_gpu_h = lost_gpu_s / 3600
    result.preemptible_jobs = sum(j.view.preemptible for j in jobs.values())
    if result.makespan_s > 0:
        result.fragmentation = fragment_gpu_s / (total_gpus * result.makespan_s)
    result.energy_wh = used.energy_wh
    result.cost = used.cost
    result.cost_at_peak = used.cost_at_peak
    result.runs = gpu_runs
    return result


# The lower_bounds keys (see _result).
_BOUNDS = ("avg_jct_s", "makespan_s", "avg_jct_s_with_arrivals", "makespan_s_with_arrivals")


def _result(
    policy: str,
    jobs: dict[int, _Job],
    skipped: list[str],
    preemptions: int,
    total_gpus: int,
    cycles: int,
    preemption_cost_s: float,
) -> SimResult:
    done = [j for j in jobs.values() if j.end is not None]
    if not done:
        zero = dict.fromkeys(_BOUNDS, 0.0)
        return SimResult(
            policy, 0, len(skipped), 0, 0, 0, 0, 0, 0, preemptions, {}, zero, skipped_ids=skipped
        )
    jcts = [j.end - j.arrival for j in done if j.end is not None]
    durations = [j.trace.duration for j in done]
    # What each job ran: its duration and the work its preemptions added.
    ran = [j.trace.duration + j.preempted * preemption_cost_s for j in done]
    held = [
        BoundJob(j.arrival, j.view.total_gpus * j.view.share_milli / 1000, j.trace.duration)
        for j in done
    ]
    gpu_s = [b.gpus * b.duration for b in held]
    start = min(j.arrival for j in done)
    end = max(j.end for j in done if j.end is not None)
    makespan = end - start
    per_vc_lists: dict[str, list[float]] = {}
    for j, jct in zip(done, jcts, strict=True):
        per_vc_lists.setdefault(j.trace.vc, []).append(jct)
    # Average JCT >= mean duration; makespan >= longest job and total work / GPUs. The
    # "with arrivals" bounds also count when jobs arrive (app/simulator/bounds.py).
    lower = {
        "avg_jct_s": statistics.fmean(durations),
        "makespan_s": max(max(durations), sum(gpu_s) / total_gpus),
        "avg_jct_s_with_arrivals": avg_jct_bound(held, total_gpus),
        "makespan_s_with_arrivals": makespan_bound(held, total_gpus),
    }
    return SimResult(
        policy=policy,
        jobs=len(done),
        skipped=len(skipped),
        avg_jct_s=statistics.fmean(jcts),
        p50_jct_s=percentile(jcts, 50),
        p99_jct_s=percentile(jcts, 99),
        avg_queue_s=statistics.fmean(jct - r for jct, r in zip(jcts, ran, strict=True)),
        makespan_s=makespan,
        utilization=sum(gpu_s) / (total_gpus * makespan) if makespan > 0 else 0.0,
        preemptions=preemptions,
        per_vc={vc: statistics.fmean(v) for vc, v in sorted(per_vc_lists.items())},
        lower_bounds=lower,
        jcts=jcts,
        skipped_ids=skipped,
        cycles=cycles,
    )
