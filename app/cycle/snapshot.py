"""Phase 1 of the cycle: read the database into the pure core's frozen Snapshot."""

from __future__ import annotations

import functools
import json
import math
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from types import MappingProxyType
from typing import Any, cast

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Integer,
    Subquery,
    Text,
    and_,
    any_,
    bindparam,
    func,
    or_,
    select,
    text,
    type_coerce,
    union_all,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

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
    KeptOrder,
    NodeView,
    ProjectView,
    RunningJobView,
    Snapshot,
    UserView,
    WindowInterval,
)
from app.scheduling.types import ReasonKind, ScheduleMode

HISTORY_DAYS = 30

__all__ = ["ClockGates", "QueueMemory", "SnapshotContext", "head_depth", "read_snapshot"]


@dataclass(frozen=True, slots=True)
class SnapshotContext:
    """What apply needs to re-verify the plan: each pending job as read (`pending_rows`:
    its attempt and last change, `gpusched update`, and its reasons as stored)."""

    snapshot: Snapshot
    # A full read's are the view cache's own rows (20,000 at depth: not copied).
    pending_rows: dict[int, CachedRow]
    node_ids: dict[str, int]
    gpu_ids: dict[tuple[int, int], int]  # (node id, index) -> GPU id
    # Derived from the whole history; a quick read reuses them (see QueueMemory).
    usage: dict[int, float]
    attained: dict[int, float]
    # A full read: the last attempt of each job whose service `attained` counts, and when
    # it read (a quick read adds the attempts that ended since).
    attained_through: dict[int, int] = field(default_factory=dict)
    read_at: datetime | None = None
    quick: bool = False
    # A quick read: the remembered head it asked for (some may have left the queue), and
    # the jobs new to the queue it read besides.
    asked: tuple[int, ...] = ()
    arrived: tuple[int, ...] = ()
    # A full read over its limit: some waiting jobs were not read (nor ranked).
    unread: bool = False
    # Where the pending jobs were kept: the reasons apply writes are followed there.
    cache: ViewCache | None = None
    # A job placed behind a preemption waits for its victims to exit (`dispatch_after`):
    # only then need apply look for gates to open (`released_gates`), not every cycle.
    gated: bool = False


def head_depth(nodes: tuple[NodeView, ...]) -> int:
    """How much of the queue a quick cycle reads: enough candidates to fill every GPU a
    few times over (some will not fit), bounded so one query stays small."""
    gpus = sum(len(node.gpus) for node in nodes)
    return min(2000, 64 + 4 * gpus)


# Bounds the list a quick read leaves out (one bind parameter each); past it, arrivals are
# read again until the next full cycle, as before they were remembered.
MAX_ARRIVALS_READ = 2000
# How far before the last full read a quick one looks for attempts that ended: a report's
# time comes from another process's clock.
_ENDED_MARGIN = timedelta(seconds=60)
# How often a full read takes the allocations ended within the usage horizon from the
# database again rather than from those it keeps (`ViewCache.ended`): a row deleted (a
# job purged, by `retention_days` or by hand) leaves no change behind to follow.
_ENDED_READ_WHOLE_EVERY = timedelta(minutes=10)


@dataclass(slots=True)
class CachedRow:
    """A waiting job as a cycle last read it: its change-stamp (`Job.row_version`) then,
    the row, its reason/message/position/estimated start as read or written since, the
    attained service and naming its view was made with, and the view."""

    version: int
    row: Any
    reasons: tuple[Any, ...]
    attained: float
    view: JobView


# A placed job waiting for its victims to exit, as `released_gates` selects it.
_GATED = and_(Job.status == JobStatus.SCHEDULED, Job.dispatch_after.is_not(None)).label("gated")
# A cached row's view, mapped over a whole queue at C speed.
_VIEW_OF = attrgetter("view")


@dataclass
class GpusByNode:
    """The GPUs' views grouped by node in index order, as the core takes them, with each
    GPU's place: kept across cycles and mended where rows changed. At 1,000 nodes,
    grouping 8,000 GPUs anew was a sixth of a quick cycle's snapshot."""

    views: dict[int, list[GpuView]]  # node id -> its GPUs' views, in index order
    slots: dict[int, tuple[int, int]]  # GPU id -> (node id, place among the node's)
    index: dict[int, int]  # GPU id -> its index on the node
    ids: dict[tuple[int, int], int]  # (node id, index) -> GPU id
    frozen: dict[int, tuple[GpuView, ...]] = field(default_factory=dict)  # while unchanged

    @classmethod
    def of(cls, gpus: Iterable[tuple[tuple[Any, ...], GpuView]]) -> GpusByNode:
        """From rows (GPU_COLUMNS) and views in node and index order."""
        grouped = cls(views=defaultdict(list), slots={}, index={}, ids={})
        for gpu, view in gpus:
            gpu_id, node_id, index = gpu[:3]
            views = grouped.views[node_id]
            grouped.slots[gpu_id] = (node_id, len(views))
            views.append(view)
            grouped.index[gpu_id] = index
            grouped.ids[node_id, index] = gpu_id
        return grouped

    def mend(self, gpu_id: int, view: GpuView) -> None:
        """A GPU's new view, in its place."""
        node_id, place = self.slots[gpu_id]
        self.views[node_id][place] = view
        self.frozen.pop(node_id, None)

    def of_node(self, node_id: int) -> tuple[GpuView, ...]:
        views = self.frozen.get(node_id)
        if views is None:
            views = self.frozen[node_id] = tuple(self.views.get(node_id, ()))
        return views


