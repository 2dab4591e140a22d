"""Memory accounting against published figures and hand-worked examples."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.estimator import (
    CUDA_CONTEXT_BYTES,
    FRAGMENTATION_FRACTION,
    EstimateRequest,
    EstimateResponse,
    TransformerShape,
    assumed_shape,
    estimate,
    transformer_parameters,
)

# GPT-3 Small (Brown et al. 2020, table 2.1): L=12, h=768, a=12, s=2048, GPT-2 vocabulary.
GPT3_SMALL: dict[str, int] = {
    "layers": 12,
    "hidden": 768,
    "heads": 12,
    "vocab": 50257,
    "seq_len": 2048,
}


def run(**fields: Any) -> EstimateResponse:
    return estimate(EstimateRequest(**fields), gpu_models={})


def model_states(response: EstimateResponse) -> int:
    b = response.per_gpu_bytes
    return b.weights + b.gradients + b.optimizer_states


# --------------------------------------------------------------------------- model states


@pytest.mark.parametrize(
    ("precision", "optimizer", "weights", "gradients", "optimizer_states"),
    [
        # ZeRO paper (Rajbhandari et al. 2020) section 3.1: mixed-precision Adam, K = 12.
        ("mixed", "adam", 2, 2, 12),
        ("fp32", "adam", 4, 4, 8),
        ("bf16", "adam", 2, 2, 4),
        ("fp32", "sgd", 4, 4, 4),
        ("mixed", "sgd", 2, 2, 8),
        ("bf16", "sgd", 2, 2, 2),
        # 8-bit Adam (Dettmers et al. 2022): two 1-byte states, + fp32 master when mixed.
        ("fp32", "adam8bit", 4, 4, 2),
        ("mixed", "adam8bit", 2, 2, 6),
        ("bf16", "adam8bit", 2, 2, 2),
    ],
)
def test_bytes_per_parameter_table(
    precision: str, optimizer: str, weights: int, gradients: int, optimizer_states: int
) -> None:
    params = 1_000_000_000
    r = run(parameters=params, precision=precision, optimizer=optimizer)
    assert r.per_gpu_bytes.weights == weights * params
    assert r.per_gpu_bytes.gradients == gradients * params
    assert r.per_gpu_bytes.optimizer_states == optimizer_states * params
    assert r.bytes_per_parameter.total == weights + gradients + optimizer_states


def test_mixed_adam_is_16_bytes_per_parameter() -> None:
    r = run(parameters=1_000_000_000)
    assert model_states(r) == 16 * 1_000_000_000
    assert r.bytes_per_parameter.total == 16


def test_adafactor_factored_second_moment_is_rows_plus_columns() -> None:
    shape = TransformerShape(**GPT3_SMALL)
    params = transformer_parameters(shape)
    # Per layer: QKV (h x 3h) 4h + output 2h + MLP 2(h + 4h) = 16h, plus the vectors kept
    # in full (biases 5h + f = 9h, two LayerNorms 4h) = 13h: 29h = 22272; 12 layers 267264.
    # Embedding V + h = 51025; positions s + h = 2816; final LayerNorm 2h = 1536.
    factored = 4 * (12 * 29 * 768 + 50257 + 768 + 2048 + 768 + 2 * 768)
    assert factored == 4 * 322641
    fp32 = run(transformer=GPT3_SMALL, precision="fp32", optimizer="adafactor")
    assert fp32.per_gpu_bytes.optimizer_states == factored
    mixed = run(transformer=GPT3_SMALL, precision="mixed", optimizer="adafactor")
    assert mixed.per_gpu_bytes.optimizer_states == 4 * params + factored
    # Far below Adam's 8 bytes of states per parameter.
    assert fp32.bytes_per_parameter.optimizer_states < 0.011


def test_zero_stage_divides_the_right_components() -> None:
    base = run(parameters=8_000_000_000, data_parallel=8).per_gpu_bytes
    z1 = run(parameters=8_000_000_000, data_parallel=8, sharding="zero1").per_gpu_bytes
    z2 = run(parameters=8_000_000_000, data_parallel=8, sharding="zero2").per_gpu_bytes
    z3 = run(parameters=8_000_000_000, data_parallel=8, sharding="zero3").per_gpu_bytes
    assert (z1.weights, z1.gradients, z1.optimizer_states) == (
        base.weights,
        base.gradients,
        base.optimizer_states // 8,
    )
    assert (z2.weights, z2.gradients) == (base.weights, base.gradients // 8)
    assert (z3.weights, z3.gradients, z3.optimizer_states) == (
        base.weights // 8,
        base.gradients // 8,
        base.optimizer_states // 8,
    )


def test_tensor_and_pipeline_parallel_divide_model_states() -> None:
    shape = {**GPT3_SMALL, "layers": 16}
    base = run(transformer=shape)
    split = run(transformer=shape, tensor_parallel=4, pipeline_parallel=2)
    assert split.per_gpu_bytes.weights == math.ceil(base.per_gpu_bytes.weights / 8)
    assert split.per_gpu_bytes.optimizer_states == math.ceil(
        base.per_gpu_bytes.optimizer_states / 8
    )
    assert split.gpu_count == 8


# --------------------------------------------------------------------------- parameters


def test_transformer_parameter_count() -> None:
    shape = TransformerShape(**GPT3_SMALL)
    # 12*L*h^2 = 12*12*768^2 = 84,934,656; biases and LayerNorms 13*L*h = 119,808;
    # V*h = 50257*768 = 38,597,376; s*h = 2048*768 = 1,572,864; final LayerNorm 2h = 1,536
    # -> 125,226,240 (GPT-3 Small is quoted as 125M).
    assert transformer_parameters(shape) == 125_226_240


def test_gpt3_175b_parameter_count_close_to_published() -> None:
    shape = TransformerShape(layers=96, hidden=12288, heads=96, vocab=50257, seq_len=2048)
    assert transformer_parameters(shape) == pytest.approx(175e9, rel=0.005)


def test_ffn_hidden_changes_mlp_parameters() -> None:
    shape = TransformerShape(layers=2, hidden=64, heads=4, vocab=100, seq_len=16, ffn_hidden=128)
    layer = 4 * 64 * 64 + 2 * 64 * 128 + (5 * 64 + 128) + 2 * 2 * 64
    assert transformer_parameters(shape) == 2 * layer + 100 * 64 + 16 * 64 + 2 * 64


@pytest.mark.parametrize(
    ("field", "value", "difference"),
    [
        # A third h x f matrix and its bias.
        ("gated_ffn", True, 2 * (64 * 128 + 128)),
        # A separate V x h output head.
        ("tied_embeddings", False, 100 * 64),
        # No learned positions.
        ("position_embedding", "rotary", -16 * 64),
        # One weight (h) per norm instead of weight and bias (2h): 2 per layer + final.
        ("norm", "rmsnorm", -(2 * 2 + 1) * 64),
        # Q, K, V, output and MLP-output biases (5h) and the MLP-input bias (f) per layer.
        ("biases", False, -2 * (5 * 64 + 128)),
    ],
)
def test_each_architecture_field_counts_what_it_adds(
    field: str, value: object, difference: int
) -> None:
    shape = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "seq_len": 16, "ffn_hidden": 128}
    base = transformer_parameters(TransformerShape(**shape))
    changed = transformer_parameters(TransformerShape(**{**shape, field: value}))
    assert changed - base == difference


def test_assumed_shape_for_parameters_only() -> None:
    # 175B -> h = (128 * 175e9 / 12)^(1/3) = 12310 -> 12288 (96 * 128); the layers that hold
    # 175e9 at that h (embeddings, positions, biases and norms counted): 96.2 -> 96, GPT-3's.
    guess = assumed_shape(175_000_000_000)
    shape = guess.shape
    assert (shape.hidden, shape.heads, shape.layers, shape.seq_len) == (12288, 96, 96, 2048)
    assert guess.adjustments == ()
    r = run(parameters=175_000_000_000, seq_len=4096)
    assert r.shape_assumed
    assert r.shape.seq_len == 4096
    assert r.parameters == 175_000_000_000  # the given count is used, not the shape's
    assert r.per_gpu_bytes.activations > 0
    assert "ASSUMED shape" in r.assumptions[0]


@pytest.mark.parametrize("tensor_parallel", [2, 4, 8])
def test_assumed_heads_are_divisible_by_tensor_parallel(tensor_parallel: int) -> None:
    # 7B alone: h = 4210 -> 4224, 33 heads, which no t > 1 divides.  With t: h rounds to a
    # multiple of 128 * t instead, 4096 (32 heads), and the layers grow to keep 7e9.
    alone = assumed_shape(7_000_000_000).shape
    assert (alone.heads, alone.layers) == (33, 32)
    r = run(parameters=7_000_000_000, tensor_parallel=tensor_parallel)
    assert (r.shape.hidden, r.shape.heads, r.shape.layers) == (4096, 32, 34)
    assert r.shape.heads % tensor_parallel == 0
    adjusted = [a for a in r.assumptions if a.startswith("assumed shape adjusted")]
    assert adjusted == [
        "assumed shape adjusted: heads 33 -> 32 (hidden 4224 -> 4096) so that "
        f"tensor_parallel={tensor_parallel} divides them",
        "assumed shape adjusted: layers 32 -> 34 to keep about 7,000,000,000 parameters at "
        "hidden 4096",
    ]
    assert not any("not divisible" in w for w in r.warnings)


def test_assumed_layers_are_divisible_by_pipeline_parallel() -> None:
    r = run(parameters=7_000_000_000, pipeline_parallel=3)
    assert r.shape.layers == 33 and r.coefficients["n"] == 11
    assert (
        "assumed shape adjusted: layers 32 -> 33 so that pipeline_parallel=3 divides them"
        in r.assumptions
    )
    assert not any("not divisible by pipeline_parallel" in w for w in r.warnings)
    both = run(parameters=175_000_000_000, tensor_parallel=8, pipeline_parallel=16)
    assert both.shape.heads % 8 == 0 and both.shape.layers % 16 == 0
    # An explicit shape is the user's model: kept, with a warning.
    explicit = run(transformer=GPT3_SMALL, pipeline_parallel=5)
    assert explicit.shape.layers == 12
    assert any("not divisible by pipeline_parallel" in w for w in explicit.warnings)


# --------------------------------------------------------------------------- activations

# Hand-worked GPT-3 Small activations (Korthikanti et al. 2022, 16-bit activations):
# s*b*h = 2048 * 1 * 768 = 1,572,864; 5*a*s/h = 5 * 12 * 2048 / 768 = 160.
# Per layer, no recomputation, t = 1: s*b*h*(34 + 160) = 1,572,864 * 194 = 305,135,616 B.
# 12 layers: 3,661,627,392 B. fp32 logits: 4 * s * b * V = 4 * 2048 * 50257 = 411,705,344 B.
SMALL_LAYER = 305_135_616
SMALL_LOGITS = 411_705_344


def test_activations_gpt3_small_no_recompute() -> None:
    r = run(transformer=GPT3_SMALL)
    assert r.per_gpu_bytes.activations == 12 * SMALL_LAYER + SMALL_LOGITS == 4_073_332_736
    assert r.coefficients["A_layer"] == SMALL_LAYER


def test_activations_gpt3_small_checkpointing() -> None:
    # Full recomputation keeps each layer's input, 2*s*b*h = 3,145,728 B (x 12 = 37,748,736),
    # plus one layer recomputed in full during backward (305,135,616) and the logits.
    r = run(transformer=GPT3_SMALL, checkpointing=True)
    assert r.per_gpu_bytes.activations == 37_748_736 + SMALL_LAYER + SMALL_LOGITS == 754_589_696


def test_checkpointing_reduces_activations() -> None:
    for micro_batch in (1, 4, 16):
        plain = run(transformer=GPT3_SMALL, micro_batch=micro_batch)
        ckpt = run(transformer=GPT3_SMALL, micro_batch=micro_batch, checkpointing=True)
        assert ckpt.per_gpu_bytes.activations < plain.per_gpu_bytes.activations / 4
        assert ckpt.per_gpu_bytes.total < plain.per_gpu_bytes.total


def test_activations_scale_linearly_with_micro_batch() -> None:
    one = run(transformer=GPT3_SMALL).per_gpu_bytes.activations
    eight = run(transformer=GPT3_SMALL, micro_batch=8).per_gpu_bytes.activations
    assert eight == 8 * one


def test_activations_tensor_parallel_without_sequence_parallel() -> None:
    # Korthikanti eq. for t-way tensor parallelism without sequence parallelism:
    # s*b*h*(10 + 24/t + 5*a*s/(h*t)); t = 2: 1,572,864 * (10 + 12 + 80) = 160,432,128 per layer.
    # Logits are split over t (vocab-parallel cross entropy): 411,705,344 / 2 = 205,852,672.
    r = run(transformer=GPT3_SMALL, tensor_parallel=2)
    assert r.per_gpu_bytes.activations == 12 * 160_432_128 + 205_852_672


def test_activations_tensor_and_sequence_parallel() -> None:
    # With sequence parallelism everything is split: s*b*h*(34 + 5*a*s/h)/t = 305,135,616 / 2.
    r = run(transformer=GPT3_SMALL, tensor_parallel=2, sequence_parallel=True)
    assert r.per_gpu_bytes.activations == 12 * SMALL_LAYER // 2 + SMALL_LOGITS // 2


def test_activations_fp32() -> None:
    # e = 4: per layer s*b*((4e+2)h + 4e*h + 2e*f) + (2e+1)*a*s^2*b
    #      = s*b*h*(18 + 16 + 32) + 9*a*s^2*b = 1,572,864 * (66 + 9 * 32) = 556,793,856.
    r = run(transformer=GPT3_SMALL, precision="fp32")
    assert r.per_gpu_bytes.activations == 12 * 556_793_856 + SMALL_LOGITS


@pytest.mark.parametrize("gradient_accumulation", [1, 2, 4, 8])
def test_activations_pipeline_1f1b(gradient_accumulation: int) -> None:
    # p = 4 -> n = 3 layers per stage.  1F1B: the first stage runs p forwards before its
    # first backward, so it holds p * n = 12 layers' worth, the same as no pipelining
    # (Korthikanti sec. 4.2.3), whatever the accumulation.
    r = run(
        transformer=GPT3_SMALL, pipeline_parallel=4, gradient_accumulation=gradient_accumulation
    )
    assert r.pipeline_schedule == "1f1b"
    assert (r.coefficients["k"], r.coefficients["j"]) == (4, 1)
    assert r.per_gpu_bytes.activations == 12 * SMALL_LAYER
    schedule = [a for a in r.assumptions if a.startswith("pipeline schedule")]
    assert schedule and "p = 4 micro-batches in flight" in schedule[0]
    bubble = [w for w in r.warnings if "pipeline bubble" in w]
    assert bool(bubble) == (gradient_accumulation < 4)


def test_activations_pipeline_gpipe_holds_every_micro_batch() -> None:
    # GPipe: every stage keeps all 8 micro-batches; the last also their logits.
    r = run(
        transformer=GPT3_SMALL,
        pipeline_parallel=4,
        gradient_accumulation=8,
        pipeline_schedule="gpipe",
    )
    assert (r.coefficients["k"], r.coefficients["j"]) == (8, 8)
    assert r.per_gpu_bytes.activations == 8 * (3 * SMALL_LAYER + SMALL_LOGITS)
    assert any(a.startswith("pipeline schedule gpipe") for a in r.assumptions)
    # Without pipelining the schedule changes nothing and is not mentioned.
    plain = run(transformer=GPT3_SMALL, gradient_accumulation=8, pipeline_schedule="gpipe")
    assert plain.per_gpu_bytes.activations == 12 * SMALL_LAYER + SMALL_LOGITS
    assert not any(a.startswith("pipeline schedule") for a in plain.assumptions)


def test_gated_feed_forward_keeps_a_third_f_sized_tensor() -> None:
    # Fused SwiGLU keeps gate and up outputs (2e*sbf) and the down input (e*sbf): e*s*b*f
    # more per layer than GeLU's two, split over t like the rest of the MLP.
    gelu = run(transformer=GPT3_SMALL, tensor_parallel=2)
    swiglu = run(transformer={**GPT3_SMALL, "gated_ffn": True}, tensor_parallel=2)
    extra = 2 * 2048 * 1 * 4 * 768 // 2
    assert swiglu.coefficients["A_layer"] - gelu.coefficients["A_layer"] == extra


def test_uneven_pipeline_uses_busiest_stage() -> None:
    r = run(transformer=GPT3_SMALL, pipeline_parallel=5)  # ceil(12 / 5) = 3 layers
    assert r.coefficients["n"] == 3
    assert any("not divisible by pipeline_parallel" in w for w in r.warnings)


# --------------------------------------------------------------------------- overhead, total


def test_overhead_and_total() -> None:
    r = run(transformer=GPT3_SMALL)
    b = r.per_gpu_bytes
    tensors = b.weights + b.gradients + b.optimizer_states + b.activations
    assert b.overhead == math.ceil(CUDA_CONTEXT_BYTES + FRAGMENTATION_FRACTION * tensors)
    assert b.total == tensors + b.overhead
    assert r.per_gpu_mib == math.ceil(b.total / 2**20)


def test_zero3_adds_gathered_parameter_buffers() -> None:
    # Two gathered units of max(4h^2 + 2hf, V*h) 16-bit parameters: V*h = 38,597,376 here.
    r = run(transformer=GPT3_SMALL, data_parallel=4, sharding="zero3")
    assert r.coefficients["zero3_gathered"] == 2 * 2 * 50257 * 768


def test_formulas_cover_every_component() -> None:
    r = run(transformer=GPT3_SMALL, checkpointing=True)
    for key in ("weights", "gradients", "optimizer_states", "activations", "overhead", "total"):
        assert r.formulas[key]
    assert "A_kept = e*s*b*h; A_re = A_layer" in r.formulas["activations"]
