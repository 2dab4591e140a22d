"""`gpusched up`'s layout: one scheduler process for cycles (`--only cycle`, with beat) and
one for agents' reports (`--only reports`), through the real stack."""

from __future__ import annotations

import pytest

from bench.common import Stack

pytestmark = pytest.mark.e2e

STACK_AGENTS = {"n1": "sim:2:H100-80GB"}
STACK_REPORTS_WORKER = True


def _tasks(stack: Stack, process: str, task: str) -> int:
    text = stack.procs[process].log.read_text(errors="replace")
    return sum(f"Task {task}[" in line and "received" in line for line in text.splitlines())


def test_cycles_and_reports_run_in_their_own_processes(stack: Stack) -> None:
    jobs = [stack.submit({"command": "true", "gpus": 1}) for _ in range(3)]
    for job in jobs:
        assert stack.wait_status(job["id"], "SUCCEEDED", "FAILED")["status"] == "SUCCEEDED"
    # The node registered and its jobs' starts and ends were reported, all to `reports`.
    assert _tasks(stack, "reports", "gpusched.agent_report") >= 1 + 2 * len(jobs)
    assert _tasks(stack, "scheduler", "gpusched.agent_report") == 0
    assert _tasks(stack, "scheduler", "gpusched.schedule_cycle") >= 1
    assert _tasks(stack, "reports", "gpusched.schedule_cycle") == 0
