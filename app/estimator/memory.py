"""Per-GPU training memory and training-time arithmetic (pure calculation).

Formulas, sources and assumptions are in ``docs/estimator.md``; the strings in
:data:`FORMULAS` are quoted there verbatim (a test checks this).

Symbols: P parameters, L layers, h hidden, f MLP inner size, a heads, V vocabulary,
s sequence length, b micro-batch, t tensor parallel, p pipeline parallel, d data parallel,
e bytes per activation element, g h*f matrices per MLP, k and j micro-batches in flight
at the first and last pipeline stage, n layers per pipeline stage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.estimator.schemas import (
    BytesPerParameter,
    EstimateRequest,
    EstimateResponse,
    GpuModelSpec,
    MemoryBreakdown,
    Optimizer,
    PipelineSchedule,
    Precision,
    Sharding,
    TrainingTime,
    TransformerShape,
)
from app.estimator.shape import (
    assumed_shape,
    layer_parameters,
    mlp_matrices,
    norm_parameters,
    transformer_parameters,
)

MIB = 2**20
GIB = 2**30

#: CUDA context + cuBLAS/cuDNN workspaces + NCCL communicator buffers, per GPU.
CUDA_CONTEXT_BYTES = 1 * GIB
#: Caching-allocator fragmentation, as a fraction of the tensors it holds.
FRAGMENTATION_FRACTION = 0.05
#: ZeRO-3/FSDP keeps this many gathered (unsharded) units alive: current + prefetched.
ZERO3_GATHERED_UNITS = 2
#: fp32 bytes per element of Adafactor's second-moment statistics.
ADAFACTOR_STAT_BYTES = 4

SHARDING_LEVEL: dict[str, int] = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3}

_STATE_BYTES: dict[str, float] = {"fp32": 4, "mixed": 2, "bf16": 2}
#: Optimizer-state bytes per parameter (master weights included for mixed precision).
#: Adafactor's factored second moment is added from the shape, see ``_optimizer_bytes``.
_OPTIMIZER_BYTES: dict[tuple[str, str], float] = {
    ("fp32", "adam"): 8,  # fp32 momentum + variance
    ("mixed", "adam"): 12,  # fp32 master + momentum + variance (ZeRO paper K = 12)
    ("bf16", "adam"): 4,  # bf16 momentum + variance
    ("fp32", "sgd"): 4,  # fp32 momentum
    ("mixed", "sgd"): 8,  # fp32 master + momentum
    ("bf16", "sgd"): 2,  # bf16 momentum
    ("fp32", "adam8bit"): 2,  # two 8-bit states
    ("mixed", "adam8bit"): 6,  # fp32 master + two 8-bit states
    ("bf16", "adam8bit"): 2,
    ("fp32", "adafactor"): 0,  # + factored second moment
    ("mixed", "adafactor"): 4,  # fp32 master + factored second moment
    ("bf16", "adafactor"): 0,
}

FORMULAS: dict[str, str] = {
    "parameters": (
        "P = L * (4*h^2 + g*h*f + c_b + 2*c_n) + u*V*h + q*s*h + c_n; "
        "g = 3 (gated feed-forward) or 2; c_b = 5*h + (g - 1)*f with biases, else 0; "
        "c_n = 2*h (LayerNorm) or h (RMSNorm); u = 1 (tied output head) or 2 (untied); "
        "q = 1 (learned positions) or 0 (rotary)"
    ),
    "weights": (
        "weights = b_w * P / (t * p * d_w); b_w = 4 (fp32) or 2 (mixed, bf16); "
        "d_w = d for zero3, else 1"
    ),
    "gradients": (
        "gradients = b_g * P / (t * p * d_g); b_g = 4 (fp32) or 2 (mixed, bf16); "
        "d_g = d for zero2 and zero3, else 1"
    ),
    "optimizer_states": (
        "optimizer_states = b_o * P / (t * p * d_o); b_o from the optimizer table "
        "(mixed adam: 4 master + 4 momentum + 4 variance = 12); "
        "d_o = d for zero1, zero2 and zero3, else 1"
    ),
    "optimizer_states_adafactor": (
        "optimizer_states = (m * P + 4 * F) / (t * p * d_o); "
        "F = L * (6*h + g*(h + f) + c_b + 2*c_n) + u*(V + h) + q*(s + h) + c_n; "
        "m = 4 (mixed: fp32 master weights) or 0; d_o = d for zero1, zero2 and zero3, else 1"
    ),
    "activations": (
        "activations = max(k * n * A_kept, j * (n * A_kept + 4*s*b*V/t)) + A_re; "
        "n = ceil(L / p); k = 1 if p = 1, p for 1f1b, gradient_accumulation for gpipe; "
        "j = gradient_accumulation for gpipe with p > 1, else 1; "
        "e = 2 (mixed, bf16) or 4 (fp32)"
    ),
    "activations_layer": (
        "A_layer = s*b*((4e + 2)*h + (4e*h + g*e*f)/t) + (2e + 1)*a*s^2*b/t   "
        "(e = 2, g = 2, f = 4h: s*b*h*(10 + 24/t + 5*a*s/(h*t)))"
    ),
    "activations_layer_sp": (
        "A_layer = (s*b*((8e + 2)*h + g*e*f) + (2e + 1)*a*s^2*b) / t   "
        "(e = 2, g = 2, f = 4h: s*b*h*(34 + 5*a*s/h)/t)"
    ),
    "activations_no_recompute": "A_kept = A_layer; A_re = 0",
    "activations_recompute": "A_kept = e*s*b*h; A_re = A_layer",
    "activations_recompute_sp": "A_kept = e*s*b*h/t; A_re = A_layer",
    "overhead": (
        "overhead = 1 GiB (CUDA context, library workspaces, NCCL buffers) "
        "+ 0.05 * (weights + gradients + optimizer_states + activations) "
        "+ [zero3 and d > 1] 2 * b_w * max(P_layer, V*h) / t"
    ),
    "total": "total = weights + gradients + optimizer_states + activations + overhead",
    "training_flops": "FLOPs = 6 * P * tokens",
    "training_time": (
        "seconds = 6 * P * tokens / (mfu * peak_flops_per_gpu * t * p * d); "
        "peak = bf16 peak (mixed, bf16) or fp32 peak (fp32)"
    ),
}


@dataclass(frozen=True)
class Setup:
    """A fully resolved request: what the arithmetic needs and nothing else."""

    parameters: int
    shape: TransformerShape
    precision: Precision
    optimizer: Optimizer
    sharding: Sharding
    micro_batch: int
    gradient_accumulation: int
    checkpointing: bool
    sequence_parallel: bool
    dp: int
    tp: int
    pp: int
    schedule: PipelineSchedule

    @property
    def gpu_count(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.gradient_accumulation * self.dp


@dataclass(frozen=True)
class Memory:
    weights: int
    gradients: int
    optimizer_states: int
    activations: int
    overhead: int
    coefficients: dict[str, float]

    @property
    def total(self) -> int:
        return (
            self.weights + self.gradients + self.optimizer_states + self.activations + self.overhead
        )

    def breakdown(self) -> MemoryBreakdown:
        return MemoryBreakdown(
            weights=self.weights,
            gradients=self.gradients,
            optimizer_states=self.optimizer_states,
            activations=self.activations,
            overhead=self.overhead,
            total=self.total,
        )


@dataclass(frozen=True)
class CodedWarning:
    """A warning with a stable code, so a changed request's new warnings can be told apart."""

    code: str
    text: str


