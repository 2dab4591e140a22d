from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from app.estimator.schemas import EstimateRequest
from app.jobs.arrays import parse_indices
from app.jobs.spec_limits import ENV_NAME, MAX_SCRIPT_CHARS, RESERVED_ENV
from app.jobs.states import DependencyKind
from app.request_body import RequestBody
from app.scheduling.types import ReasonKind
from app.text import check_name, check_no_controls
from app.timeutil import checked_utc

_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,62}$")

Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(check_name)]
LabelValue = Annotated[str, Field(max_length=256), AfterValidator(check_no_controls)]
# A job's id, as the database stores it (a 32-bit integer, as the path's {job_id}).
JobRef = Annotated[int, Field(ge=1, le=2**31 - 1)]
NotifyEvent = Literal["start", "end", "fail", "requeue"]
# A node's name, as an agent registers it (gpusched agent --name).
NodeName = Annotated[str, Field(min_length=1, max_length=64)]


# A job's command: one shell string, or an argv list of at most MAX_ARGS arguments.
MAX_SHELL_CHARS = 65536
MAX_ARG_CHARS = 8192
MAX_ARGS = 4096


class ScheduleSpec(RequestBody):
    mode: Literal["now", "offpeak", "at"] = Field(
        default="now",
        description="when the job may start: now (as soon as it fits), offpeak (only inside "
        "an off-peak window) or at (not before `at`)",
    )
    at: datetime | None = Field(default=None, description="begin time, with a UTC offset")
    window: str | None = Field(default=None, max_length=64, description="off-peak window name")

    @model_validator(mode="after")
    def _consistent(self) -> ScheduleSpec:
        if self.mode == "at":
            if self.at is None:
                raise ValueError("mode 'at' needs 'at': an ISO 8601 time with a UTC offset")
            try:
                self.at = checked_utc(self.at)
            except ValueError as exc:
                raise ValueError(f"'at' {exc}") from None
        elif self.at is not None:
            raise ValueError("'at' is only allowed with mode 'at'")
        if self.window is not None and self.mode != "offpeak":
            raise ValueError("'window' is only allowed with mode 'offpeak'")
        return self


class ArraySpec(RequestBody):
    """A job array, as sbatch --array: one task per index, each a job of its own."""

    indices: str = Field(
        min_length=1,
        max_length=4096,
        description="Slurm's index syntax: '0-9', '1,3,5-7' or '0-15:4' (at most 1000 tasks)",
    )
    max_running: int | None = Field(
        default=None, ge=1, le=1000, description="at most this many tasks at once (Slurm's %N)"
    )

    @field_validator("indices")
    @classmethod
    def _valid_indices(cls, value: str) -> str:
        parse_indices(value)
        return value

    @property
    def task_indices(self) -> tuple[int, ...]:
        return parse_indices(self.indices)


