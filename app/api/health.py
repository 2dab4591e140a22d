from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up (no dependency checked)."""
    return {"status": "ok"}


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    """Prometheus exposition (no token, like the health checks; see README)."""
    return Response(
        generate_latest(request.app.state.metrics_registry), media_type=CONTENT_TYPE_LATEST
    )


@router.get("/readyz")
def readyz(request: Request) -> JSONResponse:
    """Database and Redis reachable: 200, else 503 naming what is down."""
    checks: dict[str, str] = {}
    try:
        with request.app.state.read_session_factory() as session:
            session.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:  # any failure means "not ready", reported, not raised
        checks["database"] = f"unreachable: {type(exc).__name__}"
    redis_client = request.app.state.redis
    if redis_client is None:
        checks["redis"] = "not configured"
    else:
        try:
            redis_client.ping()
            checks["redis"] = "ok"
        except Exception as exc:
            checks["redis"] = f"unreachable: {type(exc).__name__}"
    ready = all(v in ("ok", "not configured") for v in checks.values())
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)
