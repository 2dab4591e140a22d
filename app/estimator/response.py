""":func:`estimate`: a request's memory, its fit on the GPUs it would run on, and advice."""

from __future__ import annotations

import math
from collections.abc import Mapping

from app.estimator.advice import Target, fit, suggestions
from app.estimator.memory import (
    CUDA_CONTEXT_BYTES,
    FRAGMENTATION_FRACTION,
    MIB,
    Evaluation,
    bytes_per_parameter,
    evaluate,
    formulas,
    in_flight,
    training_flops,
)
from app.estimator.schemas import EstimateRequest, EstimateResponse, GpuModelSpec, Suggestion
from app.estimator.shape import ASSUMED_HEAD_DIM, ASSUMED_VOCAB, DEFAULT_SEQ_LEN


def _architecture_note(evaluation: Evaluation) -> str:
    shape = evaluation.setup.shape
    return (
        f"parameters counted for the shape: {'gated' if shape.gated_ffn else 'non-gated'} "
        f"feed-forward (f = {shape.ffn}), {'tied' if shape.tied_embeddings else 'untied'} "
        f"output head, {shape.position_embedding} positions, "
        f"{'LayerNorm' if shape.norm == 'layernorm' else 'RMSNorm'}, "
        f"{'with' if shape.biases else 'no'} biases"
    )


def _pipeline_note(evaluation: Evaluation) -> str:
    setup = evaluation.setup
    k, j = in_flight(setup)
    if setup.schedule == "gpipe":
        return (
            f"pipeline schedule gpipe: every stage holds the activations of all "
            f"gradient_accumulation = {k} micro-batches (k = j = {k})"
        )
    return (
        f"pipeline schedule 1f1b: the first stage holds the activations of p = {k} "
        f"micro-batches in flight (k = {k}) whatever gradient_accumulation is; the last "
        f"stage {j} and its logits"
    )


def _assumptions(evaluation: Evaluation) -> list[str]:
    request, setup = evaluation.request, evaluation.setup
    notes: list[str] = []
    if evaluation.shape_assumed:
        shape = setup.shape
        seq_note = "given" if request.seq_len is not None else f"default {DEFAULT_SEQ_LEN}"
        notes.append(
            "activations use an ASSUMED shape derived from the parameter count "
            f"(GPT-3 proportions h = 128*L, head size {ASSUMED_HEAD_DIM}, vocab "
            f"{ASSUMED_VOCAB}): layers={shape.layers}, hidden={shape.hidden}, "
            f"heads={shape.heads}, seq_len={shape.seq_len} ({seq_note}); give "
            "'transformer' for a real estimate"
        )
        notes.extend(f"assumed shape adjusted: {a}" for a in evaluation.shape_adjustments)
    else:
        notes.append(_architecture_note(evaluation))
    if setup.pp > 1:
        notes.append(_pipeline_note(evaluation))
    notes.append(
        f"overhead: {CUDA_CONTEXT_BYTES // MIB} MiB CUDA context/workspaces + "
        f"{FRAGMENTATION_FRACTION:.0%} allocator fragmentation"
    )
    notes.append("GPU memory_mb is MiB (2**20 bytes), as reported by NVML")
    if setup.checkpointing:
        notes.append(
            "time estimate counts model FLOPs (6*P*tokens); checkpointing recomputes the "
            "forward pass, so use a lower mfu (about 3/4) if it is not already accounted for"
        )
    return notes


def estimate(
    request: EstimateRequest, *, gpu_models: Mapping[str, GpuModelSpec]
) -> EstimateResponse:
    """Per-GPU memory, its fit on each of ``gpu_models`` (the GPUs the job would run on),
    training time and, for each GPU it does not fit as asked, verified suggestions.

    ``request.gpu_model`` is not looked at here: the caller resolves it into
    ``gpu_models`` (:func:`app.estimator.catalog.advice_gpus`).  With
    ``target_gpu_memory_mb`` the suggestions aim for that memory instead of each GPU's.
    """
    evaluation = evaluate(request)
    setup, total = evaluation.setup, evaluation.memory.total
    if request.target_gpu_memory_mb is not None:
        targets = [Target(None, request.target_gpu_memory_mb)]
    else:
        targets = [Target(name, gpu.memory_mb) for name, gpu in gpu_models.items()]
    advice: dict[str | None, list[Suggestion]] = {
        target.gpu_model: suggestions(evaluation, target)
        for target in targets
        if total > target.capacity
    }
    fits = {
        name: fit(evaluation, name, gpu, advice=advice.get(name, []))
        for name, gpu in gpu_models.items()
    }
    assumptions = _assumptions(evaluation)
    if not targets:
        assumptions.append("no target_gpu_memory_mb and no gpu_models: no suggestions")
    return EstimateResponse(
        parameters=setup.parameters,
        shape=setup.shape,
        shape_assumed=evaluation.shape_assumed,
        precision=setup.precision,
        optimizer=setup.optimizer,
        sharding=setup.sharding,
        data_parallel=setup.dp,
        tensor_parallel=setup.tp,
        pipeline_parallel=setup.pp,
        gpu_count=setup.gpu_count,
        micro_batch=setup.micro_batch,
        gradient_accumulation=setup.gradient_accumulation,
        pipeline_schedule=setup.schedule,
        global_batch=setup.global_batch,
        bytes_per_parameter=bytes_per_parameter(setup),
        per_gpu_bytes=evaluation.memory.breakdown(),
        per_gpu_mib=math.ceil(total / MIB),
        formulas=formulas(setup),
        coefficients=evaluation.memory.coefficients,
        training_flops=(
            training_flops(setup.parameters, request.tokens) if request.tokens else None
        ),
        fits=fits,
        target_memory_mb=min((t.memory_mb for t in targets), default=None),
        suggestions=[s for found in advice.values() for s in found],
        warnings=[w.text for w in evaluation.warnings],
        assumptions=assumptions,
    )
