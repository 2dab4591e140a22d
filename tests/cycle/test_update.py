"""Changing a pending job (scontrol update): PATCH /api/v1/jobs/{id} checks the result as
a submission, keeps the job's submit time, and the next cycle ranks it anew."""

from __future__ import annotations

from app.cycle.apply import apply_plan
from app.cycle.snapshot import read_snapshot
from app.db import utcnow
from app.scheduling import Placement, Plan
from tests.cycle.jobs_api import (
    add_node,
    grant_priority,
    job_events,
    lease_taken,
    run_one_cycle,
    submit,
)

DAY = 86400


def _patch(api, job_id: int, user="alice", **changes):
    return api.client.patch(f"/api/v1/jobs/{job_id}", json=changes, headers=api.as_(user))


def test_a_job_asking_too_many_gpus_fits_once_changed(api):
    add_node(api, 4)
    grant_priority(api)
    running = submit(api, gpus=2)
    big = submit(api, name="big", gpus=4, max_runtime_s=DAY)
    run_one_cycle(api)
    waiting = api.client.get(f"/api/v1/jobs/{big['id']}", headers=api.as_("alice")).json()
    assert waiting["status"] == "PENDING"

    r = _patch(api, big["id"], gpus=2, priority=5, max_runtime_s=None, estimated_runtime_s=600)
    assert r.status_code == 200, r.text
    changed = r.json()
    assert (changed["gpus"], changed["priority"], changed["max_runtime_s"]) == (2, 5, None)
    assert (changed["estimated_runtime_s"], changed["pending_reason"]) == (600, "NEW")
    assert changed["created_at"] == big["created_at"]  # its age is kept
    run_one_cycle(api)
    placed = api.client.get(f"/api/v1/jobs/{big['id']}", headers=api.as_("alice")).json()
    assert placed["status"] == "SCHEDULED"
    events = job_events(api, big["id"])
    assert events[1]["reason"] == (
        "updated by alice: gpus 4 -> 2, priority 0 -> 5, max_runtime_s 86400 -> None,"
        " estimated_runtime_s None -> 600"
    )
    # A placed job takes only a new time limit.
    conflict = _patch(api, running["id"], priority=1)
    assert conflict.status_code == 409
    assert "only its time limit (max_runtime_s) can be changed" in conflict.json()["detail"]


def test_a_change_is_checked_as_a_submission(api):
    job = submit(api, gpu_share=0.5)

    def refused(**changes) -> tuple[list, str]:
        r = _patch(api, job["id"], **changes)
        assert r.status_code == 422, r.text
        [error] = r.json()["errors"]
        return error["loc"], error["msg"]

    assert refused(priority=5000) == (
        ["body", "priority"],
        "Input should be less than or equal to 1000",
    )
    assert refused(gpus=None)[0] == ["body", "gpus"]
    assert refused(name=None) == (
        ["body", "name"],
        "Value error, a job keeps a name: give a new one",
    )
    assert refused(project="cv") == (["body", "project"], "Extra inputs are not permitted")
    # The job shares a GPU: the merged request breaks that rule, named on the field sent.
    assert refused(gpus=2) == (
        ["body", "gpus"],
        "gpu_share below 1 needs gpus = 1 (a fraction of one GPU)",
    )
    assert refused(estimated_runtime_s=2 * DAY, max_runtime_s=DAY)[0] == [
        "body",
        "estimated_runtime_s",
    ]
    # Nothing changed, and nothing recorded.
    after = api.client.get(f"/api/v1/jobs/{job['id']}", headers=api.as_("alice")).json()
    assert (after["gpus"], after["priority"], after["estimated_runtime_s"]) == (1, 0, None)
    events = job_events(api, job["id"])
    assert [e["reason"] for e in events] == ["submitted"]
    assert _patch(api, job["id"], user="bob", priority=1).status_code == 403
    assert _patch(api, 999_999, priority=1).status_code == 404


def test_a_job_waiting_on_a_dependency_keeps_its_reason_when_changed(api):
    train = submit(api, name="train")
    evaluate = submit(api, depends_on=[train["id"]])
    r = _patch(api, evaluate["id"], name="eval-v2")
    assert r.status_code == 200, r.text
    assert (r.json()["name"], r.json()["pending_reason"]) == ("eval-v2", "dependency")


def test_a_change_between_snapshot_and_apply_is_not_placed_as_it_was(api):
    """The plan placed the old request (2 GPUs); the job now asks 4: placing it on 2
    would run it short of GPUs. It waits for the next cycle, which plans the new request."""
    add_node(api, 4)
    job = submit(api, gpus=2)
    now = utcnow()
    with api.factory() as session:
        token = lease_taken(session, holder="t", now=now, ttl_s=30)
        ctx = read_snapshot(session=session, now=now, half_life_s=3600)
        session.rollback()
        assert _patch(api, job["id"], gpus=4).status_code == 200
        plan = Plan(placements=(Placement(job["id"], (("n1", (0, 1)),)),))
        applied = apply_plan(session, ctx=ctx, plan=plan, token=token, now=now)
    assert applied.placed == [] and job["id"] in applied.skipped
    run_one_cycle(api)
    placed = api.client.get(f"/api/v1/jobs/{job['id']}", headers=api.as_("alice")).json()
    assert [a["gpu_index"] for a in placed["allocations"]] == [0, 1, 2, 3]
