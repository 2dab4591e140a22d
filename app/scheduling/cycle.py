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
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from operator import attrgetter, itemgetter
from typing import NamedTuple

from app.scheduling import filters as F
from app.scheduling import scorers
from app.scheduling.filters import account, node_choice
from app.scheduling.queue import attained, las_level, order_jobs
from app.scheduling.state import (
    Choice,
    HardwareClass,
    NodeIndex,
    NodeState,
    Request,
    Slot,
    hardware_classes,
)
from app.scheduling.status import OK, Code, Context, Status
from app.scheduling.types import (
    GpuView,
    JobView,
    NodeGpus,
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
_QUEUE_POSITION = attrgetter("queue_position")
# The filter sets the build prechecks were written for (tests may swap the tuples).
_NODE_FILTERS = F.NODE_FILTERS
_GPU_FILTERS = F.GPU_FILTERS
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
        # (request, may use reserved GPUs) pairs that found no room, as `_memo_key` ints.
        self.failed: set[int] = set()
        self.never_cache: dict[Request, Status] = {}
        self.preempted: set[int] = set()
        # Explain phase: projects running beyond their quota (per GPU model asked for, None
        # for any), and the note per (project, GPU model asked for).
        self._borrowers: dict[str | None, dict[str, tuple[datetime | None, bool]]] = {}
        self._reclaim_notes: dict[tuple[str, str | None], str] = {}
        self._quota_room: dict[str, int] = {}
        # Preemptible running jobs still too young to preempt, and the note per (priority,
        # GPU model asked for) of a job that outranks some of them.
        self._young: list[RunningJobView] = []
        self._priority_notes: dict[tuple[int, str | None], str] = {}
        self.preempt_attempts = 0
        self.victim_scans = 0  # searches that ran (a dominated one counts as attempt only)
        # Backfill reservation (one, for the first job that cannot start).
        self.res_job: int | None = None
        self.res_time: datetime | None = None
        self.res_nodes: list[NodeState] = []
        self.res_tried = False
        self.preempt_failed: set[tuple[Request, str, int, int]] = set()
        # Requests whose victim search found too few nodes, per victim set (see
        # _dominated); emptied when a preemption frees GPUs.
        self.no_victims: dict[_VictimRules, list[Request]] = {}
        self._reasons_by_rules: dict[_VictimRules, dict[int, str]] = {}
        self._hardware: tuple[HardwareClass, ...] | None = None
        self._had_room: list[list[Slot]] = []
        self._room_profiles: list[tuple[tuple[tuple[_SlotProfile, int], ...], int]] = []
        self._room_max = 0
        self._memo_keys: dict[tuple[Request, bool], int] = {}
        self._pmemo: dict[tuple[str, str | None, int], _NodeForPreempt] = {}
        self.version = 0  # bumped whenever GPU state changes (placement, release, reservation)
        # Expected ends of jobs placed this cycle (for the reservation).
        self.placed_ends: list[tuple[datetime | None, NodeGpus, int]] = []
        self._build()

    # ------------------------------------------------------------------ 1. build

    def _build(self) -> None:
        ctx = self.ctx
        self.nodes: list[NodeState] = []
        self.slot_at: dict[tuple[str, int], Slot] = {}
        # Usable nodes whose maintenance is still to come, with its start.
        self.maintenance: list[tuple[str, datetime]] = []
        self._barred_by_limit: dict[int | None, frozenset[str]] = {}
        self._barred_by_choice: dict[
            tuple[frozenset[str] | None, frozenset[str]], frozenset[str]
        ] = {}
        # Owners' accounts some node cannot run jobs as (filters/account.py).
        self.lacking = account.lacking(self.snap.nodes)
        node_filters = F.NODE_FILTERS
        gpu_filters = F.GPU_FILTERS
        peers_cache: dict[tuple[int, ...], frozenset[int]] = {}

        self.projects: dict[str, ProjectView] = {p.name: p for p in self.snap.projects}
        self.quota_any = any(p.quota_gpus > 0 for p in self.snap.projects)
        used_milli: dict[str, int] = {}
        running: dict[int, RunningJobView] = {}
        self.used_milli = used_milli
        self.running = running
        offpeak_milli = 0
        booked: dict[tuple[str, int], int] = {}
        for r in self.snap.running:
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
        self.offpeak_running_milli = offpeak_milli

        # Precheck bounds (see filters/__init__.py): only nodes and GPUs they cannot
        # vouch for run the filters, which then decide as always.
        prechecks = node_filters == _NODE_FILTERS and gpu_filters == _GPU_FILTERS
        hb_after = F.heartbeat_fresh.fresh_after(ctx)
        tel_after = F.telemetry_fresh.fresh_after(ctx)
        idle_before = F.foreign_load.idle_before(ctx)
        foreign_below = self.settings.foreign_util_threshold_pct
        # For _check_late: None when the GPU filters must always run.
        self._gpu_bounds = (tel_after, idle_before, foreign_below) if prechecks else None
        for i, nv in enumerate(self.snap.nodes):
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
            rank = i if self.seed == 0 else zlib.crc32(f"{self.seed}:{nv.name}".encode())
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
                        # it, and then the GPU filters run (see _release). Saves most of the
                        # filter calls on a busy cluster.
                        unchecked = True
                    elif not (prechecks and _gpu_vouched(g, tel_after, idle_before, foreign_below)):
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
                    ns,
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
                self.slot_at[(nv.name, g.index)] = s
            ns.gpu_count = len(ns.slots)
            ns.models = frozenset([s.model for s in ns.slots])
            self.nodes.append(ns)
            if blocker is None and nv.maintenance_at is not None:
                self.maintenance.append((nv.name, nv.maintenance_at))
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
        if self._gpu_bounds is not None and _gpu_vouched(g, *self._gpu_bounds):
            return False
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
            now=self.now,
        )
        strict_blocker: JobView | None = None
        strict_msg = ""
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
        # Once no GPU has any room left and nothing can be preempted, the rest of the
        # queue only needs its reason: skip the placement machinery for it.
        exhausted = False
        full_outside = False  # no room except on GPUs reserved for the backfill head
        checked_at = -1
        deferred: list[tuple[int, JobView, Request]] = []
        # Request per job shape: most of 10k jobs share a few dozen shapes.
        shapes: dict[
            tuple[int, int, float | None, int | None, str | None, frozenset[str]], _Shape
        ] = {}
        # May a job of this runtime use the reserved GPUs? (fixed once the reservation is)
        fits_before_res: dict[int | None, bool] = {}
        res_time = self.res_time  # set by _reserve below, once
        pending = self.pending
        maintenance = bool(self.maintenance)
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
            barred = self._barred(job) if maintenance else _NOT_BARRED
            if job.only_nodes is not None or job.exclude_nodes:
                by_choice = self._chosen_barred(job)
                # Every node barred: none of its only_nodes may be left (cheap test first).
                why = (
                    node_choice.gone(job, (n.name for n in self.nodes))
                    if len(by_choice) == len(self.nodes)
                    else None
                )
                if why is not None:
                    self._pend(job, pos, ReasonKind.NEVER_FITS, why)
                    continue
                barred = barred | by_choice
            if self.lacking and job.unix_user in self.lacking:
                by_account = account.barred(job, self.lacking)
                if len(barred | by_account) == len(self.nodes):
                    self._pend(job, pos, ReasonKind.NO_ACCOUNT, account.reason(job, self.lacking))
                    continue
                barred = barred | by_account
            shape = (job.gpus, job.nodes, job.gpu_share, job.gpu_memory_mb, job.gpu_model, barred)
            known = shapes.get(shape)
            if known is None:
                r = Request.of(job)
                if barred:
                    r = r._replace(barred=barred)
                known = shapes[shape] = _Shape(
                    r, self._never(r), self._memo_key(r, False), self._memo_key(r, True)
                )
            req = known.req
            nv = known.never
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
                pending.append(_reason(job.id, ReasonKind.PRIORITY, strict_msg, pos, None))
                continue
            if exhausted and req.gpus > 0:
                deferred.append((pos, job, req))
                continue
            allow_reserved = False
            if res_time is not None:
                rt = job.estimated_runtime_s  # _runtime(job), inlined
                if rt is None:
                    rt = job.max_runtime_s
                cached = fits_before_res.get(rt)
                if cached is None:
                    cached = fits_before_res[rt] = self._may_use_reserved(job)
                allow_reserved = cached
            if full_outside and not allow_reserved and req.gpus > 0:
                # Only reserved GPUs have room and this job may not use them.
                deferred.append((pos, job, req))
                continue
            key = known.key_reserved if allow_reserved else known.key
            chosen = None if key in failed else self._find(req, allow_reserved, key)
            if chosen is not None:
                self._commit(job, req, chosen, ())
                continue
            failed.add(key)
            if (
                preemption
                and self.preempt_attempts < _MAX_PREEMPT_SEARCHES  # else _try_preempt says no
                and self._try_preempt(job, req)
            ):
                failed = self.failed
                continue
            if backfill:
                if not self.res_tried:
                    self.res_tried = True
                    self._reserve(job, req)
                    res_time = self.res_time
            else:
                strict_blocker = job
                strict_msg = f"waiting behind job {job.id} (strict queue order, backfill off)"
            deferred.append((pos, job, req))
            if may_preempt_any and not self._later_may_preempt(job):
                may_preempt_any = False
            if not may_preempt_any and self.version != checked_at:
                checked_at = self.version
                full_outside = self.index.largest_free_block() == 0 and not self.index.partial
                exhausted = full_outside and self._no_room_left()
        if explain:
            self._explain(deferred)
        self.pending.sort(key=_QUEUE_POSITION)
        return Plan(
            placements=tuple(self.placements),
            preemptions=tuple(self.preemptions),
            pending=tuple(self.pending),
            queue_order=tuple([j.id for j in order]),
        )

    def _later_may_preempt(self, job: JobView) -> bool:
        """Whether a job after `job` in the queue (which failed to start) may still start
        by preemption in this cycle; if not, the rest of the queue needs only free room."""
        if self.preempt_attempts >= _MAX_PREEMPT_SEARCHES:
            return False
        if self.settings.queue_policy != "las" or self.quota_any:
            return True
        # LAS orders by queue level and only a lower level preempts: later jobs are at
        # this level or above.
        return las_level(job.attained_gpu_s, self.settings) < self._max_level

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
        self.pending.append(_reason(job.id, kind, message, pos, estimated_start))

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

    def _barred(self, job: JobView) -> frozenset[str]:
        """The nodes whose maintenance begins before this job's time limit (with its grace
        period) would end, or all of them if it has none: as Slurm, by the limit, which
        the agent enforces, not the estimate."""
        limit = job.max_runtime_s
        barred = self._barred_by_limit.get(limit)
        if barred is None:
            end = None if limit is None else self.now + timedelta(seconds=limit)
            barred = self._barred_by_limit[limit] = frozenset(
                [name for name, at in self.maintenance if end is None or end > at]
            )
        return barred

    def _chosen_barred(self, job: JobView) -> frozenset[str]:
        """The nodes the job's own choice leaves out (only_nodes, exclude_nodes)."""
        key = (job.only_nodes, job.exclude_nodes)
        barred = self._barred_by_choice.get(key)
        if barred is None:
            names = [n.name for n in self.nodes]
            barred = self._barred_by_choice[key] = node_choice.barred(job, names)
        return barred

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

    def _candidates(
        self, req: Request, allow_reserved: bool, key: int
    ) -> list[tuple[NodeState, list[Slot]]]:
        limit = max(self.settings.candidate_limit, req.nodes)
        out: list[tuple[NodeState, list[Slot]]] = []
        model = req.model
        choose = self._choose
        # Each node sits in one bucket; only the reserved and partly shared nodes
        # looked at first can come round again.
        seen: set[str] | None = set() if allow_reserved or req.milli < 1000 else None
        barred = req.barred
        for n in self._walk(req, allow_reserved):
            if n.blocker is not None or (barred and n.name in barred):
                continue
            if seen is not None:
                if n.name in seen:
                    continue
                seen.add(n.name)
            if model is not None and model not in n.models:
                continue
            # A node's GPU choice (and score) only changes when the node does: most
            # candidates of one job are the candidates of the next job of that shape.
            memo = n.memo.get(key)
            if memo is not None and memo.version == n.version:
                c = memo.picked
            else:
                c = choose(n, req, allow_reserved)
                n.memo[key] = Choice(n.version, c)
            if c is not None:
                out.append((n, c))
                if len(out) >= limit:
                    return out
        return out

    def _walk(self, req: Request, allow_reserved: bool) -> Iterator[NodeState]:
        """Nodes in the order placement looks at them: reserved (if allowed), partly
        shared (for shared jobs), then by free whole GPUs, tightest first."""
        if allow_reserved:
            yield from self.res_nodes
        if req.milli < 1000:
            yield from list(self.index.partial.values())
        buckets = self.index.buckets
        node_by_name = self.node_by_name
        for k in range(max(1, req.gpus), self.index.max_gpus + 1):
            for _, name in buckets[k]:
                yield node_by_name[name]

    def _memo_key(self, req: Request, allow_reserved: bool) -> int:
        """Small int standing for (request, may use reserved GPUs) in the node memos."""
        k = (req, allow_reserved)
        n = self._memo_keys.get(k)
        if n is None:
            n = self._memo_keys[k] = len(self._memo_keys)
        return n

    def _find(self, req: Request, allow_reserved: bool, key: int) -> Chosen | None:
        """Best `req.nodes` candidate nodes with their GPUs, or None if too few fit.

        `key` is `_memo_key(req, allow_reserved)`, worked out once per job shape.
        """
        if req.gpus == 0:
            ready = [n for n in self.nodes if n.blocker is None and n.name not in req.barred]
            ready.sort(key=lambda n: (n.gpu_count > 0, n.rank))
            if len(ready) < req.nodes:
                return None
            return [(n, []) for n in ready[: req.nodes]]
        # Cheap exit when no node has enough free GPUs (cluster full for this size).
        if req.milli == 1000 and not allow_reserved and self.index.largest_free_block() < req.gpus:
            return None
        cands = self._candidates(req, allow_reserved, key)
        if len(cands) < req.nodes:
            return None
        if len(cands) == 1:
            return cands
        weighted = self.scorers

        def rank(c: tuple[NodeState, list[Slot]]) -> tuple[float, int]:
            node, picked = c
            memo = node.memo[key]  # filled by _candidates for this very node state
            total = memo.score
            if total is None:
                total = 0.0
                for scorer, weight in weighted:
                    total += weight * scorer(req, node, picked)
                memo.score = total
            return (-total, node.rank)

        return sorted(cands, key=rank)[: req.nodes]

    def _commit(self, job: JobView, req: Request, chosen: Chosen, after: tuple[int, ...]) -> None:
        self.version += 1
        for node, picked in chosen:
            for s in picked:
                s.free_milli -= req.milli
                s.free_mem -= req.memory_mb
            self.index.refresh(node)
        need = req.milli * job.total_gpus
        self.used_milli[job.project] = self.used_milli.get(job.project, 0) + need
        if job.schedule_mode == "offpeak":
            self.offpeak_running_milli += need
        placed = tuple([(n.name, tuple([s.index for s in p])) for n, p in chosen])
        if not self.res_tried:  # only the (single) reservation reads these
            rt = _runtime(job)
            end = None if rt is None else self.now + timedelta(seconds=rt)
            self.placed_ends.append((end, placed, req.milli))
        self.placements.append(Placement(job.id, placed, req.milli / 1000, after))

    # ------------------------------------------------------------------ backfill

    def _reserve(self, job: JobView, req: Request) -> None:
        """EASY backfill: reserve for the first blocked job the GPUs it can start on soonest."""
        if req.gpus == 0:
            return
        releases: list[tuple[datetime, NodeGpus, int]] = []
        now = self.now
        preempted = self.preempted
        spans: dict[int, timedelta] = {}  # runtimes repeat: one timedelta each
        for r in self.running.values():
            rj = r.job
            if rj.id in preempted:
                continue
            rt = _runtime(rj)
            if rt is None:
                continue  # unknown end: assume it never ends
            span = spans.get(rt)
            if span is None:
                span = spans[rt] = timedelta(seconds=rt)
            end = r.started_at + span
            if not end > now:  # max(now, end), keeping `now` on ties as max() does
                end = now
            releases.append((end, r.placement, r.share_milli))
        for end_opt, placed, milli in self.placed_ends:
            if end_opt is not None:
                releases.append((end_opt, placed, milli))
        when, per_node = reservation(
            self.nodes, releases, req, job.id, self.now, slot_at=self.slot_at
        )
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

    def _victim_rules(self, job: JobView, req: Request) -> _VictimRules:
        """What decides which running jobs `job` may stop (see `_victim_reasons`)."""
        quota = self._quota_of(job.project)
        used = self.used_milli
        borrowing: frozenset[str] = frozenset()
        if quota > 0 and used.get(job.project, 0) + req.milli * job.total_gpus <= quota:
            # It may reclaim its quota from projects borrowing beyond theirs right now.
            borrowing = frozenset(
                name
                for name, milli in used.items()
                if milli > self._quota_of(name) and name != job.project
            )
        policy = self.settings.queue_policy
        return _VictimRules(
            borrowing,
            job.priority if policy in ("default", "priority") else None,
            las_level(job.attained_gpu_s, self.settings) if policy == "las" else None,
        )

    def _victim_reasons(self, rules: _VictimRules) -> dict[int, str]:
        """Running jobs the rules allow stopping, with the rule that allows it (first that
        applies).

        The pool is already limited to preemptible jobs past `min_run_before_preempt_s`.
        Messages are formatted only for the victims finally chosen (`_why`). Remembered
        per rules for the cycle: `_release` drops each victim from every remembered set.
        """
        out = self._reasons_by_rules.get(rules)
        if out is not None:
            return out
        out = self._reasons_by_rules[rules] = {}
        borrowing, above, mine = rules
        self._victim_pool()
        preempted = self.preempted
        levels = self._las_levels
        for rid, project, priority in self._pool_keys:
            if rid in preempted:
                continue
            if project in borrowing:
                out[rid] = "quota"
            elif above is not None and priority < above:
                out[rid] = "priority"
            elif mine is not None and levels[rid] > mine:
                out[rid] = "las"
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
            self._pool_keys = [(r.job.id, r.job.project, r.job.priority) for r in pool]
            self._pool_by_node: list[tuple[NodeState, list[_VictimHere]]] | None = None
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

    def _victims_by_node(self) -> list[tuple[NodeState, list[_VictimHere]]]:
        """The pool per node, in node order; built at the first victim search (most
        cycles run none)."""
        if self._pool_by_node is None:
            on_node: dict[str, list[RunningJobView]] = {}
            for r in self._victim_pool():
                for nname, _ in r.placement:
                    on_node.setdefault(nname, []).append(r)
            self._pool_by_node = [
                (n, [_VictimHere.of(r, n.name) for r in on_node[n.name]])
                for n in self.nodes
                if n.name in on_node
            ]
        return self._pool_by_node

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
        rules = self._victim_rules(job, req)
        if not self._dominated(job, req, rules) and self._search_preempt(job, req, rules):
            return True
        self.preempt_failed.add(key)
        return False

    def _dominated(self, job: JobView, req: Request, rules: _VictimRules) -> bool:
        """Whether a search with the same victims already failed for a request no harder
        than `req`: then this one fails too, and is counted without scanning every node.

        No harder: no more GPUs, nodes, share or memory per GPU, any model or the same
        one, and no node it may not use that `req` may. Every node test of the search is
        monotone in these, so a node that offered the easier request no victim set offers
        none to this one. Not for the reservation's owner: the GPUs reserved for it add to
        what it may use.
        """
        if job.id == self.res_job:
            return False
        return any(
            req.gpus >= f.gpus
            and req.nodes >= f.nodes
            and req.milli >= f.milli
            and req.memory_mb >= f.memory_mb
            and (f.model is None or f.model == req.model)
            and req.barred >= f.barred
            for f in self.no_victims.get(rules, ())
        )

    def _search_preempt(self, job: JobView, req: Request, rules: _VictimRules) -> bool:
        self.victim_scans += 1
        options: list[tuple[tuple[int, int, int], NodeState, list[RunningJobView]]] = []
        # Which running jobs this job may stop at all, and why (one pass over the pool).
        reasons = self._victim_reasons(rules)
        if not reasons:
            self.no_victims.setdefault(rules, []).append(req)
            return False
        enough = req.nodes + _PREEMPT_OPTIONS
        pmemo = self._pmemo
        for node, pool in self._victims_by_node():
            if len(options) >= enough:
                break  # a few alternatives are plenty; scanning every node is not worth it
            if node.blocker is not None or (req.model is not None and req.model not in node.models):
                continue
            if node.name in req.barred:
                continue
            if not any(v.id in reasons for v in pool):
                continue
            # GPUs that would serve the job once freed, remembered per node state (see
            # _NodeForPreempt). The late GPU checks run on every slot of every node looked
            # at here, as they always have: their outcome feeds later scores and the
            # reservation, so which slots get checked must not change. A remembered
            # entry implies they already ran.
            mkey = (node.name, req.model, req.memory_mb)
            pm = pmemo.get(mkey)
            if pm is None or pm.version != node.version or pm.own not in (None, job.id):
                useful: list[Slot] = []
                changed = False
                reserved = False
                for sl in node.slots:
                    if sl.unchecked is not None:
                        changed |= self._check_late(sl)
                    if sl.reserved_for is not None:
                        reserved = True
                    if (
                        sl.blocker is None
                        and (sl.reserved_for is None or sl.reserved_for == job.id)
                        and (req.model is None or sl.model == req.model)
                        and sl.total_mem >= req.memory_mb
                    ):
                        useful.append(sl)
                if changed:
                    self.index.refresh(node)
                pm = pmemo[mkey] = _NodeForPreempt(
                    node.version, job.id if reserved else None, useful, pool
                )
            useful = pm.useful
            if len(useful) < req.gpus:
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
            if _fits_after(useful, freed, req) < req.gpus:
                continue
            cands.sort(key=_victim_order)
            freed = {}
            picked: list[RunningJobView] = []
            for v in cands:
                picked.append(v.run)
                for i in v.idxs:
                    freed[i] = freed.get(i, 0) + v.milli
                ok = _fits_after(useful, freed, req)
                if ok >= req.gpus:
                    cost = (len(picked), sum(p.job.total_gpus for p in picked), node.rank)
                    options.append((cost, node, list(picked)))
                    break
        if len(options) < req.nodes:
            if job.id != self.res_job:
                self.no_victims.setdefault(rules, []).append(req)
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
        rule_of = {rid: reasons[rid] for rid in victims}  # _release drops them from reasons
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
                Preemption(r.job.id, job.id, self._why(rule_of[r.job.id], job, r))
            )
        # Capacity went up: earlier failures may fit now.
        self.failed = set()
        self.no_victims = {}
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
        for reasons in self._reasons_by_rules.values():
            reasons.pop(r.job.id, None)
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
        self.used_milli[r.job.project] = self.used_milli.get(r.job.project, 0) - r.held_milli

    def _unrelease(self, r: RunningJobView) -> None:
        self.preempted.discard(r.job.id)
        self._reasons_by_rules.clear()  # worked out again, with this job a victim again
        self.used_milli[r.job.project] = self.used_milli.get(r.job.project, 0) + r.held_milli

    # ------------------------------------------------------------------ 4. explain

    def _explain(self, deferred: list[tuple[int, JobView, Request]]) -> None:
        # By object: deferred requests are the cycle's one Request per job shape (and all
        # alive while this runs), so id() is as good a key as the value and cheaper.
        cache: dict[int, tuple[ReasonKind, str]] = {}
        levels: dict[tuple[int, int, str | None], list[list[int]]] = {}
        # Only GPUs with room at the start of the cycle can count at any level.
        self._had_room = [
            room for n in self.nodes if (room := [sl for sl in n.slots if sl.init_free_milli > 0])
        ]
        self._room_profiles = _room_profiles(self._had_room)
        self._room_max = max((len(room) for room in self._had_room), default=0)
        pending = self.pending
        res_job = self.res_job
        if self.quota_any and self.settings.preemption:
            self._borrowers[None] = self._find_borrowers(None)
            used = self.used_milli
            # GPU share (milli) each project may still take within its quota.
            self._quota_room = {
                name: self._quota_of(name) - used.get(name, 0)
                for name, p in self.projects.items()
                if p.quota_gpus > 0
            }
        reclaim = bool(self._borrowers.get(None))  # else no job has anything to reclaim
        if self.settings.preemption and self.settings.queue_policy in ("default", "priority"):
            self._young = [
                r for r in self.running.values() if r.job.preemptible and self._protected(r)
            ]
        lowest_young = min((r.job.priority for r in self._young), default=None)
        maintenance: dict[tuple[int, int | None], str | None] = {}
        for pos, job, req in deferred:
            note = self._reclaim_note(job, req) if reclaim else ""
            if lowest_young is not None and job.priority > lowest_young and req.gpus:
                note += self._priority_note(job, req)
            if job.only_nodes is not None or job.exclude_nodes:
                note += node_choice.note(job)
            if self.lacking and job.unix_user in self.lacking:
                note += account.note(job, self.lacking)
            if req.barred:
                mkey = (id(req), job.max_runtime_s)
                if mkey not in maintenance:
                    maintenance[mkey] = self._maintenance_reason(job, req)
                why = maintenance[mkey]
                if why is not None:
                    own = job.id == res_job
                    why += _reservation_note(self.res_time) if own else ""
                    estimate = self.res_time if own else None
                    self._pend(job, pos, ReasonKind.MAINTENANCE, why + note, estimate)
                    continue
            if job.id == res_job:
                kind, msg = self._diagnose(req, {}, own=job.id)  # its own GPUs count as free
                msg += _reservation_note(self.res_time) + note
                self._pend(job, pos, kind, msg, self.res_time)
                continue
            got = cache.get(id(req))
            if got is None:
                got = cache[id(req)] = self._diagnose(req, levels)
            pending.append(_reason(job.id, got[0], got[1] + note, pos, None))

    def _maintenance_reason(self, job: JobView, req: Request) -> str | None:
        """Why a job waits when it would start now but for nodes going into maintenance
        before its time limit ends; None if they are not what holds it back."""
        if req.gpus == 0:
            return None
        # Room now, or else as the cycle began (a job placed since, a backfill too, on a
        # node this one may not use does not change why it waits): where the nodes it may
        # not use make the difference.
        usable = [n for n in self.nodes if n.blocker is None]
        for current in (True, False):
            rooms = {n.name for n in usable if _room_for(n, req, now=current)}
            if len(rooms) >= req.nodes and len(rooms - req.barred) < req.nodes:
                break
        else:
            return None
        # Of the nodes with room it may not use, those it may not use for their maintenance
        # (the rest its own choice of nodes leaves out).
        closing = self._barred(job)
        name, at = min(
            ((name, at) for name, at in self.maintenance if name in rooms and name in closing),
            key=itemgetter(1),
            default=(None, None),
        )
        if name is None or at is None:
            return None
        limit = job.max_runtime_s
        runs = (
            "this job has no time limit"
            if limit is None
            else "this job's time limit (with its grace period) ends at "
            + (self.now + timedelta(seconds=limit)).isoformat(timespec="seconds")
        )
        return (
            f"node {name} goes into maintenance at {at.isoformat(timespec='seconds')} and "
            f"takes only jobs whose time limit ends by then; {runs}"
        )

    def _reclaim_note(self, job: JobView, req: Request) -> str:
        """Why a job that fits in its project's quota did not take it back from borrowers
        this cycle: they are too young to preempt (anti-loop guard) or not preemptible.
        Without this, "waiting for GPUs" reads as a broken guarantee."""
        if not 0 < req.milli * job.total_gpus <= self._quota_room.get(job.project, 0):
            return ""
        key = (job.project, req.model)
        note = self._reclaim_notes.get(key)
        if note is None:
            note = self._reclaim_notes[key] = self._reclaim_from(*key)
        return note

    def _priority_note(self, job: JobView, req: Request) -> str:
        """Why a job that outranks running preemptible jobs still waits: they have not
        run `min_run_before_preempt_s` yet (the anti-loop guard). When the first may be
        stopped for it; whether that frees GPUs of the right shape is the plan's to say."""
        key = (job.priority, req.model)
        note = self._priority_notes.get(key)
        if note is None:
            nodes = self.node_by_name
            starts = [
                r.started_at
                for r in self._young
                if r.job.priority < job.priority
                and (req.model is None or _holds_model(r, req.model, nodes))
            ]
            note = ""
            if starts:
                guard = self.settings.min_run_before_preempt_s
                when = min(starts) + timedelta(seconds=guard)
                note = (
                    f"; lower-priority preemptible jobs may be preempted for it once they"
                    f" have run {_minutes(guard)} (from {when.isoformat(timespec='seconds')})"
                )
            self._priority_notes[key] = note
        return note

    def _reclaim_from(self, project: str, model: str | None) -> str:
        # Only borrowers on GPUs of the model the job asks for could give it room.
        by_model = self._borrowers.get(model)
        if by_model is None:
            by_model = self._borrowers[model] = self._find_borrowers(model)
        borrowers = {name: b for name, b in by_model.items() if name != project}
        others = list(borrowers.values())
        young = [b[0] for b in others if b[0] is not None]
        if young:
            guard = self.settings.min_run_before_preempt_s
            when = min(young) + timedelta(seconds=guard)
            return (
                "; within quota: borrowed GPUs are reclaimed once a borrowing job has run"
                f" {_minutes(guard)} (from {when.isoformat(timespec='seconds')})"
            )
        if others and not any(b[1] for b in others):
            names = ", ".join(sorted(borrowers))
            return (
                f"; within quota, but the GPUs borrowed by {names} are held by"
                " non-preemptible jobs, which run to the end"
            )
        return ""

    def _find_borrowers(self, model: str | None) -> dict[str, tuple[datetime | None, bool]]:
        """Per project running beyond its quota (only its jobs on `model` GPUs if given):
        the earliest start among its preemptible jobs still too young to preempt, and
        whether any of its jobs is preemptible."""
        used = self.used_milli
        nodes = self.node_by_name
        out: dict[str, tuple[datetime | None, bool]] = {}
        for r in self.running.values():
            project = r.job.project
            if r.job.id in self.preempted or used.get(project, 0) <= self._quota_of(project):
                continue
            if model is not None and not _holds_model(r, model, nodes):
                continue
            young, preemptible = out.get(project, (None, False))
            if r.job.preemptible and self._protected(r) and (young is None or r.started_at < young):
                young = r.started_at
            out[project] = (young, preemptible or r.job.preemptible)
        return out

    def _level_histogram(
        self, key: tuple[int, int, str | None], own: int | None
    ) -> list[list[int]]:
        """Per level A..E: how many nodes have exactly k GPUs passing (see _diagnose).

        Counted over distinct node profiles (see `_room_profiles`), each weighted by
        how many nodes share it: on a large cluster most nodes look alike.
        """
        milli, mem, model = key
        size = self._room_max + 1
        hist = [[0] * size for _ in range(5)]
        h0, h1, h2, h3, h4 = hist
        for profile, nodes in self._room_profiles:
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
                if (
                    init_milli < milli
                    or total_mem < mem
                    or (model is not None and sl_model != model)
                ):
                    continue
                c0 += n
                if blocked:
                    continue
                c1 += n
                if init_mem < mem:
                    continue
                c2 += n
                if r is not None and r != own:
                    continue
                c3 += n
                if free_milli < milli or free_mem < mem:
                    continue
                c4 += n
            h0[c0] += nodes
            h1[c1] += nodes
            h2[c2] += nodes
            h3[c3] += nodes
            h4[c4] += nodes
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


