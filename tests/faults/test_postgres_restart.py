"""Stop a PRIVATE PostgreSQL server (never the machine's shared one) while jobs run and
are submitted: the API answers 503, not 500, while it is down; once it is back every
submission retried with its Idempotency-Key is stored once and every job finishes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.faults.support import (
    Traffic,
    finished_but_stuck,
    marker_command,
    probe_recovery,
    verify,
    wait_settled,
)
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

OUTAGE_S = 4.0
STUCK_AFTER_S = 30.0


def test_postgres_stop_and_restart(make_stack, record, tmp_path: Path, private_pg) -> None:
    pg = private_pg
    stack = None
    try:
        stack = make_stack(pg_admin_url=pg.url)
        runs = tmp_path / "runs"
        traffic = Traffic(
            stack, {"command": marker_command(runs, 0.5), "gpus": 1, "retries": 1}, interval=0.25
        ).start()
        poll("jobs flowing", lambda: len(traffic.ids) >= 6)
        pg.stop("fast")
        down_at = time.monotonic()

        def refused() -> bool:
            return traffic.codes_between(down_at, time.monotonic()).get(("submit", 503), 0) >= 3

        poll("the API to refuse submissions with 503", refused, interval=0.1)
        while time.monotonic() - down_at < OUTAGE_S:
            time.sleep(0.1)
        pg.start()
        up_at = time.monotonic()
        during = traffic.codes_between(down_at, up_at)

        recover = probe_recovery(stack, up_at, timeout=60)
        traffic.stop(drain_timeout=30)
        stuck = wait_settled(stack, timeout=STUCK_AFTER_S)
        verdict = verify(stack, traffic.ids, runs=runs)
        record("postgresql stop/restart (private server)", verdict.submitted,
               len(verdict.lost), len(verdict.duplicated) + len(verdict.gpu_overlaps), recover,
               f"while down: {sorted(during.items())}; {len(verdict.reruns)} ran twice"
               + (f"; STUCK: {[(j['id'], j['status']) for j in stuck]}" if stuck else ""))  # fmt: skip

        assert not traffic.server_errors(), (traffic.server_errors(), during)
        assert during.get(("submit", 503), 0) >= 3, during
        assert not verdict.duplicated and not verdict.gpu_overlaps
        # A job that ended during the outage keeps its "finished" report (retried with
        # backoff, repeated in heartbeats): none is stuck, none runs twice.
        assert not stuck, (stuck, finished_but_stuck(stuck, runs))
        verdict.assert_clean()
    finally:
        if stack is not None:
            stack.stop()  # before the server goes (the private_pg fixture removes it)
