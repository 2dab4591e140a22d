"""One scheduling cycle: frozen snapshot in, Plan out. No I/O, no clock.

The planner's rooms, each a module sharing one `CycleState` (cycle_state.py), passed
explicitly; phases numbered as in the logs and the docs:

1. build    : (here) per-node and per-GPU state; node and GPU filters run once here
              and unusable GPUs are left out of the free-capacity index.
2. order    : the queue policy gives every pending job a position (queue.py).
3. place    : (here, the run loop) walk the queue; job filters, can-never-fit
              check, quota, running limits (eligibility.py), then placement on the best-scored
              candidate nodes (placement.py). The first job that cannot start gets
              a backfill reservation (EASY, backfill.py); later jobs may use
              reserved GPUs only if they end before it. Blocked jobs may preempt
              (preempt.py).
4. explain  : every job left pending gets a typed reason, computed once per job
              shape against the final state (explain.py).
"""

from __future__ import annotations

import zlib
from datetime import datetime
from operator import attrgetter
from typing import NamedTuple

from app.scheduling import eligibility, scorers
from app.scheduling import filters as F
from app.scheduling.backfill import no_room_left, reserve, reserved_until_s
from app.scheduling.cycle_state import CycleState, gpu_vouched, pend, pending_reason
from app.scheduling.explain import explain
from app.scheduling.filters import account, enough_gpus, gpu_share, node_choice
from app.scheduling.placement import commit, find, memo_key
from app.scheduling.preempt import (
    MAX_PREEMPT_SEARCHES,
    later_may_preempt,
    try_preempt,
    victim_pool,
)
from app.scheduling.queue import KeptOrder, order_jobs
from app.scheduling.state import NodeIndex, NodeState, Request, Slot
from app.scheduling.status import OK, Context, Status
from app.scheduling.types import (
    JobView,
    Plan,
    ReasonKind,
    RunningJobView,
    Snapshot,
)

_QUEUE_POSITION = attrgetter("queue_position")
# The filter sets the build prechecks were written for (tests may swap the tuples).
_NODE_FILTERS = F.NODE_FILTERS
_GPU_FILTERS = F.GPU_FILTERS
_NOT_BARRED: frozenset[str] = frozenset()


class Shape(NamedTuple):
    """Per job shape, worked out once per cycle: the request, its can-never-fit
    verdict and its keys in the failure set and node memos."""

    req: Request
    never: Status
    key: int  # memo_key(req, allow_reserved=False)
    key_reserved: int  # memo_key(req, allow_reserved=True)


def plan(snapshot: Snapshot, ctx: Context, seed: int, memo: KeptOrder | None = None) -> Plan:
    """The whole cycle: `build`, then `run`."""
    return run(build(snapshot, ctx, seed), memo)


