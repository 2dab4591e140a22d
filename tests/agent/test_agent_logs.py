"""Each node of a multi-node job logs apart: on a data directory the nodes share, one
file would be overwritten by the node that opened it last."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app.wire import attempt_log_path
from tests.agent.support import RecordingReporter, installation_of, run
from tests.support.wait import WAIT_S
from workers.agent.service import Agent, AgentSettings


def _agent(tmp_path: Path, name: str, reporter: RecordingReporter) -> Agent:
    return Agent(
        settings=AgentSettings(
            name=name, grace_s=1.0, installation=installation_of(tmp_path), uid0_accounts="root"
        ),
        backend=None,  # type: ignore[arg-type]
        reporter=reporter,
        log_dir=tmp_path / "logs",  # shared, as the data directory is
        log_cap_bytes=10_000,
        state_dir=tmp_path / "state" / name,
    )


def test_the_nodes_of_a_multi_node_job_write_their_own_logs(tmp_path: Path) -> None:
    outputs = {}
    for rank, node in enumerate(("n1", "n2")):
        reporter = RecordingReporter()
        order = {
            "node": node, "job_id": 7, "attempt": 1, "node_rank": rank, "world_size": 2,
            "command": ["sh", "-c", f"echo output of {node}"], "master_addr": "n1",
        }  # fmt: skip
        assert run(_agent(tmp_path, node, reporter), **order) == "started"
        assert reporter.finished.wait(WAIT_S), reporter.reports
        outputs[rank] = attempt_log_path(tmp_path / "logs", 7, 1, rank)
    assert outputs[0].name == "attempt-1.log"  # a one-node job's file, as before
    assert outputs[0].read_text() == "output of n1\n"
    assert outputs[1].read_text() == "output of n2\n"


def test_a_start_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The runner and the agent each logged it: two lines a job in a node's log.
    reporter = RecordingReporter()
    caplog.set_level(logging.INFO)
    order = {"node": "n1", "job_id": 8, "attempt": 1, "command": ["true"]}
    assert run(_agent(tmp_path, "n1", reporter), **order) == "started"
    assert reporter.finished.wait(WAIT_S), reporter.reports
    starts = [r.getMessage() for r in caplog.records if "started" in r.getMessage()]
    assert len(starts) == 1 and "job 8 attempt 1" in starts[0], starts
