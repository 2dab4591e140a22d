"""Phase 1 of the cycle: read the database into the pure core's frozen Snapshot."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from types import MappingProxyType
from typing import Any

from sqlalchemy import Subquery, Text, func, select, type_coerce, union_all
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session, selectinload

from app.auth.models import User
from app.cycle.eligibility import ELIGIBLE, NOT_THROTTLED, ClockGates
from app.cycle.ranks import LastStored
from app.db import UTCDateTime
from app.jobs.models import Job
from app.jobs.states import ACTIVE, JobStatus
from app.nodes.models import Allocation, Gpu, Node, NodeState
from app.projects.models import Project
from app.scheduling import (
    GpuView,
    JobView,
    NodeView,
    ProjectView,
    RunningJobView,
    Snapshot,
    UserView,
    WindowInterval,
)
from app.scheduling.types import ReasonKind

HISTORY_DAYS = 30

__all__ = ["ClockGates", "QueueMemory", "SnapshotContext", "head_depth", "read_snapshot"]


@dataclass(frozen=True, slots=True)
class SnapshotContext:
    """What apply needs to re-verify the plan: each pending job's attempt and last change
    (`gpusched update`) as read."""

    snapshot: Snapshot
    pending_attempts: dict[int, int]
    pending_updated_at: dict[int, datetime]
    pending_reasons: dict[int, tuple[str | None, str | None, int | None, datetime | None]]
    node_ids: dict[str, int]
    gpu_ids: dict[tuple[str, int], int]
    # Derived from the whole history; a quick read reuses them (see QueueMemory).
    usage: dict[int, float]
    attained: dict[int, float]
    quick: bool = False
    # A quick read: the remembered head it asked for (some may have left the queue), and
    # the jobs new to the queue it read besides.
    asked: tuple[int, ...] = ()
    arrived: tuple[int, ...] = ()
    # A full read over its limit: some waiting jobs were not read (nor ranked).
    unread: bool = False


def head_depth(nodes: tuple[NodeView, ...]) -> int:
    """How much of the queue a quick cycle reads: enough candidates to fill every GPU a
    few times over (some will not fit), bounded so one query stays small."""
    gpus = sum(len(node.gpus) for node in nodes)
    return min(2000, 64 + 4 * gpus)


# Bounds the list a quick read leaves out (one bind parameter each); past it, arrivals are
# read again until the next full cycle, as before they were remembered.
MAX_ARRIVALS_READ = 2000


@dataclass
class ViewCache:
    """The waiting jobs' views a cycle made, by what each was made of (`_view_key`), for
    the next cycles: a full cycle at 20,000 waiting would otherwise build 20,000 views
    again (a quarter of its time, bench/deep_queue.py) when few of them changed. Kept
    for one owner/project naming (`names`); each full read keeps only the views it used."""

    names: tuple[Any, ...] = ()
    views: dict[tuple[Any, ...], JobView] = field(default_factory=dict)


@dataclass
class QueueMemory:
    """What the last full cycle learned, for the quick cycles until the next full one.

    Like Slurm's main scheduling loop (default_queue_depth) next to its periodic full
    pass: a cycle triggered by an event (a job finished, one was submitted) reads only
    the head of the queue in the remembered order, plus jobs new to the queue (submitted
    or requeued since, still marked NEW, read once), and reuses fair-share usage and runtime
    history. Its cost then depends on the cluster's size, not the queue's depth; the full
    cycle every few seconds re-ranks everything.
    """

    # Pending job ids in policy order. Quick cycles re-rank the part they read and drop
    # the jobs that left the queue, so the head they read slides forward as jobs start.
    order: list[int] = field(default_factory=list)
    usage: dict[int, float] = field(default_factory=dict)
    attained: dict[int, float] = field(default_factory=dict)
    history: Mapping[tuple[str, str], tuple[float, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    ready: bool = False
    # New jobs a quick read took in since the last full one. They keep their NEW reason
    # until a full cycle ranks them, but are in `order` now: later quick reads find them
    # there when they reach the head, instead of reading every one of them each time.
    arrivals_read: set[int] = field(default_factory=set)
    views: ViewCache = field(default_factory=ViewCache)
    ranks: LastStored = field(default_factory=LastStored)

    def head(self, depth: int) -> list[int]:
        return self.order[:depth]

    def remember(self, ctx: SnapshotContext, queue_order: tuple[int, ...]) -> None:
        if not ctx.quick:
            self.order = list(queue_order)
            self.usage, self.attained = ctx.usage, ctx.attained
            self.history = ctx.snapshot.runtime_history
            self.arrivals_read = set()
            self.ready = True
            return
        # Asked-for ids missing from the plan's order are no longer pending: forget them
        # (one that comes back, requeued, is new again).
        in_order = set(queue_order)
        seen = set(ctx.asked) | in_order
        self.order = [*queue_order, *(i for i in self.order if i not in seen)]
        self.arrivals_read.difference_update(i for i in ctx.asked if i not in in_order)
        if len(self.arrivals_read) < MAX_ARRIVALS_READ:
            self.arrivals_read.update(ctx.arrived)


def _gpu_view(gpu: Gpu) -> GpuView:
    unknown = tuple(gpu.unknown_readings or ())
    return GpuView(
        index=gpu.index,
        uuid=gpu.uuid,
        model=gpu.model,
        memory_total_mb=gpu.memory_total_mb,
        memory_used_mb=gpu.memory_used_mb,
        util_pct=gpu.util_pct,
        foreign_util_pct=gpu.foreign_util_pct,
        foreign_memory_mb=gpu.foreign_memory_mb,
        foreign_since=gpu.foreign_since,
        idle_since=gpu.idle_since,
        temperature_c=gpu.temperature_c,
        # An unknown or MIG-enabled GPU is no more usable than a sick one: every check
        # that trusts only healthy GPUs leaves it out; `unknown`/`mig_enabled` say why.
        healthy=gpu.healthy and not unknown and not gpu.mig_enabled,
        unknown=unknown,
        mig_enabled=gpu.mig_enabled,
        telemetry_at=gpu.sampled_at,
        allocated_milli=gpu.allocated_milli,
        nvlink_peers=tuple(gpu.nvlink_peers),
    )


class _ReadUTC(UTCDateTime):
    """UTCDateTime read in one step: SQLite's text by `datetime.fromisoformat` (C) instead
    of the generic type's regular expression and then a second pass for the zone;
    PostgreSQL's as the driver made them (aware, so the type's check had nothing to do). Seven
    such columns of 20,000 waiting jobs were a third of the snapshot's read."""

    cache_ok = True

    def result_processor(self, dialect: Dialect, coltype: object) -> Any:
        if dialect.name == "postgresql":
            return None  # timestamptz: the driver's datetimes carry their zone already
        if dialect.name != "sqlite":
            return super().result_processor(dialect, coltype)

        def process(value: Any) -> datetime | None:
            if value is None:
                return None
            if isinstance(value, str):
                value = datetime.fromisoformat(value)
            stamp: datetime = value
            return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)

        return process


