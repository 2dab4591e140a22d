"""GPUSCHED_RETENTION_DAYS: history older than the cutoff is deleted (slurmdbd's
PurgeJobAfter), and nothing that is still in use."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select, update

from app.audit.models import AuditEvent
from app.batches.models import BatchFiring
from app.config import Settings
from app.cycle.settings import SchedulerSettings
from app.db import utcnow
from app.jobs.models import Job, JobEvent
from app.messaging import PURGE_HISTORY
from app.nodes.models import Allocation
from app.retention import purge_history
from tests.cycle.jobs_api import add_node, finish, get_job, run_one_cycle, submit
from workers.scheduler import build_scheduler_app

DAY = timedelta(days=1)


def _ended_long_ago(api: Any, job_ids: list[int], days: int = 100) -> None:
    with api.factory.begin() as session:
        session.execute(
            update(Job).where(Job.id.in_(job_ids)).values(finished_at=utcnow() - days * DAY)
        )


def _count(api: Any, model: Any, *where: Any) -> int:
    with api.factory() as session:
        return session.scalar(select(func.count()).select_from(model).where(*where)) or 0


def test_old_history_goes_and_what_is_recent_or_in_use_stays(api, tmp_path: Path) -> None:
    add_node(api, 4)
    old = submit(api, name="old")["id"]
    recent = submit(api, name="recent")["id"]
    sweep = submit(api, name="sweep", array={"indices": "0-1", "max_running": 1})["id"]
    run_one_cycle(api)
    for job_id in (old, recent, sweep):
        finish(api, job_id)
    _ended_long_ago(api, [old, sweep])  # sweep's task 1 has not run yet
    waiting = submit(api, name="waiting", schedule={"mode": "at", "at": "2099-01-01T00:00:00Z"})
    logs = tmp_path / "logs"
    for job_id in (old, recent):
        path = logs / str(job_id) / "attempt-1.log"
        path.parent.mkdir(parents=True)
        path.write_text("epoch 1\n")
    r = api.client.patch("/api/v1/projects/ml", json={"weight": 2}, headers=api.as_("admin"))
    assert r.status_code == 200
    with api.factory.begin() as session:  # the trail so far (the weight, the users) is old
        session.execute(update(AuditEvent).values(at=utcnow() - 100 * DAY))
    old_trail = _count(api, AuditEvent)
    with api.factory.begin() as session:
        session.add(AuditEvent(actor="admin", action="node.drain", target="n1", info={}))

    purged = purge_history(factory=api.factory, before=utcnow() - 90 * DAY, log_dir=logs)

    assert (purged.jobs, purged.audit_events) == (1, old_trail)
    assert _count(api, Job, Job.id == old) == 0
    assert _count(api, JobEvent, JobEvent.job_id == old) == 0
    assert _count(api, Allocation, Allocation.job_id == old) == 0
    assert not (logs / str(old)).exists() and (logs / str(recent)).exists()
    # Recent, pending, and a task of an array still running all stay, with their rows.
    for job_id in (recent, waiting["id"], sweep, sweep + 1):
        assert get_job(api, job_id)["id"] == job_id
    assert _count(api, AuditEvent) == 1
    # Once the whole array has ended long enough ago, it goes as one.
    run_one_cycle(api)
    finish(api, sweep + 1)
    _ended_long_ago(api, [sweep + 1])
    again = purge_history(factory=api.factory, before=utcnow() - 90 * DAY, log_dir=logs)
    assert again.jobs == 2 and _count(api, Job, Job.array_id == sweep) == 0


def test_old_batch_firings_go(api) -> None:
    body = {"name": "nightly", "cron": "0 2 * * *", "templates": [{"command": ["t"]}]}
    assert (
        api.client.post("/api/v1/batches", json=body, headers=api.as_("alice")).status_code == 201
    )
    fired = api.client.post("/api/v1/batches/nightly/run", headers=api.as_("alice"))
    assert fired.status_code == 201
    with api.factory.begin() as session:
        session.execute(update(BatchFiring).values(created_at=utcnow() - 100 * DAY))
    purged = purge_history(
        factory=api.factory, before=utcnow() - 90 * DAY, log_dir=Path("/nonexistent")
    )
    assert purged.firings == 1 and _count(api, BatchFiring) == 0


def test_the_setting_is_checked_and_schedules_the_purge(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="retention_days"):
        Settings(data_dir=tmp_path, retention_days=7)  # too short: fair share needs weeks
    plain = build_scheduler_app(Settings(data_dir=tmp_path), SchedulerSettings())
    assert "purge-history" not in plain.conf.beat_schedule  # off unless set
    kept = build_scheduler_app(Settings(data_dir=tmp_path, retention_days=90), SchedulerSettings())
    assert kept.conf.beat_schedule["purge-history"]["task"] == PURGE_HISTORY
