"""Holding a pending job (scontrol hold / release): the live cycle leaves it alone, even
when the hold lands between a cycle's snapshot and its apply."""

from __future__ import annotations

from datetime import timedelta

from app.cycle.apply import apply_plan
from app.cycle.settings import SchedulerSettings
from app.cycle.snapshot import read_snapshot
from app.db import utcnow
from app.jobs.models import Job
from app.scheduling import Placement, Plan, plan_cycle
from tests.cycle.jobs_api import add_node, get_job, job_events, lease_taken, run_one_cycle, submit


def _submit(api, **body) -> int:
    return submit(api, **body)["id"]


def _post(api, job_id: int, action: str, user="alice"):
    return api.client.post(f"/api/v1/jobs/{job_id}/{action}", headers=api.as_(user))


def test_a_held_job_is_not_scheduled_until_released(api):
    add_node(api, 1)
    first, second = _submit(api), _submit(api)
    r = _post(api, first, "hold")
    assert r.status_code == 200, r.text
    held = r.json()
    assert (held["status"], held["held_by"], held["pending_reason"]) == ("PENDING", "alice", "held")
    assert (
        held["pending_message"] == f"held by alice: gpusched release {first} lets it be scheduled"
    )
    assert _post(api, first, "hold").json()["held_by"] == "alice"  # idempotent

    run_one_cycle(api)
    # The only GPU goes to the job behind it; the held one keeps its reason, no position.
    assert get_job(api, second)["status"] == "SCHEDULED"
    after = get_job(api, first)
    assert (after["status"], after["pending_reason"], after["queue_position"]) == (
        "PENDING",
        "held",
        None,
    )

    released = _post(api, first, "release").json()
    assert (released["held_by"], released["pending_reason"]) == (None, "NEW")
    run_one_cycle(api)
    assert get_job(api, first)["pending_reason"] == "waiting_for_gpus"  # ranked again
    events = job_events(api, first)
    assert [(e["actor"], e["reason"]) for e in events[1:]] == [
        ("alice", "held by alice"),
        ("alice", "released by alice"),
    ]


def test_a_hold_between_snapshot_and_apply_wins(api):
    add_node(api, 1)
    job_id = _submit(api)
    now = utcnow()
    with api.factory() as session:
        token = lease_taken(session, holder="t", now=now, ttl_s=30)
        ctx = read_snapshot(session=session, now=now, half_life_s=3600)
        session.rollback()
        assert _post(api, job_id, "hold").status_code == 200
        plan = Plan(placements=(Placement(job_id, (("n1", (0,)),)),))
        applied = apply_plan(session, ctx=ctx, plan=plan, token=token, now=now)
    assert applied.placed == [] and job_id in applied.skipped
    assert get_job(api, job_id)["status"] == "PENDING"


def test_who_may_hold_and_release(api):
    job_id = _submit(api)
    assert _post(api, job_id, "hold", user="bob").status_code == 403  # not bob's project
    # An admin's hold is the admin's to lift, as Slurm's admin hold.
    assert _post(api, job_id, "hold", user="admin").json()["held_by"] == "admin"
    refused = _post(api, job_id, "release")
    assert refused.status_code == 403
    assert "held by admin 'admin'" in refused.json()["detail"]
    assert _post(api, job_id, "release", user="admin").json()["held_by"] is None
    # Releasing a job that is not held changes nothing, and records nothing.
    before = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.as_("alice")).json()
    assert _post(api, job_id, "release").json() == before
    events = job_events(api, job_id)
    assert [e["reason"] for e in events] == ["submitted", "held by admin", "released by admin"]

    # Only a pending job can be held.
    assert api.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.as_("alice")).is_success
    conflict = _post(api, job_id, "hold")
    assert conflict.status_code == 409 and "only a pending job" in conflict.json()["detail"]
    assert _post(api, 999_999, "hold").status_code == 404


def test_held_jobs_come_last_in_the_queue(api):
    add_node(api, 1)
    running, first, second = _submit(api), _submit(api), _submit(api)
    run_one_cycle(api)
    assert _post(api, first, "hold").status_code == 200
    run_one_cycle(api)
    queue = api.client.get("/api/v1/queue", headers=api.as_("alice")).json()
    assert [(j["id"], j["queue_position"]) for j in queue["items"]] == [(second, 1), (first, None)]
    assert get_job(api, running)["status"] == "SCHEDULED"


def test_time_held_does_not_count_as_waiting(api):
    """Else a job held for two days would, once released, go ahead of everything
    submitted meanwhile (FIFO) or first as starving (default policy)."""
    add_node(api, 1)
    held, later = _submit(api, name="held"), _submit(api, name="later")
    assert _post(api, held, "hold").status_code == 200
    now = utcnow()
    with api.factory.begin() as session:  # as if submitted and held two days ago
        job = session.get_one(Job, held)
        job.created_at = job.held_at = now - timedelta(days=2)
        session.get_one(Job, later).created_at = now - timedelta(hours=1)
    released = _post(api, held, "release").json()
    assert released["created_at"].startswith((now - timedelta(days=2)).date().isoformat())
    with api.factory() as session:
        assert session.get_one(Job, held).ineligible_s >= 2 * 86400

    for policy in ("fifo", "default"):
        settings = SchedulerSettings(stability_window_s=0, policy=policy)
        with api.factory() as session:
            ctx = read_snapshot(session=session, now=utcnow(), half_life_s=3600)
        plan = plan_cycle(ctx.snapshot, now=utcnow(), settings=settings.policy_settings())
        assert plan.queue_order == (later, held), policy  # "later" has waited longer


