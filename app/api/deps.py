"""FastAPI dependencies: the DB session per request and the calling principal."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from app.auth.service import (
    TOKEN_CACHE,
    FailedAuthLimiter,
    Principal,
    failure_keys,
    load_principal,
)
from app.config import Settings
from app.db import utcnow
from app.jobs.pending_limits import PendingCounts
from app.messaging import Sender
from app.nodes.inventory import InventoryCache


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_session(request: Request) -> Iterator[Session]:
    # GET and HEAD only read (no route writes on them), so they need no write lock.
    state = request.app.state
    reads = request.method in ("GET", "HEAD")
    with (state.read_session_factory if reads else state.session_factory)() as session:
        yield session


def get_messenger(request: Request) -> Sender:
    messenger: Sender = request.app.state.messenger
    return messenger


def get_inventory(request: Request) -> InventoryCache:
    inventory: InventoryCache = request.app.state.inventory
    return inventory


def get_pending_counts(request: Request) -> PendingCounts:
    counts: PendingCounts = request.app.state.pending_counts
    return counts


SessionDep = Annotated[Session, Depends(get_session)]
InventoryDep = Annotated[InventoryCache, Depends(get_inventory)]
PendingCountsDep = Annotated[PendingCounts, Depends(get_pending_counts)]
MessengerDep = Annotated["Sender", Depends(get_messenger)]
SettingsDep = Annotated[Settings, Depends(get_settings)]

_UNAUTHORIZED = {"WWW-Authenticate": "Bearer"}

# Declares the bearer scheme in OpenAPI (the Authorize button of /docs, generated clients);
# a missing or malformed header is answered below, with the failed-check limiter.
bearer_scheme = HTTPBearer(
    auto_error=False,
    description="An API token: the one printed at first start, or `gpusched admin create-token`",
)
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]


def get_principal(
    request: Request, session: SessionDep, settings: SettingsDep, credentials: BearerDep
) -> Principal:
    """The caller, by their bearer token. A valid token is always accepted: the failed-check
    limiter answers only failed checks (429 instead of 401), so nobody is locked out by
    another client's failures. The client's address is the connection's, or, from a proxy
    named in GPUSCHED_TRUSTED_PROXIES, the one it forwards (see main.py)."""
    token = credentials.credentials.strip() if credentials is not None else ""
    if token:
        principal = TOKEN_CACHE.get(token, settings.token_cache_s)
        if principal is None:
            principal = load_principal(session=session, token=token, now=utcnow())
            if principal is not None:
                TOKEN_CACHE.put(token, principal)
        if principal is not None:
            return principal
    limiter: FailedAuthLimiter = request.app.state.auth_limiter
    client = request.client.host if request.client else "unknown"
    keys = failure_keys(client=client, token=token)
    wait = limiter.retry_after(*keys)
    if wait is not None:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            "too many failed token checks from this address or for this token; retry later",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )
    limiter.failed(*keys)
    if not token:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token: send 'Authorization: Bearer <token>'",
            headers=_UNAUTHORIZED,
        )
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED, "invalid, expired or revoked token", headers=_UNAUTHORIZED
    )


CurrentUser = Annotated[Principal, Depends(get_principal)]


def require_admin(principal: CurrentUser) -> Principal:
    if not principal.is_admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "admin role required")
    return principal


AdminUser = Annotated[Principal, Depends(require_admin)]