# What `_level_histogram` reads of one GPU with room at the start of the cycle.
_SlotProfile = tuple[int, int, str, bool, int, int | None, int, int]


def _room_profiles(
    had_room: list[list[Slot]],
) -> list[tuple[tuple[tuple[_SlotProfile, int], ...], int]]:
    """Distinct nodes as seen by the pending-reason histograms, with their multiplicity.

    A node is the multiset of its GPUs' profiles ((profile, how many) pairs): the
    histograms only count GPUs per node, so GPU order and identical GPUs don't matter,
    and on a large cluster a few hundred kinds of node stand for a thousand.
    """
    counts: dict[frozenset[tuple[_SlotProfile, int]], int] = {}
    for room in had_room:
        per_gpu: dict[_SlotProfile, int] = {}
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


def _reason(
    job_id: int, kind: ReasonKind, message: str, position: int, start: datetime | None
) -> PendingReason:
    """`PendingReason(...)` without the NamedTuple's own `__new__`, which runs as
    interpreted Python even in the compiled core: one per waiting job, thousands a cycle."""
    return tuple.__new__(PendingReason, (job_id, kind, message, position, start))


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
            and milli >= req.milli
            and mem >= req.memory_mb
            and (req.model is None or s.model == req.model)
        ):
            fitting += 1
    return fitting >= req.gpus


