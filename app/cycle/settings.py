from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.scheduling import PolicySettings, QueuePolicy

_CORE = PolicySettings()  # the pure core's defaults


class SchedulerSettings(BaseSettings):
    """GPUSCHED_SCHEDULER_* : how often and how the live scheduler decides."""

    model_config = SettingsConfigDict(env_prefix="GPUSCHED_SCHEDULER_", extra="ignore")

    interval_s: float = Field(default=2.0, gt=0, description="beat period of the cycle")
    policy: QueuePolicy = "default"
    foreign_util_threshold_pct: float = Field(default=10.0, ge=0, le=100)
    stability_window_s: float = Field(default=30.0, ge=0)
    telemetry_max_age_s: float = Field(default=30.0, gt=0)
    backfill: bool = True
    preemption: bool = True
    borrowing: bool = Field(
        default=True,
        description="projects may use idle GPUs beyond their quota; false makes every quota a"
        " hard cap (a project with quota 0 runs nothing)",
    )
    min_run_before_preempt_s: float = Field(default=600.0, ge=0)
    # The default policy's preemption rule (docs/scheduling.md), as the simulator's
    # --preemption-cost: a cluster whose jobs checkpoint often says so here.
    preemption_cost_s: float = Field(
        default=_CORE.preemption_cost_s,
        ge=0,
        description="work one preemption costs the job it stops (restart and the work since"
        " its last checkpoint); default and las policies stop a job only where that pays",
    )
    las_thresholds_gpu_s: tuple[float, ...] = Field(
        default=_CORE.las_thresholds_gpu_s,
        description="attained GPU-seconds at which a job moves to the next LAS queue"
        " (default and las policies), a JSON list in increasing order",
    )
    fair_share_half_life_s: float = Field(default=7 * 86400.0, gt=0)
    starvation_after_s: float = Field(
        default=0.0,
        ge=0,
        le=3650 * 86400.0,
        description="default policy: waited this long, goes first in submit order; 0 = never "
        "(the default: waits are bounded relative to each job's size, see docs/scheduling.md)",
    )
    lease_ttl_s: float = Field(default=30.0, gt=0)
    heartbeat_timeout_s: float = Field(default=30.0, gt=0)
    dispatch_timeout_s: float = Field(default=15.0, gt=0)
    reconcile_interval_s: float = Field(default=5.0, gt=0)
    metrics_port: int = Field(default=9101, ge=0, le=65535, description="0 = no metrics server")
    # The reports process (`gpusched scheduler --only reports`) counts its own: a second
    # port, so that both processes of `gpusched up` serve theirs on one host.
    reports_metrics_port: int = Field(
        default=9102, ge=0, le=65535, description="0 = no metrics server"
    )

    @field_validator("las_thresholds_gpu_s")
    @classmethod
    def _increasing(cls, thresholds: tuple[float, ...]) -> tuple[float, ...]:
        if any(t <= 0 for t in thresholds) or list(thresholds) != sorted(set(thresholds)):
            raise ValueError("must be positive and increasing, e.g. [3600, 36000]")
        return thresholds

    def ranking(self) -> dict[str, Any]:
        """What orders the queue, stored with the ranking a full cycle keeps."""
        return {
            "policy": self.policy,
            "starvation_after_s": self.starvation_after_s,
            "fair_share_half_life_s": self.fair_share_half_life_s,
        }

    def policy_settings(self) -> PolicySettings:
        return PolicySettings(
            queue_policy=self.policy,
            foreign_util_threshold_pct=self.foreign_util_threshold_pct,
            stability_window_s=self.stability_window_s,
            telemetry_max_age_s=self.telemetry_max_age_s,
            backfill=self.backfill,
            preemption=self.preemption,
            borrowing=self.borrowing,
            min_run_before_preempt_s=self.min_run_before_preempt_s,
            starvation_after_s=self.starvation_after_s,
            preemption_cost_s=self.preemption_cost_s,
            las_thresholds_gpu_s=self.las_thresholds_gpu_s,
        )
