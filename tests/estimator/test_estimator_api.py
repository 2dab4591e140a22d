"""POST /api/v1/estimate: the estimator against the cluster's registered GPU models."""

from __future__ import annotations

from typing import Any

import pytest

from app.estimator import EstimateRequest, memory_request_mb
from app.estimator.catalog import CATALOG, lookup, specs_for
from tests.foundation.builders import add_node

ESTIMATE = "/api/v1/estimate"
SEVEN_B = {"parameters": 7_000_000_000, "precision": "mixed", "optimizer": "adam"}
SHAPE = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "seq_len": 16}


# The response fields of the API before issue 38: every one is still there.
RESPONSE_FIELDS_BEFORE = {
    "parameters", "shape", "shape_assumed", "precision", "optimizer", "sharding",
    "data_parallel", "tensor_parallel", "pipeline_parallel", "gpu_count", "micro_batch",
    "gradient_accumulation", "global_batch", "bytes_per_parameter", "per_gpu_bytes",
    "per_gpu_mib", "formulas", "coefficients", "training_flops", "fits", "target_memory_mb",
    "suggestions", "warnings", "assumptions",
}  # fmt: skip
SUGGESTION_FIELDS_BEFORE = {
    "kind", "description", "changes", "per_gpu_bytes", "total_bytes", "fits", "target_bytes"
}  # fmt: skip


def post(api: Any, body: dict[str, Any]) -> Any:
    return api.client.post(ESTIMATE, json=body, headers=api.as_("alice"))


def test_without_nodes_advice_assumes_the_most_common_data_centre_gpu(api) -> None:  # type: ignore[no-untyped-def]
    # 7B on 8 data-parallel GPUs: the H200 (143,771 MiB) used to be the yardstick, and
    # ZeRO-2 at 127.5 GiB was said to fit.  Now every verdict is for an H100.
    response = post(api, {**SEVEN_B, "data_parallel": 8})
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body["fits"]) == {"H100-80GB"}
    h100 = CATALOG["H100-80GB"].memory_mb
    assert body["target_memory_mb"] == h100 == 81559
    assert any(
        "none registered in the cluster: advice assumes H100-80GB (81559 MiB)" in a
        for a in body["assumptions"]
    )
    assert body["fits"]["H100-80GB"]["message"].startswith("does not fit H100-80GB (81559 MiB)")
    assert body["suggestions"]
    for s in body["suggestions"]:
        assert s["gpu_model"] == "H100-80GB" and s["target_bytes"] == h100 * 2**20
        assert s["fits"] and s["total_bytes"] <= h100 * 2**20
        assert s["message"].startswith("fits H100-80GB (81559 MiB) at ")


def test_an_old_request_body_still_works_and_keeps_every_response_field(api) -> None:  # type: ignore[no-untyped-def]
    old = {
        "parameters": 7_000_000_000,
        "precision": "mixed",
        "optimizer": "adam",
        "micro_batch": 2,
        "gradient_accumulation": 4,
        "data_parallel": 8,
        "sharding": "zero1",
        "tokens": 10**12,
        "target_gpu_memory_mb": 40960,
    }
    response = post(api, old)
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) >= RESPONSE_FIELDS_BEFORE
    assert body["suggestions"]
    assert all(set(s) >= SUGGESTION_FIELDS_BEFORE for s in body["suggestions"])
    shape_before = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "seq_len": 16}
    assert post(api, {"transformer": shape_before}).status_code == 200


def test_estimate_uses_registered_models_and_flags_unknown_ones(api) -> None:  # type: ignore[no-untyped-def]
    add_node(api.factory, "h1", gpus=8, model="NVIDIA H100 80GB HBM3", memory_mb=81559)
    add_node(api.factory, "x1", gpus=2, model="Mystery-GPU", memory_mb=24_000)
    body = post(api, {**SEVEN_B, "sharding": "zero3", "data_parallel": 8, "tokens": 10**12}).json()
    assert set(body["fits"]) == {"NVIDIA H100 80GB HBM3", "Mystery-GPU"}
    h100 = body["fits"]["NVIDIA H100 80GB HBM3"]
    assert h100["fits_as_requested"] is True
    assert h100["training_time"]["peak_tflops_per_gpu"] == CATALOG["H100-80GB"].peak_tflops_bf16
    mystery = body["fits"]["Mystery-GPU"]
    assert mystery["memory_mb"] == 24_000
    assert mystery["training_time"]["peak_tflops_per_gpu"] == min(
        s.peak_tflops_bf16 for s in CATALOG.values()
    )
    assert any("Mystery-GPU" in w and "not in the catalog" in w for w in body["warnings"])
    assert any(
        "registered in the cluster: Mystery-GPU (24000 MiB), NVIDIA H100 80GB HBM3 (81559 MiB)" in a
        for a in body["assumptions"]
    )
    # Advice is per registered model: only for the one it does not fit.
    assert body["suggestions"]
    assert {s["gpu_model"] for s in body["suggestions"]} == {"Mystery-GPU"}


