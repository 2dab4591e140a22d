"""Requeue (scontrol requeue / requeuehold): a running job is stopped as a preemption and
comes back to the queue with its age, costing no retry; with hold it comes back held."""

from __future__ import annotations

from app.db import utcnow
from app.jobs.agent_reports import job_finished, job_started
from app.jobs.models import Job
from app.wire import Finished, Started
from tests.cycle.jobs_api import add_node, get_job, job_events, run_one_cycle, submit
from tests.foundation.builders import ready_node


def _node_of(api, job_id: int) -> str:
    """The node the job is placed on (its agent is the one that reports on it)."""
    return get_job(api, job_id)["allocations"][0]["node"]


def _running(api, **body) -> dict:
    job = submit(api, **body)
    run_one_cycle(api)
    node = _node_of(api, job["id"])
    with api.factory.begin() as session:
        attempt = session.get_one(Job, job["id"]).attempt
        report = Started(job_id=job["id"], attempt=attempt, node=node, pid=7)
        assert job_started(session=session, report=report).accepted
    running = get_job(api, job["id"])
    assert running["status"] == "RUNNING"
    return running


def _stopped_by_agent(api, job_id: int) -> None:
    """As the agent reports a job it stopped for a preemption (it checkpointed, exited 0)."""
    node = _node_of(api, job_id)
    with api.factory.begin() as session:
        attempt = session.get_one(Job, job_id).attempt
        report = Finished(
            job_id=job_id,
            attempt=attempt,
            node=node,
            result="PREEMPTED",
            exit_code=0,
            message="exit code 0 after preempt",
        )
        assert job_finished(session=session, report=report).accepted


def _requeue(api, job_id: int, user: str = "alice", **params):
    return api.client.post(f"/api/v1/jobs/{job_id}/requeue", params=params, headers=api.as_(user))


def test_a_requeued_job_comes_back_first_with_its_age_and_no_retry_spent(api):
    add_node(api, 1)
    train = _running(api, name="train")
    later = submit(api, name="later")

    r = _requeue(api, train["id"])
    assert r.status_code == 200, r.text
    assert (r.json()["status"], r.json()["requeue_requested"]) == ("RUNNING", True)
    assert _requeue(api, train["id"]).status_code == 200  # idempotent: asked once
    notes = [e["reason"] for e in job_events(api, train["id"])]
    assert notes.count("requeue requested by alice; stopping the process") == 1

    _stopped_by_agent(api, train["id"])
    back = get_job(api, train["id"])
    assert (back["status"], back["failures"], back["requeue_requested"]) == ("PENDING", 0, False)
    assert back["created_at"] == train["created_at"]
    run_one_cycle(api)  # its age puts it ahead of the job submitted after it
    assert get_job(api, train["id"])["status"] == "SCHEDULED"
    assert get_job(api, train["id"])["attempt"] == 2
    assert get_job(api, later["id"])["status"] == "PENDING"


def test_requeue_with_hold_brings_it_back_held_to_be_changed(api):
    add_node(api, 1)
    train = _running(api, name="train")
    later = submit(api, name="later")

    r = _requeue(api, train["id"], hold="true")
    assert r.status_code == 200, r.text
    assert (r.json()["status"], r.json()["held_by"]) == ("RUNNING", "alice")  # once back
    _stopped_by_agent(api, train["id"])
    held = get_job(api, train["id"])
    assert (held["status"], held["pending_reason"], held["held_by"]) == (
        "PENDING",
        "held",
        "alice",
    )
    run_one_cycle(api)  # the held job stays out: the next one gets the GPU
    assert get_job(api, train["id"])["status"] == "PENDING"
    assert get_job(api, later["id"])["status"] == "SCHEDULED"
    # Changed while held (scontrol update), then let go.
    changed = api.client.patch(
        f"/api/v1/jobs/{train['id']}", json={"priority": -5}, headers=api.as_("alice")
    )
    assert changed.status_code == 200, changed.text
    released = api.client.post(f"/api/v1/jobs/{train['id']}/release", headers=api.as_("alice"))
    assert released.status_code == 200 and released.json()["held_by"] is None


