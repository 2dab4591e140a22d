"""A node that goes away: its jobs go back to the queue without spending a retry, once
whatever of them ran there has surely ended. An agent that stops on purpose says so ("leaving"),
and its node takes no job from then on, not only after the heartbeat timeout."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from app.cycle.reconcile import (
    SilenceJudge,
    node_left,
    node_registered,
    reconcile,
    requeue_lost_on,
)
from app.db import utcnow
from app.jobs.agent_reports import WATCHDOG_KILL_S, mark_lost
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.nodes.models import Node, NodeState
from app.wire import Finished, GpuInfo, Leaving, Register
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


def test_the_jobs_of_a_silent_node_go_back_to_the_queue_once_surely_ended_there(api) -> None:
    # Its agent died after its last heartbeat; its watchdog gives each job its grace
    # period, then SIGKILL. Until then a new attempt elsewhere could run beside the old
    # one: they wait LOST, and then go back to the queue, no retry spent (Slurm requeues
    # a batch job on node failure), started or not.
    add_node(api, gpus=2)
    waiting, running = _scheduled(api), _scheduled(api)  # retries: 0
    _started(api, running)
    with api.factory.begin() as session:
        session.execute(update(Node).values(grace_s=60.0, interval_s=2.0))
        heartbeat = session.scalars(select(Node.last_heartbeat_at)).one()
    surely_ended = heartbeat + timedelta(seconds=2 + 60 + WATCHDOG_KILL_S)
    silent_since = heartbeat + timedelta(seconds=HEARTBEAT_TIMEOUT_S + 1)
    judge = SilenceJudge(heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)

    def judge_at(now: datetime) -> Any:
        with api.factory() as session:
            return reconcile(
                session=session,
                now=now,
                heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
                dispatch_timeout_s=3600,
                silence=judge,
            )

    judge_at(silent_since - timedelta(seconds=HEARTBEAT_TIMEOUT_S))  # a judge trusts
    repairs = judge_at(silent_since)  # silence only after a timeout of service
    assert repairs.lost_nodes == ["n1"]
    assert [get_job(api, j)["status"] for j in (waiting, running)] == ["LOST", "LOST"]
    assert job_events(api, waiting)[-1]["reason"] == (
        f"node n1 stopped responding before its start was reported: back in the queue at "
        f"{surely_ended:%H:%M:%S} UTC, no retry spent, once its node's watchdog has surely "
        "ended it (its grace period)"
    )
    assert judge_at(surely_ended - timedelta(seconds=1)).requeued == []
    assert judge_at(surely_ended).requeued == [waiting, running]
    for job_id in (waiting, running):
        assert get_job(api, job_id)["status"] == "PENDING"
        assert [e["to_status"] for e in job_events(api, job_id)][-2:] == ["LOST", "PENDING"]
        with api.factory() as session:
            assert session.get_one(Job, job_id).failures == 0


def test_a_node_whose_agent_comes_back_requeues_its_lost_jobs_at_once(api) -> None:
    # The restarted agent ended what was left of them before it registered.
    add_node(api, gpus=1)
    running = _scheduled(api)
    _started(api, running)
    with api.factory() as session:
        node = session.scalars(select(Node)).one()
        job = session.get_one(Job, running)
        mark_lost(
            session=session,
            job=job,
            reason="node n1 stopped responding",
            ended_by=utcnow() + timedelta(hours=1),
            now=utcnow(),
        )
        session.commit()
        assert job.status is JobStatus.LOST
        assert requeue_lost_on(session=session, node=node.name) == [running]
        session.commit()
    assert get_job(api, running)["status"] == "PENDING"


def test_an_agent_asked_to_register_again_requeues_none_of_its_lost_jobs(api) -> None:
    # Asked because its first Register was lost (RegisterAgain): it did not restart, so
    # what it runs may still run; only a Register of its next start requeues them.
    add_node(api, gpus=1)
    running = _scheduled(api)
    _started(api, running)
    with api.factory() as session:
        node = session.scalars(select(Node)).one()
        mark_lost(
            session=session,
            job=session.get_one(Job, running),
            reason="node n1 stopped responding",
            ended_by=utcnow() + timedelta(hours=1),
            now=utcnow(),
        )
        gpus = tuple(
            GpuInfo(index=g.index, uuid=g.uuid, model=g.model, memory_total_mb=g.memory_total_mb)
            for g in node.gpus
        )
        assert (
            node_registered(session=session, report=Register(node="n1", gpus=gpus, again=True))
            == []
        )
        session.commit()
        assert session.get_one(Job, running).status is JobStatus.LOST
        assert node.state is NodeState.READY and all(g.healthy for g in node.gpus)
        assert node_registered(session=session, report=Register(node="n1", gpus=gpus)) == [running]
        session.commit()
    assert get_job(api, running)["status"] == "PENDING"


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
        "the agent of node n1 stopped before its start was reported: back in the queue, no retry spent"
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
