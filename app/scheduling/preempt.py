"""Phase 3, preemption: a job that cannot start may stop running jobs to start now.

Which running jobs a job may stop (`victim_rules`, `victim_reasons`): those of projects
borrowing beyond their quota while it is within its own, those of lower priority, or,
under LAS and the default, those in a later LAS queue; never non-preemptible ones nor ones younger than
`min_run_before_preempt_s` (the anti-loop guard). The search (`try_preempt`) looks for
the cheapest victim sets on a few nodes, releases them and places the job with
placement.choose/commit. At most MAX_PREEMPT_SEARCHES searches a cycle.
"""

from __future__ import annotations

import math

from app.scheduling.cycle_state import (
    Chosen,
    CycleState,
    check_late,
    protected,
    quota_of,
)
from app.scheduling.filters import enough_gpus, enough_nodes, gpu_memory, gpu_model, reserved
from app.scheduling.filters import quota as project_quota
from app.scheduling.placement import choose, commit
from app.scheduling.queue import attained, las_level, las_victim, queue_level, time_left
from app.scheduling.state import NodeState, Request, Slot
from app.scheduling.types import JobView, Preemption, RunningJobView
from app.scheduling.victims import (
    NodeForPreempt,
    VictimHere,
    VictimRules,
    fits_after,
    mem_after_release,
    victim_order,
)

# Victim searches per cycle: each may scan every running job, so cap them.
MAX_PREEMPT_SEARCHES = 16
# Victim sets compared per search beyond the nodes needed.
_PREEMPT_OPTIONS = 3
# Policies whose queues are LAS levels, where a job in an earlier queue may stop a
# preemptible job in a later one (the default only among equal or lower priorities).
_LEVELLED = frozenset({"las", "default"})


def pending_level(cs: CycleState, job: JobView) -> int:
    """The LAS queue a pending job is in under the cycle's policy (0 for the others)."""
    policy = cs.settings.queue_policy
    if policy == "las":
        return las_level(job.attained_gpu_s, cs.settings)
    if policy == "default":
        if not cs.settings.promoted_may_preempt:
            # A job promoted back to the first queue goes first on free GPUs only.
            return las_level(job.attained_gpu_s, cs.settings)
        return queue_level(job, cs.now, cs.settings)
    return 0


def later_may_preempt(cs: CycleState, job: JobView) -> bool:
    """Whether a job after `job` in the queue (which failed to start) may still start
    by preemption in this cycle; if not, the rest of the queue needs only free room."""
    if cs.preempt_attempts >= MAX_PREEMPT_SEARCHES:
        return False
    if cs.settings.queue_policy != "las" or cs.quota_any:
        return True
    # LAS orders by queue level and only a lower level preempts: later jobs are at
    # this level or above.
    return las_level(job.attained_gpu_s, cs.settings) < cs.max_level


def victim_pool(cs: CycleState) -> list[RunningJobView]:
    pool = cs.pool
    if pool is None:
        pool = [r for r in cs.running.values() if r.job.preemptible and not protected(cs, r)]
        cs.pool = pool
        cs.pool_keys = [(r.job.id, r.job.project, r.job.priority) for r in pool]
        cs.pool_by_node = None
        cs.min_prio = min((r.job.priority for r in pool), default=0)
        cs.las_levels = {}
        settings = cs.settings
        if settings.queue_policy in _LEVELLED:
            # Under the default, a job the LAS rule may not stop (the preemption would not
            # pay for its cost, queue.las_victim) counts as in the first queue.
            costed = settings.queue_policy == "default"
            cs.las_levels = {
                r.job.id: (
                    las_level(attained(r.job, cs.now, r.started_at, r.share), settings)
                    if not costed or las_victim(r, cs.now, settings)
                    else 0
                )
                for r in pool
            }
            if costed and settings.preempt_shorter_only:
                cs.las_left = {
                    r.job.id: time_left(r.job, cs.now, r.started_at, r.share) for r in pool
                }
        cs.max_level = max(cs.las_levels.values(), default=0)
    return pool


