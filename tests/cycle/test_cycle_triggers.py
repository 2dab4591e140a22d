"""Cycle triggers that arrive while a cycle runs (workers/scheduler.py), against a real
Redis (valkey): the trigger's key is what keeps the reports that commit during a cycle
from each sending a cycle task.

- However many commits ask for a cycle while one runs, one task is sent, and the running
  cycle goes once more, after them.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis as redis_lib

from app.config import Settings
from app.cycle.settings import SchedulerSettings
from app.messaging import SCHEDULE_CYCLE, SCHEDULER_QUEUE
from workers import scheduler as scheduler_module
from workers.runtime import Runtime


def test_commits_during_a_cycle_send_one_trigger_and_run_it_once_more(
    api: Any,
    settings: Settings,
    redis_server: str,
    redis: redis_lib.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = Runtime(settings.model_copy(update={"redis_url": redis_server}))
    runtime.__dict__["factory"] = api.factory  # the test's database, not a second engine
    task = scheduler_module.build_scheduler_app(
        runtime.settings, SchedulerSettings(), runtime=runtime
    ).tasks[SCHEDULE_CYCLE]
    real_run_cycle = scheduler_module.run_cycle
    cycles: list[Any] = []

    def cycle_while_reports_commit(**kwargs: Any) -> Any:
        cycles.append(kwargs["now"])
        if len(cycles) == 1:
            # Three reports commit during the cycle, each asking for one; the task the
            # first one sent is delivered at once, while this cycle still runs.
            runtime.messenger.request_cycle()
            assert task()["ran"] is False  # it only asks the running cycle to go again
            runtime.messenger.request_cycle()
            runtime.messenger.request_cycle()
        return real_run_cycle(**kwargs)

    monkeypatch.setattr(scheduler_module, "run_cycle", cycle_while_reports_commit)
    assert task()["ran"] is True
    assert len(cycles) == 2
    assert redis.llen(SCHEDULER_QUEUE) == 1  # the first commit's task, and no other
