"""Starting the scheduler's Celery worker (with embedded beat for a single-host setup)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
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
from workers.heartbeats import DrainerLease, HeartbeatDrain, ReportsContext
from workers.job_reports import DRAINS, reports_backlog_s, start_report_drains
from workers.scheduler import build_scheduler_app, scheduler_runtime

log = logging.getLogger("gpusched.scheduler")


# What a scheduler process does: everything (one process, the simplest deployment), or
# one half. Agents' reports (heartbeats, job starts and ends) in a process of their own
# do not compete with the cycle for one interpreter lock: `gpusched up` runs the two.
# Reports are not in Celery's queues: the process that takes them drains the heartbeats'
# queue (workers/heartbeats.py) and the job reports' (workers/job_reports.py) in threads
# of their own, in batches, so a heartbeat backlog never delays a job's start or end.
# Celery's worker runs only where cycles do. Reports processes may be replicated (one
# interpreter lock each): every one drains job reports, each batch taken atomically, and
# one at a time drains the heartbeats (DrainerLease).
ROLES = {"all": "scheduler", "cycle": "scheduler", "reports": "reports"}


def run_scheduler_worker(
    settings: Settings, scheduler: SchedulerSettings, *, beat: bool, work: str = "all"
) -> None:
    """`work`: "all", "cycle" (cycles, reconciliation, batches; beat) or "reports"."""
    role = ROLES[work]
    configure_logging()
    log.info(
        "scheduling core: %s",
        "compiled (mypyc)"
        if compiled_core.in_use()
        else "plain Python (`make native` compiles it)",
    )
    runtime = scheduler_runtime(settings, scheduler)
    stop = threading.Event()
    drains: list[threading.Thread] = []
    if work != "cycle":
        context = ReportsContext(
            redis=runtime.redis,
            factory=runtime.factory,
            key_for=runtime.node_keys,
            sender=runtime.messenger,
            telemetry=TelemetryPolicy(
                foreign_util_threshold_pct=scheduler.foreign_util_threshold_pct
            ),
            grace_s=scheduler.dispatch_timeout_s,
        )
        lease = DrainerLease(runtime.redis)
        drains = [
            HeartbeatDrain(
                context,
                lease=lease,
                reports_waited_s=lambda: reports_backlog_s(
                    runtime.redis, key_for=runtime.node_keys, now=time.time()
                ),
            ).start(stop)
        ]
        drains += start_report_drains(DRAINS, stop, context)
    # Cycle durations, report handling and dispatch failures live in the process that
    # counts them: each serves its own.
    port = scheduler.reports_metrics_port if work == "reports" else scheduler.metrics_port
    if port:
        try:
            start_http_server(port, addr=settings.host)
        except OSError as exc:  # e.g. a second scheduler on this host: run without metrics
            log.warning("%s metrics not served on port %d: %s", role, port, exc)
    if work == "reports":
        _wait_for_a_signal(stop)
        # Each finishes its batch in hand, or leaves it taken; the heartbeats' drain gives
        # its lease up, so that another reports process takes over at once.
        for drain in drains:
            drain.join(timeout=30)
        return
    celery = build_scheduler_app(settings, scheduler, runtime=runtime)
    argv = [
        *celery_options(),
        "--queues",
        SCHEDULER_QUEUE,
        # Threads: reconciliation and batches run while a cycle runs; cycles themselves
        # serialise on a lock (and across processes on the database lease).
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
    if beat:
        schedule_file = settings.data_dir.resolve() / "celerybeat-schedule"
        argv += ["--beat", "--schedule", str(schedule_file)]
        # The embedded beat runs in a child process; a worker killed outright would leave
        # it firing cycles (and a restarted worker would start a second one).
        beat_embedded_init.connect(partial(_beat_dies_with_worker, os.getpid()), weak=False)
    celery.worker_main(argv)


def _beat_dies_with_worker(worker_pid: int, **_: object) -> None:
    die_with_parent(worker_pid)


def _wait_for_a_signal(stop: threading.Event) -> None:
    """The reports process: its drains work in threads until SIGTERM or SIGINT."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log.info("reports: draining job reports and heartbeats")
    while not stop.wait(1.0):
        pass
