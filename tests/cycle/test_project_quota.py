"""An admin sets a project's quota and weight over the API; the live cycle plans with them."""

from __future__ import annotations

from sqlalchemy import select

from app.cycle.run import run_cycle
from app.cycle.settings import SchedulerSettings
from app.db import utcnow
from app.jobs.lifecycle import transition
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.messaging import NullMessenger
from app.nodes.models import Allocation
from tests.foundation.builders import ready_node

SETTINGS = SchedulerSettings(stability_window_s=0, min_run_before_preempt_s=0)


def _submit(api, user: str, **body) -> int:
    body.setdefault("command", ["train"])
    r = api.client.post("/api/v1/jobs", json=body, headers=api.as_(user))
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _patch(api, project: str, body, user: str = "admin"):
    return api.client.patch(f"/api/v1/projects/{project}", json=body, headers=api.as_(user))


def _cycle(api, settings: SchedulerSettings = SETTINGS):
    return run_cycle(factory=api.factory, messenger=NullMessenger(), settings=settings, holder="t",
                     now=utcnow())  # fmt: skip


def test_admin_sets_quota_and_weight_and_queues_show_them(api):
    r = _patch(api, "ml", {"gpu_quota": 4, "weight": 2.5})
    assert r.status_code == 200, r.text
    assert (r.json()["project"], r.json()["gpu_quota"], r.json()["weight"]) == ("ml", 4, 2.5)
    # A partial change keeps the other value.
    assert _patch(api, "ml", {"weight": 1.5}).json()["gpu_quota"] == 4
    assert _patch(api, "ml", {"gpu_quota": 0}).json()["weight"] == 1.5
    queues = api.client.get("/api/v1/queues", headers=api.as_("alice")).json()
    assert [(q["project"], q["gpu_quota"], q["weight"]) for q in queues] == [("ml", 0, 1.5)]


def test_bad_changes_are_refused_with_the_field_and_nothing_changes(api):
    for body, field, words in (
        (
            {},
            "body",
            "give gpu_quota, weight, max_runtime_s, max_priority, max_pending_jobs, "
            "max_running_jobs, max_gpus or several",
        ),
        (
            {"gpu_quota": None},
            "body",
            "give gpu_quota, weight, max_runtime_s, max_priority, max_pending_jobs, "
            "max_running_jobs, max_gpus or several",
        ),
        ({"gpu_quota": -1}, "gpu_quota", "greater than or equal to 0"),
        ({"gpu_quota": 2.5}, "gpu_quota", "integer"),
        ({"gpu_quota": True}, "gpu_quota", "not true or false"),
        ({"weight": 0}, "weight", "greater than 0"),
        ({"weight": "inf"}, "weight", "finite"),
        ({"quota": 4}, "quota", "Extra inputs"),
    ):
        r = _patch(api, "ml", body)
        assert r.status_code == 422, (body, r.text)
        error = r.json()["errors"][0]
        assert error["loc"][-1] == field and words in error["msg"], (body, error)
    r = _patch(api, "nlp", {"gpu_quota": 1})
    assert r.status_code == 404
    assert r.json()["detail"] == "no project named 'nlp'; projects: cv, default, ml"
    assert _patch(api, "ml", {"gpu_quota": 8}, user="alice").status_code == 403
    queues = api.client.get("/api/v1/queues", headers=api.as_("admin")).json()
    assert {(q["gpu_quota"], q["weight"], q["max_runtime_s"]) for q in queues} == {(0, 1.0, None)}


def test_a_quota_given_over_the_api_reclaims_borrowed_gpus(api):
    with api.factory() as session:
        session.add(ready_node("n1", gpus=4, now=utcnow()))
        session.commit()
    borrower = _submit(api, "bob", gpus=4, preemptible=True)
    assert _cycle(api).placed == 1
    with api.factory() as session:
        transition(session, job=session.get(Job, borrower), to=JobStatus.RUNNING, actor="t")
        session.commit()

    owner = _submit(api, "alice", gpus=4)
    # Without a guarantee, ml waits like anyone else: nothing is preempted for it.
    assert (_cycle(api).preempted, _cycle(api).placed) == (0, 0)

    assert _patch(api, "ml", {"gpu_quota": 4}).status_code == 200
    # The borrower is younger than the anti-loop guard: the owner is told which job's age
    # lets it reclaim (a job, not a time: the message names no time).
    guarded = SchedulerSettings(stability_window_s=0, min_run_before_preempt_s=600)
    assert _cycle(api, guarded).preempted == 0
    shown = api.client.get(f"/api/v1/jobs/{owner}", headers=api.as_("alice")).json()
    assert shown["pending_message"].startswith(
        "waiting for 4 GPUs (largest free block 0); within quota: borrowed GPUs are"
        " reclaimed once a borrowing job has run 10 min (job "
    ), shown
    report = _cycle(api)
    assert (report.preempted, report.placed) == (1, 1)
    with api.factory() as session:
        holders = session.scalars(select(Allocation.job_id).where(Allocation.released_at.is_(None)))
        assert set(holders) == {owner}  # handed over to the project that owns the quota
    events = api.client.get(f"/api/v1/jobs/{borrower}/events", headers=api.as_("bob")).json()
    assert events[-1]["reason"] == (
        f"preempting for job {owner}: quota: project ml reclaims its guaranteed GPUs from cv"
        " (borrowing)"
    )


def test_without_borrowing_a_quota_is_a_hard_cap(api, monkeypatch):
    monkeypatch.setenv("GPUSCHED_SCHEDULER_BORROWING", "false")
    capped = SchedulerSettings(stability_window_s=0)
    with api.factory() as session:
        session.add(ready_node("n1", gpus=4, now=utcnow()))
        session.commit()
    assert _patch(api, "ml", {"gpu_quota": 2}).status_code == 200
    first, second = (_submit(api, "alice", gpus=2) for _ in range(2))
    report = _cycle(api, capped)
    assert (report.placed, report.pending) == (1, 1)  # 2 of the 4 GPUs stay idle
    shown = api.client.get(f"/api/v1/jobs/{second}", headers=api.as_("alice")).json()
    assert (shown["pending_reason"], shown["pending_message"]) == (
        "quota",
        "project ml would exceed its quota of 2 GPUs (using 2, borrowing disabled)",
    )
    assert (
        api.client.get(f"/api/v1/jobs/{first}", headers=api.as_("alice")).json()["status"]
        == "SCHEDULED"
    )
