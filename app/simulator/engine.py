"""Discrete-event trace simulator driven by the real `plan_cycle`.

Events are job arrivals and job completions, and off-peak window openings and
closings; the scheduler is asked for a plan at each distinct event time (never
on a fixed tick), and its plan is applied exactly: placements start jobs,
preemptions stop them (they resume later with their remaining work, as from a
checkpoint, and keep their attained service).

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

import heapq
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from app.scheduling import (
    GpuView,
    JobView,
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
from app.scheduling.window_close import window_close_preemptions
from app.simulator.bounds import BoundJob, avg_jct_bound, makespan_bound
from app.simulator.energy import DEFAULT_GPU_WATTS, GpuRun, energy_use
from app.simulator.trace import TraceJob
from app.windows.calendar import WindowSpec, window_rules
from app.windows.tariff import Tariff
from app.windows.timeline import WindowTimeline

SIM_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
FAIR_SHARE_HALF_LIFE_S = 7 * 86400.0
_HISTORY_KEEP = 50  # recent runs per (user, job name) kept for the runtime median

# Event kinds, in the order they are handled at one instant (all before the plan).
_END, _ARRIVAL, _WINDOW_EDGE, _REPLAN = 0, 1, 2, 3


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
    avg_queue_s: float
    makespan_s: float
    utilization: float
    preemptions: int
    per_vc: dict[str, float]
    lower_bounds: dict[str, float]
    # True when the scheduler was told true durations (`simulate(exact_runtimes=True)`).
    exact_runtimes: bool = False
    offpeak_jobs: int = 0
    # Of `preemptions`, those made because an off-peak window closed.
    window_preemptions: int = 0
    # Run time x GPU-equivalents x watts; cost (None without a tariff) at the prices in
    # force while the GPUs ran, and the same energy at the tariff's highest price.
    energy_wh: float = 0.0
    cost: float | None = None
    cost_at_peak: float | None = None
    # Not part of to_json: per-job JCTs (for CDF charts) and skipped job ids.
    jcts: list[float] = field(default_factory=list, repr=False)
    skipped_ids: list[str] = field(default_factory=list, repr=False)
    # Not part of to_json either: every stretch a job ran, in the order they ended.
    runs: list[GpuRun] = field(default_factory=list, repr=False)
    cycles: int = 0

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
            "avg_jct_s": self.avg_jct_s,
            "p50_jct_s": self.p50_jct_s,
            "p99_jct_s": self.p99_jct_s,
            "avg_queue_s": self.avg_queue_s,
            "makespan_s": self.makespan_s,
            "utilization": self.utilization,
            "preemptions": self.preemptions,
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
) -> SimResult:
    """Replay a trace on `nodes` x `gpus_per_node` GPUs under a queue policy.

    Arrival times are divided by `time_scale` (2.0 = arrivals twice as dense);
    durations are not scaled. Jobs that could never fit the cluster are skipped.
    Time 0 of the trace is `epoch` (timezone-aware).

    `exact_runtimes` tells the scheduler each job's true duration, in place of the
    prediction from finished jobs (a clairvoyant reference, see the module doc).

    Trace jobs marked `offpeak` wait for a window of `window_specs` (turned into
    intervals along the simulated calendar) or of the fixed `windows` intervals;
    only spec windows carry `preempt_on_close` and `capacity_outside_fraction`.
    """
    if time_scale <= 0:
        raise ValueError("time_scale must be positive")
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
        telemetry_max_age_s=math.inf,
        stability_window_s=0.0,
        explain=False,
    )
    node_names = [f"n{i:04d}" for i in range(nodes)]
    alloc: dict[str, list[int]] = {n: [0] * gpus_per_node for n in node_names}
    node_cache: dict[str, NodeView] = {}
    idle_since = epoch - timedelta(days=1)

    def node_view(name: str) -> NodeView:
        nv = node_cache.get(name)
        if nv is None:
            row = alloc[name]
            peers = tuple(range(gpus_per_node))
            nv = NodeView(
                name=name,
                heartbeat_at=epoch,
                gpus=tuple(
                    GpuView(
                        index=i,
                        uuid=f"{name}-{i}",
                        model="sim",
                        memory_total_mb=81920,
                        memory_used_mb=0,
                        util_pct=0.0,
                        telemetry_at=epoch,
                        idle_since=idle_since,
                        temperature_c=40.0,
                        allocated_milli=row[i],
                        nvlink_peers=tuple(p for p in peers if p != i),
                    )
                    for i in range(gpus_per_node)
                ),
            )
            node_cache[name] = nv
        return nv

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
            preemptible=True,
            schedule_mode="offpeak" if tj.offpeak else "now",
        )
        offpeak_jobs += tj.offpeak
        jobs[n] = _Job(tj, view, arrival, tj.duration)
        vcs.add(tj.vc)
        heapq.heappush(events, (arrival, _ARRIVAL, n, 0))
    timeline = WindowTimeline(specs, epoch=epoch, extra=windows or ())
    if offpeak_jobs and timeline.empty:
        raise ValueError("off-peak jobs need at least one window")

    history: dict[tuple[str, str], tuple[float, ...]] = {}
    usage: dict[str, float] = dict.fromkeys(vcs, 0.0)
    pending: dict[int, JobView] = {}
    running: dict[int, RunningJobView] = {}
    preemptions = 0
    window_preemptions = 0
    cycles = 0
    last_t = 0.0
    total_gpus = nodes * gpus_per_node
    arrivals_left = len(jobs)
    gpu_runs: list[GpuRun] = []

    def gpu_use(rv: RunningJobView) -> float:
        return rv.job.total_gpus * min(1.0, rv.share)

    def stop(jid: int, t: float) -> RunningJobView:
        rv = running.pop(jid)
        job = jobs[jid]
        assert job.started is not None
        gpu_runs.append(GpuRun(job.trace.job_id, job.started, t, gpu_use(rv)))
        _free(rv, alloc, node_cache)
        return rv

    while events:
        if not arrivals_left and not pending and not running:
            break  # only window edges left: nothing more to schedule
        # Edges first: on the first call they may precede the first job event.
        for edge in timeline.extend(epoch + timedelta(seconds=events[0][0])):
            heapq.heappush(events, ((edge - epoch).total_seconds(), _WINDOW_EDGE, -1, 0))
        t = events[0][0]
        # Fair-share usage: decay, then add what ran since the last event.
        dt = t - last_t
        if dt > 0:
            for vc in usage:
                usage[vc] = decay_usage(usage[vc], dt, FAIR_SHARE_HALF_LIFE_S)
            for rv in running.values():
                usage[rv.job.project] += gpu_use(rv) * dt
        last_t = t
        arrivals = False
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
                arrivals = True
                continue
            if version != job.version or jid not in running:
                continue  # completion of a run that was preempted
            stop(jid, t)
            job.end = t
            job.remaining = 0.0
            hkey = (job.trace.user, job.trace.jobname)
            history[hkey] = (*history.get(hkey, ())[-(_HISTORY_KEEP - 1) :], job.trace.duration)
        if (
            arrivals
            and not window_edge
            and not events_free(alloc)
            and settings.queue_policy != "las"
            and running
        ):
            # Cluster full and no policy that preempts on arrival: nothing can change.
            continue
        if not pending and not (window_edge and running):
            continue
        now = epoch + timedelta(seconds=t)
        snapshot = Snapshot(
            nodes=tuple(node_view(n) for n in node_names),
            pending=tuple(pending.values()),
            running=tuple(running.values()),
            projects=tuple(ProjectView(name=vc, usage_gpu_s=usage[vc]) for vc in sorted(vcs)),
            windows=timeline.around(now),
            runtime_history=history,
        )
        victims: list[int] = []
        placements: tuple[Placement, ...] = ()
        if pending:
            plan = plan_cycle(snapshot, now=now, settings=settings, seed=seed)
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
            job.remaining = max(0.0, job.remaining - ran)
            job.version += 1
            rv = stop(victim, t)
            job.started = None
            pending[rv.job.id] = replace(
                rv.job,
                attempt=rv.job.attempt + 1,
                last_preempted_at=now,
                attained_gpu_s=rv.job.attained_gpu_s + ran * gpu_use(rv),
            )
            preemptions += 1
        window_preemptions += len(closing)
        if closing:
            # The GPUs they held are free now; plan again at once rather than leave
            # them idle until the next arrival or completion.
            heapq.heappush(events, (t, _REPLAN, -1, 0))
        for pl in placements:
            view = pending.pop(pl.job_id)
            job = jobs[pl.job_id]
            rv = RunningJobView(
                job=view,
                placement=pl.node_gpus,
                started_at=now,
                share=pl.share,
                started_via_preemption=bool(pl.after_preemption_of),
            )
            running[pl.job_id] = rv
            milli = 1000 if pl.share >= 1 else round(pl.share * 1000)
            for name, idxs in pl.node_gpus:
                row = alloc[name]
                for i in idxs:
                    row[i] += milli
                    if row[i] > 1000:
                        raise AssertionError(f"GPU {name}:{i} over-allocated")
                node_cache.pop(name, None)
            job.started = t
            if job.first_start is None:
                job.first_start = t
            heapq.heappush(events, (t + job.remaining, _END, pl.job_id, job.version))

    if pending or running:
        raise RuntimeError(
            f"simulation stalled with {len(pending)} pending, {len(running)} running"
        )
    result = _result(policy, jobs, skipped, preemptions, total_gpus, cycles)
    used = energy_use(gpu_runs, epoch=epoch, gpu_watts=gpu_watts, tariff=tariff)
    result.exact_runtimes = exact_runtimes
    result.offpeak_jobs = offpeak_jobs
    result.window_preemptions = window_preemptions
    result.energy_wh = used.energy_wh
    result.cost = used.cost
    result.cost_at_peak = used.cost_at_peak
    result.runs = gpu_runs
    return result


def events_free(alloc: dict[str, list[int]]) -> bool:
    """True when any GPU has unallocated share left."""
    return any(m < 1000 for row in alloc.values() for m in row)


def _free(rv: RunningJobView, alloc: dict[str, list[int]], cache: dict[str, NodeView]) -> None:
    milli = 1000 if rv.share >= 1 else round(rv.share * 1000)
    for name, idxs in rv.placement:
        row = alloc[name]
        for i in idxs:
            row[i] -= milli
        cache.pop(name, None)


# The lower_bounds keys (see _result).
_BOUNDS = ("avg_jct_s", "makespan_s", "avg_jct_s_with_arrivals", "makespan_s_with_arrivals")


def _result(
    policy: str,
    jobs: dict[int, _Job],
    skipped: list[str],
    preemptions: int,
    total_gpus: int,
    cycles: int,
) -> SimResult:
    done = [j for j in jobs.values() if j.end is not None]
    if not done:
        zero = dict.fromkeys(_BOUNDS, 0.0)
        return SimResult(policy, 0, len(skipped), 0, 0, 0, 0, 0, 0, preemptions, {}, zero)
    jcts = [j.end - j.arrival for j in done if j.end is not None]
    durations = [j.trace.duration for j in done]
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
        avg_queue_s=statistics.fmean(jct - d for jct, d in zip(jcts, durations, strict=True)),
        makespan_s=makespan,
        utilization=sum(gpu_s) / (total_gpus * makespan) if makespan > 0 else 0.0,
        preemptions=preemptions,
        per_vc={vc: statistics.fmean(v) for vc, v in sorted(per_vc_lists.items())},
        lower_bounds=lower,
        jcts=jcts,
        skipped_ids=skipped,
        cycles=cycles,
    )
