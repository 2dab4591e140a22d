"""Phase 4, explain: every job left pending gets a typed reason.

Worked out once per job shape against the final state (cheap even for 10k jobs):
`_diagnose` finds the first of a ladder of relaxations (free by bookkeeping, usable,
enough memory, not reserved, not taken this cycle) under which the job would not fit,
counting per distinct node profile. Notes are added for a quota that cannot be
reclaimed yet, lower-priority jobs too young to preempt, the job's own node choice,
missing Unix accounts, and nodes going into maintenance.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from operator import itemgetter

from app.scheduling.cycle_state import (
    CycleState,
    SlotProfile,
    pend,
    pending_reason,
    protected,
    quota_of,
)
from app.scheduling.eligibility import maintenance_barred
from app.scheduling.filters import (
    account,
    enough_gpus,
    enough_nodes,
    gpu_memory,
    gpu_model,
    gpu_share,
    node_choice,
    reserved,
)
from app.scheduling.filters import quota as project_quota
from app.scheduling.state import NodeState, Request, Slot
from app.scheduling.types import JobView, ReasonKind, RunningJobView


def explain(
    cs: CycleState,
    deferred: list[tuple[int, JobView, Request]],
    plain: list[tuple[int, int, int, Request]],
) -> None:
    """Give every job the walk left waiting its reason. `deferred`: (position, view, request)
    of jobs that may get a note of their own (a node choice, a missing account, nodes
    going into maintenance, a quota to reclaim); `plain`: (position, id, priority,
    request) of the others, whose reason is their shape's (and the priority note's):
    explained without reading their views again. Behind a full cluster that is most of a
    deep queue, and reading 20,000 views a second time was most of explaining them
    (memory reads, on a busy host)."""
    # By object: deferred requests are the cycle's one Request per job shape (and all
    # alive while this runs), so id() is as good a key as the value and cheaper.
    cache: dict[int, tuple[ReasonKind, str]] = {}
    levels: dict[tuple[int, int, str | None], list[list[int]]] = {}
    # Only GPUs with room at the start of the cycle can count at any level.
    cs.had_room = [
        room for n in cs.nodes if (room := [sl for sl in n.slots if sl.init_free_milli > 0])
    ]
    cs.room_profiles = _room_profiles(cs.had_room)
    cs.room_max = max((len(room) for room in cs.had_room), default=0)
    if cs.quota_any and cs.settings.preemption:
        cs.borrowers[None] = _find_borrowers(cs, None)
        used = cs.used_milli
        # GPU share (milli) each project may still take within its quota.
        cs.quota_room = {
            name: quota_of(cs, name) - used.get(name, 0)
            for name, p in cs.projects.items()
            if p.quota_gpus > 0
        }
    reclaim = bool(cs.borrowers.get(None))  # else no job has anything to reclaim
    if cs.settings.preemption and cs.settings.queue_policy in ("default", "priority"):
        cs.young = [r for r in cs.running.values() if r.job.preemptible and protected(cs, r)]
    lowest_young = min((r.job.priority for r in cs.young), default=None)
    maintenance: dict[tuple[int, int | None], str | None] = {}
    for pos, job, req in deferred:
        note = _reclaim_note(cs, job, req) if reclaim else ""
        if lowest_young is not None and job.priority > lowest_young and req.gpus:
            note += _priority_note(cs, job.priority, req)
        if job.only_nodes is not None or job.exclude_nodes:
            note += node_choice.note(job)
        if cs.lacking and job.unix_user in cs.lacking:
            note += account.note(job, cs.lacking)
        if req.barred:
            mkey = (id(req), job.max_runtime_s)
            if mkey not in maintenance:
                maintenance[mkey] = _maintenance_reason(cs, job, req)
            why = maintenance[mkey]
            if why is not None:
                own = job.id == cs.res_job
                why += _reservation_note(cs.res_time) if own else ""
                estimate = cs.res_time if own else None
                pend(cs, job, pos, ReasonKind.MAINTENANCE, why + note, estimate)
                continue
        _shape_reason(cs, pos, job.id, req, note, cache, levels)
    for pos, job_id, priority, req in plain:
        note = ""
        if lowest_young is not None and priority > lowest_young and req.gpus:
            note = _priority_note(cs, priority, req)
        _shape_reason(cs, pos, job_id, req, note, cache, levels)


def _shape_reason(
    cs: CycleState,
    pos: int,
    job_id: int,
    req: Request,
    note: str,
    cache: dict[int, tuple[ReasonKind, str]],
    levels: dict[tuple[int, int, str | None], list[list[int]]],
) -> None:
    """A waiting job's reason from its request's shape (worked out once per shape, in
    `cache`), with its `note`; the backfill head's with its own GPUs counted as free."""
    if job_id == cs.res_job:
        kind, msg = _diagnose(cs, req, {}, own=job_id)
        msg += _reservation_note(cs.res_time) + note
        cs.pending.append(pending_reason(job_id, kind, msg, pos, cs.res_time))
        return
    got = cache.get(id(req))
    if got is None:
        got = cache[id(req)] = _diagnose(cs, req, levels)
    cs.pending.append(pending_reason(job_id, got[0], got[1] + note, pos, None))


