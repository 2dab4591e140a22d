"""A deep queue against the real database: the full cycle's phases, and a bulk cancel's
memory in the API process (issue 42 point 4).

    .venv/bin/python bench/deep_queue.py [--db postgresql|sqlite] [--waiting 20000]
        [--repeat 5] [--skip-memory] [--nodes 2] [--gpus-per-node 4] [--ended 1]
        [--fresh-gpus 1.0] [--history 0]

Cycle: as the scheduler worker runs it (one QueueMemory across cycles), on `nodes` x
`gpus-per-node` GPUs (2 x 4; 1,000 x 8 is the fleet's cluster, issue 35 point 4), with `waiting` jobs of two projects (1-4 GPUs, priorities and runtimes varied)
inserted in bulk. Times `run_cycle` as the scheduler runs its full cycle every few
seconds: the first one (every job NEW), then full cycles with nothing changed, then full
cycles after one running job ended (one placed: every job behind it moves up a place,
which costs no write since places come from the stored ranking; `--ended N`: N jobs
ended before each, as on a large cluster many end between two cycles; `--fresh-gpus F`:
the GPU readings of that share of the nodes are new before each cycle, in turn, where
1 has every node report between two cycles; `--history N`: N jobs that succeeded within
the fair-share usage horizon, one GPU-hour each, which a full cycle sums the decayed usage
of); then the same two kinds of quick cycle, which
an event (a job ended, one submitted) triggers between two full ones and which a live
scheduler mostly runs (QueueMemory: the head of the queue, the whole cluster). Each row
splits the
cycle: phase 0 (dependencies, array limits, clock gates), snapshot read, plan, apply
(reasons and queue keys written, committed), rank storage; with the count of SQL
statements, how many jobs' change-stamps one cycle looked at (`stamps`: those changed
since the last full read, by job.changed_in; every waiting job's once a minute), the most
waiting jobs one cycle read whole (`read`: those whose change-stamp moved,
job.row_version), the most rows one cycle wrote (`written`: the change-stamps it
moved), the waiting jobs whose queue key it rewrote (`keys`) and the bench process's CPU
time in the cycle (on a shared machine the wall time also counts other processes' turns;
on SQLite the database's work is in this process, on PostgreSQL the server's is not).
Goal: <= 150 ms for a full cycle at 20,000 waiting.

Memory: the API as its own process (uvicorn, one worker), its resident set size read
from /proc before and after POST /api/v1/jobs/cancel?status=PENDING of the `waiting`
jobs (and after a second, empty one: what stays). Goal: the RSS after is about the RSS
before (the API does not keep 20,000 jobs' worth of objects).

Prints tables; writes bench/results/deep_queue-<db>.json.
"""

from __future__ import annotations

import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from sqlalchemy import event, func, insert, select, text, update

from app.cycle.run import CycleReport, run_cycle
from app.cycle.settings import SchedulerSettings
from app.cycle.snapshot import QueueMemory
from app.db import make_engine, make_session_factory, utcnow
from app.jobs.allocations import release
from app.jobs.lifecycle import transition
from app.jobs.models import Job
from app.jobs.states import ACTIVE, JobStatus
from app.messaging import NullMessenger
from app.migrate import upgrade
from app.nodes.models import Allocation, Gpu, Node, NodeState
from bench.common import bench_args, durable_postgres, machine_info, print_table, write_results
from bench.rank import seed_queue
from tests.support.servers import create_pg_database, drop_pg_database, free_port
from tests.support.wait import poll

GOAL_MS = 150.0
SETTINGS = SchedulerSettings(stability_window_s=0)


def _cluster(factory: Any, *, nodes: int, gpus_per_node: int) -> None:
    now = utcnow()
    with factory() as session:
        for n in range(nodes):
            node = Node(name=f"n{n}", hostname="127.0.0.1", state=NodeState.READY)
            node.last_heartbeat_at = now
            node.gpus = [
                Gpu(
                    index=i,
                    uuid=f"GPU-n{n}-{i}",
                    model="H100-80GB",
                    memory_total_mb=81559,
                    memory_used_mb=0,
                    sampled_at=now,
                    util_pct=0.0,
                    idle_since=now,
                )
                for i in range(gpus_per_node)
            ]
            session.add(node)
        session.commit()


