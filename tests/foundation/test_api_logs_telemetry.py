"""Logs (tail, attempts, follow, path safety), utilisation series and job telemetry."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from sqlalchemy import select

from app.db import utcnow
from app.jobs.allocations import GpuClaim, allocate
from app.jobs.lifecycle import transition
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.nodes.models import Gpu, GpuSample, Node
from app.nodes.telemetry import TelemetryPolicy, ingest_heartbeat
from app.wire import Finished, Heartbeat, parse
from tests.foundation.builders import add_node


def _running_job(api, *, gpus=(0,)):
    job_id = api.client.post(
        "/api/v1/jobs", json={"command": ["train"], "gpus": len(gpus)}, headers=api.as_("alice")
    ).json()["id"]
    with api.factory() as session:
        job = session.get(Job, job_id)
        job.attempt = 1
        transition(session, job=job, to=JobStatus.SCHEDULED, actor="t")
        ids = session.scalars(select(Gpu.id).where(Gpu.index.in_(gpus)).order_by(Gpu.index)).all()
        allocate(
            session,
            job=job,
            claims=[GpuClaim(node_id=1, gpu_id=g, share_milli=1000, rank=0) for g in ids],
        )
        transition(session, job=job, to=JobStatus.RUNNING, actor="t")
        session.commit()
    return job_id


def _write_log(settings, job_id, attempt, text):
    path = settings.log_dir.resolve() / str(job_id) / f"attempt-{attempt}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_log_tail_and_attempts(api, settings):
    add_node(api.factory, "n1", gpus=2)
    job_id = _running_job(api)
    _write_log(settings, job_id, 1, "one\ntwo\nthree\n")
    r = api.client.get(f"/api/v1/jobs/{job_id}/logs", headers=api.as_("alice"))
    assert r.status_code == 200 and r.text == "one\ntwo\nthree\n"
    assert r.headers["x-attempt"] == "1"
    r = api.client.get(f"/api/v1/jobs/{job_id}/logs?tail=2", headers=api.as_("alice"))
    assert r.text == "two\nthree\n"
    r = api.client.get(f"/api/v1/jobs/{job_id}/logs?attempt=2", headers=api.as_("alice"))
    assert r.status_code == 404 and "no attempt 2" in r.json()["detail"]
    assert api.client.get(f"/api/v1/jobs/{job_id}/logs", headers=api.as_("bob")).status_code == 403
    assert (
        api.client.get(f"/api/v1/jobs/{job_id}/logs?tail=0", headers=api.as_("alice")).status_code
        == 422
    )


def test_log_from_a_byte_offset_says_where_it_starts(api, settings):
    """What a follower that lost its connection resumes with: no byte twice, none lost."""
    add_node(api.factory, "n1", gpus=2)
    job_id = _running_job(api)
    _write_log(settings, job_id, 1, "one\ntwo\nthree\n")
    url = f"/api/v1/jobs/{job_id}/logs"
    r = api.client.get(url, params={"offset": 4}, headers=api.as_("alice"))
    assert (r.text, r.headers["x-log-offset"]) == ("two\nthree\n", "4")
    r = api.client.get(url, params={"tail": 1}, headers=api.as_("alice"))
    assert (r.text, r.headers["x-log-offset"]) == ("three\n", "8")
    r = api.client.get(url, params={"offset": 99}, headers=api.as_("alice"))
    assert (r.text, r.headers["x-log-offset"]) == ("", "99")  # nothing new yet
    r = api.client.get(url, params={"offset": 4, "tail": 1}, headers=api.as_("alice"))
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["query", "offset"]


def test_log_path_cannot_leave_the_log_dir(api, settings):
    # Only integers reach the path; anything else is rejected before any file is opened.
    for path in ("/api/v1/jobs/..%2F..%2Fetc/logs", "/api/v1/jobs/1/logs?attempt=..%2F1"):
        assert api.client.get(path, headers=api.as_("alice")).status_code in (404, 422)


def test_follow_streams_until_the_attempt_ends(api, settings):
    add_node(api.factory, "n1", gpus=1)
    job_id = _running_job(api)
    _write_log(settings, job_id, 1, "started\n")
    with api.factory() as session:
        job = session.get(Job, job_id)
        transition(session, job=job, to=JobStatus.SUCCEEDED, actor="t")
        session.commit()
    r = api.client.get(f"/api/v1/jobs/{job_id}/logs?follow=true", headers=api.as_("alice"))
    assert r.status_code == 200 and r.text == "started\n"


def test_pending_job_has_empty_log(api):
    job_id = api.client.post(
        "/api/v1/jobs", json={"command": ["x"]}, headers=api.as_("alice")
    ).json()["id"]
    r = api.client.get(f"/api/v1/jobs/{job_id}/logs", headers=api.as_("alice"))
    assert r.status_code == 200 and r.text == "" and r.headers["x-job-status"] == "PENDING"


def as_heartbeat(data: dict) -> Heartbeat:
    """As the scheduler reads one off the wire."""
    return parse(Heartbeat, json.dumps(data))


def _heartbeat(api, *, utils, foreign=None, at=None):
    with api.factory() as session:
        ingest_heartbeat(
            session=session,
            heartbeat=as_heartbeat(
                {
                    "node": "n1",
                    "interval_s": 5,
                    "gpus": [
                        {
                            "index": i,
                            "uuid": f"GPU-n1-{i}",
                            "healthy": True,
                            "util_pct": u,
                            "memory_used_mb": 1000 * (i + 1),
                            "power_w": 100.0,
                            "temperature_c": 40.0,
                            "processes": [],
                            "foreign_util_pct": (foreign or {}).get(i, 0.0),
                            "foreign_memory_mb": 0,
                        }
                        for i, u in enumerate(utils)
                    ],
                }
            ),
            policy=TelemetryPolicy(),
            now=at or utcnow(),
        )
        session.commit()


def test_heartbeat_tracks_foreign_load_and_serves_latest_readings(api):
    add_node(api.factory, "n1", gpus=2)
    t0 = utcnow()
    _heartbeat(api, utils=[10, 80], foreign={1: 80.0}, at=t0)
    _heartbeat(api, utils=[10, 80], foreign={1: 80.0}, at=t0 + timedelta(seconds=5))
    node = api.client.get("/api/v1/nodes/n1", headers=api.as_("alice")).json()
    gpu0, gpu1 = node["gpus"]
    assert gpu0["util_pct"] == 10 and gpu0["foreign_since"] is None
    assert gpu1["foreign_util_pct"] == 80.0
    # foreign_since is the first sample of the busy run, not the latest one.
    assert gpu1["foreign_since"].startswith(t0.isoformat()[:19])


def test_utilization_series_averages_per_bucket(api):
    add_node(api.factory, "n1", gpus=2)
    start = utcnow() - timedelta(minutes=10)
    _heartbeat(api, utils=[20, 40], at=start + timedelta(seconds=1))
    _heartbeat(api, utils=[40, 60], at=start + timedelta(seconds=31))
    since = start.isoformat().replace("+00:00", "Z")
    r = api.client.get(f"/api/v1/utilization?since={since}&step=60", headers=api.as_("alice"))
    assert r.status_code == 200, r.text
    points = r.json()["points"]
    assert len(points) == 1
    # GPU0 averages 30, GPU1 50: cluster 40%; memory 1000 + 2000 MiB; power 2 x 100 W.
    assert points[0]["util_pct"] == 40 and points[0]["gpus"] == 2
    assert points[0]["memory_used_mb"] == 3000 and points[0]["power_w"] == 200.0
    r = api.client.get("/api/v1/utilization?node=nope", headers=api.as_("alice"))
    assert r.status_code == 422
    r = api.client.get(f"/api/v1/utilization?since={since}&step=1", headers=api.as_("alice"))
    assert r.status_code == 200
    r = api.client.get(
        "/api/v1/utilization?since=2000-01-01T00:00:00Z&step=1", headers=api.as_("alice")
    )
    assert r.status_code == 422 and "too many points" in r.text


def test_job_telemetry_only_covers_the_jobs_gpus(api):
    add_node(api.factory, "n1", gpus=2)
    job_id = _running_job(api, gpus=(1,))
    _heartbeat(api, utils=[5, 95])
    points = api.client.get(f"/api/v1/jobs/{job_id}/telemetry", headers=api.as_("alice")).json()[
        "points"
    ]
    assert [(p["gpu_index"], p["util_pct"]) for p in points] == [(1, 95)]


def _samples(api, rows):
    """GpuSample rows (node, gpu index, seconds after the first, util, job ids) as the
    agents' heartbeats leave them."""
    with api.factory.begin() as session:
        ids = {
            (node, index): gpu_id
            for gpu_id, index, node in session.execute(
                select(Gpu.id, Gpu.index, Node.name).join(Node, Node.id == Gpu.node_id)
            )
        }
        for node, index, at, util, jobs in rows:
            session.add(
                GpuSample(
                    gpu_id=ids[(node, index)], at=at, resolution_s=5, util_pct=util, job_ids=jobs
                )
            )