def _maintenance_reason(cs: CycleState, job: JobView, req: Request) -> str | None:
    """Why a job waits when it would start now but for nodes going into maintenance
    before its time limit ends; None if they are not what holds it back."""
    if req.gpus == 0:
        return None
    # Room now, or else as the cycle began (a job placed since, a backfill too, on a
    # node this one may not use does not change why it waits): where the nodes it may
    # not use make the difference.
    usable = [n for n in cs.nodes if n.blocker is None]
    for current in (True, False):
        rooms = {n.name for n in usable if _room_for(n, req, now=current)}
        if enough_nodes.fits(req.nodes, len(rooms)) and not enough_nodes.fits(
            req.nodes, len(rooms - req.barred)
        ):
            break
    else:
        return None
    # Of the nodes with room it may not use, those it may not use for their maintenance
    # (the rest its own choice of nodes leaves out).
    closing = maintenance_barred(cs, job)
    name, at = min(
        ((name, at) for name, at in cs.maintenance if name in rooms and name in closing),
        key=itemgetter(1),
        default=(None, None),
    )
    if name is None or at is None:
        return None
    # No times in the text (clients format times, and the node's maintenance_at says
    # when): the limit is a duration, the maintenance an event.
    limit = job.max_runtime_s
    runs = (
        "this job has no time limit"
        if limit is None
        else "this job's time limit (with its grace period) ends after it begins"
    )
    return (
        f"node {name} goes into maintenance (see the node's maintenance time) and takes "
        f"only jobs whose time limit ends by then; {runs}"
    )


def _reclaim_note(cs: CycleState, job: JobView, req: Request) -> str:
    """Why a job that fits in its project's quota did not take it back from borrowers
    this cycle: they are too young to preempt (anti-loop guard) or not preemptible.
    Without this, "waiting for GPUs" reads as a broken guarantee."""
    room = cs.quota_room.get(job.project, 0)
    if not (req.milli * job.total_gpus > 0 and project_quota.fits(req, job, 0, room)):
        return ""
    key = (job.project, req.model)
    note = cs.reclaim_notes.get(key)
    if note is None:
        note = cs.reclaim_notes[key] = _reclaim_from(cs, *key)
    return note


def _priority_note(cs: CycleState, priority: int, req: Request) -> str:
    """Why a job that outranks running preemptible jobs still waits: they have not
    run `min_run_before_preempt_s` yet (the anti-loop guard). When the first may be
    stopped for it; whether that frees GPUs of the right shape is the plan's to say."""
    key = (priority, req.model)
    note = cs.priority_notes.get(key)
    if note is None:
        nodes = cs.node_by_name
        starts = [
            (r.started_at, r.job.id)
            for r in cs.young
            if r.job.priority < priority
            and (req.model is None or _holds_model(r, req.model, nodes))
        ]
        note = ""
        if starts:
            # Which job comes of age first, not when: a time in the text would be in no
            # client's style, and a countdown would rewrite the rows every cycle.
            guard = cs.settings.min_run_before_preempt_s
            note = (
                f"; lower-priority preemptible jobs may be preempted for it once they"
                f" have run {_minutes(guard)} (job {min(starts)[1]} first)"
            )
        cs.priority_notes[key] = note
    return note