def _minutes(seconds: float) -> str:
    return f"{seconds:g} s" if seconds < 60 else f"{round(seconds / 60)} min"


def _reservation_note(when: datetime | None) -> str:
    if when is None:
        return "; GPUs reserved, start time unknown (running jobs without runtime estimate)"
    return f"; GPUs reserved, estimated start {when.isoformat(timespec='seconds')}"


_NOT_BARRED: frozenset[str] = frozenset()


class _Shape(NamedTuple):
    """Per job shape, worked out once per cycle: the request, its can-never-fit
    verdict and its keys in the failure set and node memos."""

    req: Request
    never: Status
    key: int  # _memo_key(req, allow_reserved=False)
    key_reserved: int  # _memo_key(req, allow_reserved=True)


class _VictimRules(NamedTuple):
    """Which running jobs a job may stop: those of `borrowing` projects (quota
    reclaim), those below priority `above`, those in a LAS queue above `las_level`
    (None: the rule does not apply under this policy)."""

    borrowing: frozenset[str]
    above: int | None
    las_level: int | None


class _VictimHere(NamedTuple):
    """A preemptible running job as seen from one node it runs on."""

    id: int
    idxs: tuple[int, ...]  # its GPU indices on this node
    milli: int
    run: RunningJobView
    order: tuple[int, float, int]  # cheapest victims first: low priority, youngest, id

    @staticmethod
    def of(r: RunningJobView, node: str) -> _VictimHere:
        idxs = tuple(i for nname, ix in r.placement if nname == node for i in ix)
        key = (r.job.priority, -r.started_at.timestamp(), r.job.id)
        return _VictimHere(r.job.id, idxs, r.share_milli, r, key)


