"""Heartbeats drained from their own queue in batches (workers/heartbeats.py).

- Only each node's newest heartbeat of a batch is stored: the others are superseded
  snapshots, never written.
- A batch's heartbeats are believed only if sealed by the node they name, as any report.
- Job reports travel in another queue, drained apart (workers/job_reports.py): the
  agent routes only heartbeats to `heartbeats`.
- A node whose heartbeats wait in the queue is not silent: silence is judged up to the
  oldest queued heartbeat's send time, not up to now.
- A node not registered is asked to register again, but not while its Register may still
  wait behind job reports.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import threading
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from app.cycle.reconcile import SilenceJudge, reconcile
from app.db import utcnow
from app.jobs.orders import AfterCommit
from app.messaging import NullMessenger, Sender
from app.nodes.keys import node_key
from app.nodes.models import Gpu, GpuSample, Node
from app.nodes.telemetry import TelemetryPolicy
from app.wire import (
    HEARTBEATS_QUEUE,
    REPORTS_QUEUE,
    AttemptRef,
    Finished,
    GpuReading,
    Heartbeat,
    Order,
    Register,
    RegisterAgain,
    Started,
    StopJob,
    seal,
)
from tests.cycle.jobs_api import get_job, run_one_cycle, statements_while, submit
from tests.foundation.builders import ready_node
from workers.heartbeats import (
    GATHER_S,
    IN_FLIGHT_KEY,
    HeartbeatDrain,
    ReportsContext,
    heartbeats_backlog_s,
    report_backlog_s,
    task_kwargs,
)
from workers.job_reports import reports_backlog_s

SECRET = b"s" * 32


def key_for(node: str) -> bytes:
    return node_key(SECRET, node)


class FakeQueueRedis:
    """Redis's list commands as kombu uses them: pushed left, popped right."""

    def __init__(self) -> None:
        self.lists: dict[str, list[bytes]] = {}
        self.keys: dict[str, bytes] = {}

    def lpush(self, name: str, value: bytes) -> None:
        self.lists.setdefault(name, []).insert(0, value)

    def rpop(self, name: str, count: int) -> list[bytes] | None:
        items = self.lists.get(name, [])
        taken = [items.pop() for _ in range(min(count, len(items)))]
        return taken or None

    def brpop(self, names: list[str], timeout: float) -> tuple[bytes, bytes] | None:
        popped = self.rpop(names[0], 1)
        return (names[0].encode(), popped[0]) if popped else None

    def lindex(self, name: str, index: int) -> bytes | None:
        items = self.lists.get(name, [])
        return items[index] if -len(items) <= index < len(items) else None

    # ... and the plain keys the drain sets (expiry not modelled).
    def set(self, name: str, value: str, ex: int | None = None) -> None:
        self.keys[name] = value.encode()

    def get(self, name: str) -> bytes | None:
        return self.keys.get(name)

    def delete(self, name: str) -> None:
        self.keys.pop(name, None)

    def scan_iter(self, match: str, count: int) -> list[str]:
        return [name for name in self.lists if fnmatch.fnmatchcase(name, match)]


def task_message(kwargs: dict[str, Any]) -> bytes:
    """A Celery task message as kombu stores it in Redis (tests/e2e sends real ones)."""
    body = base64.b64encode(json.dumps([[], kwargs, {}]).encode()).decode()
    envelope = {
        "body": body,
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"task": "gpusched.agent_report"},
        "properties": {"body_encoding": "base64", "priority": 0},
    }
    return json.dumps(envelope).encode()


def queue_heartbeat(
    redis: Any, heartbeat: Heartbeat, *, key: bytes | None = None, sent_at=None
) -> None:
    sealed = seal(heartbeat, key=key or key_for(heartbeat.node), now=sent_at)
    redis.lpush(HEARTBEATS_QUEUE, task_message(sealed))


def heartbeat(node: str, util: float) -> Heartbeat:
    return Heartbeat(
        node=node,
        gpus=(GpuReading(index=0, uuid=f"GPU-{node}-0", util_pct=util),),
        taken_at=time.time(),
    )


def context(
    api: Any, redis: Any, *, sender: Sender | None = None, factory: Any = None
) -> ReportsContext:
    return ReportsContext(
        redis=redis,
        factory=factory or api.factory,
        key_for=key_for,
        sender=sender or NullMessenger(),
        telemetry=TelemetryPolicy(),
        grace_s=15,
    )


def drain(api: Any, redis: FakeQueueRedis, *, sender: Sender | None = None) -> HeartbeatDrain:
    return HeartbeatDrain(context(api, redis, sender=sender))


