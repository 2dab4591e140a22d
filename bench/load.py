"""Load test: a burst of jobs from many concurrent API clients while agents run them.

    .venv/bin/python bench/load.py [--jobs 10000] [--clients 64] [--db postgresql|sqlite]

Starts the real stack (tests/support/stack.py: private Redis, API, scheduler, agents) with
`--nodes` simulated nodes of `--gpus-per-node` GPUs, then `--clients` asyncio+httpx clients
submit `--jobs` jobs running `true` (half with 1 whole GPU, half with gpu_share 0.25), each
with its own Idempotency-Key. After the burst, `--resend-pct` percent of the requests are
sent again with the same key and body: each must answer 200 with the first job's id.
Then it waits until every job has finished and checks, through the API, that every job
SUCCEEDED and that there is exactly one job per key.

Reported: API latency (p50/p90/p99/max) of the burst, scheduler cycle time (from the
scheduler's Prometheus histogram `gpusched_scheduling_cycle_seconds` on its metrics port,
else from the "cycle: ... total N ms" lines of its log), total wall time and jobs finished
per second. Prints a table; writes bench/results/load.json.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.common import (
    ROOT,
    bench_args,
    bench_env,
    durable_postgres,
    machine_info,
    print_table,
    summarize,
)
from tests.support.servers import free_port
from tests.support.stack import Stack

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT")


def spec_for(i: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": f"load-{i}", "command": "true", "gpus": 1}
    if i % 2:
        spec["gpu_share"] = 0.25
    return spec


async def burst(
    stack: Stack, n: int, clients: int, run: str
) -> tuple[list[float], Counter[int], dict[int, int], float, float]:
    """POST n jobs from `clients` coroutines; returns (latencies, status codes, key index ->
    job id, start, end)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    latencies: list[float] = []
    codes: Counter[int] = Counter()
    ids: dict[int, int] = {}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(
        base_url=stack.url,
        headers={"Authorization": f"Bearer {stack.token}"},
        timeout=120,
        limits=limits,
    ) as http:

        async def client() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                for attempt in range(5):  # retry only what the API asks to be retried
                    t0 = time.perf_counter()
                    try:
                        r = await http.post(
                            "/api/v1/jobs",
                            json=spec_for(i),
                            headers={"Idempotency-Key": f"{run}-{i}"},
                        )
                    except httpx.HTTPError:
                        codes[-1] += 1
                        await asyncio.sleep(0.5 * (attempt + 1))
                        continue
                    latencies.append(time.perf_counter() - t0)
                    codes[r.status_code] += 1
                    if r.status_code in (200, 201):
                        ids[i] = r.json()["id"]
                        break
                    if r.status_code not in (429, 503):
                        break
                    await asyncio.sleep(0.5 * (attempt + 1))

        start = time.time()
        await asyncio.gather(*(client() for _ in range(clients)))
        end = time.time()
    return latencies, codes, ids, start, end


async def resend(
    stack: Stack, picks: list[int], clients: int, run: str
) -> tuple[list[float], Counter[int], dict[int, int]]:
    latencies: list[float] = []
    codes: Counter[int] = Counter()
    got: dict[int, int] = {}
    sem = asyncio.Semaphore(clients)
    async with httpx.AsyncClient(
        base_url=stack.url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=120
    ) as http:

        async def one(i: int) -> None:
            async with sem:
                t0 = time.perf_counter()
                r = await http.post(
                    "/api/v1/jobs", json=spec_for(i), headers={"Idempotency-Key": f"{run}-{i}"}
                )
                latencies.append(time.perf_counter() - t0)
                codes[r.status_code] += 1
                if r.status_code in (200, 201):
                    got[i] = r.json()["id"]

        await asyncio.gather(*(one(i) for i in picks))
    return latencies, codes, got


def progress(database_url: str) -> tuple[dict[str, int], Any]:
    """(status -> count, latest finished_at) straight from the database: cheap enough to
    poll every second; the final accounting goes through the API."""
    from sqlalchemy import create_engine, func, select

    from app.jobs.models import Job

    engine = progress.engines.get(database_url)  # type: ignore[attr-defined]
    if engine is None:
        engine = progress.engines[database_url] = create_engine(database_url)  # type: ignore[attr-defined]
    with engine.connect() as conn:
        rows = conn.execute(select(Job.status, func.count()).group_by(Job.status)).all()
        last = conn.execute(select(func.max(Job.finished_at))).scalar()
    return {str(getattr(s, "value", s)): c for s, c in rows}, last


progress.engines = {}  # type: ignore[attr-defined]


