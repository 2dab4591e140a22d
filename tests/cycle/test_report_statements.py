"""An agent's start report is applied with one read: the job, locked, with whether the
reporting node holds its attempt (two queries before), and a first attempt does not look
for an earlier start (a third). Every agent sends two reports per job, so a busy cluster's
reports process spends its time here (docs/benchmarks.md)."""

from __future__ import annotations

from sqlalchemy import event

from app.jobs.agent_reports import job_started
from app.jobs.models import Job
from app.wire import Started
from tests.cycle.jobs_api import add_node, get_job, run_one_cycle, submit


def _reads_while(api, apply) -> list[str]:
    engine = api.factory.kw["bind"]
    reads: list[str] = []

    def seen(_conn, _cursor, statement, *_):
        if statement.lstrip().upper().startswith("SELECT"):
            reads.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        apply()
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    return reads


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
