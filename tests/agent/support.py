"""What the tests that run an Agent share: a stand-in for its Celery reporter, an agent
without GPUs, and the orders the scheduler would send it (app.wire messages)."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

from app.wire import Finished, Report, RunJob, SetTimeLimit, StopJob
from workers.agent.service import Agent, AgentSettings


def installation_of(tmp_path: Path) -> str:
    """An installation id of the test's own."""
    return "t" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:16]


RUN_AS_ROOT = {"unix_user": "root"}  # what a run_job names when the job is root's


class RecordingReporter:
    """Keeps every report; `delivered=False` plays reports lost with Redis or the agent."""

    def __init__(self, *, delivered: bool = True) -> None:
        self.delivered = delivered
        self.reports: list[Report] = []
        self.finished = threading.Event()

    def report(self, message: Report) -> bool:
        self.reports.append(message)
        if isinstance(message, Finished):
            self.finished.set()
        return self.delivered

    def of(self, kind: type[Any]) -> list[Any]:
        return [r for r in self.reports if isinstance(r, kind)]


def agent_without_gpus(tmp_path: Path, reporter: RecordingReporter, **settings: Any) -> Agent:
    """An agent on node "n1" that runs processes; nothing samples or attaches GPUs. Its
    installation is the test's own (tmp_path's name), so that agents of tests running at
    once on this host never see each other's jobs; a test's second agent is its first
    restarted."""
    settings.setdefault("installation", installation_of(tmp_path))
    return Agent(
        settings=AgentSettings(name="n1", grace_s=1.0, uid0_accounts="root", **settings),
        backend=None,  # type: ignore[arg-type]
        reporter=reporter,
        log_dir=tmp_path / "logs",
        log_cap_bytes=10_000,
        state_dir=tmp_path / "state" / "n1",
    )


def run_order(**fields: Any) -> RunJob:
    """A run_job for node n1, with the fields given."""
    return RunJob(**{"node": "n1", "master_port": 29500, **RUN_AS_ROOT, **fields})


def run(agent: Agent, *, sent_at: float | None = None, **fields: Any) -> str:
    """Deliver a run_job sent now (or at `sent_at`) to `agent`."""
    return agent.run_job(run_order(**fields), sent_at=time.time() if sent_at is None else sent_at)


def stop(agent: Agent, **fields: Any) -> str:
    return agent.stop_job(StopJob(**{"node": "n1", "reason": "cancel", **fields}))


def set_limit(agent: Agent, **fields: Any) -> str:
    return agent.set_time_limit(SetTimeLimit(**{"node": "n1", **fields}))
