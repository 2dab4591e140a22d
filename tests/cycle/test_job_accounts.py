"""Jobs run as their owner's Unix account: the run order names it, a node that lacks it
refuses the run (no retry spent) and the owner's jobs go elsewhere, or wait saying which
node lacks what. What an attempt used on its node reaches `seff`."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from app.db import utcnow
from app.jobs.agent_reports import job_finished
from app.jobs.models import Job
from app.jobs.orders import run_orders
from app.nodes.models import Node
from app.nodes.telemetry import TelemetryPolicy, ingest_heartbeat
from app.wire import Finished, Heartbeat, RunJob
from tests.cycle.jobs_api import get_job, job_events, run_one_cycle, statements_while, submit
from tests.foundation.builders import ready_node


def _nodes(api: Any, *names: str) -> None:
    with api.factory.begin() as session:
        for name in names:
            session.add(ready_node(name, gpus=1, now=utcnow()))


def _placed_on(api: Any, job_id: int) -> tuple[str, RunJob]:
    with api.factory() as session:
        [order] = run_orders(session, jobs=[session.get_one(Job, job_id)])
    return order.node, order


def _refuse(api: Any, job_id: int, node: str, account: str) -> None:
    with api.factory.begin() as session:
        job = session.get_one(Job, job_id)
        applied = job_finished(
            session=session,
            report=Finished(
                node=node, job_id=job_id, attempt=job.attempt, result="REFUSED",
                account=account, account_reason="no such account on this node",
                message=f"not started: no usable unix account {account!r} on node {node} "
                "(no such account on this node)",
            ),
        )  # fmt: skip
        assert applied.accepted and applied.after.cycle  # its GPUs are free again


def test_the_run_order_names_the_owners_account(api: Any) -> None:
    _nodes(api, "n1")
    api.add_user("dora", ["ml"])
    with api.factory.begin() as session:
        from app.auth.service import set_unix_user

        set_unix_user(session=session, user_name="dora", unix_user="dora2", actor="test")
    job = submit(api, user="dora", gpus=1)["id"]
    run_one_cycle(api)
    _, order = _placed_on(api, job)
    assert order.unix_user == "dora2"


def test_the_run_orders_of_a_cycle_and_their_accounts_are_one_read(api: Any) -> None:
    """A dispatching cycle sends one statement for every placed job's orders, whoever
    owns them: a round trip per cycle counts in a drain."""
    _nodes(api, "n1", "n2")
    api.add_user("dora", ["ml"])
    jobs = [submit(api, user=user, gpus=1)["id"] for user in ("alice", "dora")]
    run_one_cycle(api)
    orders = []
    with api.factory() as session:
        placed = list(session.scalars(select(Job).where(Job.id.in_(jobs)).order_by(Job.id)))
        statements = statements_while(api, lambda: orders.extend(run_orders(session, jobs=placed)))
    assert [o.unix_user for o in orders] == ["alice", "dora"]
    assert len(statements) == 1, statements


def test_a_node_without_the_account_refuses_and_the_job_goes_elsewhere(api: Any) -> None:
    _nodes(api, "n1", "n2")
    job = submit(api, gpus=1)["id"]  # alice's: her account is "alice"
    run_one_cycle(api)
    first, order = _placed_on(api, job)
    assert order.unix_user == "alice"
    _refuse(api, job, first, "alice")

    done = get_job(api, job)
    assert done["status"] == "PENDING" and done["retries"] == 0
    with api.factory() as session:
        assert session.get_one(Job, job).failures == 0  # nothing ran: no retry spent
        node = session.scalars(select(Node).where(Node.name == first)).one()
        assert node.unusable_accounts == {"alice": "no such account on this node"}
    run_one_cycle(api)
    second, _ = _placed_on(api, job)
    assert second != first
    assert [e["to_status"] for e in job_events(api, job)] == [
        "PENDING", "SCHEDULED", "PENDING", "SCHEDULED",
    ]  # fmt: skip


def test_with_no_node_left_the_job_waits_saying_which_node_lacks_what(api: Any) -> None:
    _nodes(api, "n1")
    job = submit(api, gpus=1)["id"]
    run_one_cycle(api)
    _refuse(api, job, "n1", "alice")
    run_one_cycle(api)
    waiting = get_job(api, job)
    assert waiting["status"] == "PENDING"
    assert waiting["pending_reason"] == "no_account"
    assert waiting["pending_message"].startswith(
        "no node it may use can run it as Unix account 'alice' (n1: no such account on this node)"
    )
    # Another user's job is not held back by it.
    other = submit(api, user="admin", gpus=1)["id"]
    run_one_cycle(api)
    assert get_job(api, other)["status"] == "SCHEDULED"

    finish_other = job_finished  # the other job ends; its GPU is free again
    with api.factory.begin() as session:
        attempt = session.get_one(Job, other).attempt
        finish_other(session=session, report=Finished(node="n1", job_id=other, attempt=attempt,
                                                      result="SUCCEEDED"))  # fmt: skip
    # The account is created on n1: its agent's next heartbeat no longer lists it, and the
    # job starts there.
    with api.factory.begin() as session:
        ingest_heartbeat(
            session=session,
            heartbeat=Heartbeat(node="n1", unusable_accounts={}),
            policy=TelemetryPolicy(),
            now=utcnow(),
        )
    run_one_cycle(api)
    assert get_job(api, job)["status"] == "SCHEDULED"


def test_what_an_attempt_used_reaches_seff(api: Any) -> None:
    _nodes(api, "n1")
    job = submit(api, gpus=1)["id"]
    run_one_cycle(api)
    with api.factory.begin() as session:
        attempt = session.get_one(Job, job).attempt
        job_finished(
            session=session,
            report=Finished(
                node="n1", job_id=job, attempt=attempt, result="SUCCEEDED", exit_code=0,
                message="exit code 0", cpu_s=12.5, memory_peak_mb=2048,
            ),
        )  # fmt: skip
    report = api.client.get(f"/api/v1/jobs/{job}/efficiency", headers=api.as_("alice")).json()
    assert (report["cpu_s"], report["host_memory_peak_mb"]) == (12.5, 2048)
    assert report["cpu_cores_avg"] is not None
