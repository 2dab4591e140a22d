"""One scheduling cycle: frozen snapshot in, Plan out. No I/O, no clock.

Phases (numbered as in the logs and the docs):

1. build    : per-node and per-GPU state; node and GPU filters run once here and
              unusable GPUs are left out of the free-capacity index.
2. order    : the queue policy gives every pending job a position.
3. place    : walk the queue; job filters, can-never-fit check, quota, then
              placement on the best-scored candidate nodes. The first job that
              cannot start gets a backfill reservation (EASY); later jobs may use
              reserved GPUs only if they end before it. Blocked jobs may preempt.
4. explain  : every job left pending gets a typed reason, computed once per
              job shape against the final state (cheap even for 10k jobs).
"""

from __future__ import annotations

import zlib
from collections import Counter
from datetime import datetime, timedelta

from app.scheduling import filters as F
from app.scheduling import scorers
from app.scheduling.queue import attained, las_level, order_jobs
from app.scheduling.state import (
    HardwareClass,
    NodeIndex,
    NodeState,
    Request,
    Slot,
    hardware_classes,
)
from app.scheduling.status import OK, Code, Context, Status
from app.scheduling.types import (
    JobView,
    PendingReason,
    Placement,
    Plan,
    PolicySettings,
    Preemption,
    ProjectView,
    ReasonKind,
    RunningJobView,
    Snapshot,
)

Chosen = list[tuple[NodeState, list[Slot]]]
# Victim searches per cycle: each may scan every running job, so cap them.
_MAX_PREEMPT_SEARCHES = 16
# Victim sets compared per search beyond the nodes needed.
_PREEMPT_OPTIONS = 3


def _runtime(job: JobView) -> int | None:
    """What the scheduler may assume about a job's length: estimate, else limit."""
    if job.estimated_runtime_s is not None:
        return job.estimated_runtime_s
    return job.max_runtime_s


