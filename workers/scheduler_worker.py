"""Starting the scheduler's Celery worker (with embedded beat for a single-host setup)."""

from __future__ import annotations

import logging
import os
from functools import partial

from celery.signals import beat_embedded_init
from prometheus_client import start_http_server

from app import compiled_core
from app.config import Settings
from app.cycle.settings import SchedulerSettings
from app.logs import celery_options, configure_logging, log_level_name
from app.messaging import SCHEDULER_QUEUE
from app.nodes.telemetry import TelemetryPolicy
from app.processes import die_with_parent
from app.wire import REPORTS_QUEUE
from workers.heartbeats import HeartbeatDrain
from workers.scheduler import build_scheduler_app, scheduler_runtime

log = logging.getLogger("gpusched.scheduler")


# What a scheduler process consumes: everything (one process, the simplest deployment), or
# one half. Agents' reports (heartbeats, job starts and ends) in a process of their own
# do not compete with the cycle for one interpreter lock: `gpusched up` runs the two.
# Heartbeats are not in Celery's queues: the process that takes reports drains their own
# queue in a thread (workers/heartbeats.py), so they never delay a job's start or end.
WORK_QUEUES = {
    "all": (f"{SCHEDULER_QUEUE},{REPORTS_QUEUE}", "scheduler"),
    "cycle": (SCHEDULER_QUEUE, "scheduler"),
    "reports": (REPORTS_QUEUE, "reports"),
}


def run_scheduler_worker(
    settings: Settings, scheduler: SchedulerSettings, *, beat: bool, work: str = "all"
) -> None:
    """`work`: "all", "cycle" (cycles, reconciliation, batches; beat) or "reports"."""
    queues, role = WORK_QUEUES[work]
    configure_logging()
    log.info(
        "scheduling core: %s",
        "compiled (mypyc)"
        if compiled_core.in_use()
        else "plain Python (`make native` compiles it)",
    )
    runtime = scheduler_runtime(settings, scheduler)
    celery = build_scheduler_app(settings, scheduler, runtime=runtime)
    if work != "cycle":
        HeartbeatDrain(
            redis_client=runtime.redis,
            factory=runtime.factory,
            key_for=runtime.node_keys,
            sender=runtime.messenger,
            telemetry=TelemetryPolicy(
                foreign_util_threshold_pct=scheduler.foreign_util_threshold_pct
            ),
            grace_s=scheduler.dispatch_timeout_s,
        ).start()
    # Cycle durations, report handling and dispatch failures live in the process that
    # counts them: each serves its own.
    port = scheduler.reports_metrics_port if work == "reports" else scheduler.metrics_port
    if port:
        try:
            start_http_server(port, addr=settings.host)
        except OSError as exc:  # e.g. a second scheduler on this host: run without metrics
            log.warning("%s metrics not served on port %d: %s", role, port, exc)
    argv = [
        *celery_options(),
        "--queues",
        queues,
        # Threads: reports are handled while a cycle runs; cycles themselves serialise on a
        # lock (and across processes on the database lease).
        "--pool",
        "threads",
        "--concurrency",
        "4",
        "--hostname",
        f"{role}@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel",
        log_level_name().upper(),
    ]
    if beat and work != "reports":
        schedule_file = settings.data_dir.resolve() / "celerybeat-schedule"
        argv += ["--beat", "--schedule", str(schedule_file)]
        # The embedded beat runs in a child process; a worker killed outright would leave
        # it firing cycles (and a restarted worker would start a second one).
        beat_embedded_init.connect(partial(_beat_dies_with_worker, os.getpid()), weak=False)
    celery.worker_main(argv)


def _beat_dies_with_worker(worker_pid: int, **_: object) -> None:
    die_with_parent(worker_pid)
