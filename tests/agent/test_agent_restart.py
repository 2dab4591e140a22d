"""An agent killed after a job exited but before its finished report was applied reports it
again when it restarts, so the scheduler does not take the job for a lost process and run
it a second time."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from workers.agent import service
from workers.agent.gpu_backend import NodeSample
from workers.agent.service import Agent, AgentSettings

RUN = {"job_id": 7, "attempt": 2, "command": ["true"], "gpu_indices": []}


class Reports:
    """Records reports; `delivered=False` plays a report lost with the agent (or Redis)."""

    def __init__(self, *, delivered: bool = True) -> None:
        self.delivered = delivered
        self.sent: list[dict[str, Any]] = []
        self.finished = threading.Event()

    def report(self, payload: dict[str, Any]) -> bool:
        self.sent.append(payload)
        if payload["kind"] == "finished":
            self.finished.set()
        return self.delivered


def agent(tmp_path: Path, reports: Reports) -> Agent:
    return Agent(
        settings=AgentSettings(name="n1", grace_s=1.0),
        backend=None,  # type: ignore[arg-type]  # no GPUs are sampled or attached here
        reporter=reports,
        log_dir=tmp_path / "logs",
        log_cap_bytes=10_000,
        state_dir=tmp_path / "state" / "n1",
    )


def heartbeat(a: Agent) -> dict[str, Any]:
    return a.heartbeat(NodeSample(taken_at=time.time(), gpus=()))


def finish_then_die(tmp_path: Path) -> dict[str, Any]:
    """Run a job to its end on an agent whose finished report never arrives; return it."""
    lost = Reports(delivered=False)
    first = agent(tmp_path, lost)
    assert first.run_job(dict(RUN)) == "started"
    assert lost.finished.wait(10), lost.sent
    # The agent process dies here: its memory is gone, its state directory is not.
    return next(r for r in lost.sent if r["kind"] == "finished")


def test_a_finish_whose_report_was_lost_is_reported_again_after_a_restart(
    tmp_path: Path,
) -> None:
    report = finish_then_die(tmp_path)
    assert (report["job_id"], report["attempt"], report["result"]) == (7, 2, "SUCCEEDED")

    reports = Reports()
    restarted = agent(tmp_path, reports)
    restarted.replay_finished()

    assert reports.sent == [report]
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
    restarted = agent(tmp_path, Reports())
    restarted.replay_finished()
    monkeypatch.setattr(service, "RECENT_S", -1.0)  # every entry is old now

    assert heartbeat(restarted)["recent"] == []
    assert list((tmp_path / "state" / "n1" / "finished").iterdir()) == []
    again = Reports()
    agent(tmp_path, again).replay_finished()
    assert again.sent == []


def test_an_unreadable_record_is_dropped_not_fatal(tmp_path: Path) -> None:
    records = tmp_path / "state" / "n1" / "finished"
    records.mkdir(parents=True)
    (records / "9-1.json").write_text("{half a rec")
    reports = Reports()
    restarted = agent(tmp_path, reports)

    restarted.replay_finished()

    assert reports.sent == [] and not (records / "9-1.json").exists()
    assert heartbeat(restarted)["recent"] == []


def test_a_run_sent_to_the_agent_before_this_one_is_not_started(tmp_path: Path) -> None:
    reports = Reports()
    restarted = agent(tmp_path, reports)
    stale = {**RUN, "sent_at": restarted.started_at - 5}

    assert restarted.run_job(stale) == "stale"
    assert reports.sent == [] and heartbeat(restarted)["running"] == []
    # Reconciliation sends it again when it is still due: that one runs.
    assert restarted.run_job({**RUN, "sent_at": time.time()}) == "started"
    assert reports.finished.wait(10), reports.sent