@dataclass(frozen=True)
class Evaluation:
    """One request, estimated: what :func:`app.estimator.estimate` and every suggestion's
    re-estimate are built from."""

    request: EstimateRequest
    setup: Setup
    shape_assumed: bool
    shape_adjustments: tuple[str, ...]
    memory: Memory
    warnings: tuple[CodedWarning, ...]


# --------------------------------------------------------------------------- resolve


def _resolve(request: EstimateRequest) -> tuple[Setup, bool, tuple[str, ...]]:
    adjustments: tuple[str, ...] = ()
    if request.transformer is not None:
        shape = request.transformer
        parameters = transformer_parameters(shape)
        assumed = False
    else:
        assert request.parameters is not None  # guaranteed by the request validator
        parameters = request.parameters
        guess = assumed_shape(
            parameters,
            request.seq_len,
            tensor_parallel=request.tensor_parallel,
            pipeline_parallel=request.pipeline_parallel,
        )
        shape, assumed, adjustments = guess.shape, True, guess.adjustments
    setup = Setup(
        parameters=parameters,
        shape=shape,
        precision=request.precision,
        optimizer=request.optimizer,
        sharding=request.sharding,
        micro_batch=request.micro_batch,
        gradient_accumulation=request.gradient_accumulation,
        checkpointing=request.checkpointing,
        sequence_parallel=request.sequence_parallel,
        dp=request.data_parallel,
        tp=request.tensor_parallel,
        pp=request.pipeline_parallel,
        schedule=request.pipeline_schedule,
    )
    return setup, assumed, adjustments


