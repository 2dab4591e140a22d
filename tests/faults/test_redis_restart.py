"""Stop the private Redis while jobs are submitted and run, keep submitting, start it
again on the same port: submissions are still accepted (the API stores jobs before it
notifies), /readyz says redis is down, and every job finishes once Redis is back."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.faults.support import (
    Traffic,
    crashed,
    marker_command,
    probe_recovery,
    redis_restart,
    verify,
    wait_settled,
)
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

OUTAGE_S = 4.0


def test_redis_stop_and_restart(make_stack, record, tmp_path: Path) -> None:
    stack = make_stack()
    runs = tmp_path / "runs"
    traffic = Traffic(
        stack, {"command": marker_command(runs, 0.3), "gpus": 1, "retries": 1}, interval=0.25
    ).start()
    poll("jobs flowing", lambda: len(traffic.ids) >= 6)
    stack.redis_server.stop()
    down_at = time.monotonic()
    accepted_before = len(traffic.ids)

    def outage_seen() -> bool:
        down = [r for t, code, r in traffic.readyz if t > down_at and code == 503]
        return bool(down) and len(traffic.ids) >= accepted_before + 4

    poll("submissions during the outage", outage_seen, interval=0.1)
    while time.monotonic() - down_at < OUTAGE_S:  # keep it down a few heartbeat periods
        time.sleep(0.1)
    redis_restart(stack)
    up_at = time.monotonic()
    poll("redis ready again", lambda: stack.api("GET", "/readyz", check=False).status_code == 200,
         timeout=20)  # fmt: skip
    during = traffic.codes_between(down_at, up_at)
    readyz_down = [r for t, code, r in traffic.readyz if down_at < t < up_at and code == 503]

    recover = probe_recovery(stack, up_at, timeout=60)
    traffic.stop()
    stuck = wait_settled(stack, timeout=30)
    verdict = verify(stack, traffic.ids, runs=runs)
    dead = crashed(stack)
    lost = [(j, e["attempt"], e["at"], e["actor"], e["reason"])
            for j in traffic.ids for e in stack.events(j) if e["to_status"] == "LOST"]  # fmt: skip
    record("redis stop/restart (same port)", verdict.submitted, len(verdict.lost),
           len(verdict.duplicated) + len(verdict.gpu_overlaps), recover,
           f"{during.get(('submit', 201), 0)} submits accepted while down; "
           f"{len(lost)} attempts LOST; {len(verdict.reruns)} ran twice"
           + (f"; CRASHED: {[c.split(':')[0] for c in dead]}" if dead else "")
           + (f"; STUCK: {[(j['id'], j['status']) for j in stuck]}" if stuck else ""))  # fmt: skip

    assert not dead, f"a worker died with the Redis connection: {dead}"
    assert during.get(("submit", 201), 0) >= 4, during
    assert not [k for k in during if k[0] == "submit" and k[1] != 201], during
    assert readyz_down and all("redis" in r["checks"] and r["checks"]["redis"] != "ok"
                               for r in readyz_down), readyz_down  # fmt: skip
    assert all(r["checks"]["database"] == "ok" for r in readyz_down)
    assert not traffic.server_errors(), traffic.server_errors()
    # The agents repeat recent results in every heartbeat, and the scheduler does not judge
    # silent nodes until heartbeats have had a full timeout to resume: no job that finished
    # during the outage is left RUNNING, declared LOST, or run again.
    assert not stuck, f"jobs still active after the outage: {stuck}"
    assert not lost, f"attempts declared LOST because Redis was down: {lost}"
    verdict.assert_clean()
