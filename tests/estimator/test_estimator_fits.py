"""GPU fit search, training time, suggestions and memory_request_mb."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.estimator import (
    EstimateRequest,
    EstimateResponse,
    GpuModelSpec,
    estimate,
    memory_request_mb,
)

MIB = 2**20
# Illustrative specs (dense peaks; fp32 peak = TF32 tensor cores).
A100_80 = GpuModelSpec(memory_mb=81920, peak_tflops_bf16=312, peak_tflops_fp32=156)
A100_40 = GpuModelSpec(memory_mb=40960, peak_tflops_bf16=312, peak_tflops_fp32=156)
GPUS = {"a100-80gb": A100_80, "a100-40gb": A100_40}

# A 7B-class decoder (LLaMA-7B dimensions, non-gated MLP): 6,581,911,552 parameters.
SEVEN_B: dict[str, int] = {
    "layers": 32,
    "hidden": 4096,
    "heads": 32,
    "vocab": 32000,
    "seq_len": 2048,
}
FULL_FINETUNE: dict[str, Any] = {
    "transformer": SEVEN_B,
    "precision": "mixed",
    "optimizer": "adam",
    "micro_batch": 4,
    "data_parallel": 8,
}


def run(gpu_models: dict[str, GpuModelSpec] | None = None, **fields: Any) -> EstimateResponse:
    return estimate(EstimateRequest(**fields), gpu_models=gpu_models or {})


def reestimate(fields: dict[str, Any], changes: dict[str, Any]) -> int:
    return run(**{**fields, **changes}).per_gpu_bytes.total


# --------------------------------------------------------------------------- fits


def test_sharding_none_does_not_fit_at_any_data_parallel_degree() -> None:
    r = run(GPUS, **FULL_FINETUNE)
    assert r.parameters == 6_581_911_552
    fit = r.fits["a100-80gb"]
    assert not fit.fits_as_requested
    assert fit.min_gpu_count is None and fit.total_bytes_at_min is None
    assert fit.message.startswith("does not fit at any data-parallel degree")
    assert "sharding=none" in fit.message
    assert "checkpointing=true" in fit.message


def test_no_fit_message_names_the_sharding_that_would_fit() -> None:
    r = run(GPUS, **{**FULL_FINETUNE, "checkpointing": True, "data_parallel": 1})
    fit = r.fits["a100-80gb"]
    assert fit.min_gpu_count is None
    assert "sharding=zero3 (fits from data_parallel=" in fit.message


def test_min_gpu_count_is_the_boundary() -> None:
    fields = {**FULL_FINETUNE, "sharding": "zero3", "checkpointing": True, "micro_batch": 1}
    r = run(GPUS, **fields)
    for name, gpu in GPUS.items():
        fit = r.fits[name]
        dp = fit.min_data_parallel
        assert dp is not None and fit.min_gpu_count == dp
        capacity = gpu.memory_mb * MIB
        at_min = run(**{**fields, "data_parallel": dp}).per_gpu_bytes.total
        assert at_min == fit.total_bytes_at_min
        assert at_min <= capacity
        if dp > 1:
            assert run(**{**fields, "data_parallel": dp - 1}).per_gpu_bytes.total > capacity
    small, large = r.fits["a100-40gb"].min_gpu_count, r.fits["a100-80gb"].min_gpu_count
    assert small is not None and large is not None and small >= large


def test_min_gpu_count_includes_model_parallel() -> None:
    fields = {
        "transformer": SEVEN_B,
        "sharding": "zero1",
        "checkpointing": True,
        "tensor_parallel": 2,
        "pipeline_parallel": 2,
    }
    fit = run(GPUS, **fields).fits["a100-40gb"]
    assert fit.min_data_parallel is not None
    assert fit.min_gpu_count == 4 * fit.min_data_parallel


def test_small_model_fits_on_one_gpu() -> None:
    fit = run(GPUS, transformer={**SEVEN_B, "layers": 2, "hidden": 1024, "heads": 8}).fits[
        "a100-40gb"
    ]
    assert fit.fits_as_requested and fit.min_gpu_count == 1


# --------------------------------------------------------------------------- time


def test_training_time_from_6_p_tokens() -> None:
    r = run(GPUS, parameters=10**9, tokens=10**11, data_parallel=8)
    assert r.training_flops == 6e20
    t = r.fits["a100-80gb"].training_time
    assert t is not None
    # 6e20 / (0.4 * 312e12 * 8) = 600,961.5 s = 166.9 h
    assert t.seconds == pytest.approx(6e20 / (0.4 * 312e12 * 8))
    assert t.hours == pytest.approx(t.seconds / 3600)
    assert t.gpu_count == 8 and t.peak_tflops_per_gpu == 312


def test_training_time_fp32_uses_fp32_peak_and_mfu() -> None:
    r = run(GPUS, parameters=10**9, tokens=10**9, precision="fp32", mfu=0.5)
    t = r.fits["a100-40gb"].training_time
    assert t is not None
    assert t.seconds == pytest.approx(6e18 / (0.5 * 156e12))


def test_training_time_absent_without_tokens() -> None:
    r = run(GPUS, parameters=10**9)
    assert r.training_flops is None
    assert r.fits["a100-80gb"].training_time is None


# --------------------------------------------------------------------------- suggestions


def test_suggestions_make_7b_full_finetune_fit_on_80gb() -> None:
    r = run(GPUS, **FULL_FINETUNE)
    target = 81920 * MIB
    assert r.target_memory_mb == 81920
    assert r.per_gpu_bytes.total > target
    assert r.suggestions
    kinds = [s.kind for s in r.suggestions]
    assert kinds == ["sharding", "sharding", "checkpointing", "micro_batch", "combined"]
    fitting = [s for s in r.suggestions if s.fits]
    assert fitting, "some suggestion must fit on 80 GB"
    combined = r.suggestions[-1]
    assert combined.fits
    assert combined.changes == {"sharding": "zero2", "checkpointing": True}
    for s in r.suggestions:
        # Each suggestion is a full new estimate of the changed request.
        assert s.total_bytes == s.per_gpu_bytes.total == reestimate(FULL_FINETUNE, s.changes)
        assert s.fits == (s.total_bytes <= target)
        assert s.target_bytes == target
        # Only changes that differ from the request.
        for key, value in s.changes.items():
            assert FULL_FINETUNE.get(key, EstimateRequest.model_fields[key].default) != value


def test_micro_batch_suggestion_keeps_global_batch() -> None:
    fields = {**FULL_FINETUNE, "micro_batch": 8, "gradient_accumulation": 2}
    r = run(GPUS, **fields)
    (mb,) = [s for s in r.suggestions if s.kind == "micro_batch"]
    new_mb = mb.changes["micro_batch"]
    new_ga = mb.changes["gradient_accumulation"]
    assert isinstance(new_mb, int) and isinstance(new_ga, int)
    assert new_mb < 8 and new_mb * new_ga == 16
    assert "global batch 128 unchanged" in mb.description


def test_fp32_request_gets_mixed_precision_suggestion() -> None:
    r = run(target_gpu_memory_mb=40960, **{**FULL_FINETUNE, "precision": "fp32"})
    (precision,) = [s for s in r.suggestions if s.kind == "precision"]
    assert precision.changes == {"precision": "mixed"}
    assert precision.total_bytes < r.per_gpu_bytes.total


def test_no_sharding_suggestion_at_one_data_parallel_rank() -> None:
    r = run(GPUS, **{**FULL_FINETUNE, "data_parallel": 1})
    assert all(s.kind != "sharding" for s in r.suggestions)
    assert "sharding suggestions need data_parallel > 1" in r.assumptions
    # 16 bytes/param of unsharded model states (105 GB) cannot fit 80 GB: reported honestly.
    assert not any(s.fits for s in r.suggestions)


def test_no_suggestions_when_request_fits() -> None:
    r = run(GPUS, **{**FULL_FINETUNE, "sharding": "zero3", "checkpointing": True})
    assert r.per_gpu_bytes.total <= 81920 * MIB
    assert r.suggestions == []


def test_explicit_target_overrides_largest_gpu() -> None:
    fields = {**FULL_FINETUNE, "sharding": "zero3", "checkpointing": True}
    r = run(GPUS, target_gpu_memory_mb=8192, **fields)
    assert r.target_memory_mb == 8192
    assert r.suggestions and all(s.target_bytes == 8192 * MIB for s in r.suggestions)


def test_no_target_no_suggestions() -> None:
    r = run(**FULL_FINETUNE)
    assert r.target_memory_mb is None and r.suggestions == []


# --------------------------------------------------------------------------- memory_request_mb


def test_memory_request_mb() -> None:
    fields = {**FULL_FINETUNE, "sharding": "zero3", "checkpointing": True}
    r = run(**fields)
    expected = math.ceil(r.per_gpu_bytes.total / MIB)
    assert r.per_gpu_mib == expected
    assert memory_request_mb(r) == expected
    assert memory_request_mb(EstimateRequest(**fields)) == expected
    assert memory_request_mb(fields) == expected  # a model description from a job spec
    assert memory_request_mb(r, headroom_fraction=0.1) == math.ceil(
        r.per_gpu_bytes.total * 1.1 / MIB
    )
    with pytest.raises(ValueError, match="headroom_fraction"):
        memory_request_mb(r, headroom_fraction=-0.1)


# --------------------------------------------------------------------------- properties

shapes = st.builds(
    lambda layers, head_dim, heads, vocab, seq_len: {
        "layers": layers,
        "hidden": head_dim * heads,
        "heads": heads,
        "vocab": vocab,
        "seq_len": seq_len,
    },
    st.integers(2, 64),
    st.sampled_from([32, 64, 128]),
    st.sampled_from([4, 8, 16, 32]),
    st.integers(1000, 130_000),
    st.sampled_from([128, 512, 2048, 8192]),
)


@settings(max_examples=60, deadline=None)
@given(
    shape=shapes,
    micro_batch=st.integers(1, 16),
    dp=st.integers(2, 256),
    precision=st.sampled_from(["fp32", "mixed", "bf16"]),
    optimizer=st.sampled_from(["adam", "sgd", "adafactor", "adam8bit"]),
)
def test_properties(
    shape: dict[str, int], micro_batch: int, dp: int, precision: str, optimizer: str
) -> None:
    common: dict[str, Any] = {
        "transformer": shape,
        "micro_batch": micro_batch,
        "data_parallel": dp,
        "precision": precision,
        "optimizer": optimizer,
    }
    states = []
    for sharding in ("none", "zero1", "zero2", "zero3"):
        b = run(**common, sharding=sharding).per_gpu_bytes
        states.append(b.weights + b.gradients + b.optimizer_states)
        assert b.total == b.weights + b.gradients + b.optimizer_states + b.activations + b.overhead
    assert states == sorted(states, reverse=True)
    plain = run(**common).per_gpu_bytes.activations
    assert run(**common, checkpointing=True).per_gpu_bytes.activations < plain
