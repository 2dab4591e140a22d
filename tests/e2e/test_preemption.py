"""The default policy's preemption, live (issue 41): long preemptible jobs fill the GPUs, a
short job arrives and starts within the victim's grace and a cycle; the victim checkpoints
on SIGTERM, goes back in line keeping the service it got, resumes and succeeds.

The LAS rule is scaled down to seconds through the scheduler's settings: a job moves to
the second LAS queue after 2 GPU-seconds, a preemption costs 1 s of work (so a job must
have run 2 s to be stopped) and no job is stopped before it has run 3 s."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from app.cycle.settings import SchedulerSettings
from tests.support.stack import Stack
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

STACK_AGENTS = {"n1": "sim:2:H100-80GB"}
STACK_ENV = {
    "GPUSCHED_SCHEDULER_LAS_THRESHOLDS_GPU_S": "[2, 36000]",
    "GPUSCHED_SCHEDULER_PREEMPTION_COST_S": "1",
    "GPUSCHED_SCHEDULER_MIN_RUN_BEFORE_PREEMPT_S": "3",
}
GRACE_S = 30  # the victim checkpoints at once; the agent would SIGKILL it only after this
INTERVAL_S = SchedulerSettings.model_fields["interval_s"].default  # the stack leaves it


def _training(work: Path) -> str:
    """Steps of one second until the test lets it finish; SIGTERM saves the step reached
    and ends the attempt, the next attempt starts from it."""
    state = work / "step-$GPUSCHED_JOB_ID"
    return (
        f"n=$(cat {state} 2>/dev/null || echo 0); echo attempt $GPUSCHED_ATTEMPT from step $n; "
        f"trap 'echo $n > {state}; echo checkpointed at step $n; exit 0' TERM; "
        f"while [ ! -f {work}/finish ]; do sleep 1 & wait $!; n=$((n+1)); echo step $n; done; "
        "echo trained"
    )


def test_a_short_job_preempts_a_long_one_which_resumes_and_succeeds(
    stack: Stack, work: Path
) -> None:
    long_jobs = [
        stack.submit(
            {
                "command": _training(work),
                "gpus": 1,
                "preemptible": True,
                "grace_s": GRACE_S,
                "max_runtime_s": 600,
            }
        )["id"]
        for _ in range(2)
    ]
    for job_id in long_jobs:
        stack.wait_status(job_id, "RUNNING")
    # Both have run long enough to be in the second LAS queue and past the guards, and so
    # long that a victim waits 4 x that (over 30 s) before it is promoted back to queue 0.
    for job_id in long_jobs:
        poll(f"job {job_id} at step 8", lambda j=job_id: "step 8\n" in stack.logs(j))

    short = stack.submit(
        {"command": f"until [ -f {work}/short-done ]; do sleep 0.2; done", "gpus": 1}
    )["id"]
    started = stack.wait_status(short, "RUNNING")

    stopped = {
        job_id: [
            e for e in stack.events(job_id) if e["attempt"] == 1 and "preempting" in e["reason"]
        ]
        for job_id in long_jobs
    }
    victims = [job_id for job_id, events in stopped.items() if events]
    assert len(victims) == 1, stopped  # one GPU was needed: one job stopped
    victim = victims[0]
    (decided,) = stopped[victim]
    assert decided["reason"].startswith(f"preempting for job {short}: "), decided
    # It started within the victim's grace and one cycle of the decision.
    assert datetime.fromisoformat(started["started_at"]) - datetime.fromisoformat(
        decided["at"]
    ) <= timedelta(seconds=GRACE_S + INTERVAL_S)
    assert "checkpointed at step" in stack.logs(victim, attempt=1)

    # Back in line, it keeps the service it got: the second LAS queue, not the first.
    back = stack.wait_job(victim, lambda j: j["status"] == "PENDING", "back in the queue")
    assert back["attempt"] == 1 and back["failures"] == 0  # a preemption spends no retry
    rank = poll(
        f"job {victim} ranked",
        lambda: (r := stack.api("GET", f"/api/v1/jobs/{victim}/rank").json())["ranked"] and r,
    )
    assert rank["las_queue"] == 1, rank
    other = next(j for j in long_jobs if j != victim)
    assert stack.job(other)["status"] == "RUNNING"  # the same queue: never stopped for it

    # The short job ends; the victim resumes from its checkpoint on the freed GPU.
    (work / "short-done").touch()
    assert stack.wait_status(short, "SUCCEEDED", "FAILED")["status"] == "SUCCEEDED"
    stack.wait_job(victim, lambda j: j["status"] == "RUNNING" and j["attempt"] == 2, "resumed")
    poll("attempt 2 started", lambda: "attempt 2 from step" in stack.logs(victim, attempt=2))
    assert "attempt 2 from step 0" not in stack.logs(victim, attempt=2)

    (work / "finish").touch()
    for job_id in long_jobs:
        done = stack.wait_status(job_id, "SUCCEEDED", "FAILED", "CANCELLED")
        assert (done["status"], done["attempt"]) == ("SUCCEEDED", 2 if job_id == victim else 1)
    assert "trained" in stack.logs(victim, attempt=2)
