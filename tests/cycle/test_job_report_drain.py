"""Job reports drained from the `reports` queue in batches (workers/job_reports.py),
against a real Redis (valkey): its Lua scripts move what is taken atomically.

- Consecutive started and finished reports are applied many to a transaction, in queue
  order, and what their commits leave to do is sent once. Their jobs are read, and their
  GPUs released, by statements for the whole run, not for each report.
- Nothing taken is lost: a database failure leaves the batch taken, applied at the next
  round; a dead drain's batch goes back to the front of the queue, oldest first.
- Taken reports count as queued for reconciliation, as queued ones do.
- A message not sealed by the node it names is refused; the rest of its batch is applied.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis as redis_lib
from sqlalchemy import event, func, select
from sqlalchemy.exc import OperationalError

from app.db import utcnow
from app.jobs.orders import AfterCommit
from app.nodes.models import Gpu
from app.wire import REPORTS_QUEUE, Finished, Register, Started, seal
from tests.cycle.jobs_api import get_job, job_events, run_one_cycle, statements_while, submit
from tests.cycle.test_heartbeat_drain import RecordingSender, context, key_for, task_message
from tests.cycle.test_late_success import lost_while_running
from tests.foundation.builders import ready_node
from workers.job_reports import (
    ALIVE_PREFIX,
    TAKEN_PREFIX,
    ReportDrain,
    reports_backlog_s,
    unseal_report,
)


class CountingSender(RecordingSender):
    def __init__(self) -> None:
        super().__init__()
        self.sends = 0
        self.cycles = 0

    def send(self, after: AfterCommit) -> tuple[Any, ...]:
        self.sends += 1
        self.cycles += after.cycle
        return super().send(after)


def drain(
    api: Any,
    redis: redis_lib.Redis,
    *,
    sender: CountingSender | None = None,
    factory: Any = None,
    **kwargs: Any,
) -> ReportDrain:
    return ReportDrain(
        context(api, redis, sender=sender or CountingSender(), factory=factory), **kwargs
    )


def queue(redis: redis_lib.Redis, report: Any, *, key: bytes | None = None, sent_at=None) -> None:
    sealed = seal(report, key=key or key_for(report.node), now=sent_at)
    redis.lpush(REPORTS_QUEUE, task_message(sealed))


def placed_jobs(api: Any, count: int) -> list[tuple[int, int]]:
    """`count` 1-GPU jobs placed on node n1: (job id, attempt) each."""
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=count, now=utcnow()))
    jobs = [submit(api, name=f"j{i}", gpus=1)["id"] for i in range(count)]
    run_one_cycle(api)
    return [(job, get_job(api, job)["attempt"]) for job in jobs]


def commits_while(api: Any, apply: Any) -> int:
    engine = api.factory.kw["bind"]
    commits: list[object] = []
    listener = lambda *_: commits.append(1)  # noqa: E731
    event.listen(engine, "commit", listener)
    try:
        apply()
    finally:
        event.remove(engine, "commit", listener)
    return len(commits)


def test_started_and_finished_reports_are_applied_many_to_a_transaction(
    api: Any, redis: redis_lib.Redis
) -> None:
    jobs = placed_jobs(api, 6)
    for job, attempt in jobs:
        queue(redis, Started(node="n1", job_id=job, attempt=attempt, pid=100 + job))
    for job, attempt in jobs:
        queue(redis, Finished(node="n1", job_id=job, attempt=attempt, result="SUCCEEDED"))
    sender = CountingSender()
    draining = drain(api, redis, sender=sender, per_transaction=5)

    assert commits_while(api, lambda: draining.drain_once()) == 3  # 12 reports, 5 a commit
    for job, _ in jobs:
        assert get_job(api, job)["status"] == "SUCCEEDED"
        steps = [(e["to_status"], e["reason"]) for e in job_events(api, job)][-2:]
        assert steps[0] == ("RUNNING", f"started as pid {100 + job}")  # in queue order
        assert steps[1][0] == "SUCCEEDED"
    assert sender.sends == 3 and sender.cycles == 2  # GPUs freed: a cycle
    assert redis.llen(REPORTS_QUEUE) == 0
    assert redis.llen(draining.taken_key) == 12  # applied, dropped at the next take
    assert draining.take(block_s=0) == [] and redis.llen(draining.taken_key) == 0


class ArrivingSender(CountingSender):
    """Calls `meanwhile` once, from the first send: after a drain's first commit, before
    it has finished its round."""

    def __init__(self, meanwhile: Any) -> None:
        super().__init__()
        self.meanwhile = meanwhile
        self.seen: list[int] = []

    def send(self, after: AfterCommit) -> tuple[Any, ...]:
        if self.meanwhile is not None:
            self.seen.append(self.meanwhile())
            self.meanwhile = None
        return super().send(after)


@pytest.mark.parametrize(("taken_first", "taken_meanwhile"), [(1, 0), (2, 2)])
def test_a_small_batch_is_applied_before_another_drain_takes(
    api: Any, redis: redis_lib.Redis, taken_first: int, taken_meanwhile: int
) -> None:
    # Drains take turns: what arrives while one applies a batch smaller than a
    # transaction waits for the next batch (one transaction, not one each), and a batch
    # of a transaction or more lets the next drain take at once.
    jobs = placed_jobs(api, taken_first + 2)
    for job, attempt in jobs[:taken_first]:
        queue(redis, Started(node="n1", job_id=job, attempt=attempt, pid=100 + job))
    turn = threading.Lock()
    other = drain(api, redis, turn=turn, per_transaction=2)

    def reports_arrive() -> int:
        for job, attempt in jobs[taken_first:]:
            queue(redis, Started(node="n1", job_id=job, attempt=attempt, pid=100 + job))
        return other.drain_once()

    first_sender = ArrivingSender(reports_arrive)
    first = drain(api, redis, sender=first_sender, turn=turn, per_transaction=2)
    assert first.drain_once() == taken_first
    assert first_sender.seen == [taken_meanwhile]
    # What the other drain could not take meanwhile it takes next, in one transaction.
    assert commits_while(api, other.drain_once) == (1 if taken_meanwhile == 0 else 0)
    assert redis.llen(REPORTS_QUEUE) == 0
    assert all(get_job(api, job)["status"] == "RUNNING" for job, _ in jobs)


def test_a_run_of_reports_costs_the_same_statements_however_many_it_holds(
    api: Any, redis: redis_lib.Redis
) -> None:
    jobs = placed_jobs(api, 24)
    statements = []
    for run in (jobs[:4], jobs[4:]):  # 8 reports, then 40: each run one transaction
        for job, attempt in run:
            queue(redis, Started(node="n1", job_id=job, attempt=attempt, pid=100 + job))
            queue(redis, Finished(node="n1", job_id=job, attempt=attempt, result="SUCCEEDED"))
        draining = drain(api, redis, per_transaction=len(run) * 2)
        sent = statements_while(api, lambda d=draining: d.drain_once())
        # But INSERTs: the ORM inserts a flush's events together where the driver allows
        # it (psycopg), one by one on SQLite.
        statements.append(len([s for s in sent if not s.startswith("INSERT")]))
        draining.settle()

    assert statements[0] == statements[1]
    assert all(get_job(api, job)["status"] == "SUCCEEDED" for job, _ in jobs)
    with api.factory() as session:
        assert session.scalar(select(func.sum(Gpu.allocated_milli))) == 0


def test_a_late_success_in_a_run_of_reports_ends_the_job(api: Any, redis: redis_lib.Redis) -> None:
    job = lost_while_running(api)
    queue(redis, Finished(node="n1", job_id=job, attempt=1, result="SUCCEEDED", exit_code=0))

    drain(api, redis).drain_once()

    assert (get_job(api, job)["status"], get_job(api, job)["exit_code"]) == ("SUCCEEDED", 0)


def test_drains_side_by_side_apply_each_report_once(api: Any, redis: redis_lib.Redis) -> None:
    jobs = placed_jobs(api, 8)
    for job, attempt in jobs:
        queue(redis, Started(node="n1", job_id=job, attempt=attempt, pid=100 + job))
        queue(redis, Finished(node="n1", job_id=job, attempt=attempt, result="SUCCEEDED"))
    first, second = drain(api, redis, batch=10), drain(api, redis, batch=10)

    assert first.take(block_s=0) != second.take(block_s=0)  # each its own batch
    assert first.drain_once() == 10 and second.drain_once() == 6
    for job, _ in jobs:
        steps = [e["to_status"] for e in job_events(api, job)][-2:]
        assert steps == ["RUNNING", "SUCCEEDED"]
    first.settle()
    second.settle()
    assert redis.keys(f"{TAKEN_PREFIX}*") == [] and redis.llen(REPORTS_QUEUE) == 0


def test_a_register_is_applied_in_its_place_between_job_reports(
    api: Any, redis: redis_lib.Redis
) -> None:
    [(job, attempt)] = placed_jobs(api, 1)
    queue(redis, Started(node="n1", job_id=job, attempt=attempt))
    queue(redis, Register(node="n2", gpus=()))
    queue(redis, Finished(node="n1", job_id=job, attempt=attempt, result="FAILED", exit_code=2))
    draining = drain(api, redis)

    assert commits_while(api, lambda: draining.drain_once()) == 3
    assert get_job(api, job)["status"] == "FAILED"
    assert get_job(api, job)["exit_code"] == 2
    draining.settle()
    assert redis.llen(draining.taken_key) == 0


def test_a_forged_report_is_refused_and_the_rest_of_its_batch_applied(
    api: Any, redis: redis_lib.Redis
) -> None:
    [(job, attempt), (other, other_attempt)] = placed_jobs(api, 2)
    # Sealed with n2's key while it names n1: a job that reached Redis cannot end another.
    forged = Finished(node="n1", job_id=other, attempt=other_attempt, result="FAILED")
    queue(redis, forged, key=key_for("n2"))
    queue(redis, Finished(node="n1", job_id=job, attempt=attempt, result="SUCCEEDED"))
    redis.lpush(REPORTS_QUEUE, b"not a task message")

    assert drain(api, redis).drain_once() == 3
    assert get_job(api, job)["status"] == "SUCCEEDED"
    assert get_job(api, other)["status"] == "SCHEDULED"


class DatabaseDown:
    """A session factory whose sessions' commits meet a database outage while `down`."""

    def __init__(self, factory: Any) -> None:
        self.factory, self.down = factory, True

    def __call__(self) -> Any:
        session = self.factory()
        if self.down:

            def commit() -> None:
                raise OperationalError("COMMIT", {}, Exception("server closed the connection"))

            session.commit = commit
        return session