# --------------------------------------------------------------------------- memory


def _adafactor_statistics(shape: TransformerShape) -> int:
    """Second-moment elements (Shazeer & Stern 2018): rows + columns of every matrix, the
    full size of every vector (biases, norms).

    Per layer: fused QKV (h x 3h) -> 4h, output (h x h) -> 2h, each of the g MLP matrices
    -> h + f; embedding and an untied head (V x h) -> V + h each; positions -> s + h.
    """
    h, f = shape.hidden, shape.ffn
    vectors = layer_parameters(shape) - 4 * h * h - mlp_matrices(shape) * h * f
    heads = 1 if shape.tied_embeddings else 2
    positions = shape.seq_len + h if shape.position_embedding == "learned" else 0
    return (
        shape.layers * (6 * h + mlp_matrices(shape) * (h + f) + vectors)
        + heads * (shape.vocab + h)
        + positions
        + norm_parameters(shape)
    )


def _optimizer_bytes_total(setup: Setup) -> float:
    """Optimizer-state bytes for the whole (unsharded) model."""
    total = _OPTIMIZER_BYTES[(setup.precision, setup.optimizer)] * setup.parameters
    if setup.optimizer == "adafactor":
        total += ADAFACTOR_STAT_BYTES * _adafactor_statistics(setup.shape)
    return total


def bytes_per_parameter(setup: Setup) -> BytesPerParameter:
    w = _STATE_BYTES[setup.precision]
    g = _STATE_BYTES[setup.precision]
    o = _optimizer_bytes_total(setup) / setup.parameters
    return BytesPerParameter(weights=w, gradients=g, optimizer_states=o, total=w + g + o)


def in_flight(setup: Setup) -> tuple[int, int]:
    """Micro-batches whose activations the first and the last pipeline stage hold at once.

    1F1B (PipeDream-Flush, Megatron's default): the first stage runs p forwards before its
    first backward, whatever the accumulation (Korthikanti et al. 2022, sec. 4.2.3); the
    last stage one.  GPipe: every stage runs all micro-batches' forwards first.
    """
    if setup.pp == 1:
        return 1, 1
    if setup.schedule == "gpipe":
        return setup.gradient_accumulation, setup.gradient_accumulation
    return setup.pp, 1


def _activation_bytes(setup: Setup) -> tuple[int, dict[str, float]]:
    """Korthikanti et al. 2022 per-layer activations, generalised to e, f and g (see docs)."""
    shape = setup.shape
    s, b, h, f, a = shape.seq_len, setup.micro_batch, shape.hidden, shape.ffn, shape.heads
    t, p = setup.tp, setup.pp
    e = 4 if setup.precision == "fp32" else 2
    g = mlp_matrices(shape)
    scores = (2 * e + 1) * a * s * s * b / t
    if setup.sequence_parallel:
        a_layer = (s * b * ((8 * e + 2) * h + g * e * f)) / t + scores
    else:
        a_layer = s * b * ((4 * e + 2) * h + (4 * e * h + g * e * f) / t) + scores
    if setup.checkpointing:
        a_kept = e * s * b * h / (t if setup.sequence_parallel else 1)
        a_re = a_layer
    else:
        a_kept = a_layer
        a_re = 0.0
    n = math.ceil(shape.layers / p)
    k, j = in_flight(setup)
    logits = 4 * s * b * shape.vocab / t
    first_stage = k * n * a_kept
    last_stage = j * (n * a_kept + logits)
    total = max(first_stage, last_stage) + a_re
    coefficients = {
        "e": e,
        "g": g,
        "n": n,
        "k": k,
        "j": j,
        "A_layer": a_layer,
        "A_kept": a_kept,
        "A_re": a_re,
        "logits": logits,
    }
    return math.ceil(total), coefficients


