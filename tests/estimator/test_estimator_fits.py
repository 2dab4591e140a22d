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
    Suggestion,
    estimate,
    memory_request_mb,
)

MIB = 2**20
# Illustrative specs (dense peaks; fp32 peak = TF32 tensor cores).
A100_80 = GpuModelSpec(memory_mb=81920, peak_tflops_bf16=312, peak_tflops_fp32=156)
A100_40 = GpuModelSpec(memory_mb=40960, peak_tflops_bf16=312, peak_tflops_fp32=156)
H100 = GpuModelSpec(memory_mb=81559, peak_tflops_bf16=989.5, peak_tflops_fp32=494.7)
GPUS = {"a100-80gb": A100_80, "a100-40gb": A100_40}

# A 7B-class decoder (LLaMA-7B dimensions, GPT architecture): 6,583,623,680 parameters.
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
    assert r.parameters == 6_583_623_680
    fit = r.fits["a100-80gb"]
    assert not fit.fits_as_requested
    assert fit.min_gpu_count is None and fit.total_bytes_at_min is None
    assert fit.message.startswith("does not fit a100-80gb (81920 MiB) at any data-parallel degree")
    assert "sharding=none" in fit.message
    # The message quotes the cheapest verified fix for this GPU, not a list of guesses.
    first = next(s for s in r.suggestions if s.gpu_model == "a100-80gb")
    assert f"cheapest verified fix: {first.description} ({first.message})" in fit.message
    assert "precision=mixed" not in fit.message and "checkpointing=true" not in fit.message


def test_no_fit_message_quotes_a_fix_on_more_gpus_when_none_fits_the_requested_ones() -> None:
    r = run(GPUS, **{**FULL_FINETUNE, "checkpointing": True, "data_parallel": 1})
    fit = r.fits["a100-80gb"]
    assert fit.min_gpu_count is None
    assert "cheapest verified fix: sharding=zero1" in fit.message
    assert "data_parallel 1 -> 2 (2 GPUs" in fit.message


def test_fits_messages_name_the_gpu_and_its_memory() -> None:
    fields = {**FULL_FINETUNE, "sharding": "zero3", "checkpointing": True, "micro_batch": 1}
    r = run(GPUS, **fields)
    for name, gpu in GPUS.items():
        assert r.fits[name].message.startswith(f"fits {name} ({gpu.memory_mb} MiB) from ")


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


def reestimated(fields: dict[str, Any], suggestion: Suggestion) -> EstimateResponse:
    """The request with the suggestion's changes applied, estimated from scratch."""
    return run(**{**fields, **suggestion.changes})


def assert_verified(fields: dict[str, Any], r: EstimateResponse) -> None:
    for s in r.suggestions:
        again = reestimated(fields, s)
        assert s.total_bytes == s.per_gpu_bytes.total == again.per_gpu_bytes.total
        assert s.per_gpu_bytes == again.per_gpu_bytes
        assert s.fits == (again.per_gpu_bytes.total <= s.target_bytes)
        assert s.gpu_count == again.gpu_count
        assert set(s.warnings) <= set(again.warnings)
        # Only changes that differ from the request.
        for key, value in s.changes.items():
            assert fields.get(key, EstimateRequest.model_fields[key].default) != value


def test_suggestions_are_verified_combinations_cheapest_first() -> None:
    r = run(GPUS, **FULL_FINETUNE)
    assert r.per_gpu_bytes.total > 81920 * MIB
    assert_verified(FULL_FINETUNE, r)
    # Every listed suggestion fits the GPU it names: none offered unchecked.
    assert r.suggestions and all(s.fits for s in r.suggestions)
    # Grouped by GPU in the order of fits, each naming the GPU and its memory.
    assert [s.gpu_model for s in r.suggestions] == sorted(
        (s.gpu_model for s in r.suggestions), key=list(GPUS).index
    )
    for s in r.suggestions:
        assert s.gpu_model is not None
        memory_mb = GPUS[s.gpu_model].memory_mb
        assert s.target_bytes == memory_mb * MIB
        assert s.message.startswith(f"fits {s.gpu_model} ({memory_mb} MiB) at ")
    on_80 = [s.changes for s in r.suggestions if s.gpu_model == "a100-80gb"]
    on_40 = [s.changes for s in r.suggestions if s.gpu_model == "a100-40gb"]
    # Cheapest first: ZeRO-1 + checkpointing (cost 1 + 3) before ZeRO-1 with a 4x smaller
    # micro-batch (1 + 4) and ZeRO-3 with a 2x smaller one (3 + 4).
    assert on_80 == [
        {"sharding": "zero1", "checkpointing": True},
        {"sharding": "zero1", "micro_batch": 1, "gradient_accumulation": 4},
        {"sharding": "zero3", "micro_batch": 2, "gradient_accumulation": 2},
    ]
    # Alone, no change fits 40 GB; the combination that does is offered.
    assert on_40[0] == {"sharding": "zero2", "checkpointing": True}
    assert all(len(set(c) - {"gradient_accumulation"}) > 1 for c in on_40)
    for single in ({"sharding": "zero3"}, {"checkpointing": True}):
        assert reestimate(FULL_FINETUNE, single) > 40960 * MIB


