"""Snapshot (input) and Plan (output) types of the pure scheduling core.

Everything here is a frozen, slotted dataclass holding tuples, so a snapshot can
be stored, hashed into a log line, and replayed: the same snapshot, `now`,
settings and seed always give the same Plan.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Literal, NamedTuple

QueuePolicy = Literal["default", "fifo", "priority", "fair-share", "sjf", "las"]
QUEUE_POLICIES: tuple[str, ...] = ("default", "fifo", "priority", "fair-share", "sjf", "las")
ScheduleMode = Literal["now", "offpeak", "at"]

# Placement of a job: one entry per node, each with the GPU indices on that node.
NodeGpus = tuple[tuple[str, tuple[int, ...]], ...]


# --------------------------------------------------------------------------- snapshot


@dataclass(frozen=True, slots=True)
class GpuView:
    index: int
    uuid: str = ""
    model: str = "generic"
    memory_total_mb: int = 81920
    memory_used_mb: int | None = 0
    util_pct: float | None = 0.0
    foreign_util_pct: float = 0.0
    foreign_memory_mb: int = 0
    foreign_since: datetime | None = None
    idle_since: datetime | None = None
    temperature_c: float | None = None
    # False also when it is unknown or MIG-enabled (the two fields below say so), so
    # that every check trusting only healthy GPUs leaves it out.
    healthy: bool = True
    # Deciding readings its agent could not take ("processes: why"): not free, unknown.
    unknown: tuple[str, ...] = ()
    # MIG mode on: sliced, never handed out whole.
    mig_enabled: bool = False
    telemetry_at: datetime | None = None
    allocated_milli: int = 0
    nvlink_peers: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    ready: bool = True
    drained: bool = False
    labels: tuple[tuple[str, str], ...] = ()
    heartbeat_at: datetime | None = None
    gpus: tuple[GpuView, ...] = ()
    # Maintenance (Slurm's maint reservation): drained from then on; until then it takes
    # only jobs whose time limit ends by then.
    maintenance_at: datetime | None = None
    # Owners' Unix accounts its agent cannot run jobs as: (account, why) pairs.
    unusable_accounts: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class JobView:
    id: int
    name: str = "job"
    user: str = "user"
    project: str = "default"
    gpus: int = 1
    gpu_share: float | None = None
    gpu_memory_mb: int | None = None
    gpu_model: str | None = None
    nodes: int = 1
    priority: int = 0
    submitted_at: datetime | None = None
    estimated_runtime_s: int | None = None
    max_runtime_s: int | None = None  # its time limit plus its grace period
    grace_s: int = 0  # how long it may take to exit after SIGTERM (0: the agent's default)
    preemptible: bool = False
    schedule_mode: ScheduleMode = "now"
    begin_at: datetime | None = None
    window: str | None = None
    attempt: int = 0
    last_preempted_at: datetime | None = None
    attained_gpu_s: float = 0.0
    # The user's choice of nodes: only these (any of them; None: any node), never those.
    only_nodes: frozenset[str] | None = None
    exclude_nodes: frozenset[str] = frozenset()
    # The owner's Unix account, which the job runs as (None: not known, any node will do).
    unix_user: str | None = None

    @property
    def share_milli(self) -> int:
        """Part of each GPU the job needs, in 1/1000 (1000 = whole GPU, exclusive)."""
        if self.gpu_share is None or self.gpu_share >= 1.0:
            return 1000
        return max(1, round(self.gpu_share * 1000))

    @property
    def total_gpus(self) -> int:
        return self.gpus * max(1, self.nodes)


@dataclass(frozen=True, slots=True)
class RunningJobView:
    job: JobView
    placement: NodeGpus
    started_at: datetime
    share: float = 1.0
    started_via_preemption: bool = False

    @property
    def share_milli(self) -> int:
        if self.share >= 1.0:
            return 1000
        return max(1, round(self.share * 1000))

    @property
    def held_milli(self) -> int:
        """What it holds now, counted against its project's quota: a gang whose node
        ended early (app/jobs/agent_reports.py) holds only the GPUs of the nodes still running."""
        return self.share_milli * sum(len(indexes) for _, indexes in self.placement)


@dataclass(frozen=True, slots=True)
class ProjectView:
    name: str
    quota_gpus: int = 0
    weight: float = 1.0
    usage_gpu_s: float = 0.0
    # What its users may run together, as Slurm's GrpJobs and GrpTRES=gres/gpu on an
    # account (filters/running_limit.py); None: no limit.
    max_running_jobs: int | None = None
    max_gpus: int | None = None


@dataclass(frozen=True, slots=True)
class UserView:
    """A user with a limit of their own (Slurm's MaxJobs and MaxTRES=gres/gpu on a user
    association): a user not in the snapshot has none."""

    name: str
    max_running_jobs: int | None = None
    max_gpus: int | None = None


@dataclass(frozen=True, slots=True)
class WindowInterval:
    """One concrete opening of a named off-peak window (computed by the caller)."""

    name: str
    opens_at: datetime
    closes_at: datetime


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: tuple[NodeView, ...] = ()
    pending: tuple[JobView, ...] = ()
    running: tuple[RunningJobView, ...] = ()
    projects: tuple[ProjectView, ...] = ()
    windows: tuple[WindowInterval, ...] = ()
    # Users with running limits of their own (only those: the rest have none).
    users: tuple[UserView, ...] = ()
    # (user, job name) -> past runtimes in seconds, for `predict_runtime`.
    runtime_history: Mapping[tuple[str, str], tuple[float, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )


@dataclass(frozen=True, slots=True)
class PolicySettings:
    queue_policy: QueuePolicy = "default"
    foreign_util_threshold_pct: float = 10.0
    stability_window_s: float = 60.0
    telemetry_max_age_s: float = 30.0
    backfill: bool = True
    preemption: bool = True
    # Anti-loop: a running job younger than this is never a preemption victim.
    min_run_before_preempt_s: float = 600.0
    # Share of all GPUs that preemptible off-peak jobs may use outside their windows.
    offpeak_outside_fraction: float = 0.0
    # Projects may use idle GPUs above their guaranteed quota.
    borrowing: bool = True
    # Fair share: each queued or running GPU is charged this many seconds when ordering.
    fair_share_horizon_s: float = 3600.0
    # Default policy: a job pending this long goes first in its priority tier, in submit
    # order, ahead of everything else (Slurm's PriorityMaxAge). 0 = never, the default:
    # an absolute wait makes an overloaded cluster FIFO (issue 41); the two knobs below
    # bound waits relative to each job's own size instead.
    starvation_after_s: float = 0.0
    # Default policy, inside a LAS queue: deadline = submitted + this x expected
    # remaining GPU-seconds (queue.deadline). 0 = FIFO; larger = closer to short-first.
    # 1000 chosen from bench/results/default_frontier.md (0.1-2 lost up to 5x to sjf).
    short_first_factor: float = 1000.0
    # Default policy: a job preempted into a later LAS queue returns to the first once
    # it has waited this many times the run time it got (Tiresias' PROMOTE_KNOB). 0 = never.
    promote_after_service: float = 4.0
    # Default policy: seconds of work a preemption costs the job it stops (its restart
    # plus the work since its last checkpoint; the simulator's --preemption-cost). The LAS
    # rule stops a job only if that pays (queue.las_victim): it has run at least
    # `preempt_after_cost` x this since it started, and is not expected to end within
    # `preempt_remaining_cost` x this. 0 for either factor turns that test off.
    preemption_cost_s: float = 300.0
    preempt_after_cost: float = 2.0
    preempt_remaining_cost: float = 1.0
    # Default policy: whether a job promoted back to the first LAS queue may stop jobs of
    # a later queue (Tiresias lets it; then promoted jobs take turns stopping each other:
    # 2-3x the preemptions, docs/scheduling.md). False: it goes first on free GPUs, and
    # stops only jobs of a later queue than its attained service's.
    promoted_may_preempt: bool = False
    # Default policy: the LAS rule stops only jobs expected to run longer than the job
    # that stops them (both by estimate, else limit; unknown counts as long).
    preempt_shorter_only: bool = False
    # LAS (Tiresias-style discretised queues) thresholds on attained GPU-seconds.
    las_thresholds_gpu_s: tuple[float, ...] = (3600.0, 36000.0)
    weight_best_fit: float = 1.0
    weight_topology: float = 0.5
    weight_thermal: float = 0.25
    # Nodes ranked per placement (Nomad's limit iterator): keeps a cycle fast on big clusters.
    candidate_limit: int = 4
    # Running time assumed for a job without estimate or limit when ordering by SJF.
    default_runtime_s: float = 86400.0
    # Reasons for jobs that fail placement. Only the simulator turns this off (it
    # never shows them); then Plan.pending is incomplete (at most the jobs failing
    # job filters, never-fit checks or quota).
    explain: bool = True


# --------------------------------------------------------------------------- plan


class ReasonKind(enum.Enum):
    """Why a job waits: a job's `pending_reason`, published in the API's schema. The plan
    gives all but the first four, which the job domain and the live loop set outside it."""

    # No scheduling cycle has ranked it yet (just submitted, or back in the queue); quick
    # cycles look for it (app/cycle/snapshot.py).
    NEW = "NEW"
    # Held (gpusched hold): no cycle considers it until released.
    HELD = "held"
    # Its dependencies (depends_on) have not all succeeded yet: no cycle considers it
    # until they have (app/cycle/dependencies.py).
    DEPENDENCY = "dependency"
    # An array task kept out of the queue because its array already has as many tasks
    # running as it allows (max_running, app/cycle/arrays.py).
    ARRAY_LIMIT = "array_limit"
    WAITING_FOR_GPUS = "waiting_for_gpus"
    FOREIGN_PROCESS = "foreign_process"
    QUOTA = "quota"
    RESERVED_BACKFILL = "reserved_backfill"
    WINDOW_CLOSED = "window_closed"
    BEGIN_TIME = "begin_time"
    NEVER_FITS = "never_fits"
    NODE_NOT_READY = "node_not_ready"
    TELEMETRY_STALE = "telemetry_stale"
    GPU_UNHEALTHY = "gpu_unhealthy"
    GPU_UNKNOWN = "gpu_unknown"
    GPU_MIG = "gpu_mig"
    GPU_MODEL_UNAVAILABLE = "gpu_model_unavailable"
    GPU_MEMORY = "gpu_memory"
    PRIORITY = "priority"
    MAINTENANCE = "maintenance"
    NO_ACCOUNT = "no_account"
    RUNNING_LIMIT = "running_limit"
    # Set outside the planner (app/windows/service.py): an off-peak job that is not
    # preemptible and lasts longer than every opening of its window(s), after a window
    # change; it waits, out of every cycle, until a window or the job changes.
    NEVER_IN_WINDOW = "never_in_window"


class Placement(NamedTuple):
    """Where a job starts. A NamedTuple, as PendingReason: built per placed job."""

    job_id: int
    node_gpus: NodeGpus
    share: float = 1.0
    # Jobs preempted in this plan to make room; dispatch only after they have exited.
    after_preemption_of: tuple[int, ...] = ()

    @property
    def node(self) -> str:
        return self.node_gpus[0][0] if self.node_gpus else ""

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return self.node_gpus[0][1] if self.node_gpus else ()


@dataclass(frozen=True, slots=True)
class Preemption:
    victim_job_id: int
    for_job_id: int
    reason: str


class PendingReason(NamedTuple):
    """Why a job waits. A NamedTuple: a cycle makes one per waiting job (thousands), and
    a tuple is built several times faster than a frozen dataclass."""

    job_id: int
    kind: ReasonKind
    message: str
    queue_position: int
    estimated_start: datetime | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    # By queue_position (the planner sorts them).
    pending: tuple[PendingReason, ...] = ()
    # The pending jobs in the policy's queue order (position i+1 = queue_position). Their
    # views, not ids: a replay asks for no ids, and boxing thousands per cycle costs.
    queued: tuple[JobView, ...] = ()

    @property
    def queue_order(self) -> tuple[int, ...]:
        """Job ids in the policy's queue order."""
        return tuple([j.id for j in self.queued])

    def reasons(self) -> dict[int, PendingReason]:
        return {r.job_id: r for r in self.pending}

    def placement_for(self, job_id: int) -> Placement | None:
        for p in self.placements:
            if p.job_id == job_id:
                return p
        return None
