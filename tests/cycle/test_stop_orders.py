"""stop_job messages for many jobs at once (a bulk cancel, a node's requeue, a batch's
replace): one per node holding each job's current attempt, read in one query."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

from app.db import utcnow
from app.jobs.agent_reports import job_finished
from app.jobs.orders import stop_orders
from app.wire import Finished, StopJob
from tests.cycle.jobs_api import get_job, run_one_cycle, submit
from tests.foundation.builders import ready_node


def test_one_stop_per_node_of_each_current_attempt_in_one_query(api):
    with api.factory.begin() as session:
        session.add_all([ready_node(f"n{i}", gpus=1, now=utcnow()) for i in (1, 2, 3, 4)])
    gang = submit(api, name="gang", nodes=2)["id"]  # on two of the nodes
    single = submit(api, name="single")["id"]
    done = submit(api, name="done")["id"]
    run_one_cycle(api)
    waiting = submit(api, name="waiting")["id"]  # no GPU left: never placed
    placed = {j: get_job(api, j) for j in (gang, single, done)}
    assert {j["status"] for j in placed.values()} == {"SCHEDULED"}
    with api.factory.begin() as session:  # `done` ends: its allocation is released
        node = placed[done]["allocations"][0]["node"]
        report = Finished(job_id=done, attempt=1, node=node, result="SUCCEEDED")
        assert job_finished(session=session, report=report).accepted

    statements: list[str] = []

    def count(*args: Any) -> None:
        if args[2].lstrip().startswith("SELECT"):  # not SQLite's BEGIN
            statements.append(args[2])

    attempts = {gang: 1, single: 1, done: 1, waiting: 0}
    with api.factory() as session:
        event.listen(session.get_bind(), "before_cursor_execute", count)
        try:
            stops = stop_orders(session, attempts, reason="cancel", grace_s=0)
        finally:
            event.remove(session.get_bind(), "before_cursor_execute", count)
        # Asked for one job, the same for it.
        assert stop_orders(session, {gang: 1}, reason="cancel", grace_s=0) == [
            s for s in stops if s.job_id == gang
        ]
        # An attempt that is not the one placed gets no stop.
        assert stop_orders(session, {single: 2}, reason="cancel") == []
    assert len(statements) == 1
    gang_nodes = sorted({a["node"] for a in placed[gang]["allocations"]})
    assert len(gang_nodes) == 2
    assert [(s.node, s.job_id) for s in stops] == [
        *((node, gang) for node in gang_nodes),
        (stops[-1].node, single),
    ]
    assert all(
        s == StopJob(node=s.node, job_id=s.job_id, attempt=1, reason="cancel", grace_s=0)
        for s in stops
    )