def build(snapshot: Snapshot, ctx: Context, seed: int) -> CycleState:
    """Phase 1: the cycle state of one snapshot. Node and GPU filters run here, once."""
    settings = ctx.settings
    node_filters = F.NODE_FILTERS
    gpu_filters = F.GPU_FILTERS
    nodes: list[NodeState] = []
    slot_at: dict[tuple[str, int], Slot] = {}
    # Usable nodes whose maintenance is still to come, with its start.
    maintenance: list[tuple[str, datetime]] = []
    peers_cache: dict[tuple[int, ...], frozenset[int]] = {}

    used_milli: dict[str, int] = {}
    running: dict[int, RunningJobView] = {}
    offpeak_milli = 0
    booked: dict[tuple[str, int], int] = {}
    for r in snapshot.running:
        job = r.job
        running[job.id] = r
        used = r.held_milli
        used_milli[job.project] = used_milli.get(job.project, 0) + used
        if job.schedule_mode == "offpeak":
            offpeak_milli += used
        mem = job.gpu_memory_mb or 0
        if mem:
            for node, idxs in r.placement:
                for idx in idxs:
                    booked[(node, idx)] = booked.get((node, idx), 0) + mem

    # Precheck bounds (see filters/__init__.py): only nodes and GPUs they cannot
    # vouch for run the filters, which then decide as always.
    prechecks = node_filters == _NODE_FILTERS and gpu_filters == _GPU_FILTERS
    hb_after = F.heartbeat_fresh.fresh_after(ctx)
    tel_after = F.telemetry_fresh.fresh_after(ctx)
    idle_before = F.foreign_load.idle_before(ctx)
    foreign_below = settings.foreign_util_threshold_pct
    for i, nv in enumerate(snapshot.nodes):
        blocker: Status | None = None
        hb = nv.heartbeat_at
        if not (
            prechecks
            and nv.ready
            and not nv.drained
            and nv.maintenance_at is None
            and hb is not None
            and hb_after is not None
            and hb >= hb_after
        ):
            for nf in node_filters:
                st = nf(nv, ctx)
                if st is not OK:  # every filter returns the OK singleton on success
                    blocker = st
                    break
        rank = i if seed == 0 else zlib.crc32(f"{seed}:{nv.name}".encode())
        ns = NodeState(nv.name, rank, blocker)
        gpus = nv.gpus
        indices = [g.index for g in gpus]
        if indices != sorted(indices):  # agents may report GPUs out of order
            gpus = tuple(sorted(gpus, key=lambda g: g.index))
        for g in gpus:
            gb = blocker
            unchecked = False
            allocated = g.allocated_milli
            if gb is None:
                if allocated >= 1000:
                    # Wholly ours: nothing can be placed on it unless a preemption frees
                    # it, and then the GPU filters run (see preempt._release). Saves most of the
                    # filter calls on a busy cluster.
                    unchecked = True
                elif not (prechecks and gpu_vouched(g, tel_after, idle_before, foreign_below)):
                    for gf in gpu_filters:
                        st = gf(nv, g, ctx)
                        if st is not OK:
                            gb = st
                            break
            used_mb = g.memory_used_mb or 0
            foreign_mem = g.foreign_memory_mb
            book = booked.get((nv.name, g.index), 0) if booked else 0
            taken = used_mb if used_mb > foreign_mem + book else foreign_mem + book
            peers = peers_cache.get(g.nvlink_peers)
            if peers is None:
                peers = peers_cache[g.nvlink_peers] = frozenset(g.nvlink_peers)
            total_mb = g.memory_total_mb
            s = Slot(
                nv.name,
                g.index,
                g.model,
                total_mb,
                total_mb - taken,
                1000 - allocated if allocated < 1000 else 0,
                gb,
                g.temperature_c,
                g.util_pct,
                peers,
                foreign_mem,
            )
            if book:
                s.booked_mem = book
            if unchecked:
                s.unchecked = (nv, g)
            ns.slots.append(s)
            slot_at[(nv.name, g.index)] = s
        ns.gpu_count = len(ns.slots)
        ns.models = frozenset([s.model for s in ns.slots])
        nodes.append(ns)
        if blocker is None and nv.maintenance_at is not None:
            maintenance.append((nv.name, nv.maintenance_at))
    user_limits, project_limits = eligibility.running_limits(snapshot)
    counts: tuple[dict[str, int], dict[str, int], dict[str, int], dict[str, int]] = (
        eligibility.count_running(snapshot.running)
        if user_limits or project_limits
        else ({}, {}, {}, {})
    )
    return CycleState(
        snap=snapshot,
        ctx=ctx,
        settings=settings,
        now=ctx.now,
        seed=seed,
        scorers=scorers.weighted(settings),
        nodes=nodes,
        slot_at=slot_at,
        node_by_name={n.name: n for n in nodes},
        index=NodeIndex(nodes),
        total_gpus=len(slot_at),
        maintenance=maintenance,
        lacking=account.lacking(snapshot.nodes),
        projects={p.name: p for p in snapshot.projects},
        quota_any=any(p.quota_gpus > 0 for p in snapshot.projects),
        used_milli=used_milli,
        running=running,
        offpeak_running_milli=offpeak_milli,
        # For check_late: None when the GPU filters must always run.
        gpu_bounds=(tel_after, idle_before, foreign_below) if prechecks else None,
        user_limits=user_limits,
        project_limits=project_limits,
        user_jobs=counts[0],
        user_milli=counts[1],
        project_jobs=counts[2],
        project_milli=counts[3],
    )


def _first_fit(
    order: list[JobView],
    start: int,
    room: tuple[int, int, int, int],
    reserved_until: int | None,
) -> int:
    """The index in `order` of the first job from `start` on that could fit `room`
    (`_free_room`), ignoring everything else; -1 if none could. A shared job needs a GPU
    with its milli-GPUs free, a whole-GPU job as many wholly free GPUs on one node as it
    asks per node, a job without GPUs nothing; the reserved GPUs count only for jobs
    that may use them (`reserved_until`, as the walk decides it)."""
    for i in range(start, len(order)):
        job = order[i]
        if job.gpus <= 0:
            return i
        milli, whole = room[2], room[3]
        if reserved_until is not None:
            rt = job.estimated_runtime_s  # runtime(job), inlined
            if rt is None:
                rt = job.max_runtime_s
            if rt is not None and rt <= reserved_until:
                milli, whole = room[0], room[1]
        share = job.gpu_share
        if share is not None and share < 1.0:
            # A share of `milli` + 1 thousandths or more rounds to more than `milli`:
            # most jobs of a full cluster, told apart without `share_milli`'s rounding.
            if share * 1000 < milli + 1 and gpu_share.fits(job.share_milli, milli):
                return i
        elif enough_gpus.fits(job.gpus, whole):
            return i
    return -1