def test_advice_for_each_registered_model(api) -> None:  # type: ignore[no-untyped-def]
    add_node(api.factory, "a1", gpus=8, model="NVIDIA A100-SXM4-40GB", memory_mb=40960)
    add_node(api.factory, "a2", gpus=8, model="NVIDIA A100-SXM4-80GB", memory_mb=81920)
    body = post(api, {**SEVEN_B, "data_parallel": 8}).json()
    by_gpu = {s["gpu_model"] for s in body["suggestions"]}
    assert by_gpu == {"NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB"}
    for s in body["suggestions"]:
        memory_mb = body["fits"][s["gpu_model"]]["memory_mb"]
        assert s["target_bytes"] == memory_mb * 2**20
        assert s["message"].startswith(f"fits {s['gpu_model']} ({memory_mb} MiB)")


@pytest.mark.parametrize(
    ("gpu_model", "judged", "memory_mb", "note"),
    [
        # Registered: the cluster's own name and memory, however the user spells it.
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", 81559, "as its nodes report it"),
        ("h100", "NVIDIA H100 80GB HBM3", 81559, "as its nodes report it"),
        ("H100-80GB", "NVIDIA H100 80GB HBM3", 81559, "as its nodes report it"),
        # Not registered: the catalog's figures, said so.
        ("A100-40GB", "A100-40GB", 40960, "not registered in the cluster; catalog figures"),
        ("NVIDIA L4", "L4", 23034, "not registered in the cluster; catalog figures"),
    ],
)
def test_advice_for_the_gpu_model_named(api, gpu_model, judged, memory_mb, note) -> None:  # type: ignore[no-untyped-def]
    add_node(api.factory, "h1", gpus=8, model="NVIDIA H100 80GB HBM3", memory_mb=81559)
    add_node(api.factory, "a1", gpus=8, model="NVIDIA A100-SXM4-80GB", memory_mb=81920)
    body = post(api, {**SEVEN_B, "data_parallel": 8, "gpu_model": gpu_model}).json()
    assert list(body["fits"]) == [judged]
    assert body["fits"][judged]["memory_mb"] == memory_mb
    assert any(
        f"advice for the GPU model named, {judged} ({memory_mb} MiB)" in a and note in a
        for a in body["assumptions"]
    )
    assert body["suggestions"] and all(s["gpu_model"] == judged for s in body["suggestions"])


@pytest.mark.parametrize(
    ("gpu_model", "words"),
    [
        ("Radeon 7900", "unknown GPU model 'Radeon 7900'"),
        ("a100", "could be NVIDIA A100-SXM4-40GB or NVIDIA A100-SXM4-80GB"),
    ],
)
def test_a_gpu_model_that_names_no_single_gpu_is_422(api, gpu_model, words) -> None:  # type: ignore[no-untyped-def]
    add_node(api.factory, "a1", gpus=8, model="NVIDIA A100-SXM4-40GB", memory_mb=40960)
    add_node(api.factory, "a2", gpus=8, model="NVIDIA A100-SXM4-80GB", memory_mb=81920)
    response = post(api, {**SEVEN_B, "gpu_model": gpu_model})
    assert response.status_code == 422
    [error] = response.json()["errors"]
    assert error["loc"] == ["body", "gpu_model"]
    assert words in error["msg"]


