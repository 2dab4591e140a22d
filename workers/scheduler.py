"""The scheduler's Celery tasks: the cycle (beat + triggers), reconciliation and the
periodic chores (agents' reports are drained apart: workers/job_reports.py and
workers/heartbeats.py). Thin: each task opens a session, calls a domain function, commits, and
only then sends messages."""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import Celery

from app.batches.service import CHECK_INTERVAL_S as BATCH_CHECK_INTERVAL_S
from app.batches.service import fire_due
from app.config import Settings
from app.cycle.reconcile import (
    SilenceJudge,
    reconcile,
)
from app.cycle.run import CycleReport, run_cycle
from app.cycle.settings import SchedulerSettings
from app.cycle.snapshot import QueueMemory
from app.cycle.wakeup import WakeUps
from app.db import utcnow
from app.installation.service import installation_id
from app.jobs.limits import runtime_limits
from app.jobs.webhooks import NOTIFY_INTERVAL_S, send_due
from app.messaging import (
    COMPACT_TELEMETRY,
    CYCLE_PENDING_KEY,
    FIRE_BATCHES,
    PURGE_HISTORY,
    RECONCILE,
    SCHEDULE_CYCLE,
    SEND_NOTIFICATIONS,
    publish_installation,
)
from app.nodes.telemetry import TelemetryPolicy, compact_telemetry
from app.retention import purge_history
from app.windows.timeline import SchedulerWindows
from workers.heartbeats import heartbeats_backlog_s
from workers.job_reports import reports_backlog_s
from workers.runtime import Runtime

__all__ = ["build_scheduler_app"]

log = logging.getLogger("gpusched.scheduler")
# Queue positions behind the head are refreshed this often (see app.cycle.apply).
FULL_POSITIONS_EVERY_S = 5.0


def scheduler_runtime(settings: Settings, scheduler: SchedulerSettings) -> Runtime:
    return Runtime(settings, run_expires_s=scheduler.dispatch_timeout_s)