def _free_room(cs: CycleState) -> tuple[int, int, int, int]:
    """The most milli-GPUs free on one usable GPU and the most wholly free usable GPUs on
    one node, first counting the GPUs reserved for the backfill head, then not: no job
    asking for more than what it may use can be placed."""
    most = [0, 0, 0, 0]
    for n in cs.nodes:
        if n.blocker is not None:
            continue
        whole = whole_free = 0
        for sl in n.slots:
            if sl.blocker is None:
                fm = sl.free_milli
                free = sl.reserved_for is None
                if fm > most[0]:
                    most[0] = fm
                if free and fm > most[2]:
                    most[2] = fm
                if fm >= 1000:
                    whole += 1
                    whole_free += free
        most[1] = max(most[1], whole)
        most[3] = max(most[3], whole_free)
    return most[0], most[1], most[2], most[3]


def _defer(
    deferred: list[tuple[int, JobView, Request]],
    plain: list[tuple[int, int, int, Request]],
    pos: int,
    job: JobView,
    req: Request,
    noted: bool,
) -> None:
    """Leave `job` to explain: with its view if a note of its own may be added to its
    reason (`noted`, or nodes it may not use), else by id and priority."""
    if noted or req.barred:
        deferred.append((pos, job, req))
    else:
        plain.append((pos, job.id, job.priority, req))


