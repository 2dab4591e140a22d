"""A job finishes while a dependency is down; once it is back the job must be SUCCEEDED,
attempt 1, within a few seconds, never LOST and run again.

Redis down: the agent cannot send its "finished" report, but every heartbeat repeats the
results of recent attempts, so the first heartbeat after the outage settles the job. The
agent keeps those results on disk too: killed during the outage and started again, it
reports them again.
PostgreSQL down: the scheduler's report task fails and is retried with backoff.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.support import (
    kill9,
    redis_restart,
    wait_status_alive,
)
from tests.support.stack import Stack
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

# Long enough that no node is declared dead during the outage: only the report matters.
ENV = {"GPUSCHED_SCHEDULER_HEARTBEAT_TIMEOUT_S": "30"}


def _gated_job(stack: Stack, gate: Path) -> dict:
    job = stack.submit(
        {"command": f"while [ ! -e {gate} ]; do sleep 0.05; done", "gpus": 1, "retries": 1}
    )
    stack.wait_status(job["id"], "RUNNING")
    return job


def _finish_during(stack: Stack, job: dict, gate: Path, log_label: str, needle: str) -> None:
    """Open the gate and wait until the job's end was reported into the outage."""
    gate.touch()
    log = stack.procs[log_label].log
    poll(f"{needle!r} in {log}", lambda: needle in log.read_text(errors="replace"))


def test_finished_report_survives_redis_outage(make_stack, tmp_path: Path) -> None:
    stack = make_stack(agents={"n1": "sim:2:H100-80GB"}, env=ENV)
    gate = tmp_path / "gate"
    job = _gated_job(stack, gate)
    stack.redis_server.stop()
    try:
        _finish_during(
            stack, job, gate, f"agent-{stack.name('n1')}", "could not send report finished"
        )
    finally:
        redis_restart(stack)
    done = wait_status_alive(stack, job["id"], "SUCCEEDED", "FAILED", timeout=30)
    assert done["status"] == "SUCCEEDED" and done["attempt"] == 1


def test_finished_report_survives_an_agent_killed_during_redis_outage(
    make_stack, tmp_path: Path
) -> None:
    stack = make_stack(agents={"n1": "sim:2:H100-80GB"}, env=ENV)
    gate = tmp_path / "gate"
    job = _gated_job(stack, gate)
    agent = f"agent-{stack.name('n1')}"
    stack.redis_server.stop()
    try:
        _finish_during(stack, job, gate, agent, "could not send report finished")
        kill9(stack, agent)  # the unsent report and the heartbeats' memory die with it
    finally:
        redis_restart(stack)
    stack.start_agent("n1")
    done = wait_status_alive(stack, job["id"], "SUCCEEDED", "FAILED", "LOST", timeout=30)
    assert done["status"] == "SUCCEEDED" and done["attempt"] == 1, done
    assert "finished before the restart: reporting again" in stack.agent("n1").log.read_text()


def test_finished_report_survives_database_outage(make_stack, tmp_path: Path, private_pg) -> None:
    pg = private_pg
    stack = None
    try:
        stack = make_stack(pg_admin_url=pg.url, agents={"n1": "sim:2:H100-80GB"}, env=ENV)
        gate = tmp_path / "gate"
        job = _gated_job(stack, gate)
        pg.stop("fast")
        try:
            gate.touch()
            poll("the job process to end", lambda: not stack.job_processes("n1"))
            # The agent has sent its "finished" report into the outage (it meets the dead
            # database and must be retried, not dropped).
            agent_log = stack.procs[f"agent-{stack.name('n1')}"].log
            poll(
                "the agent to report the end",
                lambda: f"job {job['id']} attempt 1 SUCCEEDED" in agent_log.read_text(),
            )
        finally:
            pg.start()
        done = stack.wait_status(job["id"], "SUCCEEDED", "FAILED")
        assert done["status"] == "SUCCEEDED" and done["attempt"] == 1
    finally:
        if stack is not None:
            stack.stop()  # before the server goes (the private_pg fixture removes it)