@dataclass
class ViewCache:
    """The waiting jobs a cycle read, by id, for the next cycles: a full cycle reads each
    waiting job's change-stamp (one narrow read) and whole rows only of the jobs whose
    stamp moved or that are new to it, so its read follows what changed, not the queue's
    depth (at 20,000 waiting, reading and converting every row was most of a full cycle,
    bench/deep_queue.py). Every UPDATE of a job moves its stamp (a trigger), whoever
    writes; the cycle's own reason writes move it by one in the same statement, and
    `wrote` follows them here, so they are not read back. A stamp that differs from the
    one kept for any other reason only costs a read. Views are per owner/project naming
    (`names`); a full read keeps only the jobs it read."""

    names: tuple[Any, ...] = ()
    rows: dict[int, CachedRow] = field(default_factory=dict)
    # Jobs whose view was made with some attained service (`_kept_views`); may name jobs
    # no longer in `rows`.
    served: set[int] = field(default_factory=set)
    # How many whole rows the last read took, and how many jobs' stamps a full read
    # looked at (bench/deep_queue.py, tests).
    reread: int = 0
    stamps: int = 0
    # `rows` is in id order unless a job joined it below its highest id (`top`).
    top: int = 0
    in_order: bool = True
    # For the next full read, when the last read every waiting job's stamp (`swept_at`)
    # and its cache holds all of them: which jobs may have changed since (`ChangedSince`),
    # when it read (begin times due since let jobs in) and what the
    # clock's gates let in then (`gated_by`). None: the next full read reads every stamp.
    horizon: ChangedSince | None = None
    read_at: datetime | None = None
    gated_by: tuple[Any, ...] | None = None
    swept_at: datetime | None = None
    # Each GPU's row (GPU_COLUMNS) and the view made of it, by GPU id: a GPU whose row
    # has not changed since keeps its view (at 1,000 nodes, making 8,000 views was a fifth
    # of every snapshot, and a heartbeat changes a node's rows once an interval).
    gpus: dict[int, tuple[tuple[Any, ...], GpuView]] = field(default_factory=dict)
    gpus_by_node: GpusByNode | None = None  # the same views, grouped
    # Each running job's change-stamp, row (JOB_COLUMNS and `_GATED`) and view, by job id,
    # with what the view was made of (the row's first `_MADE_OF` columns, its owner's and
    # project's names and its attained service), and the running view made of that view,
    # the row and the allocations it held (None: made with the cycle's time, not kept).
    running: dict[
        int, tuple[int, tuple[Any, ...], tuple[Any, ...], JobView, RunningJobView | None]
    ] = field(default_factory=dict)
    running_read: int = 0  # how many running jobs' rows the last read took whole
    # The GPU and allocation writes the last read may have missed (PostgreSQL;
    # `_read_gpus`, `_read_allocations`), and how many GPU rows that read took.
    rows_since: ChangedSince | None = None
    gpus_read: int = 0
    # The job writes the last read (full or quick) may have missed, and the clock's gates
    # then (`_gated_by`): a quick read looks for changes in its head from there.
    jobs_since: tuple[ChangedSince, tuple[Any, ...] | None] | None = None
    # The allocations held (not released), by id, as ALLOCATION_COLUMNS; how many
    # allocation rows the last read took; and, on PostgreSQL, those released since the
    # last full read as this cache's reads of what changed saw them (None: not followed).
    held: dict[int, tuple[Any, ...]] | None = None
    allocations_read: int = 0
    # The jobs whose held allocations the last read saw change (None: it read all).
    held_moved: set[int] | None = None
    released: list[tuple[Any, ...]] | None = None
    # On PostgreSQL, the allocations released within the usage horizon, by id, as the last
    # full read from the database took them and the reads of what changed added since
    # (None: read them from the database next), and when that read was.
    ended: dict[int, tuple[Any, ...]] | None = None
    ended_read_at: datetime | None = None

    @property
    def views(self) -> dict[int, JobView]:
        return {job_id: cached.view for job_id, cached in self.rows.items()}

    def wrote(self, changes: Sequence[tuple[Any, ...]], columns: tuple[str, ...]) -> None:
        """Rows of (id, *values of `columns`) written with their stamp moved by one, as
        `app.cycle.apply.write_reasons` does: kept as written. Only for the reason
        columns, which are the ones kept."""
        at = [REASON_COLUMNS.index(column) for column in columns]
        rows = self.rows
        for change in changes:
            cached = rows.get(change[0])
            if cached is None:
                continue
            reasons = list(cached.reasons)
            for i, value in zip(at, change[1:], strict=True):
                reasons[i] = value
            cached.reasons = tuple(reasons)
            cached.version += 1


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
    attained_through: dict[int, int] = field(default_factory=dict)
    read_at: datetime | None = None
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
    # The queue in its policy's one-key order, as the last full cycle left it.
    kept_order: KeptOrder = field(default_factory=KeptOrder)

    def head(self, depth: int) -> list[int]:
        return self.order[:depth]

    def remember(self, ctx: SnapshotContext, queue_order: tuple[int, ...]) -> None:
        if not ctx.quick:
            self.order = list(queue_order)
            self.usage, self.attained = ctx.usage, ctx.attained
            self.attained_through, self.read_at = ctx.attained_through, ctx.read_at
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


def _json_tuple(value: str | None) -> tuple[Any, ...]:
    """A JSON list read as text (SQL NULL and JSON null: empty)."""
    if value is None or value in ("[]", "null"):
        return ()
    return tuple(json.loads(value))


@functools.lru_cache(maxsize=1024)
def _json_pairs(value: str | None) -> tuple[tuple[str, Any], ...]:
    """A JSON object read as text, as its sorted items (SQL NULL and JSON null: empty)."""
    if value is None or value in ("{}", "null"):
        return ()
    return tuple(sorted(json.loads(value).items()))


