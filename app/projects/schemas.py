from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field, model_validator

from app.request_body import RequestBody


class QueueOut(BaseModel):
    project: str
    pending: int
    held: int = Field(
        description="of the pending jobs, those held (gpusched hold): none starts until "
        "released, as squeue's JobHeldUser"
    )
    running: int
    gpus_requested: int
    gpus_in_use: float
    gpu_quota: int
    weight: float
    fair_share: float = Field(description="its weight over all projects' weights (0..1)")
    usage_gpu_hours: float = Field(
        description="GPU-hours used, each decayed by how long ago (the scheduler's half-life), "
        "as the scheduler last ranked by them"
    )
    usage_share: float | None = Field(
        description="its part of all projects' decayed usage (0..1); null: none has any. "
        "Above fair_share, it has used more than its part, and fair share ranks its jobs later"
    )
    usage_at: datetime | None = Field(description="when the scheduler computed the usage")
    max_runtime_s: int | None = Field(
        description="the longest time limit its jobs may have; null: the cluster's"
    )
    max_priority: int = Field(
        description="the highest priority its users may give their jobs (0: they may only "
        "lower it); admins give any"
    )
    max_pending_jobs: int | None = Field(
        description="jobs (array tasks each) its users may have pending together; null: no "
        "limit of the project's own"
    )
    max_running_jobs: int | None = Field(
        default=None,
        description="jobs its users may run at once together (more wait, reason "
        "running_limit); null: no limit of the project's own",
    )
    max_gpus: int | None = Field(
        default=None,
        description="GPUs its users' running jobs may use together (more wait, reason "
        "running_limit); null: no limit of the project's own",
    )


class ProjectUpdate(RequestBody):
    """An admin's change to a project's guarantee, fair-share weight, longest time limit
    and highest priority its users may give (Kueue's nominal quota and fair-sharing
    weight, Slurm's GrpTRES=gres/gpu, Fairshare, a QOS's MaxWall and Priority). Only the
    fields sent change."""

    gpu_quota: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="GPUs guaranteed to the project; 0 = no guarantee (it only borrows)",
    )
    weight: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        allow_inf_nan=False,
        description="fair-share weight: the project's share of the cluster relative to others",
    )

    max_runtime_s: int | None = Field(
        default=None,
        ge=1,
        le=366 * 86400,
        description="the longest time limit its jobs may have, in seconds (a job that sets "
        "none gets the cluster's default, cut to this); null: the cluster's. Jobs already "
        "submitted keep theirs",
    )

    max_priority: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="the highest priority its users may give their jobs, as an admin "
        "grants it (0, the default: they may only lower it, as Slurm's nice). Jobs already "
        "submitted keep theirs",
    )

    max_pending_jobs: int | None = Field(
        default=None,
        ge=0,
        le=10_000_000,
        description="jobs (array tasks each) its users may have pending together, as "
        "Slurm's GrpSubmitJobs; null: no limit of its own. Jobs already pending stay",
    )

    max_running_jobs: int | None = Field(
        default=None,
        ge=0,
        le=10_000_000,
        description="jobs its users may run at once together, as Slurm's GrpJobs; a job "
        "over it waits (pending reason running_limit); null: no limit of its own. Jobs "
        "already running go on",
    )

    max_gpus: int | None = Field(
        default=None,
        ge=0,
        le=10_000_000,
        description="GPUs its users' running jobs may use together, as Slurm's "
        "GrpTRES=gres/gpu (a shared job counts its share); a job over it waits; null: no "
        "limit of its own. Jobs already running go on",
    )

    @model_validator(mode="after")
    def _changes_something(self) -> ProjectUpdate:
        clears = self.model_fields_set & _CLEARED_BY_NULL
        given = (self.gpu_quota, self.weight, self.max_priority)
        if all(value is None for value in given) and not clears:
            raise ValueError(
                "give gpu_quota, weight, max_runtime_s, max_priority, max_pending_jobs, "
                "max_running_jobs, max_gpus or several"
            )
        return self

    def changes(self) -> dict[str, int | float | None]:
        """What to set: the fields sent with a value, and those a null clears."""
        sent = self.model_dump(exclude_unset=True)
        return {k: v for k, v in sent.items() if v is not None or k in _CLEARED_BY_NULL}


# Fields where null means "none of the project's own" rather than "unchanged".
_CLEARED_BY_NULL = frozenset({"max_runtime_s", "max_pending_jobs", "max_running_jobs", "max_gpus"})