def _heartbeat(factory: Any, *, share: float) -> None:
    """The nodes' agents report, as they would every few seconds: on a loaded machine
    the bench runs past the heartbeat timeout (30 s), and cycles on nodes gone stale placed
    nothing (the "one job ended" rows then timed no placement, or none at all). Every
    node is marked heard from; the GPU readings of `share` of them, in turn, are new
    (1,000 nodes heartbeating every 5 s between cycles half a second apart: a tenth)."""
    now = utcnow()
    turns = max(1, round(1 / share))
    turn = next(HEARTBEATS) % turns
    with factory() as session:
        session.execute(update(Node).values(last_heartbeat_at=now))
        session.execute(update(Gpu).where(Gpu.node_id % turns == turn).values(sampled_at=now))
        session.commit()


HEARTBEATS = itertools.count()  # which share of the nodes' GPUs reports next


def _end_some(factory: Any, count: int) -> bool:
    """The `count` oldest placed jobs run and succeed: their GPUs are free for the next
    cycle. False: fewer are placed (the cycles since did not fill the GPUs)."""
    with factory() as session:
        jobs = session.scalars(
            select(Job).where(Job.status.in_(ACTIVE)).order_by(Job.id).limit(count)
        ).all()
        if len(jobs) < count:
            return False
        for job in jobs:
            if job.status is JobStatus.SCHEDULED:
                transition(session, job=job, to=JobStatus.RUNNING, actor="bench")
            transition(session, job=job, to=JobStatus.SUCCEEDED, actor="bench")
            release(session, job_id=job.id)
        session.commit()
    return True


def _history(factory: Any, count: int) -> None:
    """`count` jobs that succeeded within the last 27 days (the usage horizon is 28 at the
    default half-life), one GPU-hour each, written in bulk; analyzed on PostgreSQL."""
    with factory() as session:
        user_id, project_id = session.execute(select(Job.user_id, Job.project_id).limit(1)).one()
        gpu = session.scalars(select(Gpu).order_by(Gpu.id).limit(1)).one()
        now = utcnow()
        for start in range(0, count, 5000):
            ended = [
                now - timedelta(days=27 * (start + i) / count)
                for i in range(min(5000, count - start))
            ]
            ids = session.scalars(
                insert(Job).returning(Job.id),
                [
                    {
                        "name": "history", "user_id": user_id, "project_id": project_id,
                        "command": ["train"], "status": JobStatus.SUCCEEDED, "attempt": 1,
                        "finished_at": at,
                    }
                    for at in ended
                ],
            ).all()  # fmt: skip
            session.execute(
                insert(Allocation),
                [
                    {
                        "job_id": job_id, "attempt": 1, "node_id": gpu.node_id, "gpu_id": gpu.id,
                        "share_milli": 1000, "created_at": at - timedelta(hours=1),
                        "released_at": at,
                    }
                    for job_id, at in zip(ids, ended, strict=True)
                ],
            )  # fmt: skip
        session.commit()
        if session.get_bind().dialect.name == "postgresql":
            session.execute(text("ANALYZE job, allocation"))
            session.commit()


def _stamps(factory: Any) -> tuple[int, dict[int, int | None]]:
    """The sum of every job's change-stamp (each row an UPDATE wrote adds one) and each
    waiting job's queue key."""
    with factory() as session:
        total = session.scalar(select(func.sum(Job.row_version))) or 0
        keys = dict(
            session.execute(
                select(Job.id, Job.queue_position).where(Job.status == JobStatus.PENDING)
            ).all()
        )
    return int(total), keys


def _cycle(
    engine: Any, factory: Any, memory: QueueMemory, *, share: float, quick: bool = False
) -> tuple[CycleReport, int, float, int, int]:
    """The cycle's report, its SQL statements, this process's CPU ms in it, how many
    jobs' change-stamps its snapshot looked at and how many waiting jobs it read whole (the
    others' change-stamps had not moved). Rows
    written (change-stamps moved) and queue keys written go to WRITTEN, counted outside
    the timing."""
    _heartbeat(factory, share=share)  # before the timing: not the cycle's work
    stamps_before, keys_before = _stamps(factory)
    statements = [0]

    def count(*_: Any) -> None:
        statements[0] += 1

    event.listen(engine, "before_cursor_execute", count)
    cpu = time.process_time()
    try:
        report = run_cycle(
            factory=factory, messenger=NullMessenger(), settings=SETTINGS, holder="bench",
            now=utcnow(), full_every_s=5.0, memory=memory, all_positions=not quick,
        )  # fmt: skip
    finally:
        cpu = time.process_time() - cpu
        event.remove(engine, "before_cursor_execute", count)
    assert report.ran
    stamps_after, keys_after = _stamps(factory)
    WRITTEN.append(
        (
            stamps_after - stamps_before,
            sum(1 for job, key in keys_after.items() if keys_before.get(job, key) != key),
        )
    )
    return report, statements[0], cpu * 1000, memory.views.stamps, memory.views.reread