class Cycle:
    """State of one `plan_cycle` call. Not shared, not reused."""

    def __init__(self, snapshot: Snapshot, ctx: Context, seed: int) -> None:
        self.snap = snapshot
        self.ctx = ctx
        self.settings: PolicySettings = ctx.settings
        self.now = ctx.now
        self.seed = seed
        self.scorers = scorers.weighted(self.settings)
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.pending: list[PendingReason] = []
        self.failed: set[tuple[Request, bool]] = set()
        self.never_cache: dict[Request, Status] = {}
        self.preempted: set[int] = set()
        self.preempt_attempts = 0
        # Backfill reservation (one, for the first job that cannot start).
        self.res_job: int | None = None
        self.res_time: datetime | None = None
        self.res_nodes: list[NodeState] = []
        self.res_tried = False
        self.preempt_failed: set[tuple[Request, str, int, int]] = set()
        self._hardware: tuple[HardwareClass, ...] | None = None
        self._had_room: list[list[Slot]] = []
        self.version = 0  # bumped whenever GPU state changes (placement, release, reservation)
        # Expected ends of jobs placed this cycle (for the reservation).
        self.placed_ends: list[tuple[datetime | None, list[Slot], int]] = []
        self._build()

    # ------------------------------------------------------------------ 1. build

    def _build(self) -> None:
        ctx = self.ctx
        self.nodes: list[NodeState] = []
        self.slot_at: dict[tuple[str, int], Slot] = {}
        node_filters = F.NODE_FILTERS
        gpu_filters = F.GPU_FILTERS
        peers_cache: dict[tuple[int, ...], frozenset[int]] = {}

        self.projects: dict[str, ProjectView] = {p.name: p for p in self.snap.projects}
        self.quota_any = any(p.quota_gpus > 0 for p in self.snap.projects)
        self.used_milli: dict[str, int] = {}
        self.running: dict[int, RunningJobView] = {}
        self.running_on: dict[str, list[RunningJobView]] = {}
        self.offpeak_running_milli = 0
        booked: dict[tuple[str, int], int] = {}
        for r in self.snap.running:
            job = r.job
            self.running[job.id] = r
            used = r.share_milli * job.total_gpus
            self.used_milli[job.project] = self.used_milli.get(job.project, 0) + used
            if job.schedule_mode == "offpeak":
                self.offpeak_running_milli += used
            mem = job.gpu_memory_mb or 0
            for node, idxs in r.placement:
                self.running_on.setdefault(node, []).append(r)
                if mem:
                    for idx in idxs:
                        booked[(node, idx)] = booked.get((node, idx), 0) + mem

        for i, nv in enumerate(self.snap.nodes):
            blocker: Status | None = None
            for nf in node_filters:
                st = nf(nv, ctx)
                if st is not OK:  # every filter returns the OK singleton on success
                    blocker = st
                    break
            rank = i if self.seed == 0 else zlib.crc32(f"{self.seed}:{nv.name}".encode())
            ns = NodeState(nv.name, rank, blocker)
            gpus = nv.gpus
            if any(gpus[k].index > gpus[k + 1].index for k in range(len(gpus) - 1)):
                gpus = tuple(sorted(gpus, key=lambda g: g.index))
            for g in gpus:
                gb = blocker
                unchecked = False
                if gb is None:
                    if g.allocated_milli >= 1000:
                        # Wholly ours: nothing can be placed on it unless a preemption frees
                        # it, and then the GPU filters run (see _release). Saves most of the
                        # filter calls on a busy cluster.
                        unchecked = True
                    else:
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
                s = Slot(
                    ns,
                    g.index,
                    g.model,
                    g.memory_total_mb,
                    g.memory_total_mb - taken,
                    1000 - g.allocated_milli if g.allocated_milli < 1000 else 0,
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
                self.slot_at[(nv.name, g.index)] = s
            ns.gpu_count = len(ns.slots)
            ns.models = frozenset(s.model for s in ns.slots)
            self.nodes.append(ns)
        self.node_by_name = {n.name: n for n in self.nodes}
        self.index = NodeIndex(self.nodes)
        self.total_gpus = len(self.slot_at)

    def _check_late(self, s: Slot) -> bool:
        """Run the GPU filters on a GPU skipped at build time because it was fully ours.

        Returns True if the GPU turned out unusable (the caller re-files its node).
        """
        if s.unchecked is None:
            return False
        nv, g = s.unchecked
        s.unchecked = None
        for gf in F.GPU_FILTERS:
            st = gf(nv, g, self.ctx)
            if st is not OK:
                s.blocker = st
                return True
        return False

    @property
    def hardware(self) -> tuple[HardwareClass, ...]:
        if self._hardware is None:
            self._hardware = hardware_classes(self.snap.nodes)
        return self._hardware

    # ------------------------------------------------------------------ 2-4. run

    def run(self) -> Plan:
        snap = self.snap
        running_ids = set(self.running)
        jobs = [j for j in snap.pending if j.id not in running_ids]
        order = order_jobs(
            jobs,
            settings=self.settings,
            projects=self.projects,
            running=snap.running,
            history=snap.runtime_history,
        )
        strict_blocker: JobView | None = None
        failed = self.failed
        preemption = self.settings.preemption and bool(self._victim_pool())
        policy = self.settings.queue_policy
        may_preempt_any = preemption and (
            self.quota_any
            or policy == "las"
            or (
                policy in ("default", "priority")
                and max((j.priority for j in jobs), default=0) > self._min_prio
            )
        )
        backfill = self.settings.backfill
        explain = self.settings.explain
        borrowing = self.settings.borrowing
        never_cache = self.never_cache
        # Once no GPU has any room left and nothing can be preempted, the rest of the
        # queue only needs its reason: skip the placement machinery for it.
        exhausted = False
        full_outside = False  # no room except on GPUs reserved for the backfill head
        checked_at = -1
        deferred: list[tuple[int, JobView, Request]] = []
        for pos, job in enumerate(order, start=1):
            if job.schedule_mode != "now":
                st = self._job_filters(job)
                if st is not None:
                    self._pend(
                        job,
                        pos,
                        st.kind or ReasonKind.WAITING_FOR_GPUS,
                        st.message,
                        st.estimated_start,
                    )
                    continue
            req = Request.of(job)
            nv = never_cache.get(req) or self._never(req)
            if nv is not OK:
                self._pend(job, pos, nv.kind or ReasonKind.NEVER_FITS, nv.message)
                continue
            if not borrowing:
                q = self._quota_block(job, req)
                if q is not None:
                    self._pend(job, pos, ReasonKind.QUOTA, q)
                    continue
            if strict_blocker is not None:
                if not explain:
                    break  # strict order: nothing after the blocked job can start
                self._pend(
                    job,
                    pos,
                    ReasonKind.PRIORITY,
                    f"waiting behind job {strict_blocker.id} (strict queue order, backfill off)",
                )
                continue
            if exhausted and req.gpus > 0:
                deferred.append((pos, job, req))
                continue
            allow_reserved = self.res_time is not None and self._may_use_reserved(job)
            if full_outside and not allow_reserved and req.gpus > 0:
                # Only reserved GPUs have room and this job may not use them.
                deferred.append((pos, job, req))
                continue
            key = (req, allow_reserved)
            chosen = None if key in failed else self._find(req, allow_reserved)
            if chosen is not None:
                self._commit(job, req, chosen, ())
                continue
            failed.add(key)
            if preemption and self._try_preempt(job, req):
                failed = self.failed
                continue
            if backfill:
                if not self.res_tried:
                    self.res_tried = True
                    self._reserve(job, req)
            else:
                strict_blocker = job
            deferred.append((pos, job, req))
            if not may_preempt_any and self.version != checked_at:
                checked_at = self.version
                full_outside = self.index.largest_free_block() == 0 and not self.index.partial
                exhausted = full_outside and self._no_room_left()
        if explain:
            self._explain(deferred)
        self.pending.sort(key=lambda r: r.queue_position)
        return Plan(
            placements=tuple(self.placements),
            preemptions=tuple(self.preemptions),
            pending=tuple(self.pending),
            queue_order=tuple(j.id for j in order),
        )

    def _no_room_left(self) -> bool:
        """True when no usable GPU has any share free (reserved ones included)."""
        if self.index.largest_free_block() > 0 or self.index.partial:
            return False
        if self.res_time is None:
            return True  # held GPUs with unknown start: nobody else may use them
        return not any(
            sl.free_milli > 0 and sl.blocker is None for n in self.res_nodes for sl in n.slots
        )

    def _pend(
        self,
        job: JobView,
        pos: int,
        kind: ReasonKind,
        message: str,
        estimated_start: datetime | None = None,
    ) -> None:
        self.pending.append(PendingReason(job.id, kind, message, pos, estimated_start))

    # ------------------------------------------------------------------ eligibility

    def _job_filters(self, job: JobView) -> Status | None:
        if job.schedule_mode == "now":
            return None  # both job filters only concern "at" and "offpeak" jobs
        for jf in F.JOB_FILTERS:
            st = jf(job, self.ctx)
            if not st.ok:
                if (
                    st.kind is ReasonKind.WINDOW_CLOSED
                    and job.preemptible
                    and self._offpeak_budget_ok(job)
                ):
                    continue
                return st
        return None

    def _offpeak_budget_ok(self, job: JobView) -> bool:
        frac = self.settings.offpeak_outside_fraction
        if frac <= 0:
            return False
        budget = int(frac * self.total_gpus * 1000)
        need = Request.of(job).milli * job.total_gpus
        return self.offpeak_running_milli + need <= budget

    def _never(self, req: Request) -> Status:
        st = self.never_cache.get(req)
        if st is None:
            st = OK if req.gpus == 0 else _first_failure(req, self.hardware)
            self.never_cache[req] = st
        return st

    def _quota_of(self, project: str) -> int:
        p = self.projects.get(project)
        return 0 if p is None else p.quota_gpus * 1000

    def _quota_block(self, job: JobView, req: Request) -> str | None:
        if self.settings.borrowing:
            return None
        quota = self._quota_of(job.project)
        used = self.used_milli.get(job.project, 0)
        need = req.milli * job.total_gpus
        if used + need <= quota:
            return None
        return (
            f"project {job.project} would exceed its quota of {quota // 1000} GPUs "
            f"(using {used / 1000:g}, borrowing disabled)"
        )

    def _may_use_reserved(self, job: JobView) -> bool:
        if self.res_job is None or self.res_time is None:
            return False
        rt = _runtime(job)
        return rt is not None and self.now + timedelta(seconds=rt) <= self.res_time

    # ------------------------------------------------------------------ placement

    def _choose(self, node: NodeState, req: Request, allow_reserved: bool) -> list[Slot] | None:
        """Pick GPUs on one node: NVLink-connected set first, then lowest indices."""
        g = req.gpus
        milli, mem, model = req.milli, req.memory_mb, req.model
        if g == 1 and milli == 1000:
            # One whole GPU: the lowest free index that passes, no need to list them all.
            for s in node.slots:
                if (
                    s.blocker is None
                    and s.free_milli == 1000
                    and s.free_mem >= mem
                    and (model is None or s.model == model)
                    and (s.reserved_for is None or allow_reserved)
                ):
                    return [s]
            return None
        # F.slot_fits inlined: this comprehension is the placement hot loop.
        elig = [
            s
            for s in node.slots
            if s.blocker is None
            and s.free_milli >= milli
            and s.free_mem >= mem
            and (model is None or s.model == model)
            and (s.reserved_for is None or allow_reserved)
        ]
        if not F.enough_gpus.fits(req, len(elig)):
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

    def _candidates(self, req: Request, allow_reserved: bool) -> list[tuple[NodeState, list[Slot]]]:
        limit = max(self.settings.candidate_limit, req.nodes)
        out: list[tuple[NodeState, list[Slot]]] = []
        seen: set[str] = set()

        def consider(n: NodeState) -> bool:
            if n.name in seen or n.blocker is not None:
                return False
            seen.add(n.name)
            if req.model is not None and req.model not in n.models:
                return False
            c = self._choose(n, req, allow_reserved)
            if c is not None:
                out.append((n, c))
            return len(out) >= limit

        if allow_reserved:
            for n in self.res_nodes:
                if consider(n):
                    return out
        if req.milli < 1000:
            for n in list(self.index.partial.values()):
                if consider(n):
                    return out
        buckets = self.index.buckets
        for k in range(max(1, req.gpus), self.index.max_gpus + 1):
            for _, name in buckets[k]:
                if consider(self.node_by_name[name]):
                    return out
        return out

    def _find(self, req: Request, allow_reserved: bool) -> Chosen | None:
        if req.gpus == 0:
            ready = [n for n in self.nodes if n.blocker is None]
            ready.sort(key=lambda n: (n.gpu_count > 0, n.rank))
            if len(ready) < req.nodes:
                return None
            return [(n, []) for n in ready[: req.nodes]]
        # Cheap exit when no node has enough free GPUs (cluster full for this size).
        if req.milli == 1000 and not allow_reserved and self.index.largest_free_block() < req.gpus:
            return None
        cands = self._candidates(req, allow_reserved)
        if len(cands) < req.nodes:
            return None
        if len(cands) == 1:
            return cands
        weighted = self.scorers

        def rank(c: tuple[NodeState, list[Slot]]) -> tuple[float, int]:
            node, picked = c
            total = 0.0
            for scorer, weight in weighted:
                total += weight * scorer(req, node, picked)
            return (-total, node.rank)

        return sorted(cands, key=rank)[: req.nodes]

    def _commit(self, job: JobView, req: Request, chosen: Chosen, after: tuple[int, ...]) -> None:
        self.version += 1
        slots: list[Slot] = []
        for node, picked in chosen:
            for s in picked:
                s.free_milli -= req.milli
                s.free_mem -= req.memory_mb
                slots.append(s)
            self.index.refresh(node)
        need = req.milli * job.total_gpus
        self.used_milli[job.project] = self.used_milli.get(job.project, 0) + need
        if job.schedule_mode == "offpeak":
            self.offpeak_running_milli += need
        rt = _runtime(job)
        end = None if rt is None else self.now + timedelta(seconds=rt)
        self.placed_ends.append((end, slots, req.milli))
        self.placements.append(
            Placement(
                job_id=job.id,
                node_gpus=tuple((n.name, tuple(s.index for s in p)) for n, p in chosen),
                share=req.milli / 1000,
                after_preemption_of=after,
            )
        )

    # ------------------------------------------------------------------ backfill

    def _reserve(self, job: JobView, req: Request) -> None:
        """EASY backfill: reserve for the first blocked job the GPUs it can start on soonest."""
        if req.gpus == 0:
            return
        releases: list[tuple[datetime, list[Slot], int]] = []
        for r in self.running.values():
            if r.job.id in self.preempted:
                continue
            rt = _runtime(r.job)
            if rt is None:
                continue  # unknown end: assume it never ends
            end = max(self.now, r.started_at + timedelta(seconds=rt))
            rslots = [
                s
                for node, idxs in r.placement
                for i in idxs
                if (s := self.slot_at.get((node, i))) is not None
            ]
            releases.append((end, rslots, r.share_milli))
        for end_opt, pslots, milli in self.placed_ends:
            if end_opt is not None:
                releases.append((end_opt, pslots, milli))
        when, per_node = reservation(self.nodes, releases, req, job.id, self.now)
        if not per_node:
            return
        self.version += 1
        self.res_job = job.id
        self.res_time = when
        for node, picked in per_node:
            for s in picked:
                s.reserved_for = job.id
            self.index.refresh(node)
            self.res_nodes.append(node)

    # ------------------------------------------------------------------ preemption

    def _protected(self, r: RunningJobView) -> bool:
        """Anti-loop: young jobs (including ones started by preempting) are never victims."""
        age = (self.now - r.started_at).total_seconds()
        return age < self.settings.min_run_before_preempt_s

    def _victim_reasons(self, job: JobView, req: Request) -> dict[int, str]:
        """Running jobs `job` may stop, with the rule that allows it (first that applies).

        The pool is already limited to preemptible jobs past `min_run_before_preempt_s`.
        Messages are formatted only for the victims finally chosen (`_why`).
        """
        quota = self._quota_of(job.project)
        used = self.used_milli
        reclaim = quota > 0 and used.get(job.project, 0) + req.milli * job.total_gpus <= quota
        policy = self.settings.queue_policy
        by_prio = policy in ("default", "priority")
        las = policy == "las"
        mine = las_level(job.attained_gpu_s, self.settings) if las else 0
        out: dict[int, str] = {}
        for r in self._victim_pool():
            rj = r.job
            if rj.id in self.preempted or rj.id == job.id:
                continue
            if (
                reclaim
                and rj.project != job.project
                and used.get(rj.project, 0) > self._quota_of(rj.project)
            ):
                out[rj.id] = "quota"
            elif by_prio and rj.priority < job.priority:
                out[rj.id] = "priority"
            elif las and self._las_levels[rj.id] > mine:
                out[rj.id] = "las"
        return out

    def _why(self, rule: str, job: JobView, r: RunningJobView) -> str:
        if rule == "quota":
            return (
                f"quota: project {job.project} reclaims its guaranteed GPUs from "
                f"{r.job.project} (borrowing)"
            )
        if rule == "priority":
            return f"priority: job {job.id} (priority {job.priority}) > {r.job.priority}"
        mine = las_level(job.attained_gpu_s, self.settings)
        return (
            f"las: job {job.id} attained less service (queue {mine} < {self._las_levels[r.job.id]})"
        )

    def _victim_pool(self) -> list[RunningJobView]:
        pool = getattr(self, "_pool", None)
        if pool is None:
            pool = [
                r for r in self.running.values() if r.job.preemptible and not self._protected(r)
            ]
            self._pool: list[RunningJobView] | None = pool
            on_node: dict[str, list[RunningJobView]] = {}
            for r in pool:
                for nname, _ in r.placement:
                    on_node.setdefault(nname, []).append(r)
            self._pool_by_node = [(n, on_node[n.name]) for n in self.nodes if n.name in on_node]
            self._min_prio = min((r.job.priority for r in pool), default=0)
            self._las_levels: dict[int, int] = {}
            if self.settings.queue_policy == "las":
                self._las_levels = {
                    r.job.id: las_level(
                        attained(r.job, self.now, r.started_at, r.share), self.settings
                    )
                    for r in pool
                }
            self._max_level = max(self._las_levels.values(), default=0)
        return pool

    def _may_preempt(self, job: JobView, req: Request) -> tuple[Request, str, int, int] | None:
        """Cheap test whether any preemption rule could apply; else skip the search."""
        if req.gpus == 0 or self.preempt_attempts >= _MAX_PREEMPT_SEARCHES:
            return None
        policy = self.settings.queue_policy
        if policy == "las" and self._max_level == 0 and not self.quota_any:
            return None  # every running job is still in the first LAS queue
        if (
            not self.quota_any
            and policy != "las"
            and (policy not in ("default", "priority") or job.priority <= self._min_prio)
        ):
            return None
        level = las_level(job.attained_gpu_s, self.settings) if policy == "las" else 0
        quota = self._quota_of(job.project)
        possible = (
            (
                quota > 0
                and self.used_milli.get(job.project, 0) + req.milli * job.total_gpus <= quota
            )
            or (policy in ("default", "priority") and job.priority > self._min_prio)
            or (policy == "las" and level < self._max_level)
        )
        if not possible:
            return None
        key = (req, job.project, job.priority, level)
        if key in self.preempt_failed:
            return None
        return key

    def _try_preempt(self, job: JobView, req: Request) -> bool:
        key = self._may_preempt(job, req)
        if key is None:
            return False
        self.preempt_attempts += 1
        if self._search_preempt(job, req):
            return True
        self.preempt_failed.add(key)
        return False

    def _search_preempt(self, job: JobView, req: Request) -> bool:
        options: list[tuple[tuple[int, int, int], NodeState, list[RunningJobView]]] = []
        # Which running jobs this job may stop at all, and why (one pass over the pool).
        reasons = self._victim_reasons(job, req)
        if not reasons:
            return False
        enough = req.nodes + _PREEMPT_OPTIONS
        for node, pool in self._pool_by_node:
            if len(options) >= enough:
                break  # a few alternatives are plenty; scanning every node is not worth it
            if node.blocker is not None or (req.model is not None and req.model not in node.models):
                continue
            if not any(r.job.id in reasons for r in pool):
                continue
            useful: set[int] = set()  # GPUs that would serve the job once freed
            changed = False
            for sl in node.slots:
                changed |= self._check_late(sl)
                if (
                    sl.blocker is None
                    and (sl.reserved_for is None or sl.reserved_for == job.id)
                    and (req.model is None or sl.model == req.model)
                    and sl.total_mem >= req.memory_mb
                ):
                    useful.add(sl.index)
            if changed:
                self.index.refresh(node)
            cands = []
            for r in pool:
                if not any(
                    i in useful for nname, idxs in r.placement if nname == node.name for i in idxs
                ):
                    continue  # stopping it would free nothing this job can use
                if r.job.id in reasons:
                    cands.append(r)
            if not cands:
                continue
            cands.sort(key=lambda r: (r.job.priority, -r.started_at.timestamp(), r.job.id))
            freed: dict[int, int] = {}  # slot id -> milli freed on this node
            picked: list[RunningJobView] = []
            for r in cands:
                picked.append(r)
                for nname, idxs in r.placement:
                    if nname == node.name:
                        for i in idxs:
                            freed[i] = freed.get(i, 0) + r.share_milli
                ok = sum(
                    1
                    for s in node.slots
                    if s.blocker is None
                    and (s.reserved_for is None or s.reserved_for == job.id)
                    and (req.model is None or s.model == req.model)
                    and s.free_milli + freed.get(s.index, 0) >= req.milli
                    and _mem_after_release(s, freed.get(s.index, 0)) >= req.memory_mb
                )
                if ok >= req.gpus:
                    cost = (len(picked), sum(p.job.total_gpus for p in picked), node.rank)
                    options.append((cost, node, list(picked)))
                    break
        if len(options) < req.nodes:
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
            if (vs := self.slot_at.get((nname, i))) is not None
        }
        touched: set[str] = set()
        for r in victims.values():
            self._release(r, touched)
        chosen: Chosen = []
        for _, node, _ in chosen_opts:
            c = self._choose(node, req, allow_reserved=False)
            if c is None:
                c = self._choose_for_reservation_owner(node, req, job.id)
            if c is None:
                break
            chosen.append((node, c))
        if len(chosen) < req.nodes:
            # Should not happen; undo so the plan never preempts for nothing.
            for r in victims.values():
                self._unrelease(r)
            for s in self.slot_at.values():
                if id(s) in saved:
                    s.free_milli, s.free_mem, s.booked_mem = saved[id(s)]
            for name in touched:
                self.index.refresh(self.node_by_name[name])
            return False
        for r in victims.values():
            self.preemptions.append(
                Preemption(r.job.id, job.id, self._why(reasons[r.job.id], job, r))
            )
        self.failed = set()  # capacity went up: earlier failures may fit now
        self._commit(job, req, chosen, tuple(victims))
        return True

    def _choose_for_reservation_owner(
        self, node: NodeState, req: Request, job_id: int
    ) -> list[Slot] | None:
        if self.res_job != job_id:
            return None
        return self._choose(node, req, allow_reserved=True)

    def _release(self, r: RunningJobView, touched: set[str]) -> None:
        self.version += 1
        self.preempted.add(r.job.id)
        milli = r.share_milli
        mem = r.job.gpu_memory_mb or 0
        for nname, idxs in r.placement:
            for i in idxs:
                s = self.slot_at.get((nname, i))
                if s is None:
                    continue
                s.free_mem = _mem_after_release(s, milli)
                s.free_milli = min(1000, s.free_milli + milli)
                s.booked_mem = max(0, s.booked_mem - mem)
                self._check_late(s)
            touched.add(nname)
            if nname in self.node_by_name:
                self.index.refresh(self.node_by_name[nname])
        self.used_milli[r.job.project] = self.used_milli.get(r.job.project, 0) - milli * (
            r.job.total_gpus
        )

    def _unrelease(self, r: RunningJobView) -> None:
        self.preempted.discard(r.job.id)
        self.used_milli[r.job.project] = self.used_milli.get(r.job.project, 0) + (
            r.share_milli * r.job.total_gpus
        )

    # ------------------------------------------------------------------ 4. explain

    def _explain(self, deferred: list[tuple[int, JobView, Request]]) -> None:
        cache: dict[Request, tuple[ReasonKind, str]] = {}
        levels: dict[tuple[int, int, str | None], list[list[int]]] = {}
        # Only GPUs with room at the start of the cycle can count at any level.
        self._had_room = [
            room for n in self.nodes if (room := [sl for sl in n.slots if sl.init_free_milli > 0])
        ]
        for pos, job, req in deferred:
            if job.id == self.res_job:
                kind, msg = self._diagnose(req, {}, own=job.id)  # its own GPUs count as free
                self._pend(job, pos, kind, msg + _reservation_note(self.res_time), self.res_time)
                continue
            got = cache.get(req)
            if got is None:
                got = self._diagnose(req, levels)
                cache[req] = got
            self._pend(job, pos, got[0], got[1])

    def _level_histogram(
        self, key: tuple[int, int, str | None], own: int | None
    ) -> list[list[int]]:
        """Per level A..E: how many nodes have exactly k GPUs passing (see _diagnose)."""
        milli, mem, model = key
        size = max((len(room) for room in self._had_room), default=0) + 1
        hist = [[0] * size for _ in range(5)]
        h0, h1, h2, h3, h4 = hist
        for room in self._had_room:
            c0 = c1 = c2 = c3 = c4 = 0
            for sl in room:
                if (
                    sl.init_free_milli < milli
                    or sl.total_mem < mem
                    or (model is not None and sl.model != model)
                ):
                    continue
                c0 += 1
                if sl.blocker is not None:
                    continue
                c1 += 1
                if sl.init_free_mem < mem:
                    continue
                c2 += 1
                r = sl.reserved_for
                if r is not None and r != own:
                    continue
                c3 += 1
                if sl.free_milli < milli or sl.free_mem < mem:
                    continue
                c4 += 1
            h0[c0] += 1
            h1[c1] += 1
            h2[c2] += 1
            h3[c3] += 1
            h4[c4] += 1
        return hist

    def _diagnose(
        self,
        req: Request,
        levels: dict[tuple[int, int, str | None], list[list[int]]],
        own: int | None = None,
    ) -> tuple[ReasonKind, str]:
        """Why a job does not fit: the first of these relaxations under which it would not.

        A: GPUs free by bookkeeping at the start of the cycle (else: waiting for GPUs)
        B: ... and usable (else: node not ready / stale telemetry / unhealthy / foreign)
        C: ... and with enough free memory (else: GPU memory)
        D: ... and not reserved for the backfill head (else: reserved)
        E: ... and not taken by jobs placed earlier this cycle (else: priority)
        Counts are per node, so gangs and per-node GPU counts are judged exactly.
        """
        if req.gpus == 0:
            return (ReasonKind.NODE_NOT_READY, f"waiting for {req.nodes} ready node(s)")
        key = (req.milli, req.memory_mb, req.model)
        hist = levels.get(key)
        if hist is None:
            hist = levels[key] = self._level_histogram(key, own)

        def fits(level: int) -> bool:
            # hist[level][k] = nodes with exactly k GPUs passing up to `level`
            return sum(hist[level][req.gpus :]) >= req.nodes

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
            for room in self._had_room:
                for sl in room:
                    if sl.blocker is not None and sl.init_free_milli >= req.milli:
                        k = sl.blocker.kind or ReasonKind.NODE_NOT_READY
                        blockers[k] += 1
                        example.setdefault(k, sl.blocker.message)
            kind = blockers.most_common(1)[0][0]
            return (kind, example[kind])
        if not fits(2):
            most = max(
                (sl.free_mem for sl in self.slot_at.values() if sl.blocker is None), default=0
            )
            return (
                ReasonKind.GPU_MEMORY,
                f"waiting for {req.memory_mb} MB free GPU memory on {what} (most free {most} MB)",
            )
        if not fits(3):
            return (ReasonKind.RESERVED_BACKFILL, f"reserved for job {self.res_job} (backfill)")
        if not fits(4):
            return (
                ReasonKind.PRIORITY,
                f"waiting for {what}: free GPUs went to jobs ahead in the queue this cycle",
            )
        return (
            ReasonKind.WAITING_FOR_GPUS,
            f"waiting for {what} (largest free block {largest})",
        )