def _reclaim_from(cs: CycleState, project: str, model: str | None) -> str:
    # Only borrowers on GPUs of the model the job asks for could give it room.
    by_model = cs.borrowers.get(model)
    if by_model is None:
        by_model = cs.borrowers[model] = _find_borrowers(cs, model)
    borrowers = {name: b for name, b in by_model.items() if name != project}
    others = list(borrowers.values())
    young = [b[0] for b in others if b[0] is not None]
    if young:
        guard = cs.settings.min_run_before_preempt_s
        return (
            "; within quota: borrowed GPUs are reclaimed once a borrowing job has run"
            f" {_minutes(guard)} (job {min(young)[1]} first)"
        )
    if others and not any(b[1] for b in others):
        names = ", ".join(sorted(borrowers))
        return (
            f"; within quota, but the GPUs borrowed by {names} are held by"
            " non-preemptible jobs, which run to the end"
        )
    return ""


def _find_borrowers(
    cs: CycleState, model: str | None
) -> dict[str, tuple[tuple[datetime, int] | None, bool]]:
    """Per project running beyond its quota (only its jobs on `model` GPUs if given):
    the earliest (start, job id) among its preemptible jobs still too young to preempt,
    and whether any of its jobs is preemptible."""
    used = cs.used_milli
    nodes = cs.node_by_name
    out: dict[str, tuple[tuple[datetime, int] | None, bool]] = {}
    for r in cs.running.values():
        project = r.job.project
        if r.job.id in cs.preempted or used.get(project, 0) <= quota_of(cs, project):
            continue
        if model is not None and not _holds_model(r, model, nodes):
            continue
        young, preemptible = out.get(project, (None, False))
        first = (r.started_at, r.job.id)
        if r.job.preemptible and protected(cs, r) and (young is None or first < young):
            young = first
        out[project] = (young, preemptible or r.job.preemptible)
    return out


def _level_histogram(cs: CycleState, req: Request, own: int | None) -> list[list[int]]:
    """Per level A..E: how many nodes have exactly k GPUs passing (see _diagnose).

    Reads only the request's share, memory and model (what `_diagnose` keys it by).
    Counted over distinct node profiles (see `_room_profiles`), each weighted by
    how many nodes share it: on a large cluster most nodes look alike.
    """
    milli, mem, model = req.milli, req.memory_mb, req.model
    size = cs.room_max + 1
    hist = [[0] * size for _ in range(5)]
    h0, h1, h2, h3, h4 = hist
    for profile, nodes in cs.room_profiles:
        c0 = c1 = c2 = c3 = c4 = 0
        for (
            init_milli,
            total_mem,
            sl_model,
            blocked,
            init_mem,
            r,
            free_milli,
            free_mem,
        ), n in profile:
            if not (
                gpu_share.fits(milli, init_milli)
                and gpu_memory.fits(mem, total_mem)
                and gpu_model.fits(model, sl_model)
            ):
                continue
            c0 += n
            if blocked:
                continue
            c1 += n
            if not gpu_memory.fits(mem, init_mem):
                continue
            c2 += n
            if not reserved.fits(r, own):
                continue
            c3 += n
            if not (gpu_share.fits(milli, free_milli) and gpu_memory.fits(mem, free_mem)):
                continue
            c4 += n
        h0[c0] += nodes
        h1[c1] += nodes
        h2[c2] += nodes
        h3[c3] += nodes
        h4[c4] += nodes
    return hist