class _NodeForPreempt:
    """What the victim search learnt about one node for one (model, memory) request,
    valid while the node's version is unchanged (and, if the node holds reserved GPUs,
    only for the job it was worked out for)."""

    __slots__ = ("_hopeless", "own", "pool", "useful", "useful_idx", "version")

    def __init__(
        self, version: int, own: int | None, useful: list[Slot], pool: list[_VictimHere]
    ) -> None:
        self.version = version
        self.own = own
        self.useful = useful
        self.useful_idx = {sl.index for sl in useful}
        self.pool = pool
        self._hopeless: dict[Request, bool] = {}

    def hopeless(self, req: Request) -> bool:
        """True if even stopping every preemptible job on the node (whatever the rules
        say for this job) leaves fewer than `req.gpus` GPUs for it: an upper bound on
        what any allowed victim set can free."""
        got = self._hopeless.get(req)
        if got is None:
            freed: dict[int, int] = {}
            for v in self.pool:
                for i in v.idxs:
                    freed[i] = freed.get(i, 0) + v.milli
            got = self._hopeless[req] = _fits_after(self.useful, freed, req) < req.gpus
        return got


def _gpu_vouched(
    g: GpuView, tel_after: datetime | None, idle_before: datetime | None, foreign_below: float
) -> bool:
    """The GPU filters' precheck (filters/__init__.py): True only if they surely pass."""
    return (
        g.healthy
        and g.foreign_util_pct < foreign_below
        and (at := g.telemetry_at) is not None
        and tel_after is not None
        and at >= tel_after
        and (idle := g.idle_since) is not None
        and idle_before is not None
        and idle <= idle_before
    )


