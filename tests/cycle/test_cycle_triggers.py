"""Cycle triggers that arrive while a cycle runs (workers/scheduler.py), against a real
Redis (valkey): the trigger's key is what keeps the reports that commit during a cycle
from each sending a cycle task.

- However many commits ask for a cycle while one runs, one task is sent, and the running
  cycle goes once more, after them.
- A trigger refused just as the running cycle lets go of its lock is run all the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import redis as redis_lib

from app.config import Settings
from app.cycle.settings import SchedulerSettings
from app.messaging import SCHEDULE_CYCLE, SCHEDULER_QUEUE
from workers import scheduler as scheduler_module
from workers.runtime import Runtime


class Cycles:
    """The scheduler's cycle task on the test's database and Redis; `during_first` runs
    inside the first cycle, which `run` counts."""

    def __init__(self, api: Any, settings: Settings, redis_server: str, monkeypatch: Any):
        self.runtime = Runtime(settings.model_copy(update={"redis_url": redis_server}))
        self.runtime.__dict__["factory"] = api.factory  # the test's database, not another
        self.task = scheduler_module.build_scheduler_app(
            self.runtime.settings, SchedulerSettings(), runtime=self.runtime
        ).tasks[SCHEDULE_CYCLE]
        self.run: list[Any] = []
        self.during_first: Callable[[], None] = lambda: None
        real_run_cycle = scheduler_module.run_cycle

        def counted(**kwargs: Any) -> Any:
            self.run.append(kwargs["now"])
            if len(self.run) == 1:
                self.during_first()
            return real_run_cycle(**kwargs)

        monkeypatch.setattr(scheduler_module, "run_cycle", counted)


def test_commits_during_a_cycle_send_one_trigger_and_run_it_once_more(
    api: Any,
    settings: Settings,
    redis_server: str,
    redis: redis_lib.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cycles = Cycles(api, settings, redis_server, monkeypatch)

    def reports_commit() -> None:
        # Three reports commit during the cycle, each asking for one; the task the first
        # one sent is delivered at once, while this cycle still runs.
        cycles.runtime.messenger.request_cycle()
        assert cycles.task()["ran"] is False  # it only asks the running cycle to go again
        cycles.runtime.messenger.request_cycle()
        cycles.runtime.messenger.request_cycle()

    cycles.during_first = reports_commit
    assert cycles.task()["ran"] is True
    assert len(cycles.run) == 2
    assert redis.llen(SCHEDULER_QUEUE) == 1  # the first commit's task, and no other


class LockLettingATriggerIn:
    """A lock that delivers a trigger (`before_release`, once) after its holder has
    decided to stop, before it lets go: the moment a trigger could be lost."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.before_release: Callable[[], None] | None = None

    def acquire(self, blocking: bool = True) -> bool:
        return self._lock.acquire(blocking)

    def release(self) -> None:
        deliver, self.before_release = self.before_release, None
        if deliver is not None:
            deliver()
        self._lock.release()


def test_a_trigger_refused_as_a_cycle_ends_is_run(
    api: Any,
    settings: Settings,
    redis_server: str,
    redis: redis_lib.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    locks: list[LockLettingATriggerIn] = []

    def new_lock() -> LockLettingATriggerIn:
        locks.append(LockLettingATriggerIn())
        return locks[-1]

    monkeypatch.setattr(
        scheduler_module, "threading", SimpleNamespace(Lock=new_lock, Event=threading.Event)
    )
    cycles = Cycles(api, settings, redis_server, monkeypatch)
    [cycle_lock] = locks

    def refused() -> None:
        assert cycles.task()["ran"] is False  # the lock is still held

    cycle_lock.before_release = refused
    assert cycles.task()["ran"] is True
    assert len(cycles.run) == 2