def _gpu_view(gpu: tuple[Any, ...]) -> GpuView:
    """A GPU's row (GPU_COLUMNS, as a tuple) as the core sees it."""
    (
        _id, _node_id, index, uuid, model, memory_total_mb, memory_used_mb, util_pct,
        foreign_util_pct, foreign_memory_mb, foreign_since, idle_since, temperature_c,
        healthy, unknown_readings, mig_enabled, sampled_at, allocated_milli, nvlink_peers,
    ) = gpu  # fmt: skip
    unknown = _json_tuple(unknown_readings)
    return GpuView(
        index=index,
        uuid=uuid,
        model=model,
        memory_total_mb=memory_total_mb,
        memory_used_mb=memory_used_mb,
        util_pct=util_pct,
        foreign_util_pct=foreign_util_pct,
        foreign_memory_mb=foreign_memory_mb,
        foreign_since=foreign_since,
        idle_since=idle_since,
        temperature_c=temperature_c,
        # An unknown or MIG-enabled GPU is no more usable than a sick one: every check
        # that trusts only healthy GPUs leaves it out; `unknown`/`mig_enabled` say why.
        healthy=healthy and not unknown and not mig_enabled,
        unknown=unknown,
        mig_enabled=mig_enabled,
        telemetry_at=sampled_at,
        allocated_milli=allocated_milli,
        nvlink_peers=_json_tuple(nvlink_peers),
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


# What the core needs of a node and of its GPUs (_gpu_view).
NODE_COLUMNS = (
    Node.id,
    Node.name,
    Node.state,
    Node.drained,
    # JSON objects as their text, decoded once per distinct text (`_json_pairs`): most
    # nodes have the same labels, and decoding 1,000 nodes' two objects took a cycle 30 ms.
    Node.labels.cast(Text).label("labels"),
    _utc(Node.last_heartbeat_at),
    _utc(Node.maintenance_at),
    Node.unusable_accounts.cast(Text).label("unusable_accounts"),
)
GPU_COLUMNS = (
    Gpu.id,
    Gpu.node_id,
    Gpu.index,
    Gpu.uuid,
    Gpu.model,
    Gpu.memory_total_mb,
    Gpu.memory_used_mb,
    Gpu.util_pct,
    Gpu.foreign_util_pct,
    Gpu.foreign_memory_mb,
    _utc(Gpu.foreign_since),
    _utc(Gpu.idle_since),
    Gpu.temperature_c,
    Gpu.healthy,
    # JSON lists as their text (cast in SQL, so that the driver does not decode them
    # either): compared as strings with the kept row, decoded only for a GPU whose row
    # changed (`_json_tuple`). Decoded, they were two thirds of the GPUs' read.
    Gpu.unknown_readings.cast(Text).label("unknown_readings"),
    Gpu.mig_enabled,
    _utc(Gpu.sampled_at),
    Gpu.allocated_milli,
    Gpu.nvlink_peers.cast(Text).label("nvlink_peers"),
)

# An allocation as the snapshot sums and places it, with its job's project (which does
# not change). `_RELEASED`: None while held.
ALLOCATION_COLUMNS = (
    Allocation.id,
    Allocation.job_id,
    Allocation.attempt,
    Allocation.node_id,
    Allocation.gpu_id,
    Allocation.share_milli,
    Allocation.created_at,
    Allocation.released_at,
    Job.project_id,
)
_ALLOCATIONS = select(*ALLOCATION_COLUMNS).join(Job, Job.id == Allocation.job_id)
# The few changed since the last read, each project looked up by the job's key. Joined,
# with the job table's statistics stale after a burst of submissions, PostgreSQL hashed
# the whole table for them: 8 ms of each cycle at 1,000 nodes with 10,000 jobs. For the
# thousands of a full read the join is the cheaper (5 against 10 ms for 10,000).
assert ALLOCATION_COLUMNS[-1] is Job.project_id  # replaced by its subquery below
_CHANGED_ALLOCATIONS = select(
    *ALLOCATION_COLUMNS[:-1],
    select(Job.project_id).where(Job.id == Allocation.job_id).scalar_subquery(),
)
_RELEASED = 7
assert ALLOCATION_COLUMNS[_RELEASED] is Allocation.released_at
# How many allocations are held, in the same statement as the changed ones: an allocation
# deleted while held (its job removed) leaves no change behind, and a count that differs
# from the held ones kept sends the read back to reading them all. Read apart, a release
# committed between the two statements made them differ as well (about one cycle in 30
# during a drain), and it was one more round trip in every cycle. Outer-joined to the
# count, the read gives one row (the count, the rest NULL) when nothing changed.
_HELD_COUNT = select(func.count().label("held")).where(Allocation.released_at.is_(None)).subquery()

# What the core needs of a job; selected as plain columns (no ORM objects) because the
# queue can hold thousands of jobs. The first _MADE_OF columns are what a job's view is
# made of (see _job_view), the JSON lists last among them.
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
    Job.row_version,
)
# The columns of the reasons the cycle writes (app/cycle/apply.py), in JOB_COLUMNS' order.
REASON_COLUMNS = ("pending_reason", "pending_message", "queue_position", "estimated_start_at")
# By position (a row's attribute lookup by name costs more, 20,000 times over): the
# reason, message, position and estimated start, then the last change and the stamp.
_ATTEMPT, _STARTED_AT, _SCHEDULED_AT, _REASON, _UPDATED_AT, _VERSION = 18, 23, 24, 25, 29, 30
assert JOB_COLUMNS[_ATTEMPT] is Job.attempt and JOB_COLUMNS[_REASON] is Job.pending_reason
assert (JOB_COLUMNS[_STARTED_AT].key, JOB_COLUMNS[_SCHEDULED_AT].key) == (
    "started_at",
    "scheduled_at",
)
assert tuple(c.key for c in JOB_COLUMNS[_REASON:_UPDATED_AT]) == REASON_COLUMNS
assert JOB_COLUMNS[_UPDATED_AT].key == "updated_at" and JOB_COLUMNS[_VERSION] is Job.row_version
assert len(JOB_COLUMNS) == _VERSION + 1
# A full read re-reads the jobs whose stamp moved by id, this many per statement; past
# STALE_BY_ID of them (the first cycle, a burst of submissions), the whole queue at once.
_IDS_PER_READ = 500
# A job's view is made of its first columns (through exclude_nodes): `_job_view`.
_MADE_OF = 23
assert JOB_COLUMNS[_MADE_OF - 1].key == "exclude_nodes"
# A running job's row has `_GATED` after JOB_COLUMNS.
_GATED_AT = len(JOB_COLUMNS)
STALE_BY_ID = 2000


def _node_names(value: Any) -> tuple[str, ...] | None:
    """A JSON list of node names as the driver returns it (text, or decoded already)."""
    if value is None or value == "null":
        return None
    if isinstance(value, str):
        return () if value == "[]" else tuple(json.loads(value))
    return tuple(value)


# The views that name no node to avoid share one empty set: the planner tests every
# waiting job's, and an object of its own per job, read anew by each full cycle, cost a
# cache miss per job (perf, bench/deep_queue.py). Schedule modes and names are interned
# for the same reason.
_NO_NODES: frozenset[str] = frozenset()


