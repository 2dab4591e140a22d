"""One live scheduling cycle, phases numbered as in DESIGN.md:

0. dependencies  jobs whose dependencies have all succeeded join the queue, job
   arrays let in as many tasks as their limit allows, and jobs the clock holds back
   (begin time ahead, off-peak window closed) get their reasons (one write)
1. snapshot  read queue, nodes, GPUs, telemetry and usage (one read transaction)
2. plan      the pure core decides (no I/O)
3. apply     one transaction re-verifies and writes allocations and pending reasons
4. dispatch  after commit, run_job / stop_job messages go to the nodes' queues
5. ranks     a full cycle stores why each waiting job is where it is in the queue
             (app/cycle/ranks.py), off the path from plan to dispatch
"""

from __future__ import annotations

import functools
import gc
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import ParamSpec, TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.cycle import lease, ranks
from app.cycle.apply import Applied, apply_plan
from app.cycle.arrays import settle_array_limits
from app.cycle.dependencies import settle_dependencies
from app.cycle.eligibility import ClockGates, settle_clock_gates, unsettled
from app.cycle.ranks import RankedBy
from app.cycle.settings import SchedulerSettings
from app.cycle.snapshot import QueueMemory, SnapshotContext, read_snapshot
from app.jobs.never_in_window import settle_never_in_window
from app.messaging import Sender
from app.metrics import CYCLE_SECONDS, PLACEMENTS, PLAN_SECONDS
from app.scheduling import JobView, PendingReason, Plan, plan_cycle
from app.scheduling.wakeup import next_wakeup
from app.scheduling.window_close import next_window_stop, window_close_preemptions
from app.windows.calendar import window_rules
from app.windows.service import window_specs
from app.windows.timeline import SchedulerWindows

