"""An agent killed after a job exited but before its finished report was applied reports it
again when it restarts, so the scheduler does not take the job for a lost process and run
it a second time."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.agent.support import RUN_AS_ROOT, RecordingReporter, agent_without_gpus
from workers.agent import service
from workers.agent.gpu_backend import NodeSample
from workers.agent.service import Agent

RUN = {"job_id": 7, "attempt": 2, "command": ["true"], "gpu_indices": [], **RUN_AS_ROOT}


def heartbeat(a: Agent) -> dict[str, Any]:
    return a.heartbeat(NodeSample(taken_at=time.time(), gpus=()))


def finish_then_die(tmp_path: Path) -> dict[str, Any]:
    """Run a job to its end on an agent whose finished report never arrives; return it."""
    lost = RecordingReporter(delivered=False)
    first = agent_without_gpus(tmp_path, lost)
    assert first.run_job(dict(RUN)) == "started"
    assert lost.finished.wait(10), lost.reports
    # The agent process dies here: its memory is gone, its state directory is not.
    return next(r for r in lost.reports if r["kind"] == "finished")


def test_a_finish_whose_report_was_lost_is_reported_again_after_a_restart(
    tmp_path: Path,
) -> None:
    report = finish_then_die(tmp_path)
    assert (report["job_id"], report["attempt"], report["result"]) == (7, 2, "SUCCEEDED")

    reports = RecordingReporter()
    restarted = agent_without_gpus(tmp_path, reports)
    restarted.replay_finished()

    assert reports.reports == [report]
    # Heartbeats repeat it (the scheduler applies it from there if the report is lost
    # again), and never list the attempt as running.
    beat = heartbeat(restarted)
    assert beat["recent"] == [report] and beat["running"] == []
    # A run_job message delivered again after the restart does not run the job twice.
    assert restarted.run_job(dict(RUN)) == "duplicate"


def test_the_record_goes_when_the_heartbeats_stop_repeating_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    finish_then_die(tmp_path)
    restarted = agent_without_gpus(tmp_path, RecordingReporter())
    restarted.replay_finished()
    monkeypatch.setattr(service, "RECENT_S", -1.0)  # every entry is old now

    assert heartbeat(restarted)["recent"] == []
    assert list((tmp_path / "state" / "n1" / "finished").iterdir()) == []
    again = RecordingReporter()
    agent_without_gpus(tmp_path, again).replay_finished()
    assert again.reports == []


def test_an_unreadable_record_is_dropped_not_fatal(tmp_path: Path) -> None:
    records = tmp_path / "state" / "n1" / "finished"
    records.mkdir(parents=True)
    (records / "9-1.json").write_text("{half a rec")
    reports = RecordingReporter()
    restarted = agent_without_gpus(tmp_path, reports)

    restarted.replay_finished()

    assert reports.reports == [] and not (records / "9-1.json").exists()
    assert heartbeat(restarted)["recent"] == []


def test_a_run_sent_to_the_agent_before_this_one_is_not_started(tmp_path: Path) -> None:
    reports = RecordingReporter()
    restarted = agent_without_gpus(tmp_path, reports)
    stale = {**RUN, "sent_at": restarted.started_at - 5}

    assert restarted.run_job(stale) == "stale"
    assert reports.reports == [] and heartbeat(restarted)["running"] == []
    # Reconciliation sends it again when it is still due: that one runs.
    assert restarted.run_job({**RUN, "sent_at": time.time()}) == "started"
    assert reports.finished.wait(10), reports.reports
