"""One live cycle that places many jobs at once, against the real database.

    .venv/bin/python bench/apply.py [--db postgresql|sqlite] [--repeat 3]

A job array or a burst of submissions meets free GPUs: the cycle places a job on every
free GPU, and writing those placements (phase 3, one transaction that re-verifies each
one) is most of the cycle, not the plan. For 8, 64 and 256 placements (1, 8 and 32 idle
nodes x 8 GPUs, as many 1-GPU jobs waiting) it times one full `run_cycle` (dependencies,
snapshot, plan, apply; no Redis), counts its SQL statements, and prints a table; writes
bench/results/apply-<db>.json.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastapi.testclient import TestClient
from sqlalchemy import event

from app.auth.service import create_user
from app.config import Settings
from app.cycle.run import run_cycle
from app.cycle.settings import SchedulerSettings
from app.db import make_engine, make_session_factory, utcnow
from app.main import create_app
from app.messaging import NullMessenger
from app.migrate import upgrade
from app.nodes.models import Gpu, Node, NodeState
from bench.common import bench_args, durable_postgres, machine_info, print_table, write_results
from tests.support.servers import create_pg_database, drop_pg_database, wipe_tables

SIZES = (8, 64, 256)
GPUS_PER_NODE = 8
SETTINGS = SchedulerSettings(stability_window_s=0, preemption=False)


def _idle_nodes(factory: Any, count: int) -> None:
    now = utcnow()
    with factory() as session:
        for n in range(count):
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
                for i in range(GPUS_PER_NODE)
            ]
            session.add(node)
        session.commit()


def one_cycle(engine: Any, data_dir: Path, jobs: int) -> tuple[float, int, int]:
    """(seconds, placed, SQL statements) of the cycle that places `jobs` waiting jobs."""
    wipe_tables(engine)
    factory = make_session_factory(engine)
    with factory() as session:
        _, token = create_user(
            session=session,
            name="alice",
            projects=["ml"],
            is_admin=False,
            ttl_days=0,
            actor="bench",
        )
        session.commit()
    _idle_nodes(factory, jobs // GPUS_PER_NODE)
    settings = Settings(data_dir=data_dir, database_url=str(engine.url), token_cache_s=0)
    with TestClient(create_app(settings, session_factory=factory)) as client:
        for i in range(jobs):
            r = client.post(
                "/api/v1/jobs",
                json={"command": "true", "gpus": 1, "name": f"burst-{i}"},
                headers={"Authorization": f"Bearer {token}"},
            )
            r.raise_for_status()
    statements = [0]

    def count(*_: Any) -> None:
        statements[0] += 1

    event.listen(engine, "before_cursor_execute", count)
    try:
        started = time.perf_counter()
        report = run_cycle(
            factory=factory,
            messenger=NullMessenger(),
            settings=SETTINGS,
            holder="bench",
            now=utcnow(),
        )
        elapsed = time.perf_counter() - started
    finally:
        event.remove(engine, "before_cursor_execute", count)
    return elapsed, report.placed, statements[0]


def main() -> int:
    durable_postgres()
    args = bench_args(__doc__.splitlines()[0], repeat=3)
    root = Path(tempfile.mkdtemp(prefix="gpusched-apply-"))
    pg_name = None
    if args.db == "postgresql":
        pg_name, url = create_pg_database("gpusched_bench")
    else:
        url = f"sqlite:///{root / 'bench.db'}"
    engine = make_engine(url)
    upgrade(engine)
    results: dict[int, dict[str, Any]] = {}
    try:
        for jobs in SIZES:
            runs = [one_cycle(engine, root / "data", jobs) for _ in range(args.repeat)]
            if any(placed != jobs for _, placed, _ in runs):
                raise SystemExit(f"a cycle placed {[p for _, p, _ in runs]} of {jobs} jobs")
            results[jobs] = {
                "median_ms": statistics.median(s for s, _, _ in runs) * 1000,
                "runs_ms": [s * 1000 for s, _, _ in runs],
                "statements": runs[0][2],
            }
    finally:
        engine.dispose()
        if pg_name:
            drop_pg_database(pg_name)
        shutil.rmtree(root, ignore_errors=True)

    rows = [
        (
            f"{jobs} placements",
            f"cycle {r['median_ms']:.0f} ms median of {args.repeat}  "
            f"({r['median_ms'] / jobs:.2f} ms per job), {r['statements']} SQL statements",
        )
        for jobs, r in results.items()
    ]
    print_table(rows, f"one cycle placing every waiting job on idle GPUs, {args.db}")
    path = write_results(
        "apply",
        {"db": args.db, "repeat": args.repeat, "results": results, "machine": machine_info()},
    )
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
