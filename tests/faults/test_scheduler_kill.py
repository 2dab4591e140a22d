"""kill -9 the scheduler worker (and its beat) while many jobs are pending and being
placed, several times, restarting it each time: every job is placed and finishes
exactly once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.faults.support import (
    describe_stuck,
    finished_but_stuck,
    kill9,
    list_jobs,
    marker_command,
    probe_recovery,
    restart,
    verify,
    wait_settled,
)
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

JOBS = 48
STUCK_AFTER_S = 30.0
KILLS = 3


def test_scheduler_sigkill_mid_cycle(make_stack, record, tmp_path: Path) -> None:
    # The restarted scheduler waits out the dead one's lease (5 s here) and then works
    # through the heartbeats queued meanwhile: with the e2e 3 s heartbeat timeout its first
    # reconcile declares every node dead (see the report); production's default is 30 s.
    stack = make_stack(env={"GPUSCHED_SCHEDULER_HEARTBEAT_TIMEOUT_S": "10"})
    runs = tmp_path / "runs"
    spec = {"command": marker_command(runs, 1.0), "gpus": 1, "retries": 1}
    # The queue fills while no scheduler runs: on a loaded machine the submissions take
    # seconds, and a running scheduler would drain it before the first kill.
    kill9(stack, "scheduler")
    ids = [
        stack.api("POST", "/api/v1/jobs", json=spec, headers={"Idempotency-Key": f"k{i}"}).json()[
            "id"
        ]
        for i in range(JOBS)
    ]
    seen_kills = []
    for _ in range(KILLS):
        # Kill while the queue is still long and placements are being made.
        placed_before = len(list_jobs(stack, "SCHEDULED", "RUNNING", "SUCCEEDED"))
        restart(stack, "scheduler")
        poll(
            "the scheduler to place more jobs",
            lambda n=placed_before: len(list_jobs(stack, "SCHEDULED", "RUNNING", "SUCCEEDED")) > n,
            timeout=60,
            interval=0.02,
        )
        seen_kills.append(len(list_jobs(stack, "PENDING")))
        kill9(stack, "scheduler")
    restart(stack, "scheduler")
    restarted = time.monotonic()
    recover = probe_recovery(stack, restarted, timeout=60)
    stuck = wait_settled(stack, timeout=STUCK_AFTER_S)
    probe_ids = [j["id"] for j in list_jobs(stack) if j["id"] not in ids]
    verdict = verify(stack, ids, runs=runs)
    record(f"scheduler kill -9 x{KILLS} mid-placement", verdict.submitted, len(verdict.lost),
           len(verdict.duplicated) + len(verdict.gpu_overlaps), recover,
           f"pending at kills: {seen_kills}"
           + (f"; STUCK: {[(j['id'], j['status']) for j in stuck]}" if stuck else ""))  # fmt: skip
    assert len(probe_ids) == 1, "the idempotent submissions made extra jobs"
    assert all(p > 0 for p in seen_kills), "a kill came after the queue had drained"
    assert not verdict.duplicated and not verdict.gpu_overlaps and not verdict.reruns
    ran = finished_but_stuck(stuck, runs)
    if ran:
        pytest.xfail(
            "BUG (reported): the killed scheduler held these jobs' started/finished reports "
            "unacknowledged; they come back only after the broker's visibility timeout (300 s) "
            "and the agent ignores the re-sent run_job, so the jobs stay SCHEDULED/RUNNING "
            f"although they ran: {[(j['id'], j['status']) for j in stuck]} {ran}"
        )
    assert not stuck, describe_stuck(stack, stuck)
    verdict.assert_clean()
