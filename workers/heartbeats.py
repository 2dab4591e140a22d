"""Agents' heartbeats, drained from their own queue in batches, apart from job reports.

A heartbeat is a snapshot of its node (see `handle_heartbeat`): only each node's newest
matters. Agents send them, sealed like every report, as Celery task messages to the
`heartbeats` queue (`app.wire.report_queue`); Celery's pool does not consume that queue.
This drain does, in a thread of the reports process (of one of them, where they run as
replicas: the one that holds the lease, `DrainerLease`):

- it pops the whole queue at once (up to `batch` messages, oldest first), checks each
  one's seal as the reports task does, and keeps only the last of each node in queue
  order (an agent sends its heartbeats one after another, so the later is the newer): a
  heartbeat superseded by a newer one already received is never stored;
- it stores the kept ones `per_transaction` nodes to a transaction, `threads`
  transactions at once (each node's readings and the reconciliation of its attempts, as
  `handle_heartbeat` does), then sends what the repairs left to do; a transaction that
  fails is retried one heartbeat at a time through `handle_heartbeat` (its deadlock
  retries, its drop on a database outage);
- job reports (started, finished, leaving, register) stay in the `reports` queue, which
  Celery's threads consume: no heartbeat backlog is ever in front of them.

A popped heartbeat is gone from Redis: one lost with a dying process is replaced by the
node's next, seconds later (heartbeats are dropped, not retried, for the same reason).

Silence is judged by the newest heartbeat received, not stored: a batch's nodes are all
marked heard from (one statement) before their readings are stored, and
`report_backlog_s` tells the reconciliation how long the oldest heartbeat still queued
has waited; silence is judged up to then (`app.cycle.reconcile.reconcile`), so a node
whose heartbeats are only queued is never declared lost for the backlog. Between the pop
and that statement a batch is neither queued nor marked (checking thousands of seals
takes seconds on a loaded machine): the drain says in Redis since when the oldest
heartbeat it holds was sent (`IN_FLIGHT_KEY`), and `heartbeats_backlog_s` counts those
as queued.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from app.cycle.reconcile import NodeRepairs, heartbeat_taken_at, reconcile_nodes_attempts
from app.db import utcnow
from app.messaging import Sender
from app.metrics import HEARTBEAT_BATCH_SECONDS, HEARTBEATS_DRAINED
from app.nodes.models import Node
from app.nodes.telemetry import TelemetryPolicy, ingest_heartbeats
from app.wire import (
    HEARTBEATS_QUEUE,
    REPORT_TYPES,
    Heartbeat,
    Message,
    Refused,
    RegisterAgain,
    note_refused,
    unseal,
)

log = logging.getLogger("gpusched.heartbeats")

# A batch is the whole backlog (up to this many messages): of a backlog longer than one
# interval, only each node's newest is stored, so the queue cannot grow past what one
# round of storing lets in, and no node's heartbeat is stored older than that.
BATCH = 10_000
# Nodes stored per transaction: few, so that a cycle's apply or a finished report (which
# update GPU rows too) never waits long for the rows a transaction of heartbeats holds
# (at 25, 1.5 s transactions on a loaded machine stalled the cycle at 1,000 nodes).
PER_TRANSACTION = 5
# Transactions of one batch stored at once (distinct nodes: they touch distinct rows), as
# Celery's 4 threads did one heartbeat each: the time of one is mostly waiting.
STORE_THREADS = 4
# After a batch too short to fill one round of transactions (PER_TRANSACTION x
# STORE_THREADS), the drain waits this long before taking the next: the heartbeats that
# come meanwhile are marked heard by one statement and stored in full transactions,
# instead of batches of one to four, each with its own mark and Redis round trips (at
# 1,000 nodes, about 57 a second). A heartbeat after a quiet spell is taken at once, and
# a backlog without a pause.
GATHER_S = 0.1
HEARTBEAT_TYPES = {Heartbeat.KIND: Heartbeat}
# A node not registered is asked to register at most this often: at 1,000 simulated nodes
# whose Registers waited behind a backlog of job reports, every heartbeat asked again
# (1,692 asks for 1,000 nodes, each one more Register in that backlog).
ASK_TO_REGISTER_EVERY_S = 30.0
# A node heard unknown is forgotten after this long (it registered, or went away).
FORGET_UNKNOWN_S = 600.0

# When the oldest heartbeat that the drain popped but has not yet marked heard from was
# sent (see the module doc). It expires, so that a drain that died holding a batch does
# not keep every node's silence from counting.
IN_FLIGHT_KEY = "gpusched:heartbeats:in_flight_since"
IN_FLIGHT_TTL_S = 120

# One drain of heartbeats at a time among all reports processes (`gpusched scheduler
# --only reports` may run several, for the job reports' sake): a node's heartbeats are
# stored in the order they were sent only while one drain takes them, and IN_FLIGHT_KEY
# is one drain's. The holder renews its lease before each round and each transaction; a
# holder that died or stalled loses it after DRAINER_TTL_S, and another takes over.
DRAINER_KEY = "gpusched:heartbeats:drainer"
DRAINER_TTL_S = 15
# Held by the caller already, or by nobody: (re)set it, and say so.
_HOLD = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# deadlock_detected, serialization_failure: the transaction may simply be run again.
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})
HEARTBEAT_TRIES = 3


def store_heartbeats(
    *,
    session: Session,
    heartbeats: Sequence[Heartbeat],
    telemetry: TelemetryPolicy,
    grace_s: float,
    now: datetime,
) -> list[NodeRepairs]:
    """Store heartbeats of distinct nodes and reconcile their attempts with them (not
    committed); one NodeRepairs per heartbeat.

    Reconciled first: the jobs whose ends the heartbeats repeat are locked before their
    GPUs, as a run of job reports locks them (and a cycle its jobs before its GPUs); the
    telemetry written first took the GPUs' rows before the jobs', and the two
    transactions deadlocked a few times a minute at 1,000 nodes."""
    repairs = reconcile_nodes_attempts(
        session=session,
        heartbeats=[
            (heartbeat, heartbeat_taken_at(heartbeat.taken_at, received_at=now))
            for heartbeat in heartbeats
        ],
        grace_s=grace_s,
    )
    ingest_heartbeats(session=session, heartbeats=heartbeats, policy=telemetry, now=now)
    return repairs


def handle_heartbeat(
    *,
    session: Session,
    heartbeat: Heartbeat,
    telemetry: TelemetryPolicy,
    grace_s: float,
    now: datetime,
) -> NodeRepairs | None:
    """Store a heartbeat's readings and reconcile the node's attempts with it (committed);
    None when the database failed and the heartbeat was dropped.

    Dropped, not retried later: a heartbeat is a snapshot. Applied late, it would judge
    attempts started since against its old list of running ones and declare them lost;
    the next heartbeat, seconds away, is current. Only a deadlock's victim is run again,
    at once.
    """
    tries = 1
    while True:
        try:
            [repairs] = store_heartbeats(
                session=session,
                heartbeats=(heartbeat,),
                telemetry=telemetry,
                grace_s=grace_s,
                now=now,
            )
            session.commit()
            return repairs
        except OperationalError as exc:
            session.rollback()
            # The victim of a deadlock (a cycle's apply locked the same rows): PostgreSQL
            # rolled it back so that it can be run again at once, still current. Dropped,
            # its node would look silent and its jobs be declared lost.
            if (
                getattr(exc.orig, "sqlstate", None) in RETRYABLE_SQLSTATES
                and tries < HEARTBEAT_TRIES
            ):
                tries += 1
                continue
            log.warning("heartbeat from %s dropped: %s", heartbeat.node, exc)
            return None


def task_kwargs(raw: bytes | str) -> dict[str, Any] | None:
    """The keyword arguments of a Celery task message as kombu keeps it in Redis (JSON,
    its body base64-encoded JSON `[args, kwargs, embed]`); None if it is not one."""
    try:
        envelope = json.loads(raw)
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        _args, kwargs, _embed = json.loads(body)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return kwargs if isinstance(kwargs, dict) else None


def unseal_queued(
    raw: bytes | str, *, types: Mapping[str, type[Message]], key_for: Callable[[str], bytes]
) -> Any | None:
    """The message a queued report carries, if it is one of `types` sealed by the node it
    names; else None, the refusal logged and counted as the reports task counted it."""
    kwargs = task_kwargs(raw)
    try:
        if kwargs is None:
            raise Refused("unsigned", "not a task message")
        return unseal(kwargs, types=types, key_for=key_for).message
    except Refused as refused:
        note_refused(refused, receiver="scheduler")
        return None


def newest_per_node(
    raws: Sequence[bytes | str], *, key_for: Callable[[str], bytes]
) -> tuple[list[Heartbeat], int]:
    """The believed heartbeats among `raws` (oldest first), the last of each node only,
    and how many were superseded. A message that is not a heartbeat sealed by the node it
    names is refused (logged, counted) as the reports task refuses it."""
    newest: dict[str, Heartbeat] = {}
    believed = 0
    for raw in raws:
        heartbeat = unseal_queued(raw, types=HEARTBEAT_TYPES, key_for=key_for)
        if heartbeat is None:
            continue
        assert isinstance(heartbeat, Heartbeat)
        believed += 1
        newest.pop(heartbeat.node, None)  # re-inserted last: stored in order of arrival
        newest[heartbeat.node] = heartbeat
    return list(newest.values()), believed - len(newest)


def sent_at(raw: bytes | str | None, *, key_for: Callable[[str], bytes]) -> float | None:
    """The sealed send time of a queued report; None unless it is a believed report."""
    kwargs = task_kwargs(raw) if raw is not None else None
    if kwargs is None:
        return None
    try:
        sealed = unseal(kwargs, types=REPORT_TYPES, key_for=key_for)
    except Refused:
        return None
    return sealed.header.sent_at


def report_backlog_s(
    redis_client: Any, queue: str, *, key_for: Callable[[str], bytes], now: float
) -> float:
    """How long the oldest report waiting in `queue` (heartbeats, or job reports) has
    waited, by its sealed send time; 0 when none, or when it is not a believed report."""
    oldest = sent_at(redis_client.lindex(queue, -1), key_for=key_for)  # pushed left, popped right
    return 0.0 if oldest is None else max(0.0, now - oldest)


def heartbeats_backlog_s(
    redis_client: Any, *, key_for: Callable[[str], bytes], now: float
) -> float:
    """How long the oldest heartbeat not yet marked heard from has waited: queued, or
    popped by the drain and not yet marked (IN_FLIGHT_KEY)."""
    queued = report_backlog_s(redis_client, HEARTBEATS_QUEUE, key_for=key_for, now=now)
    in_flight = redis_client.get(IN_FLIGHT_KEY)
    held = 0.0 if in_flight is None else max(0.0, now - float(in_flight))
    return max(queued, held)


class DrainerLease:
    """Which reports process drains the heartbeats (DRAINER_KEY): the first to ask, for
    as long as it renews the lease."""

    def __init__(self, redis_client: Any, *, ttl_s: int = DRAINER_TTL_S) -> None:
        self.holder = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.ttl_s = ttl_s
        self._hold = redis_client.register_script(_HOLD)
        self._release = redis_client.register_script(_RELEASE)

    def hold(self) -> bool:
        """Take or renew the lease; False while another process holds it."""
        return bool(self._hold(keys=[DRAINER_KEY], args=[self.holder, self.ttl_s]))

    def release(self) -> None:
        """Give the lease up (if still ours), so that another process takes over at once."""
        self._release(keys=[DRAINER_KEY], args=[self.holder])


@dataclass(frozen=True)
class ReportsContext:
    """What every drain of agents' reports works with, heartbeats' and job reports':
    the broker, the database, the nodes' keys (to unseal), where orders go, how readings
    are judged, and the grace of a run order not yet confirmed by a start."""

    redis: Any
    factory: sessionmaker[Session]
    key_for: Callable[[str], bytes]
    sender: Sender
    telemetry: TelemetryPolicy
    grace_s: float


# `heard`'s statement, built once and run on the connection: through the ORM's bulk
# update it cost half as much again.
_NODE = cast(Table, Node.__table__)
_MARK_HEARD = (
    update(_NODE)
    .where(_NODE.c.name.in_(bindparam("names", expanding=True)))
    .values(last_heartbeat_at=bindparam("last_heartbeat_at"))
)


class HeartbeatDrain:
    def __init__(
        self,
        context: ReportsContext,
        *,
        batch: int = BATCH,
        per_transaction: int = PER_TRANSACTION,
        threads: int = STORE_THREADS,
        lease: DrainerLease | None = None,
        reports_waited_s: Callable[[], float] | None = None,
    ) -> None:
        """`lease`: where several reports processes may run, the one that drains (None:
        this drain is the only one). `reports_waited_s`: how long the oldest job report
        not yet applied has waited (None: not known, a node is asked at once)."""
        self.context = context
        self.batch = batch
        self.per_transaction = per_transaction
        self.threads = threads
        self.lease = lease
        self._pool: ThreadPoolExecutor | None = None
        self.reports_waited_s = reports_waited_s
        self._asked_to_register: dict[str, float] = {}  # node -> when (monotonic)
        self._unknown_since: dict[str, float] = {}  # node -> first heard unknown (epoch)
        self._asked_lock = threading.Lock()

    def pop(self, *, block_s: float) -> list[bytes]:
        """Up to `batch` queued heartbeats, oldest first; waits up to `block_s` for one.
        Before taking a backlog, says in Redis since when its oldest was sent: until they
        are marked heard from (`heard`), they count as queued for the silence judge."""
        oldest = sent_at(
            self.context.redis.lindex(HEARTBEATS_QUEUE, -1), key_for=self.context.key_for
        )
        if oldest is not None:
            self.context.redis.set(IN_FLIGHT_KEY, repr(oldest), ex=IN_FLIGHT_TTL_S)
        raws: list[bytes] = self.context.redis.rpop(HEARTBEATS_QUEUE, self.batch) or []
        if raws or block_s <= 0:
            return raws
        got = self.context.redis.brpop([HEARTBEATS_QUEUE], timeout=block_s)
        if not got:
            return []
        more = self.context.redis.rpop(HEARTBEATS_QUEUE, self.batch - 1) if self.batch > 1 else None
        return [got[1], *(more or [])]

    def drain_once(self, *, block_s: float = 0.0) -> tuple[int, int]:
        """One batch: (heartbeats stored, superseded ones skipped)."""
        raws = self.pop(block_s=block_s)
        if not raws:
            return 0, 0
        heartbeats, superseded = newest_per_node(raws, key_for=self.context.key_for)
        if superseded:
            HEARTBEATS_DRAINED.labels("superseded").inc(superseded)
        self.heard(heartbeats)
        chunks = [
            heartbeats[start : start + self.per_transaction]
            for start in range(0, len(heartbeats), self.per_transaction)
        ]
        if len(chunks) <= 1 or self.threads <= 1:
            return sum(self.store(chunk) for chunk in chunks), superseded
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="heartbeats")
        return sum(self._pool.map(self.store, chunks)), superseded

    def heard(self, heartbeats: Sequence[Heartbeat]) -> None:
        """Mark every node of a batch heard from now, in one statement, before their
        readings are stored (transaction after transaction): silence is judged by the
        newest heartbeat received, so none is silent while its batch is being stored.
        Then the batch is no longer in flight (IN_FLIGHT_KEY); if the mark failed, it
        stays in flight until the key expires or the next batch is taken."""
        names = [heartbeat.node for heartbeat in heartbeats]
        if names:
            try:
                with self.context.factory() as session:
                    session.connection().execute(
                        _MARK_HEARD, {"names": names, "last_heartbeat_at": utcnow()}
                    )
                    session.commit()
            except OperationalError as exc:  # stored below, or dropped as any heartbeat is
                log.warning("could not mark %d nodes heard from: %s", len(names), exc)
                return
        self.context.redis.delete(IN_FLIGHT_KEY)

    def store(self, heartbeats: Sequence[Heartbeat]) -> int:
        """Store heartbeats of distinct nodes in one transaction (one at a time if it
        fails), then send what their repairs left to do; returns how many were stored.
        Dropped if this drain lost its lease meanwhile: the new holder stores the nodes'
        next ones, and a snapshot stored after a newer one would go back in time."""
        if self.lease is not None and not self.lease.hold():
            log.warning(
                "%d heartbeats dropped: another reports process drains them now", len(heartbeats)
            )
            return 0
        started = time.monotonic()
        now = utcnow()
        all_repairs: list[NodeRepairs] = []
        with self.context.factory() as session:
            try:
                all_repairs = store_heartbeats(
                    session=session,
                    heartbeats=heartbeats,
                    telemetry=self.context.telemetry,
                    grace_s=self.context.grace_s,
                    now=now,
                )
                session.commit()
            except Exception as exc:  # a deadlock, an outage, one odd heartbeat: one by one
                session.rollback()
                log.warning(
                    "a batch of %d heartbeats failed (%s); one by one", len(heartbeats), exc
                )
                all_repairs = []
                for heartbeat in heartbeats:
                    repairs = handle_heartbeat(
                        session=session,
                        heartbeat=heartbeat,
                        telemetry=self.context.telemetry,
                        grace_s=self.context.grace_s,
                        now=utcnow(),
                    )
                    if repairs is not None:
                        all_repairs.append(repairs)
        HEARTBEAT_BATCH_SECONDS.observe(time.monotonic() - started)
        HEARTBEATS_DRAINED.labels("stored").inc(len(all_repairs))
        waited: float | None = None
        for repairs in all_repairs:
            for stop in repairs.stops:
                log.warning(
                    "heartbeat of %s: stopping job %s attempt %s (orphaned, or its gang ended)",
                    stop.node,
                    stop.job_id,
                    stop.attempt,
                )
            if repairs.register_again is not None:
                if waited is None:  # asked once a batch, only when some node is unknown
                    waited = self.reports_waited_s() if self.reports_waited_s else 0.0
                if not self._may_ask(repairs.register_again, reports_waited_s=waited):
                    repairs.register_again = None
            self.context.sender.send(repairs.after)
        return len(all_repairs)

    def _may_ask(self, order: RegisterAgain, *, reports_waited_s: float) -> bool:
        """Whether a node not registered may be asked to register (again) now.

        Not while its Register may still wait behind job reports in the reports queue:
        it was sent before the node's first heartbeat, so it may wait as long as a job
        report not yet applied (the oldest has waited `reports_waited_s`, by the reports'
        sealed send times) was sent before the drain first heard the node unknown. At a
        fleet's cold start heartbeats overtook nearly every node's Register, and each
        node registered twice. Nor when it was asked within ASK_TO_REGISTER_EVERY_S: each
        of its heartbeats would ask once more."""
        now, wall = time.monotonic(), time.time()
        with self._asked_lock:
            unknown, asked = self._unknown_since, self._asked_to_register
            for node in [n for n, at in unknown.items() if wall - at >= FORGET_UNKNOWN_S]:
                del unknown[node]
            if reports_waited_s > wall - unknown.setdefault(order.node, wall):
                return False
            if now - asked.get(order.node, -math.inf) < ASK_TO_REGISTER_EVERY_S:
                return False
            for node in [n for n, at in asked.items() if now - at >= ASK_TO_REGISTER_EVERY_S]:
                del asked[node]
            asked[order.node] = now
            return True

    def run(self, stop: threading.Event) -> None:
        """Drain until `stop` is set, while this drain holds the lease (if it has one);
        Redis or database trouble is logged and waited out."""
        while not stop.is_set():
            try:
                if self.lease is None or self.lease.hold():
                    taken = sum(self.drain_once(block_s=1.0))
                    if 0 < taken < self.per_transaction * self.threads:
                        stop.wait(GATHER_S)
                else:
                    stop.wait(1.0)  # another process drains; take over when it stops
            except Exception as exc:
                log.warning("heartbeat drain: %s", exc)
                stop.wait(1.0)
        if self.lease is not None:
            with contextlib.suppress(Exception):  # else it lapses after DRAINER_TTL_S
                self.lease.release()

    def start(self, stop: threading.Event) -> threading.Thread:
        """Run in a daemon thread until `stop` is set."""
        thread = threading.Thread(target=self.run, args=(stop,), name="heartbeats", daemon=True)
        thread.start()
        return thread