def _victim_order(v: _VictimHere) -> tuple[int, float, int]:
    return v.order


def _fits_after(useful: list[Slot], freed: dict[int, int], req: Request) -> int:
    """GPUs of `useful` (usable, suitable, not reserved for another) that fit `req`
    once `freed` (GPU index -> milli) is released on their node."""
    n = 0
    for s in useful:
        f = freed.get(s.index, 0)
        if s.free_milli + f >= req.milli and _mem_after_release(s, f) >= req.memory_mb:
            n += 1
    return n


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
    releases: list[tuple[datetime, NodeGpus, int]],
    req: Request,
    job_id: int,
    now: datetime,
    *,
    slot_at: Mapping[tuple[str, int], Slot],
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
    model, memory_mb, milli = req.model, req.memory_mb, req.milli
    for n in nodes:
        if n.blocker is not None or n.name in req.barred:
            continue
        c = 0
        for s in n.slots:
            # Usable, right model, big enough, not held for another job.
            if (
                s.blocker is not None
                or (model is not None and s.model != model)
                or s.total_mem < memory_mb
                or (s.reserved_for is not None and s.reserved_for != job_id)
            ):
                continue
            sid = id(s)
            milli_at[sid] = s.free_milli
            m_ok = mem_ok[sid] = s.free_mem >= memory_mb
            now_ok = free_now[sid] = s.free_milli >= milli and m_ok
            c += now_ok
        count[n.name] = c
        if c >= req.gpus:
            ok_nodes[n.name] = n
    when: datetime | None = now if len(ok_nodes) >= req.nodes else None
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
                    before = at >= milli and mem_ok[sid]
                    at = milli_at[sid] = at + freed
                    if at >= 1000:
                        mem_ok[sid] = freed_on.total_mem - freed_on.foreign_mem >= memory_mb
                    after = at >= milli and mem_ok[sid]
                    if after and not before:
                        count[name] += 1
                        if count[name] >= req.gpus:
                            ok_nodes[name] = freed_on.node
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
