"""Per-GPU training memory, GPU fit and training-time estimates (pure calculation).

Formulas, sources and assumptions are in ``docs/estimator.md``; the strings in
:data:`FORMULAS` are quoted there verbatim (a test checks this).

Symbols: P parameters, L layers, h hidden, f MLP inner size, a heads, V vocabulary,
s sequence length, b micro-batch, t tensor parallel, p pipeline parallel, d data parallel,
e bytes per activation element, k micro-batches in flight, n layers per pipeline stage.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.estimator.schemas import (
    BytesPerParameter,
    EstimateRequest,
    EstimateResponse,
    GpuFit,
    GpuModelSpec,
    MemoryBreakdown,
    Optimizer,
    Precision,
    Sharding,
    Suggestion,
    SuggestionKind,
    TrainingTime,
    TransformerShape,
)

MIB = 2**20
GIB = 2**30

#: CUDA context + cuBLAS/cuDNN workspaces + NCCL communicator buffers, per GPU.
CUDA_CONTEXT_BYTES = 1 * GIB
#: Caching-allocator fragmentation, as a fraction of the tensors it holds.
FRAGMENTATION_FRACTION = 0.05
#: ZeRO-3/FSDP keeps this many gathered (unsharded) units alive: current + prefetched.
ZERO3_GATHERED_UNITS = 2
#: Sequence length assumed for a parameters-only request without ``seq_len``.
DEFAULT_SEQ_LEN = 2048
#: Shape assumptions for a parameters-only request (GPT-3 family, Brown et al. 2020).
ASSUMED_HIDDEN_PER_LAYER = 128
ASSUMED_HEAD_DIM = 128
ASSUMED_VOCAB = 50257
#: Upper bound of the data-parallel search in :func:`estimate` fits.
MAX_DATA_PARALLEL = 2**16
#: fp32 bytes per element of Adafactor's factored second moment.
ADAFACTOR_STAT_BYTES = 4

_SHARDING_LEVEL: dict[str, int] = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3}

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
    "parameters": "P = L * (4*h^2 + 2*h*f) + V*h + s*h   (f = 4h gives 12*L*h^2 + V*h + s*h)",
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
        "optimizer_states = (m * P + 4 * (L * (8*h + 2*f) + V + s + 2*h)) / (t * p * d_o); "
        "m = 4 (mixed: fp32 master weights) or 0; d_o = d for zero1, zero2 and zero3, else 1"
    ),
    "activations": (
        "activations = max(k * n * A_kept, n * A_kept + 4*s*b*V/t) + A_re; "
        "n = ceil(L / p); k = 1 if p = 1 else min(p, gradient_accumulation); "
        "e = 2 (mixed, bf16) or 4 (fp32)"
    ),
    "activations_layer": (
        "A_layer = s*b*((4e + 2)*h + (4e*h + 2e*f)/t) + (2e + 1)*a*s^2*b/t   "
        "(e = 2, f = 4h: s*b*h*(10 + 24/t + 5*a*s/(h*t)))"
    ),
    "activations_layer_sp": (
        "A_layer = (s*b*((8e + 2)*h + 2e*f) + (2e + 1)*a*s^2*b) / t   "
        "(e = 2, f = 4h: s*b*h*(34 + 5*a*s/h)/t)"
    ),
    "activations_no_recompute": "A_kept = A_layer; A_re = 0",
    "activations_recompute": "A_kept = e*s*b*h; A_re = A_layer",
    "activations_recompute_sp": "A_kept = e*s*b*h/t; A_re = A_layer",
    "overhead": (
        "overhead = 1 GiB (CUDA context, library workspaces, NCCL buffers) "
        "+ 0.05 * (weights + gradients + optimizer_states + activations) "
        "+ [zero3 and d > 1] 2 * b_w * max(4*h^2 + 2*h*f, V*h) / t"
    ),
    "total": "total = weights + gradients + optimizer_states + activations + overhead",
    "training_flops": "FLOPs = 6 * P * tokens",
    "training_time": (
        "seconds = 6 * P * tokens / (mfu * peak_flops_per_gpu * t * p * d); "
        "peak = bf16 peak (mixed, bf16) or fp32 peak (fp32)"
    ),
}


@dataclass(frozen=True)
class _Setup:
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

    @property
    def gpu_count(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class _Memory:
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


# --------------------------------------------------------------------------- shape


def transformer_parameters(shape: TransformerShape) -> int:
    """Parameter count of a GPT-style decoder: ``L*(4h^2 + 2hf) + V*h + s*h``.

    Attention has 4 h*h matrices (Q, K, V, output), the MLP two h*f matrices; the input
    embedding (V*h, tied with the output layer) and learned positions (s*h) are added.
    Biases and LayerNorm parameters (13*h per layer) are left out.
    """
    h, f = shape.hidden, shape.ffn
    return shape.layers * (4 * h * h + 2 * h * f) + shape.vocab * h + shape.seq_len * h


def assumed_shape(parameters: int, seq_len: int | None = None) -> TransformerShape:
    """Shape assumed for a parameters-only request.

    GPT-3-family proportions: ``h = 128 * L`` (so ``P ~ 12*L*h^2 = 12*h^3/128``), head size
    128, vocabulary 50257; ``h`` rounded to a multiple of 128, ``L = round(P / (12*h^2))``.
    """
    raw_hidden = (ASSUMED_HIDDEN_PER_LAYER * parameters / 12) ** (1 / 3)
    hidden = max(ASSUMED_HEAD_DIM, round(raw_hidden / ASSUMED_HEAD_DIM) * ASSUMED_HEAD_DIM)
    layers = max(1, round(parameters / (12 * hidden * hidden)))
    return TransformerShape(
        layers=layers,
        hidden=hidden,
        heads=hidden // ASSUMED_HEAD_DIM,
        vocab=ASSUMED_VOCAB,
        seq_len=seq_len if seq_len is not None else DEFAULT_SEQ_LEN,
    )


def _resolve(request: EstimateRequest) -> tuple[_Setup, bool]:
    if request.transformer is not None:
        shape = request.transformer
        parameters = transformer_parameters(shape)
        assumed = False
    else:
        assert request.parameters is not None  # guaranteed by the request validator
        parameters = request.parameters
        shape = assumed_shape(parameters, request.seq_len)
        assumed = True
    setup = _Setup(
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
    )
    return setup, assumed


# --------------------------------------------------------------------------- memory


def _adafactor_factored_elements(shape: TransformerShape) -> int:
    """Row + column statistics of every weight matrix (Shazeer & Stern 2018).

    Per layer: fused QKV (h x 3h) -> 4h, output (h x h) -> 2h, MLP (h x f, f x h) -> 2(h+f);
    embedding (V x h) -> V + h; positions (s x h) -> s + h.
    """
    h, f = shape.hidden, shape.ffn
    return shape.layers * (8 * h + 2 * f) + shape.vocab + shape.seq_len + 2 * h


def _optimizer_bytes_total(setup: _Setup) -> float:
    """Optimizer-state bytes for the whole (unsharded) model."""
    total = _OPTIMIZER_BYTES[(setup.precision, setup.optimizer)] * setup.parameters
    if setup.optimizer == "adafactor":
        total += ADAFACTOR_STAT_BYTES * _adafactor_factored_elements(setup.shape)
    return total


def _bytes_per_parameter(setup: _Setup) -> BytesPerParameter:
    w = _STATE_BYTES[setup.precision]
    g = _STATE_BYTES[setup.precision]
    o = _optimizer_bytes_total(setup) / setup.parameters
    return BytesPerParameter(weights=w, gradients=g, optimizer_states=o, total=w + g + o)


def _activation_bytes(setup: _Setup) -> tuple[int, dict[str, float]]:
    """Korthikanti et al. 2022 per-layer activations, generalised to e and f (see docs)."""
    shape = setup.shape
    s, b, h, f, a = shape.seq_len, setup.micro_batch, shape.hidden, shape.ffn, shape.heads
    t, p = setup.tp, setup.pp
    e = 4 if setup.precision == "fp32" else 2
    scores = (2 * e + 1) * a * s * s * b / t
    if setup.sequence_parallel:
        a_layer = (s * b * ((8 * e + 2) * h + 2 * e * f)) / t + scores
    else:
        a_layer = s * b * ((4 * e + 2) * h + (4 * e * h + 2 * e * f) / t) + scores
    if setup.checkpointing:
        a_kept = e * s * b * h / (t if setup.sequence_parallel else 1)
        a_re = a_layer
    else:
        a_kept = a_layer
        a_re = 0.0
    n = math.ceil(shape.layers / p)
    k = 1 if p == 1 else min(p, setup.gradient_accumulation)
    logits = 4 * s * b * shape.vocab / t
    first_stage = k * n * a_kept
    last_stage = n * a_kept + logits
    total = max(first_stage, last_stage) + a_re
    coefficients = {
        "e": e,
        "n": n,
        "k": k,
        "A_layer": a_layer,
        "A_kept": a_kept,
        "A_re": a_re,
        "logits": logits,
    }
    return math.ceil(total), coefficients


def _memory(setup: _Setup) -> _Memory:
    level = _SHARDING_LEVEL[setup.sharding]
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
    gathered = 0.0
    if level >= 3 and d > 1:
        h, f = setup.shape.hidden, setup.shape.ffn
        unit = max(4 * h * h + 2 * h * f, setup.shape.vocab * h)
        gathered = ZERO3_GATHERED_UNITS * b_w * unit / setup.tp
    overhead = math.ceil(CUDA_CONTEXT_BYTES + FRAGMENTATION_FRACTION * tensors + gathered)
    coefficients: dict[str, float] = {
        "P": setup.parameters,
        "L": setup.shape.layers,
        "h": setup.shape.hidden,
        "f": setup.shape.ffn,
        "a": setup.shape.heads,
        "V": setup.shape.vocab,
        "s": setup.shape.seq_len,
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
    return _Memory(
        weights=weights,
        gradients=gradients,
        optimizer_states=optimizer_states,
        activations=activations,
        overhead=overhead,
        coefficients=coefficients,
    )


def _formulas(setup: _Setup) -> dict[str, str]:
    if setup.checkpointing:
        kept = "activations_recompute_sp" if setup.sequence_parallel else "activations_recompute"
    else:
        kept = "activations_no_recompute"
    layer = "activations_layer_sp" if setup.sequence_parallel else "activations_layer"
    optimizer = (
        "optimizer_states_adafactor" if setup.optimizer == "adafactor" else ("optimizer_states")
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


# --------------------------------------------------------------------------- fits


def _min_data_parallel(setup: _Setup, capacity: int) -> int | None:
    """Smallest data-parallel degree at which ``setup`` fits ``capacity`` bytes, or None."""
    if _memory(replace(setup, dp=1)).total <= capacity:
        return 1
    if setup.sharding == "none":
        return None  # nothing is divided by d
    # From d = 2 on, the per-GPU total is non-increasing in d: binary search.
    lo, hi = 2, MAX_DATA_PARALLEL
    if _memory(replace(setup, dp=hi)).total > capacity:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if _memory(replace(setup, dp=mid)).total <= capacity:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _no_fit_message(setup: _Setup, capacity: int) -> str:
    options: list[str] = []
    level = _SHARDING_LEVEL[setup.sharding]
    for sharding in ("zero1", "zero2", "zero3"):
        if _SHARDING_LEVEL[sharding] <= level:
            continue
        dp = _min_data_parallel(replace(setup, sharding=sharding), capacity)
        if dp is not None:
            gpus = setup.tp * setup.pp * dp
            options.append(f"sharding={sharding} (fits from data_parallel={dp}, {gpus} GPUs)")
    if setup.precision == "fp32":
        options.append("precision=mixed")
    if not setup.checkpointing:
        options.append("checkpointing=true")
    if setup.micro_batch > 1:
        options.append("a smaller micro_batch with gradient accumulation")
    options.append("a larger tensor_parallel or pipeline_parallel")
    if setup.sharding == "none":
        why = "with sharding=none more data-parallel GPUs do not reduce per-GPU memory"
    else:
        why = f"even with sharding={setup.sharding} the unsharded part is too large"
    return f"does not fit at any data-parallel degree ({why}); change " + ", or ".join(options)


def _fit(
    setup: _Setup,
    name: str,
    gpu: GpuModelSpec,
    *,
    tokens: int | None,
    mfu: float,
    requested_total: int,
) -> GpuFit:
    capacity = gpu.memory_mb * MIB
    dp = _min_data_parallel(setup, capacity)
    time_requested = time_at_min = None
    if tokens is not None:
        time_requested = training_time(
            setup.parameters,
            tokens,
            gpu=gpu,
            gpu_count=setup.gpu_count,
            precision=setup.precision,
            mfu=mfu,
        )
    if dp is None:
        return GpuFit(
            gpu_model=name,
            memory_mb=gpu.memory_mb,
            fits_as_requested=requested_total <= capacity,
            total_bytes_as_requested=requested_total,
            min_gpu_count=None,
            min_data_parallel=None,
            total_bytes_at_min=None,
            message=_no_fit_message(setup, capacity),
            training_time=time_requested,
        )
    min_count = setup.tp * setup.pp * dp
    total_at_min = _memory(replace(setup, dp=dp)).total
    if tokens is not None:
        time_at_min = training_time(
            setup.parameters,
            tokens,
            gpu=gpu,
            gpu_count=min_count,
            precision=setup.precision,
            mfu=mfu,
        )
    message = (
        f"fits from {min_count} GPUs (tensor_parallel={setup.tp} * pipeline_parallel="
        f"{setup.pp} * data_parallel={dp}) at {total_at_min / GIB:.2f} GiB per GPU"
    )
    if dp != setup.dp:
        message += "; the global batch scales with data_parallel"
    return GpuFit(
        gpu_model=name,
        memory_mb=gpu.memory_mb,
        fits_as_requested=requested_total <= capacity,
        total_bytes_as_requested=requested_total,
        min_gpu_count=min_count,
        min_data_parallel=dp,
        total_bytes_at_min=total_at_min,
        message=message,
        training_time=time_requested,
        training_time_at_min=time_at_min,
    )


# --------------------------------------------------------------------------- suggestions


def _micro_batch_options(setup: _Setup) -> list[int]:
    """Smaller micro-batches that keep ``micro_batch * gradient_accumulation`` exact."""
    per_replica = setup.micro_batch * setup.gradient_accumulation
    return [m for m in range(setup.micro_batch - 1, 0, -1) if per_replica % m == 0]


def _with_micro_batch(setup: _Setup, micro_batch: int) -> _Setup:
    per_replica = setup.micro_batch * setup.gradient_accumulation
    return replace(setup, micro_batch=micro_batch, gradient_accumulation=per_replica // micro_batch)


def _describe(setup: _Setup, new: _Setup) -> tuple[list[str], dict[str, str | int | bool]]:
    words: list[str] = []
    changes: dict[str, str | int | bool] = {}
    if new.precision != setup.precision:
        words.append("mixed precision (16-bit compute, fp32 master weights)")
        changes["precision"] = new.precision
    if new.sharding != setup.sharding:
        what = {
            "zero1": "optimizer states",
            "zero2": "gradients and optimizer states",
            "zero3": "weights, gradients and optimizer states",
        }[new.sharding]
        words.append(f"sharding={new.sharding}: shard {what} over the {new.dp} data-parallel ranks")
        changes["sharding"] = new.sharding
    if new.checkpointing != setup.checkpointing:
        words.append("full activation checkpointing (about 33% more compute)")
        changes["checkpointing"] = new.checkpointing
    if new.micro_batch != setup.micro_batch:
        global_batch = setup.micro_batch * setup.gradient_accumulation * setup.dp
        words.append(
            f"micro_batch {setup.micro_batch} -> {new.micro_batch} with gradient_accumulation "
            f"{setup.gradient_accumulation} -> {new.gradient_accumulation} "
            f"(global batch {global_batch} unchanged)"
        )
        changes["micro_batch"] = new.micro_batch
        changes["gradient_accumulation"] = new.gradient_accumulation
    return words, changes


def _suggestion(kind: SuggestionKind, setup: _Setup, new: _Setup, target: int) -> Suggestion:
    memory = _memory(new)
    words, changes = _describe(setup, new)
    return Suggestion(
        kind=kind,
        description="; ".join(words),
        changes=changes,
        per_gpu_bytes=memory.breakdown(),
        total_bytes=memory.total,
        fits=memory.total <= target,
        target_bytes=target,
    )


def _suggestions(setup: _Setup, target: int) -> list[Suggestion]:
    """Single changes, then the cheapest combination that fits (if more than one change)."""
    out: list[Suggestion] = []
    precisions: list[Precision] = [setup.precision]
    if setup.precision == "fp32":
        precisions.append("mixed")
        out.append(_suggestion("precision", setup, replace(setup, precision="mixed"), target))
    shardings: list[Sharding] = [setup.sharding]
    if setup.dp > 1:
        for sharding in ("zero2", "zero3"):
            if _SHARDING_LEVEL[sharding] > _SHARDING_LEVEL[setup.sharding]:
                shardings.append(sharding)
                out.append(
                    _suggestion("sharding", setup, replace(setup, sharding=sharding), target)
                )
    checkpointing = [setup.checkpointing]
    if not setup.checkpointing:
        checkpointing.append(True)
        out.append(_suggestion("checkpointing", setup, replace(setup, checkpointing=True), target))
    micro_batches = _micro_batch_options(setup)
    if micro_batches:
        chosen = next(
            (m for m in micro_batches if _memory(_with_micro_batch(setup, m)).total <= target),
            micro_batches[-1],
        )
        out.append(_suggestion("micro_batch", setup, _with_micro_batch(setup, chosen), target))

    # Combined: cheapest fitting combination by (penalty, -micro_batch); penalties rank
    # the throughput cost of each change.
    best: tuple[tuple[int, int], _Setup] | None = None
    strongest: _Setup | None = None
    for precision, sharding, ckpt, micro in itertools.product(
        precisions, shardings, checkpointing, [setup.micro_batch, *micro_batches]
    ):
        candidate = _with_micro_batch(
            replace(setup, precision=precision, sharding=sharding, checkpointing=ckpt), micro
        )
        n_changes = sum(
            (
                precision != setup.precision,
                sharding != setup.sharding,
                ckpt != setup.checkpointing,
                micro != setup.micro_batch,
            )
        )
        if n_changes < 2:
            continue
        strongest = candidate  # the product's last element applies every change
        if _memory(candidate).total > target:
            continue
        penalty = (
            (precision != setup.precision)
            + _SHARDING_LEVEL[sharding]
            - _SHARDING_LEVEL[setup.sharding]
            + 3 * (ckpt != setup.checkpointing)
            + 4 * (micro != setup.micro_batch)
        )
        key = (penalty, -micro)
        if best is None or key < best[0]:
            best = (key, candidate)
    if best is not None:
        out.append(_suggestion("combined", setup, best[1], target))
    elif strongest is not None:
        out.append(_suggestion("combined", setup, strongest, target))
    return out


# --------------------------------------------------------------------------- public API


def _warnings(setup: _Setup, assumed: bool) -> list[str]:
    warnings: list[str] = []
    if setup.sharding != "none" and setup.dp == 1:
        warnings.append(
            f"sharding={setup.sharding} with data_parallel=1 shards over a single rank: "
            "no memory saving"
        )
    if _SHARDING_LEVEL[setup.sharding] >= 2 and setup.pp > 1:
        warnings.append(
            "ZeRO-2/ZeRO-3 with pipeline parallelism is unusual (DeepSpeed's pipeline engine "
            "supports ZeRO-1 only); the estimate assumes it works"
        )
    if setup.shape.layers % setup.pp:
        warnings.append(
            f"transformer.layers ({setup.shape.layers}) is not divisible by pipeline_parallel "
            f"({setup.pp}); the busiest stage holds {math.ceil(setup.shape.layers / setup.pp)}"
        )
    if setup.pp > 1 and setup.gradient_accumulation < setup.pp:
        warnings.append(
            f"gradient_accumulation ({setup.gradient_accumulation}) < pipeline_parallel "
            f"({setup.pp}): the pipeline bubble dominates"
        )
    if setup.sequence_parallel and setup.tp == 1:
        warnings.append("sequence_parallel has no effect with tensor_parallel=1")
    if assumed and setup.tp > 1:
        warnings.append(
            "parameters-only request: tensor_parallel is not checked against the head count"
        )
    if setup.optimizer == "adafactor" and setup.precision == "bf16":
        warnings.append("pure bf16 Adafactor without master weights may not converge")
    return warnings


def _assumptions(request: EstimateRequest, setup: _Setup, assumed: bool) -> list[str]:
    notes = [
        "tied input/output embeddings; biases and LayerNorm parameters ignored",
        f"overhead: {CUDA_CONTEXT_BYTES // MIB} MiB CUDA context/workspaces + "
        f"{FRAGMENTATION_FRACTION:.0%} allocator fragmentation",
        "GPU memory_mb is MiB (2**20 bytes), as reported by NVML",
    ]
    if assumed:
        shape = setup.shape
        seq_note = "given" if request.seq_len is not None else f"default {DEFAULT_SEQ_LEN}"
        notes.insert(
            0,
            "activations use an ASSUMED shape derived from the parameter count "
            f"(GPT-3 proportions h = 128*L, head size 128, vocab {ASSUMED_VOCAB}): "
            f"layers={shape.layers}, hidden={shape.hidden}, heads={shape.heads}, "
            f"seq_len={shape.seq_len} ({seq_note}); give 'transformer' for a real estimate",
        )
    if setup.checkpointing:
        notes.append(
            "time estimate counts model FLOPs (6*P*tokens); checkpointing recomputes the "
            "forward pass, so use a lower mfu (about 3/4) if it is not already accounted for"
        )
    return notes


def estimate(
    request: EstimateRequest, *, gpu_models: Mapping[str, GpuModelSpec]
) -> EstimateResponse:
    """Estimate per-GPU memory, fits on ``gpu_models``, training time and suggestions."""
    setup, assumed = _resolve(request)
    memory = _memory(setup)
    total = memory.total
    fits = {
        name: _fit(setup, name, gpu, tokens=request.tokens, mfu=request.mfu, requested_total=total)
        for name, gpu in gpu_models.items()
    }
    target_mb = request.target_gpu_memory_mb
    if target_mb is None and gpu_models:
        target_mb = max(gpu.memory_mb for gpu in gpu_models.values())
    suggestions: list[Suggestion] = []
    assumptions = _assumptions(request, setup, assumed)
    if target_mb is None:
        assumptions.append("no target_gpu_memory_mb and no gpu_models: no suggestions")
    elif total > target_mb * MIB:
        suggestions = _suggestions(setup, target_mb * MIB)
        if setup.dp == 1 and setup.sharding != "zero3":
            assumptions.append("sharding suggestions need data_parallel > 1")
    return EstimateResponse(
        parameters=setup.parameters,
        shape=setup.shape,
        shape_assumed=assumed,
        precision=setup.precision,
        optimizer=setup.optimizer,
        sharding=setup.sharding,
        data_parallel=setup.dp,
        tensor_parallel=setup.tp,
        pipeline_parallel=setup.pp,
        gpu_count=setup.gpu_count,
        micro_batch=setup.micro_batch,
        gradient_accumulation=setup.gradient_accumulation,
        global_batch=setup.micro_batch * setup.gradient_accumulation * setup.dp,
        bytes_per_parameter=_bytes_per_parameter(setup),
        per_gpu_bytes=memory.breakdown(),
        per_gpu_mib=math.ceil(total / MIB),
        formulas=_formulas(setup),
        coefficients=memory.coefficients,
        training_flops=(
            training_flops(setup.parameters, request.tokens) if request.tokens else None
        ),
        fits=fits,
        target_memory_mb=target_mb,
        suggestions=suggestions,
        warnings=_warnings(setup, assumed),
        assumptions=assumptions,
    )


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
        total = _memory(_resolve(request)[0]).total
    return math.ceil(total * (1 + headroom_fraction) / MIB)
