"""What the tests that run an Agent share: a stand-in for its Celery reporter, and an
agent without GPUs."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

from workers.agent.service import Agent, AgentSettings


def installation_of(tmp_path: Path) -> str:
    """An installation id of the test's own."""
    return "t" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:16]


RUN_AS_ROOT = {"unix_user": "root"}  # what a run_job names when the job is root's


class RecordingReporter:
    """Keeps every report; `delivered=False` plays reports lost with Redis or the agent."""

    def __init__(self, *, delivered: bool = True) -> None:
        self.delivered = delivered
        self.reports: list[dict[str, Any]] = []
        self.finished = threading.Event()

    def report(self, payload: dict[str, Any]) -> bool:
        self.reports.append(payload)
        if payload["kind"] == "finished":
            self.finished.set()
        return self.delivered


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
