"""For the tests that drive jobs through the API and run live cycles on them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import event, select

from app.cycle import lease
from app.cycle.run import run_cycle
from app.cycle.settings import SchedulerSettings
from app.db import utcnow
from app.jobs.models import Job
from app.jobs.ranking import last
from app.jobs.states import JobStatus
from app.messaging import NullMessenger
from tests.foundation.builders import ready_node

SETTINGS = SchedulerSettings(stability_window_s=0)


def statements_while(api: Any, apply: Callable[[], object]) -> list[str]:
    """The SQL statements `apply()` sent through the API's engine, in order."""
    engine = api.factory.kw["bind"]
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        apply()
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    return statements


def lease_taken(session: Any, *, holder: str, now: datetime, ttl_s: float) -> int | None:
    """The cycle lease taken and committed, as a scheduler holding it between cycles."""
    token = lease.take(session, holder=holder, now=now, ttl_s=ttl_s)
    if token is not None:
        session.commit()
    return token


def submit(api: Any, user: str = "alice", **body: Any) -> dict[str, Any]:
    body.setdefault("command", ["train"])
    r = api.client.post("/api/v1/jobs", json=body, headers=api.as_(user))
    assert r.status_code == 201, r.text
    job: dict[str, Any] = r.json()
    return job


def grant_priority(api: Any, project: str = "ml", up_to: int = 10) -> None:
    """As an admin: the project's users may give their jobs priority up to `up_to`."""
    r = api.client.patch(
        f"/api/v1/projects/{project}", json={"max_priority": up_to}, headers=api.as_("admin")
    )
    assert r.status_code == 200, r.text


def positions(api: Any) -> dict[int, int | None]:
    """Each waiting job's place in the queue as the API shows it: its index among the
    jobs the last full cycle ranked that still wait (None: not ranked, or held)."""
    with api.factory() as session:
        rows = session.execute(
            select(Job.id, Job.queue_position, Job.held_by).where(Job.status == JobStatus.PENDING)
        ).all()
        stored = last(session)
    return {
        job_id: None
        if stored is None or key is None or held is not None
        else stored.position(job_id)
        for job_id, key, held in rows
    }


def get_job(api: Any, job_id: int) -> dict[str, Any]:
    r = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.as_("admin"))
    assert r.status_code == 200, r.text
    job: dict[str, Any] = r.json()
    return job


def job_events(api: Any, job_id: int) -> list[dict[str, Any]]:
    r = api.client.get(f"/api/v1/jobs/{job_id}/events", headers=api.as_("admin"))
    assert r.status_code == 200, r.text
    events: list[dict[str, Any]] = r.json()
    return events


def run_one_cycle(api: Any) -> None:
    run_cycle(
        factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="t", now=utcnow()
    )


def add_node(api: Any, gpus: int) -> None:
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=gpus, now=utcnow()))


def finish(api: Any, job_id: int, result: str = "SUCCEEDED") -> None:
    """As the agent's report would: the job's current attempt ended this way on n1."""
    assert report_end(api, job_id, result).accepted


def report_end(
    api: Any, job_id: int, result: str, *, node: str = "n1", exit_code: int | None = None
) -> Any:
    """An agent's end report for the job's current attempt on `node`, applied and
    committed; returns what it changed (app.jobs.agent_reports.Applied)."""
    from app.jobs.agent_reports import job_finished
    from app.jobs.models import Job
    from app.wire import Finished

    with api.factory.begin() as session:
        attempt = session.get_one(Job, job_id).attempt
        report = Finished(node=node, job_id=job_id, attempt=attempt, result=result)  # type: ignore[arg-type]
        if exit_code is not None:
            report = replace(report, exit_code=exit_code, message=f"exit code {exit_code}")
        return job_finished(session=session, report=report)
