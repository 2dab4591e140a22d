"""What an agent reports for an attempt: its start, then its end; a job that ends at once
is reported by its end alone, which carries the pid (its end implies its start)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent.support import RUN_AS_ROOT, RecordingReporter, agent_without_gpus
from workers.agent import service


def _run(tmp_path: Path, command: list[str]) -> list[dict[str, object]]:
    reports = RecordingReporter()
    agent = agent_without_gpus(tmp_path, reports)
    assert agent.run_job(
        {"job_id": 7, "attempt": 1, "command": command, "gpu_indices": [], **RUN_AS_ROOT}
    ) == ("started")
    assert reports.finished.wait(10), reports.reports
    return [
        {k: r[k] for k in ("kind", "job_id", "attempt", "pid") if k in r}
        | {"result": r.get("result")}
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
