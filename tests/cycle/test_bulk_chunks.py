"""Bulk actions (POST /jobs/cancel, /hold, /release; PATCH /jobs) hold a chunk of jobs as
objects at a time, not all of them (issue 42 point 4: a bulk cancel of 20,000 jobs left
the API 80 MB larger; bench/deep_queue.py), and act on every job as before."""

from __future__ import annotations

import pytest

from app.jobs import control, updates
from app.jobs.models import Job
from tests.cycle.jobs_api import add_node, get_job, job_events, run_one_cycle, submit


@pytest.fixture
def loaded(monkeypatch):
    """Chunks of 2, and the most Job objects the session held while one job was acted on."""
    monkeypatch.setattr(control, "BULK_CHUNK", 2)
    most = [0]

    def counting(real):
        def act(session, *, job, **kwargs):
            held = sum(isinstance(o, Job) for o in session.identity_map.values())
            most[0] = max(most[0], held)
            return real(session, job=job, **kwargs)

        return act

    for module, name in (
        (control, "cancel_locked"),
        (control, "_hold_one"),
        (control, "_release_one"),
        (updates, "_update_locked"),
    ):
        monkeypatch.setattr(module, name, counting(getattr(module, name)))
    return most


def test_a_bulk_cancel_acts_on_every_job_a_chunk_at_a_time(api, loaded, monkeypatch):
    """Placed jobs are asked to stop through the ORM, a chunk at a time; waiting ones are
    cancelled by statement, a chunk of ids at a time, never loaded as objects."""
    monkeypatch.setattr(control, "BULK_STATEMENT_IDS", 2)
    through_orm: list[int] = []
    one_by_one = control.cancel_locked

    def spied(session, *, job, **kwargs):
        through_orm.append(job.id)
        return one_by_one(session, job=job, **kwargs)

    monkeypatch.setattr(control, "cancel_locked", spied)
    add_node(api, 3)
    placed = [submit(api, name="sweep", estimated_runtime_s=60)["id"] for _ in range(3)]
    run_one_cycle(api)
    assert [get_job(api, j)["status"] for j in placed] == ["SCHEDULED"] * 3
    waiting = [submit(api, name="sweep")["id"] for _ in range(5)]
    r = api.client.post("/api/v1/jobs/cancel", params={"name": "sweep"}, headers=api.as_("alice"))
    assert r.status_code == 200, r.text
    assert r.json() == {"count": 8, "ids": sorted([*placed, *waiting]), "more": 0, "stopping": 3}
    assert loaded[0] == 2 and through_orm == placed
    assert all(job_events(api, j)[-1]["reason"].startswith("cancel requested") for j in placed)
    assert [get_job(api, j)["status"] for j in waiting] == ["CANCELLED"] * 5
    assert all(job_events(api, j)[-1]["reason"] == "cancelled by user" for j in waiting)


def test_a_waiting_job_cancelled_in_bulk_ends_as_one_cancelled_alone(api):
    alone, together, other = (submit(api, name=name)["id"] for name in ("a", "b", "c"))
    run_one_cycle(api)  # ranked: a place of their own
    alice = api.as_("alice")
    assert api.client.post(f"/api/v1/jobs/{alone}/cancel", headers=alice).status_code == 200
    r = api.client.post("/api/v1/jobs/cancel", params={"name": "b"}, headers=alice)
    assert r.json()["ids"] == [together]

    def ended(job_id):
        job = get_job(api, job_id)
        last = job_events(api, job_id)[-1]
        return (
            job["status"],
            job["finished_at"] is not None,
            job["queue_position"],
            {k: last[k] for k in ("from_status", "to_status", "attempt", "actor", "reason")},
        )

    assert ended(together) == ended(alone)
    assert ended(together)[:3] == ("CANCELLED", True, None)
    assert get_job(api, other)["status"] == "PENDING"  # not selected: untouched


def test_a_bulk_hold_and_release_act_on_every_job_a_chunk_at_a_time(api, loaded):
    jobs = [submit(api, name="sweep")["id"] for _ in range(5)]
    alice = api.as_("alice")
    r = api.client.post("/api/v1/jobs/hold", params={"name": "sweep"}, headers=alice)
    assert r.json()["ids"] == jobs and loaded[0] == 2
    assert [get_job(api, j)["held_by"] for j in jobs] == ["alice"] * 5
    loaded[0] = 0
    r = api.client.post("/api/v1/jobs/release", params={"name": "sweep"}, headers=alice)
    assert r.json()["ids"] == jobs and loaded[0] == 2
    assert [get_job(api, j)["held_by"] for j in jobs] == [None] * 5


def test_a_bulk_release_refuses_all_when_an_admin_held_one(api, loaded):
    jobs = [submit(api, name="sweep")["id"] for _ in range(5)]
    r = api.client.post(f"/api/v1/jobs/{jobs[3]}/hold", headers=api.as_("admin"))
    assert r.status_code == 200, r.text
    api.client.post("/api/v1/jobs/hold", params={"name": "sweep"}, headers=api.as_("alice"))
    r = api.client.post("/api/v1/jobs/release", params={"name": "sweep"}, headers=api.as_("alice"))
    assert r.status_code == 403 and f"jobs {jobs[3]} were held by an admin" in r.json()["detail"]
    assert [get_job(api, j)["held_by"] for j in jobs] == ["alice"] * 3 + ["admin", "alice"]


def test_a_bulk_change_changes_every_job_a_chunk_at_a_time(api, loaded):
    jobs = [submit(api, name="sweep")["id"] for _ in range(5)]
    r = api.client.patch(
        "/api/v1/jobs", params={"name": "sweep"}, json={"gpus": 2}, headers=api.as_("alice")
    )
    assert r.status_code == 200, r.text
    assert r.json()["ids"] == jobs and loaded[0] == 2
    assert [get_job(api, j)["gpus"] for j in jobs] == [2] * 5
