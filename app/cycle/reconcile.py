"""Repairs the world when messages or machines were lost. Runs every few seconds.

- A node whose heartbeats stopped (or whose agent said it stops) becomes NOT_READY; its
  jobs become LOST and go back to the queue without spending a retry, once their
  processes have surely ended there (their watchdog's grace period; at once when the
  node's agent comes back, having ended them before it registers).
- A job scheduled but never reported started is sent run_job again (the agent ignores a
  repeat for an attempt it already started), so losing Redis never loses a job.
- A cancel or preemption not yet carried out is sent again.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import exists, or_, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from app.jobs import agent_reports
from app.jobs.agent_reports import dead_by, mark_lost, requeue_lost
from app.jobs.models import Job
from app.jobs.orders import AfterCommit, released_gates, run_orders, stop_orders
from app.jobs.states import ACTIVE, JobStatus
from app.nodes.models import Allocation, Node, NodeState
from app.nodes.telemetry import register_node
from app.wire import (
    Heartbeat,
    Leaving,
    Order,
    RefusalReason,
    Register,
    RegisterAgain,
    RunJob,
    Started,
    StopJob,
)

log = logging.getLogger("gpusched.reconcile")


@dataclass
class Repairs:
    lost_nodes: list[str] = field(default_factory=list)
    lost_jobs: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)  # LOST ones back in the queue
    run: list[RunJob] = field(default_factory=list)
    stop: list[StopJob] = field(default_factory=list)
    # A report a leaving node carried that was not believed (see agent_reports.Applied.refused).
    refused: list[RefusalReason] = field(default_factory=list)

    @property
    def after(self) -> AfterCommit:
        return AfterCommit.of([*self.run, *self.stop], cycle=bool(self.lost_jobs or self.requeued))


def _lose_silent_nodes(
    session: Session, *, stale_before: datetime, now: datetime, repairs: Repairs
) -> None:
    """Nodes silent since `stale_before` become NOT_READY and their jobs LOST."""
    for node in session.scalars(
        select(Node)
        .where(Node.state == NodeState.READY, Node.last_heartbeat_at < stale_before)
        .with_for_update()
    ):
        log.warning(
            "node %s silent: last heartbeat %s, threshold %s",
            node.name,
            node.last_heartbeat_at.isoformat() if node.last_heartbeat_at else "never",
            stale_before.isoformat(),
        )
        _lose_node(
            session,
            node,
            health=f"no heartbeat since {node.last_heartbeat_at:%Y-%m-%d %H:%M:%S} UTC",
            why=f"node {node.name} stopped responding",
            now=now,
            repairs=repairs,
        )


def node_left(*, session: Session, leaving: Leaving, now: datetime) -> Repairs:
    """Its agent stopped on purpose (a shutdown) and said so: the node is NOT_READY at
    once, not after the heartbeat timeout, so no job is placed where nothing would start
    it. The report carries the outcome of the agent's last attempts (it stopped its
    running ones, which it reports PREEMPTED): they are applied first, since reports may
    be handled out of order. What is still active there was dispatched but not started,
    and goes back to the queue without spending a retry. Committed.

    A report taken before the node's agent last registered is stale (the agent is back)
    and only its outcomes are applied."""
    repairs = Repairs()
    name = leaving.node
    for report in leaving.recent:
        applied = agent_reports.job_finished(session=session, report=report)
        repairs.stop.extend(applied.after.of_type(StopJob))
        if applied.refused:
            repairs.refused.append(applied.refused)
    row = session.scalar(select(Node).where(Node.name == name).with_for_update())
    left_at = heartbeat_taken_at(leaving.taken_at, received_at=now)
    if row is not None and row.state is NodeState.READY and row.registered_at <= left_at:
        log.warning("node %s: its agent stopped", name)
        _lose_node(
            session,
            row,
            health=f"its agent stopped at {left_at:%Y-%m-%d %H:%M:%S} UTC",
            why=f"the agent of node {name} stopped",
            now=now,
            repairs=repairs,
            # It stopped its running attempts before it left, and refused to start new
            # ones: what it could not stop in time its watchdog ends within its grace.
            ended_by=lambda job: (
                dead_by(job, row, since=left_at) if job.status is JobStatus.RUNNING else now
            ),
        )
    session.commit()
    return repairs


def _lose_node(
    session: Session,
    node: Node,
    *,
    health: str,
    why: str,
    now: datetime,
    repairs: Repairs,
    ended_by: Callable[[Job], datetime] | None = None,
) -> None:
    """The node becomes NOT_READY; the jobs holding its GPUs are LOST (requeued once
    their processes there have surely ended: `ended_by`, by default the end of their
    grace period after the node's last heartbeat), and the ranks a gang runs on other
    nodes are stopped."""
    node.state = NodeState.NOT_READY
    node.health_message = health
    repairs.lost_nodes.append(node.name)
    job_ids = session.scalars(
        select(Allocation.job_id)
        .where(Allocation.node_id == node.id, Allocation.released_at.is_(None))
        .distinct()
    ).all()
    for job in session.scalars(
        select(Job).where(Job.id.in_(job_ids), Job.status.in_(ACTIVE)).with_for_update()
    ):
        # Other nodes of a gang may still run ranks of this attempt: stop them.
        stops = stop_orders(session, {job.id: job.attempt}, reason="cancel")
        ends = ended_by(job) if ended_by is not None else dead_by(job, node)
        mark_lost(session=session, job=job, reason=why, ended_by=ends, now=now)
        repairs.lost_jobs.append(job.id)
        repairs.stop.extend(stop for stop in stops if stop.node != node.name)


def reconcile(
    *,
    session: Session,
    now: datetime,
    heartbeat_timeout_s: float,
    dispatch_timeout_s: float,
    silence: SilenceJudge,
    heartbeats_queued_s: float = 0.0,
    reports_queued_s: float = 0.0,
) -> Repairs:
    """Silent nodes are judged only when `silence` allows it; a run that the database
    fails interrupts the judge's trust (heartbeats could not be stored either).

    `heartbeats_queued_s`: how long the oldest heartbeat still waiting in the broker has
    waited (the scheduler's backlog). Every heartbeat sent before then has been stored, so
    silence is judged up to then, not up to now: a node whose heartbeats are only queued
    is not silent. `reports_queued_s`, the same for job reports: an order is overdue only
    if its attempt's start or end is not even in the queue of reports, so a backlog of
    started reports does not have every job it holds sent again (at 1,000 simulated nodes
    that tripled the run orders, docs/benchmarks.md)."""
    try:
        return _repair(
            session,
            now=now,
            heartbeat_timeout_s=heartbeat_timeout_s + max(0.0, heartbeats_queued_s),
            dispatch_timeout_s=dispatch_timeout_s + max(0.0, reports_queued_s),
            judge_nodes=silence.may_judge(now),
        )
    except OperationalError:
        silence.interrupted()
        raise


def _repair(
    session: Session,
    *,
    now: datetime,
    heartbeat_timeout_s: float,
    dispatch_timeout_s: float,
    judge_nodes: bool,
) -> Repairs:
    repairs = Repairs()
    stale_before = now - timedelta(seconds=heartbeat_timeout_s)
    if judge_nodes:
        _lose_silent_nodes(session, stale_before=stale_before, now=now, repairs=repairs)
    for job in session.scalars(
        select(Job)
        .where(Job.status == JobStatus.LOST, Job.lost_until <= now)
        .order_by(Job.id)
        .with_for_update()
    ):
        requeue_lost(session, job=job)
        repairs.requeued.append(job.id)

    overdue = now - timedelta(seconds=dispatch_timeout_s)
    undelivered = session.scalars(
        select(Job).where(
            Job.status == JobStatus.SCHEDULED,
            Job.scheduled_at < overdue,
            Job.dispatch_after.is_(None),  # gated jobs wait for their victims (released_gates)
        )
    ).all()
    repairs.run.extend(run_orders(session, jobs=undelivered))
    repairs.run.extend(released_gates(session))
    for job in session.scalars(
        select(Job).where(
            Job.status.in_(ACTIVE),
            or_(Job.cancel_requested_at < overdue, Job.preempt_requested_at < overdue),
        )
    ):
        cancelling = job.cancel_requested_at is not None
        repairs.stop.extend(
            stop_orders(
                session,
                {job.id: job.attempt},
                reason="cancel" if cancelling else "preempt",
                grace_s=job.cancel_grace_s if cancelling else None,
            )
        )
    session.commit()
    if repairs.lost_nodes or repairs.lost_jobs:
        log.warning("nodes not ready: %s; jobs lost: %s", repairs.lost_nodes, repairs.lost_jobs)
    return repairs


@dataclass
class SilenceJudge:
    """Whether a node's silence is evidence against the node, as seen from one scheduler.

    Heartbeats travel through Redis to this process and are stored in the database. After
    it (re)starts, after a gap in its own reconcile runs (a Redis outage, a paused
    process) or after a run that failed (a database outage), heartbeats may be missing
    through no fault of the nodes; only a full heartbeat timeout of continuous service
    later does silence count again. Otherwise a broker outage would declare every node
    dead and run all their jobs twice.
    """

    heartbeat_timeout_s: float
    _last_run: datetime | None = None
    _trusted_from: datetime | None = None

    def may_judge(self, now: datetime) -> bool:
        if self._last_run is None or (now - self._last_run).total_seconds() > (
            self.heartbeat_timeout_s
        ):
            self._trusted_from = now
        self._last_run = now
        assert self._trusted_from is not None
        return (now - self._trusted_from).total_seconds() >= self.heartbeat_timeout_s

    def interrupted(self) -> None:
        """A run failed (the database is down): heartbeats could not be stored either, so
        the service counts as interrupted from here, however soon the next run comes."""
        self._last_run = None


@dataclass
class NodeRepairs:
    stops: list[StopJob] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    register_again: RegisterAgain | None = None

    @property
    def after(self) -> AfterCommit:
        orders: list[Order] = [*self.stops]
        if self.register_again is not None:
            orders.append(self.register_again)
        return AfterCommit.of(orders, cycle=bool(self.lost or self.finished))


def heartbeat_taken_at(stamp: float | None, *, received_at: datetime) -> datetime:
    """When the agent took a heartbeat's lists of running and finished attempts.

    A heartbeat can be handled long after it was taken (redelivered after a worker died,
    queued behind a backlog); judged by the time it is handled, an attempt that started
    in between looks vanished. The agent's stamp is used, but never a time later than
    receipt, so an agent clock running ahead cannot make the judgement harsher.
    """
    if stamp is None or not math.isfinite(stamp):
        return received_at  # an agent from before the stamp existed
    return min(received_at, datetime.fromtimestamp(stamp, UTC))


def reconcile_node_attempts(
    *, session: Session, heartbeat: Heartbeat, taken_at: datetime, grace_s: float
) -> NodeRepairs:
    """`reconcile_nodes_attempts` for one heartbeat."""
    [repairs] = reconcile_nodes_attempts(
        session=session, heartbeats=[(heartbeat, taken_at)], grace_s=grace_s
    )
    return repairs


def reconcile_nodes_attempts(
    *,
    session: Session,
    heartbeats: Sequence[tuple[Heartbeat, datetime]],
    grace_s: float,
) -> list[NodeRepairs]:
    """Compare what agents report in their heartbeats (each with the time it was taken;
    distinct nodes) with what the database says, in one read of the attempts active on
    their nodes; one NodeRepairs per heartbeat.

    - An attempt the agent runs that is not current on that node is stopped (an orphan of
      a requeued job).
    - An attempt the agent runs that is still SCHEDULED here gets its lost start report;
      one it finished lately that is still active here gets its lost finish report (the
      heartbeat repeats both, so a report lost with Redis or the database heals).
    - A job RUNNING here that the agent neither runs nor finished lately is LOST (its
      process died with a previous agent).
    - A node not known here is asked to register again: its `Register` was lost (with a
      Redis that restarted empty), and it would never be used until its agent restarts.
    """
    names = [heartbeat.node for heartbeat, _ in heartbeats]
    node_ids = {
        name: node_id
        for name, node_id in session.execute(select(Node.name, Node.id).where(Node.name.in_(names)))
    }
    active: dict[int, dict[tuple[int, int], Job]] = defaultdict(dict)
    for node_id, job in session.execute(
        select(Allocation.node_id, Job)
        .join(Allocation, Allocation.job_id == Job.id)
        .where(
            Allocation.node_id.in_(list(node_ids.values())),
            Allocation.released_at.is_(None),
            Job.status.in_(ACTIVE),
        )
    ):
        active[node_id][(job.id, job.attempt)] = job
    # The jobs whose lost start or end a heartbeat repeats, locked by one statement for
    # the batch (at 1,000 nodes heartbeats list most ends before their job reports come).
    due = [
        job_id
        for heartbeat, _ in heartbeats
        for job_id in _reports_due(heartbeat, active.get(node_ids.get(heartbeat.node, -1), {}))
    ]
    locked = agent_reports.lock_reported(session=session, job_ids=due) if due else None
    return [
        _reconcile_node(
            session, heartbeat, node_ids.get(heartbeat.node), active, taken_at, grace_s, locked
        )
        for heartbeat, taken_at in heartbeats
    ]


def _reports_due(heartbeat: Heartbeat, here: Mapping[tuple[int, int], Job]) -> set[int]:
    """The jobs active on the heartbeat's node that it says ended, or runs while they are
    still SCHEDULED here: `_reconcile_node` applies their reports."""
    ended = {(e.job_id, e.attempt) for e in heartbeat.recent}
    running = {(e.job_id, e.attempt) for e in heartbeat.running}
    return {
        job_id
        for (job_id, attempt), job in here.items()
        if (job_id, attempt) in ended
        or ((job_id, attempt) in running and job.status is JobStatus.SCHEDULED)
    }


def _reconcile_node(
    session: Session,
    heartbeat: Heartbeat,
    node_id: int | None,
    active: Mapping[int, Mapping[tuple[int, int], Job]],
    taken_at: datetime,
    grace_s: float,
    locked: agent_reports.LockedJobs | None,
) -> NodeRepairs:
    repairs = NodeRepairs()
    node = heartbeat.node
    if node_id is None:
        # Also when its heartbeat merely overtook its Register: a second one is harmless.
        log.info("heartbeat from %s, a node not registered: asking it to register", node)
        repairs.register_again = RegisterAgain(node=node)
        return repairs
    reported = {(e.job_id, e.attempt) for e in heartbeat.running}
    results = {(e.job_id, e.attempt): e for e in heartbeat.recent}
    # Still active: a gang's attempt may have ended with another node of the batch.
    here = {key: job for key, job in active.get(node_id, {}).items() if job.status in ACTIVE}
    orphans = reported - here.keys()
    if orphans:  # read only then: most heartbeats list nothing that is not active here
        orphans -= _ended_since(session, node_id, taken_at)
        orphans -= _handed_over(session, node_id)
    repairs.stops = [
        StopJob(node=node, job_id=j, attempt=a, reason="cancel") for j, a in sorted(orphans)
    ]
    # Attempts started this long before the heartbeat was taken should be in it.
    settled = taken_at - timedelta(seconds=grace_s)
    for key, job in here.items():
        if key in results:
            applied = agent_reports.job_finished(
                session=session, report=results[key], locked=locked
            )
            if applied.accepted:
                repairs.finished.append(job.id)
                repairs.stops.extend(applied.after.of_type(StopJob))
        elif key in reported:
            # Only a start not yet applied: the report locks the job, and every heartbeat
            # lists every attempt its node runs (at 1,000 nodes, 8 locked reads each,
            # waiting on the job reports' locks).
            if job.status is JobStatus.SCHEDULED:
                agent_reports.job_started(
                    session=session,
                    report=Started(node=node, job_id=key[0], attempt=key[1]),
                    locked=locked,
                )
        elif (
            job.status is JobStatus.RUNNING
            and job.started_at is not None
            and job.started_at < settled
        ):
            # Its agent ended whatever was left of it before it registered.
            mark_lost(
                session=session,
                job=job,
                reason=f"process no longer running on {node}",
                ended_by=taken_at,
                now=taken_at,
            )
            repairs.lost.append(job.id)
    if locked is not None:
        # For the node, before the batch's next heartbeat: its own judge of orphans reads
        # which attempts ended (`_ended_since`).
        locked.release_ended(session)
    return repairs


def _ended_since(session: Session, node_id: int, taken_at: datetime) -> set[tuple[int, int]]:
    """The attempts on a node that ended after a heartbeat was taken: it listed them as
    running, rightly; they are no orphans (handled behind their finished reports, such
    heartbeats had them stopped again, with a warning on the console)."""
    return {
        (job_id, attempt)
        for job_id, attempt in session.execute(
            select(Allocation.job_id, Allocation.attempt).where(
                Allocation.node_id == node_id, Allocation.released_at >= taken_at
            )
        )
    }


def _handed_over(session: Session, node_id: int) -> set[tuple[int, int]]:
    """The attempts on a node being preempted whose GPUs went to the job that preempted
    them at once (apply's `_preempt`): they still run, in their grace period, with their
    stop order sent. No orphans: stopped as such they ended CANCELLED, not requeued."""
    return {
        (job_id, attempt)
        for job_id, attempt in session.execute(
            select(Allocation.job_id, Allocation.attempt)
            .join(Job, Job.id == Allocation.job_id)
            .where(
                Allocation.node_id == node_id,
                Allocation.attempt == Job.attempt,
                Job.status.in_(ACTIVE),
                Job.preempt_requested_at.is_not(None),
            )
        )
    }


def node_registered(*, session: Session, report: Register) -> list[int]:
    """Store an agent's registration; returns the node's LOST jobs requeued for it (none
    when it registered again on request: its attempts still run)."""
    register_node(session=session, report=report)
    return [] if report.again else requeue_lost_on(session=session, node=report.node)


def requeue_lost_on(*, session: Session, node: str) -> list[int]:
    """A node's agent has registered again: it ended what was left of its attempts first
    (workers/agent/service.py), so its LOST ones need not wait out their grace period."""
    node_id = session.scalar(select(Node.id).where(Node.name == node))
    if node_id is None:
        return []
    on_node = exists().where(
        Allocation.job_id == Job.id,
        Allocation.attempt == Job.attempt,
        Allocation.node_id == node_id,
    )
    jobs = session.scalars(
        select(Job).where(Job.status == JobStatus.LOST, on_node).order_by(Job.id).with_for_update()
    ).all()
    for job in jobs:
        requeue_lost(session, job=job)
    return [job.id for job in jobs]