def _reservation_note(when: datetime | None) -> str:
    if when is None:
        return "; GPUs reserved, start time unknown (running jobs without runtime estimate)"
    return f"; GPUs reserved, estimated start {when.isoformat()}"


def _mem_after_release(s: Slot, milli: int) -> int:
    if milli <= 0:
        return s.free_mem
    if s.free_milli + milli >= 1000:
        return s.total_mem - s.foreign_mem
    return s.free_mem


def _first_failure(req: Request, hardware: tuple[HardwareClass, ...]) -> Status:
    for nf in F.NEVER_FILTERS:
        st = nf(req, hardware)
        if st.code is Code.UNRESOLVABLE:
            return st
    return OK


def reservation(
    nodes: list[NodeState],
    releases: list[tuple[datetime, list[Slot], int]],
    req: Request,
    job_id: int,
    now: datetime,
) -> tuple[datetime | None, list[tuple[NodeState, list[Slot]]]]:
    """Earliest time `req` fits as running jobs end, and the GPUs to hold for it.

    Walks expected job ends in time order, adding freed capacity per GPU, until
    `req.nodes` nodes each have `req.gpus` suitable GPUs. GPUs busy now but
    free by then are preferred for the reservation, so as few GPUs as possible
    are held idle (more room for backfill). If no time is found (running jobs
    without a runtime), the currently free suitable GPUs on the best nodes are
    held with an unknown start, so the head job still accumulates capacity.
    """

    def static_ok(s: Slot) -> bool:
        return (
            s.blocker is None
            and (req.model is None or s.model == req.model)
            and s.total_mem >= req.memory_mb
            and (s.reserved_for is None or s.reserved_for == job_id)
        )

    milli_at: dict[int, int] = {}
    mem_ok: dict[int, bool] = {}
    free_now: dict[int, bool] = {}
    count: dict[str, int] = {}
    ok_nodes: dict[str, NodeState] = {}
    for n in nodes:
        if n.blocker is not None:
            continue
        c = 0
        for s in n.slots:
            if not static_ok(s):
                continue
            milli_at[id(s)] = s.free_milli
            mem_ok[id(s)] = s.free_mem >= req.memory_mb
            now_ok = s.free_milli >= req.milli and mem_ok[id(s)]
            free_now[id(s)] = now_ok
            c += now_ok
        count[n.name] = c
        if c >= req.gpus:
            ok_nodes[n.name] = n
    when: datetime | None = now if len(ok_nodes) >= req.nodes else None
    if when is None:
        for end, slots, milli in sorted(releases, key=lambda r: r[0]):
            for s in slots:
                sid = id(s)
                if sid not in milli_at:
                    continue
                before = milli_at[sid] >= req.milli and mem_ok[sid]
                milli_at[sid] += milli
                if milli_at[sid] >= 1000:
                    mem_ok[sid] = s.total_mem - s.foreign_mem >= req.memory_mb
                after = milli_at[sid] >= req.milli and mem_ok[sid]
                if after and not before:
                    count[s.node.name] += 1
                    if count[s.node.name] >= req.gpus:
                        ok_nodes[s.node.name] = s.node
            if len(ok_nodes) >= req.nodes:
                when = end
                break

    def fits_then(s: Slot) -> bool:
        sid = id(s)
        return sid in milli_at and milli_at[sid] >= req.milli and mem_ok[sid]

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