def test_a_change_that_does_not_fit_alone_is_not_offered_alone() -> None:
    # 10B fp32 Adam on 8 GPUs of 80 GB: mixed precision alone (and checkpointing alone)
    # leave it far too large; combinations with ZeRO fit and are what is offered.
    fields: dict[str, Any] = {
        "parameters": 10_000_000_000,
        "precision": "fp32",
        "data_parallel": 8,
        "target_gpu_memory_mb": 81559,
    }
    r = run(**fields)
    assert reestimate(fields, {"precision": "mixed"}) > 81559 * MIB
    assert reestimate(fields, {"checkpointing": True}) > 81559 * MIB
    assert_verified(fields, r)
    changes = [s.changes for s in r.suggestions]
    assert {"precision": "mixed"} not in changes and {"checkpointing": True} not in changes
    assert {"sharding": "zero2", "checkpointing": True} in changes
    assert all(s.fits and s.gpu_model is None for s in r.suggestions)
    assert r.suggestions[0].message.startswith("fits target_gpu_memory_mb (81559 MiB) at ")


def test_a_fix_that_changes_more_than_another_fitting_fix_is_not_listed() -> None:
    r = run(GPUS, **FULL_FINETUNE)
    on_80 = [s.changes for s in r.suggestions if s.gpu_model == "a100-80gb"]
    # ZeRO-1 + checkpointing fits, so ZeRO-2 + checkpointing (a stronger version) is noise.
    assert {"sharding": "zero2", "checkpointing": True} not in on_80
    assert reestimate(FULL_FINETUNE, {"sharding": "zero2", "checkpointing": True}) <= (81920 * MIB)


def test_more_gpus_only_when_nothing_fits_the_requested_ones() -> None:
    one_gpu = {**FULL_FINETUNE, "micro_batch": 1, "data_parallel": 1}
    r = run({"h100": H100}, **one_gpu)
    assert_verified(one_gpu, r)
    assert r.suggestions and all(s.fits for s in r.suggestions)
    assert all(s.gpu_count > 1 for s in r.suggestions)
    assert [s.gpu_count for s in r.suggestions] == sorted(s.gpu_count for s in r.suggestions)
    first = r.suggestions[0]
    assert first.changes == {"sharding": "zero1", "checkpointing": True, "data_parallel": 2}
    assert "data_parallel 1 -> 2 (2 GPUs; global batch 1 -> 2)" in first.description
    # On 8 GPUs a fix exists on the GPUs asked for: no suggestion asks for more.
    eight = run({"h100": H100}, **{**one_gpu, "data_parallel": 8})
    assert eight.suggestions and all(s.gpu_count == 8 for s in eight.suggestions)


def test_more_data_parallel_keeps_the_global_batch_where_accumulation_allows() -> None:
    fields = {**FULL_FINETUNE, "micro_batch": 1, "data_parallel": 1, "gradient_accumulation": 8}
    r = run({"h100": H100}, **fields)
    first = r.suggestions[0]
    assert first.changes["data_parallel"] == 2 and first.changes["gradient_accumulation"] == 4
    assert "global batch 8 unchanged with gradient_accumulation 8 -> 4" in first.description
    assert_verified(fields, r)


