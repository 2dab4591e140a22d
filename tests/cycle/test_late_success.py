"""An attempt declared lost while its node was only late (a heartbeat dropped, the report
queue behind on a loaded scheduler): the node's report that it succeeded, arriving before
the requeue ran it again, ends the job instead of running it twice. Found by
tests/faults/test_two_schedulers.py under load: jobs that had ended ran a second time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import update

from app.db import utcnow
from app.jobs.agent_reports import mark_lost
from app.jobs.models import Job
from app.jobs.states import JobStatus
from tests.cycle.jobs_api import add_node, get_job, job_events, report_end, run_one_cycle, submit
from tests.foundation.builders import ready_node


def lost_while_running(api: Any, **body: Any) -> int:
    """A running job whose node was judged silent: LOST until its grace period is over."""
    add_node(api, gpus=2)
    job_id: int = submit(api, gpus=1, **body)["id"]
    run_one_cycle(api)
    now = utcnow()
    with api.factory.begin() as session:
        session.execute(
            update(Job).where(Job.id == job_id).values(status=JobStatus.RUNNING, started_at=now)
        )
    with api.factory.begin() as session:
        job = session.get_one(Job, job_id)
        mark_lost(
            session=session,
            job=job,
            reason="node n1 silent",
            ended_by=now + timedelta(seconds=60),
            now=now,
        )
    assert get_job(api, job_id)["status"] == "LOST"
    return job_id


def test_a_late_success_of_a_lost_attempt_ends_the_job(api) -> None:
    job_id = lost_while_running(api)

    applied = report_end(api, job_id, "SUCCEEDED", exit_code=0)

    assert applied.accepted
    job = get_job(api, job_id)
    assert (job["status"], job["attempt"], job["exit_code"]) == ("SUCCEEDED", 1, 0)
    last = job_events(api, job_id)[-1]
    assert (last["from_status"], last["to_status"]) == ("LOST", "SUCCEEDED")
    assert last["reason"].startswith("its node reported the attempt's success after it was")


def test_a_late_failure_leaves_the_requeue_as_it_was(api) -> None:
    job_id = lost_while_running(api, retries=0)

    applied = report_end(api, job_id, "FAILED", exit_code=1)

    assert not applied.accepted
    assert get_job(api, job_id)["status"] == "LOST"  # back in the queue at its lost_until


def test_a_late_success_from_another_node_is_not_believed(api) -> None:
    job_id = lost_while_running(api)
    with api.factory.begin() as session:
        session.add(ready_node("n2", gpus=2, now=utcnow()))

    applied = report_end(api, job_id, "SUCCEEDED", node="n2", exit_code=0)

    assert not applied.accepted
    assert get_job(api, job_id)["status"] == "LOST"
