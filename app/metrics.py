"""Prometheus metrics.

The API's `/metrics` reads the database at scrape time (jobs by state and project, queue
wait, latest GPU readings, heartbeat age), so every API replica reports the same truth.
The scheduler process counts what only it sees (cycle duration, dispatch failures) and
serves them on its own port (GPUSCHED_SCHEDULER_METRICS_PORT); split in two, its reports
process serves its own (report handling, its dispatch failures) on a second one
(GPUSCHED_SCHEDULER_REPORTS_METRICS_PORT).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from app.db import utcnow
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.nodes.models import Gpu, Node
from app.notifications.deliveries import delivery_state
from app.notifications.models import Notification
from app.projects.models import Project

WAIT_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400)

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
PLACEMENTS = Counter("gpusched_placements", "Jobs placed by the scheduler")
DISPATCH_FAILURES = Counter(
    "gpusched_dispatch_failures", "Messages that could not be sent to Redis", ["task"]
)


class DatabaseCollector(Collector):
    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.factory = factory

    def collect(self) -> Iterator[GaugeMetricFamily | HistogramMetricFamily]:
        now = utcnow()
        with self.factory() as session:
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

            waits = [
                (started - created).total_seconds()
                for created, started in session.execute(
                    select(Job.created_at, Job.started_at).where(
                        Job.started_at >= now - timedelta(days=1)
                    )
                )
                if started is not None
            ]
            buckets = [(str(b), sum(1 for w in waits if w <= b)) for b in WAIT_BUCKETS] + [
                ("+Inf", len(waits))
            ]
            wait = HistogramMetricFamily(
                "gpusched_queue_wait_seconds",
                "Submission to start of jobs started in the last 24 hours",
            )
            wait.add_metric([], buckets, sum_value=sum(waits))
            yield wait

            pending = GaugeMetricFamily("gpusched_pending_jobs", "Jobs waiting to be placed")
            pending.add_metric(
                [], session.scalar(select(func.count()).where(Job.status == JobStatus.PENDING)) or 0
            )
            yield pending

            util = GaugeMetricFamily(
                "gpusched_gpu_utilization_percent", "Latest SM utilisation", labels=["node", "gpu"]
            )
            memory = GaugeMetricFamily(
                "gpusched_gpu_memory_used_bytes", "Latest memory used", labels=["node", "gpu"]
            )
            power = GaugeMetricFamily(
                "gpusched_gpu_power_watts", "Latest power draw", labels=["node", "gpu"]
            )
            allocated = GaugeMetricFamily(
                "gpusched_gpu_allocated_ratio", "Share allocated to jobs", labels=["node", "gpu"]
            )
            healthy = GaugeMetricFamily(
                "gpusched_gpu_healthy", "1 if the GPU reads healthy", labels=["node", "gpu"]
            )
            for node, gpu in session.execute(
                select(Node.name, Gpu)
                .join(Gpu, Gpu.node_id == Node.id)
                .where(Node.removed_at.is_(None))
            ):
                labels = [node, str(gpu.index)]
                if gpu.util_pct is not None:
                    util.add_metric(labels, gpu.util_pct)
                if gpu.memory_used_mb is not None:
                    memory.add_metric(labels, gpu.memory_used_mb * 2**20)
                if gpu.power_w is not None:
                    power.add_metric(labels, gpu.power_w)
                allocated.add_metric(labels, gpu.allocated_milli / 1000)
                healthy.add_metric(labels, 1.0 if gpu.healthy else 0.0)
            yield from (util, memory, power, allocated, healthy)

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
            yield undelivered

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
            yield age