log = logging.getLogger("gpusched.cycle")
P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: for a whole cycle (`without_gc`).

    A cycle allocates tens of thousands of short-lived objects (rows read, views, the
    plan, reasons to write) next to a large heap that lives on (the views a scheduler
    keeps between cycles), so the collector keeps running and its full passes walk that
    whole heap: about half of a 10,000-job plan's time (`bench/cycle.py`), and 25-40 %
    of a full cycle's CPU at 20,000 waiting (`bench/deep_queue.py`). What the cycle
    drops is freed by reference counting as usual; the rest waits for the next
    collection after it.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def without_gc(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn`, each call inside `gc_paused`."""

    @functools.wraps(fn)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        with gc_paused():
            return fn(*args, **kwargs)

    return paused


@dataclass(frozen=True, slots=True)
class CycleReport:
    ran: bool
    placed: int = 0
    pending: int = 0
    preempted: int = 0
    skipped: int = 0
    plan_ms: float = 0.0
    total_ms: float = 0.0
    # Where a cycle's time went, phase by phase (bench/deep_queue.py prints them): phase 0
    # (settle), 1 (snapshot), 3 (apply, with its commit) and 5 (ranks, with its commit).
    settle_ms: float = 0.0
    snapshot_ms: float = 0.0
    apply_ms: float = 0.0
    ranks_ms: float = 0.0
    # When a waiting job's begin time or off-peak window comes, or a running off-peak job
    # must be stopped for its window's close: cycle again then. Now, when this cycle placed
    # a job that jobs waiting with `after` wait for.
    wake_at: datetime | None = None


def _waiting_views(
    plan: Plan, ctx: SnapshotContext, waiting: Sequence[PendingReason]
) -> list[JobView]:
    """The views of the jobs left `waiting`, in queue order: the plan's order less the jobs
    it placed, when that is all of them (it explains every job it does not place). Not
    by id: 20,000 lookups in the cache took longer than storing unchanged ranks."""
    views = _without(plan.queued, {p.job_id for p in plan.placements})
    if len(views) == len(waiting):
        return views
    rows = ctx.pending_rows
    return [rows[r.job_id].view for r in waiting]


def _without(queued: Sequence[JobView], placed: set[int]) -> list[JobView]:
    """`queued` less the `placed` jobs. The planner walks the queue in order, so those it
    places are mostly near its head: they are looked for from there, and the rest is
    copied whole (a test per job of 20,000 was a few ms of each full cycle)."""
    head: list[JobView] = []
    left = len(placed)
    at = 0
    while left and at < len(queued):
        view = queued[at]
        at += 1
        if view.id in placed:
            left -= 1
        else:
            head.append(view)
    return head + list(queued[at:])


@without_gc
def run_cycle(
    *,
    factory: sessionmaker[Session],
    messenger: Sender,
    settings: SchedulerSettings,
    holder: str,
    now: datetime,
    all_positions: bool = True,
    memory: QueueMemory | None = None,
    windows: SchedulerWindows | None = None,
    full_every_s: float | None = None,
) -> CycleReport:
    """One cycle. With `all_positions=False`, a `memory` that a full cycle filled makes
    this a quick cycle (see QueueMemory), which re-ranks only the head of the queue (the
    scheduler worker asks for a full cycle every few seconds: `full_every_s`, stored with
    the ranks a full cycle keeps for GET /jobs/{id}/rank)."""
    started = time.perf_counter()
    with factory() as session:
        # Taken in the settle phase's transaction: one commit for both.
        token = lease.take(
            session,
            holder=holder,
            now=now,
            ttl_s=settings.lease_ttl_s,
            ranking=settings.ranking(),
        )
        if token is None:
            return CycleReport(ran=False)
        applied: Applied | None = None
        try:
            specs = window_specs(session=session)
            openings = (windows or SchedulerWindows()).around(specs, now=now)
            policy = settings.policy_settings()
            rules = window_rules(specs)
            if rules.outside_fraction is not None:
                policy = replace(policy, offpeak_outside_fraction=rules.outside_fraction)
            gates = ClockGates(
                now=now, windows=openings, outside_fraction=policy.offpeak_outside_fraction
            )
            # 0. dependencies, array limits, then the jobs the clock holds back
            settle_started = time.perf_counter()
            to_settle = unsettled(session)
            awaited_starts = (
                settle_dependencies(session, now=now) if to_settle.dependencies else frozenset()
            )
            if to_settle.arrays:
                settle_array_limits(session)
            if to_settle.offpeak:
                settle_never_in_window(session=session, specs=specs, now=now)
            gated_until = settle_clock_gates(session, gates=gates) if to_settle.clock else None
            session.commit()
            # 1. snapshot
            snapshot_started = time.perf_counter()
            ctx = read_snapshot(
                session=session,
                now=now,
                half_life_s=settings.fair_share_half_life_s,
                windows=openings,
                quick_from=None if all_positions else memory,
                gates=gates,
                views=None if memory is None else memory.views,
            )
            session.rollback()  # end the read transaction before the pure phase
            # 2. plan
            plan_started = time.perf_counter()
            # The order kept from the last full cycle (KeptOrder); not for a quick
            # cycle, whose head of the queue would make it forget the rest.
            kept = None if memory is None or ctx.quick else memory.kept_order
            plan = plan_cycle(ctx.snapshot, now=now, settings=policy, memo=kept)
            closing = window_close_preemptions(
                ctx.snapshot.running,
                ctx.snapshot.windows,
                now=now,
                preempt_on_close=rules.preempt_on_close,
            )
            if closing:
                plan = replace(plan, preemptions=plan.preemptions + closing)
            plan_ms = (time.perf_counter() - plan_started) * 1000
            kind = "quick" if ctx.quick else "full"
            PLAN_SECONDS.labels(kind).observe(plan_ms / 1000)
            wake_times = (
                gated_until,
                next_wakeup(plan.pending, now=now),
                next_window_stop(
                    ctx.snapshot.running,
                    ctx.snapshot.windows,
                    now=now,
                    preempt_on_close=rules.preempt_on_close,
                ),
            )
            wake_at = min((at for at in wake_times if at is not None), default=None)
            if memory is not None:
                memory.remember(ctx, plan.queue_order)
            # 3. apply
            apply_started = time.perf_counter()
            applied = apply_plan(session, ctx=ctx, plan=plan, token=token, now=now)
            apply_ms = (time.perf_counter() - apply_started) * 1000
        finally:
            # Applied, the plan's commit released the lease; lost, it is another's.
            if applied is None:
                lease.release(session, holder=holder, token=token, now=now)
    if applied.lease_lost:
        log.warning("cycle lease lost before apply; plan dropped")
        return CycleReport(ran=False)
    if awaited_starts.intersection(applied.placed):
        wake_at = now  # a job waiting `after` one placed now may start: cycle again
    # 4. dispatch (after commit; reconciliation re-sends anything lost on the way)
    messenger.send(applied.after)
    ranks_started = time.perf_counter()
    if not ctx.quick:  # 5. what this full cycle ranked, for GET /jobs/{id}/rank
        with factory() as session:
            ranks.store(
                session,
                order=_waiting_views(plan, ctx, applied.waiting),
                ranked_by=RankedBy(
                    policy=policy,
                    ranking=settings.ranking(),
                    next_at=None if full_every_s is None else now + timedelta(seconds=full_every_s),
                ),
                history=ctx.snapshot.runtime_history,
                now=now,
                last=None if memory is None else memory.ranks,
            )
            try:
                session.commit()
            except IntegrityError:  # another scheduler stored the first ranks meanwhile
                session.rollback()
                if memory is not None:
                    memory.ranks = ranks.LastStored()
    ranks_ms = (time.perf_counter() - ranks_started) * 1000
    CYCLE_SECONDS.labels(kind).observe(time.perf_counter() - started)
    PLACEMENTS.inc(len(applied.placed))
    report = CycleReport(
        ran=True,
        placed=len(applied.placed),
        pending=len(plan.pending),
        preempted=len(applied.stops),
        skipped=len(applied.skipped),
        plan_ms=plan_ms,
        total_ms=(time.perf_counter() - started) * 1000,
        wake_at=wake_at,
        settle_ms=(snapshot_started - settle_started) * 1000,
        snapshot_ms=(plan_started - snapshot_started) * 1000,
        apply_ms=apply_ms,
        ranks_ms=ranks_ms,
    )
    if report.placed or report.preempted or report.skipped:
        log.info(
            "cycle: placed %d, preempting %d, skipped %d, pending %d (total %.1f ms: settle %.1f,"
            " snapshot %.1f, plan %.1f, apply %.1f, ranks %.1f)",
            report.placed,
            report.preempted,
            report.skipped,
            report.pending,
            report.total_ms,
            report.settle_ms,
            report.snapshot_ms,
            report.plan_ms,
            report.apply_ms,
            report.ranks_ms,
        )
    return report
