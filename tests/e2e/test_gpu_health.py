"""What the agent reads from the GPUs decides placement: failed GPUs and GPUs busy with
processes the scheduler did not start are avoided. The simulated backend of the only
node's agent is driven through its state file while the agent runs."""

from __future__ import annotations

import pytest

from tests.support.stack import Stack
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

STACK_AGENTS = {"n1": "sim:4:H100-80GB"}

FOREIGN = {"pid": 4_999_001, "util_pct": 80.0, "memory_mb": 4096}


@pytest.fixture
def clean_node(stack: Stack):
    """Start and end with nothing injected and every GPU healthy and foreign-free."""
    stack.set_sim_state("n1")
    yield stack
    stack.set_sim_state("n1")
    poll(
        "n1 back to healthy, foreign-free, unallocated GPUs",
        lambda: all(
            g["healthy"] and g["foreign_util_pct"] == 0 and g["allocated"] == 0
            for g in stack.node("n1")["gpus"]
        ),
    )


def _sleepers(stack: Stack, count: int) -> list[int]:
    return [stack.submit({"command": "sleep 60", "gpus": 1})["id"] for _ in range(count)]


def _cancel_all(stack: Stack, ids: list[int]) -> None:
    # Pending jobs first: cancelling a running one frees a GPU, and a pending job placed on
    # it while its own cancel is in flight hits the race in test_cancel_race.py.
    pending_first = sorted(ids, key=lambda i: stack.job(i)["status"] != "PENDING")
    for job_id in pending_first:
        stack.cancel(job_id)
    for job_id in ids:
        stack.wait_status(job_id, "CANCELLED")


def test_failed_gpu_is_reported_and_avoided(clean_node: Stack) -> None:
    stack = clean_node
    stack.set_sim_state("n1", failed={0: "GPU has fallen off the bus"})
    gpu0 = poll(
        "GPU 0 unhealthy in the API",
        lambda: (g := stack.node("n1")["gpus"][0]) and not g["healthy"] and g,
    )
    assert "fallen off the bus" in gpu0["health_message"]
    assert gpu0["util_pct"] is None  # no readings from a GPU that is gone
    assert all(g["healthy"] for g in stack.node("n1")["gpus"][1:])

    ids = _sleepers(stack, 4)
    try:

        def three_running() -> list[dict] | None:
            jobs = [stack.job(i) for i in ids]
            running = [j for j in jobs if j["status"] == "RUNNING"]
            return running if len(running) == 3 else None

        placed = poll("three of four 1-GPU jobs running", three_running)
        gpus = sorted(a["gpu_index"] for j in placed for a in j["allocations"])
        assert gpus == [1, 2, 3]
        waiting = [stack.job(i) for i in ids if stack.job(i)["status"] == "PENDING"]
        assert len(waiting) == 1
        poll(
            "the fourth job to get a pending reason",
            lambda: stack.job(waiting[0]["id"])["pending_reason"],
        )
        assert stack.job(waiting[0]["id"])["allocations"] == []
    finally:
        _cancel_all(stack, ids)


def test_foreign_process_is_shown_and_avoided(clean_node: Stack) -> None:
    stack = clean_node
    stack.set_sim_state("n1", foreign={0: [FOREIGN]})
    gpu0 = poll(
        "foreign process on GPU 0 in the API",
        lambda: (g := stack.node("n1")["gpus"][0])["foreign_util_pct"] > 0 and g,
    )
    assert gpu0["foreign_memory_mb"] == FOREIGN["memory_mb"]
    assert gpu0["foreign_since"] is not None
    assert {"pid": FOREIGN["pid"], "job_id": None} in [
        {"pid": p["pid"], "job_id": p["job_id"]} for p in gpu0["processes"]
    ]

    job = stack.submit({"command": "sleep 1", "gpus": 1})
    running = stack.wait_status(job["id"], "RUNNING", "SUCCEEDED")
    events = stack.events(job["id"])
    placed_on = next(e["reason"] for e in events if e["to_status"] == "SCHEDULED")
    assert placed_on.endswith(":1") or placed_on.endswith(":2") or placed_on.endswith(":3")
    if running["status"] == "RUNNING":
        assert [a["gpu_index"] for a in running["allocations"]] != [0]
    stack.wait_status(job["id"], "SUCCEEDED")

    # Fill the other three GPUs too: all four stay taken until the first job is done.
    ids = _sleepers(stack, 3)
    try:
        for job_id in ids:
            got = stack.wait_status(job_id, "RUNNING")
            assert 0 not in [a["gpu_index"] for a in got["allocations"]]
    finally:
        _cancel_all(stack, ids)


def test_all_gpus_foreign_busy_keeps_job_pending(clean_node: Stack) -> None:
    stack = clean_node
    busy = {i: [{**FOREIGN, "pid": FOREIGN["pid"] + i}] for i in range(4)}
    stack.set_sim_state("n1", foreign=busy)
    poll(
        "every GPU foreign-busy in the API",
        lambda: all(g["foreign_util_pct"] > 0 for g in stack.node("n1")["gpus"]),
    )
    job = stack.submit({"command": "echo ran; sleep 0.2", "gpus": 1})
    pending = stack.wait_job(
        job["id"],
        lambda j: j["pending_reason"] == "foreign_process",
        "pending reason foreign_process",
    )
    assert pending["status"] == "PENDING"
    assert "foreign" in (pending["pending_message"] or "")
    # It stays pending across several scheduler cycles (interval 0.5 s), not by luck.
    scheduler_log = stack.procs["scheduler"].log

    def cycles_started() -> int:
        text = scheduler_log.read_text(errors="replace")
        return sum("schedule_cycle[" in line and "received" in line for line in text.splitlines())

    before = cycles_started()
    poll("four more scheduling cycles", lambda: cycles_started() >= before + 4)
    still = stack.job(job["id"])
    assert still["status"] == "PENDING" and still["attempt"] == 0
    assert still["pending_reason"] == "foreign_process"

    # The foreign processes go away: after the stability window the job runs.
    stack.set_sim_state("n1")
    stack.wait_status(job["id"], "SUCCEEDED")
