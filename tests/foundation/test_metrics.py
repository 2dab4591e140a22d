"""`/metrics` by Prometheus' conventions: ratios for utilisation, base units, counters
ending in `_total`, a queue-wait histogram observed once per job as it starts (so it only
grows), no duplicate series, GPU series labelled with the job, user and project holding
the GPU; and `promtool check metrics` accepts what the API and the scheduler serve."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from app.db import utcnow
from app.jobs.agent_reports import job_started
from app.jobs.lifecycle import queue_wait_s
from app.jobs.models import Job
from app.wire import Started
from tests.cycle.jobs_api import add_node, report_end, run_one_cycle, submit

PROMTOOL = os.environ.get("GPUSCHED_PROMTOOL") or shutil.which("promtool")
NO_PROMTOOL = (
    "no promtool: Debian's `prometheus` package ships it (apt-get install prometheus, or "
    "only its /usr/bin/promtool, as .ci/run extracts it); GPUSCHED_PROMTOOL names another"
)


def _families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def _gpu_samples(text: str, name: str) -> dict[str, dict[str, str]]:
    """gpu index on n1 -> labels of its sample of `name`."""
    family = _families(text)[name]
    return {s.labels["gpu"]: s.labels for s in family.samples if s.labels["node"] == "n1"}


def _start(api: Any, job_id: int) -> None:
    """As the agent's start report: the job's current attempt runs on n1."""
    with api.factory.begin() as session:
        attempt = session.scalar(select(Job.attempt).where(Job.id == job_id))
        assert job_started(
            session=session, report=Started(job_id=job_id, attempt=attempt, node="n1")
        ).accepted


def _waits() -> float:
    return REGISTRY.get_sample_value("gpusched_queue_wait_seconds_count") or 0.0


@pytest.fixture
def busy(api: Any) -> Any:
    """n1 with 4 GPUs: alice's 2-GPU job running on two, bob's and alice's half-GPU jobs
    sharing a third, the fourth free."""
    add_node(api, gpus=4)
    jobs = [
        submit(api, "alice", gpus=2),
        submit(api, "bob", gpus=1, gpu_share=0.5),
        submit(api, "alice", gpus=1, gpu_share=0.5),
    ]
    run_one_cycle(api)
    for job in jobs:
        _start(api, job["id"])
    api.jobs = [job["id"] for job in jobs]
    return api


def test_gpu_series_are_ratios_in_base_units_labelled_with_who_holds_the_gpu(busy: Any) -> None:
    text = busy.client.get("/metrics").text
    families = _families(text)
    assert "gpusched_gpu_utilization_percent" not in families
    # The node's GPUs report 0 % and 0 MiB (tests.foundation.builders.ready_node).
    util = _gpu_samples(text, "gpusched_gpu_utilization_ratio")
    assert set(util) == {"0", "1", "2", "3"}
    total = families["gpusched_gpu_memory_total_bytes"].samples
    assert {s.value for s in total} == {81559 * 2**20}
    whole, shared, _ = busy.jobs
    holders = {
        gpu: (labels["job_id"], labels["user"], labels["project"])
        for gpu, labels in _gpu_samples(text, "gpusched_gpu_allocated_ratio").items()
    }
    two_gpus = [gpu for gpu, held in holders.items() if held == (str(whole), "alice", "ml")]
    assert len(two_gpus) == 2
    # The shared GPU names both of its jobs, in job order, as one series (no double count).
    half = [gpu for gpu, held in holders.items() if held[0] == f"{shared},{shared + 1}"]
    assert len(half) == 1 and holders[half[0]][1:] == ("bob,alice", "cv,ml")
    assert list(holders.values()).count(("", "", "")) == 1  # the free GPU
    allocated = families["gpusched_gpu_allocated_ratio"].samples
    assert sorted(s.value for s in allocated) == [0.0, 1.0, 1.0, 1.0]
    gpu = util[two_gpus[0]]
    assert gpu["uuid"] == f"GPU-n1-{two_gpus[0]}" and gpu["model"] == "H100-80GB"
    assert all(0.0 <= s.value <= 1.0 for s in families["gpusched_gpu_utilization_ratio"].samples)


def test_jobs_are_counted_once_by_state_and_project(busy: Any) -> None:
    submit(busy, "alice", gpus=2)  # two free GPUs are not left: it waits
    run_one_cycle(busy)
    families = _families(busy.client.get("/metrics").text)
    assert "gpusched_pending_jobs" not in families  # sum(gpusched_jobs{state="PENDING"})
    jobs = {
        (s.labels["state"], s.labels["project"]): s.value for s in families["gpusched_jobs"].samples
    }
    assert jobs == {("RUNNING", "ml"): 2, ("RUNNING", "cv"): 1, ("PENDING", "ml"): 1}


def test_queue_wait_is_observed_once_per_job_when_it_first_starts(api: Any) -> None:
    add_node(api, gpus=1)
    job = submit(api, "alice", gpus=1, preemptible=True)
    run_one_cycle(api)  # placed: SCHEDULED, not started yet
    before = _waits()
    _start(api, job["id"])
    assert _waits() == before + 1
    # Requeued (its node's agent stopped it) and started again: the same job, no new wait.
    assert report_end(api, job["id"], "PREEMPTED").accepted
    run_one_cycle(api)
    _start(api, job["id"])
    assert _waits() == before + 1
    # A start rolled back (the report's transaction failed and is retried) counts nothing.
    other = submit(api, "alice", gpus=1)
    report_end(api, job["id"], "SUCCEEDED")
    run_one_cycle(api)
    with api.factory() as session:
        attempt = session.scalar(select(Job.attempt).where(Job.id == other["id"]))
        job_started(session=session, report=Started(job_id=other["id"], attempt=attempt, node="n1"))
        session.rollback()
    assert _waits() == before + 1
    _start(api, other["id"])
    assert _waits() == before + 2


def test_queue_wait_leaves_out_the_time_a_job_was_held() -> None:
    now = utcnow()
    job = Job(created_at=now - timedelta(hours=3), ineligible_s=2 * 3600, begin_at=None)
    assert queue_wait_s(job, started_at=now) == pytest.approx(3600)
    # Not before its begin time (submit --begin): waiting for it is not queueing.
    job.begin_at = now - timedelta(minutes=10)
    assert queue_wait_s(job, started_at=now) == pytest.approx(600)
    assert queue_wait_s(job, started_at=now - timedelta(hours=1)) == 0.0


def _promtool(text: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_accepts_the_apis_metrics(busy: Any) -> None:
    text = busy.client.get("/metrics").text
    checked = _promtool(text)
    assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout + checked.stderr


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_accepts_the_schedulers_metrics(api: Any) -> None:
    # What GPUSCHED_SCHEDULER_METRICS_PORT serves: the process's default registry, with
    # every instrument the cycle and the reports define, some of them observed.
    import workers.scheduler  # noqa: F401  (defines nothing new, but imports all it uses)
    from app.metrics import CYCLE_SECONDS, DISPATCH_FAILURES, PLACEMENTS

    CYCLE_SECONDS.labels("full").observe(0.01)
    PLACEMENTS.inc(0)
    DISPATCH_FAILURES.labels("run_job").inc(0)
    text = generate_latest(REGISTRY).decode()
    assert "gpusched_queue_wait_seconds_bucket" in text
    checked = _promtool(text)
    assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout + checked.stderr


def test_counters_end_in_total_and_no_percent_is_left(busy: Any) -> None:
    """Checked without promtool too: the conventions promtool's linter does not know."""
    import workers.scheduler  # noqa: F401

    served = busy.client.get("/metrics").text + generate_latest(REGISTRY).decode()
    ours = {n: f for n, f in _families(served).items() if n.startswith("gpusched_")}
    assert ours
    for name, family in ours.items():
        assert "percent" not in name, name
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), name
        if name.endswith("_ratio"):
            assert all(0.0 <= s.value <= 1.0 for s in family.samples), name


