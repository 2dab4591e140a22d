"""Exactly once under races: two "beats" fire the same schedule at the same moment.

Each thread has its own session and connection, as two beat/worker processes would. On
PostgreSQL the loser's INSERT of the firing row blocks until the winner commits and then
violates the unique (schedule_id, fire_at) constraint; SQLite serialises the writers.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from app.auth.service import Principal
from app.batches import service
from app.jobs.models import Job
from tests.batches.conftest import World
from tests.conftest import BACKEND

ROUNDS = 8


def test_two_concurrent_beats_submit_each_batch_once(
    world: World, alice: Principal, monkeypatch
) -> None:
    world.create(
        alice,
        datetime(2026, 1, 1, tzinfo=UTC),
        templates=[{"command": ["a"]}, {"command": ["b"]}],
    )
    real_create_job = service.create_job

    def slow_create_job(**kwargs: Any) -> Any:
        # Hold the winner's transaction open so the loser really collides with it.
        time.sleep(0.05)
        return real_create_job(**kwargs)

    monkeypatch.setattr(service, "create_job", slow_create_job)

    outcomes: list[str] = []
    lock = threading.Lock()
    for day in range(ROUNDS):
        now = datetime(2026, 1, 1 + day, 2, 0, 2, tzinfo=UTC)
        barrier = threading.Barrier(2)

        def beat(now: datetime = now, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            report = world.fire(now)
            with lock:
                outcomes.extend(f.outcome for f in report.firings)

        threads = [threading.Thread(target=beat) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)

    firings = world.firings()
    assert [f.fire_at for f in firings] == [
        datetime(2026, 1, 1, 2, tzinfo=UTC) + timedelta(days=d) for d in range(ROUNDS)
    ]
    assert all(len(f.job_ids) == 2 for f in firings)
    with world.factory() as session:
        assert session.scalar(select(func.count(Job.id))) == 2 * ROUNDS
    assert outcomes.count("submitted") == ROUNDS
    if BACKEND == "postgresql":
        # Both read "due" before either committed, so the loser hit the constraint.
        assert outcomes.count("duplicate") >= 1
