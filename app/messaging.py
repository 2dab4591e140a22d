"""Sending through Celery (Redis) from the control plane: the scheduler's own tasks, and
`Messenger.send`, the one function that carries out what a committed transaction left to
do (orders to agents, sealed with each node's key; a scheduling cycle).

The API and the scheduler send by task name, so neither imports worker code. Every send
happens after the database transaction that justifies it has committed.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from celery import Celery

from app.jobs.orders import AfterCommit
from app.metrics import DISPATCH_FAILURES
from app.wire import INSTALLATION_KEY, Order, RunJob, celery_app, node_queue, send_sealed

log = logging.getLogger("gpusched.messaging")

SCHEDULER_QUEUE = "scheduler"

SCHEDULE_CYCLE = "gpusched.schedule_cycle"
RECONCILE = "gpusched.reconcile"
COMPACT_TELEMETRY = "gpusched.compact_telemetry"
PURGE_HISTORY = "gpusched.purge_history"
SEND_NOTIFICATIONS = "gpusched.send_notifications"
FIRE_BATCHES = "gpusched.fire_batches"

# Set while a cycle request is queued; the cycle clears it when it starts, so a request
# that arrives during a cycle queues exactly one more (debounce without losing a trigger).
CYCLE_PENDING_KEY = "gpusched:cycle:pending"


def create_celery(redis_url: str, *, name: str = "gpusched") -> Celery:
    scheduler_tasks = (
        SCHEDULE_CYCLE,
        RECONCILE,
        COMPACT_TELEMETRY,
        PURGE_HISTORY,
        SEND_NOTIFICATIONS,
        FIRE_BATCHES,
    )
    return celery_app(
        redis_url,
        name=name,
        default_queue=SCHEDULER_QUEUE,
        routes={task: {"queue": SCHEDULER_QUEUE} for task in scheduler_tasks},
    )


class Sender(Protocol):
    """What routers and workers send through: a Messenger, or the NullMessenger."""

    def send(self, after: AfterCommit) -> tuple[Order, ...]: ...

    def request_cycle(self) -> bool: ...

    def request_cycle_at(self, when: datetime) -> bool: ...


def publish_installation(redis_client: Any, installation: str) -> None:
    try:
        redis_client.set(INSTALLATION_KEY, installation)
    except Exception as exc:  # Redis down: the next reconcile publishes it again
        log.warning("could not publish the installation id: %s", exc)


class Messenger:
    """Sends tasks; failures to reach Redis are logged and reported, never raised into
    a request that already committed its data (reconciliation re-sends what matters).

    `keys(node)` is the node's key: every order is sealed with its addressee's.
    `run_expires_s`: a run_job not consumed by then is dropped, so an agent that comes
    back late never starts an attempt that was given up meanwhile (reconciliation
    re-sends the ones still wanted)."""

    def __init__(
        self,
        celery: Celery,
        redis_client: Any,
        *,
        keys: Callable[[str], bytes],
        run_expires_s: float | None = None,
    ) -> None:
        self.celery = celery
        self.redis = redis_client
        self.keys = keys
        self.run_expires_s = run_expires_s

    def send(self, after: AfterCommit) -> tuple[Order, ...]:
        """Carry out what a commit left to do; returns the orders that could not be sent
        (the caller may say so: a time limit is not re-sent by reconciliation)."""
        unsent = self._send_orders(after.orders)
        if after.cycle:
            self.request_cycle()
        return unsent

    def _send_orders(self, orders: tuple[Order, ...]) -> tuple[Order, ...]:
        """All of them in one Redis pipeline (kombu's publish batch), not a connection and
        a round trip each: a full cycle on an empty 1,000-node cluster sends 8,000 run
        orders, and one by one each took about 1 ms of the scheduler's CPU on this machine
        (0.4-0.6 ms batched; docs/benchmarks.md). A batch that fails has an uncertain
        outcome, so its orders are all reported unsent; the agent ignores an order it
        already has (`OrderGate`), and reconciliation re-sends the run and stop orders
        still wanted."""
        if not orders:
            return ()
        try:
            with self.celery.producer_or_acquire() as producer, producer.batch():
                for order in orders:
                    send_sealed(
                        self.celery,
                        order.TASK,
                        order,
                        key=self.keys(order.node),
                        queue=node_queue(order.node),
                        expires=self.run_expires_s if isinstance(order, RunJob) else None,
                        producer=producer,
                    )
        except Exception as exc:
            for order in orders:
                DISPATCH_FAILURES.labels(task=order.TASK).inc()
            log.warning("could not send %d orders (%s): %s", len(orders), _kinds(orders), exc)
            return orders
        return ()

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


def _kinds(orders: tuple[Order, ...]) -> str:
    counts = Counter(order.KIND for order in orders)
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))


class NullMessenger:
    """Sends nothing: an API without Redis (tests, a replica that only reads). The beat
    and reconciliation do the work later, as they do when Redis is down."""

    def send(self, after: AfterCommit) -> tuple[Order, ...]:
        return ()

    def request_cycle(self) -> bool:
        return True

    def request_cycle_at(self, when: datetime) -> bool:
        return True