def _victims_by_node(cs: CycleState) -> list[tuple[NodeState, list[VictimHere]]]:
    """The pool per node, in node order; built at the first victim search (most
    cycles run none)."""
    if cs.pool_by_node is None:
        on_node: dict[str, list[RunningJobView]] = {}
        for r in victim_pool(cs):
            for nname, _ in r.placement:
                on_node.setdefault(nname, []).append(r)
        cs.pool_by_node = [
            (n, [VictimHere.of(r, n.name) for r in on_node[n.name]])
            for n in cs.nodes
            if n.name in on_node
        ]
    return cs.pool_by_node


def _may_preempt(
    cs: CycleState, job: JobView, req: Request
) -> tuple[Request, str, int, int] | None:
    """Cheap test whether any preemption rule could apply; else skip the search."""
    if req.gpus == 0 or cs.preempt_attempts >= MAX_PREEMPT_SEARCHES:
        return None
    policy = cs.settings.queue_policy
    if policy == "las" and cs.max_level == 0 and not cs.quota_any:
        return None  # every running job is still in the first LAS queue
    by_priority = policy in ("default", "priority") and job.priority > cs.min_prio
    if not cs.quota_any and not by_priority and not (policy in _LEVELLED and cs.max_level):
        return None
    level = pending_level(cs, job)
    quota = quota_of(cs, job.project)
    possible = (
        (quota > 0 and project_quota.fits(req, job, cs.used_milli.get(job.project, 0), quota))
        or by_priority
        or (policy in _LEVELLED and level < cs.max_level)
    )
    if not possible:
        return None
    key = (req, job.project, job.priority, level)
    if key in cs.preempt_failed:
        return None
    return key


def try_preempt(cs: CycleState, job: JobView, req: Request) -> bool:
    key = _may_preempt(cs, job, req)
    if key is None:
        return False
    cs.preempt_attempts += 1
    rules = victim_rules(cs, job, req)
    if not _dominated(cs, job, req, rules) and _search_preempt(cs, job, req, rules):
        return True
    cs.preempt_failed.add(key)
    return False


def _dominated(cs: CycleState, job: JobView, req: Request, rules: VictimRules) -> bool:
    """Whether a search with the same victims already failed for a request no harder
    than `req`: then this one fails too, and is counted without scanning every node.

    No harder: no more GPUs, nodes, share or memory per GPU, any model or the same
    one, and no node it may not use that `req` may. Every node test of the search is
    monotone in these, so a node that offered the easier request no victim set offers
    none to this one. Not for the reservation's owner: the GPUs reserved for it add to
    what it may use.
    """
    if job.id == cs.res_job:
        return False
    return any(
        req.gpus >= f.gpus
        and req.nodes >= f.nodes
        and req.milli >= f.milli
        and req.memory_mb >= f.memory_mb
        and (f.model is None or f.model == req.model)
        and req.barred >= f.barred
        for f in cs.no_victims.get(rules, ())
    )


