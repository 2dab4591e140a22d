"""What an agent reports for an attempt: its start, then its end; a job that ends at once
is reported by its end alone, which carries the pid (its end implies its start)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.wire import Register
from tests.agent.support import RecordingReporter, agent_without_gpus, run
from tests.support.wait import WAIT_S
from workers.agent import service
from workers.agent.sim_backend import SimulatedGpus


def _run(tmp_path: Path, command: list[str]) -> list[dict[str, object]]:
    reports = RecordingReporter()
    agent = agent_without_gpus(tmp_path, reports)
    assert run(agent, job_id=7, attempt=1, command=command) == "started"
    assert reports.finished.wait(WAIT_S), reports.reports
    return [
        {"kind": r.KIND, "pid": getattr(r, "pid", None), "result": getattr(r, "result", None)}
        for r in reports.reports
    ]


def test_a_job_that_ends_at_once_is_reported_by_its_end_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A generous fold, so that a slow machine cannot make `true` outlast it; the wait
    # ends as soon as the job does.
    monkeypatch.setattr(service, "_FOLD_START_S", 10.0)
    [finished] = _run(tmp_path, ["true"])
    assert finished["kind"] == "finished"
    assert finished["result"] == "SUCCEEDED"
    assert isinstance(finished["pid"], int)


def test_a_job_that_outlasts_the_fold_is_reported_started_then_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "_FOLD_START_S", 0.05)
    started, finished = _run(tmp_path, ["sleep", "0.5"])
    assert (started["kind"], started["result"]) == ("started", None)
    assert (finished["kind"], finished["result"]) == ("finished", "SUCCEEDED")
    assert started["pid"] == finished["pid"]


def test_asked_to_register_again_the_agent_says_it_is_not_a_restart(tmp_path: Path) -> None:
    # The scheduler asks (RegisterAgain) when its first Register was lost: the attempts
    # this agent runs still run, which `again` tells the scheduler.
    reports = RecordingReporter()
    agent = agent_without_gpus(tmp_path, reports)
    agent.backend = SimulatedGpus(2, "L4", hostname="n1")
    assert agent.register_again() == "registered again"
    [register] = reports.of(Register)
    assert (register.node, register.again, len(register.gpus)) == ("n1", True, 2)
