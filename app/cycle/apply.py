"""Phase 3 of the cycle: write the plan in one transaction, re-verifying each placement
against the current rows (optimistic concurrency, as Nomad's plan applier). What changed
since the snapshot is skipped and tried again next cycle; the allocation constraints are
the last line of defence."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, literal_column, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.cycle import lease
from app.cycle.snapshot import (
    REASON_COLUMNS,
    SnapshotContext,
    attempt_of,
    updated_at_of,
)
from app.jobs.allocations import GpuClaim, allocate_many, release
from app.jobs.lifecycle import schedule_placed
from app.jobs.models import PENDING_MESSAGE_CHARS, Job, JobEvent
from app.jobs.orders import AfterCommit, released_gates, run_orders, stop_orders
from app.jobs.ranking import ROW as RANKING_ROW
from app.jobs.ranking import QueueRanking
from app.jobs.states import ACTIVE, JobStatus
from app.nodes.models import Node, NodeState
from app.projects.models import Project
from app.scheduling import PendingReason, Placement, Plan, Preemption
from app.scheduling.stored import changed_reasons, still_waiting
from app.scheduling.types import ReasonKind
from app.wire import RunJob, StopJob

log = logging.getLogger("gpusched.cycle")


@dataclass
class Applied:
    placed: list[int] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)
    dispatches: list[RunJob] = field(default_factory=list)
    stops: list[StopJob] = field(default_factory=list)
    lease_lost: bool = False
    # The jobs left waiting, in queue order (position i + 1).
    waiting: Sequence[PendingReason] = ()

    @property
    def after(self) -> AfterCommit:
        return AfterCommit.of([*self.dispatches, *self.stops])


def _claims(ctx: SnapshotContext, placement: Placement) -> list[GpuClaim]:
    share_milli = 1000 if placement.share >= 1 else max(1, round(placement.share * 1000))
    claims = []
    for rank, (node, gpus) in enumerate(placement.node_gpus):
        node_id = ctx.node_ids[node]
        if not gpus:  # a CPU-only job holds a slot on the node, no GPU
            claims.append(GpuClaim(node_id=node_id, gpu_id=None, share_milli=1000, rank=rank))
        claims.extend(
            GpuClaim(
                node_id=node_id,
                gpu_id=ctx.gpu_ids[(node_id, index)],
                share_milli=share_milli,
                rank=rank,
            )
            for index in gpus
        )
    return claims


def _preempt(
    session: Session, *, preemption: Preemption, now: datetime, applied: Applied
) -> int | None:
    """Ask the victim to stop. With a beneficiary, its GPUs are handed over at once (the
    beneficiary's dispatch waits for the victim's exit), so a requeued victim that sorts
    earlier can never take them back. Returns the attempt being stopped, None when the
    victim is no longer one."""
    victim = session.scalar(select(Job).where(Job.id == preemption.victim_job_id).with_for_update())
    if (
        victim is None
        or victim.status not in ACTIVE
        or not victim.preemptible
        or victim.preempt_requested_at is not None
    ):
        return None
    victim.preempt_requested_at = now
    session.add(
        JobEvent(
            job_id=victim.id,
            at=now,
            from_status=victim.status,
            to_status=victim.status,
            attempt=victim.attempt,
            actor="scheduler",
            reason=(
                f"preempting for job {preemption.for_job_id}: {preemption.reason}"
                if preemption.for_job_id
                else f"preempting: {preemption.reason}"
            ),
        )
    )
    applied.stops.extend(stop_orders(session, {victim.id: victim.attempt}, reason="preempt"))
    if preemption.for_job_id:
        release(session, job_id=victim.id, attempt=victim.attempt)
    return victim.attempt


def apply_plan(
    session: Session,
    *,
    ctx: SnapshotContext,
    plan: Plan,
    token: int,
    now: datetime,
) -> Applied:
    applied = Applied()
    if not lease.released_on_commit(session, token=token, now=now):
        session.rollback()
        applied.lease_lost = True
        return applied

    # Victims first: their hand-over frees the GPUs their beneficiaries are placed on.
    preempted = {
        p.victim_job_id: attempt
        for p in plan.preemptions
        if (attempt := _preempt(session, preemption=p, now=now, applied=applied)) is not None
    }
    placements = []
    for placement in plan.placements:
        if any(v not in preempted for v in placement.after_preemption_of):
            applied.skipped[placement.job_id] = "a preemption it needs did not happen"
        else:
            placements.append(placement)
    verified = _verified(session, ctx=ctx, placements=placements, applied=applied)
    placed = _schedule(session, ctx=ctx, verified=verified, applied=applied)
    applied.placed.extend(job.id for _, job in placed)
    for placement, job in placed:
        if placement.after_preemption_of:  # sent once these attempts have ended
            job.dispatch_after = [[v, preempted[v]] for v in placement.after_preemption_of]
    applied.dispatches.extend(
        run_orders(session, jobs=[job for p, job in placed if not p.after_preemption_of])
    )
    if ctx.gated:
        applied.dispatches.extend(released_gates(session))
    applied.waiting = _store_reasons(session, ctx=ctx, plan=plan, placed=set(applied.placed))
    if not ctx.quick:  # a quick read reuses the usage of the last full one
        _store_usage(session, usage=ctx.usage, now=now)
    session.commit()  # which also releases the lease (lease.released_on_commit)
    return applied


def _store_usage(session: Session, *, usage: dict[int, float], now: datetime) -> None:
    """Each project's fair-share usage this cycle ranked by, for `gpusched queues` (as
    Slurm's sshare): users see why another project's jobs go first."""
    if usage:
        session.execute(
            update(Project),
            [{"id": pid, "usage_gpu_s": gpu_s, "usage_at": now} for pid, gpu_s in usage.items()],
        )


def _verified(
    session: Session, *, ctx: SnapshotContext, placements: list[Placement], applied: Applied
) -> list[tuple[Placement, Job]]:
    """The placements whose job is still as the snapshot saw it, locked, on nodes still
    ready; the others are skipped with the reason. One read for all jobs (locked in id
    order, so racing writers never wait on each other crosswise) and one for the nodes."""
    if not placements:
        return []
    jobs = {
        job.id: job
        for job in session.scalars(
            select(Job)
            .where(Job.id.in_([p.job_id for p in placements]))
            .order_by(Job.id)
            .with_for_update()
        )
    }
    ready = set(
        session.scalars(
            select(Node.name).where(
                Node.name.in_({n for p in placements for n, _ in p.node_gpus}),
                Node.state == NodeState.READY,
                Node.drained.is_(False),
            )
        )
    )
    verified = []
    for placement in placements:
        job = jobs.get(placement.job_id)
        read = ctx.pending_rows.get(placement.job_id)
        if (
            job is None
            or read is None
            or job.status is not JobStatus.PENDING
            or job.attempt != attempt_of(read)
            or job.held_by is not None
            # Changed (gpusched update): the plan placed the request as it was.
            or job.updated_at != updated_at_of(read)
        ):
            applied.skipped[placement.job_id] = "job changed since the snapshot"
        elif any(n not in ready for n, _ in placement.node_gpus):
            applied.skipped[placement.job_id] = "node no longer ready"
        else:
            verified.append((placement, job))
    return verified


def _schedule(
    session: Session,
    *,
    ctx: SnapshotContext,
    verified: list[tuple[Placement, Job]],
    applied: Applied,
) -> list[tuple[Placement, Job]]:
    """Write the placements (SCHEDULED, allocations) in one savepoint; returns those made.

    All at once first: a cycle often places many jobs, and one flush batches their rows.
    If the database refuses (a GPU of one of them was taken by another writer since the
    snapshot), the savepoint is rolled back and they are tried one by one, so that only
    the ones whose GPUs are gone are skipped, to be tried again next cycle.
    """
    if not verified:
        return []
    try:
        with session.begin_nested():
            schedule_placed(
                session,
                [(job, f"placed on {_where(placement)}") for placement, job in verified],
                actor="scheduler",
            )
            allocate_many(session, [(job, _claims(ctx, p)) for p, job in verified])
    except IntegrityError:
        for _, job in verified:
            session.expire(job)  # back to its row: attempt and status as before the try
        if len(verified) == 1:
            applied.skipped[verified[0][1].id] = "GPU taken meanwhile"
            return []
        made = []
        for one in verified:
            made.extend(_schedule(session, ctx=ctx, verified=[one], applied=applied))
        return made
    return verified


def _where(placement: Placement) -> str:
    return ", ".join(f"{n}:{','.join(map(str, g)) or '-'}" for n, g in placement.node_gpus)


# A quick read writes the reasons of the arrivals it ranked among the first this many
# jobs it read; the others keep NEW until the next full cycle (a burst of submissions
# must not cost a quick cycle thousands of writes).
HEAD_POSITIONS = 100


def _store_reasons(
    session: Session, *, ctx: SnapshotContext, plan: Plan, placed: set[int]
) -> Sequence[PendingReason]:
    """Write each waiting job's reason, ranked mark and estimated start; only rows that
    changed.

    A job's place in the queue is not written here: it is its index in the ranking the
    full cycle stores (app/jobs/ranking.py), counted among the ranked jobs still waiting,
    and the Queue page is sorted by that ranking too. `Job.queue_position` only says that
    a full cycle ranked the job: a full cycle sets it, to the job's place then, when it
    ranks the job for the first time, and never rewrites it when the order changes (it
    used to be a sort key kept in step with the order: thousands of writes per cycle
    whenever fair share shifted the turns). A quick read keeps it (it ranks the head only;
    arrivals are ranked by the next full cycle), and the ranked jobs any cycle places (or
    a quick one finds gone from the head: cancelled, held) are listed as departed, so
    that the jobs behind them move up at once. Returns the waiting jobs, in queue order.
    """
    waiting = still_waiting(plan.pending, placed)
    rows = ctx.pending_rows
    if not ctx.quick:
        changes = changed_reasons(waiting, rows, max_message=PENDING_MESSAGE_CHARS)
    else:
        changes = []
        for read_as, reason in enumerate(waiting, start=1):
            read = rows.get(reason.job_id)
            old = None if read is None else read.reasons
            if read_as > HEAD_POSITIONS and old is not None and old[0] == ReasonKind.NEW.value:
                continue
            new = (
                reason.kind.value,
                reason.message[:PENDING_MESSAGE_CHARS],
                None if old is None else old[2],
                reason.estimated_start,
            )
            if old != new:
                changes.append((reason.job_id, *new))
    write_reasons(session, changes=changes)
    if ctx.cache is not None:  # as written: the next full read need not read them back
        ctx.cache.wrote(changes, REASON_COLUMNS)
    departed = [i for i in placed if (read := rows.get(i)) and read.reasons[2] is not None]
    if ctx.quick:  # the head it asked for, less the jobs still waiting: cancelled, held...
        still = {r.job_id for r in plan.pending}
        departed.extend(i for i in ctx.asked if i not in still and i not in placed)
    _depart(session, departed)
    if ctx.unread:  # a full read: every job it read has its place now
        _forget_positions(session, ranked={r.job_id for r in waiting} | placed)
    return waiting


# The stored ranking's departed jobs with more appended, in the UPDATE itself: no read
# of the row first (a round trip every cycle of a drain). Order and repeats do not matter
# to its reader (ranking.last). JSON, not JSONB, on PostgreSQL: appended as JSONB.
_DEPART_APPEND = {
    "postgresql": "(coalesce(departed::jsonb, '[]'::jsonb) || CAST(:ids AS jsonb))::json",
    "sqlite": (
        "(SELECT json_group_array(value) FROM (SELECT value FROM json_each(coalesce(departed, "
        "'[]')) UNION ALL SELECT value FROM json_each(:ids)))"
    ),
}


def _depart(session: Session, job_ids: list[int]) -> None:
    """The stored ranking's jobs placed now: the jobs behind them move up (one row)."""
    if not job_ids:
        return
    append = _DEPART_APPEND[session.get_bind().dialect.name]
    session.execute(
        text(f"UPDATE {QueueRanking.__tablename__} SET departed = {append} WHERE name = :name"),
        {"ids": json.dumps(sorted(job_ids)), "name": RANKING_ROW},
    )