def _search_preempt(cs: CycleState, job: JobView, req: Request, rules: VictimRules) -> bool:
    cs.victim_scans += 1
    options: list[tuple[tuple[int, int, int], NodeState, list[RunningJobView]]] = []
    # Which running jobs this job may stop at all, and why (one pass over the pool).
    reasons = victim_reasons(cs, rules)
    if not reasons:
        cs.no_victims.setdefault(rules, []).append(req)
        return False
    enough = req.nodes + _PREEMPT_OPTIONS
    pmemo = cs.pmemo
    for node, pool in _victims_by_node(cs):
        if len(options) >= enough:
            break  # a few alternatives are plenty; scanning every node is not worth it
        if node.blocker is not None or not gpu_model.on_node(req.model, node.models):
            continue
        if node.name in req.barred:
            continue
        if not any(v.id in reasons for v in pool):
            continue
        # GPUs that would serve the job once freed, remembered per node state (see
        # NodeForPreempt). The late GPU checks run on every slot of every node looked
        # at here, as they always have: their outcome feeds later scores and the
        # reservation, so which slots get checked must not change. A remembered
        # entry implies they already ran.
        mkey = (node.name, req.model, req.memory_mb)
        pm = pmemo.get(mkey)
        if pm is None or pm.version != node.version or pm.own not in (None, job.id):
            useful: list[Slot] = []
            changed = False
            holds_reserved = False
            model, memory_mb = req.model, req.memory_mb
            for sl in node.slots:
                if sl.unchecked is not None:
                    changed |= check_late(cs, sl)
                if sl.reserved_for is not None:
                    holds_reserved = True
                if (
                    sl.blocker is None
                    and reserved.fits(sl.reserved_for, job.id)
                    and gpu_model.fits(model, sl.model)
                    and gpu_memory.fits(memory_mb, sl.total_mem)
                ):
                    useful.append(sl)
            if changed:
                cs.index.refresh(node)
            pm = pmemo[mkey] = NodeForPreempt(
                node.version, job.id if holds_reserved else None, useful, pool
            )
        useful = pm.useful
        if not enough_gpus.fits(req.gpus, len(useful)):
            continue  # even stopping every job here leaves too few suitable GPUs
        if pm.hopeless(req):
            continue  # stopping every preemptible job here would not make room
        useful_idx = pm.useful_idx
        # Jobs it may stop whose GPUs here would serve it (others would free nothing).
        cands = [v for v in pool if v.id in reasons and any(i in useful_idx for i in v.idxs)]
        if not cands:
            continue
        freed: dict[int, int] = {}  # GPU index -> milli freed on this node
        for v in cands:
            for i in v.idxs:
                freed[i] = freed.get(i, 0) + v.milli
        # Upper bound first: freeing more never makes a GPU less suitable, so if all
        # candidates together do not make room, no prefix of them does.
        if not enough_gpus.fits(req.gpus, fits_after(useful, freed, req)):
            continue
        cands.sort(key=victim_order)
        freed = {}
        picked: list[RunningJobView] = []
        for v in cands:
            picked.append(v.run)
            for i in v.idxs:
                freed[i] = freed.get(i, 0) + v.milli
            if enough_gpus.fits(req.gpus, fits_after(useful, freed, req)):
                cost = (len(picked), sum(p.job.total_gpus for p in picked), node.rank)
                options.append((cost, node, list(picked)))
                break
    if not enough_nodes.fits(req.nodes, len(options)):
        if job.id != cs.res_job:
            cs.no_victims.setdefault(rules, []).append(req)
        return False
    options.sort(key=lambda o: o[0])
    chosen_opts = options[: req.nodes]
    victims: dict[int, RunningJobView] = {}
    for _, _, picked in chosen_opts:
        for r in picked:
            victims[r.job.id] = r
    saved = {
        id(vs): (vs.free_milli, vs.free_mem, vs.booked_mem)
        for r in victims.values()
        for nname, idxs in r.placement
        for i in idxs
        if (vs := cs.slot_at.get((nname, i))) is not None
    }
    rule_of = {rid: reasons[rid] for rid in victims}  # _release drops them from reasons
    touched: set[str] = set()
    for r in victims.values():
        _release(cs, r, touched)
    chosen: Chosen = []
    for _, node, _ in chosen_opts:
        c = choose(node, req, None)
        if c is None:
            c = _choose_for_reservation_owner(cs, node, req, job.id)
        if c is None:
            break
        chosen.append((node, c))
    if not enough_nodes.fits(req.nodes, len(chosen)):
        # Should not happen; undo so the plan never preempts for nothing.
        for r in victims.values():
            _unrelease(cs, r)
        for s in cs.slot_at.values():
            if id(s) in saved:
                s.free_milli, s.free_mem, s.booked_mem = saved[id(s)]
        for name in touched:
            cs.index.refresh(cs.node_by_name[name])
        return False
    for r in victims.values():
        cs.preemptions.append(Preemption(r.job.id, job.id, _why(cs, rule_of[r.job.id], job, r)))
    # Capacity went up: earlier failures may fit now.
    cs.failed = set()
    cs.no_victims = {}
    commit(cs, job, req, chosen, tuple(victims))
    return True


