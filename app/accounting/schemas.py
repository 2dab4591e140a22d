"""Response models of the efficiency and usage reports (pydantic only)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

FlagCode = Literal["low_utilisation", "memory_underused", "idle_gpus"]


class Flag(BaseModel):
    code: FlagCode
    message: str = Field(description="what the telemetry shows")
    advice: str = Field(description="what to change")


class GpuEfficiency(BaseModel):
    node: str
    gpu_index: int
    model: str
    memory_total_mb: int
    share: float = Field(description="fraction of the GPU the job held")
    held_s: float = Field(description="seconds the job held this GPU (inside the period)")
    samples: int
    avg_util_pct: float | None = Field(description="time-weighted average SM utilisation")
    peak_util_pct: float | None
    peak_memory_mb: int | None
    energy_wh: float = Field(description="trapezoid of power over time, times share")
    cost: float | None = Field(default=None, description="energy priced by the tariff")
    cost_at_peak: float | None = Field(default=None, description="the same energy at peak price")
    idle: bool = Field(description="average utilisation below the idle threshold")


class JobEfficiency(BaseModel):
    job_id: int
    name: str
    project: str
    user: str
    status: str
    live: bool = Field(description="the job still runs: figures so far")
    gpus: int = Field(description="GPUs requested (gpus * nodes)")
    started_at: datetime | None
    finished_at: datetime | None
    period_start: datetime | None = Field(description="start of the period reported on")
    period_end: datetime
    gpu_hours: float = Field(description="sum of held time * share over the job's allocations")
    samples: int
    avg_util_pct: float | None = Field(description="mean of the per-GPU averages")
    peak_util_pct: float | None
    peak_memory_mb: int | None = Field(description="highest memory used on any one GPU")
    memory_requested_mb: int | None = Field(
        description="gpu_memory_mb, or the held GPUs' memory when the job gave none"
    )
    memory_basis: Literal["requested", "gpu_total"] | None
    memory_used_pct: float | None = Field(description="peak_memory_mb / memory_requested_mb")
    energy_wh: float
    cost: float | None = Field(default=None, description="None when no tariff is configured")
    cost_at_peak: float | None = None
    idle_gpus: int
    cpu_s: float | None = Field(
        default=None,
        description="CPU time of every process of its last attempt (its nodes' fences: "
        "cgroup, or the supervisor's reaped children), as seff's CPU Utilized; null while "
        "it runs or when not measured",
    )
    cpu_cores_avg: float | None = Field(
        default=None, description="cpu_s over its last attempt's run time: cores kept busy"
    )
    host_memory_peak_mb: int | None = Field(
        default=None,
        description="peak host memory of its last attempt (its biggest node's), as seff's "
        "Memory Utilized",
    )
    wasted_gpu_hours: float = Field(description="gpu_hours * (1 - avg_util_pct / 100)")
    per_gpu: list[GpuEfficiency]
    flags: list[Flag]
    notes: list[str]


class ProjectUsage(BaseModel):
    project: str
    jobs: int
    by_state: dict[str, int]
    gpu_hours: float
    avg_util_pct: float | None = Field(description="GPU-hour-weighted average utilisation")
    energy_wh: float
    cost: float | None = None
    cost_at_peak: float | None = None
    wasted_gpu_hours: float


class UsageReport(BaseModel):
    since: datetime
    until: datetime
    project: str | None = Field(description="the project asked for; None: every visible one")
    jobs: int
    by_state: dict[str, int]
    gpu_hours: float
    avg_util_pct: float | None
    energy_wh: float
    cost: float | None = None
    cost_at_peak: float | None = None
    wasted_gpu_hours: float
    projects: list[ProjectUsage]
    top_wasteful: list[JobEfficiency] = Field(description="most wasted GPU-hours first")