def test_a_suggestion_that_raises_a_warning_carries_it_and_comes_last() -> None:
    # 32 x 6144 on 2 pipeline stages x 4 data-parallel ranks: ZeRO-3 alone would be the
    # cheapest, but ZeRO-2/3 with a pipeline is a warning the request does not have.
    fields: dict[str, Any] = {
        "transformer": {
            "layers": 32,
            "hidden": 6144,
            "heads": 48,
            "vocab": 50257,
            "seq_len": 2048,
        },
        "pipeline_parallel": 2,
        "data_parallel": 4,
        "gradient_accumulation": 2,
    }
    r = run({"h100": H100}, **fields)
    assert_verified(fields, r)
    assert [s.changes for s in r.suggestions] == [
        {"sharding": "zero1", "checkpointing": True},
        {"sharding": "zero3"},
    ]
    clean, warned = r.suggestions
    assert clean.warnings == []
    (warning,) = warned.warnings
    assert "ZeRO-2/ZeRO-3 with pipeline parallelism" in warning
    assert warning in reestimated(fields, warned).warnings
    assert warning not in r.warnings
    assert "with a warning the request does not have" in warned.message


def test_gpt3_on_h100s_gets_the_fix_the_h200_yardstick_hid() -> None:
    # GPT-3 175B at t = 8, p = 8: 98 GiB per GPU, which fits an H200 (so no advice came)
    # but not the H100 the job runs on.  Checkpointing, on the same 64 GPUs, does.
    fields: dict[str, Any] = {
        "parameters": 175_000_000_000,
        "tensor_parallel": 8,
        "pipeline_parallel": 8,
    }
    r = run({"h100": H100}, **fields)
    assert 81559 * MIB < r.per_gpu_bytes.total < 143771 * MIB
    first = r.suggestions[0]
    assert first.changes == {"checkpointing": True}
    assert first.fits and first.gpu_count == 64
    assert_verified(fields, r)


def test_micro_batch_suggestion_keeps_global_batch() -> None:
    fields = {
        **FULL_FINETUNE,
        "sharding": "zero3",
        "checkpointing": True,
        "micro_batch": 16,
        "gradient_accumulation": 2,
        "target_gpu_memory_mb": 20000,
    }
    r = run(**fields)
    (mb,) = r.suggestions
    assert mb.kind == "micro_batch"
    assert mb.changes == {"micro_batch": 2, "gradient_accumulation": 16}
    assert "global batch 256 unchanged" in mb.description
    # The largest micro-batch that fits: the next larger divisor of 32 does not.
    assert reestimate(fields, {"micro_batch": 4, "gradient_accumulation": 8}) > 20000 * MIB
    assert_verified(fields, r)


def test_when_nothing_fits_the_one_suggestion_says_so() -> None:
    fields = {"transformer": {**SEVEN_B, "seq_len": 262144}}
    r = run({"h100": H100}, **fields)
    (everything,) = r.suggestions
    assert not everything.fits
    assert everything.changes == {"checkpointing": True}
    assert "still does not fit h100 (81559 MiB)" in everything.message
    assert "only more tensor_parallel or pipeline_parallel is left" in everything.message
    assert "still does not fit" in r.fits["h100"].message
    assert_verified(fields, r)
    # Nothing left to change: no suggestion at all.
    none_left = run(
        {"h100": H100}, **{**fields, "checkpointing": True, "sharding": "zero3", "data_parallel": 2}
    )
    assert none_left.suggestions == []


def test_a_change_past_a_bound_is_not_suggested() -> None:
    # At gradient_accumulation 4 a smaller micro-batch is among the fixes; at 1,000,000 it
    # would push the accumulation past its bound: not a valid request, so not offered.
    fields = {**FULL_FINETUNE, "gradient_accumulation": 4}
    assert any("micro_batch" in s.changes for s in run({"h100": H100}, **fields).suggestions)
    bounded = {**FULL_FINETUNE, "gradient_accumulation": 1_000_000}
    r = run({"h100": H100}, **bounded)
    assert [s.changes for s in r.suggestions] == [{"sharding": "zero1", "checkpointing": True}]
    assert_verified(bounded, r)
    # An assumed shape follows even an absurd parallelism without failing.
    absurd = run({"h100": H100}, parameters=10**15, tensor_parallel=2**20)
    assert absurd.shape.heads % 2**20 == 0


def test_no_suggestions_when_request_fits() -> None:
    r = run(GPUS, **{**FULL_FINETUNE, "sharding": "zero3", "checkpointing": True})
    assert r.per_gpu_bytes.total <= 81920 * MIB
    assert r.suggestions == []


