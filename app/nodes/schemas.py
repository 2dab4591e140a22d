from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, field_validator

from app.request_body import RequestBody
from app.timeutil import checked_utc


class GpuOut(BaseModel):
    index: int
    uuid: str
    model: str
    memory_total_mb: int
    nvlink_peers: list[int]
    healthy: bool
    health_message: str
    unknown_readings: list[str] = Field(
        description="readings its agent could not take that placement decides with "
        '("processes: why"); not empty: the GPU is unknown, and nothing is placed on it'
    )
    mig_enabled: bool = Field(
        description="MIG mode is on: the GPU is sliced and not handed out as a whole GPU"
    )
    allocated: float = Field(description="fraction of the GPU allocated to our jobs (0..1)")
    sampled_at: datetime | None
    util_pct: float | None
    memory_util_pct: float | None
    memory_used_mb: int | None
    temperature_c: float | None
    power_w: float | None
    processes: list[dict[str, Any]]
    foreign_util_pct: float
    foreign_memory_mb: int
    foreign_since: datetime | None


class NodeOut(BaseModel):
    name: str
    hostname: str
    labels: dict[str, str]
    agent_version: str
    gpu_backend: str
    state: str
    drained: bool = Field(description="takes no new jobs: drained, or its maintenance has begun")
    drain_reason: str
    maintenance_at: datetime | None = Field(
        description="when its maintenance begins (drain --at); until then it takes only jobs "
        "whose time limit ends by then"
    )
    health_message: str
    isolation: str = Field(
        description='how its agent fences each job\'s processes: "cgroup v2", "cgroup v1" or '
        '"subreaper only" (empty: an agent from before it said)'
    )
    jobs_run_as: str | None = Field(
        description="single-user: every job there runs as this account (its agent is not "
        "root); null: each job runs as its owner's Unix account"
    )
    unusable_accounts: dict[str, str] = Field(
        description="owners' Unix accounts its agent cannot run jobs as, and why: their "
        "jobs are placed on other nodes meanwhile"
    )
    registered_at: datetime = Field(description="when its agent last registered (started)")
    last_heartbeat_at: datetime | None
    removed_at: datetime | None = Field(
        default=None,
        description="when an admin removed it (only in the answer to the removal: removed "
        "nodes are not listed); its agent registering or heartbeating again brings it back",
    )
    gpu_count: int
    gpus_allocated: float
    gpus: list[GpuOut]


class DrainRequest(RequestBody):
    reason: str = Field(
        default="", max_length=255, description="why, shown with the node (as Slurm's Reason)"
    )
    at: datetime | None = Field(
        default=None,
        description="drain from this time on (maintenance, as Slurm's maint reservation); "
        "until then only jobs whose time limit ends by then start on the node. Default: now",
    )

    @field_validator("at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        return None if value is None else checked_utc(value)
