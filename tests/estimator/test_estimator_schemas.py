"""Request validation: impossible inputs are rejected with errors naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.estimator import EstimateRequest, GpuModelSpec, TransformerShape, estimate

SHAPE: dict[str, int] = {"layers": 4, "hidden": 256, "heads": 8, "vocab": 1000, "seq_len": 128}


def error_of(**fields: Any) -> tuple[tuple[str | int, ...], str]:
    with pytest.raises(ValidationError) as info:
        EstimateRequest(**fields)
    errors = info.value.errors()
    assert len(errors) >= 1
    return errors[0]["loc"], str(info.value)


@pytest.mark.parametrize(
    ("fields", "loc"),
    [
        ({"parameters": -5}, ("parameters",)),
        ({"parameters": 0}, ("parameters",)),
        ({"parameters": True}, ("parameters",)),  # not read as 1 parameter
        ({"transformer": {**SHAPE, "layers": True}}, ("transformer", "layers")),
        ({"parameters": 10**9, "optimizer": "lion"}, ("optimizer",)),
        ({"parameters": 10**9, "precision": "fp8"}, ("precision",)),
        ({"parameters": 10**9, "sharding": "zero4"}, ("sharding",)),
        ({"parameters": 10**9, "micro_batch": 0}, ("micro_batch",)),
        ({"parameters": 10**9, "data_parallel": 0}, ("data_parallel",)),
        ({"parameters": 10**9, "tensor_parallel": -1}, ("tensor_parallel",)),
        ({"parameters": 10**9, "pipeline_parallel": 0}, ("pipeline_parallel",)),
        ({"parameters": 10**9, "mfu": 0}, ("mfu",)),
        ({"parameters": 10**9, "mfu": 1.5}, ("mfu",)),
        ({"parameters": 10**9, "tokens": -1}, ("tokens",)),
        ({"parameters": 10**9, "seq_len": 0}, ("seq_len",)),
        ({"parameters": 10**9, "batch": 4}, ("batch",)),  # extra="forbid"
        ({"transformer": {**SHAPE, "layers": 0}}, ("transformer", "layers")),
        ({"transformer": {**SHAPE, "dropout": 0.1}}, ("transformer", "dropout")),
    ],
)
def test_field_errors_name_the_field(fields: dict[str, Any], loc: tuple[str, ...]) -> None:
    assert error_of(**fields)[0] == loc


def test_both_parameters_and_transformer_rejected() -> None:
    _, message = error_of(parameters=10**9, transformer=SHAPE)
    assert "exactly one of 'parameters' or 'transformer'" in message


def test_neither_parameters_nor_transformer_rejected() -> None:
    _, message = error_of()
    assert "exactly one of 'parameters' or 'transformer'" in message


def test_heads_must_divide_hidden() -> None:
    loc, message = error_of(transformer={**SHAPE, "heads": 7})
    assert loc == ("transformer",)
    assert "transformer.hidden (256) must be divisible by transformer.heads (7)" in message


def test_tensor_parallel_must_divide_heads() -> None:
    _, message = error_of(transformer=SHAPE, tensor_parallel=3)
    assert "tensor_parallel (3) must divide transformer.heads (8)" in message


def test_tensor_parallel_must_divide_ffn_hidden() -> None:
    _, message = error_of(transformer={**SHAPE, "ffn_hidden": 1002}, tensor_parallel=4)
    assert "transformer.ffn_hidden (1002)" in message


def test_pipeline_parallel_cannot_exceed_layers() -> None:
    _, message = error_of(transformer=SHAPE, pipeline_parallel=5)
    assert "pipeline_parallel (5) must not exceed transformer.layers (4)" in message


def test_seq_len_conflicting_with_transformer() -> None:
    _, message = error_of(transformer=SHAPE, seq_len=256)
    assert "seq_len (256) conflicts with transformer.seq_len (128)" in message
    EstimateRequest(transformer=SHAPE, seq_len=128)  # the same value is accepted


def test_gpu_count_derives_or_checks_data_parallel() -> None:
    derived = EstimateRequest(parameters=10**9, gpu_count=16, tensor_parallel=2)
    assert derived.data_parallel == 8
    EstimateRequest(parameters=10**9, gpu_count=16, tensor_parallel=2, data_parallel=8)
    _, message = error_of(parameters=10**9, gpu_count=16, data_parallel=4)
    assert "gpu_count (16) must equal" in message
    _, message = error_of(parameters=10**9, gpu_count=6, tensor_parallel=4)
    assert "gpu_count (6) must be a multiple" in message


def test_zero3_with_one_data_parallel_rank_warns_not_rejects() -> None:
    r = estimate(EstimateRequest(parameters=10**9, sharding="zero3"), gpu_models={})
    assert any("data_parallel=1" in w for w in r.warnings)


def test_defaults() -> None:
    r = EstimateRequest(parameters=10**9)
    assert (r.precision, r.optimizer, r.sharding, r.mfu) == ("mixed", "adam", "none", 0.4)
    assert (r.micro_batch, r.data_parallel, r.tensor_parallel, r.pipeline_parallel) == (1, 1, 1, 1)
    assert r.transformer is None and not r.checkpointing


def test_request_round_trips_through_json() -> None:
    r = EstimateRequest(transformer=SHAPE, sharding="zero2", data_parallel=4, tokens=10**9)
    assert EstimateRequest.model_validate_json(r.model_dump_json()) == r


def test_gpu_model_spec_validation() -> None:
    with pytest.raises(ValidationError) as info:
        GpuModelSpec(memory_mb=0, peak_tflops_bf16=1, peak_tflops_fp32=1)
    assert info.value.errors()[0]["loc"] == ("memory_mb",)


def test_llama_architecture_sets_the_defaults_it_leaves_unset() -> None:
    llama = TransformerShape(
        layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096, architecture="llama"
    )
    assert (llama.ffn, llama.gated_ffn, llama.tied_embeddings) == (11008, True, False)
    assert (llama.position_embedding, llama.norm, llama.biases) == ("rotary", "rmsnorm", False)
    # LLaMA's feed-forward rule for other widths: 2/3 of 4h, up to a multiple of 256.
    assert TransformerShape(**{**SHAPE, "hidden": 5120, "heads": 40}, architecture="llama").ffn == (
        13824
    )
    # A field given explicitly wins over the architecture's default.
    tied = TransformerShape(**SHAPE, architecture="llama", tied_embeddings=True, ffn_hidden=700)
    assert tied.tied_embeddings and tied.ffn == 700 and tied.gated_ffn
    # The default architecture is GPT's, the one the estimator always assumed.
    gpt = TransformerShape(**SHAPE)
    assert (gpt.ffn, gpt.gated_ffn, gpt.tied_embeddings) == (4 * 256, False, True)
    assert (gpt.position_embedding, gpt.norm, gpt.biases) == ("learned", "layernorm", True)


def test_a_resolved_shape_round_trips() -> None:
    llama = TransformerShape(**SHAPE, architecture="llama")
    assert TransformerShape.model_validate(llama.model_dump()) == llama
    request = EstimateRequest(transformer=llama.model_dump(), pipeline_schedule="gpipe")
    assert EstimateRequest.model_validate_json(request.model_dump_json()) == request


def test_new_request_fields_default_to_the_old_behaviour() -> None:
    r = EstimateRequest(parameters=10**9)
    assert (r.gpu_model, r.pipeline_schedule) == (None, "1f1b")