def test_a_job_submitted_held_waits_for_release(api):
    add_node(api, 1)
    job_id = _submit(api, hold=True)
    submitted = get_job(api, job_id)
    assert (submitted["held_by"], submitted["pending_reason"]) == ("alice", "held")
    run_one_cycle(api)
    assert get_job(api, job_id)["status"] == "PENDING"
    events = job_events(api, job_id)
    assert [e["reason"] for e in events] == ["submitted, held"]
    _post(api, job_id, "release")
    run_one_cycle(api)
    assert get_job(api, job_id)["status"] == "SCHEDULED"

    # A cron batch is paused by disabling it, not by holding each job it submits.
    batch = {
        "name": "nightly",
        "cron": "0 2 * * *",
        "templates": [{"command": ["x"], "hold": True}],
    }
    r = api.client.post("/api/v1/batches", json=batch, headers=api.as_("alice"))
    assert r.status_code == 422
    assert r.json()["errors"][0]["loc"] == ["body", "templates", 0, "hold"]


def _bulk(api, action: str, as_user="alice", **params):
    return api.client.post(f"/api/v1/jobs/{action}", params=params, headers=api.as_(as_user))


def test_an_array_is_held_and_released_in_one_request(api):
    add_node(api, 1)
    first = submit(api, name="sweep", array={"indices": "0-3"})["id"]
    tasks = [first + i for i in range(4)]
    own = _submit(api)  # a job of alice's own, not of the array: left alone
    run_one_cycle(api)  # task 0 takes the only GPU
    assert get_job(api, first)["status"] == "SCHEDULED"

    r = _bulk(api, "hold", array=first)
    assert r.status_code == 200, r.text
    # Only the pending tasks are held (a placed task cannot be), in id order.
    assert r.json() == {"count": 3, "ids": tasks[1:], "more": 0, "stopping": 0}
    held = [get_job(api, t) for t in tasks[1:]]
    assert [(j["held_by"], j["pending_reason"]) for j in held] == [("alice", "held")] * 3
    assert get_job(api, own)["held_by"] is None
    assert _bulk(api, "hold", array=first).json()["ids"] == tasks[1:]  # idempotent
    assert [e["reason"] for e in job_events(api, tasks[1])] == ["submitted", "held by alice"]

    r = _bulk(api, "release", array=first)
    assert r.status_code == 200, r.text
    assert r.json()["ids"] == tasks[1:]
    released = [get_job(api, t) for t in tasks[1:]]
    assert [(j["held_by"], j["pending_reason"]) for j in released] == [(None, "NEW")] * 3
    assert _bulk(api, "release", array=first).json()["count"] == 0  # none is held any more
    assert [e["reason"] for e in job_events(api, tasks[1])][-1] == "released by alice"


def test_a_bulk_hold_takes_only_what_its_filters_and_the_callers_projects_select(api):
    runs_a = [_submit(api, labels={"run": "a"}) for _ in range(2)]
    run_b = _submit(api, labels={"run": "b"})
    bobs = _submit(api, user="bob")
    r = _bulk(api, "hold", label="run=a")
    assert r.json()["ids"] == runs_a
    assert get_job(api, run_b)["held_by"] is None
    # Bob may not touch project ml: his selection of alice's jobs is empty.
    assert _bulk(api, "hold", "bob", user="alice").json()["count"] == 0
    assert _bulk(api, "release", "bob", project="ml").json()["count"] == 0
    assert all(get_job(api, j)["held_by"] == "alice" for j in runs_a)
    # An admin's selection spans projects.
    r = _bulk(api, "hold", "admin", status="PENDING")
    assert r.json()["ids"] == [*runs_a, run_b, bobs]
    assert [get_job(api, j)["held_by"] for j in r.json()["ids"]] == [
        "alice",
        "alice",
        "admin",
        "admin",
    ]


def test_a_bulk_release_of_an_admins_hold_releases_nothing(api):
    mine, admins = _submit(api), _submit(api)
    assert _post(api, mine, "hold").status_code == 200
    assert _post(api, admins, "hold", user="admin").status_code == 200
    r = _bulk(api, "release", user="alice")
    assert r.status_code == 403
    assert r.json()["detail"] == (
        f"jobs {admins} were held by an admin; only an admin releases them (nothing was "
        "released: leave them out of the selection)"
    )
    assert get_job(api, mine)["held_by"] == "alice"  # all or nothing
    r = _bulk(api, "release", "admin", user="alice")
    assert r.json()["ids"] == [mine, admins]


def test_a_bulk_hold_or_release_must_say_which_jobs(api):
    job = _submit(api)
    for action in ("hold", "release"):
        r = _bulk(api, action)
        assert r.status_code == 422
        detail = r.json()["errors"][0]
        assert detail["loc"] == ["query", "status"]
        assert (
            detail["msg"]
            == f"select the jobs to {action} with status, project, user, label, array or name"
        )
    assert get_job(api, job)["held_by"] is None