# (rows written, waiting jobs whose queue key was rewritten) of each cycle, in order.
WRITTEN: list[tuple[int, int]] = []


PHASES = ("total_ms", "settle_ms", "snapshot_ms", "plan_ms", "apply_ms", "ranks_ms")


def _row(runs: list[Any]) -> dict[str, Any]:
    row: dict[str, Any] = {
        phase: statistics.median(getattr(r, phase) for r, *_ in runs) for phase in PHASES
    }
    row["worst_total_ms"] = max(r.total_ms for r, *_ in runs)
    row["cpu_ms"] = statistics.median(r[2] for r in runs)
    row["statements"] = runs[-1][1]
    row["stamps_read"] = max(r[3] for r in runs)
    row["rows_read"] = max(r[4] for r in runs)
    row["rows_written"] = max(r[5] for r in runs)
    row["keys_written"] = max(r[6] for r in runs)
    row["placed"] = sum(r.placed for r, *_ in runs)
    row["pending"] = runs[-1][0].pending
    row["runs"] = len(runs)
    return row


def cycles(
    engine: Any, factory: Any, *, repeat: int, ended: int, share: float
) -> dict[str, dict[str, Any]]:
    # One memory across the cycles, as the scheduler worker keeps one.
    memory = QueueMemory()

    def timed(quick: bool = False) -> tuple[Any, ...]:
        """`_cycle`, with the rows and keys it wrote."""
        return (*_cycle(engine, factory, memory, share=share, quick=quick), *WRITTEN[-1])

    def after_ends(quick: bool) -> dict[str, Any]:
        runs: list[tuple[Any, ...]] = []
        for _ in range(3 * repeat):
            if len(runs) == repeat:
                break
            if not _end_some(factory, ended):
                _cycle(engine, factory, memory, share=share)  # GPUs idle: it places, untimed
                continue
            runs.append(timed(quick))
        return _row(runs)

    ended_label = "one job ended" if ended == 1 else f"{ended} jobs ended"
    results = {"first full cycle (all NEW)": _row([timed()])}
    # The first cycle rewrote every waiting job's reason: analyzed again, as autovacuum
    # would within a minute, or the planner keeps believing every job is NEW and reads
    # the whole queue to find the new ones (10 ms of each quick cycle at 20,000).
    if engine.dialect.name == "postgresql":
        with engine.begin() as connection:
            connection.execute(text("ANALYZE job"))
    results["full, nothing changed"] = _row([timed() for _ in range(repeat)])
    results[f"full, {ended_label}"] = after_ends(quick=False)
    # The cycles an event triggers between two full ones (QueueMemory): most of a live
    # scheduler's, so the ones its median is made of.
    _cycle(engine, factory, memory, share=share)  # a full one first, for them to start from
    results["quick, nothing changed"] = _row([timed(quick=True) for _ in range(repeat)])
    results[f"quick, {ended_label}"] = after_ends(quick=True)
    return results


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _hwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def memory(url: str, token: str, root: Path) -> dict[str, Any]:
    """RSS of an API process around a bulk cancel of every waiting job."""
    port = free_port()
    env = {
        **os.environ,
        "GPUSCHED_DATABASE_URL": url,
        "GPUSCHED_DATA_DIR": str(root / "data"),
        "GPUSCHED_TOKEN_CACHE_S": "0",
    }
    log = (root / "api.log").open("wb")
    api = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.asgi:app", "--port", str(port),
         "--no-proxy-headers", "--log-level", "warning"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/api/v1"
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(headers=headers, timeout=120) as client:
            poll("the API answers", lambda: client.get(f"{base}/jobs?limit=1").is_success,
                 timeout=60)  # fmt: skip
            for _ in range(20):  # warm: every code path of a list and a page loaded once
                client.get(f"{base}/jobs?limit=50").raise_for_status()
                client.get(f"{base}/queue?limit=50")
            before = _rss_kb(api.pid)
            started = time.perf_counter()
            r = client.post(f"{base}/jobs/cancel?status=PENDING")
            elapsed = time.perf_counter() - started
            r.raise_for_status()
            body = r.json()
            after = _rss_kb(api.pid)
            peak = _hwm_kb(api.pid)
            client.post(f"{base}/jobs/cancel?status=PENDING").raise_for_status()
            for _ in range(20):
                client.get(f"{base}/jobs?limit=50").raise_for_status()
            settled = _rss_kb(api.pid)
    finally:
        api.terminate()
        api.wait(timeout=30)
        log.close()
    return {
        "cancelled": body["count"],
        "answer_bytes": len(r.content),
        "cancel_s": elapsed,
        "rss_before_mb": before / 1024,
        "rss_after_mb": after / 1024,
        "rss_peak_mb": peak / 1024,
        "rss_settled_mb": settled / 1024,
    }


