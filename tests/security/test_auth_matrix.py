"""Authentication and authorisation over EVERY route of the app, generated from app.routes.

A new endpoint is covered automatically; if it needs a path parameter or a body the matrix
does not know yet, `test_matrix_covers_every_route` fails and names what to add here.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Api
from tests.security.conftest import BATCH, ML_MARKER, WINDOW, Cluster, expired_token, revoked_token
from tests.security.routes import (
    EXPECTED_ADMIN_ONLY,
    Operation,
    api_operations,
    build_app,
    unexpected_public_routes,
)

APP = build_app()
OPERATIONS = api_operations(APP)
IDS = [op.id for op in OPERATIONS]
# RFC 9457 problem details: every error has these fields, and no more (a 422 adds `errors`).
PROBLEM_FIELDS = {"type", "title", "status", "detail", "instance"}

# A valid body per operation that takes one (for project ml where a project is named).
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/api/v1/jobs"): {"command": ["true"], "project": "ml"},
    ("PATCH", "/api/v1/jobs/{job_id}"): {"priority": -1},
    ("PATCH", "/api/v1/jobs"): {"priority": -1},
    ("PATCH", "/api/v1/jobs/{job_id}/array"): {"max_running": 2},
    ("POST", "/api/v1/estimate"): {"parameters": 1_000_000_000},
    ("POST", "/api/v1/windows"): {**WINDOW, "name": "day"},
    ("PUT", "/api/v1/windows/{name}"): WINDOW,
    ("POST", "/api/v1/batches"): {
        **BATCH,
        "name": "other",
        "templates": [{"command": ["true"], "project": "ml"}],
    },
    ("PUT", "/api/v1/batches/{name}"): BATCH,
    ("POST", "/api/v1/nodes/{name}/drain"): {"reason": "fan"},
    # The running limits too (Slurm's GrpJobs, GrpTRES=gres/gpu): admins set them.
    ("PATCH", "/api/v1/projects/{name}"): {"gpu_quota": 2, "max_running_jobs": 4, "max_gpus": 8},
    ("PATCH", "/api/v1/me"): {"notify_url": None},
    ("POST", "/api/v1/users"): {"name": "erin", "projects": ["ml"]},
    ("POST", "/api/v1/users/{name}/tokens"): {"label": "laptop"},
    ("PATCH", "/api/v1/users/{name}"): {"admin": True, "max_running_jobs": 4, "max_gpus": 8},
}
# Changes only an admin makes through operations open to users: raising a job's priority
# above its project's maximum (0 by default), as Slurm lets users only lower theirs.
ADMIN_ONLY_CHANGES: dict[tuple[str, str], Any] = {
    ("POST", "/api/v1/jobs"): {"command": ["true"], "project": "ml", "priority": 1},
    ("PATCH", "/api/v1/jobs/{job_id}"): {"priority": 1},
    ("PATCH", "/api/v1/jobs"): {"priority": 1},
    ("POST", "/api/v1/batches"): {
        **BATCH,
        "name": "urgent",
        "templates": [{"command": ["true"], "project": "ml", "priority": 1}],
    },
}
# Query parameters an operation needs to do anything (a bulk action must say which jobs).
QUERIES: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", f"/api/v1/jobs/{action}"): {"project": "ml"}
    for action in ("cancel", "hold", "release")
} | {("PATCH", "/api/v1/jobs"): {"project": "ml"}}
# Operations whose body names a project: another project's user is refused, but as a
# field error (422 "you are not a member of project 'ml'"), which is also accepted.
PROJECT_IN_BODY = {("POST", "/api/v1/jobs"), ("POST", "/api/v1/batches")}
# Path parameters that name a row of project ml (the rest are cluster-wide: nodes, windows).
PROJECT_SCOPED_PARAMS = {"job_id", "batch"}


def path_values(cluster: Cluster, op: Operation) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for param in op.params:
        if param == "job_id" and op.path.endswith(("/logs", "/requeue")):
            values[param] = cluster.ml_running_job
        elif param == "job_id" and op.path.endswith("/array"):
            values[param] = cluster.ml_array
        elif param == "job_id":
            values[param] = cluster.ml_job
        elif param == "name" and op.method == "DELETE" and op.path.startswith("/api/v1/nodes/"):
            values[param] = cluster.retired_node
        elif param == "name" and op.path.startswith("/api/v1/nodes/"):
            values[param] = cluster.node
        elif param == "name" and op.path.startswith("/api/v1/windows/"):
            values[param] = cluster.window
        elif param == "name" and op.path.startswith("/api/v1/batches/"):
            values[param] = cluster.batch
        elif param == "name" and op.path.startswith("/api/v1/projects/"):
            values[param] = "ml"
        elif param == "name" and op.path.startswith("/api/v1/users/"):
            values[param] = cluster.member
        elif param == "project" and op.path.startswith("/api/v1/users/"):
            values[param] = "cv"
        else:
            raise LookupError(f"{op.id}: no seeded value for path parameter {param!r}")
    return values


def scoped_to_ml(op: Operation) -> bool:
    kinds = {"batch" if p == "name" and "/batches/" in op.path else p for p in op.params}
    return bool(kinds & PROJECT_SCOPED_PARAMS)


def url(cluster: Cluster, op: Operation) -> str:
    return op.path.format(**path_values(cluster, op))


def call(api: Api, cluster: Cluster, op: Operation, headers: dict[str, str], **kwargs: Any) -> Any:
    kwargs.setdefault("json", BODIES.get((op.method, op.path)))
    kwargs.setdefault("params", QUERIES.get((op.method, op.path)))
    return api.client.request(op.method, url(cluster, op), headers=headers, **kwargs)


def test_matrix_covers_every_route() -> None:
    assert unexpected_public_routes(APP) == []
    assert len(OPERATIONS) >= 30
    missing = []
    for op in OPERATIONS:
        assert op.path.startswith("/api/v1/"), op.id
        if not op.needs_token:
            missing.append(f"{op.id}: does not depend on get_principal (public?)")
        if op.has_body and (op.method, op.path) not in BODIES:
            missing.append(f"{op.id}: add a valid body to BODIES")
        try:
            path_values(Cluster(api=None, settings=None), op)  # type: ignore[arg-type]
        except LookupError as exc:
            missing.append(str(exc))
    assert missing == []


def test_admin_only_operations_are_the_designed_ones() -> None:
    admin_only = {(op.method, op.path) for op in OPERATIONS if op.admin_only}
    assert admin_only == EXPECTED_ADMIN_ONLY


@pytest.mark.parametrize("op", OPERATIONS, ids=IDS)
def test_every_operation_refuses_missing_bad_expired_and_revoked_tokens(
    cluster: Cluster, op: Operation
) -> None:
    api = cluster.api
    expired = expired_token(api)
    revoked = revoked_token(api, "carol")
    for label, headers in {
        "no token": {},
        "wrong token": {"Authorization": "Bearer gps_not-a-real-token"},
        "empty bearer": {"Authorization": "Bearer "},
        "basic auth": {"Authorization": "Basic YWxpY2U6eA=="},
        "token without scheme": {"Authorization": api.tokens["alice"]},
        "token with a suffix": {"Authorization": f"Bearer {api.tokens['alice']}x"},
        "huge token": {"Authorization": "Bearer " + "a" * 16_000},
        "expired token": {"Authorization": f"Bearer {expired}"},
        "revoked token": {"Authorization": f"Bearer {revoked}"},
    }.items():
        r = call(api, cluster, op, headers)
        assert r.status_code == 401, (label, r.status_code, r.text)
        assert r.headers.get("www-authenticate") == "Bearer", label
        assert r.headers["content-type"] == "application/problem+json", label
        assert set(r.json()) == PROBLEM_FIELDS and ML_MARKER not in r.text, (label, r.text)
    # The valid token of the same user still works: the refusals above were about the token.
    assert call(api, cluster, op, api.as_("admin")).status_code < 400


@pytest.mark.parametrize("op", OPERATIONS, ids=IDS)
def test_another_projects_user_never_sees_project_ml(cluster: Cluster, op: Operation) -> None:
    api = cluster.api
    r = call(api, cluster, op, api.as_("bob"))
    assert r.status_code < 500, r.text
    assert ML_MARKER not in r.text, (r.status_code, r.text[:500])
    if op.admin_only:
        assert r.status_code == 403, r.text
    elif scoped_to_ml(op):
        assert r.status_code in (403, 404), (r.status_code, r.text[:500])
    elif (op.method, op.path) in PROJECT_IN_BODY:
        assert r.status_code in (403, 404, 422), (r.status_code, r.text[:500])
    query_names = {p.alias or p.name for p in op.route.dependant.query_params}
    if op.method == "GET" and query_names & {"project", "user"}:
        params = {k: v for k, v in (("project", "ml"), ("user", "alice")) if k in query_names}
        r = call(api, cluster, op, api.as_("bob"), params=params)
        assert r.status_code < 500 and ML_MARKER not in r.text, (params, r.text[:500])
    # The owner does get the resource: bob's refusal above is about bob, not a bad id.
    if not op.admin_only:
        r = call(api, cluster, op, api.as_("alice"))
        assert r.status_code < 300, (r.status_code, r.text[:500])


@pytest.mark.parametrize("op", [op for op in OPERATIONS if op.admin_only], ids=lambda op: op.id)
def test_admin_only_operations_refuse_normal_users(cluster: Cluster, op: Operation) -> None:
    api = cluster.api
    for user in ("alice", "bob"):
        r = call(api, cluster, op, api.as_(user))
        assert r.status_code == 403, (user, r.text)
    r = call(api, cluster, op, api.as_("admin"))
    assert r.status_code < 300, r.text


@pytest.mark.parametrize(
    "op",
    [op for op in OPERATIONS if (op.method, op.path) in ADMIN_ONLY_CHANGES],
    ids=lambda op: op.id,
)
def test_admin_only_changes_refuse_normal_users(cluster: Cluster, op: Operation) -> None:
    api = cluster.api
    body = ADMIN_ONLY_CHANGES[(op.method, op.path)]
    params = QUERIES.get((op.method, op.path))
    r = call(api, cluster, op, api.as_("alice"), json=body, params=params)
    assert r.status_code == 403 and "only an admin" in r.text, r.text
    # bob, of another project, is refused (or, by a bulk change, selects none of ml's).
    r = call(api, cluster, op, api.as_("bob"), json=body, params=params)
    assert ML_MARKER not in r.text
    assert r.status_code in (403, 404, 422) or r.json()["count"] == 0, r.text
    r = call(api, cluster, op, api.as_("admin"), json=body, params=params)
    assert r.status_code < 300, r.text


def test_every_admin_only_change_is_checked() -> None:
    routes = {(op.method, op.path) for op in OPERATIONS}
    assert set(ADMIN_ONLY_CHANGES) <= routes
