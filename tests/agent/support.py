"""What the tests that run an Agent share: a stand-in for its Celery reporter, and an
agent without GPUs."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from workers.agent.service import Agent, AgentSettings


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


def agent_without_gpus(tmp_path: Path, reporter: RecordingReporter) -> Agent:
    """An agent on node "n1" that runs processes; nothing samples or attaches GPUs."""
    return Agent(
        settings=AgentSettings(name="n1", grace_s=1.0),
        backend=None,  # type: ignore[arg-type]
        reporter=reporter,
        log_dir=tmp_path / "logs",
        log_cap_bytes=10_000,
        state_dir=tmp_path / "state" / "n1",
    )
