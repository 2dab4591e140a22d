"""Pydantic v2 request/response models for the memory/GPU estimator.

Pure data definitions: this module imports pydantic only (`app.request_body` is pydantic
too).  All sizes are bytes unless the field name says otherwise; ``*_mb`` fields are MiB
(2**20 bytes), the unit NVML and ``nvidia-smi`` report GPU memory in.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.request_body import RequestBody

Precision = Literal["fp32", "mixed", "bf16"]
Optimizer = Literal["adam", "sgd", "adafactor", "adam8bit"]
Sharding = Literal["none", "zero1", "zero2", "zero3"]
SuggestionKind = Literal[
    "precision", "sharding", "checkpointing", "micro_batch", "data_parallel", "combined"
]
PipelineSchedule = Literal["1f1b", "gpipe"]
Architecture = Literal["gpt", "llama"]
PositionEmbedding = Literal["learned", "rotary"]
Norm = Literal["layernorm", "rmsnorm"]

#: Upper bounds far beyond any real model: they keep the arithmetic in float range (a larger
#: number is a 422 naming the field, not an overflow).
MAX_SEQ_LEN = 100_000_000
MAX_GPUS = 2**20  # a job may ask for 1024 GPUs on each of 1024 nodes

#: What ``architecture="llama"`` means for the fields it leaves unset (LLaMA / LLaMA-2:
#: Touvron et al. 2023): SwiGLU feed-forward, separate output head, rotary positions,
#: RMSNorm, no biases.  ``ffn_hidden`` follows LLaMA's rule, see ``llama_ffn_hidden``.
LLAMA_DEFAULTS: dict[str, Any] = {
    "gated_ffn": True,
    "tied_embeddings": False,
    "position_embedding": "rotary",
    "norm": "rmsnorm",
    "biases": False,
}


def llama_ffn_hidden(hidden: int) -> int:
    """LLaMA's feed-forward size: 2/3 of 4h (SwiGLU keeps the MLP's parameter count),
    rounded up to a multiple of 256 (4096 -> 11008, 5120 -> 13824)."""
    return -(-(8 * hidden // 3) // 256) * 256


class GpuModelSpec(RequestBody):
    """One GPU model the estimate is checked against.

    ``memory_mb`` is the usable device memory in MiB (as NVML reports it).  Peak figures are
    dense (no 2:4 sparsity) TFLOP/s; ``peak_tflops_fp32`` is the figure fp32 training really
    runs at (the TF32 tensor-core peak if TF32 matmuls are enabled, else plain FP32).
    """

    model_config = ConfigDict(frozen=True)

    memory_mb: int = Field(gt=0, description="usable device memory, MiB")
    peak_tflops_bf16: float = Field(gt=0, description="dense bf16/fp16 tensor-core peak, TFLOP/s")
    peak_tflops_fp32: float = Field(gt=0, description="fp32 (or TF32) peak, TFLOP/s")


class TransformerShape(RequestBody):
    """Decoder-only transformer shape.

    The defaults describe a GPT-2/GPT-3 decoder (4h MLP with GeLU, tied embeddings, learned
    positions, LayerNorm, biases); ``architecture="llama"`` changes the defaults of the
    fields not given to LLaMA's (:data:`LLAMA_DEFAULTS`).
    """

    model_config = ConfigDict(frozen=True)

    layers: int = Field(gt=0, le=100_000, description="number of transformer layers L")
    hidden: int = Field(gt=0, le=1_000_000, description="hidden size h")
    heads: int = Field(gt=0, le=100_000, description="attention heads a")
    vocab: int = Field(gt=0, le=100_000_000, description="vocabulary size V")
    seq_len: int = Field(gt=0, le=MAX_SEQ_LEN, description="sequence length s")
    ffn_hidden: int | None = Field(
        default=None,
        gt=0,
        le=10_000_000,
        description="MLP inner size f; defaults to 4*hidden (gpt) or LLaMA's 8h/3 rounded "
        "up to a multiple of 256 (llama)",
    )
    architecture: Architecture = Field(
        default="gpt", description="defaults for the fields below: gpt (GPT-2/3) or llama"
    )
    gated_ffn: bool = Field(
        default=False, description="gated feed-forward (SwiGLU/GeGLU): three h*f matrices"
    )
    tied_embeddings: bool = Field(
        default=True, description="output head shares the input embedding matrix"
    )
    position_embedding: PositionEmbedding = Field(
        default="learned", description="learned (s*h parameters) or rotary (none)"
    )
    norm: Norm = Field(default="layernorm", description="layernorm (weight, bias) or rmsnorm")
    biases: bool = Field(default=True, description="linear layers have biases")

    @model_validator(mode="before")
    @classmethod
    def _architecture_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("architecture") == "llama":
            data = {**LLAMA_DEFAULTS, **data}
            hidden = data.get("hidden")
            if data.get("ffn_hidden") is None and isinstance(hidden, int) and hidden > 0:
                data["ffn_hidden"] = llama_ffn_hidden(hidden)
        return data

    @model_validator(mode="after")
    def _check_shape(self) -> Self:
        if self.hidden % self.heads:
            raise ValueError(
                f"transformer.hidden ({self.hidden}) must be divisible by "
                f"transformer.heads ({self.heads})"
            )
        return self

    @property
    def ffn(self) -> int:
        """MLP inner size actually used (``ffn_hidden`` or ``4 * hidden``)."""
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.hidden


class EstimateRequest(RequestBody):
    """What to estimate: a model (``parameters`` XOR ``transformer``) and a training setup."""

    parameters: int | None = Field(
        default=None, gt=0, le=10**15, description="parameter count; give this or transformer"
    )
    transformer: TransformerShape | None = Field(
        default=None, description="transformer shape; give this or parameters"
    )
    seq_len: int | None = Field(
        default=None,
        gt=0,
        le=MAX_SEQ_LEN,
        description="sequence length for a parameters-only request (default 2048)",
    )
    precision: Precision = Field(
        default="mixed",
        description="fp32; mixed (fp16/bf16 compute with fp32 master weights); bf16 (pure)",
    )
    optimizer: Optimizer = Field(
        default="adam", description="decides the optimizer state held per parameter"
    )
    micro_batch: int = Field(
        default=1, ge=1, le=65_536, description="sequences per GPU per micro-step"
    )
    gradient_accumulation: int = Field(
        default=1, ge=1, le=1_000_000, description="micro-batches per optimizer step (per pipeline)"
    )
    checkpointing: bool = Field(default=False, description="full activation recomputation")
    sequence_parallel: bool = Field(
        default=False, description="Megatron sequence parallelism on top of tensor parallelism"
    )
    data_parallel: int = Field(
        default=1, ge=1, le=MAX_GPUS, description="model replicas (data-parallel degree)"
    )
    sharding: Sharding = Field(
        default="none",
        description="ZeRO stage across the data-parallel replicas: zero1 shards optimizer "
        "state, zero2 also gradients, zero3 also parameters",
    )
    tensor_parallel: int = Field(
        default=1, ge=1, le=MAX_GPUS, description="GPUs each layer is split across"
    )
    pipeline_parallel: int = Field(
        default=1, ge=1, le=MAX_GPUS, description="pipeline stages the layers are split into"
    )
    gpu_count: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GPUS,
        description="total GPUs; must equal tensor*pipeline*data parallel "
        "(data_parallel is derived from it when not given)",
    )
    tokens: int | None = Field(default=None, gt=0, le=10**18, description="training token budget")
    mfu: float = Field(default=0.4, gt=0, le=1, description="assumed model FLOP utilisation")
    target_gpu_memory_mb: int | None = Field(
        default=None,
        gt=0,
        le=10_000_000,
        description="memory (MiB) the suggestions must fit into, instead of the GPU's",
    )
    gpu_model: str | None = Field(
        default=None,
        min_length=1,
        max_length=96,
        description="GPU model the job would run on (the cluster's name, words of it, or a "
        "catalog name); default: the cluster's registered models, else the catalog's "
        "most common data-centre GPU",
    )
    pipeline_schedule: PipelineSchedule = Field(
        default="1f1b",
        description="pipeline schedule: 1f1b (the first stage holds p micro-batches) or "
        "gpipe (every stage holds all gradient_accumulation micro-batches)",
    )

    @model_validator(mode="after")
    def _check_combination(self) -> Self:
        if (self.parameters is None) == (self.transformer is None):
            raise ValueError("give exactly one of 'parameters' or 'transformer'")
        shape = self.transformer
        if shape is not None:
            if self.seq_len is not None and self.seq_len != shape.seq_len:
                raise ValueError(
                    f"seq_len ({self.seq_len}) conflicts with transformer.seq_len "
                    f"({shape.seq_len}); set only transformer.seq_len"
                )
            if shape.heads % self.tensor_parallel:
                raise ValueError(
                    f"tensor_parallel ({self.tensor_parallel}) must divide "
                    f"transformer.heads ({shape.heads})"
                )
            if shape.ffn % self.tensor_parallel:
                raise ValueError(
                    f"tensor_parallel ({self.tensor_parallel}) must divide "
                    f"transformer.ffn_hidden ({shape.ffn})"
                )
            if self.pipeline_parallel > shape.layers:
                raise ValueError(
                    f"pipeline_parallel ({self.pipeline_parallel}) must not exceed "
                    f"transformer.layers ({shape.layers})"
                )
        if self.gpu_count is not None:
            model_parallel = self.tensor_parallel * self.pipeline_parallel
            if "data_parallel" in self.model_fields_set:
                total = model_parallel * self.data_parallel
                if total != self.gpu_count:
                    raise ValueError(
                        f"gpu_count ({self.gpu_count}) must equal tensor_parallel * "
                        f"pipeline_parallel * data_parallel ({total})"
                    )
            else:
                if self.gpu_count % model_parallel:
                    raise ValueError(
                        f"gpu_count ({self.gpu_count}) must be a multiple of tensor_parallel "
                        f"* pipeline_parallel ({model_parallel})"
                    )
                self.data_parallel = self.gpu_count // model_parallel
        return self


class MemoryBreakdown(BaseModel):
    """Bytes per GPU, by component."""

    model_config = ConfigDict(extra="forbid")

    weights: int
    gradients: int
    optimizer_states: int
    activations: int
    overhead: int
    total: int


class BytesPerParameter(BaseModel):
    """Model-state bytes per parameter before any sharding or model parallelism."""

    model_config = ConfigDict(extra="forbid")

    weights: float
    gradients: float
    optimizer_states: float
    total: float


class TrainingTime(BaseModel):
    """Time to train on ``tokens`` tokens: 6 * P * tokens / (mfu * peak * gpus)."""

    model_config = ConfigDict(extra="forbid")

    gpu_count: int
    flops: float
    peak_tflops_per_gpu: float
    mfu: float
    seconds: float
    hours: float


class GpuFit(BaseModel):
    """Whether and from how many GPUs the request fits one GPU model."""

    model_config = ConfigDict(extra="forbid")

    gpu_model: str
    memory_mb: int
    fits_as_requested: bool
    total_bytes_as_requested: int
    min_gpu_count: int | None = Field(
        description="smallest tensor*pipeline*data parallel GPU count that fits; None if none"
    )
    min_data_parallel: int | None
    total_bytes_at_min: int | None = Field(description="per-GPU total at min_gpu_count")
    message: str
    training_time: TrainingTime | None = Field(
        default=None, description="at the requested GPU count (needs tokens)"
    )
    training_time_at_min: TrainingTime | None = Field(
        default=None, description="at min_gpu_count (needs tokens and a fit)"
    )


class Suggestion(BaseModel):
    """One concrete change to the request, with its own full estimate."""

    model_config = ConfigDict(extra="forbid")

    kind: SuggestionKind
    description: str
    changes: dict[str, str | int | bool]
    per_gpu_bytes: MemoryBreakdown
    total_bytes: int
    fits: bool
    target_bytes: int
    gpu_model: str | None = Field(
        description="GPU model judged against; None for an explicit target_gpu_memory_mb"
    )
    gpu_count: int = Field(description="GPUs the changed request runs on (t * p * d)")
    warnings: list[str] = Field(
        description="warnings the changed request raises that the request itself does not"
    )
    message: str = Field(description="the verdict, naming the GPU (or target) and its memory")


class EstimateResponse(BaseModel):
    """Result of :func:`app.estimator.estimate`."""

    model_config = ConfigDict(extra="forbid")

    parameters: int
    shape: TransformerShape
    shape_assumed: bool = Field(description="True if shape was derived from parameters")
    precision: Precision
    optimizer: Optimizer
    sharding: Sharding
    data_parallel: int
    tensor_parallel: int
    pipeline_parallel: int
    gpu_count: int
    micro_batch: int
    gradient_accumulation: int
    pipeline_schedule: PipelineSchedule
    global_batch: int = Field(description="sequences per step: micro * accumulation * dp")
    bytes_per_parameter: BytesPerParameter
    per_gpu_bytes: MemoryBreakdown
    per_gpu_mib: int = Field(description="ceil(per_gpu_bytes.total / 2**20)")
    formulas: dict[str, str]
    coefficients: dict[str, float] = Field(description="values substituted in formulas")
    training_flops: float | None = Field(description="6 * parameters * tokens")
    fits: dict[str, GpuFit]
    target_memory_mb: int | None = Field(
        description="target_gpu_memory_mb, else the smallest memory among the GPU models"
    )
    suggestions: list[Suggestion] = Field(
        description="verified changes, per GPU model the request does not fit as asked "
        "(in the order of fits), cheapest first"
    )
    warnings: list[str]
    assumptions: list[str]
