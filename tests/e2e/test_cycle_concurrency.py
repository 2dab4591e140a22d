"""Two scheduling cycles at once against PostgreSQL never hand out a GPU twice.

Two threads run `app.cycle.run.run_cycle` with different holders over many pending jobs
and nodes while a third finishes running jobs (releasing GPUs) and a fourth keeps checking
the allocation invariants in its own transactions. Twice: with the cycle lease as it is,
and with the lease's fencing switched off, so that both plans really are applied at the
same time and only the database's constraints stand between them and a double allocation.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from app.auth.service import create_user
from app.cycle import lease
from app.cycle import run as run_module
from app.cycle.run import run_cycle
from app.cycle.settings import SchedulerSettings
from app.db import make_engine, make_session_factory, utcnow
from app.jobs import agent_reports
from app.jobs.models import Job
from app.jobs.states import ACTIVE, JobStatus
from app.messaging import NullMessenger
from app.migrate import upgrade
from app.nodes.models import Allocation, Node
from app.projects.models import Project
from app.wire import Finished
from tests.foundation.builders import ready_node
from tests.support.servers import create_pg_database, drop_pg_database

pytestmark = [
    pytest.mark.e2e,
    # Selected by `make test-postgres` (it takes the db and postgresql marks only): marked
    # e2e alone, the PostgreSQL pass left it out and the SQLite pass skipped it, so no
    # `make test` ran it.
    pytest.mark.postgresql,
    pytest.mark.skipif(
        os.environ.get("GPUSCHED_TEST_DB", "sqlite") != "postgresql",
        reason="needs PostgreSQL (row locks and concurrent writers); SQLite serialises writers",
    ),
]

NODES = 8
GPUS_PER_NODE = 4
JOBS = 400
ROUNDS = 15
MAX_ROUNDS = 60  # unfenced: go on until the constraints have refused a clash

SETTINGS = SchedulerSettings(
    stability_window_s=0,
    telemetry_max_age_s=3600,
    preemption=False,
    lease_ttl_s=30,
)

DOUBLE_WHOLE = text(
    """
    SELECT gpu_id, count(*) FROM allocation
    WHERE released_at IS NULL AND share_milli = 1000 AND gpu_id IS NOT NULL
    GROUP BY gpu_id HAVING count(*) > 1
    """
)
OVER_ONE = text(
    """
    SELECT gpu_id, sum(share_milli) FROM allocation
    WHERE released_at IS NULL AND gpu_id IS NOT NULL
    GROUP BY gpu_id HAVING sum(share_milli) > 1000
    """
)
COUNTER_DRIFT = text(
    """
    SELECT g.id, g.allocated_milli, coalesce(sum(a.share_milli), 0)
    FROM gpu g LEFT JOIN allocation a ON a.gpu_id = g.id AND a.released_at IS NULL
    GROUP BY g.id, g.allocated_milli
    HAVING g.allocated_milli <> coalesce(sum(a.share_milli), 0)
    """
)
ORPHAN_ALLOCATIONS = text(
    """
    SELECT a.id, a.job_id, a.attempt, j.status, j.attempt FROM allocation a
    JOIN job j ON j.id = a.job_id
    WHERE a.released_at IS NULL
      AND (j.status NOT IN ('SCHEDULED', 'RUNNING') OR a.attempt <> j.attempt)
    """
)


def violations(session: Session) -> list[str]:
    found = []
    for name, query in (
        ("GPU held whole by two allocations", DOUBLE_WHOLE),
        ("GPU shares above 1000", OVER_ONE),
        ("gpu.allocated_milli differs from its allocations", COUNTER_DRIFT),
        ("active allocation of a job not running that attempt", ORPHAN_ALLOCATIONS),
    ):
        rows = session.execute(query).all()
        if rows:
            found.append(f"{name}: {rows[:5]}")
    return found


def _populate(factory: sessionmaker[Session], seed: int) -> None:
    rng = random.Random(seed)
    now = utcnow()
    with factory() as session:
        user, _ = create_user(
            session=session, name="racer", projects=["p"], is_admin=False, ttl_days=0, actor="test"
        )
        project_id = session.scalar(select(Project.id).where(Project.name == "p"))
        for n in range(NODES):
            node = ready_node(
                f"node{n}", gpus=GPUS_PER_NODE, now=now, idle_since=now - timedelta(hours=1)
            )
            session.add(node)
        for i in range(JOBS):
            kind = rng.random()
            gpus, share = (1, 500) if kind < 0.25 else (rng.choice([1, 1, 2, 4]), 1000)
            session.add(
                Job(
                    name=f"race-{i}",
                    user_id=user.id,
                    project_id=project_id,
                    command=["true"],
                    gpus=gpus,
                    gpu_share_milli=share,
                    priority=rng.choice([0, 0, 1]),
                )
            )
        session.commit()


@pytest.fixture
def racing_db() -> Iterator[sessionmaker[Session]]:
    """A fresh PostgreSQL database of its own, migrated, filled with nodes and jobs."""
    name, url = create_pg_database("gpusched_race")
    engine = make_engine(url)
    try:
        upgrade(engine)
        factory = make_session_factory(engine)
        _populate(factory, seed=7)
        yield factory
    finally:
        engine.dispose()
        drop_pg_database(name)


def _finish_some(factory: sessionmaker[Session], rng: random.Random, fraction: float) -> int:
    """What agents' reports do: finish a random part of the active jobs, releasing GPUs."""
    with factory() as session:  # (one node each: no gangs here)
        active = session.execute(
            select(Job.id, Job.attempt, Node.name)
            .join(Allocation, (Allocation.job_id == Job.id) & (Allocation.attempt == Job.attempt))
            .join(Node, Node.id == Allocation.node_id)
            .where(Job.status.in_(ACTIVE), Allocation.released_at.is_(None))
            .distinct()
        ).all()
    finished = 0
    for job_id, attempt, node in active:
        if rng.random() > fraction:
            continue
        with factory() as session:
            applied = agent_reports.job_finished(
                session=session,
                report=Finished(
                    job_id=job_id,
                    attempt=attempt,
                    node=node,
                    result="SUCCEEDED",
                    exit_code=0,
                    message="done",
                ),
            )
            session.commit()
            finished += applied.accepted
    return finished