def _utc(column: Any) -> Any:
    return type_coerce(column, _ReadUTC).label(column.key)


# What the core needs of a job; selected as plain columns (no ORM objects) because the
# queue can hold thousands of jobs and every cycle reads all of them. The first
# VIEW_COLUMNS are what a job's view is made of (see _view_key), the JSON lists next.
JOB_COLUMNS = (
    Job.id,
    Job.name,
    Job.user_id,
    Job.project_id,
    Job.gpus,
    Job.gpu_share_milli,
    Job.gpu_memory_mb,
    Job.gpu_model,
    Job.nodes,
    Job.priority,
    _utc(Job.created_at),
    Job.estimated_runtime_s,
    Job.max_runtime_s,
    Job.grace_s,
    Job.preemptible,
    Job.schedule_mode,
    _utc(Job.begin_at),
    Job.window,
    Job.attempt,
    _utc(Job.last_preempted_at),
    Job.ineligible_s,
    # As stored (JSON text on SQLite): decoded by _node_names, only when not empty. Decoding
    # every waiting job's "[]" through the JSON type was a third of this read's time.
    type_coerce(Job.only_nodes, Text).label("only_nodes"),
    type_coerce(Job.exclude_nodes, Text).label("exclude_nodes"),
    _utc(Job.started_at),
    _utc(Job.scheduled_at),
    Job.pending_reason,
    Job.pending_message,
    Job.queue_position,
    _utc(Job.estimated_start_at),
    _utc(Job.updated_at),
)
VIEW_COLUMNS = 21
# By position (a row's attribute lookup by name costs more, 20,000 times over): the
# reason, message, position and estimated start, then the last change.
_ATTEMPT, _REASON, _UPDATED_AT = 18, 25, 29
assert JOB_COLUMNS[_ATTEMPT] is Job.attempt and JOB_COLUMNS[_REASON] is Job.pending_reason
assert JOB_COLUMNS[_UPDATED_AT].key == "updated_at" and len(JOB_COLUMNS) == _UPDATED_AT + 1