def run(cs: CycleState, memo: KeptOrder | None = None) -> Plan:
    """Phases 2-4: order the queue (with the caller's `memo`), place, backfill and
    preempt, explain."""
    snap = cs.snap
    running_ids = set(cs.running)
    jobs = [j for j in snap.pending if j.id not in running_ids]
    order = order_jobs(
        jobs,
        settings=cs.settings,
        projects=cs.projects,
        running=snap.running,
        history=snap.runtime_history,
        now=cs.now,
        memo=memo,
    )
    strict_blocker: JobView | None = None
    strict_msg = ""
    failed = cs.failed
    preemption = cs.settings.preemption and bool(victim_pool(cs))
    policy = cs.settings.queue_policy
    may_preempt_any = preemption and (
        cs.quota_any
        or policy == "las"
        or (policy == "default" and cs.max_level > 0)
        or (
            policy in ("default", "priority")
            and max((j.priority for j in jobs), default=0) > cs.min_prio
        )
    )
    backfill = cs.settings.backfill
    explaining = cs.settings.explain
    borrowing = cs.settings.borrowing
    limited = bool(cs.user_limits or cs.project_limits)
    # Once no GPU has any room left and nothing can be preempted, the rest of the
    # queue only needs its reason: skip the placement machinery for it.
    exhausted = False
    full_outside = False  # no room except on GPUs reserved for the backfill head
    checked_at = -1
    # The jobs left waiting, for explain: with their views where it may add a note of
    # the job's own, else by id (`explain`). A quota to reclaim is noted per job.
    deferred: list[tuple[int, JobView, Request]] = []
    plain: list[tuple[int, int, int, Request]] = []
    quota_notes = cs.quota_any and cs.settings.preemption
    # Request per job shape: most of 10k jobs share a few dozen shapes.
    shapes: dict[tuple[int, int, float | None, int | None, str | None, frozenset[str]], Shape] = {}
    # Jobs of at most this runtime may use the reserved GPUs (fixed once the reservation is).
    reserved_until = reserved_until_s(cs)  # set by reserve below, once
    pending = cs.pending
    # Nothing to explain (the simulator): once no job left in the queue could fit what
    # is free, even ignoring the reservation, and none may preempt, stop the walk.
    room_at = -1
    room = (0, 0, 0, 0)
    fit_at = -1  # index in `order` of a job that could fit `room`, -1 if none known
    maintenance = bool(cs.maintenance)
    for pos, job in enumerate(order, start=1):
        if job.schedule_mode != "now":
            st = eligibility.job_filters(cs, job)
            if st is not None:
                pend(
                    cs,
                    job,
                    pos,
                    st.kind or ReasonKind.WAITING_FOR_GPUS,
                    st.message,
                    st.estimated_start,
                )
                continue
        barred = eligibility.maintenance_barred(cs, job) if maintenance else _NOT_BARRED
        noted = quota_notes  # explain may add a note of this job's own
        if job.only_nodes is not None or job.exclude_nodes:
            noted = True
            by_choice = eligibility.chosen_barred(cs, job)
            # Every node barred: none of its only_nodes may be left (cheap test first).
            why = (
                node_choice.gone(job, (n.name for n in cs.nodes))
                if len(by_choice) == len(cs.nodes)
                else None
            )
            if why is not None:
                pend(cs, job, pos, ReasonKind.NEVER_FITS, why)
                continue
            barred = barred | by_choice
        if cs.lacking and job.unix_user in cs.lacking:
            noted = True
            by_account = account.barred(job, cs.lacking)
            if len(barred | by_account) == len(cs.nodes):
                pend(cs, job, pos, ReasonKind.NO_ACCOUNT, account.reason(job, cs.lacking))
                continue
            barred = barred | by_account
        shape = (job.gpus, job.nodes, job.gpu_share, job.gpu_memory_mb, job.gpu_model, barred)
        known = shapes.get(shape)
        if known is None:
            r = Request.of(job)
            if barred:
                r = r._replace(barred=barred)
            known = shapes[shape] = Shape(
                r, eligibility.never(cs, r), memo_key(cs, r, False), memo_key(cs, r, True)
            )
        req = known.req
        nv = known.never
        if nv is not OK:
            pend(cs, job, pos, nv.kind or ReasonKind.NEVER_FITS, nv.message)
            continue
        if not borrowing:
            q = eligibility.quota_block(cs, job, req)
            if q is not None:
                pend(cs, job, pos, ReasonKind.QUOTA, q)
                continue
        if limited:
            # Held back by its own limit: it neither places, preempts nor takes the
            # backfill reservation, so it holds back no other job either.
            why = eligibility.limit_block(cs, job, req)
            if why is not None:
                pend(cs, job, pos, ReasonKind.RUNNING_LIMIT, why)
                continue
        if strict_blocker is not None:
            if not explaining:
                break  # strict order: nothing after the blocked job can start
            pending.append(pending_reason(job.id, ReasonKind.PRIORITY, strict_msg, pos, None))
            continue
        if exhausted and req.gpus > 0:
            _defer(deferred, plain, pos, job, req, noted)
            continue
        allow_reserved = False
        if reserved_until is not None:
            rt = job.estimated_runtime_s  # runtime(job), inlined
            if rt is None:
                rt = job.max_runtime_s
            allow_reserved = rt is not None and rt <= reserved_until
        if full_outside and not allow_reserved and req.gpus > 0:
            # Only reserved GPUs have room and this job may not use them.
            _defer(deferred, plain, pos, job, req, noted)
            continue
        key = known.key_reserved if allow_reserved else known.key
        chosen = None if key in failed else find(cs, req, allow_reserved, key)
        if chosen is not None:
            commit(cs, job, req, chosen, ())
            continue
        failed.add(key)
        if (
            preemption
            and cs.preempt_attempts < MAX_PREEMPT_SEARCHES  # else try_preempt says no
            and try_preempt(cs, job, req)
        ):
            failed = cs.failed
            continue
        if backfill:
            if not cs.res_tried:
                cs.res_tried = True
                reserve(cs, job, req)
                reserved_until = reserved_until_s(cs)
        else:
            strict_blocker = job
            strict_msg = f"waiting behind job {job.id} (strict queue order, backfill off)"
        _defer(deferred, plain, pos, job, req, noted)
        if may_preempt_any and not later_may_preempt(cs, job):
            may_preempt_any = False
        if not may_preempt_any and cs.version != checked_at:
            checked_at = cs.version
            full_outside = cs.index.largest_free_block() == 0 and not cs.index.partial
            exhausted = full_outside and no_room_left(cs)
        if not explaining and not may_preempt_any:
            if cs.version != room_at:
                room_at = cs.version
                room = _free_room(cs)
                fit_at = -1
            if fit_at < pos:  # `pos` (1-based) is the index of the next job
                # The reservation, if any, is made by now (at the first job that failed).
                fit_at = _first_fit(order, pos, room, reserved_until)
                if fit_at < 0:
                    break  # what is left of the queue could only fail to place
    if explaining:
        explain(cs, deferred, plain)
    cs.pending.sort(key=_QUEUE_POSITION)
    return Plan(
        placements=tuple(cs.placements),
        preemptions=tuple(cs.preemptions),
        pending=tuple(cs.pending),
        queued=tuple(order),
    )
