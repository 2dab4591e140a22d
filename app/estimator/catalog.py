"""GPU model specifications for the estimator, and the view of them the cluster offers.

The table, :func:`lookup` and :func:`advice_gpus` are pure.  :func:`cluster_gpu_models` reads
the registered GPUs (one query) and :func:`job_memory_from_model` turns a job's model
description into its ``gpu_memory_mb``; both are used by ``POST /api/v1/estimate`` and by
job submission.

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
from app.estimator.memory import memory_request_mb
from app.estimator.response import estimate
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

#: The GPU advice is judged against when the request names none and none is registered: the
#: most widely deployed data-centre training GPU of the catalog's generation.
MOST_COMMON_GPU = "H100-80GB"

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
    """The GPU models registered in the cluster (none: empty), by the name nodes report."""

    specs: dict[str, GpuModelSpec]
    unknown: tuple[str, ...]  # registered names not in the catalog (peaks are assumed)

    def warnings(self, names: Iterable[str]) -> list[str]:
        """Warnings about those of ``names`` the catalog does not know."""
        return [
            f"GPU model {name!r} is not in the catalog: memory as its node reports it, peak "
            f"TFLOPS assumed {DEFAULT_PEAK_TFLOPS_BF16:g} (bf16) / {DEFAULT_PEAK_TFLOPS_FP32:g} "
            "(fp32), the catalog's lowest; its training time is a pessimistic guess"
            for name in self.unknown
            if name in names
        ]


def specs_for(registered: Iterable[tuple[str, int]]) -> ClusterModels:
    """Specs keyed by the registered model name; memory is the smallest a node reports."""
    memory: dict[str, int] = {}
    for name, memory_mb in registered:
        memory[name] = min(memory_mb, memory.get(name, memory_mb))
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
    return ClusterModels(specs=specs, unknown=tuple(unknown))


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


def _label(name: str, spec: GpuModelSpec) -> str:
    return f"{name} ({spec.memory_mb} MiB)"


def _registered_named(asked: str, registered: Mapping[str, GpuModelSpec]) -> list[str]:
    """Registered models that ``asked`` names: itself, the same catalog entry ('H100-80GB'
    for 'NVIDIA H100 80GB HBM3'), or words in a row of their name ('h100')."""
    if asked in registered:
        return [asked]
    key, words = lookup(asked), _tokens(asked)

    def named(name: str) -> bool:
        if key is not None and lookup(name, registered[name].memory_mb) == key:
            return True
        tokens = _tokens(name)
        return bool(words) and any(tokens[i : i + len(words)] == words for i in range(len(tokens)))

    return [name for name in registered if named(name)]


def advice_gpus(
    *, gpu_model: str | None, cluster: ClusterModels
) -> tuple[dict[str, GpuModelSpec], list[str]]:
    """The GPU models a request's advice is judged against, and a note saying why.

    The model the request names (registered, else from the catalog), else every registered
    model, else the catalog's most common data-centre GPU, the assumption stated.  A name
    that is neither registered nor in the catalog is a FieldError on ``gpu_model``.
    """
    registered = cluster.specs
    if gpu_model is None and registered:
        listed = ", ".join(_label(name, spec) for name, spec in registered.items())
        return dict(registered), [f"advice for each GPU model registered in the cluster: {listed}"]
    if gpu_model is None:
        spec = CATALOG[MOST_COMMON_GPU]
        return {MOST_COMMON_GPU: spec}, [
            f"no GPU model named and none registered in the cluster: advice assumes "
            f"{_label(MOST_COMMON_GPU, spec)}, the most common data-centre training GPU; "
            "name gpu_model for yours"
        ]
    hits = _registered_named(gpu_model, registered)
    if len(hits) > 1:
        raise FieldError("gpu_model", f"{gpu_model!r} could be {' or '.join(hits)}: name one")
    if hits:
        name, spec = hits[0], registered[hits[0]]
        return {name: spec}, [
            f"advice for the GPU model named, {_label(name, spec)} as its nodes report it"
        ]
    key = lookup(gpu_model)
    if key is None:
        known = sorted({*registered, *CATALOG})
        raise FieldError(
            "gpu_model",
            f"unknown GPU model {gpu_model!r}: not registered in the cluster and not in the "
            f"catalog; known: {', '.join(known)} (or give target_gpu_memory_mb)",
        )
    where = "not registered in the cluster; " if registered else ""
    return {key: CATALOG[key]}, [
        f"advice for the GPU model named, {_label(key, CATALOG[key])} ({where}catalog figures)"
    ]


def estimate_on_cluster(*, session: Session, request: EstimateRequest) -> EstimateResponse:
    """:func:`estimate` against the GPU models the job would run on, their provenance noted."""
    cluster = cluster_gpu_models(session=session)
    gpus, notes = advice_gpus(gpu_model=request.gpu_model, cluster=cluster)
    response = estimate(request, gpu_models=gpus)
    response.warnings.extend(cluster.warnings(gpus))
    response.assumptions[:0] = notes  # which GPU the verdicts are about comes first
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
    ``gpu_model`` when the job names one), with the estimator's verified advice for each
    in the message.  With no GPU registered anything is accepted, as for gpu_memory_mb.
    """
    if gpus < 1:
        raise FieldError("model", "a model description needs gpus >= 1")
    if model.gpu_model is not None:
        # Where a job runs is the job's gpu_model; a second name here could disagree with it.
        raise FieldError(
            ("model", "gpu_model"), "a job names its GPU model in gpu_model, not in model"
        )
    sized = _for_job_size(model, gpus=gpus, nodes=nodes)
    registered: Mapping[str, GpuModelSpec] = cluster_gpu_models(session=session).specs
    if not registered:
        needed = memory_request_mb(sized)
        if needed > MAX_JOB_MEMORY_MB:
            raise FieldError("model", f"needs {needed} MiB per GPU, more than any GPU has")
        return needed
    if gpu_model is not None and gpu_model in registered:
        registered = {gpu_model: registered[gpu_model]}
    result = estimate(sized, gpu_models=registered)
    needed = memory_request_mb(result)
    if not any(fit.fits_as_requested for fit in result.fits.values()):
        raise FieldError("model", _never_fits_message(result, needed))
    return needed


def _never_fits_message(result: EstimateResponse, needed: int) -> str:
    largest = max(result.fits.values(), key=lambda fit: fit.memory_mb)
    header = (
        f"needs {needed} MiB per GPU on {result.gpu_count} GPU(s); no registered GPU model "
        f"has that much (largest: {largest.gpu_model}, {largest.memory_mb} MiB)"
    )
    # Each fit's message names its GPU and, where one exists, its cheapest verified fix.
    return "; ".join([header, *(fit.message for fit in result.fits.values())])
