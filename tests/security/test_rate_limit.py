"""Failed token checks are rate limited per client address and per token prefix: 429 with
Retry-After for the guessing client's failed checks, nothing for anyone else, and never
for a valid token. X-Forwarded-For names the client only from a proxy the settings name
(a real `gpusched server` below: uvicorn on its own believes it from 127.0.0.1)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.auth.service import FailedAuthLimiter
from app.config import Settings
from app.main import create_app
from tests.conftest import Api
from tests.security.conftest import Cluster, expired_token, revoked_token
from tests.security.routes import api_operations

LIMIT = 5
GUESSER = ("203.0.113.7", 40000)
OTHER = ("198.51.100.9", 40001)
BAD = {"Authorization": "Bearer gps_guess"}


@pytest.fixture
def limited_app(settings: Settings, session_factory: sessionmaker[Session]) -> FastAPI:
    app = create_app(
        settings.model_copy(update={"auth_failures_per_minute": LIMIT}),
        session_factory=session_factory,
    )
    # Its limiter on a clock that stands still: a test's failures stay in one window
    # however slowly a loaded machine serves the requests between them.
    limit = app.state.auth_limiter.limit
    assert limit == LIMIT
    app.state.auth_limiter = FailedAuthLimiter(limit=limit, clock=lambda: 1000.0)
    return app


@pytest.fixture
def clients(limited_app: FastAPI, api: Api) -> Iterator[tuple[TestClient, TestClient]]:
    with (
        TestClient(limited_app, client=GUESSER) as guesser,
        TestClient(limited_app, client=OTHER) as other,
    ):
        yield guesser, other


def test_nth_failure_then_429_with_retry_after(clients, api: Api) -> None:
    guesser, other = clients
    statuses = [guesser.get("/api/v1/jobs", headers=BAD).status_code for _ in range(LIMIT)]
    assert statuses == [401] * LIMIT
    r = guesser.get("/api/v1/jobs", headers=BAD)
    assert r.status_code == 429, r.text
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert "gps_guess" not in r.text
    # A valid token from the same address is never refused: a NAT or a proxy may hold a
    # guesser and every user of the cluster.
    assert guesser.get("/api/v1/me", headers=api.as_("alice")).status_code == 200
    assert guesser.get("/api/v1/me", headers={}).status_code == 429  # still guessing
    # Another client is unaffected: valid token works, its own failures are counted apart.
    assert other.get("/api/v1/me", headers=api.as_("alice")).status_code == 200
    other_guess = {"Authorization": "Bearer gps_other"}
    assert other.get("/api/v1/jobs", headers=other_guess).status_code == 401
    # The guessed token is limited from every address (failures per token prefix too).
    assert other.get("/api/v1/jobs", headers=BAD).status_code == 429
    assert other.get("/api/v1/jobs", headers=api.as_("bob")).status_code == 200
    # Probes need no token and are never limited.
    assert guesser.get("/healthz").status_code == 200


def test_every_kind_of_failed_check_counts(clients, api: Api) -> None:
    guesser, _ = clients
    kinds = [
        {},
        {"Authorization": "Basic YWxpY2U6eA=="},
        {"Authorization": f"Bearer {expired_token(api)}"},
        {"Authorization": f"Bearer {revoked_token(api, 'carol')}"},
        BAD,
    ]
    assert [guesser.get("/api/v1/me", headers=h).status_code for h in kinds] == [401] * LIMIT
    assert guesser.get("/api/v1/me", headers=BAD).status_code == 429


def test_successful_checks_never_count(clients, api: Api) -> None:
    guesser, _ = clients
    for _ in range(LIMIT * 4):
        assert guesser.get("/api/v1/me", headers=api.as_("alice")).status_code == 200
    assert guesser.get("/api/v1/me", headers=BAD).status_code == 401


def test_a_forwarded_for_header_does_not_reset_the_count(clients) -> None:
    """The limiter keys on the connection's address; a client cannot pick a new identity
    per request with X-Forwarded-For (uvicorn rewrites it only for trusted proxies)."""
    guesser, _ = clients
    for i in range(LIMIT):
        headers = {**BAD, "X-Forwarded-For": f"192.0.2.{i}", "X-Real-IP": f"192.0.2.{i}"}
        assert guesser.get("/api/v1/me", headers=headers).status_code == 401
    headers = {**BAD, "X-Forwarded-For": "192.0.2.200"}
    assert guesser.get("/api/v1/me", headers=headers).status_code == 429


def test_every_token_checked_operation_is_limited(cluster: Cluster, limited_app: FastAPI) -> None:
    with TestClient(limited_app, client=GUESSER) as guesser:
        for _ in range(LIMIT):
            assert guesser.get("/api/v1/me", headers=BAD).status_code == 401
        for op in api_operations(limited_app):
            path = op.path.replace("{job_id}", str(cluster.ml_job)).replace("{name}", "x")
            r = guesser.request(op.method, path, headers=BAD)
            assert r.status_code == 429, (op.id, r.status_code)
            assert int(r.headers["retry-after"]) >= 1
            # The same operation with a valid token, from the same address, is served.
            r = guesser.request(op.method, path, headers=cluster.headers("alice"))
            assert r.status_code != 429, (op.id, r.status_code)


def test_sixty_tokenless_requests_do_not_keep_a_valid_token_out(
    settings: Settings, session_factory: sessionmaker[Session], api: Api
) -> None:
    """With the default limit (60 a minute), as a user behind a shared address found it."""
    app = create_app(settings, session_factory=session_factory)
    assert app.state.auth_limiter.limit == 60
    with TestClient(app, client=GUESSER) as client:
        statuses = [client.get("/api/v1/jobs").status_code for _ in range(60)]
        assert statuses == [401] * 60
        assert client.get("/api/v1/jobs").status_code == 429
        for user in ("alice", "bob", "admin"):
            assert client.get("/api/v1/me", headers=api.as_(user)).status_code == 200


def test_guesses_at_one_token_are_limited_from_every_address(
    limited_app: FastAPI, api: Api
) -> None:
    """Failures are counted per token prefix too: many addresses guessing one token are
    limited together, and the valid token still works from all of them."""
    prefix = api.tokens["alice"][:10]
    for i in range(LIMIT):
        with TestClient(limited_app, client=(f"192.0.2.{i}", 40000)) as client:
            r = client.get("/api/v1/me", headers={"Authorization": f"Bearer {prefix}guess{i}"})
            assert r.status_code == 401
    with TestClient(limited_app, client=("192.0.2.99", 40000)) as fresh:
        guess = {"Authorization": f"Bearer {prefix}guess99"}
        assert fresh.get("/api/v1/me", headers=guess).status_code == 429
        assert fresh.get("/api/v1/me", headers=BAD).status_code == 401  # another prefix
        assert fresh.get("/api/v1/me", headers=api.as_("alice")).status_code == 200


def test_a_trusted_proxy_names_the_client(
    settings: Settings, session_factory: sessionmaker[Session], api: Api
) -> None:
    """Behind a proxy named in GPUSCHED_TRUSTED_PROXIES each forwarded client is counted
    apart (the proxy's own address would otherwise lock everyone out); the forwarded
    address is the last one the proxy did not add itself."""
    proxied = settings.model_copy(
        update={"auth_failures_per_minute": LIMIT, "trusted_proxies": "10.0.0.0/8"}
    )
    app = create_app(proxied, session_factory=session_factory)
    with TestClient(app, client=("10.1.2.3", 40000)) as proxy:
        guesser = {**BAD, "X-Forwarded-For": "203.0.113.7"}
        assert [proxy.get("/api/v1/me", headers=guesser).status_code for _ in range(LIMIT)] == [
            401
        ] * LIMIT
        assert proxy.get("/api/v1/me", headers=guesser).status_code == 429
        # The guesser cannot pick a new address: the proxy appends the one it saw.
        spoofed = {**BAD, "X-Forwarded-For": "198.51.100.1, 203.0.113.7"}
        assert proxy.get("/api/v1/me", headers=spoofed).status_code == 429
        other = {"Authorization": "Bearer gps_other", "X-Forwarded-For": "198.51.100.9"}
        assert proxy.get("/api/v1/me", headers=other).status_code == 401


def test_the_limit_lifts_after_the_window(clients, limited_app: FastAPI, api: Api) -> None:
    guesser, _ = clients
    # The limiter's own clock: the three failures fall in one window however slowly a
    # loaded machine answers them, and the window ends when the test says so.
    now = [1000.0]
    limited_app.state.auth_limiter = FailedAuthLimiter(limit=2, window_s=60, clock=lambda: now[0])
    assert [guesser.get("/api/v1/me", headers=BAD).status_code for _ in range(3)] == [
        401,
        401,
        429,
    ]
    now[0] += 59.9
    assert guesser.get("/api/v1/me", headers=BAD).status_code == 429
    now[0] += 0.2  # the first two failures are more than a window old
    assert guesser.get("/api/v1/me", headers=BAD).status_code == 401
    assert guesser.get("/api/v1/me", headers=api.as_("alice")).status_code == 200
