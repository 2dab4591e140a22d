"""Drain rate: how many trivial jobs per second the real stack gets through.

    .venv/bin/python bench/drain.py [--db postgresql|sqlite] [--jobs 1000] [--clients 4]
                                    [--queued-first]

Starts a private Redis, the API, the scheduler (a cycle and a reports worker, as `gpusched
up`) and two agents with 4 simulated GPUs each (tests/support/stack.py, shared with tests/e2e), submits `--jobs` 1-GPU jobs running `true` from
`--clients` concurrent API clients, and waits until every job has finished. Reported:

- drain rate     jobs / (last job's finished_at - start of the first POST)
- steady rate    jobs finished per second between the 10th and 90th percentile finish
- submit rate    accepted POSTs per second (the API and database path only)

`--queued-first` measures as Slurm's anchor was (../shared/ANCHORS.md): every job is
submitted held, all are released by one request (`POST /jobs/release`), and the drain is
timed from that release to the last end; the CPU counted is the drain's alone.

Reference: Slurm, tuned, on this machine: 54 jobs/s. Prints a table; writes
bench/results/drain-<db>.json. `--profile` records the scheduler with py-spy (if
installed) into bench/results/drain-scheduler-<db>.txt and prints its top functions
(`PROFILE_PROC=reports` records the reports worker instead, `PROFILE_PROC=agent` the first
agent).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from sqlalchemy import func, select

from bench.common import (
    ROOT,
    bench_args,
    bench_env,
    durable_postgres,
    machine_info,
    percentile,
    print_table,
    write_results,
)
from tests.support.stack import Stack

SLURM_JOBS_PER_S = 54.0
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT")


def submit_all(
    stack: Stack, jobs: int, clients: int, *, held: bool = False
) -> tuple[float, float, int]:
    """POST `jobs` jobs from `clients` threads (`held`: submitted held); returns (first
    start, last end, errors)."""
    counter = iter(range(jobs))
    lock = threading.Lock()
    errors = 0
    ends: list[float] = []

    def client() -> None:
        nonlocal errors
        with httpx.Client(
            base_url=stack.url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=60
        ) as http:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    break
                r = http.post(
                    "/api/v1/jobs",
                    json={"name": f"drain-{i}", "command": "true", "gpus": 1, "hold": held},
                )
                if r.status_code != 201:
                    with lock:
                        errors += 1
        with lock:
            ends.append(time.time())

    start = time.time()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return start, max(ends), errors


def release_all(stack: Stack) -> None:
    """Release every held job by one request, as `scontrol release` of the lot."""
    with httpx.Client(
        base_url=stack.url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=120
    ) as http:
        http.post("/api/v1/jobs/release", params={"status": "PENDING"}).raise_for_status()


def cpu_seconds() -> dict[str, float]:
    """CPU time (user+system) used so far, per process name on this machine: the stack's
    processes are told apart by their command line; PostgreSQL counts all its backends."""
    tick = os.sysconf("SC_CLK_TCK")
    usage: defaultdict[str, float] = defaultdict(float)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        used = (int(fields[11]) + int(fields[12])) / tick
        comm = stat[stat.find("(") + 1 : stat.rfind(")")]
        if comm.startswith("postgres"):
            usage["postgresql (all backends)"] += used
        elif "app.cli server" in cmd:
            usage["api"] += used
        elif "app.cli scheduler --only reports" in cmd:
            usage["reports worker"] += used
        elif "app.cli scheduler" in cmd:
            usage["scheduler"] += used
        elif "app.cli agent" in cmd or "gpusched-forkserver" in cmd:
            # With what it reaped: each attempt's supervisor (and the job, here `true`),
            # which the agent's fork server (workers/agent/forkserver.py) forks and reaps.
            reaped = (int(fields[13]) + int(fields[14])) / tick
            usage["agents with supervisors"] += used + reaped
        elif "valkey" in comm or "redis" in comm:
            usage["redis"] += used
    return dict(usage)


def profile_start(pid: int, out: Path, seconds: float) -> subprocess.Popen[bytes] | None:
    pyspy = (
        os.environ.get("PYSPY") or shutil.which("py-spy") or str(ROOT / ".venv" / "bin" / "py-spy")
    )
    if not Path(pyspy).exists():
        print("py-spy not installed; no profile", flush=True)
        return None
    return subprocess.Popen(
        [
            pyspy,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "50",
            "--format",
            "raw",
            "--output",
            str(out),
            "--nonblocking",
            "--threads",
            # Only the thread holding the GIL: where the scheduler's CPU goes, not its
            # threads waiting on PostgreSQL or Redis.
            "--gil",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )


def top_functions(raw: Path, n: int = 25) -> list[tuple[str, float]]:
    """Inclusive share of samples per function from py-spy's collapsed-stack output."""
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        total += int(count)
        for frame in set(stack.split(";")):
            inclusive[frame] += int(count)
    return [(f, 100.0 * c / total) for f, c in inclusive.most_common(n)] if total else []