def _job_view(job: Any, user: tuple[str, str], project: str, attained: float) -> JobView:
    """`job`: a row of JOB_COLUMNS, or its first `_MADE_OF` columns (by position: a row's
    lookups by name cost more); `user`: the owner's name and Unix account."""
    (
        job_id, name, _user_id, _project_id, gpus, gpu_share_milli, gpu_memory_mb, gpu_model,
        nodes, priority, created_at, estimated_runtime_s, max_runtime_s, grace_s, preemptible,
        schedule_mode, begin_at, window, attempt, last_preempted_at, ineligible_s, only_nodes,
        exclude_nodes,
    ) = job[:_MADE_OF]  # fmt: skip
    excluded = _node_names(exclude_nodes)
    return JobView(
        id=job_id,
        name=sys.intern(name),
        user=user[0],
        project=project,
        gpus=gpus,
        gpu_share=None if gpu_share_milli == 1000 else gpu_share_milli / 1000,
        gpu_memory_mb=gpu_memory_mb,
        gpu_model=gpu_model,
        nodes=nodes,
        priority=priority,
        # Time spent held or waiting on dependencies is not time waited.
        submitted_at=created_at + timedelta(seconds=ineligible_s) if ineligible_s else created_at,
        estimated_runtime_s=estimated_runtime_s,
        # A job stopped at its limit may hold its GPUs through its grace period: plans
        # (backfill reservations) count it. The agent's small default is not counted.
        max_runtime_s=max_runtime_s + (grace_s or 0) if max_runtime_s is not None else None,
        grace_s=grace_s or 0,
        preemptible=preemptible,
        schedule_mode=cast(ScheduleMode, sys.intern(schedule_mode)),  # validated on submit
        begin_at=begin_at,
        window=window,
        attempt=attempt,
        last_preempted_at=last_preempted_at,
        attained_gpu_s=attained,
        only_nodes=None if (only := _node_names(only_nodes)) is None else frozenset(only),
        exclude_nodes=frozenset(excluded) if excluded else _NO_NODES,
        unix_user=user[1],
    )


def _pending_views(
    rows: list[Any],
    *,
    users: dict[int, tuple[str, str]],
    project_names: dict[int, str],
    attained: dict[int, float],
    cache: ViewCache,
) -> list[CachedRow]:
    """`rows` (whole rows, as read now) into `cache`, each with its view; the view of a
    job read before is kept when its row is as it was. Returns their entries, in order."""
    names = (tuple(sorted(users.items())), tuple(sorted(project_names.items())))
    if cache.names != names:
        cache.names = names
        for kept in cache.rows.values():  # the names changed: every view anew
            job = kept.row
            kept.view = _job_view(
                job, users[job.user_id], project_names[job.project_id], kept.attained
            )
    known = cache.rows
    entries = []
    for j in rows:
        job_id = j[0]
        got = attained.get(job_id, 0.0)  # not [], which adds every waiting job to it
        cached = known.get(job_id)
        if cached is not None and cached.row[:_MADE_OF] == j[:_MADE_OF] and cached.attained == got:
            # What its view is made of is as it was (a write of other columns moved the
            # stamp): the same view.
            cached.version, cached.row = j[_VERSION], j
            cached.reasons = tuple(j[_REASON:_UPDATED_AT])
        else:
            if cached is None:
                if job_id < cache.top:
                    cache.in_order = False
                else:
                    cache.top = job_id
            cached = known[job_id] = CachedRow(
                version=j[_VERSION],
                row=j,
                reasons=tuple(j[_REASON:_UPDATED_AT]),
                attained=got,
                view=_job_view(j, users[j.user_id], project_names[j.project_id], got),
            )
            if got:
                cache.served.add(job_id)
        entries.append(cached)
    return entries


def _kept_views(
    cache: ViewCache,
    *,
    users: dict[int, tuple[str, str]],
    project_names: dict[int, str],
    attained: dict[int, float],
) -> None:
    """Jobs not read again: a view made with another attained service (an allocation of
    theirs left the usage horizon) is made anew from the row kept. Only the jobs that
    have service now or had it when their view was made can differ (`ViewCache.served`):
    a pass over every waiting job's entry cost a full cycle 5-8 ms at 20,000 waiting.
    `attained` names every job served within the usage horizon (28 days by default), most
    of them long finished: only those still waiting are looked at (the smaller set of
    keys is walked), not 100,000 a cycle."""
    rows, served = cache.rows, cache.served
    for job_id in served.union(i for i in attained.keys() & rows.keys() if attained[i]):
        entry = rows.get(job_id)
        if entry is None:  # left the queue (or is running)
            served.discard(job_id)
            continue
        got = attained.get(job_id, 0.0)
        if entry.attained != got:
            job = entry.row
            entry.attained = got
            entry.view = _job_view(job, users[job.user_id], project_names[job.project_id], got)
        if not got:
            served.discard(job_id)
        else:
            served.add(job_id)


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


def _runnable(columns: Sequence[Any], gates: ClockGates | None) -> Subquery:
    """The waiting jobs the clock lets run, as `columns`: with gates, one part per
    schedule mode, each read by its own index range."""
    if gates is None:
        return select(*columns).where(*ELIGIBLE, NOT_THROTTLED).subquery()
    return union_all(
        *(
            select(*columns).where(*ELIGIBLE, NOT_THROTTLED, *mode)
            for mode in gates.runnable_by_mode()
        )
    ).subquery()


def _full_read(
    session: Session,
    *,
    waiting: tuple[Any, ...],
    gates: ClockGates | None,
    max_pending: int,
    cache: ViewCache,
    made: dict[str, Any],
    now: datetime,
    horizon: ChangedSince,
) -> tuple[list[CachedRow], bool]:
    """Every waiting job (up to `max_pending`, then each project's head in turn), in id
    order, and whether some were left out. Only the jobs that changed since the last full
    read are looked at (`_changed_read`), and of those only the ones whose stamp differs
    from the one kept in `cache`, or that it does not hold, are read whole. Every stamp is
    read instead (`_swept_read`) the first time, once a minute, and when the clock's gates
    let in other jobs than last time. The cache then holds exactly the jobs read.
    `horizon`: the writes not committed before anything was read, which the next read
    asks for."""
    connection = session.connection()
    gated_by = _gated_by(gates)
    entries: list[CachedRow] | None = None
    if (
        cache.horizon is not None
        and cache.gated_by == gated_by
        and cache.swept_at is not None
        and now - cache.swept_at < _SWEEP_EVERY
        and cache.read_at is not None
        and now >= cache.read_at  # a clock set back: what was due may not be now
    ):
        entries = _changed_read(
            connection, waiting=waiting, gates=gates, max_pending=max_pending, cache=cache,
            made=made,
        )  # fmt: skip
    if entries is None:
        entries, unread = _swept_read(
            session, waiting=waiting, gates=gates, max_pending=max_pending, cache=cache,
            made=made,
        )  # fmt: skip
        if unread:  # the cache holds each project's head only: sweep again next time
            cache.horizon = cache.swept_at = None
            return entries, True
        cache.swept_at = now
    cache.horizon, cache.read_at, cache.gated_by = horizon, now, gated_by
    return entries, False