def _race(factory: sessionmaker[Session], *, fenced: bool, monkeypatch: pytest.MonkeyPatch) -> dict:
    if not fenced:
        # Every holder gets the lease and keeps it: the plans of both cycles are applied,
        # concurrently; only the unique index and the check constraint can stop a clash.
        tokens = iter(range(1, 1_000_000))
        monkeypatch.setattr(lease, "take", lambda _session, **_: next(tokens))
        monkeypatch.setattr(lease, "released_on_commit", lambda session, **_: True)
    stats: dict = {
        "ran": 0,
        "placed": 0,
        "skipped": 0,
        "errors": [],
        "violations": [],
        "checks": 0,
        "skip_reasons": Counter(),
    }
    original_apply = run_module.apply_plan

    def counting_apply(*args, **kwargs):  # type: ignore[no-untyped-def]
        applied = original_apply(*args, **kwargs)
        stats["skip_reasons"].update(applied.skipped.values())
        return applied

    monkeypatch.setattr(run_module, "apply_plan", counting_apply)

    # Two schedulers rarely see the very same queue (submissions land between their
    # snapshots, each reads a bounded page): give each cycle every other pending job, so
    # their plans put different jobs on the same free GPUs.
    original_snapshot = run_module.read_snapshot

    def split_snapshot(**kwargs):  # type: ignore[no-untyped-def]
        ctx = original_snapshot(**kwargs)
        half = 0 if threading.current_thread().name.endswith("-a") else 1
        return dataclasses.replace(
            ctx, snapshot=dataclasses.replace(ctx.snapshot, pending=ctx.snapshot.pending[half::2])
        )

    monkeypatch.setattr(run_module, "read_snapshot", split_snapshot)
    stop = threading.Event()

    def checker() -> None:
        while not stop.is_set():
            with factory() as session:
                found = violations(session)
            stats["checks"] += 1
            if found:
                stats["violations"].extend(found)
                return
            time.sleep(0.01)

    def cycle(holder: str, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            report = run_cycle(
                factory=factory,
                messenger=NullMessenger(),
                settings=SETTINGS,
                holder=holder,
                now=utcnow(),
            )
        except DBAPIError as exc:  # e.g. a deadlock between the two applies: report it
            stats["errors"].append(f"{holder}: {type(exc.orig).__name__}: {str(exc.orig)[:200]}")
            return
        stats["ran"] += report.ran
        stats["placed"] += report.placed
        stats["skipped"] += report.skipped

    watcher = threading.Thread(target=checker, daemon=True)
    watcher.start()
    rng = random.Random(11)
    try:
        for round_ in range(MAX_ROUNDS):
            if round_ >= ROUNDS and (fenced or stats["skip_reasons"]["GPU taken meanwhile"]):
                break
            barrier = threading.Barrier(3)
            threads = [
                threading.Thread(
                    target=cycle, args=(f"holder-{h}-{round_}", barrier), name=f"cycle-{h}"
                )
                for h in ("a", "b")
            ]
            for t in threads:
                t.start()
            barrier.wait()
            _finish_some(factory, rng, 0.4)
            for t in threads:
                t.join(timeout=60)
                assert not t.is_alive(), "a cycle hung (lock wait?)"
            stats["rounds"] = round_ + 1
            if stats["violations"]:
                break
    finally:
        stop.set()
        watcher.join(timeout=10)
    with factory() as session:
        stats["violations"].extend(violations(session))
        stats["done"] = session.scalar(
            select(func.count()).select_from(Job).where(Job.status == JobStatus.SUCCEEDED)
        )
    return stats


def test_two_cycles_with_the_lease_never_double_allocate(
    racing_db: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    stats = _race(racing_db, fenced=True, monkeypatch=monkeypatch)
    assert stats["violations"] == []
    assert stats["errors"] == []
    assert stats["placed"] > 50 and stats["done"] > 50, stats
    assert stats["checks"] > 0


def test_two_unfenced_cycles_are_stopped_by_the_constraints(
    racing_db: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    stats = _race(racing_db, fenced=False, monkeypatch=monkeypatch)
    assert stats["violations"] == []
    assert stats["placed"] > 50 and stats["done"] > 50, stats
    # Both cycles really ran concurrently, and the losers were turned away.
    assert stats["ran"] == 2 * stats["rounds"] - len(stats["errors"]), stats
    # ...and the database itself refused some placements (unique index / check constraint).
    assert stats["skip_reasons"]["GPU taken meanwhile"] > 0, stats
    print("unfenced race:", {k: v for k, v in stats.items() if k != "violations"})
