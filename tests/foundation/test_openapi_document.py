"""The OpenAPI document as a client reads it: every request field described, the bearer
scheme on the operations that need a token, and each error in one documented shape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi.testclient import TestClient

from tests.conftest import Api
from tests.security.routes import api_operations, build_app

APP = build_app()
DOC = APP.openapi()
SCHEMAS = DOC["components"]["schemas"]
PROBLEM_REF = {"$ref": "#/components/schemas/ProblemDetails"}


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    return SCHEMAS[ref.rsplit("/", 1)[-1]] if ref else schema


def _nested(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The object schemas a value of `schema` may hold (through lists, maps and unions)."""
    schema = _resolve(schema)
    for key in ("anyOf", "oneOf", "allOf"):
        for option in schema.get(key, []):
            yield from _nested(option)
    if "items" in schema:
        yield from _nested(schema["items"])
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nested(schema["additionalProperties"])
    if "properties" in schema:
        yield schema


def _undescribed(name: str, schema: dict[str, Any], seen: set[str]) -> Iterator[str]:
    if name in seen:
        return
    seen.add(name)
    for field, prop in schema.get("properties", {}).items():
        described = prop.get("description") or _resolve(prop).get("description")
        if not described:
            yield f"{name}.{field}"
        for inner in _nested(prop):
            yield from _undescribed(inner.get("title", f"{name}.{field}"), inner, seen)


def _request_bodies() -> Iterator[tuple[str, dict[str, Any]]]:
    for path, item in DOC["paths"].items():
        for method, operation in item.items():
            content = operation.get("requestBody", {}).get("content", {})
            for media in content.values():
                yield f"{method.upper()} {path}", media["schema"]


def test_every_request_field_is_described() -> None:
    missing: set[str] = set()
    seen: set[str] = set()
    bodies = list(_request_bodies())
    assert len(bodies) >= 10  # the walk found the bodies (POST /jobs, PATCH /jobs, ...)
    for _, schema in bodies:
        for inner in _nested(schema):
            missing.update(_undescribed(inner.get("title", "?"), inner, seen))
    assert "JobCreate" in seen
    assert sorted(missing) == []


def test_operations_that_need_a_token_declare_the_bearer_scheme() -> None:
    assert DOC["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": DOC["components"]["securitySchemes"]["HTTPBearer"]["description"],
    }
    ops = api_operations(APP)
    assert ops
    for op in ops:
        operation = DOC["paths"][op.path][op.method.lower()]
        assert (operation.get("security") == [{"HTTPBearer": []}]) == op.needs_token, op.id
    for public in ("/healthz", "/readyz"):
        assert "security" not in DOC["paths"][public]["get"], public


def test_errors_are_problem_details_in_the_document() -> None:
    assert set(SCHEMAS["ProblemDetails"]["required"]) == {
        "title",
        "status",
        "detail",
        "instance",
    }
    assert "HTTPValidationError" not in SCHEMAS
    for path, item in DOC["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    [(media, content)] = response["content"].items()
                    assert media == "application/problem+json", (method, path, status)
                    assert content["schema"] == PROBLEM_REF, (method, path, status)
                    assert content["example"]["status"] == int(status), (method, path, status)


def _statuses(method: str, path: str) -> set[int]:
    return {int(s) for s in DOC["paths"][path][method]["responses"] if int(s) >= 400}


def test_each_operation_lists_its_own_errors() -> None:
    # No path id, no body: no 404, 413 or 400; a token: 401 and 429.
    assert _statuses("get", "/api/v1/me") == {401, 429, 503}
    # A path id looked up, a state that can conflict, a project membership.
    assert _statuses("post", "/api/v1/jobs/{job_id}/hold") == {401, 403, 404, 409, 422, 429, 503}
    # A body; no path id.
    assert _statuses("post", "/api/v1/jobs") == {400, 401, 403, 409, 413, 422, 429, 503}
    # Admin only, no conflict.
    assert 403 in _statuses("post", "/api/v1/nodes/{name}/undrain")
    assert 409 not in _statuses("post", "/api/v1/nodes/{name}/undrain")
    # Public: no auth errors.
    assert _statuses("get", "/healthz") == set()
    # Not every operation the same list.
    lists = {
        frozenset(_statuses(method, path)) for path, item in DOC["paths"].items() for method in item
    }
    assert len(lists) >= 8


def _assert_problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["title"] and body["detail"]
    assert body["type"] == "about:blank"
    return body


def test_every_kind_of_error_is_a_problem() -> None:
    client = TestClient(APP)
    # HTTPException (auth)
    body = _assert_problem(client.get("/api/v1/jobs"), 401)
    assert body["instance"] == "/api/v1/jobs" and "bearer token" in body["detail"]
    # Unknown path and method (Starlette's own)
    _assert_problem(client.get("/api/v1/no-such-thing"), 404)
    _assert_problem(client.delete("/healthz"), 405)


def test_validation_domain_and_size_errors_are_problems(api: Api) -> None:
    alice = api.as_("alice")
    # FastAPI's validation: each field named, where and why; `detail` sums them up.
    body = _assert_problem(
        api.client.post("/api/v1/jobs", json={"command": ["true"], "gpus": -1}, headers=alice),
        422,
    )
    assert body["instance"] == "/api/v1/jobs" and body["title"] == "Unprocessable Content"
    [error] = body["errors"]
    assert error["loc"] == ["body", "gpus"] and error["field"] == "gpus"
    assert error["type"] == "greater_than_equal" and "greater than or equal to 0" in error["msg"]
    assert body["detail"] == f"gpus: {error['msg']}"
    # The app's own FieldError, in the query.
    body = _assert_problem(api.client.get("/api/v1/jobs?label=nokey", headers=alice), 422)
    assert [(e["loc"], e["field"]) for e in body["errors"]] == [(["query", "label"], "label")]
    # A domain error: NotFound, and Conflict.
    body = _assert_problem(api.client.get("/api/v1/jobs/999999", headers=alice), 404)
    assert body == {
        "type": "about:blank",
        "title": "Not Found",
        "status": 404,
        "detail": "no job 999999",
        "instance": "/api/v1/jobs/999999",
    }
    job = api.client.post("/api/v1/jobs", json={"command": ["true"]}, headers=alice).json()
    api.client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=alice)
    body = _assert_problem(api.client.post(f"/api/v1/jobs/{job['id']}/hold", headers=alice), 409)
    assert "only a pending job can be held" in body["detail"]
    # Not an admin.
    _assert_problem(api.client.get("/api/v1/audit", headers=alice), 403)
    # A body over the limit, refused by its Content-Length before any handler runs.
    big = b"x" * (api.client.app.state.settings.max_body_bytes + 1)
    headers = {**alice, "content-type": "application/json"}
    body = _assert_problem(api.client.post("/api/v1/jobs", content=big, headers=headers), 413)
    assert "GPUSCHED_MAX_BODY_BYTES" in body["detail"] and body["title"] == "Content Too Large"
    # A body that is not JSON.
    body = _assert_problem(api.client.post("/api/v1/jobs", content=b"{x", headers=headers), 422)
    assert [e["field"] for e in body["errors"]] == ["body"]
