"""Hostile but well-formed input found by fuzzing (NUL bytes, dates near year 1 or 9999):
it must be refused with a 4xx, never a 500."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.security.conftest import Cluster

PG = os.environ.get("GPUSCHED_TEST_DB", "sqlite") == "postgresql"


def request(cluster: Cluster, method: str, url: str, body: Any = None) -> Any:
    return cluster.api.client.request(method, url, json=body, headers=cluster.headers("admin"))


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        pytest.param("GET", "/api/v1/windows/a%00b", None),
        pytest.param("GET", "/api/v1/nodes/a%00b", None),
        pytest.param("GET", "/api/v1/batches/a%00b", None),
        pytest.param("GET", "/api/v1/jobs?project=a%00b", None),
        pytest.param("GET", "/api/v1/jobs?user=a%00b", None),
        pytest.param("GET", "/api/v1/jobs?label=a%3Db%00", None),
        pytest.param("GET", "/api/v1/queue?project=a%00b", None),
        pytest.param("GET", "/api/v1/reports/usage?project=a%00b", None),
        pytest.param("GET", "/api/v1/utilization?node=a%00b", None),
        pytest.param("POST", "/api/v1/jobs", {"command": ["true"], "name": "a\0b"}),
        pytest.param("POST", "/api/v1/jobs", {"command": ["tr\0ue"]}),
        pytest.param("POST", "/api/v1/jobs", {"command": "tr\0ue"}),
        pytest.param("POST", "/api/v1/jobs", {"command": ["true"], "workdir": "/x\0"}),
        pytest.param("POST", "/api/v1/jobs", {"command": ["true"], "project": "m\0l"}),
        pytest.param("POST", "/api/v1/nodes/n1/drain", {"reason": "a\0"}),
        pytest.param(
            "POST",
            "/api/v1/batches",
            {
                "name": "x",
                "cron": "0 2 * * *",
                "window": "a\0",
                "target": "offpeak",
                "templates": [{"command": ["a"]}],
            },
        ),
        ("POST", "/api/v1/jobs", {"command": ["true"], "env": {"A": "x\0"}}),
        ("POST", "/api/v1/jobs", {"command": ["true"], "labels": {"a": "x\0"}}),
        ("POST", "/api/v1/jobs", {"command": ["true"], "gpu_model": "H\0"}),
        ("POST", "/api/v1/windows", {"name": "x", "timezone": "U\0TC", "daily": []}),
    ],
)
def test_nul_bytes_are_never_a_500(cluster: Cluster, method: str, url: str, body: Any) -> None:
    """SQLite stores a NUL like any character; PostgreSQL text cannot hold one. Either way
    the request is answered (accepted, or refused with a 4xx)."""
    r = request(cluster, method, url, body)
    assert r.status_code < 500, (r.status_code, r.text[:300])


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        pytest.param(
            "POST",
            "/api/v1/jobs",
            {"command": ["true"], "schedule": {"mode": "at", "at": "9999-12-31T23:00:00-05:00"}},
        ),
        pytest.param(
            "POST",
            "/api/v1/jobs",
            {"command": ["true"], "schedule": {"mode": "at", "at": "0001-01-01T00:00:00+05:00"}},
        ),
        pytest.param("GET", "/api/v1/reports/usage?until=0001-01-03T00:00:00Z", None),
        pytest.param("GET", "/api/v1/reports/usage?since=0001-01-01T00:00:00%2B05:00", None),
        ("GET", "/api/v1/reports/usage?until=9999-12-31T23:59:59-05:00", None),
        ("GET", "/api/v1/utilization?since=0001-01-01T00:00:00%2B05:00", None),
        ("GET", "/api/v1/utilization?since=9999-12-31T23:59:59-05:00", None),
        (
            "POST",
            "/api/v1/jobs",
            {"command": ["true"], "schedule": {"mode": "at", "at": "9999-12-31T23:00:00Z"}},
        ),
    ],
)
def test_extreme_dates_are_never_a_500(cluster: Cluster, method: str, url: str, body: Any) -> None:
    r = request(cluster, method, url, body)
    assert r.status_code < 500, (r.status_code, r.text[:300])


@pytest.mark.parametrize(
    ("url", "body", "loc"),
    [
        ("/api/v1/jobs", {"command": ["tr\0ue"]}, ["body", "command"]),
        ("/api/v1/jobs", {"command": ["true"], "env": {"A": "x\0"}}, ["body", "env"]),
        (
            "/api/v1/jobs",
            {"command": ["true"], "schedule": {"mode": "offpeak", "window": "n\0"}},
            ["body", "schedule", "window"],
        ),
        ("/api/v1/nodes/n1/drain", {"reason": "a\0"}, ["body", "reason"]),
        (
            "/api/v1/batches",
            {
                "name": "x",
                "cron": "0 2 * * *",
                "target": "offpeak",
                "window": "a\0",
                "templates": [{"command": ["a"]}],
            },
            ["body", "window"],
        ),
    ],
)
def test_nul_bytes_are_refused_naming_the_field(
    cluster: Cluster, url: str, body: Any, loc: list[str]
) -> None:
    """On SQLite too, which would store them: every request body refuses them alike."""
    r = request(cluster, "POST", url, body)
    assert r.status_code == 422, r.text
    assert [e["loc"] for e in r.json()["errors"]] == [loc], r.text
    assert r.json()["errors"][0]["msg"] == "Value error, must not contain NUL bytes"