def test_a_llama_model_and_a_pipeline_schedule_through_the_api(api) -> None:  # type: ignore[no-untyped-def]
    llama = {
        "layers": 32,
        "hidden": 4096,
        "heads": 32,
        "vocab": 32000,
        "seq_len": 4096,
        "architecture": "llama",
    }
    body = post(
        api,
        {"transformer": llama, "pipeline_parallel": 4, "pipeline_schedule": "gpipe",
         "gradient_accumulation": 8},
    ).json()  # fmt: skip
    assert body["parameters"] == 6_738_415_616
    assert body["shape"]["ffn_hidden"] == 11008 and body["shape"]["gated_ffn"] is True
    assert body["pipeline_schedule"] == "gpipe"
    assert any(a.startswith("pipeline schedule gpipe") for a in body["assumptions"])


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"parameters": 0}, ["parameters"]),
        ({"parameters": -5}, ["parameters"]),
        ({**SEVEN_B, "precision": "fp8"}, ["precision"]),
        ({**SEVEN_B, "micro_batch": 0}, ["micro_batch"]),
        ({**SEVEN_B, "mfu": 1.5}, ["mfu"]),
        ({**SEVEN_B, "sharding": "zero4"}, ["sharding"]),
        ({**SEVEN_B, "unknown": 1}, ["unknown"]),
        (
            {"transformer": {"layers": 2, "hidden": 100, "heads": 3, "vocab": 10, "seq_len": 8}},
            ["transformer"],
        ),
        ({**SEVEN_B, "pipeline_schedule": "zero-bubble"}, ["pipeline_schedule"]),
        ({**SEVEN_B, "gpu_model": ""}, ["gpu_model"]),
        ({**SEVEN_B, "gpu_model": "x" * 97}, ["gpu_model"]),
        ({**SEVEN_B, "gpu_model": 80}, ["gpu_model"]),
        ({"transformer": {**SHAPE, "architecture": "mistral"}}, ["transformer", "architecture"]),
        ({"transformer": {**SHAPE, "gated_ffn": 3}}, ["transformer", "gated_ffn"]),
        ({"transformer": {**SHAPE, "tied_embeddings": "x"}}, ["transformer", "tied_embeddings"]),
        (
            {"transformer": {**SHAPE, "position_embedding": "alibi"}},
            ["transformer", "position_embedding"],
        ),
        ({"transformer": {**SHAPE, "norm": "batchnorm"}}, ["transformer", "norm"]),
        ({"transformer": {**SHAPE, "biases": 2}}, ["transformer", "biases"]),
        (
            {"transformer": {**SHAPE, "architecture": "llama", "ffn_hidden": 0}},
            ["transformer", "ffn_hidden"],
        ),
        # Past the bounds that keep the arithmetic finite: a 422, never an overflow.
        ({"parameters": 10**400}, ["parameters"]),
        ({**SEVEN_B, "tokens": 10**400}, ["tokens"]),
        ({"transformer": {**SHAPE, "seq_len": 10**200}}, ["transformer", "seq_len"]),
        ({**SEVEN_B, "seq_len": 10**300}, ["seq_len"]),
        ({**SEVEN_B, "micro_batch": 10**7}, ["micro_batch"]),
        ({**SEVEN_B, "gradient_accumulation": 10**400}, ["gradient_accumulation"]),
        ({**SEVEN_B, "data_parallel": 2**21}, ["data_parallel"]),
    ],
)
def test_invalid_input_is_422_naming_the_field(api, body, loc) -> None:  # type: ignore[no-untyped-def]
    response = api.client.post(ESTIMATE, json=body, headers=api.as_("alice"))
    assert response.status_code == 422
    locs = [err["loc"] for err in response.json()["errors"]]
    assert any(found[1 : 1 + len(loc)] == loc for found in locs), locs


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            {
                "transformer": {
                    "layers": 32,
                    "hidden": 4096,
                    "heads": 32,
                    "vocab": 50257,
                    "seq_len": 2048,
                },
                "tensor_parallel": 3,
            },
            "tensor_parallel (3) must divide",
        ),
        ({}, "'parameters' or 'transformer'"),
        ({**SEVEN_B, "gpu_count": 3, "data_parallel": 2}, "gpu_count"),
    ],
)
def test_impossible_combinations_name_the_fields_in_the_message(api, body, words) -> None:  # type: ignore[no-untyped-def]
    response = api.client.post(ESTIMATE, json=body, headers=api.as_("alice"))
    assert response.status_code == 422
    assert any(words in err["msg"] for err in response.json()["errors"])


def test_estimate_needs_a_token(api) -> None:  # type: ignore[no-untyped-def]
    assert api.client.post(ESTIMATE, json=SEVEN_B).status_code == 401


