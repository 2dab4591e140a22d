"""Every route of the real app, read from ``app.routes``, so a new endpoint is covered (or
fails the coverage test) without anyone editing a hand-written list."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Mount, Route

from app.api.deps import get_principal, require_admin
from app.config import Settings
from app.db import make_engine, make_session_factory
from app.main import create_app

# Public on purpose: probes, metrics scrapes, the API description and the dashboard's files.
EXEMPT_PATHS = frozenset(
    {"/healthz", "/readyz", "/metrics", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}
)
DASHBOARD_MOUNT = "dashboard"
# Swagger UI's and ReDoc's own files (fastapi-offline), public as the pages that load them.
DOCS_ASSETS_MOUNT = ("static-offline-docs", "/docs/assets")
# What the design says only admins may do; the matrix checks the code agrees.
EXPECTED_ADMIN_ONLY = frozenset(
    {
        ("POST", "/api/v1/nodes/{name}/drain"),
        ("POST", "/api/v1/nodes/{name}/undrain"),
        ("POST", "/api/v1/nodes/{name}/requeue"),
        ("DELETE", "/api/v1/nodes/{name}"),
        ("POST", "/api/v1/windows"),
        ("PUT", "/api/v1/windows/{name}"),
        ("DELETE", "/api/v1/windows/{name}"),
        ("PATCH", "/api/v1/projects/{name}"),
        ("GET", "/api/v1/audit"),
        ("GET", "/api/v1/users"),
        ("POST", "/api/v1/users"),
        ("POST", "/api/v1/users/{name}/tokens"),
        ("DELETE", "/api/v1/users/{name}/tokens"),
        ("PATCH", "/api/v1/users/{name}"),
        ("PUT", "/api/v1/users/{name}/projects/{project}"),
        ("DELETE", "/api/v1/users/{name}/projects/{project}"),
    }
)


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    route: Any  # APIRoute, or FastAPI's effective route context (same attributes)

    @property
    def id(self) -> str:
        return f"{self.method} {self.path}"

    @property
    def params(self) -> list[str]:
        return re.findall(r"{(\w+)(?::\w+)?}", self.path)

    def _calls(self) -> Iterator[Any]:
        stack = [self.route.dependant]
        while stack:
            dependant = stack.pop()
            if dependant.call is not None:
                yield dependant.call
            stack.extend(dependant.dependencies)

    @property
    def needs_token(self) -> bool:
        return get_principal in set(self._calls())

    @property
    def admin_only(self) -> bool:
        return require_admin in set(self._calls())

    @property
    def has_body(self) -> bool:
        return self.route.body_field is not None


def _flat_routes(app: FastAPI) -> list[Any]:
    """The routes as served. FastAPI >= 0.16x keeps included routers as nested objects in
    ``app.routes``; ``iter_route_contexts`` flattens them. Older FastAPI: already flat."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # pragma: no cover - older FastAPI
        return list(app.routes)
    return list(iter_route_contexts(app.routes))


def _is_api_route(route: Any) -> bool:
    original = getattr(route, "original_route", route)
    return isinstance(original, APIRoute)


def build_app() -> FastAPI:
    """The real app, built only to read its routes (never serves a request)."""
    # An in-memory engine connects only when used, and it never is here.
    factory = make_session_factory(make_engine("sqlite://"))
    return create_app(Settings(database_url="sqlite://"), session_factory=factory)


def all_routes(app: FastAPI) -> list[Any]:
    return _flat_routes(app)


def operations(app: FastAPI) -> list[Operation]:
    """Every (method, path) the app answers, HEAD left out (it mirrors GET)."""
    ops = []
    for route in _flat_routes(app):
        if not _is_api_route(route):
            continue
        for method in sorted(route.methods or ()):
            if method != "HEAD":
                ops.append(Operation(method, route.path, route))
    return ops


def api_operations(app: FastAPI) -> list[Operation]:
    return [op for op in operations(app) if op.path not in EXEMPT_PATHS]


def unexpected_public_routes(app: FastAPI) -> list[str]:
    """Routes that are neither /api/v1 nor knowingly public."""
    problems = []
    for route in _flat_routes(app):
        original: BaseRoute = getattr(route, "original_route", route)
        path = getattr(route, "path", "")
        if isinstance(original, Mount):
            if (getattr(route, "name", None), path) == DOCS_ASSETS_MOUNT:
                continue
            if getattr(route, "name", None) != DASHBOARD_MOUNT or path not in ("", "/"):
                problems.append(f"mount {path!r} ({getattr(route, 'name', None)})")
        elif isinstance(original, APIRoute | Route):
            if path not in EXEMPT_PATHS and not path.startswith("/api/v1/"):
                problems.append(f"route {path!r}")
        else:
            problems.append(f"unknown route type {type(original).__name__} at {path!r}")
    return problems