def test_suggestions_only_for_the_gpus_it_does_not_fit() -> None:
    fields = {**FULL_FINETUNE, "sharding": "zero3", "checkpointing": True, "micro_batch": 16}
    r = run(GPUS, **fields)
    assert r.fits["a100-80gb"].fits_as_requested
    assert not r.fits["a100-40gb"].fits_as_requested
    assert r.suggestions and {s.gpu_model for s in r.suggestions} == {"a100-40gb"}
    assert r.target_memory_mb == 40960


def test_explicit_target_overrides_the_gpus() -> None:
    fields = {**FULL_FINETUNE, "sharding": "zero3", "checkpointing": True}
    r = run(GPUS, target_gpu_memory_mb=8192, **fields)
    assert r.target_memory_mb == 8192
    assert r.suggestions
    assert all(s.target_bytes == 8192 * MIB and s.gpu_model is None for s in r.suggestions)


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


architectures = st.fixed_dictionaries(
    {},
    optional={
        "architecture": st.sampled_from(["gpt", "llama"]),
        "gated_ffn": st.booleans(),
        "tied_embeddings": st.booleans(),
        "position_embedding": st.sampled_from(["learned", "rotary"]),
        "norm": st.sampled_from(["layernorm", "rmsnorm"]),
        "biases": st.booleans(),
    },
)


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    """A valid request: an explicit shape (any architecture) or a parameter count, with
    parallelism the shape allows."""
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    fields: dict[str, Any] = {
        "precision": draw(st.sampled_from(["fp32", "mixed", "bf16"])),
        "optimizer": draw(st.sampled_from(["adam", "sgd", "adafactor", "adam8bit"])),
        "sharding": draw(st.sampled_from(["none", "zero1", "zero2", "zero3"])),
        "micro_batch": draw(st.integers(1, 16)),
        "gradient_accumulation": draw(st.integers(1, 16)),
        "checkpointing": draw(st.booleans()),
        "sequence_parallel": draw(st.booleans()) and tp > 1,
        "data_parallel": draw(st.integers(1, 64)),
        "tensor_parallel": tp,
        "pipeline_parallel": pp,
        "pipeline_schedule": draw(st.sampled_from(["1f1b", "gpipe"])),
    }
    if draw(st.booleans()):
        fields["parameters"] = draw(st.integers(10**8, 2 * 10**11))
        fields["seq_len"] = draw(st.sampled_from([512, 2048, 8192]))
    else:
        heads = tp * draw(st.sampled_from([1, 2, 4, 8]))
        fields["transformer"] = {
            "layers": pp * draw(st.integers(1, 24)),
            "hidden": heads * draw(st.sampled_from([64, 128])),
            "heads": heads,
            "vocab": draw(st.integers(1000, 130_000)),
            "seq_len": draw(st.sampled_from([512, 2048, 8192])),
            **draw(architectures),
        }
    return fields


@settings(max_examples=80, deadline=None)
@given(
    fields=requests(),
    memories=st.lists(st.integers(8_000, 200_000), min_size=1, max_size=3, unique=True),
)
def test_every_suggestion_marked_fitting_fits_when_reestimated(
    fields: dict[str, Any], memories: list[int]
) -> None:
    gpus = {
        f"gpu-{memory_mb}": GpuModelSpec(
            memory_mb=memory_mb, peak_tflops_bf16=100, peak_tflops_fp32=50
        )
        for memory_mb in memories
    }
    r = run(gpus, **fields)
    for name, fit in r.fits.items():
        capacity = gpus[name].memory_mb * MIB
        mine = [s for s in r.suggestions if s.gpu_model == name]
        # Advice exactly for the GPUs it does not fit as asked.
        assert bool(mine) <= (not fit.fits_as_requested)
        for s in mine:
            again = reestimated(fields, s)
            if s.fits:
                assert again.per_gpu_bytes.total <= capacity
            assert again.per_gpu_bytes.total == s.total_bytes
            assert again.gpu_count == s.gpu_count
            assert set(s.warnings) <= set(again.warnings)
        if any(s.fits for s in mine):
            assert all(s.fits for s in mine)
            # Cheapest first: no new warning before one, then fewer GPUs first.
            keys = [(bool(s.warnings), s.gpu_count) for s in mine]
            assert keys == sorted(keys)
        else:
            assert len(mine) <= 1
