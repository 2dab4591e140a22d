"""PATCH /jobs/{id} with `depends_on` / `dependency`, as `scontrol update Dependency=`: a
pending job is made to wait for other jobs, or none, keeping its submit time; checked as
at submission, and never into a loop of jobs waiting for each other."""

from __future__ import annotations

from typing import Any

from app.jobs.models import Job
from tests.cycle.jobs_api import add_node, finish, get_job, job_events, run_one_cycle, submit


def _patch(api: Any, job_id: int, user: str = "alice", **body: Any) -> Any:
    return api.client.patch(f"/api/v1/jobs/{job_id}", json=body, headers=api.as_(user))


def test_a_waiting_job_is_pointed_at_another_job(api):
    add_node(api, 2)
    first = submit(api, name="first")["id"]
    second = submit(api, name="second")["id"]
    evaluate = submit(api, name="eval", depends_on=[first])["id"]
    run_one_cycle(api)  # first and second are placed; eval waits for first

    r = _patch(api, evaluate, depends_on=[second])
    assert r.status_code == 200, r.text
    job = r.json()
    assert (job["depends_on"], job["dependency"], job["pending_reason"]) == (
        [second],
        "afterok",
        "dependency",
    )
    assert job["pending_message"] == f"waiting for job {second} (second) to succeed"
    assert job_events(api, evaluate)[-1]["reason"] == (
        f"updated by alice: dependency afterok:{first} -> afterok:{second}"
    )

    finish(api, first, "SUCCEEDED")
    run_one_cycle(api)
    assert get_job(api, evaluate)["status"] == "PENDING"  # not first's: second's success
    finish(api, second, "SUCCEEDED")
    run_one_cycle(api)
    assert get_job(api, evaluate)["status"] == "SCHEDULED"


def test_changing_how_they_must_end_or_clearing_them(api):
    add_node(api, 2)
    train = submit(api, name="train")["id"]
    cleanup = submit(api, name="cleanup", depends_on=[train])["id"]
    run_one_cycle(api)

    # Only the kind sent: the jobs stay.
    job = _patch(api, cleanup, dependency="afterany").json()
    assert (job["depends_on"], job["pending_message"]) == (
        [train],
        f"waiting for job {train} (train) to end",
    )
    # Sent again unchanged: nothing changes, and no event says it did.
    events = len(job_events(api, cleanup))
    assert _patch(api, cleanup, depends_on=[train], dependency="afterany").status_code == 200
    assert len(job_events(api, cleanup)) == events

    # None: it joins the queue at once, with its submit time, and is placed by the next cycle.
    job = _patch(api, cleanup, depends_on=[]).json()
    assert (job["depends_on"], job["pending_reason"]) == ([], "NEW")
    assert job_events(api, cleanup)[-1]["reason"] == (
        f"updated by alice: dependency afterany:{train} -> none"
    )
    run_one_cycle(api)
    assert get_job(api, cleanup)["status"] == "SCHEDULED"


def test_a_job_that_waits_for_nothing_is_made_to_wait(api):
    add_node(api, 1)
    train = submit(api, name="train")["id"]
    run_one_cycle(api)
    evaluate = submit(api, name="eval")["id"]  # no GPU left for it: it waits in the queue
    job = _patch(api, evaluate, depends_on=[train]).json()
    assert (job["pending_reason"], job["pending_message"], job["queue_position"]) == (
        "dependency",
        f"waiting for job {train} (train) to succeed",
        None,
    )
    run_one_cycle(api)
    assert get_job(api, evaluate)["pending_reason"] == "dependency"
    # `after` asks only that train start: placed already, it is met at once.
    job = _patch(api, evaluate, dependency="after").json()
    assert (job["dependency"], job["pending_reason"]) == ("after", "NEW")


def test_a_plain_job_is_made_a_singleton(api):
    add_node(api, 2)
    nightly = submit(api, name="nightly")["id"]
    run_one_cycle(api)
    again = submit(api, name="nightly")["id"]
    job = _patch(api, again, dependency="singleton").json()
    assert (job["dependency"], job["pending_message"]) == (
        "singleton",
        f"waiting for job {nightly} (nightly) to end: one job named 'nightly' at a time",
    )
    run_one_cycle(api)
    assert get_job(api, again)["status"] == "PENDING"  # a GPU is free; its namesake runs


def test_changes_that_could_never_be_met_are_refused(api):
    train = submit(api, name="train")["id"]
    evaluate = submit(api, name="eval", depends_on=[train])["id"]
    report = submit(api, name="report", depends_on=[evaluate])["id"]
    failed = submit(api, name="failed")["id"]
    _finish_unplaced(api, failed)
    array = submit(api, name="sweep", array={"indices": "0-1"})["id"]
    bob_job = submit(api, user="bob", name="bobs")["id"]
    for job_id, body, field, message in [
        (train, {"depends_on": [train]}, "depends_on", f"job {train} cannot wait for itself"),
        # eval waits for train: train waiting for eval would be a loop, and so would
        # waiting for report, which waits for eval.
        (train, {"depends_on": [evaluate]}, "depends_on",
         f"job {evaluate} waits for job {train}: they would wait for each other forever"),
        (train, {"depends_on": [failed, report]}, "depends_on",
         f"job {report} waits for job {train}: they would wait for each other forever"),
        (train, {"depends_on": [failed]}, "depends_on", "could never start"),
        (train, {"depends_on": [bob_job]}, "depends_on", f"no job {bob_job} in your projects"),
        (report, {"dependency": "singleton"}, "depends_on", "a singleton job names no jobs"),
        (array, {"dependency": "singleton"}, "dependency",
         "singleton does not apply to a task of an array"),
        (train, {"dependency": "before"}, "dependency", "Input should be"),
    ]:  # fmt: skip
        r = _patch(api, job_id, **body)
        assert r.status_code == 422, (body, r.text)
        [error] = r.json()["errors"]
        assert error["loc"][-1] == field and message in error["msg"], (body, error)
    # Nothing was changed by the refusals.
    assert get_job(api, train)["depends_on"] == []
    assert get_job(api, report)["depends_on"] == [evaluate]
    # A placed job takes only a new time limit: a 409.
    add_node(api, 1)
    run_one_cycle(api)
    [placed] = [j for j in (train, array, bob_job) if get_job(api, j)["status"] == "SCHEDULED"]
    r = _patch(api, placed, user="admin", depends_on=[])
    assert r.status_code == 409 and "only its time limit (max_runtime_s) can be changed" in r.text


def _finish_unplaced(api: Any, job_id: int) -> None:
    """The job failed (placed, run and ended), without a cycle or a node."""
    from app.jobs.lifecycle import transition
    from app.jobs.states import JobStatus

    with api.factory.begin() as session:
        job = session.get_one(Job, job_id)
        for step in (JobStatus.SCHEDULED, JobStatus.RUNNING, JobStatus.FAILED):
            transition(session, job=job, to=step, actor="agent:n1")
