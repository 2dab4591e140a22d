"""Memory/GPU estimator for training jobs (pure calculation, no I/O).

Entry point: :func:`estimate`; see ``docs/estimator.md`` for the formulas.
"""

from app.estimator.memory import (
    CUDA_CONTEXT_BYTES,
    FORMULAS,
    FRAGMENTATION_FRACTION,
    memory_request_mb,
    training_flops,
    training_time,
)
from app.estimator.response import estimate
from app.estimator.schemas import (
    BytesPerParameter,
    EstimateRequest,
    EstimateResponse,
    GpuFit,
    GpuModelSpec,
    MemoryBreakdown,
    Suggestion,
    TrainingTime,
    TransformerShape,
)
from app.estimator.shape import assumed_shape, transformer_parameters

__all__ = [
    "CUDA_CONTEXT_BYTES",
    "FORMULAS",
    "FRAGMENTATION_FRACTION",
    "BytesPerParameter",
    "EstimateRequest",
    "EstimateResponse",
    "GpuFit",
    "GpuModelSpec",
    "MemoryBreakdown",
    "Suggestion",
    "TrainingTime",
    "TransformerShape",
    "assumed_shape",
    "estimate",
    "memory_request_mb",
    "training_flops",
    "training_time",
    "transformer_parameters",
]
