"""GPU model specifications for the estimator, and the view of them the cluster offers.

The table and :func:`lookup` are pure data.  :func:`cluster_gpu_models` reads the registered
GPUs (one query) and :func:`job_memory_from_model` turns a job's model description into its
``gpu_memory_mb``; both are used by ``POST /api/v1/estimate`` and by job submission.

Figures are dense (no 2:4 sparsity: NVIDIA's datasheets quote the sparse figure, twice the
dense one, with an asterisk).  ``memory_mb`` is what NVML reports as total memory (MiB), which
is a little below the marketing size; for GPUs registered in the cluster the node's own
``memory_total_mb`` is used instead, since that is what the scheduler places against.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.errors import FieldError
from app.estimator.memory import estimate, memory_request_mb
from app.estimator.schemas import EstimateRequest, EstimateResponse, GpuModelSpec

CATALOG: dict[str, GpuModelSpec] = {
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 1,979 TFLOPS and TF32 989 TFLOPS
    # "with sparsity" -> 989.5 / 494.7 dense.  80 GB HBM3; NVML reports 81559 MiB.
    "H100-80GB": GpuModelSpec(memory_mb=81559, peak_tflops_bf16=989.5, peak_tflops_fp32=494.7),
    # NVIDIA H200 datasheet (SXM): same Hopper compute as H100 SXM (BF16 1,979 / TF32 989
    # sparse); 141 GB HBM3e, NVML reports 143771 MiB.
    "H200": GpuModelSpec(memory_mb=143771, peak_tflops_bf16=989.5, peak_tflops_fp32=494.7),
    # NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS, TF32 156 TFLOPS dense;
    # 80 GB HBM2e -> 81920 MiB.
    "A100-80GB": GpuModelSpec(memory_mb=81920, peak_tflops_bf16=312.0, peak_tflops_fp32=156.0),
    # Same datasheet, 40 GB HBM2 -> 40960 MiB (SXM4; the PCIe card reports 40536 MiB).
    "A100-40GB": GpuModelSpec(memory_mb=40960, peak_tflops_bf16=312.0, peak_tflops_fp32=156.0),
    # NVIDIA V100 datasheet (SXM2): 125 TFLOPS fp16 tensor (Volta has no bf16; mixed precision
    # runs fp16), 15.7 TFLOPS fp32 (no TF32); 32 GB HBM2, NVML reports 32510 MiB.
    "V100-32GB": GpuModelSpec(memory_mb=32510, peak_tflops_bf16=125.0, peak_tflops_fp32=15.7),
    # NVIDIA L4 datasheet: BF16 242.0 and TF32 120 TFLOPS "with sparsity" -> 121 / 60 dense;
    # 24 GB GDDR6, NVML reports 23034 MiB.
    "L4": GpuModelSpec(memory_mb=23034, peak_tflops_bf16=121.0, peak_tflops_fp32=60.0),
}

#: Peaks assumed for a GPU model the catalog does not know: the lowest of the catalog, so a
#: training-time estimate errs on the long side rather than promising too much.
DEFAULT_PEAK_TFLOPS_BF16 = min(spec.peak_tflops_bf16 for spec in CATALOG.values())
DEFAULT_PEAK_TFLOPS_FP32 = min(spec.peak_tflops_fp32 for spec in CATALOG.values())

# NVML names ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "Tesla V100-SXM2-32GB",
# "NVIDIA L4") and our own short names ("H100-80GB") both resolve through these tokens.
_FAMILY_TOKENS: tuple[tuple[str, str], ...] = (
    ("h200", "H200"),
    ("h100", "H100-80GB"),
    ("v100", "V100-32GB"),
    ("l4", "L4"),
)


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[^a-z0-9]+", name.lower()) if t]


def lookup(name: str, memory_mb: int | None = None) -> str | None:
    """The catalog key for a GPU model name as NVML or an operator writes it, or None.

    A100 comes in two memory sizes: a "40gb"/"80gb" token decides, else ``memory_mb``.
    Whole tokens only, so "L40S" is not taken for an "L4".
    """
    if name in CATALOG:
        return name
    tokens = _tokens(name)
    if "a100" in tokens:
        if "40gb" in tokens or "40g" in tokens:
            return "A100-40GB"
        if "80gb" in tokens or "80g" in tokens:
            return "A100-80GB"
        if memory_mb is not None:
            return "A100-40GB" if memory_mb < 60_000 else "A100-80GB"
        return None
    for token, key in _FAMILY_TOKENS:
        if token in tokens:
            return key
    return None


@dataclass(frozen=True, slots=True)
class ClusterModels:
    """The GPU models the estimate is checked against, and notes about where they came from."""

    specs: dict[str, GpuModelSpec]
    unknown: tuple[str, ...]  # registered names not in the catalog (peaks are assumed)
    from_catalog: bool  # no GPU registered: the whole catalog stands in

    def warnings(self) -> list[str]:
        return [
            f"GPU model {name!r} is not in the catalog: memory as its node reports it, peak "
            f"TFLOPS assumed {DEFAULT_PEAK_TFLOPS_BF16:g} (bf16) / {DEFAULT_PEAK_TFLOPS_FP32:g} "
            "(fp32), the catalog's lowest; its training time is a pessimistic guess"
            for name in self.unknown
        ]

    def assumptions(self) -> list[str]:
        if self.from_catalog:
            return ["no GPU registered in the cluster: fits are checked against the catalog"]
        return ["fits are checked against the GPU models registered in the cluster"]


def specs_for(registered: Iterable[tuple[str, int]]) -> ClusterModels:
    """Specs keyed by the registered model name; memory is the smallest a node reports."""
    memory: dict[str, int] = {}
    for name, memory_mb in registered:
        memory[name] = min(memory_mb, memory.get(name, memory_mb))
    if not memory:
        return ClusterModels(specs=dict(CATALOG), unknown=(), from_catalog=True)
    specs: dict[str, GpuModelSpec] = {}
    unknown: list[str] = []
    for name, memory_mb in sorted(memory.items()):
        key = lookup(name, memory_mb)
        if key is None:
            unknown.append(name)
            bf16, fp32 = DEFAULT_PEAK_TFLOPS_BF16, DEFAULT_PEAK_TFLOPS_FP32
        else:
            bf16, fp32 = CATALOG[key].peak_tflops_bf16, CATALOG[key].peak_tflops_fp32
        specs[name] = GpuModelSpec(
            memory_mb=memory_mb, peak_tflops_bf16=bf16, peak_tflops_fp32=fp32
        )
    return ClusterModels(specs=specs, unknown=tuple(unknown), from_catalog=False)


def cluster_gpu_models(*, session: Session) -> ClusterModels:
    """Distinct registered GPU models (drained and busy GPUs included: they come back;
    removed nodes' not)."""
    from app.nodes.models import Gpu, Node

    rows = session.execute(
        select(Gpu.model, func.min(Gpu.memory_total_mb))
        .join(Node, Node.id == Gpu.node_id)
        .where(Node.removed_at.is_(None))
        .group_by(Gpu.model)
    ).all()
    return specs_for((name, int(memory_mb)) for name, memory_mb in rows)


def estimate_on_cluster(*, session: Session, request: EstimateRequest) -> EstimateResponse:
    """:func:`estimate` against the cluster's GPU models, with their provenance noted."""
    models = cluster_gpu_models(session=session)
    response = estimate(request, gpu_models=models.specs)
    response.warnings.extend(models.warnings())
    response.assumptions.extend(models.assumptions())
    return response


# --------------------------------------------------------------------------- jobs

#: JobCreate's own bound on gpu_memory_mb.
MAX_JOB_MEMORY_MB = 10_000_000


def _for_job_size(model: EstimateRequest, *, gpus: int, nodes: int) -> EstimateRequest:
    """The description with its data-parallel degree taken from the job's GPU count.

    The job's GPUs are the ranks: unless the description names ``data_parallel`` or
    ``gpu_count`` itself, data_parallel = gpus * nodes / (tensor * pipeline parallel).
    A description that names them must agree with the job.
    """
    total = gpus * nodes
    model_parallel = model.tensor_parallel * model.pipeline_parallel
    if {"data_parallel", "gpu_count"} & model.model_fields_set:
        described = model_parallel * model.data_parallel
        if described != total:
            raise FieldError(
                "model",
                f"the model description runs on {described} GPUs (tensor_parallel * "
                f"pipeline_parallel * data_parallel) but the job asks for {total} "
                f"(gpus={gpus} * nodes={nodes})",
            )
        return model
    if total % model_parallel:
        raise FieldError(
            "model",
            f"the job's {total} GPUs (gpus * nodes) are not a multiple of tensor_parallel * "
            f"pipeline_parallel ({model_parallel})",
        )
    if total // model_parallel == model.data_parallel:
        return model
    data = model.model_dump(exclude_unset=True)
    data["data_parallel"] = total // model_parallel
    return EstimateRequest.model_validate(data)


def job_memory_from_model(
    *,
    session: Session,
    model: EstimateRequest,
    gpus: int,
    nodes: int,
    gpu_model: str | None,
) -> int:
    """``gpu_memory_mb`` for a job that describes its model instead of giving it.

    Raises FieldError("model") when the estimate fits no registered GPU model (only
    ``gpu_model`` when the job names one), with the estimator's advice in the message.
    With no GPU registered anything is accepted, as for gpu_memory_mb itself.
    """
    if gpus < 1:
        raise FieldError("model", "a model description needs gpus >= 1")
    sized = _for_job_size(model, gpus=gpus, nodes=nodes)
    models = cluster_gpu_models(session=session)
    candidates: Mapping[str, GpuModelSpec] = models.specs
    if gpu_model is not None and gpu_model in candidates:
        candidates = {gpu_model: candidates[gpu_model]}
    result = estimate(sized, gpu_models=candidates)
    needed = memory_request_mb(result)
    if models.from_catalog:
        if needed > MAX_JOB_MEMORY_MB:
            raise FieldError("model", f"needs {needed} MiB per GPU, more than any GPU has")
        return needed
    if not any(fit.fits_as_requested for fit in result.fits.values()):
        raise FieldError("model", _never_fits_message(result, needed))
    return needed


def _never_fits_message(result: EstimateResponse, needed: int) -> str:
    largest = max(result.fits.values(), key=lambda fit: fit.memory_mb)
    parts = [
        f"needs {needed} MiB per GPU on {result.gpu_count} GPU(s); no registered GPU model "
        f"has that much (largest: {largest.gpu_model}, {largest.memory_mb} MiB)"
    ]
    fitting = [s for s in result.suggestions if s.fits]
    for suggestion in fitting or result.suggestions[-1:]:
        verdict = "fits" if suggestion.fits else "still too large"
        parts.append(
            f"try {suggestion.description} -> {suggestion.total_bytes / 2**20:.0f} MiB ({verdict})"
        )
    parts.append(f"on {largest.gpu_model}: {largest.message}")
    return "; ".join(parts)
