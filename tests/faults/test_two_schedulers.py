"""Two scheduler workers at once (a second `gpusched scheduler --no-beat` on the same
queues): cycles serialise on the database lease, so no GPU is ever held by two jobs and
no job runs two attempts at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.faults.support import Traffic, marker_command, spawn_extra, verify, wait_all_done
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

BURST = 40


def test_two_schedulers(make_stack, record, tmp_path: Path) -> None:
    stack = make_stack()
    second = spawn_extra(
        stack, "scheduler2", "scheduler", [*stack.procs["scheduler"].argv, "--no-beat"]
    )

    # The burst drains in a few seconds, about as long as a worker takes to start on a busy
    # machine: only a second scheduler already consuming can be shown to take cycles.
    def consuming() -> bool:
        assert second.alive(), f"the second scheduler exited:\n{second.tail()}"
        return "ready." in second.log.read_text(errors="replace")

    poll("the second scheduler's consumer", consuming, timeout=60, on_timeout=stack.tails)
    runs = tmp_path / "runs"
    started = time.monotonic()
    ids = []
    for i in range(BURST):
        spec = {"command": marker_command(runs, 0.3), "gpus": 1 + i % 2}
        ids.append(
            stack.api(
                "POST", "/api/v1/jobs", json=spec, headers={"Idempotency-Key": f"b{i}"}
            ).json()["id"]
        )
    traffic = Traffic(
        stack, {"command": marker_command(runs, 0.2), "gpus": 2}, interval=0.2, limit=20
    ).start()
    wait_all_done(stack, timeout=90)
    traffic.stop()
    wait_all_done(stack, timeout=60)
    took = time.monotonic() - started
    verdict = verify(stack, ids + traffic.ids, runs=runs)

    def cycles(label: str) -> int:
        text = stack.procs[label].log.read_text(errors="replace")
        return sum(1 for line in text.splitlines() if "cycle: placed" in line)

    ran = (cycles("scheduler"), cycles("scheduler2"))
    record("two schedulers at once", verdict.submitted, len(verdict.lost),
           len(verdict.duplicated) + len(verdict.gpu_overlaps), None,
           f"placing cycles run by each: {ran}; drained in {took:.1f}s")  # fmt: skip
    assert second.alive()
    assert not traffic.server_errors()
    verdict.assert_clean()
    assert min(ran) >= 1, f"both schedulers should have run cycles: {ran}"
