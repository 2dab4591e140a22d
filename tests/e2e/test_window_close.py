"""A window closing on a running preemptible off-peak job, through the real stack: the job
sees SIGTERM its grace period before the close (and checkpoints), goes back to pending
with the window's reason, and is restarted when the window opens again.

The window opens at every minute for 30 s, so the whole story takes one to two minutes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.stack import Stack

pytestmark = pytest.mark.e2e

STACK_AGENTS = {"n1": "sim:2:H100-80GB"}
STACK_ENV = {"GPUSCHED_AGENT_GRACE_S": "5", "GPUSCHED_SCHEDULER_HEARTBEAT_TIMEOUT_S": "20"}


def _wait_for_second(low: int, high: int) -> None:
    """Block (at most a minute) until the wall clock's second is in [low, high)."""
    deadline = time.monotonic() + 65
    while not low <= time.gmtime().tm_sec < high:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_window_close_requeues_the_job_which_restarts_in_the_next_window(
    stack: Stack, work: Path
) -> None:
    stack.api(
        "POST",
        "/api/v1/windows",
        json={"name": "minutely", "timezone": "UTC", "cron": "* * * * *", "duration_s": 30},
    )
    # Checkpoint on SIGTERM: say so, then exit 0 (a preempted job is requeued however it exits).
    script = "trap 'echo checkpoint-on-sigterm; exit 0' TERM; echo started; sleep 300 & wait"
    # Submit while the window is closed (it is open in seconds 0-30 of each minute), at
    # least 10 s before it opens. A job stopped 10 s before the close has 20 s to be
    # placed and started, which a loaded machine needs.
    _wait_for_second(32, 50)
    job = stack.submit(
        {
            "command": script,
            "gpus": 1,
            "preemptible": True,
            "retries": 0,
            "schedule": {"mode": "offpeak", "window": "minutely"},
            # Stopped 10 s before the close, so that its checkpoint is done by then.
            "grace_s": 10,
        }
    )
    # While the window is closed, that is what it says. A cycle that began before the
    # close (and read the job after it, on a loaded machine) may say first that the window
    # closes within the job's grace period: the next cycle corrects it.
    waiting = stack.wait_job(
        job["id"],
        lambda j: (
            (j["pending_reason"], j["pending_message"])
            == ("window_closed", "off-peak window closed")
        ),
        "reason",
    )
    assert waiting["pending_until"] is not None  # the next opening, as data

    # The next opening is up to 28 s away (submitted at second 32-50): 40 s of slack after it.
    stack.wait_status(job["id"], "RUNNING", timeout=70)
    stack.wait_job(
        job["id"],
        lambda j: j["attempt"] == 1 and j["pending_reason"] == "window_closed",
        "requeued until the next window",
        timeout=30,
    )
    log = stack.logs(job["id"], attempt=1)
    assert "started" in log and "checkpoint-on-sigterm" in log

    restarted = stack.wait_job(
        job["id"], lambda j: j["attempt"] == 2 and j["status"] == "RUNNING", "restarted", timeout=70
    )
    assert restarted["failures"] == 0  # a preemption spends no retry
    events = stack.events(job["id"])
    steps = [(e["attempt"], e["to_status"]) for e in events]
    assert steps[:7] == [
        (0, "PENDING"),
        (1, "SCHEDULED"),
        (1, "RUNNING"),
        (1, "RUNNING"),  # "preempting: off-peak window closes in Ns ..." (no state change)
        (1, "PREEMPTED"),
        (1, "PENDING"),
        (2, "SCHEDULED"),
    ]
    assert events[3]["reason"].startswith("preempting: off-peak window closes in ")
    assert events[3]["reason"].endswith("s: stopped now so that its 10s grace period ends by then")
    stack.cancel(job["id"])
    stack.wait_status(job["id"], "CANCELLED", timeout=30)
