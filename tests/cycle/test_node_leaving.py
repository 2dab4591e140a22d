"""A node that goes away before its jobs started: they ran nothing there, so they go back
to the queue without spending a retry. An agent that stops on purpose says so ("leaving"),
and its node takes no job from then on, not only after the heartbeat timeout."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update

from app.cycle.reconcile import SilenceJudge, node_left, reconcile
from app.db import utcnow
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.nodes.models import Node
from app.wire import Finished, Leaving
from tests.cycle.jobs_api import add_node, get_job, job_events, run_one_cycle, submit

HEARTBEAT_TIMEOUT_S = 30.0


def _scheduled(api: Any, **body: Any) -> int:
    job_id: int = submit(api, gpus=1, **body)["id"]
    run_one_cycle(api)
    assert get_job(api, job_id)["status"] == "SCHEDULED"
    return job_id


def _started(api: Any, job_id: int) -> None:
    with api.factory.begin() as session:
        session.execute(update(Job).where(Job.id == job_id)
                        .values(status=JobStatus.RUNNING, started_at=utcnow()))  # fmt: skip


def _leaving(api: Any, recent: list[Finished] | None = None, taken_at: float | None = None):
    leaving = Leaving(node="n1", recent=tuple(recent or ()), taken_at=taken_at)
    with api.factory() as session:
        return node_left(session=session, leaving=leaving, now=utcnow())


def _node(api: Any) -> Node:
    with api.factory() as session:
        node = session.scalars(select(Node).where(Node.name == "n1")).one()
        session.expunge(node)
        return node


def test_a_job_whose_node_went_silent_before_it_started_is_requeued_without_a_retry(api) -> None:
    add_node(api, gpus=2)
    waiting, running = _scheduled(api), _scheduled(api)  # retries: 0
    _started(api, running)
    silent_since = utcnow() + timedelta(seconds=HEARTBEAT_TIMEOUT_S + 1)
    judge = SilenceJudge(heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
    with api.factory() as session:  # a judge trusts silence only after a timeout of service
        for now in (silent_since - timedelta(seconds=HEARTBEAT_TIMEOUT_S), silent_since):
            repairs = reconcile(
                session=session,
                now=now,
                heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
                dispatch_timeout_s=3600,
                silence=judge,
            )

    assert repairs.lost_nodes == ["n1"]
    assert get_job(api, waiting)["status"] == "PENDING"
    assert job_events(api, waiting)[-1]["reason"] == (
        "node n1 stopped responding before it started: back in the queue, no retry spent"
    )
    # The one that had started may have run part of its work: LOST, no retry left.
    assert [e["to_status"] for e in job_events(api, running)][-2:] == ["LOST", "FAILED"]


def test_a_leaving_agent_takes_its_node_out_at_once_and_requeues_what_it_had_not_started(
    api,
) -> None:
    add_node(api, gpus=3)
    waiting, preempted, finished = _scheduled(api), _scheduled(api), _scheduled(api)
    for job_id in (preempted, finished):
        _started(api, job_id)
    # The agent stopped `preempted` for its shutdown and `finished` ended just before; the
    # reports themselves may come later (handled out of order): the leaving one has both.
    recent = [
        Finished(node="n1", job_id=job_id, attempt=1, result=result, exit_code=code, message="m")
        for job_id, result, code in ((preempted, "PREEMPTED", None), (finished, "SUCCEEDED", 0))
    ]

    repairs = _leaving(api, recent, taken_at=time.time())

    node = _node(api)
    assert (node.state, repairs.lost_nodes) == ("NOT_READY", ["n1"])
    assert node.health_message.startswith("its agent stopped at ")
    assert get_job(api, finished)["status"] == "SUCCEEDED"
    assert get_job(api, preempted)["status"] == "PENDING"  # requeued: no retry spent
    # Nobody preempted it: its agent's shutdown did, and its history says so.
    stopped = [e for e in job_events(api, preempted) if e["to_status"] == "PREEMPTED"]
    assert [e["reason"] for e in stopped] == ["requeued as its node's agent stopped (m)"]
    assert get_job(api, waiting)["status"] == "PENDING"
    assert job_events(api, waiting)[-1]["reason"] == (
        "the agent of node n1 stopped before it started: back in the queue, no retry spent"
    )
    run_one_cycle(api)  # nothing is placed on it now
    assert get_job(api, waiting)["status"] == "PENDING"


def test_a_leaving_report_from_before_the_agent_registered_is_stale(api) -> None:
    add_node(api, gpus=1)  # registered: now
    job_id = _scheduled(api)
    _leaving(api, taken_at=time.time() - 60)  # from the agent before this one
    assert (_node(api).state, get_job(api, job_id)["status"]) == ("READY", "SCHEDULED")


def test_a_cancel_asked_before_the_node_left_wins(api) -> None:
    add_node(api, gpus=1)
    job_id = _scheduled(api)
    r = api.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.as_("alice"))
    assert r.json()["cancel_requested"] is True
    _leaving(api, taken_at=time.time())
    assert get_job(api, job_id)["status"] == "CANCELLED"
