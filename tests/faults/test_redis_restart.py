"""Stop the private Redis while jobs are submitted and run, keep submitting, start it
again on the same port: submissions are still accepted (the API stores jobs before it
notifies), /readyz says redis is down, and every job finishes once Redis is back."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench.common import poll
from tests.faults.support import (
    Traffic,
    finished_but_stuck,
    marker_command,
    probe_recovery,
    redis_restart,
    revive_crashed,
    verify,
    wait_settled,
)

pytestmark = pytest.mark.e2e

OUTAGE_S = 4.0
# Reports queued in Redis just before the stop are lost with it (no persistence).
REPORT_LAG_S = 2.0


def test_redis_stop_and_restart(make_stack, record, tmp_path: Path) -> None:
    stack = make_stack()
    runs = tmp_path / "runs"
    traffic = Traffic(
        stack, {"command": marker_command(runs, 0.3), "gpus": 1, "retries": 1}, interval=0.25
    ).start()
    poll("jobs flowing", lambda: len(traffic.ids) >= 6, timeout=20)
    stack.redis_server.stop()
    down_at, down_wall = time.monotonic(), time.time()
    accepted_before = len(traffic.ids)

    def outage_seen() -> bool:
        down = [r for t, code, r in traffic.readyz if t > down_at and code == 503]
        return bool(down) and len(traffic.ids) >= accepted_before + 4

    poll("submissions during the outage", outage_seen, timeout=20, interval=0.1)
    while time.monotonic() - down_at < OUTAGE_S:  # keep it down a few heartbeat periods
        time.sleep(0.1)
    redis_restart(stack)
    up_at, up_wall = time.monotonic(), time.time()
    crashed = revive_crashed(stack)
    poll("redis ready again", lambda: stack.api("GET", "/readyz", check=False).status_code == 200,
         timeout=20)  # fmt: skip
    crashed += revive_crashed(stack)
    during = traffic.codes_between(down_at, up_at)
    readyz_down = [r for t, code, r in traffic.readyz if down_at < t < up_at and code == 503]

    recover = probe_recovery(stack, up_at, timeout=60)
    traffic.stop()
    stuck = wait_settled(stack, timeout=30)
    verdict = verify(stack, traffic.ids, runs=runs)
    lost_attempts = sum(1 for j in traffic.ids for e in stack.events(j) if e["to_status"] == "LOST")
    record("redis stop/restart (same port)", verdict.submitted, len(verdict.lost),
           len(verdict.duplicated) + len(verdict.gpu_overlaps), recover,
           f"{during.get(('submit', 201), 0)} submits accepted while down; "
           f"{lost_attempts} attempts LOST; {len(verdict.reruns)} ran twice"
           + (f"; CRASHED: {[c.split(':')[0] for c in crashed]}" if crashed else "")
           + (f"; STUCK: {[(j['id'], j['status']) for j in stuck]}" if stuck else ""))  # fmt: skip

    assert during.get(("submit", 201), 0) >= 4, during
    assert not [k for k in during if k[0] == "submit" and k[1] != 201], during
    assert readyz_down and all("redis" in r["checks"] and r["checks"]["redis"] != "ok"
                               for r in readyz_down), readyz_down  # fmt: skip
    assert all(r["checks"]["database"] == "ok" for r in readyz_down)
    assert not traffic.server_errors(), traffic.server_errors()
    known = []
    # Reports an agent could not send while Redis was down are dropped: a job that finished
    # during the outage stays RUNNING, is declared LOST and runs again.
    orphaned = {j: ends for j, ends in verdict.reruns.items()
                if down_wall - REPORT_LAG_S <= ends[0][2] <= up_wall + 1.0}  # fmt: skip
    if orphaned:
        known.append(
            "BUG (reported): the agent drops its 'finished' report when Redis is down; the "
            f"job is declared LOST and runs again: {orphaned}"
        )
    verdict.reruns = {j: e for j, e in verdict.reruns.items() if j not in orphaned}
    ran = finished_but_stuck(stuck, runs)
    if stuck and not ran:
        raise AssertionError(f"stuck jobs that never ran to their end: {stuck}")
    if ran:
        stuck_ids = {f"{j['id']}:" for j in stuck}
        verdict.lost = [x for x in verdict.lost if x.split()[0] not in stuck_ids]
        known.append(
            "BUG (reported): the agent's 'finished' report was lost with Redis; the job stays "
            f"RUNNING although it ran to its end: {ran}"
        )
    verdict.assert_clean()
    if crashed and not all("'NoneType' object has no attribute 'hostname'" in c for c in crashed):
        raise AssertionError(f"processes crashed: {crashed}")
    if crashed:
        known.append(
            "BUG (reported): a Celery worker (threads pool) exits with 'Unrecoverable error: "
            "AttributeError: NoneType has no attribute hostname' when Redis goes away while "
            f"it acks a task; nothing restarts it: {crashed}"
        )
    if known:
        pytest.xfail("\n".join(known))
