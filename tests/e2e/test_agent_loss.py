"""An agent killed with SIGKILL mid-job: the scheduler notices the missing heartbeats,
marks the attempt LOST, and requeues it onto the other node; the attempt number fences
off anything the dead agent (or its orphaned job) could still say."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.stack import Stack
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

STACK_AGENTS = {"n1": "sim:4:H100-80GB", "n2": "sim:4:H100-80GB"}
# The suite's heartbeat timeout (10 s): at 3 s, a loaded machine's late heartbeats made
# the surviving node look lost too.


def _proc_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def _submit_and_kill_its_agent(stack: Stack, work: Path) -> tuple[dict, str, str, int]:
    """Start a 4-GPU job (retries: 1) and SIGKILL the agent it runs under. Returns the
    job, the dead node's short name, the other node's short name, and the pid of the
    attempt-1 job process."""
    runs = work / "runs"
    job = stack.submit(
        {
            "command": (
                f'echo "$GPUSCHED_ATTEMPT $GPUSCHED_NODE $$" >> {runs}; '
                'if [ "$GPUSCHED_ATTEMPT" = 1 ]; then sleep 120; else sleep 1; fi'
            ),
            "gpus": 4,
            "retries": 1,
        }
    )
    running = stack.wait_status(job["id"], "RUNNING")
    real = running["allocations"][0]["node"]
    dead = next(short for short, name in stack.node_names.items() if name == real)
    other = next(short for short in stack.node_names if short != dead)
    line = poll("attempt 1 pid", lambda: runs.exists() and runs.read_text().split())
    assert line[:2] == ["1", real]
    job_pid = int(line[2])
    agent = stack.agent(dead)
    agent.expected_dead = True
    os.kill(agent.pid, signal.SIGKILL)
    agent.popen.wait(timeout=10)
    return job, dead, other, job_pid


def test_killed_agent_job_is_lost_then_requeued_on_the_other_node(stack: Stack, work: Path) -> None:
    job, dead, other, job_pid = _submit_and_kill_its_agent(stack, work)

    done = stack.wait_job(
        job["id"],
        lambda j: j["status"] in ("SUCCEEDED", "FAILED") or j["attempt"] > 2,
        "finished after the requeue",
        timeout=60,
    )
    assert done["status"] == "SUCCEEDED" and done["attempt"] == 2
    dead_node = stack.node(dead)
    assert dead_node["state"] == "NOT_READY"
    assert "no heartbeat" in dead_node["health_message"]

    events = stack.events(job["id"])
    steps = [(e["attempt"], e["to_status"]) for e in events]
    assert steps == [
        (0, "PENDING"),
        (1, "SCHEDULED"),
        (1, "RUNNING"),
        (1, "LOST"),
        (1, "PENDING"),
        (2, "SCHEDULED"),
        (2, "RUNNING"),
        (2, "SUCCEEDED"),
    ]
    at = {(e["attempt"], e["to_status"]): e["at"] for e in events}
    # In the database, attempt 2 starts only after attempt 1 was given up.
    assert at[(1, "LOST")] <= at[(2, "SCHEDULED")] < at[(2, "RUNNING")]
    assert stack.name(dead) in next(e["reason"] for e in events if e["to_status"] == "LOST")
    second = next(e for e in events if e["attempt"] == 2 and e["to_status"] == "SCHEDULED")
    assert second["reason"].startswith(f"placed on {stack.name(other)}:")

    # The dead agent's watchdog stopped its job; a restarted agent finds no leftovers and
    # the node comes back READY.
    assert not _proc_alive(job_pid)
    stack.start_agent(dead)
    stack.wait_nodes_ready([dead], timeout=30)
    assert stack.job_processes(dead) == []
    final = stack.job(job["id"])
    assert final["status"] == "SUCCEEDED" and final["attempt"] == 2
    assert [(e["attempt"], e["to_status"]) for e in stack.events(job["id"])] == steps


def test_killed_agents_job_process_does_not_outlive_the_requeue(stack: Stack, work: Path) -> None:
    job, _dead, _other, job_pid = _submit_and_kill_its_agent(stack, work)
    try:
        stack.wait_job(
            job["id"],
            lambda j: j["attempt"] == 2 and j["status"] in ("RUNNING", "SUCCEEDED"),
            "attempt 2 started",
            timeout=60,
        )
        assert not _proc_alive(job_pid), "attempt 1 still running while attempt 2 runs"
    finally:
        if _proc_alive(job_pid):  # the whole leftover group (the shell leads it)
            os.killpg(job_pid, signal.SIGKILL)
        stack.wait_status(job["id"], "SUCCEEDED", "FAILED", timeout=30)
