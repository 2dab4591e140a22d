"""The FastAPI application factory."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session, sessionmaker
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from app.api.audit import router as audit_router
from app.api.auth import router as auth_router
from app.api.batches import router as batches_router
from app.api.estimator import router as estimator_router
from app.api.health import router as health_router
from app.api.jobs import router as jobs_router
from app.api.nodes import router as nodes_router
from app.api.nodes import utilization_router
from app.api.problems import add_problem_handlers, document_errors
from app.api.projects import router as projects_router
from app.api.reports import router as reports_router
from app.api.windows import router as windows_router
from app.auth.service import FailedAuthLimiter
from app.config import Settings
from app.db import make_engine, make_read_session_factory, make_session_factory
from app.etag import ETagMiddleware
from app.frontend import mount_frontend
from app.jobs.pending_limits import PendingCounts
from app.messaging import Messenger, NullMessenger, Sender, create_celery
from app.metrics import DatabaseCollector
from app.nodes.inventory import InventoryCache
from app.nodes.keys import NodeKeys
from app.security_headers import DOCS_ASSETS, SecurityHeadersMiddleware
from app.windows.tariff import tariff_setting

log = logging.getLogger("gpusched.api")


def _document_errors_in_openapi(app: FastAPI) -> None:
    generate = app.openapi
    documented: list[dict[str, Any]] = []

    def openapi() -> dict[str, Any]:
        doc = generate()
        if not documented or documented[0] is not doc:
            document_errors(app, doc)
            documented[:] = [doc]
        return doc

    setattr(app, "openapi", openapi)  # noqa: B010 - FastAPI's documented override


def create_app(
    settings: Settings,
    *,
    session_factory: sessionmaker[Session] | None = None,
    redis_client: Any = None,
    messenger: Sender | None = None,
) -> FastAPI:
    # Swagger UI and ReDoc are served by the app itself (fastapi-offline's copies), so /docs
    # and /redoc work on a machine without internet.
    app = FastAPIOffline(
        title="gpusched",
        version="0.1.0",
        description="GPU cluster scheduling service. Authenticate with `Authorization: Bearer "
        "<token>` (the Authorize button). Every error is RFC 9457 problem details "
        "(`application/problem+json`): `detail` says what went wrong, and a 422's `errors` "
        "names each field and why.",
        max_body_size=settings.max_body_bytes,  # 413 for larger bodies, streamed or not
        static_url=DOCS_ASSETS,
        # Swagger UI would otherwise fetch a validator badge from another site.
        swagger_ui_parameters={"validatorUrl": None},
    )
    _document_errors_in_openapi(app)
    attach_services(
        app,
        settings,
        session_factory=session_factory,
        redis_client=redis_client,
        messenger=messenger,
    )

    add_problem_handlers(app)

    app.include_router(health_router)
    app.include_router(auth_router)
    app.include_router(jobs_router)
    app.include_router(nodes_router)
    app.include_router(utilization_router)
    app.include_router(projects_router)
    app.include_router(estimator_router)
    app.include_router(reports_router)
    app.include_router(windows_router)
    app.include_router(batches_router)
    app.include_router(audit_router)
    app.add_middleware(ETagMiddleware)
    app.add_middleware(SecurityHeadersMiddleware)
    if settings.trusted_proxy_list:
        # The client's address (the failed-token limiter's key, the access log) is the one
        # a trusted proxy forwards, and only theirs: from anyone else X-Forwarded-For is
        # a name the client picks per request. `gpusched server` runs uvicorn without its
        # own proxy handling, which trusts 127.0.0.1 by default.
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.trusted_proxy_list)
    mount_frontend(app)
    return app


def attach_services(
    app: FastAPI,
    settings: Settings,
    *,
    session_factory: sessionmaker[Session] | None = None,
    redis_client: Any = None,
    messenger: Sender | None = None,
) -> None:
    """Give `app` its settings, database, broker and caches (app.state), all new: what
    requests read through their dependencies. Apart from the routes, which FastAPI builds
    at each router's first request (a few hundred ms), so that the tests can give one
    app's routes fresh services per test instead of building them again."""
    if session_factory is None:
        session_factory = make_session_factory(make_engine(settings.effective_database_url))
    if redis_client is None and settings.redis_url:
        import redis

        redis_client = redis.Redis.from_url(settings.redis_url, socket_timeout=2)
    read_session_factory = make_read_session_factory(session_factory)
    if messenger is None:
        # The keys are read with a session of their own while the request's may hold
        # SQLite's write lock: a reading one, which never waits for it.
        keys = NodeKeys(read_session_factory)
        messenger = (
            Messenger(create_celery(settings.redis_url), redis_client, keys=keys)
            if settings.redis_url
            else NullMessenger()
        )
    app.state.settings = settings
    app.state.messenger = messenger
    app.state.inventory = InventoryCache()
    app.state.pending_counts = PendingCounts()
    app.state.tariff = tariff_setting(settings)
    app.state.auth_limiter = FailedAuthLimiter(limit=settings.auth_failures_per_minute)
    app.state.metrics_registry = CollectorRegistry()
    app.state.metrics_registry.register(DatabaseCollector(read_session_factory))
    app.state.session_factory = session_factory
    app.state.read_session_factory = read_session_factory
    app.state.redis = redis_client