def api_accounting(stack: Stack, run: str) -> dict[str, Any]:
    """Every job through the API (paged): statuses, and jobs per name (one per key)."""
    statuses: Counter[str] = Counter()
    names: Counter[str] = Counter()
    attempts: Counter[int] = Counter()
    finished: list[str] = []
    params: dict[str, Any] = {"limit": 500}
    pages = 0
    while True:
        page = stack.api("GET", "/api/v1/jobs", params=params).json()
        pages += 1
        for job in page["items"]:
            statuses[job["status"]] += 1
            names[job["name"]] += 1
            attempts[job["attempt"]] += 1
            if job.get("finished_at"):
                finished.append(job["finished_at"])
        if not page["next_cursor"]:
            break
        params["cursor"] = page["next_cursor"]
    return {
        "statuses": dict(statuses),
        "total": sum(statuses.values()),
        "duplicate_names": {k: v for k, v in names.items() if v > 1},
        "attempts": dict(attempts),
        "pages": pages,
    }


def cycle_metrics(port: int | None) -> dict[str, Any] | None:
    """Scheduling cycle durations from the scheduler's Prometheus endpoint."""
    if not port:
        return None
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("gpusched_scheduling_cycle_seconds_bucket"):
            le = re.search(r'le="([^"]+)"', line)
            if le:
                buckets.append((float(le.group(1)), float(line.rsplit(" ", 1)[1])))
        elif line.startswith("gpusched_scheduling_cycle_seconds_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith("gpusched_scheduling_cycle_seconds_count"):
            count = float(line.rsplit(" ", 1)[1])
    if not count:
        return None

    def quantile(q: float) -> float:
        # The upper bound of the bucket the q-th observation falls in (Prometheus style,
        # without interpolation): an upper estimate.
        for le, cum in sorted(buckets):
            if cum >= q * count:
                return le
        return float("inf")

    return {
        "source": f"metrics port {port}",
        "cycles": int(count),
        "mean_s": total / count,
        "p50_le_s": quantile(0.5),
        "p99_le_s": quantile(0.99),
    }


def cycle_from_log(log: Path) -> dict[str, Any] | None:
    values = [
        float(m.group(1)) / 1000
        for m in re.finditer(r"cycle: placed .*total ([0-9.]+) ms", log.read_text(errors="replace"))
    ]
    if not values:
        return None
    return {"source": "scheduler log (cycles that placed something)", **summarize(values)}


def main() -> int:
    durable_postgres()
    args = bench_args(
        __doc__.splitlines()[0],
        jobs=10000,
        clients=64,
        nodes=2,
        gpus_per_node=8,
        resend_pct=1.0,
        timeout=1800.0,
        seed=7,
    )
    rng = random.Random(args.seed)
    run = f"load{int(time.time())}"
    metrics_port = free_port()
    root = Path(tempfile.mkdtemp(prefix="gpusched-load-"))
    agents = {f"n{k + 1}": f"sim:{args.gpus_per_node}:H100-80GB" for k in range(args.nodes)}
    env = {**bench_env(), "GPUSCHED_SCHEDULER_METRICS_PORT": str(metrics_port)}
    stack = Stack(root, db=args.db, agents=agents, env=env, reports_worker=True)
    print(f"starting the stack in {root} ({args.db}, {args.nodes} x {args.gpus_per_node} GPUs)")
    stack.start(timeout=120)
    try:
        wall0 = time.time()
        lat, codes, ids, t_start, t_end = asyncio.run(burst(stack, args.jobs, args.clients, run))
        print(f"burst: {len(ids)} accepted in {t_end - t_start:.1f}s, codes {dict(codes)}")
        picks = rng.sample(range(args.jobs), max(1, int(args.jobs * args.resend_pct / 100)))
        picks = [i for i in picks if i in ids]
        re_lat, re_codes, re_ids = asyncio.run(resend(stack, picks, args.clients, run))
        replay_mismatch = [i for i in picks if re_ids.get(i) != ids[i]]
        print(f"re-sent {len(picks)}: codes {dict(re_codes)}, mismatched ids {replay_mismatch}")

        deadline = time.monotonic() + args.timeout
        last_print = 0.0
        counts: dict[str, int] = {}
        stopped_early = "timeout"
        try:
            while time.monotonic() < deadline:
                stack._check_alive()
                counts, last_finished = progress(stack.database_url)
                done = sum(counts.get(s, 0) for s in TERMINAL)
                if time.monotonic() - last_print > 10:
                    rate = done / max(1e-9, time.time() - t_start)
                    print(f"  {time.time() - wall0:6.0f}s  {counts}  ({rate:.1f} finished/s)")
                    last_print = time.monotonic()
                if done >= len(ids):
                    stopped_early = ""
                    break
                time.sleep(1)
        except KeyboardInterrupt:  # Ctrl-C: report what finished so far
            stopped_early = "interrupted"
        if stopped_early:
            print(f"NOT DRAINED ({stopped_early} after --timeout {args.timeout:.0f}s): partial")
        wall = time.time() - wall0
        counts, last_finished = progress(stack.database_url)
        accounting = api_accounting(stack, run)
        cycle = cycle_metrics(metrics_port) or cycle_from_log(stack.procs["scheduler"].log)
        finished_span = (
            last_finished.timestamp() - t_start if last_finished is not None else float("nan")
        )
        succeeded = accounting["statuses"].get("SUCCEEDED", 0)
        if stopped_early and last_finished is not None:
            # Not drained: the rate is what finished so far over the time so far.
            last_finished = max(
                last_finished, type(last_finished).fromtimestamp(time.time(), last_finished.tzinfo)
            )
        lat_ms = {k: (v * 1000 if k != "n" else v) for k, v in summarize(lat).items()}
        result = {
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "db": args.db,
            "jobs": args.jobs,
            "clients": args.clients,
            "cluster": f"{args.nodes} nodes x {args.gpus_per_node} simulated H100; `true`, "
            "half 1 GPU, half gpu_share 0.25",
            "settings": env,
            "accepted": len(ids),
            "submit_codes": dict(codes),
            "submit_s": t_end - t_start,
            "submit_per_s": len(ids) / max(1e-9, t_end - t_start),
            "api_latency_ms": lat_ms,
            "resent": len(picks),
            "resend_codes": dict(re_codes),
            "resend_latency_ms": {
                k: (v * 1000 if k != "n" else v) for k, v in summarize(re_lat).items()
            },
            "resend_id_mismatches": replay_mismatch,
            "api_total_jobs": accounting["total"],
            "api_statuses": accounting["statuses"],
            "attempts": accounting["attempts"],
            "duplicate_jobs": accounting["duplicate_names"],
            "all_succeeded": succeeded == args.jobs and accounting["total"] == args.jobs,
            "stopped_early": stopped_early or None,
            "scheduler_cycle": cycle,
            "wall_s": wall,
            "finished_span_s": finished_span,
            "jobs_finished_per_s": succeeded / finished_span if finished_span else None,
            "machine": machine_info(),
        }
        out = ROOT / "bench" / "results" / "load.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        cyc = (
            f"mean {cycle['mean_s'] * 1000:.1f} ms, p50 <= {cycle['p50_le_s'] * 1000:.0f} ms, "
            f"p99 <= {cycle['p99_le_s'] * 1000:.0f} ms over {cycle['cycles']} cycles"
            if cycle and "mean_s" in cycle
            else (
                f"p50 {cycle['p50'] * 1000:.1f} ms, p99 {cycle['p99'] * 1000:.1f} ms "
                f"({cycle['n']} placing cycles, from the log)"
                if cycle
                else "unavailable"
            )
        )
        print_table(
            [
                ("jobs submitted / accepted", f"{args.jobs} / {len(ids)}"),
                ("clients", str(args.clients)),
                ("submit codes", str(dict(codes))),
                ("submit rate", f"{result['submit_per_s']:.1f} /s over {t_end - t_start:.1f} s"),
                ("API latency p50", f"{lat_ms['p50']:.1f} ms"),
                ("API latency p90", f"{lat_ms['p90']:.1f} ms"),
                ("API latency p99", f"{lat_ms['p99']:.1f} ms"),
                ("API latency max", f"{lat_ms['max']:.1f} ms"),
                (
                    "re-sent (same key)",
                    f"{len(picks)}: {dict(re_codes)}, {len(replay_mismatch)} id mismatches",
                ),
                ("jobs via API", f"{accounting['total']} {accounting['statuses']}"),
                ("duplicate jobs", str(len(accounting["duplicate_names"]))),
                ("all SUCCEEDED", str(result["all_succeeded"])),
                ("scheduler cycle", cyc),
                ("wall time", f"{wall:.1f} s"),
                ("jobs finished/s", f"{result['jobs_finished_per_s']:.2f}"),
            ],
            f"load test ({args.db})",
        )
        print(f"wrote {out}")
        ok = (
            result["all_succeeded"]
            and not accounting["duplicate_names"]
            and not replay_mismatch
            and set(re_codes) <= {200}
        )
        return 0 if ok else 1
    finally:
        stack.stop()
        if not args.keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
