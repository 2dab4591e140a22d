"""A stop whose message is lost (with Redis) is re-sent by reconciliation as the user asked
for it: a `cancel --grace 0` is re-sent as SIGKILL now, not with the job's own grace."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import update

from app.cycle.reconcile import SilenceJudge, reconcile
from app.db import utcnow
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.wire import StopJob
from tests.cycle.jobs_api import add_node, run_one_cycle, submit

DISPATCH_TIMEOUT_S = 15.0


def _running_job(api: Any, **body: Any) -> int:
    job_id: int = submit(api, gpus=1, grace_s=300, **body)["id"]
    run_one_cycle(api)
    with api.factory.begin() as session:
        session.execute(update(Job).where(Job.id == job_id)
                        .values(status=JobStatus.RUNNING, started_at=utcnow()))  # fmt: skip
    return job_id


def _cancel(api: Any, job_id: int, **params: Any) -> None:
    r = api.client.post(f"/api/v1/jobs/{job_id}/cancel", params=params, headers=api.as_("alice"))
    assert r.status_code == 200, r.text
    assert r.json()["cancel_requested"] is True


def _resent_stops(api: Any) -> dict[int, StopJob]:
    """The stops a reconcile run re-sends once the cancels' messages are overdue."""
    later = utcnow() + timedelta(seconds=DISPATCH_TIMEOUT_S + 1)
    with api.factory() as session:
        repairs = reconcile(
            session=session,
            now=later,
            heartbeat_timeout_s=3600,
            dispatch_timeout_s=DISPATCH_TIMEOUT_S,
            silence=SilenceJudge(heartbeat_timeout_s=3600),
        )
    return {stop.job_id: stop for stop in repairs.stop}


def test_a_lost_stop_is_resent_with_the_shortest_grace_a_cancel_asked_for(api) -> None:
    add_node(api, gpus=3)
    killed, shortened, plain = _running_job(api), _running_job(api), _running_job(api)
    _cancel(api, killed, grace_s=0)
    _cancel(api, killed, grace_s=60)  # a longer grace later does not undo "SIGKILL now"
    _cancel(api, shortened, grace_s=60)
    _cancel(api, plain)

    stops = _resent_stops(api)

    assert stops[killed] == StopJob(
        node=stops[killed].node, job_id=killed, attempt=1, reason="cancel", grace_s=0
    )
    assert stops[shortened].grace_s == 60
    assert stops[plain].grace_s is None  # the job's own 300 s, which its agent knows