@pytest.mark.parametrize(
    ("name", "memory", "key"),
    [
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("H100-80GB", 81559, "H100-80GB"),
        ("NVIDIA H200", 143771, "H200"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA A100 PCIe", 40536, "A100-40GB"),
        ("Tesla V100-SXM2-32GB", 32510, "V100-32GB"),
        ("NVIDIA L4", 23034, "L4"),
        ("NVIDIA L40S", 46068, None),
        ("Radeon", 1, None),
    ],
)
def test_catalog_lookup(name: str, memory: int, key: str | None) -> None:
    assert lookup(name, memory) == key


def test_cluster_memory_is_the_smallest_a_node_reports() -> None:
    models = specs_for([("NVIDIA A100 PCIe", 40536), ("NVIDIA A100 PCIe", 40960)])
    assert models.specs["NVIDIA A100 PCIe"].memory_mb == 40536
    assert models.unknown == ()
    assert specs_for([]).specs == {}


# --------------------------------------------------------------------------- jobs with a model

JOBS = "/api/v1/jobs"


def submit(api: Any, **spec: Any) -> Any:
    body = {"command": ["python", "train.py"], "project": "ml", **spec}
    headers = api.as_("alice")
    if "key" in spec:
        headers = {**headers, "Idempotency-Key": body.pop("key")}
    return api.client.post(JOBS, json=body, headers=headers)


def test_model_description_fills_gpu_memory_mb(api) -> None:  # type: ignore[no-untyped-def]
    add_node(api.factory, "h1", gpus=8)
    model = {"parameters": 1_000_000_000, "precision": "mixed", "micro_batch": 2}
    response = submit(api, model=model)
    assert response.status_code == 201, response.text
    expected = memory_request_mb(EstimateRequest.model_validate(model))
    assert response.json()["gpu_memory_mb"] == expected
    job = api.client.get(f"{JOBS}/{response.json()['id']}", headers=api.as_("alice")).json()
    assert job["gpu_memory_mb"] == expected


def test_model_data_parallel_comes_from_the_jobs_gpus(api) -> None:  # type: ignore[no-untyped-def]
    add_node(api.factory, "h1", gpus=8)
    model = {"parameters": 7_000_000_000, "sharding": "zero3", "checkpointing": True}
    response = submit(api, gpus=8, model=model)
    assert response.status_code == 201, response.text
    expected = memory_request_mb(EstimateRequest.model_validate({**model, "data_parallel": 8}))
    assert response.json()["gpu_memory_mb"] == expected
    # Alone, 7B does not fit one 80 GB GPU; sharded over the job's 8 it does.
    assert expected < 81559 < memory_request_mb(EstimateRequest.model_validate(model))


def test_model_that_never_fits_is_rejected_with_suggestions(api) -> None:  # type: ignore[no-untyped-def]
    add_node(api.factory, "h1", gpus=8)
    response = submit(api, gpus=1, model={"parameters": 70_000_000_000, "precision": "fp32"})
    assert response.status_code == 422
    [error] = response.json()["errors"]
    assert error["loc"] == ["body", "model"]
    assert "no registered GPU model has that much" in error["msg"]
    assert "does not fit H100-80GB (81559 MiB)" in error["msg"]
    assert "cheapest verified fix: mixed precision" in error["msg"]
    assert "fits H100-80GB (81559 MiB) at " in error["msg"]


def test_a_jobs_model_does_not_name_a_second_gpu_model(api) -> None:  # type: ignore[no-untyped-def]
    add_node(api.factory, "h1", gpus=8)
    response = submit(api, model={"parameters": 10**9, "gpu_model": "h100"})
    assert response.status_code == 422
    [error] = response.json()["errors"]
    assert error["loc"] == ["body", "model", "gpu_model"]
    assert "in gpu_model, not in model" in error["msg"]


def test_model_description_must_agree_with_the_job_size(api) -> None:  # type: ignore[no-untyped-def]
    add_node(api.factory, "h1", gpus=8)
    response = submit(api, gpus=8, model={"parameters": 10**9, "data_parallel": 4})
    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == ["body", "model"]
    assert "asks for 8" in response.json()["errors"][0]["msg"]
    cpu_only = submit(api, gpus=0, model={"parameters": 10**9})
    assert cpu_only.status_code == 422
    assert cpu_only.json()["errors"][0]["loc"] == ["body", "model"]


def test_explicit_gpu_memory_mb_wins_and_bad_models_are_422(api) -> None:  # type: ignore[no-untyped-def]
    add_node(api.factory, "h1", gpus=8)
    response = submit(api, gpu_memory_mb=1234, model={"parameters": 10**9})
    assert response.status_code == 201 and response.json()["gpu_memory_mb"] == 1234
    bad = submit(api, model={"parameters": 10**9, "precision": "fp8"})
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["loc"][:3] == ["body", "model", "precision"]


def test_idempotent_replay_with_a_model(api) -> None:  # type: ignore[no-untyped-def]
    add_node(api.factory, "h1", gpus=8)
    first = submit(api, model={"parameters": 10**9}, key="k1")
    again = submit(api, model={"parameters": 10**9}, key="k1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
