"""The one mutable state of a `plan_cycle` call, shared by its rooms.

`planner.build` makes it from the frozen snapshot; the run loop (planner.py), placement
(placement.py), the backfill reservation (backfill.py), the victim search (preempt.py)
and the pending reasons (explain.py) read and change it, each passed it explicitly.
Nothing outside one call sees it; it is never reused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from app.scheduling import filters as F
from app.scheduling.filters.running_limit import Limits
from app.scheduling.scorers import Scorer
from app.scheduling.state import HardwareClass, NodeIndex, NodeState, Request, Slot
from app.scheduling.status import OK, Context, Status
from app.scheduling.types import (
    GpuView,
    JobView,
    NodeGpus,
    PendingReason,
    Placement,
    PolicySettings,
    Preemption,
    ProjectView,
    ReasonKind,
    RunningJobView,
    Snapshot,
)
from app.scheduling.victims import NodeForPreempt, VictimHere, VictimRules

Chosen = list[tuple[NodeState, list[Slot]]]
# What `explain._level_histogram` reads of one GPU with room at the start of the cycle.
SlotProfile = tuple[int, int, str, bool, int, int | None, int, int]


@dataclass(eq=False)
class CycleState:
    """State of one `plan_cycle` call. Not shared, not reused."""

    # ---- from the snapshot, made by planner.build (phase 1)
    snap: Snapshot
    ctx: Context
    settings: PolicySettings
    now: datetime
    seed: int
    scorers: tuple[tuple[Scorer, float], ...]
    nodes: list[NodeState]
    slot_at: dict[tuple[str, int], Slot]
    node_by_name: dict[str, NodeState]
    index: NodeIndex
    total_gpus: int
    # Usable nodes whose maintenance is still to come, with its start.
    maintenance: list[tuple[str, datetime]]
    # Owners' accounts some node cannot run jobs as (filters/account.py).
    lacking: dict[str, dict[str, str]]
    projects: dict[str, ProjectView]
    quota_any: bool
    used_milli: dict[str, int]
    running: dict[int, RunningJobView]
    offpeak_running_milli: int
    # The GPU filters' precheck bounds for check_late: None when they must always run.
    gpu_bounds: tuple[datetime | None, datetime | None, float] | None
    # Running limits (filters/running_limit.py) of the users and projects that have
    # some; empty when none has (then nothing below is counted).
    user_limits: dict[str, Limits]
    project_limits: dict[str, Limits]
    # What each user and project runs: jobs, and GPUs in thousandths; the snapshot's
    # running jobs plus those placed this cycle (placement.commit).
    user_jobs: dict[str, int]
    user_milli: dict[str, int]
    project_jobs: dict[str, int]
    project_milli: dict[str, int]

    # ---- the plan so far
    placements: list[Placement] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    pending: list[PendingReason] = field(default_factory=list)
    version: int = 0  # bumped whenever GPU state changes (placement, release, reservation)

    # ---- placement (placement.py)
    # (request, may use reserved GPUs) pairs that found no room, as `memo_key` ints.
    failed: set[int] = field(default_factory=set)
    memo_keys: dict[tuple[Request, bool], int] = field(default_factory=dict)
    never_cache: dict[Request, Status] = field(default_factory=dict)
    hardware_cache: tuple[HardwareClass, ...] | None = None
    barred_by_limit: dict[int | None, frozenset[str]] = field(default_factory=dict)
    barred_by_choice: dict[tuple[frozenset[str] | None, frozenset[str]], frozenset[str]] = field(
        default_factory=dict
    )

    # ---- backfill reservation (backfill.py): one, for the first job that cannot start
    res_job: int | None = None
    res_time: datetime | None = None
    res_nodes: list[NodeState] = field(default_factory=list)
    res_tried: bool = False
    # Expected ends of jobs placed this cycle (for the reservation).
    placed_ends: list[tuple[datetime | None, NodeGpus, int]] = field(default_factory=list)

    # ---- preemption (preempt.py)
    preempted: set[int] = field(default_factory=set)
    preempt_attempts: int = 0
    victim_scans: int = 0  # searches that ran (a dominated one counts as attempt only)
    preempt_failed: set[tuple[Request, str, int, int]] = field(default_factory=set)
    # Requests whose victim search found too few nodes, per victim set (see
    # preempt._dominated); emptied when a preemption frees GPUs.
    no_victims: dict[VictimRules, list[Request]] = field(default_factory=dict)
    reasons_by_rules: dict[VictimRules, dict[int, str]] = field(default_factory=dict)
    pmemo: dict[tuple[str, str | None, int], NodeForPreempt] = field(default_factory=dict)
    # The victim pool, built on first use (preempt.victim_pool).
    pool: list[RunningJobView] | None = None
    pool_keys: list[tuple[int, str, int]] = field(default_factory=list)
    pool_by_node: list[tuple[NodeState, list[VictimHere]]] | None = None
    min_prio: int = 0
    las_levels: dict[int, int] = field(default_factory=dict)
    # Default policy: each victim's expected run time left (queue.time_left).
    las_left: dict[int, float] = field(default_factory=dict)
    max_level: int = 0

    # ---- explain (explain.py)
    # Projects running beyond their quota (per GPU model asked for, None for any): the
    # (start, job id) of the earliest of its preemptible jobs still too young to preempt,
    # and whether any is preemptible; and the note per (project, GPU model asked for).
    borrowers: dict[str | None, dict[str, tuple[tuple[datetime, int] | None, bool]]] = field(
        default_factory=dict
    )
    reclaim_notes: dict[tuple[str, str | None], str] = field(default_factory=dict)
    quota_room: dict[str, int] = field(default_factory=dict)
    # Preemptible running jobs still too young to preempt, and the note per (priority,
    # GPU model asked for) of a job that outranks some of them.
    young: list[RunningJobView] = field(default_factory=list)
    priority_notes: dict[tuple[int, str | None], str] = field(default_factory=dict)
    had_room: list[list[Slot]] = field(default_factory=list)
    room_profiles: list[tuple[tuple[tuple[SlotProfile, int], ...], int]] = field(
        default_factory=list
    )
    room_max: int = 0


def runtime(job: JobView) -> int | None:
    """What the scheduler may assume about a job's length: estimate, else limit."""
    if job.estimated_runtime_s is not None:
        return job.estimated_runtime_s
    return job.max_runtime_s