def main() -> int:
    durable_postgres()
    args = bench_args(
        __doc__.splitlines()[0],
        waiting=20_000,
        repeat=5,
        skip_memory=False,
        nodes=2,
        gpus_per_node=4,
        ended=1,
        fresh_gpus=1.0,
        history=0,
    )
    root = Path(tempfile.mkdtemp(prefix="gpusched-deepq-"))
    pg_name = None
    if args.db == "postgresql":
        pg_name, url = create_pg_database("gpusched_bench")
    else:
        url = f"sqlite:///{root / 'bench.db'}"
    engine = make_engine(url)
    upgrade(engine)
    mem: dict[str, Any] = {}
    try:
        factory = make_session_factory(engine)
        _cluster(factory, nodes=args.nodes, gpus_per_node=args.gpus_per_node)
        token = seed_queue(factory, args.waiting)  # analyzed on PostgreSQL
        _history(factory, args.history)
        results = cycles(
            engine, factory, repeat=args.repeat, ended=args.ended, share=args.fresh_gpus
        )
        if not args.skip_memory:
            mem = memory(url, token, root)
    finally:
        engine.dispose()
        if pg_name:
            drop_pg_database(pg_name)
        shutil.rmtree(root, ignore_errors=True)

    head = (
        f"{'full cycle':<28} {'total':>7} {'worst':>7} {'cpu':>7} {'phase0':>7} {'snapshot':>8} "
        f"{'plan':>7} {'apply':>7} {'ranks':>7} {'SQL':>5} {'stamps':>6} {'read':>6} {'placed':>6} "
        f"{'written':>7} {'keys':>6}"
    )
    print(
        f"\nfull cycle, {args.waiting} waiting, {args.history} succeeded within the usage "
        f"horizon, {args.nodes} x {args.gpus_per_node} GPUs, "
        f"{args.db}: "
        f"median ms of {args.repeat} (goal <= {GOAL_MS:.0f} ms)"
    )
    print(head + "\n" + "-" * len(head))
    for label, r in results.items():
        print(
            f"{label:<28} {r['total_ms']:>7.1f} {r['worst_total_ms']:>7.1f} {r['cpu_ms']:>7.1f} "
            f"{r['settle_ms']:>7.1f} {r['snapshot_ms']:>8.1f} {r['plan_ms']:>7.1f} "
            f"{r['apply_ms']:>7.1f} {r['ranks_ms']:>7.1f} {r['statements']:>5} "
            f"{r['stamps_read']:>6} {r['rows_read']:>6} {r['placed']:>6} {r['rows_written']:>7} {r['keys_written']:>6}"
        )
    if mem:
        cancelled = (
            f"{mem['cancelled']} in {mem['cancel_s']:.2f} s, answer {mem['answer_bytes']} bytes"
        )
        print_table(
            [
                ("jobs cancelled", cancelled),
                ("API RSS before", f"{mem['rss_before_mb']:.0f} MB"),
                (
                    "API RSS after",
                    f"{mem['rss_after_mb']:.0f} MB (peak {mem['rss_peak_mb']:.0f} MB)",
                ),
                ("API RSS after 20 more requests", f"{mem['rss_settled_mb']:.0f} MB"),
            ],
            f"bulk cancel of {args.waiting} waiting jobs, API process, {args.db}",
        )
    path = write_results(
        "deep_queue",
        {
            "db": args.db,
            "waiting": args.waiting,
            "nodes": args.nodes,
            "gpus_per_node": args.gpus_per_node,
            "ended_per_cycle": args.ended,
            "fresh_gpus": args.fresh_gpus,
            "history": args.history,
            "cycle": results,
            "memory": mem,
            "load": os.getloadavg()[0],
            "machine": machine_info(),
        },
    )
    machine = machine_info()
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, scheduling core "
        f"{machine['core']}, reference loop {machine['reference_loop_ms']:.0f} ms; "
        f"results: {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