def samples(api: Any, node: str) -> list[float | None]:
    with api.factory() as session:
        return list(
            session.scalars(
                select(GpuSample.util_pct)
                .join(Gpu, Gpu.id == GpuSample.gpu_id)
                .join(Node, Node.id == Gpu.node_id)
                .where(Node.name == node)
                .order_by(GpuSample.id)
            )
        )


def test_only_each_nodes_newest_heartbeat_of_a_batch_is_stored(api: Any) -> None:
    with api.factory.begin() as session:
        session.add_all(
            [ready_node("n1", gpus=1, now=utcnow()), ready_node("n2", gpus=1, now=utcnow())]
        )
    redis = FakeQueueRedis()
    for node, util in (("n1", 10.0), ("n2", 50.0), ("n1", 20.0), ("n1", 30.0)):
        queue_heartbeat(redis, heartbeat(node, util))

    stored, superseded = drain(api, redis).drain_once()

    assert (stored, superseded) == (2, 2)
    assert samples(api, "n1") == [30.0]  # the newest; 10 and 20 were never written
    assert samples(api, "n2") == [50.0]
    assert redis.lists[HEARTBEATS_QUEUE] == []


def test_a_heartbeat_not_sealed_by_its_node_is_refused_and_the_others_stored(api: Any) -> None:
    with api.factory.begin() as session:
        session.add_all(
            [ready_node("n1", gpus=1, now=utcnow()), ready_node("n2", gpus=1, now=utcnow())]
        )
    redis = FakeQueueRedis()
    queue_heartbeat(redis, heartbeat("n1", 10.0))
    # Signed with n2's key, naming n1: the newest in the queue, and not believed.
    queue_heartbeat(redis, heartbeat("n1", 99.0), key=key_for("n2"))
    redis.lpush(HEARTBEATS_QUEUE, b"not a task message")
    queue_heartbeat(redis, heartbeat("n2", 50.0))

    stored, superseded = drain(api, redis).drain_once()

    assert (stored, superseded) == (2, 0)
    assert samples(api, "n1") == [10.0]
    assert samples(api, "n2") == [50.0]


class RecordingSender(NullMessenger):
    def __init__(self) -> None:
        self.orders: list[Order] = []

    def send(self, after: AfterCommit) -> tuple[Order, ...]:
        self.orders.extend(after.orders)
        return ()


def test_a_node_not_registered_is_asked_to_register_again(api: Any) -> None:
    # Its Register was lost (a Redis restarted empty before the reports worker took it):
    # unasked, its agent would never register until it restarts, and the node stay unused.
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=1, now=utcnow()))
    redis = FakeQueueRedis()
    queue_heartbeat(redis, heartbeat("n1", 10.0))
    queue_heartbeat(redis, heartbeat("ghost", 20.0))
    sender = RecordingSender()
    draining = drain(api, redis, sender=sender)

    assert draining.drain_once() == (2, 0)
    assert sender.orders == [RegisterAgain(node="ghost")]  # n1, known, is asked nothing
    assert samples(api, "n1") == [10.0]
    # Its next heartbeat, while its Register may still wait in the reports queue, does not
    # ask again.
    queue_heartbeat(redis, heartbeat("ghost", 30.0))
    assert draining.drain_once() == (1, 0)
    assert sender.orders == [RegisterAgain(node="ghost")]
    with api.factory() as session:
        assert session.scalar(select(Node).where(Node.name == "ghost")) is None


def test_a_node_is_not_asked_to_register_while_its_register_may_wait(api: Any) -> None:
    """At a cold start, job reports queue up and a node's heartbeats, in a queue of their
    own, overtake its Register: asked at once, every node registered twice. It is asked
    once no job report sent before the drain first heard it is still waiting."""
    redis = FakeQueueRedis()
    register = Register(node="ghost", gpus=())
    sealed = seal(register, key=key_for("ghost"), now=time.time() - 1.0)
    redis.lpush(REPORTS_QUEUE, task_message(sealed))
    sender = RecordingSender()
    draining = HeartbeatDrain(
        context(api, redis, sender=sender),
        reports_waited_s=lambda: reports_backlog_s(redis, key_for=key_for, now=time.time()),
    )
    queue_heartbeat(redis, heartbeat("ghost", 20.0))
    assert draining.drain_once() == (1, 0)
    assert sender.orders == []  # its Register, sent before, still waits

    # The reports queue moves on: what waits now was sent after the node was first
    # heard unknown, so its Register is not among it (lost with a Redis restart).
    redis.lists[REPORTS_QUEUE] = []
    later = Started(job_id=1, attempt=1, node="n1", pid=7)
    redis.lpush(REPORTS_QUEUE, task_message(seal(later, key=key_for("n1"), now=time.time())))
    queue_heartbeat(redis, heartbeat("ghost", 30.0))
    assert draining.drain_once() == (1, 0)
    assert sender.orders == [RegisterAgain(node="ghost")]


