"""Discrete-event trace simulator driven by the real `plan_cycle`.

Events are job arrivals and job completions; the scheduler is asked for a plan
at each distinct event time (never on a fixed tick), and its plan is applied
exactly: placements start jobs, preemptions stop them (they resume later with
their remaining work, as from a checkpoint, and keep their attained service).

What the scheduler is told about a job (the honest part): GPU count and share,
user, job name and VC. Not its duration. `estimated_runtime_s` is the median
of the durations of the same user's finished jobs with the same name
(`predict_runtime`), or unknown when there is no history yet. SJF orders by
that prediction and backfill reserves by it.

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
from typing import Any

from app.scheduling import (
    GpuView,
    JobView,
    NodeView,
    PolicySettings,
    ProjectView,
    RunningJobView,
    Snapshot,
    WindowInterval,
    decay_usage,
    plan_cycle,
    predict_runtime,
)
from app.simulator.trace import TraceJob

SIM_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
FAIR_SHARE_HALF_LIFE_S = 7 * 86400.0
_HISTORY_KEEP = 50  # recent runs per (user, job name) kept for the runtime median


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
    # Not part of to_json: per-job JCTs (for CDF charts) and skipped job ids.
    jcts: list[float] = field(default_factory=list, repr=False)
    skipped_ids: list[str] = field(default_factory=list, repr=False)
    cycles: int = 0

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
) -> SimResult:
    """Replay a trace on `nodes` x `gpus_per_node` GPUs under a queue policy.

    Arrival times are divided by `time_scale` (2.0 = arrivals twice as dense);
    durations are not scaled. Jobs that could never fit the cluster are skipped.
    """
    if time_scale <= 0:
        raise ValueError("time_scale must be positive")
    base = settings or PolicySettings()
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
    idle_since = SIM_EPOCH - timedelta(days=1)

    def node_view(name: str) -> NodeView:
        nv = node_cache.get(name)
        if nv is None:
            row = alloc[name]
            peers = tuple(range(gpus_per_node))
            nv = NodeView(
                name=name,
                heartbeat_at=SIM_EPOCH,
                gpus=tuple(
                    GpuView(
                        index=i,
                        uuid=f"{name}-{i}",
                        model="sim",
                        memory_total_mb=81920,
                        memory_used_mb=0,
                        util_pct=0.0,
                        telemetry_at=SIM_EPOCH,
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
    events: list[tuple[float, int, int, int]] = []  # (time, kind 0=end 1=arrival, job, version)
    vcs: set[str] = set()
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
            submitted_at=SIM_EPOCH + timedelta(seconds=arrival),
            preemptible=True,
        )
        jobs[n] = _Job(tj, view, arrival, tj.duration)
        vcs.add(tj.vc)
        heapq.heappush(events, (arrival, 1, n, 0))

    history: dict[tuple[str, str], tuple[float, ...]] = {}
    usage: dict[str, float] = dict.fromkeys(vcs, 0.0)
    pending: dict[int, JobView] = {}
    running: dict[int, RunningJobView] = {}
    preemptions = 0
    cycles = 0
    last_t = 0.0
    total_gpus = nodes * gpus_per_node
    window_t = tuple(windows or ())

    def gpu_use(rv: RunningJobView) -> float:
        return rv.job.total_gpus * min(1.0, rv.share)

    while events:
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
        while events and events[0][0] == t:
            _, kind, jid, version = heapq.heappop(events)
            job = jobs[jid]
            if kind == 1:
                view = job.view
                pred = predict_runtime(history, view)
                if pred is not None:
                    view = replace(view, estimated_runtime_s=max(1, round(pred)))
                pending[jid] = view
                arrivals = True
                continue
            if version != job.version or jid not in running:
                continue  # completion of a run that was preempted
            rv = running.pop(jid)
            _free(rv, alloc, node_cache)
            job.end = t
            job.remaining = 0.0
            hkey = (job.trace.user, job.trace.jobname)
            history[hkey] = (*history.get(hkey, ())[-(_HISTORY_KEEP - 1) :], job.trace.duration)
        if arrivals and not events_free(alloc) and settings.queue_policy != "las" and running:
            # Cluster full and no policy that preempts on arrival: nothing can change.
            continue
        if not pending:
            continue
        now = SIM_EPOCH + timedelta(seconds=t)
        snapshot = Snapshot(
            nodes=tuple(node_view(n) for n in node_names),
            pending=tuple(pending.values()),
            running=tuple(running.values()),
            projects=tuple(ProjectView(name=vc, usage_gpu_s=usage[vc]) for vc in sorted(vcs)),
            windows=window_t,
            runtime_history=history,
        )
        plan = plan_cycle(snapshot, now=now, settings=settings, seed=seed)
        cycles += 1
        for pre in plan.preemptions:
            rv = running.pop(pre.victim_job_id)
            job = jobs[pre.victim_job_id]
            assert job.started is not None
            ran = t - job.started
            job.remaining = max(0.0, job.remaining - ran)
            job.version += 1
            job.started = None
            _free(rv, alloc, node_cache)
            pending[rv.job.id] = replace(
                rv.job,
                attempt=rv.job.attempt + 1,
                last_preempted_at=now,
                attained_gpu_s=rv.job.attained_gpu_s + ran * gpu_use(rv),
            )
            preemptions += 1
        for pl in plan.placements:
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
            heapq.heappush(events, (t + job.remaining, 0, pl.job_id, job.version))

    if pending or running:
        raise RuntimeError(
            f"simulation stalled with {len(pending)} pending, {len(running)} running"
        )
    return _result(policy, jobs, skipped, preemptions, total_gpus, cycles)


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
        zero = {"avg_jct_s": 0.0, "makespan_s": 0.0}
        return SimResult(policy, 0, len(skipped), 0, 0, 0, 0, 0, 0, preemptions, {}, zero)
    jcts = [j.end - j.arrival for j in done if j.end is not None]
    durations = [j.trace.duration for j in done]
    gpu_s = [j.trace.duration * j.view.total_gpus * (j.view.share_milli / 1000) for j in done]
    start = min(j.arrival for j in done)
    end = max(j.end for j in done if j.end is not None)
    makespan = end - start
    per_vc_lists: dict[str, list[float]] = {}
    for j, jct in zip(done, jcts, strict=True):
        per_vc_lists.setdefault(j.trace.vc, []).append(jct)
    # Average JCT >= mean duration; makespan >= longest job and total work / GPUs.
    lower = {
        "avg_jct_s": statistics.fmean(durations),
        "makespan_s": max(max(durations), sum(gpu_s) / total_gpus),
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
