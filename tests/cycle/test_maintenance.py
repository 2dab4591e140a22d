"""Maintenance over the API and in live cycles: `POST /nodes/{name}/drain` with `at`."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from app.db import utcnow
from app.nodes.models import Node
from tests.cycle.jobs_api import add_node, get_job, run_one_cycle, submit

HOUR = 3600


def _drain(api, **body):  # type: ignore[no-untyped-def]
    return api.client.post("/api/v1/nodes/n1/drain", json=body, headers=api.as_("admin"))


def test_before_maintenance_only_jobs_that_end_by_then_start_and_after_it_none(api):
    add_node(api, 5)
    at = (utcnow() + timedelta(hours=2)).replace(microsecond=0)
    r = _drain(api, at=at.isoformat())
    assert r.status_code == 200, r.text
    node = r.json()
    assert node["drained"] is False  # not yet: it still takes short jobs
    assert node["maintenance_at"] == at.isoformat().replace("+00:00", "Z")
    assert node["drain_reason"] == "maintenance planned by admin"  # when: maintenance_at

    short = submit(api, name="short", max_runtime_s=HOUR)["id"]
    long = submit(api, name="long", max_runtime_s=3 * HOUR)["id"]
    unlimited = submit(api, name="open-ended")["id"]  # this cluster sets no default limit
    # Its limit ends 5 minutes before, but its grace period (SIGTERM to SIGKILL) would not.
    graceful = submit(api, name="graceful", max_runtime_s=2 * HOUR - 300, grace_s=600)["id"]
    run_one_cycle(api)
    assert get_job(api, short)["status"] == "SCHEDULED"
    for job_id in (long, unlimited, graceful):
        job = get_job(api, job_id)
        assert (job["status"], job["pending_reason"]) == ("PENDING", "maintenance")
        assert job["pending_message"].startswith(
            "node n1 goes into maintenance (see the node's maintenance time) and takes only "
            "jobs whose time limit ends by then; "
        )
    assert get_job(api, unlimited)["pending_message"].endswith("this job has no time limit")
    assert (
        "; this job's time limit (with its grace period) ends after it begins"
        in (get_job(api, graceful)["pending_message"])
    )

    # The maintenance begins: the node is drained, whatever a job's limit.
    with api.factory.begin() as session:
        past = utcnow() - timedelta(minutes=1)
        session.execute(update(Node).where(Node.name == "n1").values(maintenance_at=past))
    tiny = submit(api, name="tiny", max_runtime_s=60)["id"]
    run_one_cycle(api)
    job = get_job(api, tiny)
    assert (job["status"], job["pending_reason"]) == ("PENDING", "node_not_ready")
    assert job["pending_message"] == "node n1 is in maintenance"  # since: maintenance_at
    node = api.client.get("/api/v1/nodes/n1", headers=api.as_("alice")).json()
    assert node["drained"] is True

    # Undrain calls the maintenance off: the jobs that waited for it start.
    r = api.client.post("/api/v1/nodes/n1/undrain", headers=api.as_("admin"))
    assert r.json()["maintenance_at"] is None and r.json()["drained"] is False
    run_one_cycle(api)
    assert {get_job(api, j)["status"] for j in (long, unlimited, graceful, tiny)} == {"SCHEDULED"}


def test_drain_at_is_checked_moved_and_audited(api):
    add_node(api, 4)
    r = _drain(api, at="2026-11-25T08:00:00")  # no offset: which 08:00?
    assert r.status_code == 422
    assert r.json()["errors"][0]["loc"] == ["body", "at"]
    assert "needs a UTC offset" in r.json()["errors"][0]["msg"]
    at = (utcnow() + timedelta(days=1)).replace(microsecond=0)
    assert _drain(api, at=at.isoformat(), reason="driver upgrade").json()["drained"] is False
    # A time already past drains at once; so does a drain without one.
    r = _drain(api, at=(utcnow() - timedelta(hours=1)).isoformat())
    assert (r.json()["drained"], r.json()["maintenance_at"]) == (True, None)
    # Drained now, it is not quietly opened again until a later maintenance.
    r = _drain(api, at=at.isoformat())
    assert r.status_code == 409
    assert r.json()["detail"] == "node n1 is drained now: undrain it to plan a maintenance later"
    events = api.client.get(
        "/api/v1/audit", params={"target": "n1"}, headers=api.as_("admin")
    ).json()["items"]
    assert [(e["action"], e["info"]) for e in events] == [
        ("node.drain", {"reason": "drained by admin"}),
        ("node.drain", {"reason": "driver upgrade", "at": at.isoformat()}),
    ]