def test_a_node_whose_heartbeats_are_only_queued_is_not_declared_lost(api: Any) -> None:
    timeout = 30.0
    now = utcnow()
    last_stored = now - timedelta(seconds=40)  # past the timeout, as far as stored goes
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=1, now=last_stored))
    redis = FakeQueueRedis()
    # Its next heartbeat was sent 35 s ago, 5 s after the last one stored: it waits in
    # the queue behind the scheduler's backlog.
    queue_heartbeat(redis, heartbeat("n1", 10.0), sent_at=now.timestamp() - 35)
    judge = SilenceJudge(heartbeat_timeout_s=timeout)
    judge.may_judge(now - timedelta(seconds=timeout))  # a judge that trusts silence

    backlog = report_backlog_s(redis, HEARTBEATS_QUEUE, key_for=key_for, now=now.timestamp())
    assert 34 < backlog < 36
    with api.factory() as session:
        repairs = reconcile(
            session=session,
            now=now,
            heartbeat_timeout_s=timeout,
            dispatch_timeout_s=3600,
            silence=judge,
            heartbeats_queued_s=backlog,
        )
    assert repairs.lost_nodes == []

    # Judged up to now instead (the backlog not counted), the node is lost.
    with api.factory() as session:
        repairs = reconcile(
            session=session, now=now, heartbeat_timeout_s=timeout, dispatch_timeout_s=3600,
            silence=judge,
        )  # fmt: skip
    assert repairs.lost_nodes == ["n1"]


def test_a_node_whose_heartbeat_was_taken_but_not_yet_marked_is_not_declared_lost(
    api: Any,
) -> None:
    """Between the drain's pop and its marking the batch's nodes heard from (checking
    thousands of seals takes seconds on a loaded machine), the batch is neither queued nor
    marked (at 1,000 simulated nodes, 24 nodes once ended NOT_READY, most likely there).
    The drain says since when it holds heartbeats, and the judge counts them as queued."""
    timeout = 30.0
    now = utcnow()
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=1, now=now - timedelta(seconds=40)))
    redis = FakeQueueRedis()
    queue_heartbeat(redis, heartbeat("n1", 10.0), sent_at=now.timestamp() - 35)
    judge = SilenceJudge(heartbeat_timeout_s=timeout)
    judge.may_judge(now - timedelta(seconds=timeout))  # a judge that trusts silence
    drainer = drain(api, redis)

    def lost() -> list[str]:
        backlog = heartbeats_backlog_s(redis, key_for=key_for, now=now.timestamp())
        with api.factory() as session:
            repairs = reconcile(session=session, now=now, heartbeat_timeout_s=timeout,
                                dispatch_timeout_s=3600, silence=judge,
                                heartbeats_queued_s=backlog)  # fmt: skip
        return repairs.lost_nodes

    assert drainer.pop(block_s=0) and not redis.lists[HEARTBEATS_QUEUE]  # taken, not marked
    assert lost() == []
    drainer.heard([heartbeat("n1", 10.0)])  # marked: no longer in flight
    assert redis.get(IN_FLIGHT_KEY) is None
    assert lost() == []


def test_the_backlog_is_read_only_from_a_believed_heartbeat() -> None:
    redis = FakeQueueRedis()
    assert report_backlog_s(redis, HEARTBEATS_QUEUE, key_for=key_for, now=time.time()) == 0.0
    # A forged message at the head of the queue cannot hold every node's judgement back.
    queue_heartbeat(redis, heartbeat("n1", 1.0), key=b"x" * 32, sent_at=time.time() - 3600)
    assert report_backlog_s(redis, HEARTBEATS_QUEUE, key_for=key_for, now=time.time()) == 0.0


def test_the_agent_sends_heartbeats_apart_from_job_reports() -> None:
    from workers.agent.worker import SealedReporter

    sent: list[tuple[str, str]] = []

    class Celery:
        def send_task(
            self, name: str, *, kwargs: dict[str, str], queue: str, **options: Any
        ) -> None:
            sent.append((json.loads(kwargs["header"])["kind"], queue))

    reporter = SealedReporter(Celery(), key=key_for("n1"))  # type: ignore[arg-type]
    reporter.report(heartbeat("n1", 1.0))
    reporter.report(Started(node="n1", job_id=1, attempt=1))
    reporter.report(Finished(node="n1", job_id=1, attempt=1, result="SUCCEEDED"))

    assert sent == [
        ("heartbeat", HEARTBEATS_QUEUE),
        ("started", REPORTS_QUEUE),
        ("finished", REPORTS_QUEUE),
    ]


