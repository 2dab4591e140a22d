from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from app.request_body import RequestBody


class QueueOut(BaseModel):
    project: str
    pending: int
    running: int
    gpus_requested: int
    gpus_in_use: float
    gpu_quota: int
    weight: float


class ProjectUpdate(RequestBody):
    """An admin's change to a project's guarantee and fair-share weight (Kueue's nominal
    quota and fair-sharing weight, Slurm's GrpTRES=gres/gpu and Fairshare)."""

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

    @model_validator(mode="after")
    def _changes_something(self) -> ProjectUpdate:
        if self.gpu_quota is None and self.weight is None:
            raise ValueError("give gpu_quota, weight or both")
        return self
