"""POST /api/v1/estimate: the estimator against the cluster's registered GPU models."""

from __future__ import annotations

from typing import Any

import pytest

from app.estimator import EstimateRequest, memory_request_mb
from app.estimator.catalog import CATALOG, lookup, specs_for
from tests.foundation.builders import add_node

ESTIMATE = "/api/v1/estimate"
SEVEN_B = {"parameters": 7_000_000_000, "precision": "mixed", "optimizer": "adam"}


def test_estimate_without_nodes_uses_the_whole_catalog(api) -> None:  # type: ignore[no-untyped-def]
    response = api.client.post(ESTIMATE, json=SEVEN_B, headers=api.as_("alice"))
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body["per_gpu_bytes"]) == {
        "weights",
        "gradients",
        "optimizer_states",
        "activations",
        "overhead",
        "total",
    }
    assert set(body["fits"]) == set(CATALOG)
    assert any("catalog" in a for a in body["assumptions"])
    # 7B mixed Adam on one GPU: 16 bytes/param = 112 GB, fits nowhere: suggestions come.
    assert not any(f["fits_as_requested"] for f in body["fits"].values())
    assert body["suggestions"]


def test_estimate_uses_registered_models_and_flags_unknown_ones(api) -> None:  # type: ignore[no-untyped-def]
    add_node(api.factory, "h1", gpus=8, model="NVIDIA H100 80GB HBM3", memory_mb=81559)
    add_node(api.factory, "x1", gpus=2, model="Mystery-GPU", memory_mb=48_000)
    body = api.client.post(
        ESTIMATE,
        json={**SEVEN_B, "sharding": "zero3", "data_parallel": 8, "tokens": 10**12},
        headers=api.as_("alice"),
    ).json()
    assert set(body["fits"]) == {"NVIDIA H100 80GB HBM3", "Mystery-GPU"}
    h100 = body["fits"]["NVIDIA H100 80GB HBM3"]
    assert h100["fits_as_requested"] is True
    assert h100["training_time"]["peak_tflops_per_gpu"] == CATALOG["H100-80GB"].peak_tflops_bf16
    mystery = body["fits"]["Mystery-GPU"]
    assert mystery["memory_mb"] == 48_000
    assert mystery["training_time"]["peak_tflops_per_gpu"] == min(
        s.peak_tflops_bf16 for s in CATALOG.values()
    )
    assert any("Mystery-GPU" in w and "not in the catalog" in w for w in body["warnings"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"parameters": 0}, "parameters"),
        ({"parameters": -5}, "parameters"),
        ({**SEVEN_B, "precision": "fp8"}, "precision"),
        ({**SEVEN_B, "micro_batch": 0}, "micro_batch"),
        ({**SEVEN_B, "mfu": 1.5}, "mfu"),
        ({**SEVEN_B, "sharding": "zero4"}, "sharding"),
        ({**SEVEN_B, "unknown": 1}, "unknown"),
        (
            {"transformer": {"layers": 2, "hidden": 100, "heads": 3, "vocab": 10, "seq_len": 8}},
            "transformer",
        ),
    ],
)
def test_invalid_input_is_422_naming_the_field(api, body, field) -> None:  # type: ignore[no-untyped-def]
    response = api.client.post(ESTIMATE, json=body, headers=api.as_("alice"))
    assert response.status_code == 422
    locs = [err["loc"] for err in response.json()["detail"]]
    assert any(loc[:2] == ["body", field] for loc in locs), locs


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
    assert any(words in err["msg"] for err in response.json()["detail"])


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
    assert models.unknown == () and not models.from_catalog


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
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "model"]
    assert "no registered GPU model has that much" in error["msg"]
    assert "try " in error["msg"] and "precision" in error["msg"].lower()


def test_model_description_must_agree_with_the_job_size(api) -> None:  # type: ignore[no-untyped-def]
    add_node(api.factory, "h1", gpus=8)
    response = submit(api, gpus=8, model={"parameters": 10**9, "data_parallel": 4})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "model"]
    assert "asks for 8" in response.json()["detail"][0]["msg"]
    cpu_only = submit(api, gpus=0, model={"parameters": 10**9})
    assert cpu_only.status_code == 422
    assert cpu_only.json()["detail"][0]["loc"] == ["body", "model"]


def test_explicit_gpu_memory_mb_wins_and_bad_models_are_422(api) -> None:  # type: ignore[no-untyped-def]
    add_node(api.factory, "h1", gpus=8)
    response = submit(api, gpu_memory_mb=1234, model={"parameters": 10**9})
    assert response.status_code == 201 and response.json()["gpu_memory_mb"] == 1234
    bad = submit(api, model={"parameters": 10**9, "precision": "fp8"})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"][:3] == ["body", "model", "precision"]


def test_idempotent_replay_with_a_model(api) -> None:  # type: ignore[no-untyped-def]
    add_node(api.factory, "h1", gpus=8)
    first = submit(api, model={"parameters": 10**9}, key="k1")
    again = submit(api, model={"parameters": 10**9}, key="k1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