def test_task_kwargs_reads_only_task_messages() -> None:
    assert task_kwargs(task_message({"a": "b"})) == {"a": "b"}
    assert task_kwargs(b"{}") is None
    assert task_kwargs(b"[1, 2]") is None
    assert task_kwargs(json.dumps({"body": "!!", "properties": {}})) is None


def test_a_batchs_nodes_are_heard_from_before_their_readings_are_stored(api: Any) -> None:
    # Storing a batch takes one transaction per 100 nodes: meanwhile none of its nodes
    # may look silent. They are marked heard from first, in one statement.
    long_ago = utcnow() - timedelta(seconds=600)
    with api.factory.begin() as session:
        session.add_all([ready_node(n, gpus=1, now=long_ago) for n in ("n1", "n2")])
    redis = FakeQueueRedis()
    queue_heartbeat(redis, heartbeat("n1", 10.0))
    queue_heartbeat(redis, heartbeat("n2", 10.0))
    seen: list[dict[str, Any]] = []
    hb_drain = drain(api, redis)

    def store(heartbeats: Any) -> int:  # what the reconciliation would read meanwhile
        with api.factory() as session:
            seen.append(dict(session.execute(select(Node.name, Node.last_heartbeat_at)).all()))
        return 0

    hb_drain.store = store  # type: ignore[method-assign]
    hb_drain.drain_once()

    assert seen and all(at > long_ago + timedelta(seconds=500) for at in seen[0].values())