def test_only_a_placed_or_running_job_not_being_cancelled_is_requeued(api):
    add_node(api, 1)
    pending = submit(api, name="later", schedule={"mode": "at", "at": "2099-01-01T00:00:00Z"})
    r = _requeue(api, pending["id"])
    assert r.status_code == 409
    assert r.json()["detail"] == (
        f"job {pending['id']} is PENDING: only a placed or running job can be requeued"
    )

    running = _running(api, name="train")
    assert _requeue(api, running["id"], user="bob").status_code == 403
    assert _requeue(api, 999_999).status_code == 404
    assert _requeue(api, running["id"], hold="maybe").status_code == 422

    api.client.post(f"/api/v1/jobs/{running['id']}/cancel", headers=api.as_("alice"))
    r = _requeue(api, running["id"])
    assert r.status_code == 409
    assert r.json()["detail"] == f"job {running['id']} is being cancelled: it will not come back"
    assert get_job(api, running["id"])["requeue_requested"] is False


def test_a_job_placed_but_not_started_yet_is_requeued_too(api):
    # Its agent never starts it: stopped before it started, it reports PREEMPTED.
    add_node(api, 1)
    placed = submit(api, name="train")
    run_one_cycle(api)
    assert get_job(api, placed["id"])["status"] == "SCHEDULED"
    r = _requeue(api, placed["id"], hold="true")
    assert r.status_code == 200, r.text
    assert (r.json()["status"], r.json()["requeue_requested"]) == ("SCHEDULED", True)
    _stopped_by_agent(api, placed["id"])
    back = get_job(api, placed["id"])
    assert (back["status"], back["held_by"], back["failures"]) == ("PENDING", "alice", 0)


def test_a_job_cancelled_while_it_stops_for_a_requeue_does_not_come_back(api):
    """The agent stops it for the requeue (the first reason wins there) and reports it
    PREEMPTED; the cancel asked for meanwhile still wins: it must not run again."""
    add_node(api, 1)
    train = _running(api, name="train")
    assert _requeue(api, train["id"]).status_code == 200
    api.client.post(f"/api/v1/jobs/{train['id']}/cancel", headers=api.as_("alice"))
    _stopped_by_agent(api, train["id"])
    ended = get_job(api, train["id"])
    assert ended["status"] == "CANCELLED"
    assert job_events(api, train["id"])[-1]["reason"] == (
        "cancelled by user while it was being stopped"
    )
    run_one_cycle(api)
    assert get_job(api, train["id"])["status"] == "CANCELLED"


def test_a_job_that_fails_while_being_cancelled_is_not_retried(api):
    add_node(api, 1)
    train = _running(api, name="train", retries=3)
    api.client.post(f"/api/v1/jobs/{train['id']}/cancel", headers=api.as_("alice"))
    with api.factory.begin() as session:
        report = Finished(job_id=train["id"], attempt=1, node="n1", result="FAILED")
        assert job_finished(session=session, report=report).accepted
    assert get_job(api, train["id"])["status"] == "FAILED"  # its own end; no retry


def test_an_admin_requeues_the_jobs_running_on_a_node_to_service_it(api):
    add_node(api, 2)  # n1
    with api.factory.begin() as session:
        session.add(ready_node("n2", gpus=1, now=utcnow()))
    jobs = [_running(api, name=f"train-{i}") for i in range(3)]
    where = {j["id"]: get_job(api, j["id"])["allocations"][0]["node"] for j in jobs}
    on_n1 = sorted(i for i, node in where.items() if node == "n1")
    assert len(on_n1) == 2
    cancelled = on_n1[1]  # being cancelled: left to end
    api.client.post(f"/api/v1/jobs/{cancelled}/cancel", headers=api.as_("alice"))

    drained = api.client.post("/api/v1/nodes/n1/drain", headers=api.as_("admin"))
    assert drained.status_code == 200, drained.text
    r = api.client.post("/api/v1/nodes/n1/requeue", headers=api.as_("admin"))
    assert r.status_code == 200, r.text
    assert [j["id"] for j in r.json()] == [on_n1[0]]
    assert r.json()[0]["requeue_requested"] is True
    assert job_events(api, on_n1[0])[-1]["reason"] == (
        "requeue requested by admin (node n1); stopping the process"
    )
    others = [i for i in where if i not in on_n1]
    assert [get_job(api, i)["requeue_requested"] for i in others] == [False]

    assert api.client.post("/api/v1/nodes/n1/requeue", headers=api.as_("alice")).status_code == 403
    missing = api.client.post("/api/v1/nodes/nope/requeue", headers=api.as_("admin"))
    assert missing.status_code == 404 and missing.json()["detail"] == "no node 'nope'"