# Every waiting job's stamp is read at least this often: a job deleted while it waits
# (by hand: the service never deletes one that has not ended) leaves no change behind.
_SWEEP_EVERY = timedelta(seconds=60)


@dataclass(frozen=True, slots=True)
class ChangedSince:
    """The writes a read did not see: `Job.changed_in` from `first` on, or in `running`;
    on SQLite, whose new rows carry no stamp, also the jobs of an id above `last_id`."""

    first: int
    running: tuple[int, ...] = ()
    last_id: int | None = None

    def condition(
        self, changed_in: Any = Job.changed_in, row_id: Any = Job.id
    ) -> ColumnElement[bool]:
        """Of jobs, or of another table's rows stamped the same way (`Gpu.changed_in`)."""
        parts = [changed_in >= self.first]
        if self.running:
            parts.append(changed_in.in_(self.running))
        if self.last_id is not None:
            parts.append(row_id > self.last_id)
        return or_(*parts)


def _change_horizon(connection: Any) -> ChangedSince:
    """The writes not committed at this moment, which a read from now on may miss. On
    PostgreSQL, the transactions that had not begun (from the snapshot's xmax on) and
    those still running: transaction ids are handed out in start order, so one running now
    may commit after the read, with an id below those it saw. Not the oldest running one
    on: that would also take every change since it, in any database of the server."""
    if connection.dialect.name == "postgresql":
        first, running = connection.execute(
            text(
                "SELECT pg_snapshot_xmax(s)::text::bigint,"
                " array(SELECT x::text::bigint FROM pg_snapshot_xip(s) AS x)"
                " FROM (SELECT pg_current_snapshot() AS s) AS now"
            )
        ).one()
        return ChangedSince(int(first), tuple(running))
    # SQLite gives a new row an id above the highest there (unless that row was deleted:
    # the sweep once a minute covers it).
    counter, last_id = connection.execute(
        text("SELECT (SELECT n FROM job_change), (SELECT coalesce(max(id), 0) FROM job)")
    ).one()
    return ChangedSince(int(counter) + 1, last_id=int(last_id))


def _gated_by(gates: ClockGates | None) -> tuple[Any, ...] | None:
    """What decides which waiting jobs the clock lets in, besides begin times."""
    if gates is None:
        return None
    return (gates.windows is None, gates.open_windows, gates.outside_fraction > 0)


def _changed_read(
    connection: Any,
    *,
    waiting: tuple[Any, ...],
    gates: ClockGates | None,
    max_pending: int,
    cache: ViewCache,
    made: dict[str, Any],
) -> list[CachedRow] | None:
    """`_full_read` from the jobs changed since the last one (by ix_job_changed_in) and
    those whose begin time came since: a job leaves the cache or joins it only by a write
    of its own row (or its begin time), so the other waiting jobs are as kept. None: more
    jobs wait than one read takes (`_swept_read` picks the heads)."""
    assert cache.horizon is not None and cache.read_at is not None
    stamp = (Job.id, Job.row_version, and_(*waiting).label("runnable"))
    parts = [select(*stamp).where(cache.horizon.condition())]
    if gates is not None:
        parts.append(
            select(*stamp).where(
                Job.status == JobStatus.PENDING,
                Job.schedule_mode == "at",
                Job.begin_at > cache.read_at,
                Job.begin_at <= gates.now,
            )
        )
    known = cache.rows
    stale: dict[int, None] = {}  # ordered, without repeats: a job may be in both parts
    changed = connection.execute(parts[0] if len(parts) == 1 else union_all(*parts)).all()
    cache.stamps = len(changed)
    for job_id, version, runnable in changed:
        cached = known.get(job_id)
        if not runnable:
            if cached is not None:
                del known[job_id]
        elif cached is None or cached.version != version:
            stale[job_id] = None
    rows = _whole_rows(connection, waiting=waiting, ids=list(stale))
    cache.reread = len(rows)
    _pending_views(rows, cache=cache, **made)
    for job_id in stale.keys() - {row[0] for row in rows}:  # left the queue meanwhile
        known.pop(job_id, None)
    if len(known) > max_pending:
        return None
    if not cache.in_order:
        cache.rows = known = dict(sorted(known.items()))
        cache.in_order = True
    _kept_views(cache, **made)
    return list(known.values())


def _job_in(connection: Any, ids: Sequence[int]) -> Iterator[ColumnElement[bool]]:
    """`Job.id IN ids`, a bounded list per read. On PostgreSQL one array parameter (`=
    ANY`): an IN list of 500 parameters cost psycopg more to parse (in Python, the query
    anew each time) than the database to run."""
    for start in range(0, len(ids), _IDS_PER_READ):
        part = list(ids[start : start + _IDS_PER_READ])
        if connection.dialect.name == "postgresql":
            yield Job.id == any_(bindparam("ids", part, type_=ARRAY(Integer)))
        else:
            yield Job.id.in_(part)


def _whole_rows(connection: Any, *, waiting: tuple[Any, ...], ids: list[int]) -> list[Any]:
    """The whole rows of the jobs `ids` that are still waiting."""
    rows: list[Any] = []
    for among in _job_in(connection, ids):
        rows.extend(connection.execute(select(*JOB_COLUMNS).where(*waiting, among)))
    return rows


# A cached job's stamp once a quick read saw its row change without reading it: no row
# has it, so the next read that asks for the job reads it whole.
_UNKNOWN_VERSION = -1