class RecordedStop(threading.Event):
    """A stop event whose waits return at once, saying how long they were asked to be."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return self.is_set()


@pytest.mark.parametrize(("round_of", "waits"), [(4, [GATHER_S]), (2, [])])
def test_after_a_short_batch_the_drain_waits_for_more_before_taking_the_next(
    api: Any, round_of: int, waits: list[float]
) -> None:
    # Heartbeats come a few at a time at any scale: taken as they come, each batch of one
    # or two cost its own mark and Redis round trips. After one too short to fill a round
    # of transactions (`round_of` heartbeats) it lets the next gather; after a full round
    # (a backlog) it goes on at once, and after finding the queue empty it does not wait
    # more than the pop did.
    with api.factory.begin() as session:
        session.add_all([ready_node(n, gpus=1, now=utcnow()) for n in ("n1", "n2")])
    stop = RecordedStop()

    class EndsWhenEmpty(FakeQueueRedis):
        def brpop(self, names: list[str], timeout: float) -> tuple[bytes, bytes] | None:
            got = super().brpop(names, timeout)
            if got is None:  # a real one would have waited `timeout`: the test ends here
                stop.set()
            return got

    redis = EndsWhenEmpty()
    queue_heartbeat(redis, heartbeat("n1", 10.0))
    queue_heartbeat(redis, heartbeat("n2", 20.0))

    draining = drain(api, redis)
    draining.per_transaction, draining.threads = 1, round_of

    draining.run(stop)

    assert stop.waits == waits
    assert (samples(api, "n1"), samples(api, "n2")) == ([10.0], [20.0])


def test_a_batch_of_many_nodes_is_stored_in_several_transactions_at_once(api: Any) -> None:
    names = [f"m{i}" for i in range(7)]
    with api.factory.begin() as session:
        session.add_all([ready_node(n, gpus=1, now=utcnow()) for n in names])
    redis = FakeQueueRedis()
    for round_ in range(2):
        for name in names:
            queue_heartbeat(redis, heartbeat(name, float(round_)))
    hb_drain = drain(api, redis)
    hb_drain.per_transaction, hb_drain.threads = 2, 3

    assert hb_drain.drain_once() == (7, 7)
    assert all(samples(api, name) == [1.0] for name in names)


def test_a_gang_that_ends_on_one_node_of_a_batch_is_stopped_once_on_the_other(api: Any) -> None:
    # The batch's attempts are read once for all its nodes: n1's heartbeat ends the gang
    # (its rank failed), so n2's, stored after it in the same transaction, must see the
    # attempt ended, not still running there.
    with api.factory.begin() as session:
        session.add_all([ready_node(name, gpus=2, now=utcnow()) for name in ("n1", "n2")])
    job = submit(api, name="gang", gpus=2, nodes=2)["id"]
    run_one_cycle(api)
    attempt = get_job(api, job)["attempt"]
    redis = FakeQueueRedis()
    ended = Finished(node="n1", job_id=job, attempt=attempt, result="FAILED", exit_code=3)
    queue_heartbeat(redis, Heartbeat(node="n1", recent=(ended,), taken_at=time.time()))
    running = (AttemptRef(job_id=job, attempt=attempt),)
    queue_heartbeat(redis, Heartbeat(node="n2", running=running, taken_at=time.time()))
    sender = RecordingSender()
    draining = drain(api, redis, sender=sender)

    assert draining.drain_once() == (2, 0)
    assert get_job(api, job)["status"] == "FAILED"
    assert sender.orders == [StopJob(node="n2", job_id=job, attempt=attempt, reason="cancel")]


def test_ends_a_heartbeat_repeats_cost_the_same_statements_however_many(api: Any) -> None:
    # At 1,000 nodes heartbeats list most ends before their job reports are applied: the
    # jobs are locked by one statement for the batch, their GPUs released by one per node.
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=8, now=utcnow()))
    statements = []
    for count in (2, 6):
        jobs = [submit(api, name=f"j{i}", gpus=1)["id"] for i in range(count)]
        run_one_cycle(api)
        recent = tuple(
            Finished(node="n1", job_id=job, attempt=get_job(api, job)["attempt"], result="FAILED")
            for job in jobs
        )
        redis = FakeQueueRedis()
        queue_heartbeat(redis, Heartbeat(node="n1", recent=recent, taken_at=time.time()))
        draining = drain(api, redis)
        sent = statements_while(api, lambda d=draining: d.drain_once())
        # But INSERTs: the ORM inserts a flush's events together where the driver allows
        # it (psycopg), one by one on SQLite.
        statements.append(len([s for s in sent if not s.startswith("INSERT")]))
        assert all(get_job(api, job)["status"] == "FAILED" for job in jobs)

    assert statements[0] == statements[1]
    with api.factory() as session:
        assert not any(session.scalars(select(Gpu.allocated_milli)))


def test_a_heartbeat_locks_the_jobs_it_ends_before_their_gpus(api: Any) -> None:
    # As a run of job reports does (jobs, then GPUs): a heartbeat that wrote its GPUs'
    # telemetry first and then locked the job whose end it repeats deadlocked with the
    # run applying that job's own end report.
    if api.factory.kw["bind"].dialect.name != "postgresql":
        pytest.skip("SQLite locks the whole database for a write, not rows")
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=2, now=utcnow()))
    job = submit(api, name="ends", gpus=1)["id"]
    run_one_cycle(api)
    ended = Finished(node="n1", job_id=job, attempt=get_job(api, job)["attempt"], result="FAILED")
    redis = FakeQueueRedis()
    queue_heartbeat(redis, replace(heartbeat("n1", 50.0), recent=(ended,)))
    draining = drain(api, redis)

    sent = [s.upper() for s in statements_while(api, lambda: draining.drain_once())]

    job_lock = next(i for i, s in enumerate(sent) if "FROM JOB" in s and "FOR UPDATE" in s)
    gpu_writes = [i for i, s in enumerate(sent) if s.startswith("UPDATE GPU")]
    assert gpu_writes and job_lock < min(gpu_writes)
    assert get_job(api, job)["status"] == "FAILED"


def test_a_run_order_whose_start_may_be_queued_is_not_sent_again(api: Any) -> None:
    # Started reports wait in the reports queue behind a backlog: the jobs they start are
    # not undelivered, so their run orders are not sent again until the backlog is older.
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=1, now=utcnow()))
    job = submit(api, name="queued start", gpus=1)["id"]
    run_one_cycle(api)
    attempt = get_job(api, job)["attempt"]
    dispatch_timeout_s = 15.0
    later = utcnow() + timedelta(seconds=dispatch_timeout_s + 5)
    redis = FakeQueueRedis()
    started = Started(node="n1", job_id=job, attempt=attempt)
    sealed = seal(started, key=key_for("n1"), now=later.timestamp() - 10)
    redis.lpush(REPORTS_QUEUE, task_message(sealed))
    backlog = report_backlog_s(redis, REPORTS_QUEUE, key_for=key_for, now=later.timestamp())

    def resent(reports_queued_s: float) -> list[int]:
        with api.factory() as session:
            repairs = reconcile(
                session=session,
                now=later,
                heartbeat_timeout_s=3600,
                dispatch_timeout_s=dispatch_timeout_s,
                silence=SilenceJudge(heartbeat_timeout_s=3600),
                reports_queued_s=reports_queued_s,
            )
        return [order.job_id for order in repairs.run]

    assert 9 < backlog < 11
    assert resent(backlog) == []
    assert resent(0.0) == [job]  # judged up to now, it is overdue