# ---------------------------------------------------------------- the Grafana dashboard

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gpusched.json"
# Grafana's variables, as a query would be run.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$node": ".*"}


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["definition"])
    assert queries
    return queries


def _family(series: str) -> str:
    for suffix in ("_bucket", "_count", "_sum", "_total"):
        if series.endswith(suffix):
            return series.removesuffix(suffix)
    return series


def test_the_grafana_dashboard_uses_only_metrics_we_serve(busy: Any) -> None:
    import workers.scheduler  # noqa: F401

    served = busy.client.get("/metrics").text + generate_latest(REGISTRY).decode()
    families = set(_families(served))
    used = {
        _family(name)
        for query in _dashboard_queries()
        for name in re.findall(r"gpusched_\w+", query)
    }
    assert used - families == set()
    # The series this issue is about are charted.
    assert {
        "gpusched_gpu_utilization_ratio",
        "gpusched_gpu_allocated_ratio",
        "gpusched_queue_wait_seconds",
        "gpusched_jobs",
    } <= used


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_parses_every_query_of_the_grafana_dashboard(tmp_path: Path) -> None:
    rules = []
    for i, query in enumerate(q for q in _dashboard_queries() if not q.startswith("label_values")):
        for variable, value in GRAFANA_VARIABLES.items():
            query = query.replace(variable, value)
        assert "$" not in query, query
        rules.append({"record": f"dashboard:query_{i}", "expr": query})
    path = tmp_path / "rules.json"  # YAML is a superset of JSON
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert PROMTOOL is not None
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
