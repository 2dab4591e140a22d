"""Auth matrix over every endpoint, plus nodes, queues and health."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from app.auth.models import ApiToken, User
from app.auth.service import issue_token, revoke_tokens
from app.db import utcnow
from tests.foundation.builders import add_node

ENDPOINTS = [
    ("POST", "/api/v1/jobs", {"command": ["true"]}),
    ("GET", "/api/v1/jobs", None),
    ("GET", "/api/v1/jobs/1", None),
    ("GET", "/api/v1/jobs/1/events", None),
    ("POST", "/api/v1/jobs/1/cancel", None),
    ("POST", "/api/v1/jobs/1/hold", None),
    ("POST", "/api/v1/jobs/1/release", None),
    ("GET", "/api/v1/nodes", None),
    ("GET", "/api/v1/nodes/n1", None),
    ("POST", "/api/v1/nodes/n1/drain", None),
    ("POST", "/api/v1/nodes/n1/undrain", None),
    ("GET", "/api/v1/queues", None),
]


def call(api, method, path, body, headers):
    return api.client.request(method, path, json=body, headers=headers)


@pytest.fixture
def cluster(api):
    add_node(api.factory, "n1", gpus=4)
    job = api.client.post("/api/v1/jobs", json={"command": ["true"]}, headers=api.as_("alice"))
    assert job.json()["id"] == 1
    return api


def _expired_token(api) -> str:
    with api.factory() as session:
        user = session.scalar(select(User).where(User.name == "alice"))
        token = issue_token(session=session, user=user, ttl_days=1, label="test", actor="test")
        row = session.scalar(select(ApiToken).order_by(ApiToken.id.desc()))
        row.expires_at = utcnow() - timedelta(seconds=1)
        session.commit()
    return token


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_every_endpoint_needs_a_valid_token(cluster, method, path, body):
    api = cluster
    expired = _expired_token(api)
    for headers in (
        {},
        {"Authorization": "Bearer gps_not-a-real-token"},
        {"Authorization": "Basic YWxpY2U6eA=="},
        {"Authorization": f"Bearer {expired}"},
    ):
        r = call(api, method, path, body, headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_revoked_token_is_refused(cluster, method, path, body):
    api = cluster
    with api.factory() as session:
        assert revoke_tokens(session=session, user_name="alice", actor="test") == 1
        session.commit()
    assert call(api, method, path, body, api.as_("alice")).status_code == 401


@pytest.mark.parametrize(
    ("method", "path", "body", "alice", "bob", "admin"),
    [
        ("POST", "/api/v1/jobs", {"command": ["true"]}, 201, 201, 201),
        ("GET", "/api/v1/jobs", None, 200, 200, 200),
        ("GET", "/api/v1/jobs/1", None, 200, 403, 200),
        ("GET", "/api/v1/jobs/1/events", None, 200, 403, 200),
        ("POST", "/api/v1/jobs/1/cancel", None, 200, 403, 200),
        ("POST", "/api/v1/jobs/1/hold", None, 200, 403, 200),
        ("POST", "/api/v1/jobs/1/release", None, 200, 403, 200),
        ("GET", "/api/v1/nodes", None, 200, 200, 200),
        ("GET", "/api/v1/nodes/n1", None, 200, 200, 200),
        ("POST", "/api/v1/nodes/n1/drain", None, 403, 403, 200),
        ("POST", "/api/v1/nodes/n1/undrain", None, 403, 403, 200),
        ("GET", "/api/v1/queues", None, 200, 200, 200),
    ],
)
def test_role_and_project_matrix(cluster, method, path, body, alice, bob, admin):
    api = cluster
    # alice owns job 1 (project ml); bob is in another project; admin sees everything.
    for user, expected in (("bob", bob), ("alice", alice), ("admin", admin)):
        if user == "admin" and path.endswith("/jobs") and method == "POST":
            body = {"command": ["true"], "project": "ml"}
        r = call(api, method, path, body, api.as_(user))
        assert r.status_code == expected, (user, r.text)


def test_users_see_only_their_projects_jobs_and_queues(cluster):
    api = cluster
    assert api.client.get("/api/v1/jobs", headers=api.as_("bob")).json()["items"] == []
    queues = api.client.get("/api/v1/queues", headers=api.as_("bob")).json()
    assert [q["project"] for q in queues] == ["cv"]
    queues = api.client.get("/api/v1/queues", headers=api.as_("admin")).json()
    ml = next(q for q in queues if q["project"] == "ml")
    assert ml["pending"] == 1 and ml["gpus_requested"] == 1 and ml["running"] == 0


def test_health_needs_no_token(api):
    assert api.client.get("/healthz").json() == {"status": "ok"}
    ready = api.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "redis": "not configured"}


def test_readyz_is_503_when_redis_is_down(settings, session_factory):
    import redis
    from fastapi.testclient import TestClient

    from app.main import create_app

    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    client = TestClient(create_app(settings, session_factory=session_factory, redis_client=dead))
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["checks"]["redis"].startswith("unreachable")


def test_nodes_listing_drain_and_undrain(cluster):
    api = cluster
    nodes = api.client.get("/api/v1/nodes", headers=api.as_("alice")).json()
    assert [(n["name"], n["gpu_count"], n["state"]) for n in nodes] == [("n1", 4, "READY")]
    detail = api.client.get("/api/v1/nodes/n1", headers=api.as_("alice")).json()
    assert [g["index"] for g in detail["gpus"]] == [0, 1, 2, 3]
    assert api.client.get("/api/v1/nodes/nope", headers=api.as_("alice")).status_code == 404
    r = api.client.post(
        "/api/v1/nodes/n1/drain", json={"reason": "bad fan"}, headers=api.as_("admin")
    )
    assert r.json()["drained"] is True and r.json()["drain_reason"] == "bad fan"
    r = api.client.post("/api/v1/nodes/n1/undrain", headers=api.as_("admin"))
    assert r.json()["drained"] is False and r.json()["drain_reason"] == ""
    r = api.client.post("/api/v1/nodes/n1/drain", json={"why": "x"}, headers=api.as_("admin"))
    assert r.status_code == 422


def test_openapi_document_is_served(api):
    doc = api.client.get("/openapi.json").json()
    assert "/api/v1/jobs" in doc["paths"] and api.client.get("/docs").status_code == 200


def test_metrics_report_jobs_and_gpus_without_a_token(cluster):
    api = cluster
    text = api.client.get("/metrics").text
    assert 'gpusched_jobs{project="ml",state="PENDING"} 1.0' in text
    assert (
        'gpusched_gpu_allocated_ratio{gpu="3",job_id="",model="H100-80GB",node="n1",'
        'project="",user="",uuid="GPU-n1-3"} 0.0'
    ) in text
    assert 'gpusched_node_heartbeat_age_seconds{node="n1"}' in text


def test_repeated_failed_token_checks_are_rate_limited(settings, session_factory):
    from fastapi.testclient import TestClient

    from app.main import create_app

    client = TestClient(
        create_app(
            settings.model_copy(update={"auth_failures_per_minute": 3}),
            session_factory=session_factory,
        )
    )
    bad = {"Authorization": "Bearer gps_wrong"}
    assert [client.get("/api/v1/jobs", headers=bad).status_code for _ in range(3)] == [401] * 3
    limited = client.get("/api/v1/jobs", headers=bad)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert client.get("/healthz").status_code == 200  # health needs no token, never limited


def test_the_pending_reasons_are_one_enum_in_the_schema(api):
    """Every reason a job waits for is a ReasonKind, and the API's schema lists them, so a
    client knows the vocabulary (the dashboard, the CLI) without reading the code."""
    from app.scheduling.types import ReasonKind

    schemas = api.client.get("/openapi.json").json()["components"]["schemas"]
    assert schemas["ReasonKind"]["enum"] == [kind.value for kind in ReasonKind]
    reason = schemas["JobOut"]["properties"]["pending_reason"]
    assert {"$ref": "#/components/schemas/ReasonKind"} in reason["anyOf"]
    assert {"held", "dependency", "array_limit", "NEW", "waiting_for_gpus"} <= set(
        schemas["ReasonKind"]["enum"]
    )
    # A reason's time is data (pending_until, date-time), not text in its message.
    until = schemas["JobOut"]["properties"]["pending_until"]
    assert {"type": "string", "format": "date-time"} in until["anyOf"]


def test_the_dashboard_names_reasons_only_from_the_enum() -> None:
    """The reasons the dashboard's pages treat apart (a job outside the ranking is not
    asked for its rank) are ReasonKind values: a renamed reason fails here, not silently
    in the browser."""
    import re
    from pathlib import Path

    from app.scheduling.types import ReasonKind

    pages = Path(__file__).resolve().parents[2] / "frontend" / "js" / "pages"
    named: set[str] = set()
    for page in pages.glob("*.js"):
        for listed in re.findall(r"NOT_RANKED = new Set\(\[([^\]]*)\]\)", page.read_text()):
            named.update(re.findall(r'"([^"]+)"', listed))
        named.update(re.findall(r'pending_reason === "([^"]+)"', page.read_text()))
    assert named, "the job page's NOT_RANKED list was not found"
    assert named <= {kind.value for kind in ReasonKind}, named - {k.value for k in ReasonKind}
