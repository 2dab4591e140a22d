"""Reports processes replicated, as a deployment scales them (`gpusched scheduler --only
reports` twice): every job report is handled, by one or the other; heartbeats are
drained by one of them at a time, and by the other once that one stops."""

from __future__ import annotations

import signal

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.stack import FREE_PORT, Stack
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

STACK_AGENTS = {"n1": "sim:2:H100-80GB"}
STACK_REPORTS_WORKER = True
PORT = "GPUSCHED_SCHEDULER_REPORTS_METRICS_PORT"
REPLICAS = ("reports", "reports-2")
STACK_REPORTS_ENV = [{PORT: FREE_PORT} for _ in REPLICAS]


def _stored(stack: Stack, process: str) -> float:
    """Heartbeats the process's drain has stored so far."""
    port = stack.reports_env[REPLICAS.index(process)][PORT]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "gpusched_heartbeats_drained_total"
        and sample.labels.get("outcome") == "stored"
    )


def _lines(stack: Stack, text: str) -> int:
    return sum(
        text in line
        for process in REPLICAS
        for line in stack.procs[process].log.read_text(errors="replace").splitlines()
    )


def test_every_job_report_is_handled_by_one_of_the_replicas(stack: Stack) -> None:
    jobs = [stack.submit({"command": "sleep 0.3", "gpus": 1}) for _ in range(4)]
    for job in jobs:
        assert stack.wait_status(job["id"], "SUCCEEDED", "FAILED")["status"] == "SUCCEEDED"
    # Each start and end logs one line naming its attempt, in whichever process took it.
    for job in jobs:
        attempt = f"job {job['id']} attempt 1 "
        poll(f"{attempt}: start and end handled", lambda a=attempt: _lines(stack, a) >= 2)
        assert _lines(stack, attempt) == 2


def test_one_replica_drains_the_heartbeats_and_the_other_takes_over(stack: Stack) -> None:
    holder = poll("a replica storing heartbeats", lambda: next(
        (p for p in REPLICAS if _stored(stack, p) > 0), None))  # fmt: skip
    other = next(p for p in REPLICAS if p != holder)
    stored_before = _stored(stack, holder)
    poll("the holder storing more", lambda: _stored(stack, holder) > stored_before)
    assert _stored(stack, other) == 0

    stopped = stack.procs[holder]
    stopped.expected_dead = True
    stopped.popen.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    stopped.popen.wait(timeout=60)  # type: ignore[union-attr]

    # It gave its lease up as it stopped: the other drains from its next round.
    poll("the other replica storing heartbeats", lambda: _stored(stack, other) > 0)
    job = stack.submit({"command": "true", "gpus": 1})
    assert stack.wait_status(job["id"], "SUCCEEDED", "FAILED")["status"] == "SUCCEEDED"
    [node] = stack.api("GET", "/api/v1/nodes").json()
    assert node["state"] == "READY"
