from __future__ import annotations

from pydantic import BaseModel


class QueueOut(BaseModel):
    project: str
    pending: int
    running: int
    gpus_requested: int
    gpus_in_use: float
    gpu_quota: int
    weight: float
