"""Phase 3, backfill (EASY): the first job that cannot start gets a reservation.

`reserve` walks the running jobs' expected ends (estimate, else limit) until the
blocked job fits, and holds the GPUs it will start on; later jobs may use held GPUs
only if they end before it (`reserved_until_s`). `reservation` is the pure walk, also
behind `estimate_start`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from operator import itemgetter

from app.scheduling.cycle_state import CycleState, runtime
from app.scheduling.filters import (
    enough_gpus,
    enough_nodes,
    gpu_memory,
    gpu_model,
    gpu_share,
    reserved,
)
from app.scheduling.state import NodeState, Request, Slot
from app.scheduling.types import JobView, NodeGpus


def no_room_left(cs: CycleState) -> bool:
    """True when no usable GPU has any share free (reserved ones included)."""
    if cs.index.largest_free_block() > 0 or cs.index.partial:
        return False
    if cs.res_time is None:
        return True  # held GPUs with unknown start: nobody else may use them
    return not any(sl.free_milli > 0 and sl.blocker is None for n in cs.res_nodes for sl in n.slots)


def reserved_until_s(cs: CycleState) -> int | None:
    """The longest runtime (whole seconds) that ends by the reservation's start: a job
    whose runtime is at most this may use the reserved GPUs. None: no reservation."""
    if cs.res_job is None or cs.res_time is None:
        return None
    span = cs.res_time - cs.now  # now + runtime <= start, in whole seconds
    return span.days * 86_400 + span.seconds


def reserve(cs: CycleState, job: JobView, req: Request) -> None:
    """EASY backfill: reserve for the first blocked job the GPUs it can start on soonest."""
    if req.gpus == 0:
        return
    releases: list[tuple[datetime, NodeGpus, int]] = []
    now = cs.now
    preempted = cs.preempted
    spans: dict[int, timedelta] = {}  # runtimes repeat: one timedelta each
    for r in cs.running.values():
        rj = r.job
        if rj.id in preempted:
            continue
        rt = runtime(rj)
        if rt is None:
            continue  # unknown end: assume it never ends
        span = spans.get(rt)
        if span is None:
            span = spans[rt] = timedelta(seconds=rt)
        end = r.started_at + span
        if not end > now:  # max(now, end), keeping `now` on ties as max() does
            end = now
        releases.append((end, r.placement, r.share_milli))
    for end_opt, placed, milli in cs.placed_ends:
        if end_opt is not None:
            releases.append((end_opt, placed, milli))
    when, per_node = reservation(
        cs.nodes, releases, req, job.id, cs.now, slot_at=cs.slot_at, node_by_name=cs.node_by_name
    )
    if not per_node:
        return
    cs.version += 1
    cs.res_job = job.id
    cs.res_time = when
    for node, picked in per_node:
        for s in picked:
            s.reserved_for = job.id
        cs.index.refresh(node)
        cs.res_nodes.append(node)


def reservation(
    nodes: list[NodeState],
    releases: list[tuple[datetime, NodeGpus, int]],
    req: Request,
    job_id: int,
    now: datetime,
    *,
    slot_at: Mapping[tuple[str, int], Slot],
    node_by_name: Mapping[str, NodeState],
) -> tuple[datetime | None, list[tuple[NodeState, list[Slot]]]]:
    """Earliest time `req` fits as running jobs end, and the GPUs to hold for it.

    `releases` are (expected end, GPUs by node name, milli freed per GPU); `slot_at`
    finds a GPU's state, looked up only for the releases walked (usually few of them).
    Walks expected job ends in time order, adding freed capacity per GPU, until
    `req.nodes` nodes each have `req.gpus` suitable GPUs. GPUs busy now but
    free by then are preferred for the reservation, so as few GPUs as possible
    are held idle (more room for backfill). If no time is found (running jobs
    without a runtime), the currently free suitable GPUs on the best nodes are
    held with an unknown start, so the head job still accumulates capacity.
    """

    milli_at: dict[int, int] = {}
    mem_ok: dict[int, bool] = {}
    free_now: dict[int, bool] = {}
    count: dict[str, int] = {}
    ok_nodes: dict[str, NodeState] = {}
    model, memory_mb, milli, gpus = req.model, req.memory_mb, req.milli, req.gpus
    for n in nodes:
        if n.blocker is not None or n.name in req.barred:
            continue
        c = 0
        for s in n.slots:
            # Usable, right model, big enough, not held for another job.
            if (
                s.blocker is not None
                or not gpu_model.fits(model, s.model)
                or not gpu_memory.fits(memory_mb, s.total_mem)
                or not reserved.fits(s.reserved_for, job_id)
            ):
                continue
            sid = id(s)
            milli_at[sid] = s.free_milli
            m_ok = mem_ok[sid] = gpu_memory.fits(memory_mb, s.free_mem)
            now_ok = free_now[sid] = gpu_share.fits(milli, s.free_milli) and m_ok
            c += now_ok
        count[n.name] = c
        if enough_gpus.fits(gpus, c):
            ok_nodes[n.name] = n
    when: datetime | None = now if enough_nodes.fits(req.nodes, len(ok_nodes)) else None
    if when is None:
        for end, placement, freed in sorted(releases, key=itemgetter(0)):
            for name, idxs in placement:
                for i in idxs:
                    freed_on = slot_at.get((name, i))
                    if freed_on is None:
                        continue
                    sid = id(freed_on)
                    at = milli_at.get(sid)
                    if at is None:
                        continue
                    before = gpu_share.fits(milli, at) and mem_ok[sid]
                    at = milli_at[sid] = at + freed
                    if at >= 1000:
                        mem_ok[sid] = gpu_memory.fits(memory_mb, freed_on.mem_when_empty)
                    after = gpu_share.fits(milli, at) and mem_ok[sid]
                    if after and not before:
                        count[name] += 1
                        if enough_gpus.fits(gpus, count[name]):
                            ok_nodes[name] = node_by_name[name]
            if enough_nodes.fits(req.nodes, len(ok_nodes)):
                when = end
                break

    def fits_then(s: Slot) -> bool:
        sid = id(s)
        return sid in milli_at and gpu_share.fits(milli, milli_at[sid]) and mem_ok[sid]

    out: list[tuple[NodeState, list[Slot]]] = []
    if when is not None:
        # Hold as few currently free GPUs as possible.
        def held_now(n: NodeState) -> int:
            later = sum(1 for s in n.slots if fits_then(s) and not free_now.get(id(s), False))
            return max(0, req.gpus - later)

        chosen = sorted(ok_nodes.values(), key=lambda n: (held_now(n), n.rank))[: req.nodes]
        for n in chosen:
            ready = [s for s in n.slots if fits_then(s)]
            ready.sort(key=lambda s: (free_now.get(id(s), False), s.index))
            out.append((n, ready[: req.gpus]))
        return when, out
    ranked = sorted(
        (n for n in nodes if n.name in count),
        key=lambda n: (-count[n.name], n.rank),
    )[: req.nodes]
    for n in ranked:
        held = [s for s in n.slots if free_now.get(id(s), False)][: req.gpus]
        if held:
            out.append((n, held))
    return None, out
