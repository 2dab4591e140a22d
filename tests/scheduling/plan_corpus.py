"""Seeded random snapshots and a canonical form of their plans, for the golden test.

`test_plan_equivalence.py` compares `plan_cycle` on every case here with the
plans stored in `plan_golden.json`. Speed-ups must leave every plan identical, so
the golden file is only regenerated when a change is *meant* to alter decisions
(last: the default policy's short-first order and starvation guard):

    .venv/bin/python -m tests.scheduling.plan_corpus --write

Two families of cases:
- `bench`: the benchmark's own snapshot (`bench/cycle.py` `build`) at small
  sizes, every queue policy, backfill and preemption on (the shape that is timed).
- `mixed`: the same kind of cluster plus what the benchmark never exercises:
  shared running jobs, booked and foreign memory, unhealthy / stale / foreign-
  loaded GPUs, drained and silent nodes, 4-GPU nodes, gangs of 3, jobs that can
  never fit, off-peak and begin-time jobs, tight quotas with borrowing on and
  off, young (protected) victims, LAS attained service, runtime history, other
  candidate limits, backfill or preemption off, explain off, non-zero seeds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from app.scheduling import (
    QUEUE_POLICIES,
    GpuView,
    JobView,
    NodeView,
    Plan,
    PolicySettings,
    ProjectView,
    RunningJobView,
    Snapshot,
    WindowInterval,
    plan_cycle,
)
from bench.cycle import NOW, build

GOLDEN = Path(__file__).with_name("plan_golden.json")

Case = tuple[str, Snapshot, datetime, PolicySettings, int]


def bench_cases() -> list[Case]:
    out: list[Case] = []
    k = 0
    for nodes, pending in ((20, 120), (40, 300), (60, 500)):
        for busy in (0.0, 0.5, 0.8, 0.95):
            snap = build(nodes, pending, busy, seed=7 + k)
            for policy in QUEUE_POLICIES:
                settings = PolicySettings(queue_policy=policy)  # type: ignore[arg-type]
                out.append((f"bench-{nodes}n-{pending}j-{busy}-{policy}", snap, NOW, settings, 0))
            k += 1
    return out


def _gpu(rng: random.Random, name: str, g: int, per_node: int, model: str, mem: int) -> GpuView:
    quad = 4 if per_node >= 4 else per_node
    r = rng.random()
    return GpuView(
        index=g,
        uuid=f"{name}-{g}",
        model=model,
        memory_total_mb=mem,
        memory_used_mb=rng.choice([0, 0, 0, 500, None]),
        util_pct=rng.choice([0.0, 0.0, 5.0, None]),
        foreign_util_pct=50.0 if r < 0.02 else 0.0,
        foreign_memory_mb=rng.choice([0] * 12 + [2_000, 30_000]),
        idle_since=(
            None
            if r > 0.99
            else NOW - timedelta(seconds=20)
            if r > 0.98
            else NOW - timedelta(hours=2)
        ),
        temperature_c=rng.choice([None, 30.0 + rng.random() * 50]),
        healthy=rng.random() > 0.01,
        telemetry_at=NOW - timedelta(seconds=rng.choice([1, 5, 5, 5, 5, 5, 5, 5, 5, 90])),
        nvlink_peers=tuple(
            p for p in range(g // quad * quad, min(per_node, g // quad * quad + quad)) if p != g
        ),
    )


def _running_job(rng: random.Random, jid: int, size: int, nodes: int = 1) -> JobView:
    return JobView(
        id=jid,
        name=f"model{rng.randrange(6)}",
        user=f"user{rng.randrange(5)}",
        project=f"p{rng.randrange(6)}",
        gpus=size,
        nodes=nodes,
        gpu_memory_mb=rng.choice([None, None, 10_000, 30_000]),
        priority=rng.choice([0, 0, 1, 2]),
        submitted_at=NOW - timedelta(hours=3),
        estimated_runtime_s=rng.choice([None, 600, 3600, 7200, 36_000]),
        max_runtime_s=rng.choice([None, None, 86_400]),
        preemptible=rng.random() < 0.5,
        attained_gpu_s=rng.choice([0.0, 1_000.0, 5_000.0, 50_000.0]),
    )


def mixed_snapshot(seed: int) -> tuple[Snapshot, PolicySettings, int]:
    rng = random.Random(seed)
    n_nodes = rng.randint(20, 60)
    busy = rng.choice([0.0, 0.3, 0.5, 0.8, 0.95])
    # Per node: name, GPU count, model, memory, allocated milli per GPU.
    shapes: list[tuple[str, int, str, int]] = []
    alloc: dict[tuple[str, int], int] = {}
    used_mem: dict[tuple[str, int], int] = {}
    running: list[RunningJobView] = []
    jid = 1_000_000
    for n in range(n_nodes):
        name = f"n{n:03d}"
        per = 4 if rng.random() < 0.2 else 8
        model = rng.choice(["H100", "H100", "A100"])
        mem = 40_960 if model == "A100" and rng.random() < 0.5 else 81_920
        shapes.append((name, per, model, mem))
        i = 0
        while i < per:
            if rng.random() < busy:
                if rng.random() < 0.15:
                    # Shared job(s) on one GPU.
                    share = rng.choice([0.25, 0.5, 0.5, 0.75])
                    j = _running_job(rng, jid, 1)
                    running.append(
                        RunningJobView(
                            job=replace(j, gpu_share=share),
                            placement=((name, (i,)),),
                            started_at=NOW - timedelta(seconds=rng.randrange(60, 20_000)),
                            share=share,
                        )
                    )
                    alloc[(name, i)] = round(share * 1000)
                    used_mem[(name, i)] = 10_000
                    jid += 1
                    i += 1
                    continue
                size = min(per - i, rng.choice([1, 1, 2, 4, 8]))
                j = _running_job(rng, jid, size)
                running.append(
                    RunningJobView(
                        job=j,
                        placement=((name, tuple(range(i, i + size))),),
                        started_at=NOW - timedelta(seconds=rng.randrange(60, 20_000)),
                    )
                )
                for k in range(i, i + size):
                    alloc[(name, k)] = 1000
                    used_mem[(name, k)] = 40_000
                jid += 1
                i += size
            else:
                i += 1
    # A running 2-node gang on two fully free 8-GPU nodes, now and then.
    free8 = [s for s in shapes if s[1] == 8 and all((s[0], g) not in alloc for g in range(8))]
    if len(free8) >= 2 and rng.random() < 0.5:
        a, b = free8[0][0], free8[1][0]
        j = _running_job(rng, jid, 8, nodes=2)
        running.append(
            RunningJobView(
                job=j,
                placement=((a, tuple(range(8))), (b, tuple(range(8)))),
                started_at=NOW - timedelta(seconds=rng.randrange(60, 20_000)),
            )
        )
        for nm in (a, b):
            for g in range(8):
                alloc[(nm, g)] = 1000
                used_mem[(nm, g)] = 40_000
        jid += 1

    node_views: list[NodeView] = []
    for name, per, model, mem in shapes:
        gpus = tuple(
            replace(
                _gpu(rng, name, g, per, model, mem),
                allocated_milli=alloc.get((name, g), 0),
                memory_used_mb=used_mem.get((name, g), 0) or rng.choice([0, 0, None, 1_000]),
            )
            for g in range(per)
        )
        if rng.random() < 0.05:
            gpus = tuple(reversed(gpus))  # agents may report GPUs out of order
        r = rng.random()
        node_views.append(
            NodeView(
                name=name,
                ready=r > 0.03,
                drained=0.03 <= r < 0.06,
                heartbeat_at=None if 0.06 <= r < 0.07 else NOW - timedelta(seconds=3),
                gpus=gpus,
            )
        )

    windows = ()
    if rng.random() < 0.5:
        opens = NOW - timedelta(hours=1) if rng.random() < 0.5 else NOW + timedelta(hours=2)
        windows = (
            WindowInterval("night", opens, opens + timedelta(hours=3)),
            WindowInterval("night", opens + timedelta(days=1), opens + timedelta(days=1, hours=3)),
        )
    n_pending = rng.randint(50, 500)
    jobs: list[JobView] = []
    for k in range(n_pending):
        r = rng.random()
        gpus, nn, share = 1, 1, None
        if r < 0.08:
            share = rng.choice([0.25, 0.5, 0.3])
        elif r < 0.45:
            gpus = 1
        elif r < 0.60:
            gpus = 2
        elif r < 0.65:
            gpus = 3
        elif r < 0.80:
            gpus = 4
        elif r < 0.93:
            gpus = 8
        elif r < 0.96:
            gpus, nn = rng.choice([(8, 2), (4, 2), (8, 3), (2, 3)])
        elif r < 0.97:
            gpus = 9  # never fits on 8-GPU nodes
        elif r < 0.98:
            gpus, nn = 8, 200  # never enough nodes
        elif r < 0.985:
            gpus = 0
        mode = "now"
        begin_at = None
        m = rng.random()
        if m < 0.05:
            mode = "offpeak"
        elif m < 0.08:
            mode = "at"
            begin_at = NOW + timedelta(seconds=rng.choice([-60, 600]))
        sub = NOW - timedelta(seconds=rng.randrange(0, 86_400))
        jobs.append(
            JobView(
                id=k + 1,
                name=f"model{rng.randrange(6)}",
                user=f"user{rng.randrange(5)}",
                project=rng.choice([f"p{i}" for i in range(6)] + ["orphan"]),
                gpus=gpus,
                gpu_share=share,
                nodes=nn,
                gpu_memory_mb=rng.choice([None, None, None, 20_000, 60_000, 70_000, 200_000]),
                gpu_model=rng.choice([None, None, None, "H100", "A100", "V100"]),
                priority=rng.choice([0, 0, 0, 1, 2]),
                # Equal submit times now and then, so ties are broken by id.
                submitted_at=NOW - timedelta(hours=1) if rng.random() < 0.05 else sub,
                estimated_runtime_s=rng.choice([None, 300, 600, 3600, 14_400]),
                max_runtime_s=rng.choice([None, None, 7200]),
                preemptible=rng.random() < 0.5,
                schedule_mode=mode,  # type: ignore[arg-type]
                begin_at=begin_at,
                window="night" if mode == "offpeak" and rng.random() < 0.5 else None,
                attained_gpu_s=rng.choice([0.0, 0.0, 2_000.0, 10_000.0, 100_000.0]),
            )
        )
    total_gpus = sum(s[1] for s in shapes)
    projects = tuple(
        ProjectView(
            name=f"p{i}",
            quota_gpus=rng.choice([0, total_gpus // 10, total_gpus // 4]),
            weight=rng.choice([0.0, 1.0, 2.0]) if i else 1.0,
            usage_gpu_s=rng.random() * 1e5,
        )
        for i in range(6)
    )
    history = {
        (f"user{u}", f"model{m}"): tuple(float(rng.randrange(60, 20_000)) for _ in range(3))
        for u in range(5)
        for m in range(6)
        if rng.random() < 0.3
    }
    snap = Snapshot(
        nodes=tuple(node_views),
        pending=tuple(jobs),
        running=tuple(running),
        projects=projects,
        windows=windows,
        runtime_history=history,
    )
    settings = PolicySettings(
        queue_policy=rng.choice(QUEUE_POLICIES),  # type: ignore[arg-type]
        backfill=rng.random() < 0.85,
        preemption=rng.random() < 0.85,
        borrowing=rng.random() < 0.75,
        candidate_limit=rng.choice([4, 4, 4, 1, 2, 16]),
        offpeak_outside_fraction=rng.choice([0.0, 0.0, 0.1]),
        min_run_before_preempt_s=rng.choice([600.0, 600.0, 5_000.0]),
        explain=rng.random() < 0.9,
    )
    return snap, settings, rng.choice([0, 0, 0, 1, 42])


def mixed_cases(count: int = 60) -> list[Case]:
    out: list[Case] = []
    for seed in range(count):
        snap, settings, plan_seed = mixed_snapshot(seed)
        out.append((f"mixed-{seed}", snap, NOW, settings, plan_seed))
    return out


def all_cases() -> list[Case]:
    return bench_cases() + mixed_cases()


def canonical(plan: Plan) -> dict[str, Any]:
    """Every field of the plan, as JSON-friendly lists (compact, order kept)."""

    def when(d: datetime | None) -> str | None:
        return None if d is None else d.astimezone(UTC).isoformat()

    return {
        "placements": [
            [
                p.job_id,
                [[n, list(ix)] for n, ix in p.node_gpus],
                p.share,
                list(p.after_preemption_of),
            ]
            for p in plan.placements
        ],
        "preemptions": [[p.victim_job_id, p.for_job_id, p.reason] for p in plan.preemptions],
        "pending": [
            [r.job_id, r.kind.value, r.message, r.queue_position, when(r.estimated_start)]
            for r in plan.pending
        ],
        "queue_order": list(plan.queue_order),
    }


def digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, separators=(",", ":")).encode()).hexdigest()[:16]


def run_case(case: Case) -> dict[str, Any]:
    _, snap, now, settings, seed = case
    return canonical(plan_cycle(snap, now=now, settings=settings, seed=seed))


def summary(plan: dict[str, Any]) -> dict[str, Any]:
    """What the golden file keeps per case: a digest per part plus readable samples.

    Digests keep the file small; the counts and the first entries make a
    failure readable without regenerating anything.
    """
    out: dict[str, Any] = {}
    for part in ("placements", "preemptions", "pending", "queue_order"):
        out[part] = {"n": len(plan[part]), "sha": digest(plan[part])}
    out["first_placements"] = plan["placements"][:3]
    out["preemption_list"] = plan["preemptions"][:5]
    out["pending_kinds"] = _kind_counts(plan["pending"])
    return out


def _kind_counts(pending: list[list[Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in pending:
        counts[row[1]] = counts.get(row[1], 0) + 1
    return dict(sorted(counts.items()))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="regenerate the golden file")
    args = ap.parse_args(argv)
    golden = {name: summary(run_case(c)) for c in all_cases() for name in [c[0]]}
    text = json.dumps(golden, separators=(",", ":"), sort_keys=True)
    if args.write:
        GOLDEN.write_text("{\n" + ",\n".join(_lines(golden)) + "\n}\n")
        print(f"wrote {len(golden)} cases to {GOLDEN}")
    else:
        print(digest(text))


def _lines(golden: dict[str, Any]) -> list[str]:
    # One case per line: diffs of the golden file stay readable.
    return [
        f"{json.dumps(k)}:{json.dumps(v, separators=(',', ':'), sort_keys=True)}"
        for k, v in sorted(golden.items())
    ]


if __name__ == "__main__":
    main()
