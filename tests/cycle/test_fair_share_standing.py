"""`GET /api/v1/queues` shows each project's fair-share standing, as Slurm's sshare: its
part of the weights against its part of the recent GPU use that the scheduler's last full
cycle ranked by (usage decayed by the half-life, written by that cycle)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from app.db import utcnow
from app.nodes.models import Allocation
from tests.cycle.jobs_api import add_node, finish, run_one_cycle, submit

HALF_LIFE_H = 7 * 24  # the scheduler's default, GPUSCHED_SCHEDULER_FAIR_SHARE_HALF_LIFE_S


def _queues(api: Any, user: str = "admin") -> dict[str, dict[str, Any]]:
    r = api.client.get("/api/v1/queues", headers=api.as_(user))
    assert r.status_code == 200, r.text
    return {q["project"]: q for q in r.json()}


def test_queues_show_each_projects_share_and_recent_use(api):
    # Three projects of weight 1 (default, ml, cv): a third of the cluster each.
    before = _queues(api)
    assert {p: q["fair_share"] for p, q in before.items()} == pytest.approx(
        {"default": 1 / 3, "ml": 1 / 3, "cv": 1 / 3}
    )
    # No cycle has ranked anything yet.
    assert {(q["usage_share"], q["usage_at"]) for q in before.values()} == {(None, None)}

    add_node(api, 2)
    job = submit(api, name="train", gpus=2)["id"]
    run_one_cycle(api)
    finish(api, job, "SUCCEEDED")
    with api.factory.begin() as session:  # it ran on 2 GPUs from 3 h ago until 1 h ago
        now = utcnow()
        session.execute(
            update(Allocation)
            .where(Allocation.job_id == job)
            .values(created_at=now - timedelta(hours=3), released_at=now - timedelta(hours=1))
        )
    run_one_cycle(api)

    queues = _queues(api)
    # 2 GPUs x 2 h, decayed by 1 h of a 168 h half-life: 4 x 0.5 ** (1 / 168) = 3.9835.
    assert queues["ml"]["usage_gpu_hours"] == pytest.approx(4 * 0.5 ** (1 / HALF_LIFE_H), rel=1e-3)
    assert (queues["ml"]["usage_share"], queues["cv"]["usage_share"]) == (1.0, 0.0)
    assert queues["cv"]["usage_gpu_hours"] == 0.0
    assert all(q["usage_at"] is not None for q in queues.values())

    # A heavier weight is a larger share; a user sees the shares of all, for their projects.
    r = api.client.patch("/api/v1/projects/cv", json={"weight": 2}, headers=api.as_("admin"))
    assert r.status_code == 200, r.text
    assert r.json()["fair_share"] == pytest.approx(0.5)
    mine = _queues(api, "alice")
    assert list(mine) == ["ml"]
    assert (mine["ml"]["fair_share"], mine["ml"]["usage_share"]) == (pytest.approx(0.25), 1.0)
