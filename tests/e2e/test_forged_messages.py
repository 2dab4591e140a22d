"""No job can speak for the scheduler or an agent (issue 32, point 3), through the real
stack: Redis wants a password the job never sees; a report or an order that reaches
Redis anyway is believed only if sealed with the key of the node it names, for an
attempt placed there; an order is obeyed once. Each refusal is logged, counted in
/metrics and changes nothing."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.wire import (
    AGENT_REPORT,
    ORDER_TTL_S,
    RUN_JOB,
    SET_TIME_LIMIT,
    Finished,
    RunJob,
    SetTimeLimit,
    dump,
    node_queue,
    seal,
)
from tests.support.stack import FREE_PORT, Stack
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

STACK_AGENTS = {"n1": "sim:2:H100-80GB"}
STACK_REPORTS_WORKER = True
REPORTS_PORT, AGENT_PORT = "GPUSCHED_SCHEDULER_REPORTS_METRICS_PORT", "GPUSCHED_AGENT_METRICS_PORT"
STACK_ENV = {REPORTS_PORT: FREE_PORT, AGENT_PORT: FREE_PORT}


def _refused(stack: Stack, port: str, kind: str, reason: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{stack.env_overrides[port]}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpusched_refused_messages_total" and sample.labels == {
                "kind": kind,
                "reason": reason,
            }:
                return sample.value
    return 0.0


def _wait_refused(stack: Stack, port: str, kind: str, reason: str, before: float) -> None:
    poll(
        f"a {kind} message refused as {reason}",
        lambda: _refused(stack, port, kind, reason) > before,
        timeout=30,
    )


def _running(stack: Stack, command: str | list[str], **spec: Any) -> dict[str, Any]:
    job = stack.submit({"command": command, "gpus": 1, **spec})
    return stack.wait_status(job["id"], "RUNNING", timeout=60)


def test_a_forged_finished_report_is_refused_and_the_job_runs_on(stack: Stack) -> None:
    job = _running(stack, "sleep 120")
    node, other = stack.name("n1"), stack.name("n2")
    events = stack.events(job["id"])
    claim = Finished(node=node, job_id=job["id"], attempt=job["attempt"], result="SUCCEEDED")
    forgeries = [
        # As before the wire was sealed: the report alone (what a job could write).
        ({"payload": {"kind": "finished", **_plain(claim)}}, "unknown", "unsigned"),
        # Signed with another node's key, naming this one.
        (seal(claim, key=stack.node_key(other)), "finished", "bad_signature"),
        # Another node, signing as itself, about the attempt placed on this one.
        (
            seal(replace(claim, node=other), key=stack.node_key(other)),
            "finished",
            "not_placed_here",
        ),
    ]
    for kwargs, kind, reason in forgeries:
        before = _refused(stack, REPORTS_PORT, kind, reason)
        stack.celery.send_task(AGENT_REPORT, kwargs=kwargs)
        _wait_refused(stack, REPORTS_PORT, kind, reason, before)
        now = stack.job(job["id"])
        assert (now["status"], now["attempt"], now["exit_code"]) == ("RUNNING", 1, None)
    assert stack.events(job["id"]) == events
    reports_log = stack.procs["reports"].log.read_text(errors="replace")
    assert "scheduler refused a message (finished): not_placed_here" in reports_log
    assert stack.node(node)["state"] == "READY"  # its agent's own heartbeats still count
    stack.cancel(job["id"])
    stack.wait_status(job["id"], "CANCELLED", timeout=30)


def _plain(message: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(dump(message))
    return data


def test_a_job_sees_no_broker_secret_and_redis_refuses_it(stack: Stack, work: Path) -> None:
    """From inside a job: its environment holds no broker URL, password or node key, and
    the Redis it can reach on loopback refuses it without the password."""
    port = stack.redis_url.rsplit(":", 1)[1].split("/")[0]
    probe = (
        "import os, redis\n"
        "print(sorted(os.environ.items()))\n"
        f"r = redis.Redis(host='127.0.0.1', port={port})\n"
        "for attempt in (lambda: r.lpush('reports', 'forged'), lambda: r.keys('*')):\n"
        "    try:\n"
        "        attempt()\n"
        "        print('REDIS ACCEPTED')\n"
        "    except redis.exceptions.ResponseError as exc:\n"
        "        print('REDIS REFUSED', type(exc).__name__)\n"
    )
    job = stack.submit({"command": [sys.executable, "-c", probe], "gpus": 1})
    done = stack.wait_status(job["id"], "SUCCEEDED", "FAILED", timeout=60)
    log = stack.logs(job["id"])
    assert done["status"] == "SUCCEEDED", log
    assert log.count("REDIS REFUSED NoPermissionError") == 2 and "ACCEPTED" not in log, log
    password = stack.redis_url.split("@", 1)[0].rsplit(":", 1)[1]
    for secret in (password, stack.node_key("n1").hex(), "GPUSCHED_REDIS_URL", "redis://"):
        assert secret not in log
    key_file = stack.data_dir / "agents" / stack.name("n1") / "node.key"
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_a_forged_run_order_is_refused_by_the_agent(stack: Stack, work: Path) -> None:
    node, other = stack.name("n1"), stack.name("n2")
    marker = work / "forged-order-ran"
    order = RunJob(
        node=node,
        job_id=999_001,
        attempt=1,
        command=("touch", str(marker)),
        master_port=20001,
        unix_user="root",
    )
    forgeries = [
        ({"payload": _plain(order)}, "unknown", "unsigned"),  # the old, unsealed form
        (seal(order, key=stack.node_key(other)), "run_job", "bad_signature"),
        (seal(order, key=stack.node_key(node), now=time.time() - ORDER_TTL_S - 5), "run_job",
         "expired"),
    ]  # fmt: skip
    for kwargs, kind, reason in forgeries:
        before = _refused(stack, AGENT_PORT, kind, reason)
        stack.celery.send_task(RUN_JOB, kwargs=kwargs, queue=node_queue(node))
        _wait_refused(stack, AGENT_PORT, kind, reason, before)
    assert not marker.exists()  # refused: it would have run before the refusal was counted
    agent_log = stack.agent("n1").log.read_text(errors="replace")
    assert f"agent {node} refused a message (run_job): bad_signature" in agent_log


def test_a_replayed_order_is_refused(stack: Stack) -> None:
    """A job that saw an earlier, longer time limit's order cannot send it again to undo a
    later, shorter one."""
    job = _running(stack, "sleep 120")
    node = stack.name("n1")
    log = stack.agent("n1").log

    def changed() -> int:  # time limits the agent applied to this attempt
        applied = f"job {job['id']} attempt {job['attempt']}: time limit now"
        return log.read_text(errors="replace").count(applied)

    def send(limit: int, kwargs: dict[str, str] | None = None) -> dict[str, str]:
        order = SetTimeLimit(
            node=node, job_id=job["id"], attempt=job["attempt"], max_runtime_s=limit
        )
        kwargs = kwargs or seal(order, key=stack.node_key(node))  # as the scheduler seals it
        stack.celery.send_task(SET_TIME_LIMIT, kwargs=kwargs, queue=node_queue(node))
        return kwargs

    seen = changed()
    longer = send(3600)
    poll("the longer limit applied", lambda: changed() > seen, timeout=30)
    ran_s = time.time() - datetime.fromisoformat(job["started_at"]).timestamp()
    send(int(ran_s) + 10)  # the shorter one, which the replay would undo
    poll("the shorter limit applied", lambda: changed() > seen + 1, timeout=30)

    before = _refused(stack, AGENT_PORT, "set_time_limit", "replayed")
    send(3600, kwargs=longer)
    _wait_refused(stack, AGENT_PORT, "set_time_limit", "replayed", before)
    ended = stack.wait_status(job["id"], "TIMED_OUT", "CANCELLED", timeout=60)
    assert ended["status"] == "TIMED_OUT"  # at the shorter limit, as the scheduler last said