def _choose_for_reservation_owner(
    cs: CycleState, node: NodeState, req: Request, job_id: int
) -> list[Slot] | None:
    if cs.res_job != job_id:
        return None
    return choose(node, req, job_id)


def _release(cs: CycleState, r: RunningJobView, touched: set[str]) -> None:
    cs.version += 1
    cs.preempted.add(r.job.id)
    for reasons in cs.reasons_by_rules.values():
        reasons.pop(r.job.id, None)
    milli = r.share_milli
    mem = r.job.gpu_memory_mb or 0
    for nname, idxs in r.placement:
        for i in idxs:
            s = cs.slot_at.get((nname, i))
            if s is None:
                continue
            s.free_mem = mem_after_release(s, milli)
            s.free_milli = min(1000, s.free_milli + milli)
            s.booked_mem = max(0, s.booked_mem - mem)
            check_late(cs, s)
        touched.add(nname)
        if nname in cs.node_by_name:
            cs.index.refresh(cs.node_by_name[nname])
    cs.used_milli[r.job.project] = cs.used_milli.get(r.job.project, 0) - r.held_milli


def _unrelease(cs: CycleState, r: RunningJobView) -> None:
    cs.preempted.discard(r.job.id)
    cs.reasons_by_rules.clear()  # worked out again, with this job a victim again
    cs.used_milli[r.job.project] = cs.used_milli.get(r.job.project, 0) + r.held_milli


def victim_rules(cs: CycleState, job: JobView, req: Request) -> VictimRules:
    """What decides which running jobs `job` may stop (see `victim_reasons`)."""
    quota = quota_of(cs, job.project)
    used = cs.used_milli
    borrowing: frozenset[str] = frozenset()
    if quota > 0 and project_quota.fits(req, job, used.get(job.project, 0), quota):
        # It may reclaim its quota from projects borrowing beyond theirs right now.
        borrowing = frozenset(
            name for name, held in used.items() if held > quota_of(cs, name) and name != job.project
        )
    policy = cs.settings.queue_policy
    longer: float | None = None
    if policy == "default" and cs.settings.preempt_shorter_only:
        # Stop a job only for one expected to end sooner (shortest remaining time).
        left = time_left(job, cs.now, None, 1.0)
        longer = None if left == math.inf else left
    return VictimRules(
        borrowing,
        job.priority if policy in ("default", "priority") else None,
        pending_level(cs, job) if policy in _LEVELLED else None,
        longer,
    )


def victim_reasons(cs: CycleState, rules: VictimRules) -> dict[int, str]:
    """Running jobs the rules allow stopping, with the rule that allows it (first that
    applies).

    The pool is already limited to preemptible jobs past `min_run_before_preempt_s`.
    Messages are formatted only for the victims finally chosen (`_why`). Remembered
    per rules for the cycle: `_release` drops each victim from every remembered set.
    """
    out = cs.reasons_by_rules.get(rules)
    if out is not None:
        return out
    out = cs.reasons_by_rules[rules] = {}
    borrowing, above, mine, longer = rules
    victim_pool(cs)
    preempted = cs.preempted
    levels = cs.las_levels
    left = cs.las_left
    for rid, project, priority in cs.pool_keys:
        if rid in preempted:
            continue
        if project in borrowing:
            out[rid] = "quota"
        elif above is not None and priority < above:
            out[rid] = "priority"
        elif (
            mine is not None
            and levels[rid] > mine
            and (above is None or priority <= above)
            and (longer is None or left.get(rid, math.inf) > longer)
        ):
            out[rid] = "las"
    return out


def _why(cs: CycleState, rule: str, job: JobView, r: RunningJobView) -> str:
    if rule == "quota":
        return (
            f"quota: project {job.project} reclaims its guaranteed GPUs from "
            f"{r.job.project} (borrowing)"
        )
    if rule == "priority":
        return f"priority: job {job.id} (priority {job.priority}) > {r.job.priority}"
    mine = pending_level(cs, job)
    return f"las: job {job.id} attained less service (queue {mine} < {cs.las_levels[r.job.id]})"
