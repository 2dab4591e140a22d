"""A heartbeat says when its lists of running and finished attempts were taken, so the
scheduler can judge one it handles late by that time (see heartbeat_taken_at)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.agent.support import RecordingReporter, agent_without_gpus
from workers.agent.gpu_backend import NodeSample


def test_heartbeat_carries_when_it_was_taken(tmp_path: Path) -> None:
    agent = agent_without_gpus(tmp_path, RecordingReporter())  # heartbeat() reads the sample
    before = time.time()
    heartbeat = agent.heartbeat(NodeSample(taken_at=before, gpus=()))
    after = time.time()

    assert heartbeat.running == () and heartbeat.recent == ()
    assert heartbeat.taken_at is not None and before <= heartbeat.taken_at <= after
