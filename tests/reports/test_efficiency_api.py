"""GET /api/v1/jobs/{id}/efficiency from simulated telemetry rows."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from app.db import utcnow
from app.jobs.states import JobStatus
from tests.reports.builders import add_gpus, add_run, add_samples


def efficiency(api: Any, job_id: int, user: str = "alice") -> Any:
    return api.client.get(f"/api/v1/jobs/{job_id}/efficiency", headers=api.as_(user))


def test_idle_job_is_flagged_low_utilisation(api) -> None:  # type: ignore[no-untyped-def]
    gpus = add_gpus(api.factory, "n1", gpus=1)
    start = utcnow() - timedelta(hours=3)
    run = add_run(api.factory, gpu_ids=gpus, start=start, end=start + timedelta(hours=2))
    add_samples(api.factory, run, count=60, util=lambda _g, i: 4.0 + (i % 3), memory_mb=50_000)
    response = efficiency(api, run.job_id)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["gpu_hours"] == pytest.approx(2.0)
    assert body["avg_util_pct"] == pytest.approx(5.0)
    assert body["peak_util_pct"] == 6.0
    assert [f["code"] for f in body["flags"]] == ["low_utilisation"]
    assert "pinned memory" in body["flags"][0]["advice"]
    assert body["live"] is False
    assert body["per_gpu"][0]["samples"] == 60


def test_memory_far_below_request_is_flagged(api) -> None:  # type: ignore[no-untyped-def]
    gpus = add_gpus(api.factory, "n1", gpus=1)
    start = utcnow() - timedelta(hours=2)
    run = add_run(
        api.factory,
        gpu_ids=gpus,
        start=start,
        end=start + timedelta(hours=1),
        gpu_memory_mb=81_920,
    )
    add_samples(api.factory, run, count=30, util=85.0, memory_mb=10_240)
    body = efficiency(api, run.job_id).json()
    assert [f["code"] for f in body["flags"]] == ["memory_underused"]
    assert body["peak_memory_mb"] == 10_240
    assert body["memory_requested_mb"] == 81_920
    assert body["memory_used_pct"] == pytest.approx(12.5)


def test_one_gpu_of_four_busy_flags_idle_ranks(api) -> None:  # type: ignore[no-untyped-def]
    gpus = add_gpus(api.factory, "n1", gpus=4)
    start = utcnow() - timedelta(hours=2)
    run = add_run(api.factory, gpu_ids=gpus, start=start, end=start + timedelta(hours=1))
    add_samples(
        api.factory,
        run,
        count=30,
        util=lambda g, _i: 97.0 if g == 0 else 0.0,
        memory_mb=lambda g, _i: 70_000 if g == 0 else 300,
    )
    body = efficiency(api, run.job_id).json()
    assert [f["code"] for f in body["flags"]] == ["idle_gpus"]
    assert body["idle_gpus"] == 3
    assert body["gpu_hours"] == pytest.approx(4.0)
    assert [g["idle"] for g in body["per_gpu"]] == [False, True, True, True]
    assert "torchrun" in body["flags"][0]["advice"]


def test_energy_over_the_api_matches_the_hand_computed_value(api) -> None:  # type: ignore[no-untyped-def]
    gpus = add_gpus(api.factory, "n1", gpus=2)
    start = utcnow() - timedelta(hours=2)
    run = add_run(api.factory, gpu_ids=gpus, start=start, end=start + timedelta(hours=1))
    # 11 samples a minute apart: 10 minutes per GPU; GPU0 at 300 W, GPU1 ramps 100..200 W.
    add_samples(
        api.factory,
        run,
        count=11,
        power_w=lambda g, i: 300.0 if g == 0 else 100.0 + 10 * i,
    )
    body = efficiency(api, run.job_id).json()
    # GPU0: 300 W * 600 s = 50 Wh; GPU1: mean 150 W * 600 s = 25 Wh.
    assert body["per_gpu"][0]["energy_wh"] == pytest.approx(50.0)
    assert body["per_gpu"][1]["energy_wh"] == pytest.approx(25.0)
    assert body["energy_wh"] == pytest.approx(75.0)
    assert body["flags"] == []


def test_samples_outside_the_held_window_do_not_count(api) -> None:  # type: ignore[no-untyped-def]
    gpus = add_gpus(api.factory, "n1", gpus=1)
    start = utcnow() - timedelta(hours=2)
    run = add_run(api.factory, gpu_ids=gpus, start=start, end=start + timedelta(minutes=10))
    add_samples(api.factory, run, count=11, util=80.0)
    # Another tenant's load after the job released the GPU.
    add_samples(api.factory, run, count=5, util=1.0, offset_s=3600)
    body = efficiency(api, run.job_id).json()
    assert body["samples"] == 11
    assert body["avg_util_pct"] == pytest.approx(80.0)


def test_running_job_reports_live_figures(api) -> None:  # type: ignore[no-untyped-def]
    gpus = add_gpus(api.factory, "n1", gpus=1)
    start = utcnow() - timedelta(minutes=30)
    run = add_run(api.factory, gpu_ids=gpus, start=start, end=None, status=JobStatus.RUNNING)
    add_samples(api.factory, run, count=10, util=70.0)
    body = efficiency(api, run.job_id).json()
    assert body["live"] is True
    assert body["gpu_hours"] == pytest.approx(0.5, abs=0.01)
    assert any("still running" in n for n in body["notes"])


def test_pending_job_has_an_empty_report(api) -> None:  # type: ignore[no-untyped-def]
    add_gpus(api.factory, "n1", gpus=1)
    job = api.client.post(
        "/api/v1/jobs", json={"command": ["true"], "project": "ml"}, headers=api.as_("alice")
    ).json()
    body = efficiency(api, job["id"]).json()
    assert body["gpu_hours"] == 0 and body["samples"] == 0 and body["flags"] == []


def test_visibility_follows_get_job(api) -> None:  # type: ignore[no-untyped-def]
    gpus = add_gpus(api.factory, "n1", gpus=1)
    start = utcnow() - timedelta(hours=2)
    run = add_run(api.factory, gpu_ids=gpus, start=start, end=start + timedelta(hours=1))
    assert efficiency(api, run.job_id, "bob").status_code == 403
    assert efficiency(api, run.job_id, "admin").status_code == 200
    missing = efficiency(api, 999_999)
    assert missing.status_code == 404 and "no job" in missing.json()["detail"]
    assert api.client.get(f"/api/v1/jobs/{run.job_id}/efficiency").status_code == 401
