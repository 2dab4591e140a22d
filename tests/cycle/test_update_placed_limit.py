"""PATCH /jobs/{id} with `max_runtime_s` on a placed job, as `scontrol update TimeLimit=`:
its owner may shorten it, only an admin extend it, never below the time it has run; its
agents are told after the commit."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from app.db import utcnow
from app.jobs.agent_reports import job_started
from app.jobs.models import Job
from app.jobs.orders import AfterCommit
from app.wire import Order, SetTimeLimit, Started
from tests.cycle.jobs_api import add_node, finish, get_job, job_events, run_one_cycle, submit

HOUR = 3600


class Agents:
    """Plays the messenger: records set_time_limit messages; `reachable=False` plays a
    broker that is down."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.reachable = True

    def send(self, after: AfterCommit) -> tuple[Order, ...]:
        if not self.reachable:
            return after.orders
        self.sent.extend(
            (c.node, {"job_id": c.job_id, "attempt": c.attempt, "max_runtime_s": c.max_runtime_s})
            for c in after.of_type(SetTimeLimit)
        )
        return ()

    def request_cycle(self) -> bool:
        return True

    def request_cycle_at(self, when: datetime) -> bool:
        return True


@pytest.fixture
def agents(api: Any) -> Iterator[Agents]:
    state = api.client.app.state
    before, state.messenger = state.messenger, Agents()
    yield state.messenger
    state.messenger = before


def _running(api: Any, *, ran_s: float, **body: Any) -> int:
    """A job placed on n1 and started `ran_s` seconds ago."""
    job_id: int = submit(api, **body)["id"]
    run_one_cycle(api)
    with api.factory.begin() as session:
        job_started(session=session, report=Started(job_id=job_id, attempt=1, node="n1"))
        session.get_one(Job, job_id).started_at = utcnow() - timedelta(seconds=ran_s)
    assert get_job(api, job_id)["status"] == "RUNNING"
    return job_id


def _patch(api: Any, job_id: int, user: str, **body: Any) -> Any:
    return api.client.patch(f"/api/v1/jobs/{job_id}", json=body, headers=api.as_(user))


def test_the_owner_shortens_a_running_jobs_limit_and_its_agent_is_told(api, agents):
    add_node(api, 2)
    job_id = _running(api, ran_s=600, max_runtime_s=2 * HOUR)
    r = _patch(api, job_id, "alice", max_runtime_s=HOUR)
    assert r.status_code == 200, r.text
    assert (r.json()["status"], r.json()["max_runtime_s"]) == ("RUNNING", HOUR)
    assert agents.sent == [("n1", {"job_id": job_id, "attempt": 1, "max_runtime_s": HOUR})]
    assert job_events(api, job_id)[-1]["reason"] == "updated by alice: max_runtime_s 7200 -> 3600"

    # Extending is the admins' (as Slurm): alice is refused, the admin is not.
    r = _patch(api, job_id, "alice", max_runtime_s=3 * HOUR)
    assert r.status_code == 403
    assert r.json()["detail"] == (
        f"job {job_id} is RUNNING: only an admin extends its time limit (you may shorten it)"
    )
    assert _patch(api, job_id, "alice", max_runtime_s=None).status_code == 403  # none: longer
    r = _patch(api, job_id, "admin", max_runtime_s=3 * HOUR)
    assert r.status_code == 200 and r.json()["max_runtime_s"] == 3 * HOUR
    assert agents.sent[-1] == ("n1", {"job_id": job_id, "attempt": 1, "max_runtime_s": 3 * HOUR})


def test_what_a_placed_job_refuses(api, agents):
    add_node(api, 2)
    job_id = _running(api, ran_s=600, max_runtime_s=2 * HOUR)
    # Below the time it has run: it would end at once.
    r = _patch(api, job_id, "alice", max_runtime_s=300)
    assert r.status_code == 422
    assert r.json()["errors"][0]["loc"] == ["body", "max_runtime_s"]
    assert r.json()["errors"][0]["msg"].startswith(f"job {job_id} has run for 6")
    assert r.json()["errors"][0]["msg"].endswith(
        "s: a time limit of 300s would end it at once (cancel it instead)"
    )
    # Anything but its time limit.
    r = _patch(api, job_id, "alice", priority=5, max_runtime_s=HOUR)
    assert r.status_code == 409
    assert r.json()["detail"] == (
        f"job {job_id} is RUNNING: only its time limit (max_runtime_s) can be changed once "
        "it is placed"
    )
    # Ranges as at submission; another user's job is not theirs to change.
    assert _patch(api, job_id, "alice", max_runtime_s=0).status_code == 422
    assert _patch(api, job_id, "bob", max_runtime_s=HOUR).status_code == 403
    assert agents.sent == []
    assert get_job(api, job_id)["max_runtime_s"] == 2 * HOUR


def test_a_scheduled_job_takes_the_change_and_an_ended_one_refuses_it(api, agents):
    add_node(api, 2)
    job_id = submit(api, max_runtime_s=2 * HOUR, gpus=2)["id"]
    run_one_cycle(api)
    assert get_job(api, job_id)["status"] == "SCHEDULED"  # run_job sent, not started yet
    r = _patch(api, job_id, "alice", max_runtime_s=60)
    assert r.status_code == 200, r.text
    assert agents.sent == [("n1", {"job_id": job_id, "attempt": 1, "max_runtime_s": 60})]
    finish(api, job_id, "CANCELLED")  # as its agent reports a cancelled attempt
    r = _patch(api, job_id, "alice", max_runtime_s=30)
    assert r.status_code == 409
    assert r.json()["detail"] == f"job {job_id} is CANCELLED: it can no longer be changed"


def test_a_broker_that_is_down_is_a_503_saying_to_send_it_again(api, agents):
    add_node(api, 2)
    job_id = _running(api, ran_s=60, max_runtime_s=2 * HOUR)
    agents.reachable = False
    r = _patch(api, job_id, "alice", max_runtime_s=HOUR)
    assert r.status_code == 503
    assert r.json()["detail"] == (
        f"job {job_id}'s new time limit is stored, but its node could not be told (message "
        "broker unreachable): send the same change again"
    )
    agents.reachable = True
    assert _patch(api, job_id, "alice", max_runtime_s=HOUR).status_code == 200  # sent again
    assert agents.sent == [("n1", {"job_id": job_id, "attempt": 1, "max_runtime_s": HOUR})]
