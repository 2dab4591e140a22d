"""Job x GPU filter: the GPU is the model the job asked for.

`fits` is the one model test of the scheduler (placement, the victim search, the
backfill reservation, the explanation); `on_node` is the same rule asked of a node's
set of models, to pass over a node without looking at its GPUs. `never` answers once
per job shape whether any GPU of that model exists at all (a job for a model the
cluster lacks must say so, not wait forever).
"""

from __future__ import annotations

from app.scheduling.state import HardwareClass, Request
from app.scheduling.status import OK, Status, unresolvable
from app.scheduling.types import ReasonKind


def fits(wanted: str | None, model: str) -> bool:
    """Whether a GPU of `model` is what a job asked for (`Request.model`; None: any)."""
    return wanted is None or model == wanted


def on_node(wanted: str | None, models: frozenset[str]) -> bool:
    """Whether a node with GPUs of `models` has any GPU `fits` accepts."""
    return wanted is None or wanted in models


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