def _head_read(
    connection: Any,
    *,
    waiting: tuple[Any, ...],
    ids: tuple[int, ...],
    since: ChangedSince | None,
    cache: ViewCache,
    made: dict[str, Any],
) -> list[CachedRow]:
    """A quick read's jobs (`ids`: the remembered head and the arrivals), those still
    waiting, in id order: whole rows only of the jobs whose change-stamp moved since the
    cache took them. At 1,000 nodes the head is 2,000 jobs, and reading them whole made
    a quick cycle's snapshot slower than a full one's. With `since` (the last read's
    horizon, the clock's gates as then), the stamps of the jobs changed since, by
    ix_job_changed_in: a job whose row did not change is as waiting as it was. Else the
    stamps of `ids` (2,000 scattered rows took 15-25 ms)."""
    stamp = select(Job.id, Job.row_version, and_(*waiting).label("runnable"))
    known = cache.rows
    kept: list[CachedRow] = []
    stale: list[int] = []
    if since is not None:
        changed = {
            job_id: (version, runnable)
            for job_id, version, runnable in connection.execute(stamp.where(since.condition()))
        }
        cache.stamps = len(changed)
        # Changes to jobs behind the head too: the next read looks only from here on.
        for job_id, (version, runnable) in changed.items():
            cached = known.get(job_id)
            if cached is None:
                continue
            if not runnable:
                del known[job_id]
            elif cached.version != version:
                cached.version = _UNKNOWN_VERSION  # read whole once it is asked for
        stamps: Iterable[tuple[int, int | None, bool]] = (
            (job_id, *changed.get(job_id, (None, True))) for job_id in ids
        )
    else:
        stamps = [
            row
            for among in _job_in(connection, ids)
            for row in connection.execute(stamp.where(among))
        ]
        cache.stamps = len(stamps)
    for job_id, version, runnable in stamps:
        if not runnable:
            continue
        cached = known.get(job_id)
        if cached is not None and (version is None or cached.version == version):
            kept.append(cached)
        else:
            stale.append(job_id)
    rows = _whole_rows(connection, waiting=waiting, ids=stale)
    cache.reread = len(rows)
    entries = _pending_views(rows, cache=cache, **made)
    # A job kept as it was, but whose attained service moved (a quick read counts the
    # attempts that ended since the last full one): its view anew.
    _kept_views(cache, **made)
    entries.extend(kept)
    entries.sort(key=lambda entry: cast(int, entry.row[0]))
    return entries


def _swept_read(
    session: Session,
    *,
    waiting: tuple[Any, ...],
    gates: ClockGates | None,
    max_pending: int,
    cache: ViewCache,
    made: dict[str, Any],
) -> tuple[list[CachedRow], bool]:
    """`_full_read` from every waiting job's stamp (id and row_version)."""
    connection = session.connection()
    # No ORDER BY: each mode's part is then read by its own index range, not the whole
    # queue in id order (SQLite would walk ix_job_status_id to avoid the sort).
    # Through the connection: plain rows, without the ORM's result processing.
    stamps = connection.execute(
        select(_runnable((Job.id, Job.row_version), gates)).limit(max_pending + 1)
    ).all()
    cache.stamps = len(stamps)
    if len(stamps) > max_pending:
        runnable = _runnable(JOB_COLUMNS, gates)
        heads = _project_heads(session, runnable, max_pending)
        cache.reread = len(heads)
        entries = _pending_views(heads, cache=cache, **made)
        cache.rows = {entry.row[0]: entry for entry in entries}
        cache.top, cache.in_order = (entries[-1].row[0] if entries else 0), True
        return entries, True
    known = cache.rows
    present: set[int] = set()
    stale: list[int] = []
    for job_id, version in stamps:
        present.add(job_id)
        cached = known.get(job_id)
        if cached is None or cached.version != version:
            stale.append(job_id)
    if len(stale) > STALE_BY_ID:
        rows: list[Any] = list(connection.execute(select(_runnable(JOB_COLUMNS, gates))))
    else:
        rows = _whole_rows(connection, waiting=waiting, ids=stale)
    cache.reread = len(rows)
    _pending_views(rows, cache=cache, **made)
    # A stale job missing from the second read left the queue meanwhile; one read whole
    # that the first did not see joined it: both reads are the queue as it was at some
    # moment, and the next cycle reads it again.
    read = {row[0] for row in rows}
    fresh = set(stale)
    # `known` is mostly in id order already (as the last full read left it): jobs new to
    # it since (read now, or by a quick read) are at its end, in the order they were read.
    entries = [
        cached
        for job_id, cached in known.items()
        if job_id in read or (job_id in present and job_id not in fresh)
    ]
    ids = [entry.row[0] for entry in entries]
    in_order = ids == sorted(ids)  # linear when sorted, as it mostly is
    if not in_order:
        entries.sort(key=lambda entry: cast(int, entry.row[0]))
    if len(entries) != len(known) or not in_order:
        cache.rows = {entry.row[0]: entry for entry in entries}
    _kept_views(cache, **made)
    cache.top, cache.in_order = (entries[-1].row[0] if entries else 0), True
    return entries, False


def _read_gpus(db: Any, cache: ViewCache, since: ChangedSince | None) -> GpusByNode:
    """Every GPU's view, grouped by node in index order, the removed nodes' too. With
    `since` (PostgreSQL, after the first read), only the rows changed since the last one
    (`Gpu.changed_in`, as `_changed_read` does for jobs): a heartbeat changes a node's
    rows once an interval, so at 1,000 nodes a cycle reads a tenth of the 8,000. A GPU
    whose row is as kept keeps its view (only changed ones are decoded and made), and the
    grouping is mended where views changed."""
    kept, grouped = cache.gpus, cache.gpus_by_node
    if since is not None and kept and grouped is not None:
        changed = db.execute(
            select(*GPU_COLUMNS).where(since.condition(Gpu.changed_in, Gpu.id))
        ).all()
        cache.gpus_read = len(changed)
        moved = False  # a GPU added, or its node or index changed: grouped anew
        mended: list[tuple[int, GpuView]] = []
        for gpu in map(tuple, changed):
            was = kept.get(gpu[0])
            if was is not None and was[0] == gpu:
                continue
            view = _gpu_view(gpu)
            kept[gpu[0]] = (gpu, view)
            if was is None or was[0][1:3] != gpu[1:3]:
                moved = True
            else:
                mended.append((gpu[0], view))
        # No GPU row is deleted, which would leave no change behind: a GPU no longer
        # reported keeps its row, marked unhealthy (register_node), and a removed node
        # keeps its own. (Counting them here cost 2-5 ms of each cycle at 1,000 nodes.)
        if not moved:
            for gpu_id, view in mended:
                grouped.mend(gpu_id, view)
            return grouped
        cache.gpus = dict(sorted(kept.items(), key=lambda item: item[1][0][1:3]))
        cache.gpus_by_node = grouped = GpusByNode.of(cache.gpus.values())
        return grouped
    # As tuples, by position: 8,000 times over, a Row's attribute lookups and its __eq__
    # cost several times a tuple's.
    rows = db.execute(select(*GPU_COLUMNS).order_by(Gpu.node_id, Gpu.index))
    fresh: dict[int, tuple[tuple[Any, ...], GpuView]] = {}
    for gpu in map(tuple, rows):
        was = kept.get(gpu[0])
        fresh[gpu[0]] = was if was is not None and was[0] == gpu else (gpu, _gpu_view(gpu))
    cache.gpus, cache.gpus_read = fresh, len(fresh)
    cache.gpus_by_node = grouped = GpusByNode.of(fresh.values())
    return grouped


