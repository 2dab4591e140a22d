"""Messages sent through Celery (Redis): task names, queues, and the one sender.

The API and the scheduler send by task name, so neither imports worker code. Every send
happens after the database transaction that justifies it has committed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery import Celery
from kombu.transport import redis as kombu_redis

from app.metrics import DISPATCH_FAILURES

if TYPE_CHECKING:
    from app.cycle.dispatch import Dispatch

log = logging.getLogger("gpusched.messaging")

SCHEDULER_QUEUE = "scheduler"
REPORTS_QUEUE = "reports"

SCHEDULE_CYCLE = "gpusched.schedule_cycle"
RECONCILE = "gpusched.reconcile"
COMPACT_TELEMETRY = "gpusched.compact_telemetry"
PURGE_HISTORY = "gpusched.purge_history"
SEND_NOTIFICATIONS = "gpusched.send_notifications"
FIRE_BATCHES = "gpusched.fire_batches"
AGENT_REPORT = "gpusched.agent_report"
RUN_JOB = "gpusched.run_job"
STOP_JOB = "gpusched.stop_job"
SET_TIME_LIMIT = "gpusched.set_time_limit"

# Set while a cycle request is queued; the cycle clears it when it starts, so a request
# that arrives during a cycle queues exactly one more (debounce without losing a trigger).
CYCLE_PENDING_KEY = "gpusched:cycle:pending"
# The installation's id, published by the scheduler for agents that were not given it (a
# node added to a cluster is given Redis, not the database): agents name their jobs'
# fences by it (workers/agent/fence.py).
INSTALLATION_KEY = "gpusched:installation"


def node_queue(node: str) -> str:
    return f"node.{node}"


class _RedisChannel(kombu_redis.Channel):
    """kombu's Redis channel, made safe to use after its connection was lost.

    When Redis goes away, Celery (5.7) collects the lost connection before it closes the
    channel. Giving unacknowledged messages back on close, or acknowledging or rejecting
    a task that ran through the outage, then reads the collected connection, raises
    AttributeError and kills the worker (for an agent: its watchdog stops every job on
    the node). All three are skipped on such a channel: the messages stay in Redis's
    unacked set and are delivered again after the visibility timeout, as those of a
    worker that died (tasks are idempotent for that reason).
    """

    def _collected(self) -> bool:
        return self.connection is None or self.connection.client is None

    @property
    def do_restore(self) -> bool:  # type: ignore[override]
        return not self._collected()

    def _skipped(self, action: str, delivery_tag: Any) -> bool:
        if not self._collected():
            return False
        log.warning("not %s message %s: its connection to Redis was lost", action, delivery_tag)
        return True

    def basic_ack(self, delivery_tag: Any, multiple: bool = False) -> None:
        if not self._skipped("acknowledging", delivery_tag):
            super().basic_ack(delivery_tag, multiple=multiple)  # type: ignore[no-untyped-call]

    def basic_reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if not self._skipped("rejecting", delivery_tag):
            super().basic_reject(delivery_tag, requeue=requeue)  # type: ignore[no-untyped-call]


class RedisTransport(kombu_redis.Transport):
    Channel = _RedisChannel


def create_celery(redis_url: str, *, name: str = "gpusched") -> Celery:
    celery = Celery(name, broker=redis_url)
    celery.conf.update(
        task_default_queue=SCHEDULER_QUEUE,
        task_routes={
            SCHEDULE_CYCLE: {"queue": SCHEDULER_QUEUE},
            RECONCILE: {"queue": SCHEDULER_QUEUE},
            COMPACT_TELEMETRY: {"queue": SCHEDULER_QUEUE},
            PURGE_HISTORY: {"queue": SCHEDULER_QUEUE},
            SEND_NOTIFICATIONS: {"queue": SCHEDULER_QUEUE},
            FIRE_BATCHES: {"queue": SCHEDULER_QUEUE},
            AGENT_REPORT: {"queue": REPORTS_QUEUE},
        },
        task_ignore_result=True,
        # A task is acknowledged only after it ran, so a worker killed mid-task leaves it
        # in Redis for another worker: tasks are idempotent for exactly this reason.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        broker_transport=f"{__name__}:RedisTransport",
        broker_transport_options={"visibility_timeout": 300},
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
    )
    return celery


def publish_installation(redis_client: Any, installation: str) -> None:
    try:
        redis_client.set(INSTALLATION_KEY, installation)
    except Exception as exc:  # Redis down: the next reconcile publishes it again
        log.warning("could not publish the installation id: %s", exc)


def wait_installation(redis_client: Any, *, timeout_s: float | None = None) -> str:
    """The installation id the scheduler published (TimeoutError after `timeout_s`)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    said = False
    while True:
        try:
            value = redis_client.get(INSTALLATION_KEY)
        except Exception as exc:
            value = None
            log.warning("Redis unreachable while waiting for the installation id: %s", exc)
        if value:
            return value.decode() if isinstance(value, bytes) else str(value)
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError("no installation id published in Redis")
        if not said:
            log.info("waiting for the scheduler to publish the installation id in Redis")
            said = True
        time.sleep(1.0)


