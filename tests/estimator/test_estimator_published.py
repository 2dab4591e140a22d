"""The estimator against published figures, one table per source."""

from __future__ import annotations

from typing import Any

import pytest

from app.estimator import EstimateRequest, EstimateResponse, TransformerShape, estimate
from app.estimator import transformer_parameters as count


def run(**fields: Any) -> EstimateResponse:
    return estimate(EstimateRequest(**fields), gpu_models={})


def model_states(response: EstimateResponse) -> int:
    b = response.per_gpu_bytes
    return b.weights + b.gradients + b.optimizer_states


# --------------------------------------------------------------------------- ZeRO

# Rajbhandari et al. 2020, "ZeRO": mixed-precision Adam keeps (2 + 2 + K) * Psi bytes of
# model states, K = 12; P_os divides K * Psi by N_d, P_os+g also the gradients' 2 * Psi,
# P_os+g+p everything.  Bytes per GPU, exact.
ZERO_CASES = [
    # Sec. 3.1: GPT-2 1.5B needs 24 GB of model states; here over N_d = 8.
    ("1.5B/8 none", 1_500_000_000, 8, "none", 24_000_000_000),
    ("1.5B/8 P_os", 1_500_000_000, 8, "zero1", 8_250_000_000),  # 4 Psi + 12 Psi / 8
    ("1.5B/8 P_os+g", 1_500_000_000, 8, "zero2", 5_625_000_000),  # 2 Psi + 14 Psi / 8
    ("1.5B/8 P_os+g+p", 1_500_000_000, 8, "zero3", 3_000_000_000),  # 16 Psi / 8
    # Figure 1: Psi = 7.5B, N_d = 64 -> 120 GB, 31.4 GB, 16.6 GB, 1.88 GB.
    ("7.5B/64 none", 7_500_000_000, 64, "none", 120_000_000_000),
    ("7.5B/64 P_os", 7_500_000_000, 64, "zero1", 31_406_250_000),
    ("7.5B/64 P_os+g", 7_500_000_000, 64, "zero2", 16_640_625_000),
    ("7.5B/64 P_os+g+p", 7_500_000_000, 64, "zero3", 1_875_000_000),
    # 175B over 1,024 ranks.
    ("175B/1024 none", 175_000_000_000, 1024, "none", 2_800_000_000_000),
    ("175B/1024 P_os", 175_000_000_000, 1024, "zero1", 702_050_781_250),
    ("175B/1024 P_os+g", 175_000_000_000, 1024, "zero2", 352_392_578_125),
    ("175B/1024 P_os+g+p", 175_000_000_000, 1024, "zero3", 2_734_375_000),
]


@pytest.mark.parametrize(
    ("parameters", "data_parallel", "sharding", "expected"),
    [case[1:] for case in ZERO_CASES],
    ids=[case[0] for case in ZERO_CASES],
)
def test_zero_paper_model_states(
    parameters: int, data_parallel: int, sharding: str, expected: int
) -> None:
    r = run(parameters=parameters, data_parallel=data_parallel, sharding=sharding)
    assert model_states(r) == expected


@pytest.mark.parametrize(
    ("sharding", "published_gb", "digits"),
    [("none", 120.0, 1), ("zero1", 31.4, 1), ("zero2", 16.6, 1), ("zero3", 1.88, 2)],
)
def test_zero_paper_figure_1_as_printed(sharding: str, published_gb: float, digits: int) -> None:
    r = run(parameters=7_500_000_000, data_parallel=64, sharding=sharding)
    assert round(model_states(r) / 1e9, digits) == published_gb


def test_fp32_adam_is_4_4_8_bytes_per_parameter() -> None:
    # The seeds' 10B fp32 Adam case: 40 GB weights + 40 GB gradients + 80 GB (m, v).
    b = run(parameters=10_000_000_000, precision="fp32").per_gpu_bytes
    assert (b.weights, b.gradients, b.optimizer_states) == (40e9, 40e9, 80e9)