def _read_allocations(
    db: Any,
    cache: ViewCache,
    since: ChangedSince | None,
    *,
    ended_from: datetime | None,
    full: bool,
    now: datetime,
) -> list[tuple[Any, ...]]:
    """Brings `cache.held` up to date and returns the allocations released from
    `ended_from` on; None: those released since the last full read (`cache.released`).
    With `since` (PostgreSQL, after the first read), only the rows placed or released
    since the last read are read (`Allocation.changed_in`): at 1,000 nodes the 8,000
    held were read and summed anew each cycle. A `full` read there takes the released
    ones from `cache.ended`, which those reads keep: the usage horizon is four weeks by
    default, and reading it whole cost about 2.5 us per allocation every full cycle.
    Rows as ALLOCATION_COLUMNS' tuples."""
    held = cache.held
    if since is not None and held is not None:
        read = db.execute(
            select(_HELD_COUNT.c.held, *_CHANGED_ALLOCATIONS.selected_columns)
            .select_from(_HELD_COUNT)
            .outerjoin(Allocation, since.condition(Allocation.changed_in, Allocation.id))
        ).all()
        held_now = read[0][0]
        changed = [row[1:] for row in read if row[1] is not None]
        cache.allocations_read = len(changed)
        cache.held_moved = {row[1] for row in changed}
        for row in map(tuple, changed):
            if row[_RELEASED] is None:
                held[row[0]] = row
                continue
            if held.pop(row[0], None) is not None and cache.released is not None:
                cache.released.append(row)
            if cache.ended is not None:  # by id: a row read twice is kept once
                cache.ended[row[0]] = row
        if held_now != len(held):  # see _HELD_COUNT: every held one read, every ended one
            held = cache.ended = None
    if since is None or held is None:  # SQLite, a first read, or one that lost count
        rows = db.execute(_ALLOCATIONS.where(Allocation.released_at.is_(None))).all()
        cache.held = held = {row[0]: row for row in map(tuple, rows)}
        cache.allocations_read, cache.held_moved = len(held), None
    if ended_from is None:
        assert cache.released is not None
        return cache.released
    kept, read_at = cache.ended, cache.ended_read_at
    # (A clock set back would bring back rows that have left: read them then.)
    if (
        full
        and kept is not None
        and read_at is not None
        and read_at <= now < read_at + _ENDED_READ_WHOLE_EVERY
    ):
        for allocation_id in [i for i, row in kept.items() if row[_RELEASED] < ended_from]:
            del kept[allocation_id]  # past the horizon
        return list(kept.values())
    ended = [
        tuple(row) for row in db.execute(_ALLOCATIONS.where(Allocation.released_at >= ended_from))
    ]
    for row in ended:  # released after its stamp was read
        if held.pop(row[0], None) is not None and cache.held_moved is not None:
            cache.held_moved.add(row[1])
    if full and cache.rows_since is not None:  # PostgreSQL: kept by the reads of what changed
        cache.ended, cache.ended_read_at = {row[0]: row for row in ended}, now
    return ended


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
    # Users, and their running limits, in one read (a round trip fewer per cycle).
    user_rows = session.execute(
        select(User.id, User.name, User.unix_user, User.max_running_jobs, User.max_gpus)
    ).all()
    users = {uid: (name, unix_user) for uid, name, unix_user, _, _ in user_rows}
    # Only users with a running limit of their own (filters/running_limit.py).
    limited_users = tuple(
        UserView(name=name, max_running_jobs=jobs, max_gpus=gpus)
        for _, name, _, jobs, gpus in sorted(user_rows, key=lambda row: row[1])
        if jobs is not None or gpus is not None
    )
    projects = list(session.scalars(select(Project)))
    project_names = {p.id: p.name for p in projects}

    # Plain columns, not ORM objects: at 1,000 nodes, their 8,000 GPUs as objects (each
    # GPU's process list parsed from JSON, though no filter reads it) were most of a
    # second of every cycle (docs/benchmarks.md, "The snapshot at 1,000 nodes").
    # Through the connection: the ORM's result layer cost as much again on these rows.
    db = session.connection()
    cache = ViewCache() if views is None else views
    nodes = db.execute(
        select(*NODE_COLUMNS).where(Node.removed_at.is_(None)).order_by(Node.name)
    ).all()
    node_names = {n.id: n.name for n in nodes}
    # Before the reads: the writes they may miss, which the next read asks for. GPUs' and
    # allocations' on PostgreSQL (SQLite's rows carry no stamp, and its cycle reads them
    # all); jobs' on both.
    horizon_now = _change_horizon(db)
    since = cache.rows_since
    cache.rows_since = horizon_now if db.dialect.name == "postgresql" else None
    grouped_before = cache.gpus_by_node
    gpus = _read_gpus(db, cache, since)
    node_views = tuple(
        NodeView(
            name=name,
            ready=state is NodeState.READY,
            drained=drained,
            labels=_json_pairs(labels),
            heartbeat_at=heartbeat_at,
            gpus=gpus.of_node(node_id),
            maintenance_at=maintenance_at,
            unusable_accounts=_json_pairs(unusable_accounts),
        )
        for node_id, name, state, drained, labels, heartbeat_at, maintenance_at, unusable_accounts in (
            nodes
        )
    )

    # Usage: GPU-seconds of every allocation that ran within a few half-lives, decayed by
    # how long ago it ended (held ones count until now). Also each job's attained service.
    horizon = now - timedelta(seconds=max(4 * half_life_s, 86400.0))
    usage: dict[int, float] = defaultdict(float)
    attained: dict[int, float] = defaultdict(float)
    attained_through: dict[int, int] = {}
    # A quick read also takes the attempts that ended since the last full one: as this
    # cache's reads of what changed saw them, else by their end (with a margin for the
    # processes' clocks). `attained_through` keeps any from counting twice.
    ended_from: datetime | None = horizon
    if memory is not None:
        usage.update(memory.usage)
        attained.update(memory.attained)
        if cache.released is not None:
            ended_from = None
        elif memory.read_at is not None:
            ended_from = memory.read_at - _ENDED_MARGIN
    ended = _read_allocations(db, cache, since, ended_from=ended_from, full=not quick, now=now)
    if not quick:
        cache.released = None if cache.rows_since is None else []
    held = cache.held
    assert held is not None
    counted = {} if memory is None else memory.attained_through
    # Unpacked, not by name: a full read takes every allocation ended within the horizon
    # (four half-lives: 28 days by default).
    for _, job_id, attempt, _, gpu_id, share, created, released, project_id in ended:
        if gpu_id is None:
            continue
        gpu_s = max(0.0, (released - created).total_seconds()) * share / 1000
        if not quick:
            age = (now - released).total_seconds()
            decay = math.pow(0.5, age / half_life_s) if half_life_s else 1.0
            usage[project_id] += gpu_s * decay
        # The core adds the current run itself (LAS): count only finished attempts. A
        # quick read counts those the last full one did not: a job preempted since comes
        # back with the service it got, not as a newcomer that could stop the jobs it
        # just made room for.
        if attempt > counted.get(job_id, 0):
            attained[job_id] += gpu_s
            if not quick:
                attained_through[job_id] = max(attained_through.get(job_id, 0), attempt)
    held_by_job: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for allocation in held.values():
        _, job_id, _, _, gpu_id, share, created, _, project_id = allocation
        held_by_job[job_id].append(allocation)
        if not quick and gpu_id is not None:
            usage[project_id] += max(0.0, (now - created).total_seconds()) * share / 1000

    # A job being preempted has handed its GPUs over already: it holds nothing the core
    # may plan with, and must not be picked as a victim again.
    running_now = (Job.status.in_(ACTIVE), Job.preempt_requested_at.is_(None))
    # Their change-stamps, then whole rows only of those changed since the last cycle
    # (a job's start, its end, a preemption all write its row); a job whose row, service
    # and names are as the last cycle made its view from keeps that view. At 1,000 nodes,
    # thousands of rows were read and made into views anew each cycle.
    kept_running, cache.running = cache.running, {}
    # Jobs whose allocations changed; None: any may have (all read, or the GPUs grouped
    # anew: a renumbered GPU changes the placements that name it).
    moved = cache.held_moved if gpus is grouped_before else None
    stamps = db.execute(select(Job.id, Job.row_version).where(*running_now)).all()
    stale = [
        i for i, version in stamps if (was := kept_running.get(i)) is None or was[0] != version
    ]
    read = {
        row[0]: tuple(row)
        for among in _job_in(db, stale)
        for row in db.execute(select(*JOB_COLUMNS, _GATED).where(*running_now, among))
    }
    cache.running_read = len(read)
    active_jobs: list[tuple[Any, ...]] = []
    running_views = []
    for job_id, version in stamps:
        was = kept_running.get(job_id)
        if job_id in read:
            j = read[job_id]
        elif was is not None and was[0] == version:
            j = was[1]
        else:  # no longer running when its row was read
            continue
        active_jobs.append(j)
        made_of = (j[:_MADE_OF], users[j[2]], project_names[j[3]], attained.get(job_id, 0.0))
        if was is not None and was[2] == made_of:
            job_view = was[3]
            # The same row and allocations: the same running view (thousands at 1,000 nodes).
            if was[4] is not None and j is was[1] and moved is not None and job_id not in moved:
                cache.running[job_id] = was
                running_views.append(was[4])
                continue
        else:
            job_view = _job_view(*made_of)
        # What its current attempt holds.
        placement: dict[str, list[int]] = defaultdict(list)
        share = 1000
        for _, _, attempt, node_id, gpu_id, held_share, *_ in held_by_job.get(job_id, ()):
            if attempt == j[_ATTEMPT]:
                on_node = placement[node_names[node_id]]
                if gpu_id is not None:
                    on_node.append(gpus.index[gpu_id])
                share = held_share
        started_at = j[_STARTED_AT] or j[_SCHEDULED_AT]
        running_view = RunningJobView(
            job=job_view,
            placement=tuple((node, tuple(sorted(idx))) for node, idx in sorted(placement.items())),
            started_at=started_at or now,
            share=share / 1000,
        )
        running_views.append(running_view)
        kept = running_view if started_at is not None else None
        cache.running[job_id] = (j[_VERSION], j, made_of, job_view, kept)
    running = tuple(running_views)
    waiting = (*ELIGIBLE, NOT_THROTTLED, *(gates.runnable() if gates is not None else ()))
    asked: tuple[int, ...] = ()
    arrived: tuple[int, ...] = ()
    unread = False
    head_since: ChangedSince | None = None
    made: dict[str, Any] = {"users": users, "project_names": project_names, "attained": attained}
    pending_jobs: list[CachedRow]
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
        last = cache.jobs_since
        head_since = last[0] if last is not None and last[1] == _gated_by(gates) else None
        pending_jobs = _head_read(
            db, waiting=waiting, ids=asked + arrived, since=head_since, cache=cache, made=made
        )
    else:
        pending_jobs, unread = _full_read(
            session, waiting=waiting, gates=gates, max_pending=max_pending, cache=cache,
            made=made, now=now, horizon=horizon_now,
        )  # fmt: skip
    # The next quick read looks for changes from here, if this one saw them all: a quick
    # read by its head's stamps did not (and left the next to do the same).
    followed = not quick or head_since is not None
    cache.jobs_since = (horizon_now, _gated_by(gates)) if followed else None
    pending = tuple(map(_VIEW_OF, pending_jobs))
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
        pending_rows=cache.rows if memory is None else {j.row[0]: j for j in pending_jobs},
        node_ids={n.name: n.id for n in nodes},
        gpu_ids=gpus.ids,
        usage=dict(usage),
        attained=dict(attained),
        attained_through=attained_through,
        read_at=None if quick else now,
        quick=quick,
        asked=asked,
        arrived=arrived,
        unread=unread,
        cache=cache,
        gated=any(row[_GATED_AT] for row in active_jobs),
    )


def attempt_of(row: CachedRow) -> int:
    return cast(int, row.row[_ATTEMPT])


def updated_at_of(row: CachedRow) -> datetime:
    return cast(datetime, row.row[_UPDATED_AT])
