"""A two-node job through the real stack: it ends with its last node (the first rank
writes its checkpoint after the other is done), and each node's output is kept apart."""

from __future__ import annotations

import pytest

from tests.support.stack import Stack
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

STACK_AGENTS = {"n1": "sim:1:H100-80GB", "n2": "sim:1:H100-80GB"}


def test_a_gang_runs_until_its_last_node_ends(stack: Stack) -> None:
    command = (
        'if [ "$NODE_RANK" = 0 ]; then sleep 2; echo "rank 0 saved the checkpoint"; '
        'else echo "rank 1 done"; fi'
    )
    job = stack.submit({"command": command, "gpus": 1, "nodes": 2})
    done = stack.wait_status(job["id"], "SUCCEEDED", "FAILED", timeout=30)
    assert (done["status"], done["exit_code"]) == ("SUCCEEDED", 0)
    assert stack.logs(job["id"]) == "rank 0 saved the checkpoint\n"
    rank_1 = stack.api("GET", f"/api/v1/jobs/{job['id']}/logs", params={"node_rank": 1})
    assert (rank_1.text, rank_1.headers["X-Nodes"]) == ("rank 1 done\n", "2")
    reasons = [e["reason"] for e in stack.events(job["id"])]
    assert any("ended (exit code 0); 1 node(s) to go" in r for r in reasons), reasons


def test_a_failing_node_ends_the_gang_and_its_other_node_is_stopped(stack: Stack) -> None:
    command = 'if [ "$NODE_RANK" = 0 ]; then sleep 60; else exit 3; fi'
    job = stack.submit({"command": command, "gpus": 1, "nodes": 2})
    done = stack.wait_status(job["id"], "SUCCEEDED", "FAILED", timeout=30)
    assert (done["status"], done["exit_code"]) == ("FAILED", 3)
    # Rank 0 would wait for rank 1 forever: its agent is told to stop it.
    poll(
        "rank 0 stopped",
        lambda: "SIGTERM" in stack.logs(job["id"]) or None,
    )
    assert stack.node("n1")["gpus_allocated"] == 0 and stack.node("n2")["gpus_allocated"] == 0
