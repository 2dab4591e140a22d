"""A stop that reaches the agent before (or while) its run_job does: the attempt ends as
the stop asked. A preempted or requeued one must come back to the queue, not be lost as
cancelled."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.wire import Finished, Leaving
from tests.agent.support import RecordingReporter, agent_without_gpus, run, set_limit, stop
from tests.support.wait import WAIT_S
from workers.agent import service

RUN = {"job_id": 7, "attempt": 1, "command": ["sleep", "30"]}
STOP = {"job_id": 7, "attempt": 1}


@pytest.mark.parametrize(
    ("reason", "result"),
    [("cancel", "CANCELLED"), ("preempt", "PREEMPTED"), ("requeue", "PREEMPTED")],
)
def test_a_stop_before_the_run_ends_the_attempt_as_it_asked(
    tmp_path: Path, reason: str, result: str
) -> None:
    reports = RecordingReporter()
    agent = agent_without_gpus(tmp_path, reports)
    assert stop(agent, **STOP, reason=reason) == "remembered"
    assert run(agent, **RUN) == "stopped"
    [finished] = reports.of(Finished)
    assert (finished.result, finished.message) == (
        result,
        f"stopped before it started ({reason})",
    )
    assert agent.running_count() == 0


def test_a_stop_that_arrives_while_the_job_starts_is_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stop lands after run_job took the attempt and before the process is recorded
    # as running: it used to be answered "not running" and dropped.
    reports = RecordingReporter()
    agent = agent_without_gpus(tmp_path, reports)
    start = service.start_job

    def start_then_stop(launch, **kwargs):  # type: ignore[no-untyped-def]
        process = start(launch, **kwargs)
        assert stop(agent, **STOP, reason="requeue", grace_s=0) == "remembered"
        return process

    monkeypatch.setattr(service, "start_job", start_then_stop)
    assert run(agent, **RUN) == "started"
    assert reports.finished.wait(WAIT_S), reports.reports
    [finished] = reports.of(Finished)
    assert finished.result == "PREEMPTED"  # killed at once (grace 0), not after 30 s
    # A stop for an attempt that has ended is not kept for later.
    assert stop(agent, **STOP, reason="cancel") == "not running"


class _NoGpus:
    def close(self) -> None:
        pass


def test_a_run_job_delivered_while_the_agent_stops_starts_nothing(tmp_path: Path) -> None:
    # Celery finishes the messages it has fetched while it shuts down: a job started then
    # would outlive the agent. It goes back to the queue instead.
    reports = RecordingReporter()
    agent = agent_without_gpus(tmp_path, reports)
    agent.backend = _NoGpus()  # type: ignore[assignment]
    agent.stop()
    assert run(agent, **RUN) == "stopping"
    [leaving, finished] = reports.reports
    assert isinstance(leaving, Leaving) and (leaving.node, leaving.recent) == ("n1", ())
    assert isinstance(finished, Finished)
    assert (finished.result, finished.message) == (
        "PREEMPTED",
        "not started: the node's agent is stopping",
    )
    assert agent.running_count() == 0


def test_a_job_starting_as_the_agent_stops_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports = RecordingReporter()
    agent = agent_without_gpus(tmp_path, reports)
    agent.backend = _NoGpus()  # type: ignore[assignment]
    start = service.start_job

    def start_then_stop(launch, **kwargs):  # type: ignore[no-untyped-def]
        process = start(launch, **kwargs)
        agent.stop()  # nothing was running yet: it returns at once
        return process

    monkeypatch.setattr(service, "start_job", start_then_stop)
    assert run(agent, **RUN) == "started"
    assert reports.finished.wait(WAIT_S), reports.reports
    [finished] = reports.of(Finished)
    assert finished.result == "PREEMPTED"  # SIGTERM at once, not after `sleep 30`


def test_a_time_limit_change_reaches_a_job_before_while_and_after_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports = RecordingReporter()
    agent = agent_without_gpus(tmp_path, reports)
    short = {**RUN, "max_runtime_s": 0.3}
    # Before its run_job (the change overtook it): it starts with the new limit.
    assert set_limit(agent, **STOP, max_runtime_s=60) == "remembered"
    assert run(agent, **short) == "started"
    assert not reports.finished.wait(1.0), reports.reports  # 0.3 s would have ended it
    # Running: moved at once.
    assert set_limit(agent, **STOP, max_runtime_s=0.5) == "changed"
    assert reports.finished.wait(WAIT_S), reports.reports
    [finished] = reports.of(Finished)
    assert finished.result == "TIMED_OUT"
    assert set_limit(agent, **STOP, max_runtime_s=60) == "not running"

    # While it starts (after run_job took it, before it is recorded as running).
    start = service.start_job

    def start_then_change(launch, **kwargs):  # type: ignore[no-untyped-def]
        process = start(launch, **kwargs)
        assert set_limit(agent, job_id=7, attempt=2, max_runtime_s=60) == "remembered"
        return process

    monkeypatch.setattr(service, "start_job", start_then_change)
    reports.finished.clear()
    assert run(agent, **{**short, "attempt": 2}) == "started"
    assert not reports.finished.wait(1.0), reports.reports
    stop(agent, job_id=7, attempt=2, reason="cancel", grace_s=0)
    assert reports.finished.wait(WAIT_S)


def test_a_stopping_agent_reports_its_jobs_then_that_it_leaves(tmp_path: Path) -> None:
    # Its node must take no job from now on; the leaving report repeats how its last
    # attempts ended, since the scheduler may handle that report before theirs.
    reports = RecordingReporter()
    agent = agent_without_gpus(tmp_path, reports)
    agent.backend = _NoGpus()  # type: ignore[assignment]
    assert run(agent, **RUN) == "started"
    agent.stop()
    kinds = [r.KIND for r in reports.reports]
    assert kinds[-2:] == ["finished", "leaving"], kinds
    finished, leaving = reports.reports[-2:]
    assert isinstance(finished, Finished) and isinstance(leaving, Leaving)
    assert finished.result == "PREEMPTED"  # stopped for the shutdown: requeued
    assert leaving.recent == (finished,) and isinstance(leaving.taken_at, float)