# Reasons written row by row (SQLite before UPDATE ... FROM) go in batches of this many.
_EXECUTEMANY_ROWS = 2000
# Each column's PostgreSQL array type (for unnest).
_ARRAY_TYPES = {
    "pending_reason": "varchar[]",
    "pending_message": "varchar[]",
    "queue_position": "integer[]",
    "estimated_start_at": "timestamptz[]",
}


# Where a write changes a job (`Job.changed_in`, migration 0030): set by the trigger for
# any other write, by the statement for these, which set the change-stamp themselves.
_CHANGED_IN_PG = "pg_current_xact_id()::text::bigint"
_NEXT_CHANGE_SQLITE = "UPDATE job_change SET n = n + 1"
_CHANGED_IN_SQLITE = "(SELECT n FROM job_change)"


def write_reasons(
    session: Session,
    *,
    changes: Sequence[tuple[Any, ...]],
    columns: tuple[str, ...] = REASON_COLUMNS,
) -> None:
    """Write rows of (id, *values of `columns`) in one statement: a cycle may change
    thousands of reasons at once, and 20,000 UPDATEs by id, one per row, took most of a
    full cycle (PostgreSQL: seconds; see bench/deep_queue.py).
    PostgreSQL joins arrays of the values (unnest), SQLite the rows as one JSON array
    (json_each); an older SQLite gets an executemany. Only `columns` are set: SQLite
    rewrites the index entries of every column set, changed or not. Each row's change-stamp
    moves by one in the same statement (`ViewCache.wrote` counts on it: the trigger of
    migration 0028 leaves a statement that moves it alone), and so does where it changed
    (`Job.changed_in`: another scheduler's cache reads the row again)."""
    if not changes:
        return
    connection = session.connection()
    dialect = connection.dialect
    names = [f"c{i}" for i in range(len(columns))]
    if dialect.name == "postgresql":
        arrays = [list(values) for values in zip(*changes, strict=True)]
        casts = ", ".join(
            f"CAST(:{name} AS {_ARRAY_TYPES[column]})"
            for name, column in zip(names, columns, strict=True)
        )
        sets = ", ".join(
            f"{column} = v.{name}" for name, column in zip(names, columns, strict=True)
        )
        sets += f", row_version = job.row_version + 1, changed_in = {_CHANGED_IN_PG}"
        connection.execute(
            text(
                f"UPDATE job SET {sets} FROM unnest(CAST(:ids AS integer[]), {casts}) "
                f"AS v(id, {', '.join(names)}) WHERE job.id = v.id"
            ),
            {"ids": arrays[0], **dict(zip(names, arrays[1:], strict=True))},
        )
        return
    table = cast(Table, Job.__table__)
    if dialect.name == "sqlite" and (dialect.server_version_info or (0,)) >= (3, 33):
        if "estimated_start_at" in columns:
            # As the column's own type writes it (UTC, SQLite's text format).
            at = columns.index("estimated_start_at") + 1
            column_type = table.c.estimated_start_at.type.dialect_impl(dialect)
            as_stored: Callable[[Any], Any] = column_type.bind_processor(dialect) or (
                lambda value: value
            )
            changes = [
                (*row[:at], None if row[at] is None else as_stored(row[at]), *row[at + 1 :])
                for row in changes
            ]
        sets = ", ".join(
            f"{column} = json_extract(v.value, '$[{i}]')" for i, column in enumerate(columns, 1)
        )
        sets += f", row_version = row_version + 1, changed_in = {_CHANGED_IN_SQLITE}"
        connection.execute(text(_NEXT_CHANGE_SQLITE))
        connection.execute(
            text(
                f"UPDATE job SET {sets} "
                "FROM json_each(:rows) AS v WHERE job.id = json_extract(v.value, '$[0]')"
            ),
            {"rows": json.dumps(changes)},
        )
        return
    statement = (
        table.update()
        .where(table.c.id == bindparam("b_id"))
        .values(
            {
                **{
                    column: bindparam(f"b_{name}")
                    for name, column in zip(names, columns, strict=True)
                },
                "row_version": table.c.row_version + 1,
                "changed_in": literal_column(_CHANGED_IN_SQLITE),
            }
        )
    )
    connection.execute(text(_NEXT_CHANGE_SQLITE))
    for start in range(0, len(changes), _EXECUTEMANY_ROWS):
        connection.execute(
            statement,
            [
                {"b_id": row[0], **{f"b_{name}": v for name, v in zip(names, row[1:], strict=True)}}
                for row in changes[start : start + _EXECUTEMANY_ROWS]
            ],
        )


def _forget_positions(session: Session, *, ranked: set[int]) -> None:
    """A full read over its limit left jobs out (see read_snapshot): a place that a
    cycle gave one of them before is no longer its place. They are not ranked now."""
    stale = [
        job_id
        for job_id in session.scalars(
            select(Job.id).where(Job.status == JobStatus.PENDING, Job.queue_position.is_not(None))
        )
        if job_id not in ranked
    ]
    if stale:
        session.execute(update(Job), [{"id": job_id, "queue_position": None} for job_id in stale])