def main() -> int:
    durable_postgres()
    args = bench_args(
        __doc__.splitlines()[0],
        jobs=1000,
        clients=4,
        timeout_s=600.0,
        profile=False,
        queued_first=False,
    )
    from app.db import make_engine
    from app.jobs.models import Job

    root = Path(tempfile.mkdtemp(prefix="gpusched-drain-"))
    stack = Stack(
        root,
        db=args.db,
        agents={"n1": "sim:4:H100-80GB", "n2": "sim:4:H100-80GB"},
        env=bench_env(),
        reports_worker=True,
    )
    print(f"starting the stack ({args.db}) in {root} ...", flush=True)
    stack.start(timeout=120)
    engine = make_engine(stack.database_url)
    profiler = None
    raw = ROOT / "bench" / "results" / f"drain-scheduler-{args.db}.txt"
    try:
        print(f"stack up in {stack.startup_s:.1f}s; submitting {args.jobs} jobs", flush=True)
        if args.profile:
            raw.parent.mkdir(parents=True, exist_ok=True)
            label = os.environ.get("PROFILE_PROC", "scheduler")
            profiled = stack.agent("n1") if label == "agent" else stack.procs[label]
            profiler = profile_start(profiled.pid, raw, 60)
        cpu_before = cpu_seconds()
        wall_before = time.time()
        first_post, last_post, errors = submit_all(
            stack, args.jobs, args.clients, held=args.queued_first
        )
        print(f"submitted in {last_post - first_post:.1f}s ({errors} errors)", flush=True)
        released_at = None
        if args.queued_first:
            cpu_before = cpu_seconds()
            wall_before = released_at = time.time()
            release_all(stack)
        deadline = time.monotonic() + args.timeout_s
        counts: dict[str, int] = {}
        last_report = 0.0
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                counts = dict(
                    conn.execute(select(Job.status, func.count()).group_by(Job.status)).all()
                )
            done = sum(counts.get(s, 0) for s in TERMINAL)
            if done >= args.jobs - errors:
                break
            if time.monotonic() - last_report > 5:
                print(f"  {done} finished {counts}", flush=True)
                last_report = time.monotonic()
            time.sleep(0.2)
        cpu_after = cpu_seconds()
        wall = time.time() - wall_before
        with engine.connect() as conn:
            rows = conn.execute(
                select(Job.status, Job.created_at, Job.started_at, Job.finished_at)
            ).all()
        if profiler is not None:
            profiler.wait(timeout=90)
    finally:
        engine.dispose()
        stack.stop()

    # A job counts once it is in a final state (a lost update on SQLite can leave a job
    # RUNNING with finished_at set: that one is stuck, not finished).
    finished = sorted(
        r.finished_at.timestamp()
        for r in rows
        if r.finished_at is not None and str(r.status) in TERMINAL
    )
    statuses = Counter(str(r.status) for r in rows)
    n_done = len(finished)
    elapsed = finished[-1] - first_post if finished else float("nan")
    drain = n_done / elapsed if finished else 0.0
    # Queued first: the rate that counts is from the release (the submissions are not in it).
    drained = finished[-1] - released_at if finished and released_at else float("nan")
    drain_released = n_done / drained if finished and released_at else None
    rate = drain_released if drain_released is not None else drain  # compared with the anchor
    lo, hi = percentile(finished, 10), percentile(finished, 90)
    in_band = sum(lo <= f <= hi for f in finished)
    steady = (in_band - 1) / (hi - lo) if hi > lo else float("nan")
    submit_rate = (args.jobs - errors) / (last_post - first_post)
    waits = [
        r.started_at.timestamp() - max(r.created_at.timestamp(), released_at or 0.0)
        for r in rows
        if r.started_at is not None and r.created_at is not None
    ]
    rows_out = [
        ("jobs finished", f"{n_done} of {args.jobs} ({dict(statuses)})"),
        *(
            [
                (
                    "from release",
                    f"{drain_released:.1f} jobs/s  ({n_done} jobs in {drained:.1f}s, all queued)",
                )
            ]
            if drain_released is not None
            else []
        ),
        ("drain rate", f"{drain:.1f} jobs/s  ({n_done} jobs in {elapsed:.1f}s from first POST)"),
        ("steady rate", f"{steady:.1f} jobs/s  (10th..90th percentile of finish times)"),
        ("submit rate", f"{submit_rate:.1f} POST/s  ({args.clients} clients)"),
        ("queue wait", f"p50 {percentile(waits, 50):.1f}s  max {max(waits, default=0):.1f}s"),
        (
            "reference",
            f"Slurm tuned on this machine: {SLURM_JOBS_PER_S:.0f} jobs/s -> "
            f"{'MET' if rate >= SLURM_JOBS_PER_S else 'NOT MET'}",
        ),
    ]
    cpu = {k: cpu_after.get(k, 0.0) - cpu_before.get(k, 0.0) for k in cpu_after}
    cpu = {k: v for k, v in cpu.items() if v > 0}  # backends that exited meanwhile
    rows_out.append(
        (
            "CPU used",
            ", ".join(f"{k} {v:.1f}s" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]))
            + f"  (of {wall * (os.cpu_count() or 1):.0f} CPU-s available in {wall:.0f}s)",
        )
    )
    # Steadier than the rate on shared cores: what each finished job cost the stack.
    rows_out.append(
        (
            "CPU per job",
            f"{1000 * sum(cpu.values()) / max(n_done, 1):.1f} ms (stack, without the clients)",
        )
    )
    print_table(rows_out, f"drain: {args.jobs} x `true` on 2 nodes x 4 simulated GPUs, {args.db}")
    result = {
        "db": args.db,
        "jobs": args.jobs,
        "clients": args.clients,
        "cluster": "2 nodes x 4 simulated H100, 1-GPU jobs running `true`",
        "settings": stack.env_overrides,
        "statuses": dict(statuses),
        "queued_first": args.queued_first,
        "drain_jobs_per_s": drain,
        "drain_from_release_jobs_per_s": drain_released,
        "steady_jobs_per_s": steady,
        "submit_per_s": submit_rate,
        "elapsed_s": elapsed,
        "submit_errors": errors,
        "cpu_seconds": cpu,
        "wall_s": wall,
        "queue_wait_p50_s": percentile(waits, 50),
        "slurm_reference_jobs_per_s": SLURM_JOBS_PER_S,
        "machine": machine_info(),
    }
    if args.profile and raw.exists():
        top = top_functions(raw)
        result["scheduler_profile_top"] = top
        print("scheduler: functions by inclusive share of samples")
        for frame, pct in top:
            print(f"  {pct:5.1f}%  {frame[:150]}")
    path = write_results("drain", result)
    print(f"results: {path}")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