def test_a_database_outage_leaves_the_batch_taken_for_the_next_round(
    api: Any, redis: redis_lib.Redis
) -> None:
    [(job, attempt)] = placed_jobs(api, 1)
    queue(redis, Finished(node="n1", job_id=job, attempt=attempt, result="SUCCEEDED"))
    outage = DatabaseDown(api.factory)
    draining = drain(api, redis, factory=outage)

    with pytest.raises(OperationalError):
        draining.drain_once()
    assert get_job(api, job)["status"] == "SCHEDULED"
    assert redis.llen(draining.taken_key) == 1  # not lost, nor back in the queue
    queue(redis, Started(node="n1", job_id=job, attempt=attempt))  # arrived meanwhile
    outage.down = False

    assert draining.drain_once() == 1  # the taken batch first, on its own
    assert get_job(api, job)["status"] == "SUCCEEDED"
    assert draining.drain_once() == 1  # then the queue: a start too late, ignored
    assert get_job(api, job)["status"] == "SUCCEEDED"
    draining.settle()
    assert redis.llen(draining.taken_key) == 0


def test_a_dead_drains_batch_goes_back_to_the_front_of_the_queue(
    api: Any, redis: redis_lib.Redis
) -> None:
    [(first, a1), (second, a2)] = placed_jobs(api, 2)
    queue(redis, Finished(node="n1", job_id=first, attempt=a1, result="SUCCEEDED"))
    queue(redis, Finished(node="n1", job_id=second, attempt=a2, result="SUCCEEDED"))
    dead = drain(api, redis, holder="dead")
    assert len(dead.take(block_s=0)) == 2  # taken, then its process died
    queue(redis, Started(node="n1", job_id=first, attempt=a1))  # newer than the batch
    live = drain(api, redis, holder="live")

    assert live.restore_orphans() == 0  # its holder still said it was alive
    redis.delete(ALIVE_PREFIX + "dead")  # ... until its key expired
    assert live.restore_orphans() == 2
    assert redis.keys(f"{TAKEN_PREFIX}*") == []
    taken = [unseal_report(raw, key_for) for raw in live.take(block_s=0)]
    assert [(r.KIND, r.job_id) for r in taken if isinstance(r, Started | Finished)] == [
        ("finished", first),  # oldest first
        ("finished", second),
        ("started", first),
    ]
    assert live.drain_once() == 3
    assert get_job(api, first)["status"] == "SUCCEEDED"
    assert get_job(api, second)["status"] == "SUCCEEDED"


def test_taken_reports_count_as_queued_for_reconciliation(api: Any, redis: redis_lib.Redis) -> None:
    now = utcnow().timestamp()
    queue(redis, Started(node="n1", job_id=1, attempt=1), sent_at=now - 10)
    queue(redis, Started(node="n1", job_id=2, attempt=1), sent_at=now - 4)
    assert 9.5 < reports_backlog_s(redis, key_for=key_for, now=now) < 10.5
    drain(api, redis).take(block_s=0)  # taken, not yet applied
    assert redis.llen(REPORTS_QUEUE) == 0
    assert 9.5 < reports_backlog_s(redis, key_for=key_for, now=now) < 10.5
