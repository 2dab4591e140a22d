"""Phase 3, placement: pick the GPUs of one job on the best-scored candidate nodes.

`find` walks the free-capacity index (state.NodeIndex) tightest first, asks `choose`
for each node's GPUs (remembered per node version and job shape), ranks the
candidates with the scorers and returns the best; `commit` books the choice into the
cycle state. Preemption (preempt.py) calls `choose` and `commit` too.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from app.scheduling.cycle_state import Chosen, CycleState, runtime
from app.scheduling.eligibility import count_placed
from app.scheduling.filters import enough_gpus, enough_nodes, gpu_model, slot_fits
from app.scheduling.state import Choice, NodeState, Request, Slot
from app.scheduling.types import JobView, Placement


def choose(node: NodeState, req: Request, holder: int | None) -> list[Slot] | None:
    """Pick GPUs on one node: NVLink-connected set first, then lowest indices.

    `holder`: the job whose reserved GPUs this job may use (None: none)."""
    g = req.gpus
    milli, mem, model = req.milli, req.memory_mb, req.model  # read once: a tuple's fields
    if g == 1 and milli == 1000:
        # One whole GPU: the lowest free index that passes, no need to list them all.
        for s in node.slots:
            if slot_fits(milli, mem, model, s, holder):
                return [s]
        return None
    elig = [s for s in node.slots if slot_fits(milli, mem, model, s, holder)]
    if not enough_gpus.fits(g, len(elig)):
        return None
    if req.milli < 1000:
        # Shared job: the fullest GPU that still has room keeps others whole.
        return [min(elig, key=lambda s: (s.free_milli, s.index))]
    if g == 1:
        return elig[:1]
    for start in elig:
        if len(start.peers) < g - 1:
            continue
        group = [start]
        common = start.peers  # GPUs linked to every member so far
        for t in elig:
            if t is not start and t.index in common:
                group.append(t)
                if len(group) == g:
                    return sorted(group, key=lambda s: s.index)
                common = common & t.peers
    return elig[:g]


def candidates(
    cs: CycleState, req: Request, allow_reserved: bool, key: int
) -> list[tuple[NodeState, list[Slot]]]:
    limit = max(cs.settings.candidate_limit, req.nodes)
    out: list[tuple[NodeState, list[Slot]]] = []
    pick = choose
    model = req.model
    # Jobs that end before the backfill head starts may use the GPUs held for it.
    holder = cs.res_job if allow_reserved else None
    # Each node sits in one bucket; only the reserved and partly shared nodes
    # looked at first can come round again.
    seen: set[str] | None = set() if allow_reserved or req.milli < 1000 else None
    barred = req.barred
    for n in walk(cs, req, allow_reserved):
        if n.blocker is not None or (barred and n.name in barred):
            continue
        if seen is not None:
            if n.name in seen:
                continue
            seen.add(n.name)
        if not gpu_model.on_node(model, n.models):
            continue
        # A node's GPU choice (and score) only changes when the node does: most
        # candidates of one job are the candidates of the next job of that shape.
        memo = n.memo.get(key)
        if memo is not None and memo.version == n.version:
            c = memo.picked
        else:
            c = pick(n, req, holder)
            n.memo[key] = Choice(n.version, c)
        if c is not None:
            out.append((n, c))
            if len(out) >= limit:
                return out
    return out


def walk(cs: CycleState, req: Request, allow_reserved: bool) -> Iterator[NodeState]:
    """Nodes in the order placement looks at them: reserved (if allowed), partly
    shared (for shared jobs), then by free whole GPUs, tightest first."""
    if allow_reserved:
        yield from cs.res_nodes
    if req.milli < 1000:
        yield from list(cs.index.partial.values())
    buckets = cs.index.buckets
    node_by_name = cs.node_by_name
    for k in range(max(1, req.gpus), cs.index.max_gpus + 1):
        for _, name in buckets[k]:
            yield node_by_name[name]


def memo_key(cs: CycleState, req: Request, allow_reserved: bool) -> int:
    """Small int standing for (request, may use reserved GPUs) in the node memos."""
    k = (req, allow_reserved)
    n = cs.memo_keys.get(k)
    if n is None:
        n = cs.memo_keys[k] = len(cs.memo_keys)
    return n


def find(cs: CycleState, req: Request, allow_reserved: bool, key: int) -> Chosen | None:
    """Best `req.nodes` candidate nodes with their GPUs, or None if too few fit.

    `key` is `memo_key(req, allow_reserved)`, worked out once per job shape.
    """
    if req.gpus == 0:
        ready = [n for n in cs.nodes if n.blocker is None and n.name not in req.barred]
        ready.sort(key=lambda n: (n.gpu_count > 0, n.rank))
        if not enough_nodes.fits(req.nodes, len(ready)):
            return None
        return [(n, []) for n in ready[: req.nodes]]
    # Cheap exit when no node has enough free GPUs (cluster full for this size).
    if (
        req.milli == 1000
        and not allow_reserved
        and not enough_gpus.fits(req.gpus, cs.index.largest_free_block())
    ):
        return None
    cands = candidates(cs, req, allow_reserved, key)
    if not enough_nodes.fits(req.nodes, len(cands)):
        return None
    if len(cands) == 1:
        return cands
    weighted = cs.scorers

    def rank(c: tuple[NodeState, list[Slot]]) -> tuple[float, int]:
        node, picked = c
        memo = node.memo[key]  # filled by candidates for this very node state
        total = memo.score
        if total is None:
            total = 0.0
            for scorer, weight in weighted:
                total += weight * scorer(req, node, picked)
            memo.score = total
        return (-total, node.rank)

    return sorted(cands, key=rank)[: req.nodes]


def commit(
    cs: CycleState, job: JobView, req: Request, chosen: Chosen, after: tuple[int, ...]
) -> None:
    cs.version += 1
    for node, picked in chosen:
        for s in picked:
            s.free_milli -= req.milli
            s.free_mem -= req.memory_mb
        cs.index.refresh(node)
    need = req.milli * job.total_gpus
    cs.used_milli[job.project] = cs.used_milli.get(job.project, 0) + need
    if cs.user_limits or cs.project_limits:
        count_placed(cs, job, need)
    if job.schedule_mode == "offpeak":
        cs.offpeak_running_milli += need
    placed = tuple([(n.name, tuple([s.index for s in p])) for n, p in chosen])
    if not cs.res_tried:  # only the (single) reservation reads these
        rt = runtime(job)
        end = None if rt is None else cs.now + timedelta(seconds=rt)
        cs.placed_ends.append((end, placed, req.milli))
    cs.placements.append(Placement(job.id, placed, req.milli / 1000, after))
