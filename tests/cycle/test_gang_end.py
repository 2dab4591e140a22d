"""A job on several nodes ends with its last node, as a Slurm step ends with its last task:
the first rank often writes the checkpoint after the others are done. A node's failure
ends it at once (the others would wait on it in a collective)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from app.db import utcnow
from app.nodes.models import Allocation, Gpu, Node
from app.wire import StopJob
from tests.cycle.jobs_api import get_job, job_events, report_end, run_one_cycle, submit
from tests.foundation.builders import ready_node


def _gang(api: Any) -> int:
    with api.factory.begin() as session:
        session.add_all([ready_node(name, gpus=2, now=utcnow()) for name in ("n1", "n2")])
    job = submit(api, name="gang", gpus=2, nodes=2)["id"]
    run_one_cycle(api)
    assert get_job(api, job)["status"] == "SCHEDULED"
    return job


def _held_gpus(api: Any, job_id: int) -> dict[str, int]:
    """Allocated GPUs per node, as the GPU rows count them."""
    with api.factory() as session:
        rows = session.execute(
            select(Node.name, Gpu.allocated_milli).join(Gpu, Gpu.node_id == Node.id)
        ).all()
        active = session.scalars(
            select(Allocation.id).where(
                Allocation.job_id == job_id, Allocation.released_at.is_(None)
            )
        ).all()
    held: dict[str, int] = {}
    for name, milli in rows:
        held[name] = held.get(name, 0) + milli // 1000
    assert sum(held.values()) == len(active)
    return held


def test_a_gang_succeeds_with_its_last_node_and_frees_each_node_as_it_ends(api):
    job = _gang(api)
    first = report_end(api, job, "SUCCEEDED", node="n2", exit_code=0)
    assert first.accepted and first.after.cycle  # a cycle may use n2 now
    after_first = get_job(api, job)
    assert after_first["status"] == "RUNNING"  # n1 still runs rank 0
    assert _held_gpus(api, job) == {"n1": 2, "n2": 0}
    assert (
        job_events(api, job)[-1]["reason"] == "its part on n2 ended (exit code 0); 1 node(s) to go"
    )

    again = report_end(api, job, "SUCCEEDED", node="n2", exit_code=0)  # a redelivered report
    assert not again.accepted and "n2 already ended" in again.why

    assert report_end(api, job, "SUCCEEDED", node="n1", exit_code=0).accepted
    done = get_job(api, job)
    assert (done["status"], done["exit_code"]) == ("SUCCEEDED", 0)
    assert _held_gpus(api, job) == {"n1": 0, "n2": 0}


def test_a_node_that_fails_ends_the_gang_at_once(api):
    job = _gang(api)
    assert report_end(api, job, "SUCCEEDED", node="n2", exit_code=0).accepted
    last = report_end(api, job, "FAILED", node="n1", exit_code=3)
    assert last.accepted and last.after.orders == ()  # n2 is done: nothing left to stop
    failed = get_job(api, job)
    assert (failed["status"], failed["exit_code"]) == ("FAILED", 3)
    assert _held_gpus(api, job) == {"n1": 0, "n2": 0}

    other = submit(api, name="gang", gpus=2, nodes=2)["id"]
    run_one_cycle(api)
    first = report_end(api, other, "FAILED", node="n1", exit_code=1)
    assert first.accepted and get_job(api, other)["status"] == "FAILED"
    # n2's rank would wait on n1's forever: it is told to stop now (sent after the commit).
    assert [(d.node, d.reason) for d in first.after.of_type(StopJob)] == [("n2", "cancel")]


def test_a_preempted_gang_sends_no_second_stop(api):
    """A preemption (or a cancel) was sent to every node already; another stop to the
    others would only race with their checkpointing."""
    job = _gang(api)
    first = report_end(api, job, "PREEMPTED", node="n1")
    assert first.accepted and first.after.orders == ()
    assert get_job(api, job)["status"] == "PENDING"
