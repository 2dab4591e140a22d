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
    # Per layer: QKV (h x 3h) 4h + output 2h + MLP 2(h + 4h) = 8h + 2*4h = 16h = 12288.
    # 12 layers: 147456; embedding V + h = 51025; positions s + h = 2816 -> 201297 fp32.
    factored = 4 * (12 * 16 * 768 + 50257 + 768 + 2048 + 768)
    assert factored == 4 * 201297
    fp32 = run(transformer=GPT3_SMALL, precision="fp32", optimizer="adafactor")
    assert fp32.per_gpu_bytes.optimizer_states == factored
    mixed = run(transformer=GPT3_SMALL, precision="mixed", optimizer="adafactor")
    assert mixed.per_gpu_bytes.optimizer_states == 4 * params + factored
    # Far below Adam's 8 bytes of states per parameter.
    assert fp32.bytes_per_parameter.optimizer_states < 0.01


# ZeRO paper, figure 1: Psi = 7.5B, N_d = 64, K = 12; model-state memory per GPU in GB.
@pytest.mark.parametrize(
    ("sharding", "expected_gb", "digits"),
    [
        ("none", 120.0, 1),  # (2 + 2 + K) * Psi
        ("zero1", 31.4, 1),  # 2 Psi + 2 Psi + K Psi / N_d
        ("zero2", 16.6, 1),  # 2 Psi + (2 + K) Psi / N_d
        ("zero3", 1.88, 2),  # (2 + 2 + K) Psi / N_d
    ],
)
def test_zero_paper_figure_1(sharding: str, expected_gb: float, digits: int) -> None:
    r = run(parameters=7_500_000_000, data_parallel=64, sharding=sharding)
    assert round(model_states(r) / 1e9, digits) == expected_gb


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
    # 12*L*h^2 = 12*12*768^2 = 84,934,656; V*h = 50257*768 = 38,597,376;
    # s*h = 2048*768 = 1,572,864 -> 125,104,896 (GPT-3 Small is quoted as 125M).
    assert transformer_parameters(shape) == 125_104_896


def test_gpt3_175b_parameter_count_close_to_published() -> None:
    shape = TransformerShape(layers=96, hidden=12288, heads=96, vocab=50257, seq_len=2048)
    assert transformer_parameters(shape) == pytest.approx(175e9, rel=0.005)


def test_ffn_hidden_changes_mlp_parameters() -> None:
    shape = TransformerShape(layers=2, hidden=64, heads=4, vocab=100, seq_len=16, ffn_hidden=128)
    assert transformer_parameters(shape) == 2 * (4 * 64 * 64 + 2 * 64 * 128) + 100 * 64 + 16 * 64


def test_assumed_shape_for_parameters_only() -> None:
    # 175B -> h = (128 * 175e9 / 12)^(1/3) = 12310 -> 12288 (96 * 128); L = round(96.6) = 97.
    shape = assumed_shape(175_000_000_000)
    assert (shape.hidden, shape.heads, shape.layers, shape.seq_len) == (12288, 96, 97, 2048)
    r = run(parameters=175_000_000_000, seq_len=4096)
    assert r.shape_assumed
    assert r.shape.seq_len == 4096
    assert r.parameters == 175_000_000_000  # the given count is used, not the shape's
    assert r.per_gpu_bytes.activations > 0
    assert "ASSUMED shape" in r.assumptions[0]


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


def test_activations_pipeline_parallel() -> None:
    # p = 4 -> n = 3 layers per stage.  With >= p micro-batches in flight (1F1B) the first
    # stage holds p * n = 12 layers' worth: the same as no pipelining (Korthikanti sec. 4.2.3).
    full = run(transformer=GPT3_SMALL, pipeline_parallel=4, gradient_accumulation=8)
    assert full.per_gpu_bytes.activations == 12 * SMALL_LAYER
    # A single micro-batch: the last stage (3 layers + logits) is the largest.
    single = run(transformer=GPT3_SMALL, pipeline_parallel=4)
    assert single.per_gpu_bytes.activations == 3 * SMALL_LAYER + SMALL_LOGITS


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