class Messenger:
    """Sends tasks; failures to reach Redis are logged and reported, never raised into
    a request that already committed its data (reconciliation re-sends what matters)."""

    def __init__(self, celery: Celery, redis_client: Any) -> None:
        self.celery = celery
        self.redis = redis_client

    def request_cycle(self) -> bool:
        try:
            if self.redis.set(CYCLE_PENDING_KEY, "1", nx=True, px=5000):
                self.celery.send_task(SCHEDULE_CYCLE)
            return True
        except Exception as exc:  # Redis down: beat and reconcile will catch up
            DISPATCH_FAILURES.labels(task=SCHEDULE_CYCLE).inc()
            log.warning("could not request a scheduling cycle: %s", exc)
            return False

    def request_cycle_at(self, when: datetime) -> bool:
        """A full cycle at `when` (a begin time, a window opening): not debounced, since
        a cycle queued now runs before it is due."""
        try:
            self.celery.send_task(SCHEDULE_CYCLE, kwargs={"full": True}, eta=when)
            return True
        except Exception as exc:  # Redis down: the beat starts the job a little later
            DISPATCH_FAILURES.labels(task=SCHEDULE_CYCLE).inc()
            log.warning("could not arm a scheduling cycle for %s: %s", when.isoformat(), exc)
            return False

    def send_to_node(
        self, node: str, task: str, payload: dict[str, Any], *, expires_s: float | None = None
    ) -> bool:
        """`expires_s`: a message not consumed by then is dropped. run_job uses it, so an
        agent that comes back late never starts an attempt that was given up meanwhile
        (reconciliation re-sends the ones still wanted). `sent_at` lets an agent also
        refuse one sent before it started: meant for the agent it replaced."""
        stamped = {**payload, "sent_at": time.time()}
        try:
            self.celery.send_task(
                task, kwargs={"payload": stamped}, queue=node_queue(node), expires=expires_s
            )
            return True
        except Exception as exc:
            DISPATCH_FAILURES.labels(task=task).inc()
            log.warning("could not send %s to node %s: %s", task, node, exc)
            return False

    def send_stops(self, stops: Iterable[Dispatch]) -> None:
        """stop_job to each node, after the commit that decided the stops (cancel,
        requeue, preemption); reconciliation re-sends any that is lost."""
        for stop in stops:
            self.send_to_node(stop.node, STOP_JOB, stop.payload)

    def send_time_limits(self, changes: Iterable[Dispatch]) -> bool:
        """set_time_limit to each node of a running job whose limit changed, after the
        commit; False if one could not be sent (the caller says so: a retry re-sends)."""
        return all([self.send_to_node(c.node, SET_TIME_LIMIT, c.payload) for c in changes])

    def report(self, payload: dict[str, Any]) -> bool:
        try:
            self.celery.send_task(AGENT_REPORT, kwargs={"payload": payload})
            return True
        except Exception as exc:
            log.warning("could not send report %s: %s", payload.get("kind"), exc)
            return False
