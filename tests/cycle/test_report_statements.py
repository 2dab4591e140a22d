"""An agent's start report is applied with one read: the job, locked, with whether the
reporting node holds its attempt (two queries before), and a first attempt does not look
for an earlier start (a third). Every agent sends two reports per job, so a busy cluster's
reports process spends its time here (docs/benchmarks.md)."""

from __future__ import annotations

from app.jobs.agent_reports import job_finished, job_started
from app.jobs.models import Job
from app.wire import Finished, Started
from tests.cycle.jobs_api import add_node, get_job, run_one_cycle, statements_while, submit


def _reads_while(api, apply) -> list[str]:
    return [s for s in statements_while(api, apply) if s.lstrip().upper().startswith("SELECT")]


def test_a_first_start_is_applied_with_one_read(api):
    add_node(api, 1)
    job = submit(api)
    run_one_cycle(api)
    node = get_job(api, job["id"])["allocations"][0]["node"]
    with api.factory.begin() as session:
        attempt = session.get_one(Job, job["id"]).attempt
        report = Started(job_id=job["id"], attempt=attempt, node=node, pid=7)
        reads = _reads_while(api, lambda: job_started(session=session, report=report))
    assert len(reads) == 1, reads
    assert get_job(api, job["id"])["status"] == "RUNNING"


def test_a_start_from_a_node_that_does_not_hold_the_attempt_is_refused(api):
    add_node(api, 1)
    job = submit(api)
    run_one_cycle(api)
    with api.factory.begin() as session:
        attempt = session.get_one(Job, job["id"]).attempt
        report = Started(job_id=job["id"], attempt=attempt, node="elsewhere", pid=7)
        applied = job_started(session=session, report=report)
    assert (applied.accepted, applied.refused) == (False, "not_placed_here")
    assert get_job(api, job["id"])["status"] == "SCHEDULED"


def _job_writes_of_a_success(api, job_id: int, node: str) -> list[str]:
    """The UPDATEs of the job table a success report of its current attempt sends."""
    with api.factory.begin() as session:
        attempt = session.get_one(Job, job_id).attempt
        report = Finished(job_id=job_id, attempt=attempt, node=node,
                          result="SUCCEEDED", exit_code=0, pid=9, cpu_s=2.0)  # fmt: skip

        def finish() -> None:
            job_finished(session=session, report=report)
            session.flush()

        statements = statements_while(api, finish)
    return [s for s in statements if s.upper().startswith("UPDATE JOB ")]


def test_a_finish_report_writes_its_job_once(api):
    """The job's row is written once per finish report, with its end, its exit code and
    its usage, also for a job that ended at once (reported by its end alone, so it goes
    through RUNNING in the same report): releasing its GPUs flushed the job first."""
    add_node(api, 2)
    running, at_once = submit(api)["id"], submit(api)["id"]
    run_one_cycle(api)
    node = {j: get_job(api, j)["allocations"][0]["node"] for j in (running, at_once)}
    with api.factory.begin() as session:
        attempt = session.get_one(Job, running).attempt
        report = Started(job_id=running, attempt=attempt, node=node[running], pid=7)
        job_started(session=session, report=report)
    for job_id in (running, at_once):
        assert len(_job_writes_of_a_success(api, job_id, node[job_id])) == 1
        shown = get_job(api, job_id)
        assert (shown["status"], shown["exit_code"]) == ("SUCCEEDED", 0)
