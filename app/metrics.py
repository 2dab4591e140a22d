"""Prometheus metrics, named by Prometheus' conventions: base units (seconds, bytes,
watts, celsius), ratios from 0 to 1 (`_ratio`), counters ending in `_total`, histograms
that only grow, and no series that another one already gives (docs/metrics.md).

The API's `/metrics` reads the database at scrape time (jobs by state and project, latest
GPU readings, heartbeat age), so every API replica reports the same truth. GPU series
carry the job, user and project holding the GPU, as NVIDIA's DCGM exporter labels its
series with the pod or HPC job. The scheduler process counts what only it sees (cycle
duration, dispatch failures) and serves them on its own port
(GPUSCHED_SCHEDULER_METRICS_PORT); split in two, its reports process serves its own
(report handling, job starts' queue wait, its dispatch failures) on a second one
(GPUSCHED_SCHEDULER_REPORTS_METRICS_PORT).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from app.auth.models import User
from app.db import utcnow
from app.jobs.models import Job
from app.nodes.models import Allocation, Gpu, Node
from app.notifications.deliveries import delivery_state
from app.notifications.models import Notification
from app.projects.models import Project

# kind: "full" (the whole queue read and ranked) or "quick" (the head of the queue only).
CYCLE_SECONDS = Histogram(
    "gpusched_scheduling_cycle_seconds",
    "Duration of one scheduling cycle (snapshot, plan, apply, dispatch)",
    ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
PLAN_SECONDS = Histogram(
    "gpusched_scheduling_plan_seconds",
    "Duration of a cycle's plan phase: the policy core alone, as bench/cycle.py times it",
    ["kind"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
)
# kind: the agent's report, "register", "heartbeat", "started" or "finished".
REPORT_SECONDS = Histogram(
    "gpusched_agent_report_seconds",
    "Time the scheduler took to handle one agent report (its transaction and messages)",
    ["kind"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
)
# Heartbeats drained from their queue (workers/heartbeats.py): "stored", or "superseded"
# (a newer one of the same node came in the same batch; never stored).
HEARTBEATS_DRAINED = Counter(
    "gpusched_heartbeats_drained", "Heartbeats taken from their queue, by outcome", ["outcome"]
)
HEARTBEAT_BATCH_SECONDS = Histogram(
    "gpusched_heartbeat_batch_seconds",
    "Time one transaction of heartbeats (up to 5 nodes) took, with its messages",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
PLACEMENTS = Counter("gpusched_placements", "Jobs placed by the scheduler")
DISPATCH_FAILURES = Counter(
    "gpusched_dispatch_failures", "Messages that could not be sent to Redis", ["task"]
)


# Each GPU's series: where it is, what it is, and who holds it (DCGM exporter's labels
# for a GPU and the job on it). A GPU shared by several jobs (gpu_share) names them all,
# comma-separated, so that it stays one series and sums do not count it twice; a free GPU
# has them empty. Not `job`: Prometheus gives that label to the scrape target.
GPU_LABELS = ["node", "gpu", "uuid", "model", "job_id", "user", "project"]


def _holders(session: Session) -> dict[int, tuple[str, str, str]]:
    """gpu id -> (job ids, users, projects) of the jobs holding it now, each joined by commas."""
    held: dict[int, set[tuple[int, str, str]]] = defaultdict(set)
    for gpu_id, job_id, user, project in session.execute(
        select(Allocation.gpu_id, Job.id, User.name, Project.name)
        .join(Job, Job.id == Allocation.job_id)
        .join(User, User.id == Job.user_id)
        .join(Project, Project.id == Job.project_id)
        .where(Allocation.released_at.is_(None))
    ):
        if gpu_id is not None:
            held[gpu_id].add((job_id, user, project))

    def joined(values: list[str]) -> str:
        return ",".join(dict.fromkeys(values))  # in job order, each once

    return {
        gpu_id: (
            ",".join(str(job_id) for job_id, _, _ in sorted(jobs)),
            joined([user for _, user, _ in sorted(jobs)]),
            joined([project for _, _, project in sorted(jobs)]),
        )
        for gpu_id, jobs in held.items()
    }


class DatabaseCollector(Collector):
    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.factory = factory

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = utcnow()
        with self.factory() as session:
            # The only count of jobs by state: sum by (state) is the queue, by (project)
            # a project's load (no separate pending_jobs series to disagree with it).
            jobs = GaugeMetricFamily(
                "gpusched_jobs", "Jobs by state and project", labels=["state", "project"]
            )
            for state, project, count in session.execute(
                select(Job.status, Project.name, func.count())
                .join(Project, Project.id == Job.project_id)
                .group_by(Job.status, Project.name)
            ):
                jobs.add_metric([str(state), project], count)
            yield jobs
            yield from _gpu_families(session)
            yield _undelivered(session)
            yield _heartbeat_age(session, now)


def _gpu_families(session: Session) -> Iterator[GaugeMetricFamily]:
    def gauge(name: str, text: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, text, labels=GPU_LABELS)

    util = gauge(
        "gpusched_gpu_utilization_ratio",
        "Latest SM utilisation, 0 to 1 (as DCGM_FI_PROF_GR_ENGINE_ACTIVE)",
    )
    used = gauge("gpusched_gpu_memory_used_bytes", "Latest memory used")
    total = gauge("gpusched_gpu_memory_total_bytes", "Memory the GPU has")
    power = gauge("gpusched_gpu_power_watts", "Latest power draw")
    temperature = gauge("gpusched_gpu_temperature_celsius", "Latest GPU temperature")
    allocated = gauge("gpusched_gpu_allocated_ratio", "Part of the GPU allocated to jobs, 0 to 1")
    healthy = gauge("gpusched_gpu_healthy", "1 if the GPU reads healthy, else 0")
    unknown = gauge(
        "gpusched_gpu_unknown",
        "1 if a reading placement decides with (memory, processes) could not be taken",
    )
    holders = _holders(session)
    for node, gpu in session.execute(
        select(Node.name, Gpu).join(Gpu, Gpu.node_id == Node.id).where(Node.removed_at.is_(None))
    ):
        labels = [node, str(gpu.index), gpu.uuid, gpu.model, *holders.get(gpu.id, ("", "", ""))]
        if gpu.util_pct is not None:
            util.add_metric(labels, gpu.util_pct / 100)
        if gpu.memory_used_mb is not None:
            used.add_metric(labels, gpu.memory_used_mb * 2**20)
        total.add_metric(labels, gpu.memory_total_mb * 2**20)
        if gpu.power_w is not None:
            power.add_metric(labels, gpu.power_w)
        if gpu.temperature_c is not None:
            temperature.add_metric(labels, gpu.temperature_c)
        allocated.add_metric(labels, gpu.allocated_milli / 1000)
        healthy.add_metric(labels, 1.0 if gpu.healthy else 0.0)
        unknown.add_metric(labels, 1.0 if gpu.unknown_readings else 0.0)
    yield from (util, used, total, power, temperature, allocated, healthy, unknown)


def _undelivered(session: Session) -> GaugeMetricFamily:
    # Alert on given_up growing, or retrying staying up: a webhook that is down.
    undelivered = GaugeMetricFamily(
        "gpusched_notifications_undelivered",
        "Job webhook messages not delivered, by state: queued, retrying, given_up",
        labels=["state"],
    )
    states = dict.fromkeys(("queued", "retrying", "given_up"), 0)
    for attempts, count in session.execute(
        select(Notification.attempts, func.count())
        .where(Notification.sent_at.is_(None))
        .group_by(Notification.attempts)
    ):
        states[delivery_state(sent=False, attempts=attempts)] += count
    for delivery, count in states.items():
        undelivered.add_metric([delivery], count)
    return undelivered


def _heartbeat_age(session: Session, now: datetime) -> GaugeMetricFamily:
    age = GaugeMetricFamily(
        "gpusched_node_heartbeat_age_seconds",
        "Seconds since the node's last heartbeat",
        labels=["node"],
    )
    # A removed node's age would grow for ever (and page someone): it has none.
    present = select(Node.name, Node.last_heartbeat_at).where(Node.removed_at.is_(None))
    for name, last in session.execute(present):
        if last is not None:
            age.add_metric([name], (now - last).total_seconds())
    return age