def _node_names(value: Any) -> tuple[str, ...] | None:
    """A JSON list of node names as the driver returns it (text, or decoded already)."""
    if value is None or value == "null":
        return None
    if isinstance(value, str):
        return () if value == "[]" else tuple(json.loads(value))
    return tuple(value)


def _view_key(job: Any, attained: float) -> tuple[Any, ...]:
    """Everything `_job_view` makes a job's view of, hashable: equal keys, equal views.
    Its owner's and project's names are not in it: a ViewCache is per naming."""
    return (
        tuple(job[:VIEW_COLUMNS]),
        _node_names(job.only_nodes),
        _node_names(job.exclude_nodes) or (),
        attained,
    )


def _job_view(job: Any, user: tuple[str, str], project: str, attained: float) -> JobView:
    """`user`: the owner's name and Unix account."""
    return JobView(
        id=job.id,
        name=job.name,
        user=user[0],
        project=project,
        gpus=job.gpus,
        gpu_share=None if job.gpu_share_milli == 1000 else job.gpu_share_milli / 1000,
        gpu_memory_mb=job.gpu_memory_mb,
        gpu_model=job.gpu_model,
        nodes=job.nodes,
        priority=job.priority,
        # Time spent held or waiting on dependencies is not time waited.
        submitted_at=job.created_at + timedelta(seconds=job.ineligible_s)
        if job.ineligible_s
        else job.created_at,
        estimated_runtime_s=job.estimated_runtime_s,
        # A job stopped at its limit may hold its GPUs through its grace period: plans
        # (backfill reservations) count it. The agent's small default is not counted.
        max_runtime_s=job.max_runtime_s + (job.grace_s or 0)
        if job.max_runtime_s is not None
        else None,
        grace_s=job.grace_s or 0,
        preemptible=job.preemptible,
        schedule_mode=job.schedule_mode,  # validated on submit
        begin_at=job.begin_at,
        window=job.window,
        attempt=job.attempt,
        last_preempted_at=job.last_preempted_at,
        attained_gpu_s=attained,
        only_nodes=None if (only := _node_names(job.only_nodes)) is None else frozenset(only),
        exclude_nodes=frozenset(_node_names(job.exclude_nodes) or ()),
        unix_user=user[1],
    )


def _pending_views(
    rows: list[Any],
    *,
    users: dict[int, tuple[str, str]],
    project_names: dict[int, str],
    attained: dict[int, float],
    cache: ViewCache | None,
    keep_all: bool,
) -> tuple[JobView, ...]:
    """The views of `rows`, from `cache` where a row is as it was when its view was made.
    `keep_all`: the rows are the whole queue, so the cache keeps only their views."""
    if cache is None:
        cache = ViewCache()
    names = (tuple(sorted(users.items())), tuple(sorted(project_names.items())))
    if cache.names != names:
        cache.names, cache.views = names, {}
    known = cache.views
    used: dict[tuple[Any, ...], JobView] = {}
    views = []
    for j in rows:
        key = _view_key(j, attained[j[0]])
        view = known.get(key)
        if view is None:
            view = _job_view(j, users[j.user_id], project_names[j.project_id], key[3])
        used[key] = view
        views.append(view)
    if keep_all:
        cache.views = used
    else:
        known.update(used)
    return tuple(views)


def _project_heads(session: Session, runnable: Subquery, limit: int) -> list[Any]:
    """More jobs can run than one read takes: each project's first job, then each one's
    second, and so on, up to `limit`, so that one project's deep queue never hides another
    project's jobs (issue 34). Within a project by priority, then submission, as the
    queue policies order it; the planner then orders what was read."""
    head_rank = func.row_number().over(
        partition_by=runnable.c.project_id,
        order_by=(runnable.c.priority.desc(), runnable.c.id),
    )
    ranked = select(runnable, head_rank.label("head_rank")).subquery()
    rows = (
        session.connection()
        .execute(select(ranked).order_by(ranked.c.head_rank, ranked.c.id).limit(limit))
        .all()
    )
    return sorted(rows, key=lambda row: row.id)


