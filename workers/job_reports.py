"""Agents' job reports (register, started, finished, leaving), drained from the `reports`
queue in batches, many to a transaction.

Each report used to be a Celery task of its own: a message taken, a session, a commit, an
acknowledgement and a cycle request each, about 12 ms of the reports process's CPU per
report on a loaded 2-core machine, so that at 1,000 nodes the started and finished
reports queued by the ten thousand (docs/scaling.md). Here each of a few drains (threads
of the reports process, `start_report_drains`) takes up to `batch` queued messages at
once and applies them in queue order, consecutive started and finished reports
`per_transaction` to a transaction, a register or a leaving (or a heartbeat from an agent
that predates their queue) alone, in its place. What a commit leaves to do (a cycle, stop
orders) is sent once per transaction.

Nothing taken is lost. The batch is moved atomically (one Lua script) from the queue into
a list of this drain's own (`TAKEN_PREFIX` + holder) and removed from it only once all of
it is committed: a database outage leaves it there to be applied again (reports are
fenced by attempt, so applying one twice changes nothing), and the batch of a drain that
died goes back to the front of the queue once its holder's liveness key (`ALIVE_PREFIX` +
holder, refreshed before each transaction) has expired: what Celery's late
acknowledgement and visibility timeout did. `reports_backlog_s` counts taken reports as
queued, so that reconciliation never takes a start that waits in a batch for a lost
order.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from app.cycle.reconcile import node_left, node_registered
from app.db import utcnow
from app.jobs import agent_reports
from app.jobs.agent_reports import Applied
from app.jobs.orders import NOTHING, AfterCommit
from app.metrics import REPORT_SECONDS
from app.wire import (
    REPORT_TYPES,
    REPORTS_QUEUE,
    Finished,
    Heartbeat,
    Leaving,
    Refused,
    Register,
    Report,
    Started,
    note_refused,
)
from workers.heartbeats import (
    HEARTBEAT_TRIES,
    RETRYABLE_SQLSTATES,
    ReportsContext,
    handle_heartbeat,
    report_backlog_s,
    sent_at,
    unseal_queued,
)

log = logging.getLogger("gpusched.reports")

# At most this many messages taken at once (a Lua script moves them in one step).
BATCH = 500
# Started and finished reports per transaction: few enough that the jobs' and GPUs' row
# locks are held briefly (a cycle's apply and the heartbeats' transactions take them
# too), many enough that the commit and the cycle request are shared.
PER_TRANSACTION = 20
# Drains in one reports process (`start_report_drains`).
DRAINS = 4
TAKEN_PREFIX = "gpusched:reports:taken:"
ALIVE_PREFIX = "gpusched:reports:alive:"
# A drain that has not said it is alive for this long is dead: its batch goes back. It
# says so before each transaction. Short, since a dead drain's batch counts as queued
# reports (`reports_backlog_s`), which hold back reconciliation's re-sent run orders; a
# live drain's batch put back by mistake is only applied twice, which changes nothing.
ALIVE_TTL_S = 15
RESTORE_EVERY_S = 5.0

# One round trip per round: drops the ARGV[1] messages of the drain's list (KEYS[2]) it has
# applied (its oldest, at the right), says the drain is alive (KEYS[3] for ARGV[3] s),
# moves up to ARGV[2] of the oldest messages of the queue (KEYS[1], pushed left, popped
# right) to the drain's list if it is empty, keeping their order, and returns the list.
_TAKE = """
if tonumber(ARGV[1]) > 0 then redis.call('RPOP', KEYS[2], ARGV[1]) end
redis.call('SET', KEYS[3], '1', 'EX', ARGV[3])
if redis.call('LLEN', KEYS[2]) == 0 then
  local items = redis.call('LRANGE', KEYS[1], -tonumber(ARGV[2]), -1)
  if #items > 0 then
    redis.call('LTRIM', KEYS[1], 0, -#items - 1)
    for i = #items, 1, -1 do redis.call('LPUSH', KEYS[2], items[i]) end
  end
end
return redis.call('LRANGE', KEYS[2], 0, -1)
"""
# Puts a dead drain's batch (KEYS[1]) back at the popping end of the queue (KEYS[2]), its
# oldest message first out, unless its holder (KEYS[3]) is alive after all.
_RESTORE = """
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
local items = redis.call('LRANGE', KEYS[1], 0, -1)
for i = 1, #items do redis.call('RPUSH', KEYS[2], items[i]) end
redis.call('DEL', KEYS[1])
return #items
"""


def reports_backlog_s(redis_client: Any, *, key_for: Callable[[str], bytes], now: float) -> float:
    """How long the oldest job report not yet applied has waited: queued, or taken by a
    drain and not yet committed."""
    waited = report_backlog_s(redis_client, REPORTS_QUEUE, key_for=key_for, now=now)
    for key in redis_client.scan_iter(match=f"{TAKEN_PREFIX}*", count=100):
        oldest = sent_at(redis_client.lindex(key, -1), key_for=key_for)
        if oldest is not None:
            waited = max(waited, now - oldest)
    return waited


def unseal_report(raw: bytes, key_for: Callable[[str], bytes]) -> Report | None:
    """The report a queued message carries; None if it is refused (counted, logged)."""
    report = unseal_queued(raw, types=REPORT_TYPES, key_for=key_for)
    assert report is None or isinstance(report, Register | Heartbeat | Started | Finished | Leaving)
    return report


def _runs(reports: Sequence[Report], per_transaction: int) -> list[Sequence[Report]]:
    """A batch cut into what is applied together, in order: consecutive started and
    finished reports up to `per_transaction`; any other report alone."""
    runs: list[Sequence[Report]] = []
    start = 0
    while start < len(reports):
        end = start + 1
        if isinstance(reports[start], Started | Finished):
            while (
                end < len(reports)
                and end - start < per_transaction
                and isinstance(reports[end], Started | Finished)
            ):
                end += 1
        runs.append(reports[start:end])
        start = end
    return runs


def apply_job_reports(session: Session, reports: Sequence[Started | Finished]) -> list[Applied]:
    """Reports applied in order in the caller's transaction. Their jobs are locked and read
    by one statement and the GPUs of the attempts that ended released together at the end,
    so that a plain start or end reads nothing more (a read per report autoflushed the
    previous report's changes: more CPU than the reports themselves) and the jobs' changes
    are flushed once. Some reports still read, and so flush what came before them: a
    retried job's start (`lifecycle._started_before`), an array task's end (its
    siblings, `outbox.queue_for`), a gang's part (`_release_node`)."""
    locked = agent_reports.lock_reported(session=session, job_ids=[r.job_id for r in reports])
    applied = [
        agent_reports.job_started(session=session, report=report, locked=locked)
        if isinstance(report, Started)
        else agent_reports.job_finished(session=session, report=report, locked=locked)
        for report in reports
    ]
    locked.release_ended(session)
    return applied


class ReportDrain:
    def __init__(
        self,
        context: ReportsContext,
        *,
        batch: int = BATCH,
        per_transaction: int = PER_TRANSACTION,
        holder: str | None = None,
        turn: threading.Lock | None = None,
    ) -> None:
        self.context = context
        self.batch = batch
        self.per_transaction = per_transaction
        # Shared by the drains of a process (`start_report_drains`): see `drain_once`.
        self.turn = turn or threading.Lock()
        self._applied = 0  # of the list's oldest: dropped at the next take
        holder = holder or f"{socket.gethostname()}-{uuid.uuid4().hex[:12]}"  # says whose
        self.taken_key = TAKEN_PREFIX + holder
        self.alive_key = ALIVE_PREFIX + holder
        self._take = self.context.redis.register_script(_TAKE)
        self._restore = self.context.redis.register_script(_RESTORE)
        self._restored_at = -RESTORE_EVERY_S

    def take(self, *, block_s: float) -> list[bytes]:
        """This drain's batch, oldest first: what it took before and has not applied yet
        (a database outage), else up to `batch` queued messages; waits up to `block_s`
        for one. Drops what was applied of the last batch first."""
        keys = [REPORTS_QUEUE, self.taken_key, self.alive_key]
        taken = self._take(keys=keys, args=[self._applied, self.batch, ALIVE_TTL_S])
        self._applied = 0
        if not taken and block_s > 0:
            # Moved as atomically; the rest of a burst comes with the next round.
            first = self.context.redis.brpoplpush(REPORTS_QUEUE, self.taken_key, timeout=block_s)
            taken = [first] if first else []
        return list(reversed(taken))

    def restore_orphans(self) -> int:
        """Put the batches of dead drains back in the queue; how many messages."""
        restored = 0
        for key in self.context.redis.scan_iter(match=f"{TAKEN_PREFIX}*", count=100):
            name = key.decode() if isinstance(key, bytes) else key
            holder = name.removeprefix(TAKEN_PREFIX)
            if name != self.taken_key:
                restored += self._restore(keys=[name, REPORTS_QUEUE, ALIVE_PREFIX + holder])
        if restored:
            log.warning("%d job reports taken by a drain that died are queued again", restored)
        return restored

    def drain_once(self, *, block_s: float = 0.0) -> int:
        """One batch: how many messages were applied (or refused). If the database failed
        the whole batch stays taken, to be applied again at the next round (what was
        committed of it is then only applied twice)."""
        if time.monotonic() - self._restored_at >= RESTORE_EVERY_S:
            self._restored_at = time.monotonic()
            self.restore_orphans()
        # One drain at a time takes, and a batch smaller than a transaction is applied
        # before the next drain may take: what arrives meanwhile waits in the queue and
        # makes the next batch, where the other drains would each have taken a report
        # alone (a transaction each, nearly every report in a drain of short jobs). A
        # batch of a transaction or more is a backlog: the next drain takes at once.
        if not self.turn.acquire(timeout=max(block_s, 0.001)):
            return 0
        raws: list[bytes] = []
        backlog = False
        try:
            raws = self.take(block_s=block_s)
            backlog = len(raws) >= self.per_transaction
            if backlog:
                self.turn.release()
            reports = [unseal_report(raw, self.context.key_for) for raw in raws]
            for run in _runs([r for r in reports if r is not None], self.per_transaction):
                self.context.redis.set(self.alive_key, "1", ex=ALIVE_TTL_S)
                first = run[0]
                if isinstance(first, Started | Finished):
                    self.apply_jobs([r for r in run if isinstance(r, Started | Finished)])
                else:
                    self.apply_alone(first)
        finally:
            if not backlog:
                self.turn.release()
        self._applied = len(raws)
        return len(raws)

    def settle(self) -> None:
        """Drop what was applied from the drain's list (at a stop: else another drain
        would apply it again once this one's liveness key expired)."""
        if self._applied:
            self.context.redis.rpop(self.taken_key, self._applied)
            self._applied = 0

    def apply_jobs(self, reports: Sequence[Started | Finished]) -> None:
        """Started and finished reports in one transaction, in order; one by one if that
        fails (a deadlock, one odd report). A database outage is raised: the reports
        stay taken."""
        if not reports:
            return
        started = time.monotonic()
        with self.context.factory() as session:
            applied: list[tuple[Started | Finished, Applied | None]]
            try:
                applied = list(zip(reports, apply_job_reports(session, reports), strict=True))
                session.commit()
            except Exception as exc:
                session.rollback()
                if len(reports) == 1:
                    applied = [(reports[0], self._apply_one(reports[0]))]
                else:
                    log.warning(
                        "%d job reports failed together (%s); one by one", len(reports), exc
                    )
                    applied = [(r, self._apply_one(r)) for r in reports]
        share = (time.monotonic() - started) / len(reports)
        after = NOTHING
        for report, outcome in applied:
            REPORT_SECONDS.labels(report.KIND).observe(share)
            if outcome is not None:
                _log_outcome(report, outcome)
                after += outcome.after
        self.context.sender.send(after)

    def _apply_one(self, report: Started | Finished) -> Applied | None:
        """One report in its own transaction, a deadlock's victim run again; None when it
        failed for a reason of its own (logged, dropped as a failing task was)."""
        tries = 1
        while True:
            with self.context.factory() as session:
                try:
                    [applied] = apply_job_reports(session, [report])
                    session.commit()
                    return applied
                except OperationalError as exc:
                    session.rollback()
                    retryable = getattr(exc.orig, "sqlstate", None) in RETRYABLE_SQLSTATES
                    if not retryable or tries >= HEARTBEAT_TRIES:
                        raise
                    tries += 1
                except Exception:
                    session.rollback()
                    log.exception("%s report of job %s dropped", report.KIND, report.job_id)
                    return None

    def apply_alone(self, report: Report) -> None:
        """A register, leaving or heartbeat report, in its own transaction."""
        started = time.monotonic()
        with self.context.factory() as session:
            if isinstance(report, Register):
                node_registered(session=session, report=report)
                session.commit()
                log.info("node %s registered", report.node, extra={"node": report.node})
                self.context.sender.send(AfterCommit(cycle=True))
            elif isinstance(report, Leaving):
                left = node_left(session=session, leaving=report, now=utcnow())
                for reason in left.refused:
                    refused = Refused(reason, "in its leaving report", kind=Finished.KIND)
                    note_refused(refused, receiver="scheduler")
                self.context.sender.send(left.after)
            elif isinstance(report, Heartbeat):  # from an agent older than their own queue
                repairs = handle_heartbeat(
                    session=session,
                    heartbeat=report,
                    telemetry=self.context.telemetry,
                    grace_s=self.context.grace_s,
                    now=utcnow(),
                )
                if repairs is not None:
                    self.context.sender.send(repairs.after)
        REPORT_SECONDS.labels(report.KIND).observe(time.monotonic() - started)

    def run(self, stop: threading.Event) -> None:
        """Drain until `stop` is set; Redis or database trouble is logged and waited out
        (what was taken stays taken, and is applied once the database is back)."""
        while not stop.is_set():
            try:
                self.drain_once(block_s=1.0)
            except Exception as exc:
                log.warning("job report drain: %s", exc)
                stop.wait(1.0)
        try:
            self.settle()
        except Exception as exc:  # Redis gone: the batch is put back and applied twice
            log.warning("job report drain: %s", exc)


def start_report_drains(
    count: int, stop: threading.Event, context: ReportsContext
) -> list[threading.Thread]:
    """`count` drains of the same queue in threads of their own, each with its own batch:
    most of a transaction's time is waiting for the database, and with a backlog they
    apply side by side; without one they take turns (`ReportDrain.drain_once`), so that
    reports arriving together share a transaction. Order is kept inside each
    batch, not across drains (a job's end may be applied before its start, which
    `job_finished` allows for). They stop when `stop` is set."""
    turn = threading.Lock()
    threads = [
        threading.Thread(
            target=ReportDrain(context, turn=turn).run,
            args=(stop,),
            name=f"reports-{i}",
            daemon=True,
        )
        for i in range(count)
    ]
    for thread in threads:
        thread.start()
    return threads


def _log_outcome(report: Started | Finished, applied: Applied) -> None:
    context = {"job_id": report.job_id, "attempt": report.attempt, "node": report.node}
    if applied.refused:
        note_refused(Refused(applied.refused, applied.why, kind=report.KIND), receiver="scheduler")
    elif not applied.accepted:
        log.info("ignored %s report: %s", report.KIND, applied.why, extra=context)
    else:
        outcome = report.result if isinstance(report, Finished) else report.KIND
        log.info("job %s attempt %s %s", report.job_id, report.attempt, outcome, extra=context)