def build_scheduler_app(
    settings: Settings, scheduler: SchedulerSettings, *, runtime: Runtime | None = None
) -> Celery:
    runtime = runtime or scheduler_runtime(settings, scheduler)
    celery = runtime.celery
    installation: list[str] = []  # read once, by the first reconciliation
    holder = f"{socket.gethostname()}:{id(runtime)}"
    telemetry = TelemetryPolicy(foreign_util_threshold_pct=scheduler.foreign_util_threshold_pct)
    # Cycles in this process run one after another: a trigger that arrives mid-cycle waits
    # for it and then plans with fresh state, instead of being dropped by the lease.
    cycle_lock = threading.Lock()
    rerun = threading.Event()
    want_full = threading.Event()
    wake_ups = WakeUps()
    silence = SilenceJudge(heartbeat_timeout_s=scheduler.heartbeat_timeout_s)
    last_full_positions = [datetime.min.replace(tzinfo=UTC)]
    queue_memory = QueueMemory()
    scheduler_windows = SchedulerWindows()  # window intervals, generated once per window set

    # Not shared: each task closes over this app's state, and a shared task would also
    # be registered in every other Celery app of the process (a test builds several).
    @celery.task(name=SCHEDULE_CYCLE, shared=False)
    def schedule_cycle(full: bool = False) -> dict[str, Any]:
        # `full`: a timed cycle (a begin time came), which must read the whole queue.
        if full:
            want_full.set()
        # One cycle at a time in this process. A trigger that arrives mid-cycle does not
        # wait (it would hold a worker thread that agents' reports need): it asks the
        # running cycle to go once more, with fresh state, when it is done. The holder
        # looks again after it lets go of the lock, so that a trigger refused just as it
        # was stopping is not lost.
        rerun.set()
        placed, ran = 0, False
        while rerun.is_set() and cycle_lock.acquire(blocking=False):
            try:
                while rerun.is_set():
                    rerun.clear()
                    report = run_once()
                    placed += report.placed
                    ran = ran or report.ran
            finally:
                cycle_lock.release()
        return {"placed": placed, "ran": ran}

    def run_once() -> CycleReport:
        # Clear the trigger just before reading the state: of what commits from now on,
        # the first sends a cycle task (which makes this loop go once more) and the rest
        # find the trigger set. Cleared by every task that arrived instead, nearly every
        # report committed during a cycle sent one (938 tasks in a drain of 1,000 jobs,
        # 517 now; the scheduler's CPU 7 % less).
        try:
            runtime.redis.delete(CYCLE_PENDING_KEY)
        except Exception as exc:
            log.warning("redis unavailable: %s", exc)
        now = utcnow()
        full = want_full.is_set()
        if full:  # cleared only when seen: one set meanwhile makes the next full
            want_full.clear()
        elif (now - last_full_positions[0]).total_seconds() >= FULL_POSITIONS_EVERY_S:
            full = True
        report = run_cycle(
            factory=runtime.factory,
            messenger=runtime.messenger,
            settings=scheduler,
            holder=holder,
            now=now,
            all_positions=full,
            memory=queue_memory,
            windows=scheduler_windows,
            full_every_s=FULL_POSITIONS_EVERY_S,
        )
        if full and report.ran:
            last_full_positions[0] = now
        if report.wake_at is not None and wake_ups.arm(report.wake_at, now=now):
            runtime.messenger.request_cycle_at(report.wake_at)
        return report

    @celery.task(name=RECONCILE, shared=False)
    def reconcile_task() -> dict[str, int]:
        # Agents that were not given the installation's id take it from Redis (again after
        # a Redis restart).
        if not installation:
            with runtime.factory() as session:
                installation.append(installation_id(session=session))
                session.commit()
        publish_installation(runtime.redis, installation[0])
        # Heartbeats still queued are no silence of their nodes, and started or finished
        # reports still queued no lost orders: each judged up to the oldest queued.
        try:
            now_s = time.time()
            heartbeats_queued_s = heartbeats_backlog_s(
                runtime.redis, key_for=runtime.node_keys, now=now_s
            )
            reports_queued_s = reports_backlog_s(
                runtime.redis, key_for=runtime.node_keys, now=now_s
            )
        except Exception as exc:  # Redis down: no report arrives either (SilenceJudge)
            log.warning("could not read the reports' backlog: %s", exc)
            heartbeats_queued_s = reports_queued_s = 0.0
        with runtime.factory() as session:
            repairs = reconcile(
                session=session,
                now=utcnow(),
                heartbeat_timeout_s=scheduler.heartbeat_timeout_s,
                dispatch_timeout_s=scheduler.dispatch_timeout_s,
                silence=silence,
                heartbeats_queued_s=heartbeats_queued_s,
                reports_queued_s=reports_queued_s,
            )
        runtime.messenger.send(repairs.after)
        return {"lost": len(repairs.lost_jobs), "redispatched": len(repairs.run)}

    @celery.task(name=COMPACT_TELEMETRY, shared=False)
    def compact_task() -> int:
        with runtime.factory() as session:
            folded = compact_telemetry(session=session, policy=telemetry, now=utcnow())
            session.commit()
        return folded

    @celery.task(name=PURGE_HISTORY, shared=False)
    def purge_task() -> dict[str, int]:
        if settings.retention_days is None:
            return {}
        before = utcnow() - timedelta(days=settings.retention_days)
        purged = purge_history(factory=runtime.factory, before=before, log_dir=settings.log_dir)
        if purged.jobs or purged.audit_events or purged.firings:
            log.info("purged history before %s: %s", before.isoformat(), purged)
        return asdict(purged)

    @celery.task(name=SEND_NOTIFICATIONS, shared=False)
    def send_notifications() -> dict[str, int]:
        report = send_due(
            factory=runtime.factory, now=utcnow(), allowed_hosts=settings.notify_host_set
        )
        return asdict(report)

    @celery.task(name=FIRE_BATCHES, shared=False)
    def fire_batches() -> dict[str, int]:
        # Reads every enabled schedule from the database each time: API changes apply at
        # once; the unique (schedule, fire time) row makes repeats and rival beats harmless.
        report = fire_due(factory=runtime.factory, limits=runtime_limits(settings), now=utcnow())
        runtime.messenger.send(report.after)
        return {"firings": len(report.firings), "jobs": len(report.submitted_jobs)}

    celery.conf.beat_schedule = {
        "cycle": {"task": SCHEDULE_CYCLE, "schedule": scheduler.interval_s},
        "reconcile": {"task": RECONCILE, "schedule": scheduler.reconcile_interval_s},
        "compact-telemetry": {"task": COMPACT_TELEMETRY, "schedule": 60.0},
        "fire-batches": {"task": FIRE_BATCHES, "schedule": BATCH_CHECK_INTERVAL_S},
        "send-notifications": {"task": SEND_NOTIFICATIONS, "schedule": NOTIFY_INTERVAL_S},
    }
    if settings.retention_days is not None:
        celery.conf.beat_schedule["purge-history"] = {"task": PURGE_HISTORY, "schedule": 3600.0}
    return celery
