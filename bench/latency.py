"""Submit -> RUNNING latency on an idle cluster, through the real stack.

    .venv/bin/python bench/latency.py [--db postgresql|sqlite] [--jobs 100] [--warmup 5]

Starts a private Redis, the API, the scheduler and one agent with 4 simulated GPUs (the
helpers in tests/support/stack.py, shared with tests/e2e). Then, one job at a time on the idle
cluster, it submits a 1-GPU job (`sleep 0.2`) and waits until it has finished. Latency is
measured from the start of the POST to the `at` of the job's RUNNING event (written when
the scheduler handles the agent's "started" report, i.e. after the subprocess exists).
Also shown: POST round trip, submit -> SCHEDULED (the cycle committed the placement),
SCHEDULED -> RUNNING (dispatch through Redis, agent start, report back).

Goal: p50 <= 0.3 s, p99 <= 1 s. Prints a table; writes bench/results/latency-<db>.json.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import select

from bench.common import (
    bench_args,
    bench_env,
    durable_postgres,
    machine_info,
    print_table,
    summarize,
    write_results,
)
from tests.support.stack import Stack

GOAL_P50_S = 0.3
GOAL_P99_S = 1.0


def main() -> int:
    durable_postgres()
    args = bench_args(__doc__.splitlines()[0], jobs=100, warmup=5, job_s=0.2)
    from app.db import make_engine
    from app.jobs.models import Job, JobEvent
    from app.jobs.states import JobStatus

    root = Path(tempfile.mkdtemp(prefix="gpusched-latency-"))
    stack = Stack(
        root, db=args.db, agents={"n1": "sim:4:H100-80GB"}, env=bench_env(), reports_worker=True
    )
    print(f"starting the stack ({args.db}) in {root} ...", flush=True)
    stack.start(timeout=120)
    engine = make_engine(stack.database_url)
    samples: list[dict[str, float]] = []
    try:
        print(
            f"stack up in {stack.startup_s:.1f}s; {args.warmup} warm-up + {args.jobs} jobs",
            flush=True,
        )
        for i in range(args.warmup + args.jobs):
            t0 = time.time()
            job = stack.submit(
                {"name": f"latency-{i}", "command": f"sleep {args.job_s}", "gpus": 1}
            )
            t_post = time.time()
            stack.wait_status(job["id"], "SUCCEEDED", "FAILED", timeout=60, interval=0.02)
            with engine.connect() as conn:
                at = dict(
                    conn.execute(
                        select(JobEvent.to_status, JobEvent.at).where(
                            JobEvent.job_id == job["id"], JobEvent.attempt == 1
                        )
                    ).all()
                )
                status = conn.scalar(select(Job.status).where(Job.id == job["id"]))
            if status != "SUCCEEDED":
                raise SystemExit(f"job {job['id']} ended {status}")
            if i < args.warmup:
                continue
            samples.append(
                {
                    "post_s": t_post - t0,
                    "scheduled_s": at[JobStatus.SCHEDULED].timestamp() - t0,
                    "running_s": at[JobStatus.RUNNING].timestamp() - t0,
                    "dispatch_s": at[JobStatus.RUNNING].timestamp()
                    - at[JobStatus.SCHEDULED].timestamp(),
                }
            )
            if (i + 1 - args.warmup) % 20 == 0:
                print(f"  {i + 1 - args.warmup} jobs", flush=True)
    finally:
        engine.dispose()
        stack.stop()

    stats = {key: summarize([s[key] for s in samples]) for key in samples[0]}
    rows = []
    labels = {
        "running_s": "submit -> RUNNING",
        "scheduled_s": "submit -> SCHEDULED",
        "dispatch_s": "SCHEDULED -> RUNNING",
        "post_s": "POST round trip",
    }
    for key, label in labels.items():
        s = stats[key]
        rows.append(
            (
                label,
                f"p50 {s['p50']:.3f}s  p90 {s['p90']:.3f}s  p99 {s['p99']:.3f}s  "
                f"max {s['max']:.3f}s  mean {s['mean']:.3f}s",
            )
        )
    run = stats["running_s"]
    ok = run["p50"] <= GOAL_P50_S and run["p99"] <= GOAL_P99_S
    rows.append(
        ("goal", f"p50 <= {GOAL_P50_S}s, p99 <= {GOAL_P99_S}s: {'MET' if ok else 'NOT MET'}")
    )
    print_table(rows, f"submit -> RUNNING latency, {len(samples)} jobs, idle cluster, {args.db}")
    path = write_results(
        "latency",
        {
            "db": args.db,
            "jobs": len(samples),
            "warmup": args.warmup,
            "job_command": f"sleep {args.job_s}",
            "cluster": "1 node x 4 simulated H100 (one 1-GPU job at a time)",
            "settings": stack.env_overrides,
            "goal": {"p50_s": GOAL_P50_S, "p99_s": GOAL_P99_S, "met": ok},
            "stats": stats,
            "samples": samples,
            "machine": machine_info(),
        },
    )
    print(f"results: {path}")
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