def memory(setup: Setup) -> Memory:
    """Per-GPU bytes of ``setup`` by component (the busiest pipeline stage)."""
    level = SHARDING_LEVEL[setup.sharding]
    d = setup.dp
    d_w = d if level >= 3 else 1
    d_g = d if level >= 2 else 1
    d_o = d if level >= 1 else 1
    local = setup.parameters / (setup.tp * setup.pp)
    b_w = _STATE_BYTES[setup.precision]
    b_g = _STATE_BYTES[setup.precision]
    optimizer_total = _optimizer_bytes_total(setup)
    b_o = optimizer_total / setup.parameters
    weights = math.ceil(b_w * local / d_w)
    gradients = math.ceil(b_g * local / d_g)
    optimizer_states = math.ceil(optimizer_total / (setup.tp * setup.pp * d_o))
    activations, act_coefficients = _activation_bytes(setup)
    tensors = weights + gradients + optimizer_states + activations
    shape = setup.shape
    unit = max(layer_parameters(shape), shape.vocab * shape.hidden)
    gathered = 0.0
    if level >= 3 and d > 1:
        gathered = ZERO3_GATHERED_UNITS * b_w * unit / setup.tp
    overhead = math.ceil(CUDA_CONTEXT_BYTES + FRAGMENTATION_FRACTION * tensors + gathered)
    coefficients: dict[str, float] = {
        "P": setup.parameters,
        "P_layer": layer_parameters(shape),
        "L": shape.layers,
        "h": shape.hidden,
        "f": shape.ffn,
        "a": shape.heads,
        "V": shape.vocab,
        "s": shape.seq_len,
        "b": setup.micro_batch,
        "t": setup.tp,
        "p": setup.pp,
        "d": d,
        "b_w": b_w,
        "b_g": b_g,
        "b_o": b_o,
        "d_w": d_w,
        "d_g": d_g,
        "d_o": d_o,
        **act_coefficients,
        "zero3_gathered": gathered,
    }
    return Memory(
        weights=weights,
        gradients=gradients,
        optimizer_states=optimizer_states,
        activations=activations,
        overhead=overhead,
        coefficients=coefficients,
    )


def formulas(setup: Setup) -> dict[str, str]:
    """The documented formulas this setup's estimate used, by component."""
    if setup.checkpointing:
        kept = "activations_recompute_sp" if setup.sequence_parallel else "activations_recompute"
    else:
        kept = "activations_no_recompute"
    layer = "activations_layer_sp" if setup.sequence_parallel else "activations_layer"
    optimizer = (
        "optimizer_states_adafactor" if setup.optimizer == "adafactor" else "optimizer_states"
    )
    return {
        "parameters": FORMULAS["parameters"],
        "weights": FORMULAS["weights"],
        "gradients": FORMULAS["gradients"],
        "optimizer_states": FORMULAS[optimizer],
        "activations": f"{FORMULAS['activations']}; {FORMULAS[layer]}; {FORMULAS[kept]}",
        "overhead": FORMULAS["overhead"],
        "total": FORMULAS["total"],
        "training_time": FORMULAS["training_time"],
    }


# --------------------------------------------------------------------------- warnings