class JobCreate(RequestBody):
    name: Name | None = Field(
        default=None, description="a name to find it by; default: the program's name"
    )
    # `_command_shape` refuses a bad command with one reason before the union is tried:
    # a value that fails inside one branch fails the other's type too, and the 422 named
    # both of the union's parts. The bounds stay here for OpenAPI's clients.
    command: (
        list[Annotated[str, Field(max_length=MAX_ARG_CHARS)]]
        | Annotated[str, Field(max_length=MAX_SHELL_CHARS)]
    ) = Field(description="argv list (no shell), or one string run by /bin/sh -c")
    script: str | None = Field(
        default=None,
        max_length=MAX_SCRIPT_CHARS,
        description="the text of the program argv[0] names, as it was at submission: the "
        "job runs this copy, as sbatch runs a copy of its script (later edits of the file "
        "do not change a queued job)",
    )
    workdir: str | None = Field(
        default=None,
        max_length=1024,
        description="absolute path of the directory the job starts in, on its node; "
        "default: the node's temporary directory (the CLI sends the current directory)",
    )
    env: dict[str, Annotated[str, Field(max_length=32768)]] = Field(
        default_factory=dict,
        description="environment variables for the job, name to value (at most 256); the "
        "names the scheduler sets (GPUSCHED_*, CUDA_VISIBLE_DEVICES, MASTER_ADDR, RANK, "
        "...) are refused",
    )
    gpus: int = Field(default=1, ge=0, le=1024, description="GPUs per node")
    gpu_memory_mb: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="free GPU memory needed on each GPU, MiB; null: any GPU",
    )
    gpu_share: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="a fraction of one GPU (0 < share <= 1, with gpus = 1), shared with "
        "other jobs; null: whole GPUs",
    )
    gpu_model: str | None = Field(
        default=None,
        min_length=1,
        max_length=96,
        description="the cluster's GPU model, or words of its name that name one model "
        "('h100'); stored as the cluster spells it",
    )
    nodes: int = Field(
        default=1, ge=1, le=1024, description="nodes for a distributed job, each with `gpus`"
    )
    priority: int = Field(
        default=0,
        ge=-1000,
        le=1000,
        description="higher runs first within its project (FIFO within a priority); above "
        "the project's maximum only an admin may set",
    )
    project: Annotated[str, AfterValidator(check_name)] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="the project it is charged to and queued in; default: your only project",
    )
    max_runtime_s: int | None = Field(
        default=None,
        ge=1,
        le=365 * 86400,
        description="hard time limit in seconds, as sbatch --time: stopped past it; "
        "default: the cluster's limit, if one is set",
    )
    estimated_runtime_s: int | None = Field(
        default=None,
        ge=1,
        le=365 * 86400,
        description="expected runtime in seconds, for planning (backfill, off-peak fit, "
        "estimated start); never enforced",
    )
    grace_s: int | None = Field(
        default=None,
        ge=0,
        le=86400,
        description="seconds from SIGTERM to SIGKILL when the job is stopped (cancel, "
        "preemption, time limit, window close), to write a checkpoint; the job reads it in "
        "GPUSCHED_GRACE_S; default: the node agent's",
    )
    retries: int = Field(
        default=0, ge=0, le=100, description="times it is queued again after a failure"
    )
    preemptible: bool = Field(
        default=False,
        description="may be stopped (SIGTERM, then the grace period) and requeued for "
        "higher-priority work or at an off-peak window's close",
    )
    schedule: ScheduleSpec = Field(
        default_factory=ScheduleSpec, description="when it may start (default: now)"
    )
    labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        description="key=value tags to select jobs by (?label=key=value), at most 64",
    )
    hold: bool = Field(
        default=False, description="submit it held, as sbatch --hold: it starts once released"
    )
    depends_on: list[JobRef] = Field(
        default_factory=list,
        max_length=64,
        description="ids of jobs that must end (or, with `after`, start) first, as "
        "`dependency` says; if one ends otherwise, this job is cancelled",
    )
    dependency: DependencyKind = Field(
        default="afterok",
        description="how the depends_on jobs must end: afterok (succeed), afterany (end in "
        "any way: cleanup), afternotok (fail, be cancelled or time out: a fallback), or "
        "after (only start, i.e. be placed, or end: a monitor beside a run), as sbatch "
        "--dependency; or singleton, without depends_on: it waits while another job "
        "of yours with its name is placed or was submitted before it as a singleton, so "
        "they run one at a time in submit order",
    )
    only_nodes: list[NodeName] | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="run only on these nodes, any of them (a Kubernetes node affinity; not "
        "all of them, as sbatch --nodelist); null: any node. Each must exist",
    )
    exclude_nodes: list[NodeName] = Field(
        default_factory=list,
        max_length=1024,
        description="never run on these nodes, as sbatch --exclude. Each must exist",
    )
    notify_url: str | None = Field(
        default=None,
        max_length=2048,
        description="POST a JSON message here when the job starts, ends, fails or is "
        "requeued (notify_on), as sbatch --mail-type; its `text` suits chat webhooks. The "
        "host must be one the server allows (GPUSCHED_NOTIFY_HOSTS)",
    )
    notify_on: list[NotifyEvent] = Field(
        default=["end"],
        min_length=1,
        max_length=4,
        description="start (it started running), end (it ended, however; not a failure "
        "it is retried after), fail (it ended without success), requeue (it is back in "
        "the queue: preempted, requeued, its node lost, or retried after a failure)",
    )
    array: ArraySpec | None = Field(
        default=None,
        description="submit a job array: one job per index, told its index in "
        "GPUSCHED_ARRAY_TASK_ID; the response is the first task, whose id is the array's",
    )
    model: EstimateRequest | None = Field(
        default=None,
        description="model description; without gpu_memory_mb, the estimate fills it "
        "(see POST /api/v1/estimate)",
    )

    @field_validator("command", mode="before")
    @classmethod
    def _command_shape(cls, value: object) -> object:
        if isinstance(value, str):
            if not value.strip():
                raise ValueError("shell command must not be blank")
            if len(value) > MAX_SHELL_CHARS:
                raise ValueError(f"shell command longer than {MAX_SHELL_CHARS} characters")
            return value
        if not isinstance(value, list):
            raise ValueError("must be an argv list of strings or one shell command string")
        if not value:
            raise ValueError("argv list must not be empty")
        if len(value) > MAX_ARGS:
            raise ValueError(f"at most {MAX_ARGS} arguments")
        for position, argument in enumerate(value):
            if not isinstance(argument, str):
                raise ValueError(f"argv[{position}] must be a string")
            if len(argument) > MAX_ARG_CHARS:
                raise ValueError(f"argv[{position}] longer than {MAX_ARG_CHARS} characters")
        if not value[0]:
            raise ValueError("program (argv[0]) must not be empty")
        return value

    @field_validator("script")
    @classmethod
    def _script_needs_argv(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and isinstance(info.data.get("command"), str):
            raise ValueError("needs the command as an argv list, its first word the script")
        return value

    @field_validator("depends_on")
    @classmethod
    def _unique_ids(cls, value: list[int]) -> list[int]:
        return list(dict.fromkeys(value))  # a repeated id is the same dependency

    @field_validator("notify_on")
    @classmethod
    def _unique_events(cls, value: list[str]) -> list[str]:
        return sorted(set(value))

    @field_validator("only_nodes", "exclude_nodes")
    @classmethod
    def _sorted_names(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else sorted(set(value))

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("must be an absolute path")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 256:
            raise ValueError("at most 256 variables")
        for key in value:
            if not ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not a valid variable name")
            if key.startswith(RESERVED_ENV):
                raise ValueError(f"{key!r} is set by the scheduler and cannot be overridden")
        return value

    @field_validator("labels")
    @classmethod
    def _label_keys(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 64:
            raise ValueError("at most 64 labels")
        for key in value:
            if not _LABEL_KEY.match(key):
                raise ValueError(f"label key {key!r}: letters, digits, '_.-/', at most 63")
        return value

    @model_validator(mode="after")
    def _share_is_fraction_of_one_gpu(self) -> JobCreate:
        if self.gpu_share is not None and self.gpu_share < 1:
            if self.gpus != 1:
                raise ValueError("gpu_share below 1 needs gpus = 1 (a fraction of one GPU)")
            if self.nodes != 1:
                raise ValueError("gpu_share below 1 needs nodes = 1")
        if self.gpus == 0 and (self.gpu_memory_mb or self.gpu_model or self.gpu_share):
            raise ValueError("gpu_memory_mb, gpu_model and gpu_share need gpus >= 1")
        return self

    @property
    def share_milli(self) -> int:
        return 1000 if self.gpu_share is None else max(1, round(self.gpu_share * 1000))


class JobUpdate(RequestBody):
    """Body of PATCH /jobs/{id}: what to change in a pending job, as `scontrol update`.
    Only the fields sent change; null clears gpu_memory_mb or a runtime. The result is
    checked as a submission would be, except that the values it keeps are not judged
    again by limits an admin lowered since the job was admitted. Each field is a Job
    column of the same name, but `dependency` (the column `dependency_kind`)."""

    name: Name | None = Field(default=None, description="a new name (cannot be cleared)")
    gpus: int | None = Field(default=None, description="GPUs per node")
    gpu_memory_mb: int | None = Field(
        default=None, description="free GPU memory needed on each GPU, MiB (null: any GPU)"
    )
    nodes: int | None = Field(default=None, description="nodes for a distributed job")
    priority: int | None = Field(
        default=None, description="higher runs first (see JobCreate.priority)"
    )
    max_runtime_s: int | None = Field(
        default=None,
        description="hard time limit in seconds; the only change a placed job takes (its "
        "owner may shorten it, only an admin extend it); null: the cluster's default",
    )
    estimated_runtime_s: int | None = Field(
        default=None, description="expected runtime in seconds, for planning (null: none)"
    )
    grace_s: int | None = Field(
        default=None, description="seconds from SIGTERM to SIGKILL (null: the agent's)"
    )
    depends_on: list[JobRef] | None = Field(
        default=None,
        description="the jobs it waits for instead ([]: none), as `scontrol update "
        "Dependency=`; checked as at submission, and never a loop",
    )
    dependency: DependencyKind | None = Field(
        default=None, description="how they must end (see JobCreate.dependency)"
    )
    only_nodes: list[NodeName] | None = Field(
        default=None, description="the nodes it may run on instead (null: any node)"
    )
    exclude_nodes: list[NodeName] | None = Field(
        default=None, description="the nodes it must not run on instead ([]: none)"
    )
    notify_url: str | None = Field(default=None, description="null: no notifications")
    notify_on: list[NotifyEvent] | None = Field(
        default=None, description="the events notify_url is told of (see JobCreate.notify_on)"
    )

    @field_validator("exclude_nodes")
    @classmethod
    def _null_excludes_none(cls, value: list[str] | None) -> list[str]:
        return [] if value is None else value

    @field_validator("name")
    @classmethod
    def _name_not_cleared(cls, value: str | None) -> str | None:
        if value is None:  # sent as null; a submission without a name is named by its program
            raise ValueError("a job keeps a name: give a new one")
        return value


class ArrayUpdate(RequestBody):
    """Body of PATCH /jobs/{id}/array: change the array's limit, as `scontrol update
    ArrayTaskThrottle=N`; null lifts it."""

    max_running: int | None = Field(ge=1, le=1000, description="at most this many tasks at once")


class AllocationOut(BaseModel):
    node: str
    gpu_index: int | None
    share: float
    rank: int


class ArrayOut(BaseModel):
    id: int = Field(description="the array's id: its first task's job id")
    index: int = Field(description="this task's index (GPUSCHED_ARRAY_TASK_ID)")
    tasks: int
    max_running: int | None


class JobOut(BaseModel):
    id: int
    name: str
    user: str
    project: str
    status: str
    command: list[str] | str
    script_bytes: int | None = Field(
        default=None, description="size of the script copy taken at submission, which it runs"
    )
    workdir: str | None
    env: dict[str, str | None] = Field(
        description="the job's environment; a value is null where the caller may not read "
        "it: only the job's owner and admins read the values"
    )
    gpus: int
    gpu_memory_mb: int | None
    gpu_share: float | None
    gpu_model: str | None
    nodes: int
    priority: int
    max_runtime_s: int | None
    estimated_runtime_s: int | None
    grace_s: int | None
    retries: int
    failures: int
    preemptible: bool
    schedule: ScheduleSpec
    labels: dict[str, str]
    attempt: int
    pending_reason: ReasonKind | None = Field(
        description="why it waits (null: it does not); pending_message says it in words"
    )
    pending_message: str | None = Field(
        description="the reason in words; it names no time: the time it waits for is "
        "pending_until, for clients to format"
    )
    pending_until: datetime | None = Field(
        None,
        description="when the reason ends (ISO 8601 with offset): the begin time "
        "(begin_time), the off-peak window's next opening (window_closed); null when the "
        "reason has no known end",
    )
    queue_position: int | None = Field(
        description="place in line at the last full cycle (1: next); null: not ranked"
    )
    estimated_start_at: datetime | None
    estimate_note: str | None = Field(
        None, description="a waiting job without an estimated start: why none is given"
    )
    held_by: str | None = Field(
        description="who held this pending job (release to run it); on a running job "
        "requeued with hold, who will hold it once it is back"
    )
    notify_url: str | None
    notify_on: list[str]
    only_nodes: list[str] | None = Field(description="the nodes it may run on (null: any)")
    exclude_nodes: list[str] = Field(description="the nodes it never runs on")
    depends_on: list[int] = Field(description="jobs this one waits for")
    dependency: str = Field(
        description="what it waits for: afterok, afterany, afternotok, after, singleton"
    )
    array: ArrayOut | None = Field(description="the job array this job is a task of, if any")
    exit_code: int | None
    cancel_requested: bool
    requeue_requested: bool = Field(
        description="asked to stop and go back to the queue (requeued by its owner, or "
        "preempted); it is stopping, within its grace period"
    )
    allocations: list[AllocationOut] = Field(description="the GPUs it holds now (placed)")
    last_allocations: list[AllocationOut] = Field(
        default_factory=list,
        description="for a job not placed now (ended, or back in the queue): the GPUs its "
        "latest attempt held, where it ran last; empty when it was never placed",
    )
    created_at: datetime
    scheduled_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None


class JobPage(BaseModel):
    items: list[JobOut]
    next_cursor: str | None = Field(description="pass as ?cursor= to get the next (older) page")


class JobEventOut(BaseModel):
    id: int
    at: datetime
    from_status: str | None
    to_status: str
    attempt: int
    actor: str
    reason: str


class PendingPage(BaseModel):
    total: int
    items: list[JobOut]


class RankAhead(BaseModel):
    rule: str = Field(description="priority, starving, fair_share, shorter, less_service, earlier")
    jobs: int = Field(description="how many of the jobs ahead go first by this rule")
    text: str


class RankOut(BaseModel):
    """Where a waiting job is in the queue and why (GET /jobs/{id}/rank), as sprio: as the
    last full cycle ranked it (`ranked_at`). A job that arrived since is not ranked yet
    (`ranked` false, no position): `next_ranking_at` says when it will be."""

    job_id: int
    policy: str = Field(description="the queue policy the scheduler ranks with")
    position: int | None = Field(description="1: the next job the scheduler considers")
    waiting: int = Field(description="jobs the last full cycle ranked (this one, if ranked)")
    ahead: list[RankAhead] = Field(
        description="the jobs ahead, counted by the rule that puts each first"
    )
    expected_gpu_s: float | None = Field(
        description="its size for short-first order: runtime x GPUs"
    )
    expected_from: str | None = Field(description="where that runtime comes from")
    waited_s: float
    starving: bool = Field(description="waited past the starvation guard: served first in its tier")
    las_queue: int | None = Field(
        None,
        description="default and las policies: its LAS queue (0: the first, least GPU-time "
        "received; a job preempted long enough ago is promoted back to 0)",
    )
    message: str
    ranked: bool = Field(True, description="false: not ranked yet by a full cycle")
    ranked_at: datetime | None = Field(None, description="when the full cycle ranked the queue")
    next_ranking_at: datetime | None = Field(
        None, description="when the scheduler means to rank the queue again"
    )


# A bulk action's answer lists at most this many ids; GET /jobs with the same filters
# lists the jobs themselves, page by page.
BULK_IDS_SHOWN = 1000


class BulkOut(BaseModel):
    """What a bulk action did (POST /jobs/cancel, /hold, /release; PATCH /jobs): how many
    jobs, and their ids, not the jobs themselves: 20,000 job objects were 20 MB."""

    count: int = Field(description="jobs acted on (0: nothing matched)")
    ids: list[int] = Field(description=f"their ids in id order, the first {BULK_IDS_SHOWN}")
    more: int = Field(description="jobs acted on beyond those listed in ids")
    stopping: int = Field(
        0, description="cancel: placed or running jobs asked to stop (the others ended at once)"
    )

    @classmethod
    def of(cls, ids: list[int], *, stopping: int = 0) -> BulkOut:
        return cls(
            count=len(ids),
            ids=ids[:BULK_IDS_SHOWN],
            more=max(0, len(ids) - BULK_IDS_SHOWN),
            stopping=stopping,
        )