# --------------------------------------------------------------------------- Korthikanti

# Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
# Models", table 2, per layer with 16-bit activations, for their GPT-3 175B (a = 96,
# s = 2048, h = 12288, b = 1) at t = 8: s*b*h = 25,165,824 and 5*a*s/h = 80.
GPT3 = {"layers": 96, "hidden": 12288, "heads": 96, "vocab": 50257, "seq_len": 2048}
SBH = 2048 * 12288
KORTHIKANTI_CASES = [
    # mode, request fields, coefficient, bytes
    ("no parallelism", {}, "A_layer", SBH * (34 + 80)),
    ("tensor parallel", {"tensor_parallel": 8}, "A_layer", SBH * (10 + 24 // 8 + 80 // 8)),
    (
        "tensor + sequence parallel",
        {"tensor_parallel": 8, "sequence_parallel": True},
        "A_layer",
        SBH * (34 + 80) // 8,
    ),
    ("full recomputation", {"tensor_parallel": 8, "checkpointing": True}, "A_kept", 2 * SBH),
    (
        "full recomputation + sequence parallel",
        {"tensor_parallel": 8, "sequence_parallel": True, "checkpointing": True},
        "A_kept",
        2 * SBH // 8,
    ),
]


@pytest.mark.parametrize(
    ("fields", "coefficient", "expected"),
    [case[1:] for case in KORTHIKANTI_CASES],
    ids=[case[0] for case in KORTHIKANTI_CASES],
)
def test_korthikanti_activations_per_layer(
    fields: dict[str, Any], coefficient: str, expected: int
) -> None:
    assert run(transformer=GPT3, **fields).coefficients[coefficient] == expected


def test_korthikanti_1f1b_first_stage_holds_p_micro_batches() -> None:
    # Sec. 4.2.3: with 1F1B the first stage holds p micro-batches of L/p layers, L layers'
    # worth: 8 * 12 * 23 * s*b*h = 55,566,139,392 bytes at t = p = 8, whatever the
    # accumulation (1 here, the default).
    r = run(transformer=GPT3, tensor_parallel=8, pipeline_parallel=8)
    assert r.coefficients["k"] == 8
    assert r.per_gpu_bytes.activations == 96 * 23 * SBH == 55_566_139_392
    assert any("pipeline schedule 1f1b" in a for a in r.assumptions)


# --------------------------------------------------------------------------- counts

COUNT_CASES = [
    # GPT-2 XL (Radford et al. 2019; Hugging Face gpt2-xl): 48 layers, 1600 wide,
    # 25 heads, 1024 learned positions, tied head, LayerNorm and biases.
    (
        "GPT-2 XL",
        TransformerShape(layers=48, hidden=1600, heads=25, vocab=50257, seq_len=1024),
        1_557_611_200,
    ),
    # LLaMA-2 7B (Touvron et al. 2023; meta-llama/Llama-2-7b-hf): SwiGLU f = 11008,
    # untied head, rotary positions, RMSNorm, no biases.
    (
        "LLaMA-2 7B",
        TransformerShape(
            layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096, architecture="llama"
        ),
        6_738_415_616,
    ),
    (
        "LLaMA-2 7B, every field spelled out",
        TransformerShape(
            layers=32,
            hidden=4096,
            heads=32,
            vocab=32000,
            seq_len=4096,
            ffn_hidden=11008,
            gated_ffn=True,
            tied_embeddings=False,
            position_embedding="rotary",
            norm="rmsnorm",
            biases=False,
        ),
        6_738_415_616,
    ),
]


@pytest.mark.parametrize(
    ("shape", "expected"),
    [case[1:] for case in COUNT_CASES],
    ids=[case[0] for case in COUNT_CASES],
)
def test_exact_parameter_counts(shape: TransformerShape, expected: int) -> None:
    assert count(shape) == expected
    assert run(transformer=shape.model_dump()).parameters == expected
