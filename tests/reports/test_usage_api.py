"""GET /api/v1/reports/usage: aggregation, visibility and CSV export."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest

from app.db import utcnow
from app.jobs.states import JobStatus
from tests.reports.builders import add_gpus, add_run, add_samples

USAGE = "/api/v1/reports/usage"


@pytest.fixture
def cluster(api):  # type: ignore[no-untyped-def]
    """ml: a good 2-h job on 1 GPU, a 1-h job idling on 4 GPUs, a failed half-GPU job and one
    from last month; cv: one 1-h job."""
    gpus = add_gpus(api.factory, "n1", gpus=8)
    now = utcnow()
    good = add_run(
        api.factory, gpu_ids=gpus[:1], start=now - timedelta(hours=5), end=now - timedelta(hours=3)
    )
    add_samples(api.factory, good, count=120, util=90.0, power_w=400.0)
    idle = add_run(
        api.factory,
        gpu_ids=gpus[1:5],
        start=now - timedelta(hours=3),
        end=now - timedelta(hours=2),
        name="=idle",
    )
    add_samples(api.factory, idle, count=60, util=10.0, power_w=100.0)
    failed = add_run(
        api.factory,
        gpu_ids=gpus[5:6],
        start=now - timedelta(hours=2),
        end=now - timedelta(hours=1),
        status=JobStatus.FAILED,
        share_milli=500,
    )
    old = add_run(
        api.factory,
        gpu_ids=gpus[6:7],
        start=now - timedelta(days=30),
        end=now - timedelta(days=29),
    )
    other = add_run(
        api.factory,
        gpu_ids=gpus[7:8],
        start=now - timedelta(hours=2),
        end=now - timedelta(hours=1),
        user="bob",
        project="cv",
    )
    add_samples(api.factory, other, count=60, util=50.0)
    return {"good": good, "idle": idle, "failed": failed, "old": old, "other": other}


def test_project_summary(api, cluster) -> None:  # type: ignore[no-untyped-def]
    response = api.client.get(USAGE, params={"project": "ml"}, headers=api.as_("alice"))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["project"] == "ml"
    assert body["jobs"] == 3  # last month's job is outside the default 7 days
    assert body["by_state"] == {"FAILED": 1, "SUCCEEDED": 2}
    assert body["gpu_hours"] == pytest.approx(2.0 + 4.0 + 0.5)
    # 120 samples a minute apart at 400 W: 119 min; 60 at 100 W on 4 GPUs: 59 min each.
    assert body["energy_wh"] == pytest.approx(400 * 119 / 60 + 4 * 100 * 59 / 60)
    # Weighted by GPU-hours over the jobs with telemetry: (90*2 + 10*4) / 6.
    assert body["avg_util_pct"] == pytest.approx((90 * 2 + 10 * 4) / 6)
    wasteful = [j["job_id"] for j in body["top_wasteful"]]
    assert wasteful == [cluster["idle"].job_id, cluster["good"].job_id]
    assert body["top_wasteful"][0]["wasted_gpu_hours"] == pytest.approx(3.6)
    assert [f["code"] for f in body["top_wasteful"][0]["flags"]] == ["low_utilisation"]
    assert [p["project"] for p in body["projects"]] == ["ml"]


def test_period_is_clipped(api, cluster) -> None:  # type: ignore[no-untyped-def]
    since = (utcnow() - timedelta(hours=4)).isoformat()
    until = (utcnow() - timedelta(hours=2, minutes=30)).isoformat()
    body = api.client.get(
        USAGE, params={"project": "ml", "since": since, "until": until}, headers=api.as_("alice")
    ).json()
    # good: its last hour (4 h .. 3 h ago); idle: its first half hour on 4 GPUs.
    assert body["jobs"] == 2
    assert body["gpu_hours"] == pytest.approx(1.0 + 2.0, abs=0.01)


def test_users_see_their_projects_admins_all(api, cluster) -> None:  # type: ignore[no-untyped-def]
    mine = api.client.get(USAGE, headers=api.as_("alice")).json()
    assert [p["project"] for p in mine["projects"]] == ["ml"]
    everything = api.client.get(USAGE, headers=api.as_("admin")).json()
    assert [p["project"] for p in everything["projects"]] == ["cv", "ml"]
    assert everything["jobs"] == 4
    assert (
        api.client.get(USAGE, params={"project": "ml"}, headers=api.as_("bob")).status_code == 403
    )
    missing = api.client.get(USAGE, params={"project": "nope"}, headers=api.as_("admin"))
    assert missing.status_code == 404
    assert api.client.get(USAGE).status_code == 401


def test_bad_period_names_the_parameter(api) -> None:  # type: ignore[no-untyped-def]
    now = utcnow()
    response = api.client.get(
        USAGE,
        params={"since": now.isoformat(), "until": (now - timedelta(days=1)).isoformat()},
        headers=api.as_("alice"),
    )
    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == ["query", "since"]
    bad = api.client.get(USAGE, params={"since": "yesterday"}, headers=api.as_("alice"))
    assert bad.status_code == 422 and bad.json()["errors"][0]["loc"] == ["query", "since"]


@pytest.mark.parametrize("how", ["query", "accept"])
def test_csv_has_one_row_per_job(api, cluster, how: str) -> None:  # type: ignore[no-untyped-def]
    params = {"project": "ml"}
    headers = api.as_("alice")
    if how == "query":
        params["format"] = "csv"
    else:
        headers = {**headers, "Accept": "text/csv"}
    response = api.client.get(USAGE, params=params, headers=headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv")
    assert "attachment" in response.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [int(r["job_id"]) for r in rows] == sorted(
        cluster[k].job_id for k in ("good", "idle", "failed")
    )
    by_id = {int(r["job_id"]): r for r in rows}
    idle = by_id[cluster["idle"].job_id]
    assert idle["name"] == "'=idle"  # no formula injection into spreadsheets
    assert float(idle["gpu_hours"]) == pytest.approx(4.0)
    assert float(idle["avg_util_pct"]) == pytest.approx(10.0)
    assert idle["flags"] == "low_utilisation"
    assert idle["status"] == "SUCCEEDED"
    failed = by_id[cluster["failed"].job_id]
    assert failed["avg_util_pct"] == "" and float(failed["gpu_hours"]) == pytest.approx(0.5)