def warnings_for(setup: Setup) -> tuple[CodedWarning, ...]:
    """What the estimate assumes works but a user should know, each with a stable code."""
    out: list[CodedWarning] = []
    if setup.sharding != "none" and setup.dp == 1:
        out.append(
            CodedWarning(
                "sharding_single_rank",
                f"sharding={setup.sharding} with data_parallel=1 shards over a single rank: "
                "no memory saving",
            )
        )
    if SHARDING_LEVEL[setup.sharding] >= 2 and setup.pp > 1:
        out.append(
            CodedWarning(
                "zero_with_pipeline",
                "ZeRO-2/ZeRO-3 with pipeline parallelism is unusual (DeepSpeed's pipeline "
                "engine supports ZeRO-1 only); the estimate assumes it works",
            )
        )
    if setup.shape.layers % setup.pp:
        out.append(
            CodedWarning(
                "uneven_pipeline",
                f"transformer.layers ({setup.shape.layers}) is not divisible by "
                f"pipeline_parallel ({setup.pp}); the busiest stage holds "
                f"{math.ceil(setup.shape.layers / setup.pp)}",
            )
        )
    if setup.pp > 1 and setup.gradient_accumulation < setup.pp:
        held = (
            f"the estimate holds {setup.pp} micro-batches in flight at the first stage "
            "(1F1B steady state)"
            if setup.schedule == "1f1b"
            else "GPipe holds all of them at every stage"
        )
        out.append(
            CodedWarning(
                "pipeline_bubble",
                f"gradient_accumulation ({setup.gradient_accumulation}) < pipeline_parallel "
                f"({setup.pp}): the pipeline bubble dominates; {held}",
            )
        )
    if setup.sequence_parallel and setup.tp == 1:
        out.append(
            CodedWarning(
                "sequence_parallel_unused", "sequence_parallel has no effect with tensor_parallel=1"
            )
        )
    if setup.optimizer == "adafactor" and setup.precision == "bf16":
        out.append(
            CodedWarning(
                "bf16_adafactor", "pure bf16 Adafactor without master weights may not converge"
            )
        )
    return tuple(out)


def evaluate(request: EstimateRequest) -> Evaluation:
    """Resolve and estimate ``request`` (memory and warnings; no fits, no advice)."""
    setup, assumed, adjustments = _resolve(request)
    return Evaluation(
        request=request,
        setup=setup,
        shape_assumed=assumed,
        shape_adjustments=adjustments,
        memory=memory(setup),
        warnings=warnings_for(setup),
    )


# --------------------------------------------------------------------------- time


def training_flops(parameters: int, tokens: int) -> float:
    """Model FLOPs for ``tokens`` training tokens: ``6 * P * tokens`` (Kaplan et al. 2020)."""
    return 6.0 * parameters * tokens


def training_time(
    parameters: int,
    tokens: int,
    *,
    gpu: GpuModelSpec,
    gpu_count: int,
    precision: Precision,
    mfu: float,
) -> TrainingTime:
    """Wall time for ``6 * P * tokens`` FLOPs at ``mfu`` of the GPUs' peak."""
    peak = gpu.peak_tflops_fp32 if precision == "fp32" else gpu.peak_tflops_bf16
    flops = training_flops(parameters, tokens)
    seconds = flops / (mfu * peak * 1e12 * gpu_count)
    return TrainingTime(
        gpu_count=gpu_count,
        flops=flops,
        peak_tflops_per_gpu=peak,
        mfu=mfu,
        seconds=seconds,
        hours=seconds / 3600,
    )


# --------------------------------------------------------------------------- job requests


def memory_request_mb(
    source: EstimateResponse | EstimateRequest | Mapping[str, Any],
    *,
    headroom_fraction: float = 0.0,
) -> int:
    """Per-GPU MiB to request for a job: ``ceil(total * (1 + headroom_fraction) / 2**20)``.

    ``source`` is an :class:`EstimateResponse`, an :class:`EstimateRequest`, or a mapping
    that validates as an ``EstimateRequest`` (a model description from a job spec).
    """
    if headroom_fraction < 0:
        raise ValueError("headroom_fraction must be >= 0")
    if isinstance(source, EstimateResponse):
        total = source.per_gpu_bytes.total
    else:
        request = (
            source
            if isinstance(source, EstimateRequest)
            else EstimateRequest.model_validate(dict(source))
        )
        total = evaluate(request).memory.total
    return math.ceil(total * (1 + headroom_fraction) / MIB)
