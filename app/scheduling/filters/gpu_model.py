"""Job x GPU filter: the GPU is the model the job asked for.

`never` answers once per job shape whether any GPU of that model exists at all
(a job for a model the cluster lacks must say so, not wait forever); `fits` is
the per-GPU test used while placing.
"""

from __future__ import annotations

from app.scheduling.state import HardwareClass, Request, Slot
from app.scheduling.status import OK, Status, unresolvable
from app.scheduling.types import ReasonKind


def fits(req: Request, slot: Slot) -> bool:
    return req.model is None or slot.model == req.model


def never(req: Request, hardware: tuple[HardwareClass, ...]) -> Status:
    if req.model is None or req.gpus == 0:
        return OK
    models = sorted({model for hc in hardware for model, _ in hc.gpus})
    if req.model in models:
        return OK
    return unresolvable(
        ReasonKind.GPU_MODEL_UNAVAILABLE,
        f"no GPU of model {req.model} in the cluster (models: {', '.join(models) or 'none'})",
    )