def test_each_gpus_utilisation_over_time_for_a_heatmap(api):
    add_node(api.factory, "n1", gpus=2)
    add_node(api.factory, "n2", gpus=1)
    start = utcnow() - timedelta(minutes=10)
    _samples(
        api,
        [
            ("n1", 0, start + timedelta(seconds=1), 20, []),
            ("n1", 1, start + timedelta(seconds=1), 40, [7]),
            ("n1", 0, start + timedelta(seconds=31), 40, []),
            ("n1", 1, start + timedelta(seconds=31), 60, [7]),
            ("n1", 0, start + timedelta(seconds=121), 90, [8]),
            ("n1", 1, start + timedelta(seconds=121), 0, []),
        ],
    )
    since = start.isoformat().replace("+00:00", "Z")
    r = api.client.get(f"/api/v1/utilization/gpus?since={since}&step=60", headers=api.as_("bob"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["step"] == 60
    rows = {(g["node"], g["index"]): g for g in body["gpus"]}
    assert list(rows) == [("n1", 0), ("n1", 1), ("n2", 0)]  # by node, then index
    # 60 s buckets from `since` to now (the last one partial): ten and a bit. GPU 0 averages
    # 20 and 40 in the first, is unsampled in the second (null, not 0), reads 90 in the third.
    until = datetime.fromisoformat(body["until"])
    buckets = (int(until.timestamp()) - int(start.timestamp())) // 60 + 1
    util = rows[("n1", 0)]["util_pct"]
    assert buckets >= 11 and len(util) == buckets
    assert util[:3] == [30, None, 90] and util[3:] == [None] * (buckets - 3)
    assert rows[("n1", 1)]["job_ids"][:3] == [[7], [], []]
    assert rows[("n1", 0)]["job_ids"][2] == [8]
    assert rows[("n2", 0)]["util_pct"] == [None] * buckets  # no agent: no samples
    assert rows[("n1", 0)]["model"] == "H100-80GB"

    only = api.client.get(f"/api/v1/utilization/gpus?since={since}&node=n2", headers=api.as_("bob"))
    assert [(g["node"], g["index"]) for g in only.json()["gpus"]] == [("n2", 0)]
    for query, field in (
        ("node=nope", "node"),
        ("since=2000-01-01T00:00:00Z&step=1", "step"),
        (f"since={(utcnow() + timedelta(hours=1)).isoformat().replace('+00:00', 'Z')}", "since"),
        ("step=0", "step"),
    ):
        r = api.client.get(f"/api/v1/utilization/gpus?{query}", headers=api.as_("bob"))
        assert r.status_code == 422, (query, r.text)
        assert r.json()["errors"][0]["loc"] == ["query", field], (query, r.text)
    assert api.client.get("/api/v1/utilization/gpus").status_code == 401


def test_a_job_that_ended_says_where_it_ran(api):
    add_node(api.factory, "n1", gpus=2)
    job_id = _running_job(api, gpus=(1,))
    job = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.as_("alice")).json()
    assert [(a["node"], a["gpu_index"]) for a in job["allocations"]] == [("n1", 1)]
    assert job["last_allocations"] == []
    with api.factory() as session:
        from app.jobs.agent_reports import job_finished

        report = Finished(job_id=job_id, attempt=1, node="n1", result="SUCCEEDED")
        assert job_finished(session=session, report=report).accepted
        session.commit()
    job = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.as_("alice")).json()
    assert job["status"] == "SUCCEEDED" and job["allocations"] == []
    assert [(a["node"], a["gpu_index"]) for a in job["last_allocations"]] == [("n1", 1)]
    listed = api.client.get("/api/v1/jobs", headers=api.as_("alice")).json()["items"]
    assert [a["gpu_index"] for a in listed[0]["last_allocations"]] == [1]
    never = api.client.post("/api/v1/jobs", json={"command": ["x"]}, headers=api.as_("alice"))
    assert never.json()["last_allocations"] == []


def test_a_job_back_in_the_queue_says_where_it_was_last(api):
    add_node(api.factory, "n1", gpus=2)
    job_id = _running_job(api, gpus=(0,))
    with api.factory() as session:
        from app.jobs.agent_reports import job_finished

        report = Finished(job_id=job_id, attempt=1, node="n1", result="PREEMPTED")
        assert job_finished(session=session, report=report).accepted
        session.commit()
    job = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.as_("alice")).json()
    assert job["status"] == "PENDING" and job["allocations"] == []
    assert [(a["node"], a["gpu_index"]) for a in job["last_allocations"]] == [("n1", 0)]