def pending_reason(
    job_id: int, kind: ReasonKind, message: str, position: int, start: datetime | None
) -> PendingReason:
    """`PendingReason(...)` without the NamedTuple's own `__new__`, which runs as
    interpreted Python even in the compiled core: one per waiting job, thousands a cycle."""
    return tuple.__new__(PendingReason, (job_id, kind, message, position, start))


def pend(
    cs: CycleState,
    job: JobView,
    pos: int,
    kind: ReasonKind,
    message: str,
    estimated_start: datetime | None = None,
) -> None:
    cs.pending.append(pending_reason(job.id, kind, message, pos, estimated_start))


def quota_of(cs: CycleState, project: str) -> int:
    p = cs.projects.get(project)
    return 0 if p is None else p.quota_gpus * 1000


def protected(cs: CycleState, r: RunningJobView) -> bool:
    """Anti-loop: young jobs (including ones started by preempting) are never victims."""
    age = (cs.now - r.started_at).total_seconds()
    return age < cs.settings.min_run_before_preempt_s


def gpu_vouched(
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


def check_late(cs: CycleState, s: Slot) -> bool:
    """Run the GPU filters on a GPU skipped at build time because it was fully ours.

    Returns True if the GPU turned out unusable (the caller re-files its node).
    """
    if s.unchecked is None:
        return False
    nv, g = s.unchecked
    s.unchecked = None
    if cs.gpu_bounds is not None and gpu_vouched(g, *cs.gpu_bounds):
        return False
    for gf in F.GPU_FILTERS:
        st = gf(nv, g, cs.ctx)
        if st is not OK:
            s.blocker = st
            return True
    return False
