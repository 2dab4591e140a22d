"""A heartbeat says when its lists of running and finished attempts were taken, so the
scheduler can judge one it handles late by that time (see heartbeat_taken_at)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from workers.agent.gpu_backend import NodeSample
from workers.agent.service import Agent, AgentSettings


class Reports:
    def report(self, payload: dict[str, Any]) -> bool:  # pragma: no cover - nothing sent
        return True


def test_heartbeat_carries_when_it_was_taken(tmp_path: Path) -> None:
    agent = Agent(
        settings=AgentSettings(name="n1"),
        backend=None,  # type: ignore[arg-type]  # heartbeat() reads only the sample given
        reporter=Reports(),
        log_dir=tmp_path,
        log_cap_bytes=1_000,
        state_dir=tmp_path / "state",
    )
    before = time.time()
    heartbeat = agent.heartbeat(NodeSample(taken_at=before, gpus=()))
    after = time.time()

    assert heartbeat["running"] == [] and heartbeat["recent"] == []
    assert before <= heartbeat["taken_at"] <= after