def read_snapshot(
    *,
    session: Session,
    now: datetime,
    half_life_s: float,
    windows: tuple[WindowInterval, ...] = (),
    max_pending: int = 20_000,
    quick_from: QueueMemory | None = None,
    quick_new_limit: int = 500,
    gates: ClockGates | None = None,
    views: ViewCache | None = None,
) -> SnapshotContext:
    """The whole queue, or with `quick_from` a quick read: the remembered head of the
    queue plus up to `quick_new_limit` jobs new to it that no quick read took in yet (see
    QueueMemory).

    With `gates`, only jobs the clock lets run now are read (app/cycle/eligibility.py):
    the others get their reasons without the planner. A full read takes at most
    `max_pending` jobs; past that, each project's head in turn (see `_project_heads`).
    With `views`, pending jobs that have not changed since a cycle kept their views there
    reuse them."""
    # Nothing remembered yet (the first cycle of this process): read everything.
    memory = quick_from if quick_from is not None and quick_from.ready else None
    quick = memory is not None
    users = {
        uid: (name, unix_user)
        for uid, name, unix_user in session.execute(select(User.id, User.name, User.unix_user))
    }
    # Only users with a running limit of their own (filters/running_limit.py).
    limited_users = tuple(
        UserView(name=name, max_running_jobs=jobs, max_gpus=gpus)
        for name, jobs, gpus in session.execute(
            select(User.name, User.max_running_jobs, User.max_gpus)
            .where(User.max_running_jobs.is_not(None) | User.max_gpus.is_not(None))
            .order_by(User.name)
        )
    )
    projects = list(session.scalars(select(Project)))
    project_names = {p.id: p.name for p in projects}

    nodes = list(
        session.scalars(
            select(Node)
            .options(selectinload(Node.gpus))
            .where(Node.removed_at.is_(None))
            .order_by(Node.name)
        )
    )
    node_views = tuple(
        NodeView(
            name=n.name,
            ready=n.state is NodeState.READY,
            drained=n.drained,
            labels=tuple(sorted(n.labels.items())),
            heartbeat_at=n.last_heartbeat_at,
            gpus=tuple(_gpu_view(g) for g in n.gpus),
            maintenance_at=n.maintenance_at,
            unusable_accounts=tuple(sorted((n.unusable_accounts or {}).items())),
        )
        for n in nodes
    )
    node_names = {n.id: n.name for n in nodes}
    gpu_index = {g.id: g.index for n in nodes for g in n.gpus}

    # Usage: GPU-seconds of every allocation that ran within a few half-lives, decayed by
    # how long ago it ended (running ones count until now). Also each job's attained service.
    horizon = now - timedelta(seconds=max(4 * half_life_s, 86400.0))
    usage: dict[int, float] = defaultdict(float)
    attained: dict[int, float] = defaultdict(float)
    if memory is not None:
        usage.update(memory.usage)
        attained.update(memory.attained)
    placements: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    shares: dict[int, int] = {}
    # Plain columns, not ORM objects: a busy day leaves thousands of finished allocations
    # inside the horizon, and this runs every cycle.
    alloc_rows = session.execute(
        select(
            Allocation.job_id,
            Allocation.attempt,
            Allocation.node_id,
            Allocation.gpu_id,
            Allocation.share_milli,
            Allocation.created_at,
            Allocation.released_at,
            Job.project_id,
            Job.status,
            Job.attempt.label("job_attempt"),
        )
        .join(Job, Job.id == Allocation.job_id)
        .where(
            Allocation.released_at.is_(None)
            if quick
            else (Allocation.released_at.is_(None)) | (Allocation.released_at >= horizon)
        )
    ).all()
    for alloc in alloc_rows:
        end = alloc.released_at or now
        if alloc.gpu_id is not None and not quick:
            gpu_s = max(0.0, (end - alloc.created_at).total_seconds()) * alloc.share_milli / 1000
            age = (now - end).total_seconds()
            decay = math.pow(0.5, age / half_life_s) if half_life_s else 1.0
            usage[alloc.project_id] += gpu_s * decay
            if alloc.released_at is not None:
                # The core adds the current run itself (LAS): count only finished attempts.
                attained[alloc.job_id] += gpu_s
        if (
            alloc.released_at is None
            and alloc.status in ACTIVE
            and alloc.attempt == alloc.job_attempt
        ):
            node = node_names[alloc.node_id]
            gpus = placements[alloc.job_id][node]
            if alloc.gpu_id is not None:
                gpus.append(gpu_index[alloc.gpu_id])
            shares[alloc.job_id] = alloc.share_milli

    # A job being preempted has handed its GPUs over already: it holds nothing the core
    # may plan with, and must not be picked as a victim again.
    active_jobs = session.execute(
        select(*JOB_COLUMNS).where(Job.status.in_(ACTIVE), Job.preempt_requested_at.is_(None))
    ).all()
    running = tuple(
        RunningJobView(
            job=_job_view(j, users[j.user_id], project_names[j.project_id], attained[j.id]),
            placement=tuple(
                (node, tuple(sorted(idx))) for node, idx in sorted(placements[j.id].items())
            ),
            started_at=j.started_at or j.scheduled_at or now,
            share=shares.get(j.id, 1000) / 1000,
        )
        for j in active_jobs
    )
    waiting = (*ELIGIBLE, NOT_THROTTLED, *(gates.runnable() if gates is not None else ()))
    pending_query = select(*JOB_COLUMNS).where(*waiting).order_by(Job.id)
    asked: tuple[int, ...] = ()
    arrived: tuple[int, ...] = ()
    unread = False
    pending_jobs: list[Any]
    if memory is not None:
        asked = tuple(memory.head(head_depth(node_views)))
        # New jobs' ids first (one narrow read), then whole rows of the head and of the
        # new jobs not read before: arrivals do not pile up in every quick read.
        known = memory.arrivals_read.union(asked)
        # All of them, sorted here: ordered by id, the database would walk the whole queue
        # in id order instead of the new ones by ix_job_pending_reason.
        new_ids = sorted(
            session.scalars(
                select(Job.id).where(*waiting, Job.pending_reason == ReasonKind.NEW.value)
            )
        )
        arrived = tuple(i for i in new_ids if i not in known)[:quick_new_limit]
        pending_jobs = list(
            session.connection().execute(pending_query.where(Job.id.in_(asked + arrived)))
        )
    else:
        if gates is None:
            runnable = select(*JOB_COLUMNS).where(*waiting).subquery()
        else:
            runnable = union_all(
                *(
                    select(*JOB_COLUMNS).where(*ELIGIBLE, NOT_THROTTLED, *mode)
                    for mode in gates.runnable_by_mode()
                )
            ).subquery()
        # No ORDER BY: each mode's part is then read by its own index range, not the whole
        # queue in id order (SQLite would walk ix_job_status_id to avoid the sort).
        # Through the connection: plain rows, without the ORM's result processing (half
        # of this read's time at 20,000 rows).
        pending_jobs = list(
            session.connection().execute(select(runnable).limit(max_pending + 1)).all()
        )
        unread = len(pending_jobs) > max_pending
        if unread:
            pending_jobs = _project_heads(session, runnable, max_pending)
        else:
            pending_jobs.sort(key=attrgetter("id"))
    pending = _pending_views(
        pending_jobs,
        users=users,
        project_names=project_names,
        attained=attained,
        cache=views,
        keep_all=not quick,
    )
    history: dict[tuple[str, str], list[float]] = defaultdict(list)
    for user_id, name, started, finished in (
        ()
        if quick
        else session.execute(
            select(Job.user_id, Job.name, Job.started_at, Job.finished_at)
            .where(
                Job.status == JobStatus.SUCCEEDED,
                Job.finished_at >= now - timedelta(days=HISTORY_DAYS),
            )
            .order_by(Job.id.desc())
            .limit(5000)
        )
    ):
        if started is not None and finished is not None:
            history[(users[user_id][0], name)].append((finished - started).total_seconds())

    snapshot = Snapshot(
        nodes=node_views,
        pending=pending,
        running=running,
        projects=tuple(
            ProjectView(
                name=p.name,
                quota_gpus=p.gpu_quota,
                weight=p.weight,
                usage_gpu_s=usage[p.id],
                max_running_jobs=p.max_running_jobs,
                max_gpus=p.max_gpus,
            )
            for p in projects
        ),
        users=limited_users,
        windows=windows,
        runtime_history=(
            memory.history
            if memory is not None
            else MappingProxyType({k: tuple(v) for k, v in history.items()})
        ),
    )
    return SnapshotContext(
        snapshot=snapshot,
        pending_attempts={j[0]: j[_ATTEMPT] for j in pending_jobs},
        pending_updated_at={j[0]: j[_UPDATED_AT] for j in pending_jobs},
        pending_reasons={j[0]: tuple(j[_REASON:_UPDATED_AT]) for j in pending_jobs},
        node_ids={n.name: n.id for n in nodes},
        gpu_ids={(n.name, g.index): g.id for n in nodes for g in n.gpus},
        usage=dict(usage),
        attained=dict(attained),
        quick=quick,
        asked=asked,
        arrived=arrived,
        unread=unread,
    )
