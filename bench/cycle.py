"""Time one scheduling cycle on a large synthetic cluster.

    .venv/bin/python bench/cycle.py [--nodes 1000] [--pending 10000] [--repeat 7]

Cluster: N nodes x 8 GPUs (two NVLink quads each, two GPU models), fresh
telemetry, a few GPUs with foreign load. Queue: a realistic mix of 1/2/4/8-GPU
jobs, 2-node gangs, half-GPU shares, memory and model requests, 3 priority
tiers, 8 projects. Scenarios differ in how busy the cluster is. The snapshot
is built once, outside the timing; only `plan_cycle` is timed. The "quick" rows
time the cycle that follows a full one, as the live scheduler runs it between
full cycles: placements applied, only the head of the remaining queue read.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app import compiled_core
from app.cycle.run import gc_paused
from app.cycle.snapshot import head_depth
from app.scheduling import (
    GpuView,
    JobView,
    NodeView,
    Plan,
    PolicySettings,
    ProjectView,
    RunningJobView,
    Snapshot,
    plan_cycle,
)

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def build(nodes: int, pending: int, busy: float, seed: int = 1) -> Snapshot:
    rng = random.Random(seed)
    running: list[RunningJobView] = []
    node_views: list[NodeView] = []
    jid = 1_000_000
    for n in range(nodes):
        name = f"node{n:04d}"
        model = "H100" if n % 4 else "A100"
        alloc = [0] * 8
        # Busy fraction: whole GPUs held by running 1/2/4/8-GPU jobs.
        i = 0
        while i < 8:
            if rng.random() < busy:
                size = min(8 - i, rng.choice([1, 1, 2, 4]))
                j = JobView(
                    id=jid,
                    project=f"p{rng.randrange(8)}",
                    gpus=size,
                    priority=rng.choice([0, 0, 1]),
                    submitted_at=NOW - timedelta(hours=3),
                    estimated_runtime_s=rng.choice([None, 3600, 7200, 36_000]),
                    preemptible=rng.random() < 0.3,
                )
                running.append(
                    RunningJobView(
                        job=j,
                        placement=((name, tuple(range(i, i + size))),),
                        started_at=NOW - timedelta(seconds=rng.randrange(60, 20_000)),
                    )
                )
                for k in range(i, i + size):
                    alloc[k] = 1000
                jid += 1
                i += size
            else:
                i += 1
        gpus = tuple(
            GpuView(
                index=g,
                uuid=f"{name}-{g}",
                model=model,
                memory_total_mb=81920,
                memory_used_mb=40_000 if alloc[g] else 0,
                util_pct=90.0 if alloc[g] else 0.0,
                foreign_util_pct=50.0 if rng.random() < 0.002 else 0.0,
                idle_since=NOW - timedelta(hours=2),
                temperature_c=35.0 + rng.random() * 40,
                telemetry_at=NOW - timedelta(seconds=5),
                allocated_milli=alloc[g],
                nvlink_peers=tuple(p for p in range(g // 4 * 4, g // 4 * 4 + 4) if p != g),
            )
            for g in range(8)
        )
        node_views.append(NodeView(name=name, heartbeat_at=NOW - timedelta(seconds=3), gpus=gpus))
    jobs: list[JobView] = []
    for k in range(pending):
        r = rng.random()
        asked, nn, share = 1, 1, None
        if r < 0.10:
            share = 0.5
        elif r < 0.55:
            asked = 1
        elif r < 0.72:
            asked = 2
        elif r < 0.88:
            asked = 4
        elif r < 0.98:
            asked = 8
        else:
            asked, nn = 8, 2
        jobs.append(
            JobView(
                id=k + 1,
                name=f"model{rng.randrange(20)}",
                user=f"user{rng.randrange(50)}",
                project=f"p{rng.randrange(8)}",
                gpus=asked,
                gpu_share=share,
                nodes=nn,
                gpu_memory_mb=rng.choice([None, None, None, 20_000, 60_000]),
                gpu_model=rng.choice([None, None, None, "H100"]),
                priority=rng.choice([0, 0, 0, 1, 2]),
                submitted_at=NOW - timedelta(seconds=rng.randrange(0, 86_400)),
                estimated_runtime_s=rng.choice([None, 600, 3600, 14_400]),
                preemptible=rng.random() < 0.5,
            )
        )
    projects = tuple(
        ProjectView(
            name=f"p{i}",
            quota_gpus=nodes * 8 // 10,
            weight=1.0 + i % 2,
            usage_gpu_s=rng.random() * 1e6,
        )
        for i in range(8)
    )
    return Snapshot(
        nodes=tuple(node_views), pending=tuple(jobs), running=tuple(running), projects=projects
    )


def after_full_cycle(s: Snapshot, plan: Plan) -> Snapshot:
    """What the next quick cycle sees once `plan` (a full cycle's) is applied.

    Victims stopped, placed jobs running, and, as in the live scheduler's quick cycles
    (`app/cycle/snapshot.py`), only the head of the remaining queue in the full cycle's
    order: `head_depth` jobs.
    """
    victims = {p.victim_job_id for p in plan.preemptions}
    pending = {j.id: j for j in s.pending}
    running = [r for r in s.running if r.job.id not in victims]
    running += [
        RunningJobView(job=pending[p.job_id], placement=p.node_gpus, started_at=NOW, share=p.share)
        for p in plan.placements
    ]
    milli: dict[tuple[str, int], int] = {}
    for r in running:
        for node, indices in r.placement:
            for g in indices:
                milli[node, g] = milli.get((node, g), 0) + r.share_milli
    nodes = tuple(
        replace(
            n,
            gpus=tuple(replace(g, allocated_milli=milli.get((n.name, g.index), 0)) for g in n.gpus),
        )
        for n in s.nodes
    )
    placed = {p.job_id for p in plan.placements}
    rest = [pending[i] for i in plan.queue_order if i not in placed]
    return replace(s, nodes=nodes, running=tuple(running), pending=tuple(rest[: head_depth(nodes)]))


def time_plan(
    s: Snapshot, settings: PolicySettings, repeat: int
) -> tuple[float, float, float, int, int]:
    """Median wall ms, median CPU ms (process time: fair on a shared, busy machine), max wall.
    Both include the collection the plan leaves owed, which runs as `gc_paused` ends."""
    walls, cpus = [], []
    plan = None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        with gc_paused():  # as the live cycle runs it
            plan = plan_cycle(s, now=NOW, settings=settings, seed=0)
        cpus.append((time.process_time() - c) * 1000)
        walls.append((time.perf_counter() - t) * 1000)
    assert plan is not None
    return (
        statistics.median(walls),
        statistics.median(cpus),
        max(walls),
        len(plan.placements),
        len(plan.preemptions),
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    print(
        f"plan_cycle: {args.nodes} nodes x 8 GPUs, {args.pending} pending jobs, "
        f"median of {args.repeat} runs (python {sys.version.split()[0]}, "
        f"{'compiled' if compiled_core.in_use() else 'plain-Python'} scheduling core)"
    )
    head = (
        f"{'scenario':<26} {'policy':<11} {'running':>8} {'wall ms':>8} {'cpu ms':>7} "
        f"{'max ms':>7} {'placed':>7} {'preempt':>8}"
    )
    print(head)
    print("-" * len(head))
    half = ["default", "fifo", "priority", "fair-share", "sjf", "las"]
    cases: list[tuple[str, float, str, PolicySettings]] = [
        ("empty cluster", 0.0, "default", PolicySettings()),
        *[("half busy", 0.5, p, PolicySettings(queue_policy=p)) for p in half],  # type: ignore[arg-type]
        (
            "half busy, no bf/preempt",
            0.5,
            "default",
            PolicySettings(backfill=False, preemption=False),
        ),
        ("full (95% busy)", 0.95, "default", PolicySettings()),
    ]
    built: dict[float, Snapshot] = {}
    timed: list[tuple[str, str, Snapshot, PolicySettings]] = []
    for label, busy, policy, settings in cases:
        if busy not in built:
            built[busy] = build(args.nodes, args.pending, busy)
        timed.append((label, policy, built[busy], settings))
    # The live scheduler runs a full cycle (above) every few seconds; the cycles triggered
    # by submissions and completions in between read only the head of the queue.
    for label, busy in (("quick, after half busy", 0.5), ("quick, after full", 0.95)):
        s = built[busy]
        quick = after_full_cycle(s, plan_cycle(s, now=NOW, settings=PolicySettings(), seed=0))
        timed.append((label, "default", quick, PolicySettings()))
    for label, policy, s, settings in timed:
        med, cpu, worst, placed, pre = time_plan(s, settings, args.repeat)
        print(
            f"{label:<26} {policy:<11} {len(s.running):>8} {med:>8.1f} {cpu:>7.1f} "
            f"{worst:>7.1f} {placed:>7} {pre:>8}",
            flush=True,
        )
    print(f"load average after the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