def _diagnose(
    cs: CycleState,
    req: Request,
    levels: dict[tuple[int, int, str | None], list[list[int]]],
    own: int | None = None,
) -> tuple[ReasonKind, str]:
    """Why a job does not fit: the first of these relaxations under which it would not.

    A: GPUs free by bookkeeping at the start of the cycle (else: waiting for GPUs)
    B: ... and usable (else: node not ready / stale telemetry / unhealthy / foreign)
    C: ... and with enough free memory (else: GPU memory)
    D: ... and not reserved for the backfill head (else: reserved)
    E: ... and not taken by jobs placed earlier this cycle (else: waiting for GPUs)
    Counts are per node, so gangs and per-node GPU counts are judged exactly.
    """
    if req.gpus == 0:
        return (ReasonKind.NODE_NOT_READY, f"waiting for {req.nodes} ready node(s)")
    key = (req.milli, req.memory_mb, req.model)
    hist = levels.get(key)
    if hist is None:
        hist = levels[key] = _level_histogram(cs, req, own)

    def fits(level: int) -> bool:
        # hist[level][k] = nodes with exactly k GPUs passing up to `level`
        nodes = sum(n for k, n in enumerate(hist[level]) if enough_gpus.fits(req.gpus, k))
        return enough_nodes.fits(req.nodes, nodes)

    largest = max((k for k, n in enumerate(hist[4]) if n), default=0)
    what = (
        f"{req.milli / 1000:g} of a GPU"
        if req.milli < 1000
        else f"{req.gpus} GPU{'s' if req.gpus != 1 else ''}"
    )
    if req.nodes > 1:
        what += f" on each of {req.nodes} nodes"
    if not fits(0):
        return (
            ReasonKind.WAITING_FOR_GPUS,
            f"waiting for {what} (largest free block {largest})",
        )
    if not fits(1):
        blockers: Counter[ReasonKind] = Counter()
        example: dict[ReasonKind, str] = {}
        for room in cs.had_room:
            for sl in room:
                if sl.blocker is not None and gpu_share.fits(req.milli, sl.init_free_milli):
                    k = sl.blocker.kind or ReasonKind.NODE_NOT_READY
                    blockers[k] += 1
                    example.setdefault(k, sl.blocker.message)
        kind = blockers.most_common(1)[0][0]
        return (kind, example[kind])
    if not fits(2):
        most = max((sl.free_mem for sl in cs.slot_at.values() if sl.blocker is None), default=0)
        return (
            ReasonKind.GPU_MEMORY,
            f"waiting for {req.memory_mb} MB free GPU memory on {what} (most free {most} MB)",
        )
    if not fits(3):
        return (ReasonKind.RESERVED_BACKFILL, f"reserved for job {cs.res_job} (backfill)")
    # Free GPUs taken by jobs placed earlier this cycle (E): said as the next cycle will
    # see them, taken. Said apart ("went to jobs ahead this cycle"), each job's start
    # flipped the reason of every job behind and back again: 20,000 rows written twice.
    return (
        ReasonKind.WAITING_FOR_GPUS,
        f"waiting for {what} (largest free block {largest})",
    )


def _room_profiles(
    had_room: list[list[Slot]],
) -> list[tuple[tuple[tuple[SlotProfile, int], ...], int]]:
    """Distinct nodes as seen by the pending-reason histograms, with their multiplicity.

    A node is the multiset of its GPUs' profiles ((profile, how many) pairs): the
    histograms only count GPUs per node, so GPU order and identical GPUs don't matter,
    and on a large cluster a few hundred kinds of node stand for a thousand.
    """
    counts: dict[frozenset[tuple[SlotProfile, int]], int] = {}
    for room in had_room:
        per_gpu: dict[SlotProfile, int] = {}
        for sl in room:
            sp = (
                sl.init_free_milli,
                sl.total_mem,
                sl.model,
                sl.blocker is not None,
                sl.init_free_mem,
                sl.reserved_for,
                sl.free_milli,
                sl.free_mem,
            )
            per_gpu[sp] = per_gpu.get(sp, 0) + 1
        node = frozenset(per_gpu.items())
        counts[node] = counts.get(node, 0) + 1
    return [(tuple(node), n) for node, n in counts.items()]


def _holds_model(r: RunningJobView, model: str, nodes: dict[str, NodeState]) -> bool:
    """Whether any GPU `r` runs on is a `model` GPU."""
    for name, indexes in r.placement:
        node = nodes.get(name)
        if (
            node is not None
            and model in node.models
            and any(slot.model == model for slot in node.slots if slot.index in indexes)
        ):
            return True
    return False


def _room_for(node: NodeState, req: Request, *, now: bool) -> bool:
    """Whether the node has (`now`) or had as the cycle began `req.gpus` usable GPUs with
    room for `req`, whoever they may be reserved for."""
    fitting = 0
    for s in node.slots:
        milli, mem = (s.free_milli, s.free_mem) if now else (s.init_free_milli, s.init_free_mem)
        if (
            s.blocker is None
            and gpu_share.fits(req.milli, milli)
            and gpu_memory.fits(req.memory_mb, mem)
            and gpu_model.fits(req.model, s.model)
        ):
            fitting += 1
    return enough_gpus.fits(req.gpus, fitting)


def _minutes(seconds: float) -> str:
    return f"{seconds:g} s" if seconds < 60 else f"{round(seconds / 60)} min"


def _reservation_note(when: datetime | None) -> str:
    if when is None:
        return "; GPUs reserved, start time unknown (running jobs without runtime estimate)"
    # When: the job's estimated_start_at, which clients format; not a time in the text.
    return "; GPUs reserved for it (see its estimated start)"
