"""`gpusched up`'s layout: one scheduler process for cycles (`--only cycle`, with beat) and
one for agents' reports (`--only reports`), through the real stack."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.stack import FREE_PORT, Stack
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

STACK_AGENTS = {"n1": "sim:2:H100-80GB"}
STACK_REPORTS_WORKER = True
CYCLE_PORT, REPORTS_PORT = (
    "GPUSCHED_SCHEDULER_METRICS_PORT",
    "GPUSCHED_SCHEDULER_REPORTS_METRICS_PORT",
)
STACK_ENV = {CYCLE_PORT: FREE_PORT, REPORTS_PORT: FREE_PORT}


def _tasks(stack: Stack, process: str, task: str) -> int:
    text = stack.procs[process].log.read_text(errors="replace")
    return sum(f"Task {task}[" in line and "received" in line for line in text.splitlines())


def _lines(stack: Stack, process: str, text: str) -> int:
    log = stack.procs[process].log.read_text(errors="replace")
    return sum(text in line for line in log.splitlines())


def test_cycles_and_reports_run_in_their_own_processes(stack: Stack) -> None:
    # Jobs that outlast the agent's fold, so each one's start is reported on its own.
    jobs = [stack.submit({"command": "sleep 0.3", "gpus": 1}) for _ in range(3)]
    for job in jobs:
        assert stack.wait_status(job["id"], "SUCCEEDED", "FAILED")["status"] == "SUCCEEDED"
    # The node registered and its jobs' starts and ends were handled by the reports
    # process's drains (no Celery worker there), cycles by the scheduler's Celery. Each
    # report logs one line naming its attempt: applied ("job 2 attempt 1 started"), or
    # found already applied by a heartbeat or by its end, which another drain may apply
    # first ("ignored started report: job 2 attempt 1 is already SUCCEEDED"); a report
    # found so may be handled after the job's status was read.
    assert _lines(stack, "reports", "n1 registered") >= 1
    for job in jobs:
        attempt = f"job {job['id']} attempt 1 "
        poll(
            f"{attempt}: start and end handled", lambda a=attempt: _lines(stack, "reports", a) >= 2
        )
    assert _lines(stack, "scheduler", "gpusched.reports") == 0
    assert _tasks(stack, "scheduler", "gpusched.schedule_cycle") >= 1
    assert _lines(stack, "reports", "gpusched.schedule_cycle") == 0


def _samples(stack: Stack, port: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://127.0.0.1:{stack.env_overrides[port]}/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_each_process_serves_the_metrics_it_counts(stack: Stack) -> None:
    job = stack.submit({"command": "sleep 0.3", "gpus": 1})  # its start reported on its own
    assert stack.wait_status(job["id"], "SUCCEEDED", "FAILED")["status"] == "SUCCEEDED"
    reports, cycles = _samples(stack, REPORTS_PORT), _samples(stack, CYCLE_PORT)
    handled = "gpusched_agent_report_seconds_count"
    assert reports[(handled, (("kind", "register"),))] >= 1
    assert reports[(handled, (("kind", "started"),))] >= 1
    assert reports[(handled, (("kind", "finished"),))] >= 1
    assert (handled, (("kind", "finished"),)) not in cycles
    # Its queue wait, observed where its start was recorded, once.
    assert reports[("gpusched_queue_wait_seconds_count", ())] >= 1
    assert cycles.get(("gpusched_queue_wait_seconds_count", ()), 0) == 0
    assert cycles[("gpusched_scheduling_cycle_seconds_count", (("kind", "full"),))] >= 1
    assert not any(name.startswith("gpusched_scheduling_cycle") for name, _ in reports)


def test_a_backlog_of_heartbeats_does_not_delay_a_jobs_reports(stack: Stack) -> None:
    # A node with no GPU (no job goes there) whose agent sends far more heartbeats than
    # one process stores one by one: 3,000 of them, queued before the job is submitted.
    # They reach the heartbeats queue at once (one Redis transaction moves them from a
    # staging queue): sent one by one on a loaded machine, the drain took them as they
    # came, one pass each, and stored most of them, which says nothing about the queue.
    import time

    import redis

    from app.wire import AGENT_REPORT, HEARTBEATS_QUEUE, Heartbeat, Register, seal

    node = stack.name("hb-flood")
    stack.send_report(Register(node=node))
    staging, key = f"{node}-staging", stack.node_key(node)
    for _ in range(3000):
        heartbeat = seal(Heartbeat(node=node, taken_at=time.time()), key=key)
        stack.celery.send_task(AGENT_REPORT, kwargs=heartbeat, queue=staging)
    client = redis.Redis.from_url(stack.redis_url)
    with client.pipeline(transaction=True) as moves:
        for _ in range(3000):  # oldest first, as kombu pushes left and pops right
            moves.lmove(staging, HEARTBEATS_QUEUE, "RIGHT", "LEFT")
        moves.execute()
    client.close()
    job = stack.submit({"command": "sleep 0.3", "gpus": 1})
    assert stack.wait_status(job["id"], "SUCCEEDED", "FAILED")["status"] == "SUCCEEDED"
    # The job's start and end did not wait for the heartbeats queued before them to be
    # stored (one at a time behind them in one queue, they would all have been): the
    # flood's newest once per drain pass, plus the real agent's own.
    reports = _samples(stack, REPORTS_PORT)
    stored_one_by_one = reports.get(
        ("gpusched_agent_report_seconds_count", (("kind", "heartbeat"),)), 0
    )
    stored_in_batches = reports.get(
        ("gpusched_heartbeats_drained_total", (("outcome", "stored"),)), 0
    )
    superseded = reports.get(("gpusched_heartbeats_drained_total", (("outcome", "superseded"),)), 0)
    assert stored_one_by_one == 0
    # At most 100 of the flood stored: the rest were superseded by a newer one of theirs in
    # the same pass. Not a bound on `stored_in_batches`, which also counts the real agents'
    # heartbeats for as long as the job takes (110 at load 13, a run of make test-under-load).
    assert superseded >= 2900
    assert stored_in_batches > 0
